"""The engine step API with torch tensors (Debian's python3-torch, CPU): selections,
indices, int64 request ids (torch's req_pool_indices) and engine-owned per-layer KV caches
as torch tensors, viewed in place (Tensor.numpy(), or DLPack where numpy() refuses, as for
bfloat16), never copied. Its own ctest (python_ulacache_torch:
importing torch takes seconds); skipped, with the reason, where torch is not installed
(deps/debian-packages.txt does not list it: see docs/INTEGRATION.md, "Tensors")."""
import numpy as np
import pytest

import ulacache
from test_vllm_shapes import DLPackOnly

torch = pytest.importorskip("torch", reason="python3-torch is not installed (optional: docs/INTEGRATION.md, Tensors)")

ENTRY = 64


def pattern(addr):
    return ((np.arange(ENTRY) + addr * 131) & 0xFF).astype(np.uint8)


def test_torch_tensors_in_and_out_on_a_counting_space():
    cfg = ulacache.AddressSpaceConfig(stable_new_entries=True, num_groups=1, entry_bytes=ENTRY, row_bytes=ENTRY // 2,
                                      device_bytes_per_rank=16 * ENTRY, host_bytes_per_rank=48 * ENTRY)
    space = ulacache.AddressSpace(cfg, backend="counting")
    planner = ulacache.StepPlanner(space, max_batch=2, max_q_len=2, max_top_k=4)
    # vLLM-style: one tensor per layer, views of one allocation, handed over as a dict.
    dev = torch.zeros((2, 16, ENTRY // 2), dtype=torch.uint8)
    host = torch.zeros((2, 48, ENTRY // 2), dtype=torch.uint8)
    planner.register_engine_memory("device", 0, 0, {f"layers.{l}": t for l, t in enumerate(dev.unbind(0))})
    planner.register_engine_memory("host", 0, 0, list(host.unbind(0)))      # SGLang-style list
    mem = {"device": dev, "host": host}
    addrs = {}
    for r in (0, 1):
        space.add_request(r)
        addrs[r] = space.allocate(r, 20)
        for a in addrs[r]:
            tier, _, slot = space.lookup(int(a), 0)
            mem[tier][:, slot] = torch.from_numpy(pattern(int(a)).reshape(2, -1))
    space.advance_round()
    sel = torch.full((4, 4), -1, dtype=torch.int32)                           # page_table_1 [tokens, top_k]
    sel[0, :3] = torch.tensor(addrs[0][10:13].astype(np.int32))
    sel[1, :2] = torch.tensor(addrs[0][15:17].astype(np.int32))
    sel[2, :4] = torch.tensor(addrs[1][4:8].astype(np.int32))
    sel[3, :1] = torch.tensor(addrs[1][19:20].astype(np.int32))
    idx = torch.full_like(sel, 99)
    desc = np.zeros(planner.max_descriptors, ulacache.DESCRIPTOR_DTYPE)
    req = torch.tensor([0, 1], dtype=torch.int64)                              # req_pool_indices
    fence, n, _ = planner.plan(0, 0, sel, idx, desc, req)
    status = torch.zeros(n, dtype=torch.uint8)
    planner.execute_on_engine_memory(desc[:n], status)
    assert planner.complete(fence, status) == (n, 0)
    assert int((idx == 99).sum()) == 0                                         # written in place
    for s, i in zip(sel.reshape(-1).tolist(), idx.reshape(-1).tolist()):
        assert (i < 0) == (s < 0)
        if s >= 0:
            assert (dev[:, i].reshape(-1).numpy() == pattern(s)).all()
    # FlashMLA's view of a layer: k_cache[num_blocks, block, 1, row] over the same memory.
    assert dev[0].view(1, 16, 1, ENTRY // 2).data_ptr() == dev[0].data_ptr()


def test_torch_refusals():
    cfg = ulacache.AddressSpaceConfig(stable_new_entries=True, num_groups=1, entry_bytes=ENTRY, device_bytes_per_rank=8 * ENTRY,
                                      host_bytes_per_rank=48 * ENTRY)
    space = ulacache.AddressSpace(cfg)
    space.add_request(0)
    addrs = space.allocate(0, 8)
    space.advance_round()
    planner = ulacache.StepPlanner(space, max_batch=2, max_q_len=2, max_top_k=4)
    sel = torch.tensor(addrs[:8].astype(np.int32)).reshape(2, 1, 4).repeat(1, 2, 1)   # [batch 2, q_len 2, 4]
    idx = torch.zeros_like(sel)
    req = torch.tensor([0, 0])
    with pytest.raises(ulacache.InvalidArgumentError, match="C-contiguous"):   # the [:, :1] view
        planner.step(0, 0, sel[:, :1], idx[:, :1].contiguous(), req)
    with pytest.raises(ulacache.InvalidArgumentError, match="dtype"):
        planner.step(0, 0, sel.to(torch.int64), idx, req)
    assert int((idx != 0).sum()) == 0
    st = planner.step(0, 0, sel, idx, req)
    assert st.selections == 16


def test_vllm_tensors_as_vllm_hands_them():
    """bf16 per-layer caches [num_blocks, block_size, row] as register_kv_caches' dict,
    query_start_loc and req_id_per_token as int32 tensors, descriptors as torch columns that a
    torch copy (index_copy_ over each layer's [slots, row] view) runs."""
    row, layers, dev, host, block = 64, 2, 64, 256, 16
    cfg = ulacache.AddressSpaceConfig(stable_new_entries=True, num_groups=1, entry_bytes=row * layers, row_bytes=row,
                                      device_bytes_per_rank=dev * row * layers, host_bytes_per_rank=host * row * layers)
    space = ulacache.AddressSpace(cfg, backend="counting")
    planner = ulacache.StepPlanner(space, max_batch=8, max_q_len=1, max_top_k=8)
    caches = {tier: [torch.zeros((slots // block, block, row // 2), dtype=torch.bfloat16) for _ in range(layers)]
              for tier, slots in (("device", dev), ("host", host))}
    rows = {tier: [t.view(torch.uint8).view(-1, row) for t in ts] for tier, ts in caches.items()}   # the same memory
    for tier, ts in caches.items():
        planner.register_engine_memory(tier, 0, 0, {f"model.layers.{l}.self_attn.attn": t for l, t in enumerate(ts)})

    def pat(a, layer):
        return torch.from_numpy(((np.arange(row) + a * 131 + layer * 29) & 0xFF).astype(np.uint8))

    reqs = torch.tensor([4, 9], dtype=torch.int32)
    addrs = {}
    for r in reqs.tolist():
        space.add_request(r)
        chunks = []
        for _ in range(4):   # prefill chunks of 25, one round each; Allocate moves the oldest to host
            new = space.allocate(r, 25)
            out = torch.zeros((1, 25), dtype=torch.int64)
            space.slot_mapping(torch.from_numpy(new.astype(np.int64)), out)    # vLLM's slot_mapping
            for layer in range(layers):
                for a, slot in zip(new.tolist(), out[0].tolist()):
                    rows["device"][layer][slot] = pat(a, layer)
            chunks.append(new)
            space.advance_round()
        addrs[r] = np.concatenate(chunks)
    qsl = torch.tensor([0, 1, 3], dtype=torch.int32)                              # a decode, a 2-token row pair
    sel = torch.full((3, 8), -1, dtype=torch.int32)
    sel[0, :8] = torch.from_numpy(addrs[4][:8].astype(np.int32))                 # old: on host
    sel[1, :4] = torch.from_numpy(addrs[9][:4].astype(np.int32))
    sel[2, :6] = torch.from_numpy(addrs[9][90:96].astype(np.int32))
    idx = torch.zeros_like(sel)
    n_max = planner.max_descriptors
    cols = {k: torch.zeros(n_max, dtype=torch.int64 if k.endswith("_offset") else torch.int32)
            for k in ulacache.DESCRIPTOR_FIELDS}
    fence, n, _ = planner.plan(0, 0, sel, idx, cols, reqs, query_start_loc=qsl)
    assert n > 0
    # The engine's copy, from the columns alone: a swap exchanges, a copy copies, per layer.
    src, dst, op = cols["src_slot"][:n].long(), cols["dst_slot"][:n].long(), cols["op"][:n]
    assert (cols["src_tier"][:n] == ulacache.HOST).all() and (cols["dst_tier"][:n] == ulacache.DEVICE).all()
    for layer in range(layers):
        d, h = rows["device"][layer], rows["host"][layer]
        wanted, victims = h[src].clone(), d[dst].clone()
        d.index_copy_(0, dst, wanted)
        swaps = op == ulacache.SWAP
        h.index_copy_(0, src[swaps], victims[swaps])
    assert planner.complete(fence, torch.zeros(n, dtype=torch.uint8)) == (n, 0)
    for s, i in zip(sel.reshape(-1).tolist(), idx.reshape(-1).tolist()):
        assert (i < 0) == (s < 0)
        if s >= 0:
            for layer in range(layers):
                assert torch.equal(rows["device"][layer][i], pat(s, layer))
    # The same batch with one int32 request id per token row (req_id_per_token) plans alike.
    space.advance_round()
    idx2 = torch.zeros_like(sel)
    desc = np.zeros(n_max, ulacache.DESCRIPTOR_DTYPE)
    fence, n2, _ = planner.plan(0, 0, sel, idx2, desc, torch.tensor([4, 9, 9], dtype=torch.int32))
    assert n2 == 0 and torch.equal(idx2, idx)   # everything is on device now
    planner.complete(fence, np.zeros(0, np.uint8))


def test_cuda_tensors_are_refused_where_a_gpu_exists():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device: the refusal of CUDA tensors is tested without one in test_vllm_shapes.py")
    cfg = ulacache.AddressSpaceConfig(stable_new_entries=True, num_groups=1, entry_bytes=64, device_bytes_per_rank=64 * 64,
                                      host_bytes_per_rank=64 * 256)
    planner = ulacache.StepPlanner(ulacache.AddressSpace(cfg, backend="counting"), 1, 1, 8)
    with pytest.raises(ulacache.UnsupportedError, match="on the host"):
        planner.register_engine_memory("device", 0, 0, [torch.zeros((64, 64), dtype=torch.uint8, device="cuda")])


class CopyingNumpy(DLPackOnly):
    """Not a torch tensor: DLPack over an array, and a numpy() that returns a copy."""

    def numpy(self):
        return self.array.copy()


def test_plan_views_torch_tensors_and_only_torch_by_numpy():
    """A CPU torch tensor is taken by Tensor.numpy() (a view; the fast way), anything else by
    DLPack: the plan's indices and columns land in the caller's memory either way, and equal
    what a numpy call writes."""
    cfg = ulacache.AddressSpaceConfig(stable_new_entries=True, num_groups=1, entry_bytes=ENTRY, row_bytes=ENTRY // 2,
                                      device_bytes_per_rank=64 * ENTRY, host_bytes_per_rank=256 * ENTRY)
    outs = {}
    for form in ("numpy", "torch", "copying_numpy"):
        space = ulacache.AddressSpace(cfg, backend="counting")
        planner = ulacache.StepPlanner(space, max_batch=4, max_q_len=2, max_top_k=32)
        space.add_request(0)
        addrs = space.allocate(0, 200)
        space.advance_round()
        on_host = np.array([a for a in addrs if space.lookup(int(a), 0)[0] == "host"], np.int32)
        sel_np = on_host[:64].reshape(2, 32).copy()
        idx_np = np.full_like(sel_np, 99)
        cols_np = ulacache.descriptor_columns(planner.max_descriptors)
        req_np, qsl_np = np.array([0], np.int32), np.array([0, 2], np.int32)
        wrap = {"numpy": lambda a: a, "torch": torch.from_numpy, "copying_numpy": CopyingNumpy}[form]
        fence, n, _ = planner.plan(0, 0, wrap(sel_np), wrap(idx_np), {k: wrap(v) for k, v in cols_np.items()},
                                   wrap(req_np), query_start_loc=wrap(qsl_np))
        assert n > 0 and planner.complete(fence, np.zeros(n, np.uint8)) == (n, 0)
        assert (idx_np != 99).all() and (sel_np == on_host[:64].reshape(2, 32)).all()
        outs[form] = (idx_np.copy(), {k: v[:n].copy() for k, v in cols_np.items()})
    for form in ("torch", "copying_numpy"):
        assert (outs[form][0] == outs["numpy"][0]).all()
        assert all((outs[form][1][k] == v).all() for k, v in outs["numpy"][1].items())
    # A tensor that Tensor.numpy() refuses takes the DLPack way, and its refusal is DLPack's.
    planner = ulacache.StepPlanner(ulacache.AddressSpace(cfg, backend="counting"), 1, 1, 8)
    with pytest.raises(ulacache.InvalidArgumentError, match="dtype"):
        planner.plan(0, 0, torch.zeros((1, 1, 8), dtype=torch.bfloat16), np.zeros((1, 1, 8), np.int32),
                     np.zeros(planner.max_descriptors, ulacache.DESCRIPTOR_DTYPE), np.array([0], np.int64))
