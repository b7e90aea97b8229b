"""Tensors in and out (DLPack, int64 request ids, SGLang's flat
page_table_1, per-layer memory as a list or a dict), TP in the engine step API, faults
through the engine step, and an import that names its cause."""
import os
import subprocess
import sys

from pathlib import Path

import numpy as np
import pytest

import ulacache

ENTRY = 64
SEED = int(os.environ.get("ULA_TEST_SEED", "20261201"))
REPO = Path(__file__).resolve().parents[2]


def pattern(addr, group, version=0):
    return ((np.arange(ENTRY) + addr * 131 + group * 17 + version * 7) & 0xFF).astype(np.uint8)


def dp_space(device_slots=40, host_slots=96, backend="cpu", faults=None, engine=False, row_bytes=0):
    # row_bytes: the layers the engine registers (0: one layer of ENTRY bytes); a layout that
    # disagrees with the config is refused (docs/INTEGRATION.md, Tensors)
    cfg = ulacache.AddressSpaceConfig(stable_new_entries=engine, num_groups=1, entry_bytes=ENTRY, row_bytes=row_bytes,
                                      device_bytes_per_rank=device_slots * ENTRY,
                                      host_bytes_per_rank=host_slots * ENTRY)
    return ulacache.AddressSpace(cfg, backend=backend, faults=faults)


def filled(space, requests=2, n=40):
    addrs = {}
    for r in range(requests):
        space.add_request(r)
        addrs[r] = space.allocate(r, n)
        for a in addrs[r]:
            space.write(int(a), 0, pattern(int(a), 0))
    space.advance_round()
    return addrs


class DLPackOnly:
    """A producer that offers only the DLPack protocol (as torch does), over a numpy array."""

    def __init__(self, array, device=(1, 0)):
        self.array, self.device = array, device

    def __dlpack__(self, stream=None):
        return self.array.__dlpack__()

    def __dlpack_device__(self):
        return self.device


class CudaArray:
    """A producer of device memory through __cuda_array_interface__ (cupy, numba, torch.cuda)."""

    __cuda_array_interface__ = {"shape": (1, 1, 8), "typestr": "<i4", "data": (0, False), "version": 3}


def select(rng, addrs, batch, q_len, top_k):
    sel = np.full((batch, q_len, top_k), -1, np.int32)
    for b in range(batch):
        for q in range(q_len):
            k = top_k - int(rng.integers(0, 3))
            sel[b, q, :k] = rng.choice(addrs[b], size=k, replace=False)
    return sel


# --- item 4: tensors in, tensors out -----------------------------------------------------

def test_dlpack_views_flat_page_table_and_int64_requests_match_numpy():
    rng = np.random.default_rng(SEED)
    results = []
    for form in ("numpy", "dlpack", "flat", "flat_dlpack"):
        space = dp_space(engine=True)
        addrs = filled(space)
        planner = ulacache.StepPlanner(space, max_batch=2, max_q_len=2, max_top_k=8)
        sel = select(np.random.default_rng(SEED), addrs, 2, 2, 8)
        idx = np.full_like(sel, 99)
        req64 = np.array([0, 1], np.int64)       # torch's req_pool_indices dtype
        if form == "numpy":
            st = planner.step(0, 0, sel, idx, np.array([0, 1], np.uint64))
        elif form == "dlpack":
            st = planner.step(0, 0, DLPackOnly(sel), DLPackOnly(idx), DLPackOnly(req64))
        elif form == "flat":                      # SGLang's page_table_1: [tokens, top_k]
            st = planner.step(0, 0, sel.reshape(4, 8), idx.reshape(4, 8), req64)
        else:
            st = planner.step(0, 0, DLPackOnly(sel.reshape(4, 8)), DLPackOnly(idx.reshape(4, 8)), DLPackOnly(req64))
        assert (idx == 99).sum() == 0, form      # written through the view, not a copy
        pool = space.device_pool(0, 0)
        for s, i in zip(sel.reshape(-1), idx.reshape(-1)):
            assert (i < 0) == (s < 0)
            if s >= 0:
                assert (pool[i] == pattern(int(s), 0)).all()
        results.append((idx.copy(), st.misses, st.hits))
    for r in results[1:]:
        assert (r[0] == results[0][0]).all() and r[1:] == results[0][1:]
    del rng


def test_bad_tensors_are_refused_and_change_nothing():
    space = dp_space(engine=True)
    addrs = filled(space)
    planner = ulacache.StepPlanner(space, max_batch=2, max_q_len=2, max_top_k=8)
    sel = select(np.random.default_rng(SEED), addrs, 2, 1, 8)
    idx = np.full_like(sel, 7)
    req = np.array([0, 1], np.int64)
    before = [space.lookup(int(a), 0) for r in addrs for a in addrs[r]]
    cases = [
        (ulacache.UnsupportedError, "CUDA", lambda: planner.step(0, 0, CudaArray(), idx, req)),
        (ulacache.UnsupportedError, "cuda", lambda: planner.step(0, 0, DLPackOnly(sel, device=(2, 0)), idx, req)),
        (ulacache.InvalidArgumentError, "expected a numpy array", lambda: planner.step(0, 0, sel.tolist(), idx, req)),
        (ulacache.InvalidArgumentError, "multiple of len", lambda: planner.step(0, 0, sel.reshape(2, 8)[:1], idx.reshape(2, 8)[:1], np.array([0, 1, 1], np.int64))),
        (ulacache.InvalidArgumentError, "shape of selections", lambda: planner.step(0, 0, sel, idx.reshape(2, 8), req)),
        (ulacache.InvalidArgumentError, "dtype", lambda: planner.step(0, 0, sel, idx, req.astype(np.float64))),
        (ulacache.InvalidArgumentError, "non-negative", lambda: planner.step(0, 0, sel, idx, np.array([0, -1], np.int32))),
        # A [:, :1] view of a q_len-2 buffer is not contiguous: refused, never copied.
        (ulacache.InvalidArgumentError, "C-contiguous",
         lambda: planner.step(0, 0, np.repeat(sel, 2, axis=1)[:, :1], idx, req)),
    ]
    for exc, text, call in cases:
        with pytest.raises(exc, match=text):
            call()
        assert (idx == 7).all()
        assert [space.lookup(int(a), 0) for r in addrs for a in addrs[r]] == before


def test_engine_memory_as_list_or_dict_of_layers_and_refused_on_a_cpu_space():
    cpu = dp_space(engine=True)
    with pytest.raises(ulacache.FailedPreconditionError, match="counting"):
        ulacache.StepPlanner(cpu, 1, 1, 8).register_engine_memory("device", 0, 0,
                                                                        np.zeros((2, 16, ENTRY // 2), np.uint8))
    assert cpu.holds_bytes
    outcomes = []
    for form in ("stacked", "list", "dict"):
        space = dp_space(8, 48, backend="counting", engine=True, row_bytes=ENTRY // 2)
        assert not space.holds_bytes
        planner = ulacache.StepPlanner(space, max_batch=1, max_q_len=1, max_top_k=8)
        mem = {"device": np.zeros((2, 8, ENTRY // 2), np.uint8), "host": np.zeros((2, 48, ENTRY // 2), np.uint8)}
        for tier, a in mem.items():
            if form == "stacked":
                planner.register_engine_memory(tier, 0, 0, a)
            elif form == "list":                  # SGLang: one tensor per layer
                planner.register_engine_memory(tier, 0, 0, list(a))
            else:                                 # vLLM: register_kv_caches(dict[layer name, tensor])
                planner.register_engine_memory(tier, 0, 0, {f"model.layers.{l}.attn": a[l] for l in range(2)})
        space.add_request(1)
        addrs = space.allocate(1, 40)
        for a in addrs:
            tier, _, slot = space.lookup(int(a), 0)
            mem[tier][:, slot] = pattern(int(a), 0).reshape(2, ENTRY // 2)
        space.advance_round()
        sel = addrs[30:38].astype(np.int32).reshape(1, 1, 8)
        idx = np.zeros_like(sel)
        desc = np.zeros(planner.max_descriptors, ulacache.DESCRIPTOR_DTYPE)
        fence, n, _ = planner.plan(0, 0, sel, idx, desc, np.array([1], np.int64))
        status = np.zeros(n, np.uint8)
        planner.execute_on_engine_memory(desc[:n], status)
        assert planner.complete(fence, status) == (n, 0)
        for s, i in zip(sel.reshape(-1), idx.reshape(-1)):
            assert (mem["device"][:, i].reshape(-1) == pattern(int(s), 0)).all()
        outcomes.append(idx.copy())
    assert all((o == outcomes[0]).all() for o in outcomes)
    # Four layers of 16 bytes at any addresses: views of one allocation out of order, with a
    # gap, and separately allocated arrays are all accepted; overlapping layers are refused.
    cfg = ulacache.AddressSpaceConfig(stable_new_entries=True, num_groups=1, entry_bytes=ENTRY, row_bytes=ENTRY // 4,
                                      device_bytes_per_rank=8 * ENTRY, host_bytes_per_rank=48 * ENTRY)
    planner = ulacache.StepPlanner(ulacache.AddressSpace(cfg, backend="counting"), 1, 1, 8)
    big = np.zeros((5, 8, ENTRY // 4), np.uint8)
    planner.register_engine_memory("device", 0, 0, [big[0], big[1], big[3], big[4]])   # a gap
    planner.register_engine_memory("device", 0, 0, [big[1], big[0], big[2], big[3]])   # descending
    with pytest.raises(ulacache.InvalidArgumentError, match="same size"):
        planner.register_engine_memory("device", 0, 0, [big[0], big[1], big[2], big[3, :4]])
    with pytest.raises(ulacache.InvalidArgumentError, match="overlap"):
        planner.register_engine_memory("device", 0, 0, [big[0], big[1], big[1], big[2]])
    flat = np.zeros(5 * 8 * (ENTRY // 4), np.uint8)
    with pytest.raises(ulacache.InvalidArgumentError, match="overlap"):   # layer 1 starts inside layer 0
        planner.register_engine_memory("device", 0, 0, [flat[i * 8: i * 8 + 8 * (ENTRY // 4)].reshape(8, -1)
                                                        for i in range(4)])


def test_separately_allocated_layer_tensors_at_any_addresses():
    # vLLM and SGLang allocate each layer's KV tensor on its own: 4 layers per group, each
    # tier registered as a dict of its layers (at any addresses).
    layers, row = 4, ENTRY // 4
    space = dp_space(8, 48, backend="counting", engine=True, row_bytes=row)
    planner = ulacache.StepPlanner(space, max_batch=1, max_q_len=1, max_top_k=8)
    # Device: the layers at unequal offsets of one buffer, out of address order; host: four
    # separate allocations.
    arena = np.zeros(16384, np.uint8)
    offsets = [3000, 128, 9000, 5104]
    mem = {"device": [arena[o:o + 8 * row].reshape(8, row) for o in offsets],
           "host": [np.zeros((48, row), np.uint8) for _ in range(layers)]}
    for tier, ls in mem.items():
        planner.register_engine_memory(tier, 0, 0, {f"model.layers.{l}.self_attn": t for l, t in enumerate(ls)})
    space.add_request(1)
    addrs = space.allocate(1, 40)
    for a in addrs:
        tier, _, slot = space.lookup(int(a), 0)
        for l in range(layers):
            mem[tier][l][slot] = pattern(int(a), 0)[l * row:(l + 1) * row]
    space.advance_round()
    for step in range(3):
        sel = addrs[8 + 8 * step: 16 + 8 * step].astype(np.int32).reshape(1, 1, 8)
        idx = np.zeros_like(sel)
        desc = np.zeros(planner.max_descriptors, ulacache.DESCRIPTOR_DTYPE)
        fence, n, _ = planner.plan(0, 0, sel, idx, desc, np.array([1], np.int64))
        assert n == 8
        status = np.zeros(n, np.uint8)
        planner.execute_on_engine_memory(desc[:n], status)
        assert planner.complete(fence, status) == (n, 0)
        for s, i in zip(sel.reshape(-1), idx.reshape(-1)):
            got = np.concatenate([mem["device"][l][i] for l in range(layers)])
            assert (got == pattern(int(s), 0)).all()
        for a in addrs:   # every entry, device or host, reads its own bytes where it now is
            tier, _, slot = space.lookup(int(a), 0)
            got = np.concatenate([mem[tier][l][slot] for l in range(layers)])
            assert (got == pattern(int(a), 0)).all(), (step, int(a))
        space.advance_round()


# --- item 7: faults through the engine step ----------------------------------------------

def test_library_step_under_random_faults_publishes_nothing_and_loses_nothing():
    print(f"[ seed ] {SEED} (rerun with ULA_TEST_SEED={SEED})")
    rng = np.random.default_rng(SEED)
    faults = ulacache.FaultPlan(seed=SEED, fail_fraction=0.3, partial=True)
    space = dp_space(device_slots=48, host_slots=160, faults=faults, engine=True)
    space.set_faults_armed(False)
    addrs = filled(space, requests=3, n=30)
    shadow = {int(a): pattern(int(a), 0) for r in addrs for a in addrs[r]}
    planner = ulacache.StepPlanner(space, max_batch=3, max_q_len=2, max_top_k=8)
    failed = ok = 0
    out = np.empty(ENTRY, np.uint8)
    for step in range(40):
        sel = select(rng, addrs, 3, 2, 8)
        idx = np.full_like(sel, -1)
        space.set_faults_armed(True)
        try:
            planner.step(0, 0, sel, idx, np.arange(3, dtype=np.int64))
            ok += 1
            pool = space.device_pool(0, 0)
            for s, i in zip(sel.reshape(-1), idx.reshape(-1)):
                if s >= 0:
                    assert (pool[i] == shadow[int(s)]).all(), (SEED, step)
        except ulacache.IoError as e:
            failed += 1
            assert "failed" in e.message
            assert not planner.has_pending
        finally:
            space.set_faults_armed(False)
        for a, want in shadow.items():
            space.read(a, 0, out)
            assert (out == want).all(), (SEED, step, a)
        space.check_invariants()
        space.advance_round()
    assert failed > 3 and ok > 3, (failed, ok)
    st = space.fault_stats()
    assert st.injected > 0 and st.operations >= st.injected


def test_complete_with_failed_statuses_publishes_nothing_and_loses_nothing():
    rng = np.random.default_rng(SEED + 1)
    space = dp_space(device_slots=48, host_slots=160, backend="counting", engine=True, row_bytes=ENTRY // 2)
    planner = ulacache.StepPlanner(space, max_batch=3, max_q_len=2, max_top_k=8)
    mem = {"device": np.zeros((2, 48, ENTRY // 2), np.uint8), "host": np.zeros((2, 160, ENTRY // 2), np.uint8)}
    for tier, a in mem.items():
        planner.register_engine_memory(tier, 0, 0, a)
    addrs = {}
    for r in range(3):
        space.add_request(r)
        addrs[r] = space.allocate(r, 30)
        for a in addrs[r]:
            tier, _, slot = space.lookup(int(a), 0)
            mem[tier][:, slot] = pattern(int(a), 0).reshape(2, -1)
    space.advance_round()
    shadow = {int(a): pattern(int(a), 0) for r in addrs for a in addrs[r]}
    desc = np.zeros(planner.max_descriptors, ulacache.DESCRIPTOR_DTYPE)
    failed_total = 0
    for step in range(40):
        sel = select(rng, addrs, 3, 2, 8)
        idx = np.zeros_like(sel)
        fence, n, _ = planner.plan(0, 0, sel, idx, desc, np.arange(3, dtype=np.uint64))
        status = np.zeros(n, np.uint8)
        bad = rng.random(n) < 0.25
        for i in range(n):
            if bad[i]:
                status[i] = 1
                if desc[i]["op"] == ulacache.COPY:      # a failed copy may leave garbage at its free target
                    mem["device"][:, desc[i]["dst_slot"]] = 0xAB
            else:
                one = np.zeros(1, np.uint8)
                planner.execute_on_engine_memory(desc[i:i + 1], one)
                assert one[0] == 0
        assert planner.complete(fence, status) == (n - int(bad.sum()), int(bad.sum()))
        failed_total += int(bad.sum())
        for a, want in shadow.items():
            tier, _, slot = space.lookup(a, 0)
            assert (mem[tier][:, slot].reshape(-1) == want).all(), (SEED, step, a)
        space.check_invariants()
        space.advance_round()
    assert failed_total > 5


def test_addresses_come_in_pages():
    space = dp_space(device_slots=64, host_slots=256)
    assert space.config.page_tokens == 64
    space.add_request(1), space.add_request(2)
    a = np.concatenate([space.allocate(1, 50), space.allocate(1, 30)]).astype(np.int64)
    b = space.allocate(2, 10).astype(np.int64)
    i = np.arange(len(a))
    assert (a % 64 == i % 64).all() and len(set((a // 64).tolist())) == 2   # page_table_1[:, ::64] // 64
    assert not set((b // 64).tolist()) & set((a // 64).tolist())             # pages are per request
    with pytest.raises(ulacache.InvalidArgumentError):
        ulacache.AddressSpace(ulacache.AddressSpaceConfig(entry_bytes=ENTRY, device_bytes_per_rank=ENTRY * 8,
                                                          host_bytes_per_rank=ENTRY * 8, page_tokens=0))


def test_tp_addresses_come_in_pages_striped_over_the_ranks():
    cfg = ulacache.TpConfig(num_ranks=4, num_groups=1, entry_bytes=ENTRY, attention="at_home",
                            device_bytes_per_rank=ENTRY * 40, host_bytes_per_rank=ENTRY * 60)
    assert cfg.page_tokens == 64
    space = ulacache.TpAddressSpace(cfg)
    space.add_request(1), space.add_request(2)
    parts = {1: [], 2: []}
    parts[1].append(space.allocate(1, 50))
    for _ in range(20):                      # decode tokens of the two requests interleave
        parts[1].append(space.allocate(1, 1))
        parts[2].append(space.allocate(2, 1))
    a, b = (np.concatenate(parts[r]).astype(np.int64) for r in (1, 2))
    i = np.arange(len(a))
    assert (a % 64 == i % 64).all() and len(set((a[::64] // 64).tolist())) == 2   # page_table_1[:, ::64] // 64
    assert ((a[:64] // 64) == a[0] // 64).all()
    assert not set((b // 64).tolist()) & set((a // 64).tolist())                  # pages are per request
    assert [space.home_of(int(x)) for x in a[:8]] == [0, 1, 2, 3, 0, 1, 2, 3]      # a page spans all ranks
    space.check_invariants()
    with pytest.raises(ulacache.InvalidArgumentError):
        ulacache.TpConfig(num_ranks=4, entry_bytes=ENTRY, attention="at_home", device_bytes_per_rank=ENTRY * 8,
                          page_tokens=0).validate()


def test_per_layer_pools_of_unequal_groups_read_through_device_layer():
    row = 32
    cfg = ulacache.AddressSpaceConfig(stable_new_entries=True, num_groups=2, entry_bytes=2 * row, row_bytes=row, group_layers=[2, 1],
                                      device_bytes_per_rank=40 * 3 * row, host_bytes_per_rank=96 * 3 * row)
    assert [cfg.layers_of(0), cfg.layers_of(1)] == [2, 1]
    space = ulacache.AddressSpace(cfg)
    space.add_request(0)
    addrs = space.allocate(0, 60)
    entry = {g: {int(a): ((np.arange(row * (2 - g)) + int(a) * 7 + g) & 0xFF).astype(np.uint8) for a in addrs}
             for g in (0, 1)}
    for g in (0, 1):
        for a in addrs:
            space.write(int(a), g, entry[g][int(a)])
    space.advance_round()
    planner = ulacache.StepPlanner(space, max_batch=1, max_q_len=1, max_top_k=64, top_k_multiple=64)
    with pytest.raises(ulacache.InvalidArgumentError):
        ulacache.StepPlanner(space, max_batch=1, max_q_len=1, max_top_k=48, top_k_multiple=64)
    for g in (0, 1):
        sel = np.full((1, 64), -1, np.int32)
        sel[0, :30] = addrs[20:50]
        idx = np.zeros_like(sel)
        planner.step(0, g, sel, idx, np.zeros(1, np.int64))
        for layer in range(2 - g):
            k_cache = space.device_layer(0, g, layer)            # [slots rounded up to 64, row]
            assert k_cache.shape[0] % 64 == 0 and k_cache.shape[1] == row
            for s_, i in zip(sel[0, :30], idx[0, :30]):
                assert (k_cache[i] == entry[g][int(s_)][layer * row:(layer + 1) * row]).all()
    with pytest.raises(ulacache.OutOfRangeError):
        space.device_layer(0, 1, 1)


def test_fault_plan_is_validated():
    with pytest.raises(ulacache.InvalidArgumentError):
        ulacache.FaultPlan(fail_fraction=2.0)
    with pytest.raises(ulacache.FailedPreconditionError):
        dp_space().fault_stats()


# --- item 5: TP in the engine step API ---------------------------------------------------

def tp_space(attention, engine=False):
    cfg = ulacache.TpConfig(stable_new_entries=engine, num_ranks=2, num_groups=1, entry_bytes=ENTRY, attention=attention,
                            device_bytes_per_rank=40 * ENTRY, host_bytes_per_rank=96 * ENTRY,
                            buffer_bytes_per_rank=(0 if attention == "at_home" else 40 * ENTRY))
    space = ulacache.TpAddressSpace(cfg)
    addrs = {}
    for r in range(3):
        space.add_request(r)
        addrs[r] = space.allocate(r, 40)
        for a in addrs[r]:
            space.write(int(a), 0, pattern(int(a), 0))
    space.advance_round()
    return space, addrs


@pytest.mark.parametrize("attention", ["at_home", "local_buffer"])
def test_tp_engine_step_matches_the_tp_planner(attention):
    rng = np.random.default_rng(SEED)
    space, addrs = tp_space(attention, engine=True)
    twin, _ = tp_space(attention, engine=True)
    engine = ulacache.TpStepPlanner(space, max_batch=3, max_q_len=2, max_top_k=8)
    planner = ulacache.TpStepPlanner(twin)
    assert engine.num_ranks == 2
    dev = engine.device_slots
    out = np.empty(ENTRY, np.uint8)
    for step in range(6):
        sel = select(rng, addrs, 3, 2, 8)
        flat = sel.reshape(6, 8)                           # page_table_1 form
        idx = np.full((2, 6, 8), 5, np.int32)
        stats = engine.step(0, flat, idx, np.arange(3, dtype=np.int64))
        keep = sel.reshape(-1) >= 0
        compact = sel.reshape(-1)[keep].astype(np.uint32)
        runs = [(b, int((sel[b] >= 0).sum())) for b in range(3)]
        source, slot, twin_stats = planner.step_runs(0, compact, runs)
        assert [s.distinct for s in stats] == [s.distinct for s in twin_stats]
        for rank in range(2):
            want = np.full(sel.size, -1, np.int64)
            w = np.where(source[rank] == 0, slot[rank].astype(np.int64),
                         np.where(source[rank] == 1, dev + slot[rank].astype(np.int64), -1))
            want[keep] = w
            assert (idx[rank].reshape(-1) == want).all(), (rank, step)
            pool = space.shard_device_pool(rank, 0)
            for s, i in zip(flat.reshape(-1), idx[rank].reshape(-1)):
                if i < 0:
                    assert s < 0 or (attention == "at_home" and space.home_of(int(s)) != rank)
                    continue
                if i < dev:
                    got = pool[i]
                else:
                    space.buffer_entry(rank, 0, int(i - dev), out)
                    got = out
                assert (got == pattern(int(s), 0)).all()
            if attention == "local_buffer":
                assert ((idx[rank] >= 0) == (sel.reshape(6, 8) >= 0)).all()
        space.advance_round()
        twin.advance_round()
    space.check_invariants()
    with pytest.raises(ulacache.InvalidArgumentError, match="ranks"):
        engine.step(0, flat, np.zeros((1, 6, 8), np.int32), np.arange(3, dtype=np.int64))


@pytest.mark.parametrize("attention", ["at_home", "local_buffer"])
def test_tp_engine_plan_and_complete_is_step(attention):
    """The TP engine path: plan, run the descriptors (here the library's reference executor,
    in array order: the local buffer's remote fetches first, then the home moves), complete;
    the same indices and published state as step on a twin."""
    rng = np.random.default_rng(SEED)
    space, addrs = tp_space(attention, engine=True)
    twin, _ = tp_space(attention, engine=True)
    engine = ulacache.TpStepPlanner(space, max_batch=3, max_q_len=2, max_top_k=8)
    stepper = ulacache.TpStepPlanner(twin, max_batch=3, max_q_len=2, max_top_k=8)
    desc = np.zeros(engine.max_descriptors, ulacache.DESCRIPTOR_DTYPE)
    moved = fetched = 0
    for step in range(6):
        sel = select(rng, addrs, 3, 2, 8)
        idx = np.full((2, 3, 2, 8), 5, np.int32)
        fence, n, stats, first_phase = engine.plan(0, sel, idx, desc, np.arange(3, dtype=np.int64))
        if attention == "at_home":
            assert first_phase == 0  # no remote fetches
        assert (desc[:first_phase]["src_rank"] != desc[:first_phase]["dst_rank"]).all()
        assert (desc[first_phase:n]["src_rank"] == desc[first_phase:n]["dst_rank"]).all()
        assert sum(s.remote_fetches for s in stats) == first_phase
        assert engine.has_pending
        with pytest.raises(ulacache.FailedPreconditionError):
            engine.step(0, sel, np.zeros_like(idx), np.arange(3, dtype=np.int64))
        status = np.full(n, 7, np.uint8)
        engine.execute_on_shards(desc[:n], status)
        assert (status == 0).all()
        assert engine.complete(fence, status) == (n, 0)
        moved += n - first_phase
        fetched += first_phase
        want = np.full_like(idx, 5)
        twin_stats = stepper.step(0, sel, want, np.arange(3, dtype=np.int64))
        assert (idx == want).all(), step
        assert [s.misses for s in stats] == [s.misses for s in twin_stats]
        assert [s.remote_fetches for s in stats] == [s.remote_fetches for s in twin_stats]
        assert space.debug_digest() == twin.debug_digest()
        space.advance_round()
        twin.advance_round()
    assert moved > 0
    assert (fetched > 0) == (attention == "local_buffer")
    space.check_invariants()


# --- item 8: an import that names its cause ----------------------------------------------

def test_import_without_numpy_names_the_cause_and_the_build_interpreter():
    code = "import sys; sys.modules['numpy'] = None\ntry:\n import ulacache\nexcept ImportError as e:\n print(e)"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert "needs numpy" in out.stdout, out.stdout + out.stderr
    assert "built for" in out.stdout and "Python 3." in out.stdout


def test_the_package_docstring_example_runs():
    lines = ulacache.__doc__.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("    import numpy"))
    code = []
    for line in lines[start:]:
        if line and not line.startswith("    "):
            break
        code.append(line[4:])
    exec(compile("\n".join(code), "ulacache.__doc__", "exec"), {})


# --- item 5: Python has what C++ has (the members test_binding_coverage.py once listed) -----

def test_sharing_and_directory_members_of_both_spaces():
    tp = ulacache.TpAddressSpace(ulacache.TpConfig(num_ranks=2, entry_bytes=ENTRY, attention="at_home",
                                                   device_bytes_per_rank=ENTRY * 8, host_bytes_per_rank=ENTRY * 24))
    dp = dp_space(8, 48)
    for space in (dp, tp):
        space.add_request(1), space.add_request(2)
        a = space.allocate(1, 6)
        assert (space.addresses_of(1) == a).all() and space.num_requests == 2
        space.share_into(2, a[:4])                      # a cached prefix, no copy
        assert [space.ref_count(int(x)) for x in a] == [2, 2, 2, 2, 1, 1]
        assert space.holds(2, int(a[0])) and not space.holds(2, int(a[5]))
        digest = space.debug_digest()
        with pytest.raises(ulacache.AlreadyExistsError):
            space.share_into(2, a[:1])
        with pytest.raises(ulacache.FailedPreconditionError):
            space.release(a[:1])                        # no cache reference to drop
        assert space.debug_digest() == digest
        space.retain(a[:2])
        space.free(1), space.free(2)
        assert [space.is_live(int(x)) for x in a] == [True, True, False, False, False, False]
        space.release(a[:2])
        assert not space.is_live(int(a[0])) and space.ref_count(int(a[0])) == 0
        space.check_invariants()
    assert dp.rank_of is not None
    dp.add_request(3)
    assert dp.rank_of(3) == 0
    assert tp.hosted_ranks == [0, 1] and tp.hosts(1) and not tp.hosts(2)
    assert tp.config.shard_slots_per_group == 32 and tp.config.policy == "pb_lru"
    tp.add_request(4)
    b = tp.allocate(4, 10)
    tier, rank, slot = tp.lookup(int(b[0]), 0)
    assert (tier, rank) == ("device", tp.home_of(int(b[0])))
    assert [tp.num_homed(r) for r in (0, 1)] == [5, 5]
    assert tp.num_used(0, 0, "device") + tp.num_used(0, 0, "host") == 5
    assert tp.num_free(0, 0, "device") == 8 - tp.num_used(0, 0, "device")
    assert tp.num_buffered(0, 0) == 0 and tp.buffer_slot(0, int(b[1]), 0) is None


def test_tp_check_refuses_as_step_would_and_changes_nothing():
    space = ulacache.TpAddressSpace(ulacache.TpConfig(stable_new_entries=True, num_ranks=2, entry_bytes=ENTRY, attention="at_home",
                                                      device_bytes_per_rank=ENTRY * 8,
                                                      host_bytes_per_rank=ENTRY * 24))
    space.add_request(1), space.add_request(2)
    a, b = space.allocate(1, 6), space.allocate(2, 2)
    planner = ulacache.TpStepPlanner(space)
    planner.check(0, a, [(1, len(a))])
    digest = space.debug_digest()
    with pytest.raises(ulacache.NotFoundError):
        planner.check(0, np.concatenate([a, b]), [(1, len(a) + len(b))])    # another request's addresses
    assert space.debug_digest() == digest
    assert ulacache.TpStepPlanner(space, 1, 1, 8).ranks == [0, 1]


def test_indexer_score_select_union_and_config_members():
    rng = np.random.default_rng(SEED)
    ix = ulacache.Indexer(num_heads=2, head_dim=4, top_k=3)
    assert ix.shape == (2, 4, 3)
    keys = rng.standard_normal((20, 4)).astype(np.float32)
    qs = [(rng.standard_normal(8).astype(np.float32), np.abs(rng.standard_normal(2)).astype(np.float32))
          for _ in range(2)]
    scores = ix.score(qs[0][0], qs[0][1], keys)
    assert scores.shape == (20,)
    order = sorted(range(20), key=lambda i: (-scores[i], i))[:3]              # top-k by score, ties by position
    assert ix.select(qs[0][0], qs[0][1], keys).tolist() == order
    per_query, union = ix.select_union(qs, keys)
    assert per_query[0].tolist() == order
    first_seen = list(dict.fromkeys(per_query[0].tolist() + per_query[1].tolist()))  # every position once, first kept
    assert union.tolist() == first_seen
    model = ulacache.load_model_config(str(REPO / "configs/models/glm5.json"))
    model.validate()
    assert model.kv_bytes_per_token == (model.num_layers + model.mtp_layers) * model.kv_entry_bytes_per_layer
    assert model.kv_entry_bytes_per_layer == (model.kv_lora_rank * model.kv_lora_bytes_per_value + model.kv_scale_bytes
                                              + model.qk_rope_head_dim * model.rope_bytes_per_value)
    planner = ulacache.StepPlanner(dp_space())
    planner.set_options(threads=2)
    assert planner.options["threads"] == 2 and planner.counters["claims"] == 0
    with pytest.raises(ulacache.InvalidArgumentError):
        planner.set_options(threads=0)
    assert planner.options["threads"] == 2
    assert ulacache.FaultPlan(delay_us=5).delay == 5


def test_tp_new_tokens_keep_their_looked_up_slot_and_the_engine_writes_there():
    """A TpStepPlanner::Create requires stable_new_entries (a space without it is refused, its
    modes unchanged), so a new token lands on its home rank's device (a victim moved to host)
    and the engine writes its KV through a writable shard view at the slot lookup gave; a token
    pinned on host (the device held only this round's entries) is counted and a step that
    selects it is refused."""
    cfg = ulacache.TpConfig(num_ranks=2, num_groups=1, entry_bytes=ENTRY, attention="at_home",
                            device_bytes_per_rank=4 * ENTRY, host_bytes_per_rank=32 * ENTRY)
    assert not cfg.stable_new_entries
    with pytest.raises(ulacache.FailedPreconditionError, match="stable_new_entries"):
        ulacache.TpStepPlanner(ulacache.TpAddressSpace(cfg), max_batch=1, max_q_len=1, max_top_k=4)
    cfg.stable_new_entries = True
    space = ulacache.TpAddressSpace(cfg)
    engine = ulacache.TpStepPlanner(space, max_batch=1, max_q_len=1, max_top_k=4)
    space.add_request(1)
    old = space.allocate(1, 12)  # 6 per rank: 4 on device, 2 pinned on host
    assert [space.num_new_on_host(r, 0) for r in range(2)] == [2, 2]
    with pytest.raises(ValueError):
        space.shard_device_pool(0, 0)[0, 0] = 1  # read-only unless asked
    views = {"device": [space.shard_device_pool(r, 0, writable=True) for r in range(2)],
             "host": [space.shard_host_pool(r, 0, writable=True) for r in range(2)]}
    for a in old:
        tier, rank, slot = space.lookup(int(a), 0)
        views[tier][rank][slot] = pattern(int(a), 0)
    pinned = next(int(a) for a in old if space.lookup(int(a), 0)[0] == "host")
    sel = np.array([[pinned, -1, -1, -1]], np.int32)
    idx = np.full((2, 1, 4), 9, np.int32)
    digest = space.debug_digest()
    with pytest.raises(ulacache.ResourceExhaustedError, match="placed on host by this round's Allocate"):
        engine.step(0, sel, idx, np.array([1], np.int64))
    assert space.debug_digest() == digest and (idx == 9).all()
    space.advance_round()
    assert space.num_new_on_host(0, 0) == 0
    fresh = int(space.allocate(1, 1)[0])  # the device is full: a victim moves to host
    tier, rank, slot = space.lookup(fresh, 0)
    assert tier == "device"
    views["device"][rank][slot] = pattern(fresh, 0)  # the engine's KV write, at the looked-up slot
    sel = np.array([[fresh, pinned, -1, -1]], np.int32)
    engine.step(0, sel, idx, np.array([1], np.int64))
    assert space.lookup(fresh, 0) == (tier, rank, slot)
    out = np.empty(ENTRY, np.uint8)
    for a in list(old) + [fresh]:
        space.read(int(a), 0, out)
        assert (out == pattern(int(a), 0)).all(), a
    space.check_invariants()


@pytest.mark.parametrize("attention", ["at_home", "local_buffer"])
def test_tp_reserve_round_bounds_every_rank(attention):
    """TpStepPlanner.reserve_round: Ok for a round that fits every rank's shard, refused
    with the numbers (and nothing changed) for one whose new tokens outnumber them."""
    space, addrs = tp_space(attention, engine=True)
    engine = ulacache.TpStepPlanner(space, max_batch=3, max_q_len=2, max_top_k=8)
    req = np.arange(3, dtype=np.int64)
    needed, room = engine.reserve_round(req, np.ones(3, np.uint32), np.full(3, 8, np.uint32))
    assert 0 < needed <= room
    live = space.num_live_addresses
    with pytest.raises(ulacache.ResourceExhaustedError, match="ReserveRound: rank"):
        engine.reserve_round(req, np.full(3, 100000, np.uint32), np.full(3, 8, np.uint32))
    with pytest.raises(ulacache.InvalidArgumentError, match="past the planner"):
        engine.reserve_round(req, np.ones(3, np.uint32), np.full(3, 17, np.uint32))
    assert space.num_live_addresses == live
    space.check_invariants()
