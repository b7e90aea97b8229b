"""vLLM's and SGLang's tensors as they hand them (docs/INTEGRATION.md "Tensors"): per-layer
KV caches [num_blocks, block_size, row_bytes] (vLLM) and [slots, row_bytes] (SGLang) in any
dtype taken as bytes; int32 and int64 request ids; vLLM's flat batch cut by query_start_loc;
copy descriptors as columns (a structure of arrays); one slot_mapping call for every group;
CUDA tensors refused with the reason. The torch forms (bf16, torch columns) are in
test_torch.py."""
import time

import numpy as np
import pytest

import ulacache

ROW = 32           # one layer's row in bytes
LAYERS = 2         # layers per group
DEV, HOST = 64, 256
BLOCK = 16         # vLLM's block_size in these tests


def pattern(addr, layer):
    return ((np.arange(ROW) + addr * 131 + layer * 29) & 0xFF).astype(np.uint8)


def space_and_planner(groups=1, backend="counting", max_batch=8, max_q_len=4, max_top_k=8, device=DEV):
    cfg = ulacache.AddressSpaceConfig(stable_new_entries=True, num_groups=groups, entry_bytes=ROW * LAYERS,
                                      row_bytes=ROW, device_bytes_per_rank=groups * device * ROW * LAYERS,
                                      host_bytes_per_rank=groups * HOST * ROW * LAYERS)
    space = ulacache.AddressSpace(cfg, backend=backend)
    return space, ulacache.StepPlanner(space, max_batch=max_batch, max_q_len=max_q_len, max_top_k=max_top_k)


class DLPackOnly:
    """A producer that offers only the DLPack protocol (as torch does), over a numpy array."""

    def __init__(self, array, device=(1, 0)):
        self.array, self.device = array, device

    def __dlpack__(self, stream=None):
        return self.array.__dlpack__()

    def __dlpack_device__(self):
        return self.device


class CudaArray:
    __cuda_array_interface__ = {"shape": (4, ROW), "typestr": "|u1", "data": (0, False), "version": 3}


def fill(space, mem, requests, n):
    """Allocates n tokens per request and writes each token's rows where lookup says."""
    addrs = {}
    for r in requests:
        space.add_request(r)
        addrs[r] = space.allocate(r, n)
        for a in addrs[r]:
            tier, _, slot = space.lookup(int(a), 0)
            for layer in range(LAYERS):
                mem[tier][layer][slot] = pattern(int(a), layer)
    space.advance_round()
    return addrs


def run_plan(planner, sel, requests, **kw):
    idx = np.full_like(sel, 99)
    desc = np.zeros(planner.max_descriptors, ulacache.DESCRIPTOR_DTYPE)
    fence, n, _ = planner.plan(0, 0, sel, idx, desc, requests, **kw)
    status = np.zeros(n, np.uint8)
    planner.execute_on_engine_memory(desc[:n], status)
    assert planner.complete(fence, status) == (n, 0)
    return idx


@pytest.mark.parametrize("form", ["vllm_blocks", "flashmla_blocks", "sglang_rows", "float16_blocks", "dlpack_blocks"])
def test_per_layer_caches_as_vllm_and_sglang_hand_them(form):
    space, planner = space_and_planner()
    # The engine's own tensors, one per layer; `rows[tier][layer]` is the [slots, ROW] uint8
    # view the test writes through (the same memory).
    shapes = {"vllm_blocks": lambda s: (s // BLOCK, BLOCK, ROW), "flashmla_blocks": lambda s: (s // BLOCK, BLOCK, 1, ROW),
              "sglang_rows": lambda s: (s, ROW), "float16_blocks": lambda s: (s // BLOCK, BLOCK, ROW // 2),
              "dlpack_blocks": lambda s: (s // BLOCK, BLOCK, ROW)}
    dtype = np.float16 if form == "float16_blocks" else np.uint8
    tensors = {tier: [np.zeros(shapes[form](slots), dtype) for _ in range(LAYERS)]
               for tier, slots in (("device", DEV), ("host", HOST))}
    rows = {tier: [t.view(np.uint8).reshape(-1, ROW) for t in ts] for tier, ts in tensors.items()}
    for tier, ts in tensors.items():
        handed = [DLPackOnly(t) for t in ts] if form == "dlpack_blocks" else ts
        if form == "sglang_rows":
            planner.register_engine_memory(tier, 0, 0, handed)                      # a list
        else:
            planner.register_engine_memory(tier, 0, 0, {f"model.layers.{l}.attn": t for l, t in enumerate(handed)})
    addrs = fill(space, rows, [1], 200)
    for step in range(4):
        sel = addrs[1][step * 40: step * 40 + 8].astype(np.int32).reshape(1, 1, 8)
        idx = run_plan(planner, sel, np.array([1], np.int64))
        for s, i in zip(sel.reshape(-1), idx.reshape(-1)):
            for layer in range(LAYERS):
                assert (rows["device"][layer][i] == pattern(int(s), layer)).all(), (form, step, int(s))
        space.advance_round()


def test_stacked_block_shaped_memory_and_layouts_that_are_no_rows_are_refused():
    space, planner = space_and_planner()
    planner.register_engine_memory("device", 0, 0, np.zeros((LAYERS, DEV // BLOCK, BLOCK, ROW), np.uint8))
    planner.register_engine_memory("host", 0, 0, np.zeros((LAYERS, HOST // BLOCK, BLOCK, 1, ROW), np.uint8))
    # Two layers' rows side by side in one tensor (2 * ROW bytes per slot): no trailing
    # dimensions make one ROW-byte row, so it is read as [slots, ...] and refused with both
    # layouts named.
    with pytest.raises(ulacache.InvalidArgumentError, match=str(2 * ROW)):
        planner.register_engine_memory("device", 0, 0, [np.zeros((DEV, 2 * ROW), np.uint8)] * LAYERS)
    with pytest.raises(ulacache.InvalidArgumentError):   # fewer slots than the pool
        planner.register_engine_memory("device", 0, 0, [np.zeros((1, BLOCK, ROW), np.uint8) for _ in range(LAYERS)])


def test_request_ids_of_any_integer_width_plan_alike():
    results = []
    for dtype in (np.int32, np.uint32, np.int64, np.uint64):
        space, planner = space_and_planner(backend="cpu")
        for r in (3, 5):
            space.add_request(r)
            space.allocate(r, 30)
        space.advance_round()
        sel = np.stack([space.addresses_of(3)[:8], space.addresses_of(5)[4:12]]).astype(np.int32).reshape(2, 1, 8)
        idx = np.zeros_like(sel)
        planner.step(0, 0, sel, idx, np.array([3, 5], dtype))
        results.append(idx)
        # vLLM's req_id_per_token: one id per token row, int32.
        idx2 = np.zeros_like(sel)
        planner.step(0, 0, sel.reshape(2, 8), idx2.reshape(2, 8), DLPackOnly(np.array([3, 5], dtype)))
        assert (idx2 == idx).all()
        with pytest.raises(ulacache.NotFoundError, match="request 5"):      # the rows' requests are read
            planner.step(0, 0, sel, idx, np.array([5, 5], dtype))
    assert all((r == results[0]).all() for r in results)
    with pytest.raises(ulacache.InvalidArgumentError, match="non-negative"):
        planner.step(0, 0, sel, idx, np.array([3, -5], np.int32))
    with pytest.raises(ulacache.InvalidArgumentError, match="int32, uint32, int64 or uint64"):
        planner.step(0, 0, sel, idx, np.array([3, 5], np.int16))


def test_query_start_loc_cuts_a_flat_batch_of_any_q_len_per_request():
    q_lens = [1, 3, 2, 1]       # a decode, a 3-token prefill chunk, an MTP step, a decode
    reqs = np.array([10, 11, 12, 13], np.int32)
    qsl = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    runs = []
    for use_qsl in (True, False):
        space, planner = space_and_planner(backend="cpu", max_batch=8, max_q_len=1, max_top_k=8, device=64)
        for r in reqs:
            space.add_request(int(r))
            space.allocate(int(r), 40)
        space.advance_round()
        rng = np.random.default_rng(7)
        sel = np.full((int(qsl[-1]), 8), -1, np.int32)
        for b, r in enumerate(reqs):
            for row in range(qsl[b], qsl[b + 1]):
                sel[row, :6] = rng.choice(space.addresses_of(int(r)), 6, replace=False)
        idx = np.zeros_like(sel)
        if use_qsl:
            stats = planner.step(0, 0, sel, idx, reqs, query_start_loc=qsl)
        else:   # the same batch with one request per row (vLLM's req_id_per_token)
            stats = planner.step(0, 0, sel, idx, np.repeat(reqs, q_lens))
        runs.append((idx, stats.distinct, stats.misses))
        # A row holding another request's address is refused: the rows' requests are qsl's.
        bad = sel.copy()
        bad[1, 0] = space.addresses_of(10)[0]
        before = space.debug_digest()
        with pytest.raises(ulacache.NotFoundError, match="request 11"):
            planner.step(0, 0, bad, np.zeros_like(bad), reqs, query_start_loc=qsl)
        assert space.debug_digest() == before
    assert (runs[0][0] == runs[1][0]).all() and runs[0][1:] == runs[1][1:]
    for bad_qsl, text in (([0, 1, 4, 6], "len\\(requests\\) \\+ 1"), ([0, 1, 4, 6, 6], "end at"),
                          ([0, 2, 1, 6, 7], "decreases"), ([1, 1, 4, 6, 7], "start at 0")):
        with pytest.raises(ulacache.InvalidArgumentError, match=text):
            planner.step(0, 0, sel, idx, reqs, query_start_loc=np.array(bad_qsl, np.int64))
    with pytest.raises(ulacache.InvalidArgumentError, match="tokens, top_k"):
        planner.step(0, 0, sel.reshape(1, 7, 8), idx.reshape(1, 7, 8), reqs, query_start_loc=qsl)


def test_descriptors_as_columns_match_the_records_and_run():
    outs = []
    for as_columns in (False, True):
        space, planner = space_and_planner()
        rows = {t: [np.zeros((s, ROW), np.uint8) for _ in range(LAYERS)] for t, s in (("device", DEV), ("host", HOST))}
        for tier, ls in rows.items():
            planner.register_engine_memory(tier, 0, 0, ls)
        addrs = fill(space, rows, [1], 200)
        on_host = [int(a) for a in addrs[1] if space.lookup(int(a), 0)[0] == "host"]
        sel = np.array(on_host[:8], np.int32).reshape(1, 1, 8)
        idx = np.zeros_like(sel)
        if as_columns:
            cols = ulacache.descriptor_columns(planner.max_descriptors)
            fence, n, _ = planner.plan(0, 0, sel, idx, cols, np.array([1], np.int64))
            status = np.zeros(n, np.uint8)
            planner.execute_on_engine_memory({k: v[:n] for k, v in cols.items()}, status)
            outs.append({k: v[:n].astype(np.int64) for k, v in cols.items()})
        else:
            desc = np.zeros(planner.max_descriptors, ulacache.DESCRIPTOR_DTYPE)
            fence, n, _ = planner.plan(0, 0, sel, idx, desc, np.array([1], np.int64))
            status = np.zeros(n, np.uint8)
            planner.execute_on_engine_memory(desc[:n], status)
            outs.append({k: desc[k][:n].astype(np.int64) for k in ulacache.DESCRIPTOR_FIELDS})
        assert n > 0 and planner.complete(fence, status) == (n, 0)
        for s, i in zip(sel.reshape(-1), idx.reshape(-1)):
            for layer in range(LAYERS):
                assert (rows["device"][layer][i] == pattern(int(s), layer)).all()
    assert all((outs[0][k] == outs[1][k]).all() for k in ulacache.DESCRIPTOR_FIELDS)
    assert (outs[1]["src_offset"] == outs[1]["src_slot"] * ROW).all() and (outs[1]["num_layers"] == LAYERS).all()
    # Refusals, nothing planned: int32 offsets, an unknown field, too few rows, a read-only column.
    space.advance_round()
    sel = np.array(on_host[8:16], np.int32).reshape(1, 1, 8)
    before = space.debug_digest()
    cases = [
        (ulacache.InvalidArgumentError, "int64", {"src_offset": np.zeros(8, np.int32)}),
        (ulacache.InvalidArgumentError, "not a descriptor field", {"src": np.zeros(8, np.int64)}),
        (ulacache.ResourceExhaustedError, "", ulacache.descriptor_columns(2)),
    ]
    ro = np.zeros(8, np.int64)
    ro.flags.writeable = False
    cases.append((ulacache.InvalidArgumentError, "writable", {"dst_offset": ro}))
    for exc, text, cols in cases:
        with pytest.raises(exc, match=text):
            planner.plan(0, 0, sel, np.zeros_like(sel), cols, np.array([1], np.int64))
        assert space.debug_digest() == before and not planner.has_pending
    with pytest.raises(ulacache.InvalidArgumentError, match="needs column 'op'"):
        cols = ulacache.descriptor_columns(1)
        del cols["op"]
        planner.execute_on_engine_memory(cols, np.zeros(1, np.uint8))
    with pytest.raises(ValueError, match="not descriptor fields"):
        ulacache.descriptor_columns(4, ("src_offset", "offset"))


def test_slot_mapping_fills_every_group_in_one_call():
    groups = 3
    space, _ = space_and_planner(groups=groups, backend="cpu")
    for r in range(4):
        space.add_request(r)
    new = np.concatenate([space.allocate(r, 5 + r) for r in range(4)])     # this round's new tokens
    out = np.full((groups, len(new)), 7, np.int64)
    space.slot_mapping(new, out)
    for g in range(groups):
        assert [int(x) for x in out[g]] == [space.lookup(int(a), g)[2] for a in new]
    # int32 / int64 addresses with -1 for padding rows (vLLM's PAD_SLOT_ID).
    padded = np.concatenate([new.astype(np.int64), [-1, -1]])
    out2 = np.zeros((groups, len(padded)), np.int64)
    space.slot_mapping(DLPackOnly(padded.astype(np.int32)), out2)
    assert (out2[:, :len(new)] == out).all() and (out2[:, len(new):] == -1).all()
    # Refused, out unchanged: a freed address, a bad shape, another rank, a wrong dtype.
    space.free(3)
    out3 = np.full((groups, len(new)), 7, np.int64)
    cases = [(ulacache.NotFoundError, "", lambda: space.slot_mapping(new, out3)),
             (ulacache.InvalidArgumentError, "num_groups", lambda: space.slot_mapping(new[:4], out3)),
             (ulacache.OutOfRangeError, "rank", lambda: space.slot_mapping(new[:4], out3[:, :4], rank=1)),
             (ulacache.InvalidArgumentError, "dtype", lambda: space.slot_mapping(new[:4], out3[:, :4].astype(np.int32))),
             (ulacache.UnsupportedError, "host", lambda: space.slot_mapping(new[:4], CudaArray()))]
    for exc, text, call in cases:
        with pytest.raises(exc, match=text):
            call()
        assert (out3 == 7).all()
    # A negative address other than the -1 padding is refused with its index named, in int32
    # and in int64, out unchanged: -2, and an int64 that a cast to uint32 would wrap onto a
    # live address (new[0] - 2**32) must never read as that address.
    live = new[:4].astype(np.int64)
    for dtype, bad in [(np.int32, -2), (np.int64, -2), (np.int64, int(new[0]) - 2**32),
                       (np.int64, -2**63)]:
        addrs = live.copy()
        addrs[2] = bad
        out4 = np.full((groups, 4), 7, np.int64)
        with pytest.raises(ulacache.InvalidArgumentError, match=rf"addrs\[2\] = {bad}: neither an address nor -1"):
            space.slot_mapping(addrs.astype(dtype), out4)
        assert (out4 == 7).all(), (dtype, bad)
    # A new token placed on host (a space without stable_new_entries, its device full) has no
    # device slot to write: refused.
    cfg = ulacache.AddressSpaceConfig(num_groups=1, entry_bytes=ROW, device_bytes_per_rank=64 * ROW,
                                      host_bytes_per_rank=256 * ROW)
    plain = ulacache.AddressSpace(cfg)
    plain.add_request(0)
    a = plain.allocate(0, 100)
    tiers = [plain.lookup(int(x), 0)[0] for x in a]
    assert "host" in tiers
    with pytest.raises(ulacache.FailedPreconditionError, match="device"):
        plain.slot_mapping(a, np.zeros(len(a), np.int64))


def test_slot_mapping_cost_against_one_lookup_per_token_and_group():
    """Prints what one call costs against a lookup per (token, group) (docs/INTEGRATION.md)."""
    groups, tokens = 4, 2048
    space, _ = space_and_planner(groups=groups, backend="counting", device=4096)
    space.add_request(0)
    new = space.allocate(0, tokens)
    out = np.zeros((groups, tokens), np.int64)
    t = time.perf_counter()
    for _ in range(10):
        space.slot_mapping(new, out)
    batched = (time.perf_counter() - t) / 10
    t = time.perf_counter()
    looked = [[space.lookup(int(a), g)[2] for a in new] for g in range(groups)]
    per_lookup = time.perf_counter() - t
    assert (out == np.array(looked)).all()
    print(f"slot_mapping {groups} groups x {tokens} tokens: one call {batched * 1e6:.0f} us "
          f"({batched * 1e9 / (groups * tokens):.1f} ns per slot); lookup per token and group "
          f"{per_lookup * 1e6:.0f} us ({per_lookup * 1e9 / (groups * tokens):.0f} ns per slot)")


def test_cuda_tensors_are_refused_with_the_reason():
    space, planner = space_and_planner()
    for mem in (CudaArray(), DLPackOnly(np.zeros((DEV, ROW), np.uint8), device=(2, 0))):
        with pytest.raises(ulacache.UnsupportedError, match="on the host"):
            planner.register_engine_memory("device", 0, 0, [mem] * LAYERS)
    space.add_request(0)
    a = space.allocate(0, 8)
    space.advance_round()
    sel = a.astype(np.int32).reshape(1, 1, 8)
    with pytest.raises(ulacache.UnsupportedError, match="pass a CPU tensor"):
        planner.plan(0, 0, sel, np.zeros_like(sel), {"src_offset": DLPackOnly(np.zeros(8, np.int64), device=(2, 0))},
                     np.array([0], np.int64))
    assert not planner.has_pending
