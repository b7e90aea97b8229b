"""DP address space, StepPlanner and the engine step API from Python."""
import numpy as np
import pytest

import ulacache

ENTRY = 64


def make_space(device_slots=16, host_slots=64, groups=1, backend="cpu", ranks=1, engine=False, row_bytes=0,
               shadows=False):
    cfg = ulacache.AddressSpaceConfig(stable_new_entries=engine, host_shadows=shadows, num_ranks=ranks, num_groups=groups, entry_bytes=ENTRY,
                                      row_bytes=row_bytes,
                                      device_bytes_per_rank=device_slots * ENTRY * groups,
                                      host_bytes_per_rank=host_slots * ENTRY * groups)
    return ulacache.AddressSpace(cfg, backend=backend)


def pattern(addr, group):
    return ((np.arange(ENTRY) + addr * 131 + group * 17) & 0xFF).astype(np.uint8)


R1 = np.array([1], np.uint64)  # the request of a one-row batch


def filled(n=48, **kw):
    space = make_space(**kw)
    space.add_request(1)
    addrs = space.allocate(1, n)
    for a in addrs:
        for g in range(space.config.num_groups):
            space.write(int(a), g, pattern(int(a), g))
    space.advance_round()
    return space, addrs


def snapshot(space, addrs):
    cfg = space.config
    s = [space.lookup(int(a), g) for a in addrs for g in range(cfg.num_groups)]
    for g in range(cfg.num_groups):
        s += [space.num_free(0, g, "device"), space.num_free(0, g, "host")]
    return s + [space.num_live_addresses, space.num_requests]


def test_config_and_space_basics():
    cfg = ulacache.AddressSpaceConfig(num_groups=2, entry_bytes=ENTRY, device_bytes_per_rank=ENTRY * 2 * 8,
                                      host_bytes_per_rank=ENTRY * 2 * 32)
    assert cfg.device_slots_per_group == 8 and cfg.host_slots_per_group == 32
    cfg.validate()
    space = ulacache.AddressSpace(cfg)
    space.add_request(3, rank=0)
    addrs = space.allocate(3, 20)
    assert addrs.dtype == np.uint32 and addrs.shape == (20,)
    assert space.num_live_addresses == 20 and space.num_requests == 1
    assert space.lookup(int(addrs[0]), 0)[0] == "device"
    assert space.lookup(int(addrs[19]), 1)[0] == "host"
    assert space.num_used(0, 0, "device") == 8 and space.num_used(0, 0, "host") == 12
    assert list(space.addresses_of(3)) == list(addrs)
    assert space.is_live(int(addrs[5]))
    space.write(int(addrs[19]), 1, pattern(7, 1))
    out = np.zeros(ENTRY, np.uint8)
    space.read(int(addrs[19]), 1, out)
    assert np.array_equal(out, pattern(7, 1))
    space.check_invariants()
    space.free(3)
    assert not space.is_live(int(addrs[5]))
    assert space.num_live_addresses == 0


def test_step_planner_moves_entries_to_device():
    space, addrs = filled()
    planner = ulacache.StepPlanner(space)
    sel = addrs[30:40].copy()
    out = np.zeros(10, np.uint32)
    st = planner.step_runs(0, 0, sel, out, [(1, len(sel))])  # all ten selections are request 1's
    assert st.misses == 10 and st.distinct == 10
    pool = space.device_pool(0, 0)
    assert pool.shape == (16, ENTRY) and not pool.flags.writeable
    for a, s in zip(sel, out):
        assert space.lookup(int(a), 0) == ("device", 0, int(s))
        assert np.array_equal(pool[s], pattern(int(a), 0))
    assert space.transfer_bytes() > 0


def test_engine_step_library_path_writes_flashmla_indices():
    space, addrs = filled(groups=2, engine=True)
    planner = ulacache.StepPlanner(space, max_batch=2, max_q_len=2, max_top_k=4)
    sel = np.array([[[40, 41, 2, 3], [40, 42, -1, -1]], [[43, 5, 6, -1], [-1, -1, -1, -1]]], np.int32)
    idx = np.full_like(sel, 99)
    for g in range(2):
        st = planner.step(0, g, sel, idx, np.array([1, 1], np.uint64))  # both rows read request 1
        assert st.distinct == 8 and st.misses == 4
        pool = space.device_pool(0, g)
        assert np.array_equal(idx == -1, sel == -1)
        for a, i in zip(sel.ravel(), idx.ravel()):
            if a >= 0:
                assert np.array_equal(pool[i], pattern(int(a), g))
    space.check_invariants()


def engine_fixture(device_slots=8, host_slots=48, n=48, shadows=False):
    space = make_space(device_slots, host_slots, backend="counting", engine=True, row_bytes=ENTRY // 2,  # 2 layers
                       shadows=shadows)
    planner = ulacache.StepPlanner(space, max_batch=1, max_q_len=1, max_top_k=8)
    mem = {"device": np.zeros((2, device_slots, ENTRY // 2), np.uint8),
           "host": np.zeros((2, host_slots, ENTRY // 2), np.uint8)}
    for tier, a in mem.items():
        planner.register_engine_memory(tier, 0, 0, a)
    space.add_request(1)
    addrs = space.allocate(1, n)
    for a in addrs:
        tier, _, slot = space.lookup(int(a), 0)
        mem[tier][:, slot] = pattern(int(a), 0).reshape(2, ENTRY // 2)
    space.advance_round()
    return space, planner, mem, addrs


def entry_at(space, mem, a):
    tier, _, slot = space.lookup(int(a), 0)
    return mem[tier][:, slot].reshape(-1)


def test_engine_path_plan_execute_complete():
    space, planner, mem, addrs = engine_fixture()
    sel = addrs[20:28].astype(np.int32).reshape(1, 1, 8)
    idx = np.zeros_like(sel)
    desc = np.zeros(planner.max_descriptors, ulacache.DESCRIPTOR_DTYPE)
    fence, n, st = planner.plan(0, 0, sel, idx, desc, R1)
    assert n == 8 and st.misses == 8 and planner.has_pending
    assert set(desc[:n]["op"]) == {ulacache.SWAP}  # the device pool is full: every miss swaps
    status = np.full(n, 5, np.uint8)
    planner.execute_on_engine_memory(desc[:n], status)
    assert not status.any()
    assert planner.complete(fence, status) == (8, 0)
    assert not planner.has_pending
    for a, i in zip(sel.ravel(), idx.ravel()):
        assert space.lookup(int(a), 0) == ("device", 0, int(i))
        assert np.array_equal(mem["device"][:, i].reshape(-1), pattern(int(a), 0))
    for a in addrs:
        assert np.array_equal(entry_at(space, mem, a), pattern(int(a), 0))
    space.check_invariants()


def test_engine_path_with_host_shadows_evicts_then_copies():
    # Host shadows (include/ula/step_planner.h): victims without a shadow are EVICT descriptors
    # (the victim's row to evict_slot, then the fill); a fetched entry keeps its host slot, so
    # the next plan fills the same slots with plain COPYs and no victim's bytes move.
    space, planner, mem, addrs = engine_fixture(host_slots=56, shadows=True)
    desc = np.zeros(planner.max_descriptors, ulacache.DESCRIPTOR_DTYPE)
    for first, op in ((20, ulacache.EVICT), (28, ulacache.COPY)):
        sel = addrs[first:first + 8].astype(np.int32).reshape(1, 1, 8)
        idx = np.zeros_like(sel)
        fence, n, st = planner.plan(0, 0, sel, idx, desc, R1)
        assert n == 8 and set(desc[:n]["op"]) == {op}
        assert st.bytes_moved == (16 if op == ulacache.EVICT else 8) * ENTRY
        status = np.full(n, 5, np.uint8)
        planner.execute_on_engine_memory(desc[:n], status)
        assert planner.complete(fence, status) == (8, 0)
        for a, i in zip(sel.ravel(), idx.ravel()):
            assert np.array_equal(mem["device"][:, i].reshape(-1), pattern(int(a), 0))
        space.advance_round()
    assert space.num_host_shadows(0, 0) == 8
    for a in addrs:
        assert np.array_equal(entry_at(space, mem, a), pattern(int(a), 0))
    space.check_invariants()
    cols = ulacache.descriptor_columns(4)
    assert "evict_slot" in cols and ulacache.EVICT_LANDED == 2


def test_failed_descriptor_publishes_nothing():
    space, planner, mem, addrs = engine_fixture()
    sel = addrs[20:28].astype(np.int32).reshape(1, 1, 8)
    idx = np.zeros_like(sel)
    desc = np.zeros(planner.max_descriptors, ulacache.DESCRIPTOR_DTYPE)
    before = {int(a): space.lookup(int(a), 0) for a in addrs}
    fence, n, _ = planner.plan(0, 0, sel, idx, desc, R1)
    status = np.zeros(n, np.uint8)
    ok = np.arange(n) % 2 == 0
    st_ok = np.zeros(int(ok.sum()), np.uint8)
    planner.execute_on_engine_memory(desc[:n][ok], st_ok)  # the engine runs half; the rest fail
    status[~ok] = 3
    assert planner.complete(fence, status) == (int(ok.sum()), int((~ok).sum()))
    for d, good in zip(desc[:n], ok):
        now = space.lookup(int(d["addr"]), 0)
        assert now == (("device", 0, int(d["dst_slot"])) if good else before[int(d["addr"])])
    for a in addrs:  # no bytes lost
        assert np.array_equal(entry_at(space, mem, a), pattern(int(a), 0))
    space.check_invariants()


def test_bad_input_raises_and_changes_nothing():
    space, addrs = filled(engine=True)
    planner = ulacache.StepPlanner(space, max_batch=1, max_q_len=1, max_top_k=4)
    space.add_request(3)  # another live request: good's addresses are not its own
    space.allocate(3, 2)
    space.add_request(2)
    gone = space.allocate(2, 3)
    space.free(2)
    before = snapshot(space, addrs)
    idx = np.full((1, 1, 4), 7, np.int32)
    good = addrs[40:44].astype(np.int32).reshape(1, 1, 4)
    desc = np.zeros(planner.max_descriptors, ulacache.DESCRIPTOR_DTYPE)
    cases = [
        (ulacache.InvalidArgumentError, lambda: planner.step(0, 0, good.astype(np.int64), idx, R1)),       # dtype
        (ulacache.InvalidArgumentError, lambda: planner.step(0, 0, good.reshape(1, 4), idx, R1)),          # shape
        (ulacache.InvalidArgumentError, lambda: planner.step(0, 0, good, idx[:, :, :3], R1)),             # size
        (ulacache.InvalidArgumentError, lambda: planner.step(0, 0, good, idx.astype(np.uint32), R1)),     # out dtype
        (ulacache.InvalidArgumentError, lambda: planner.step(0, 0, np.asfortranarray(np.zeros((1, 2, 2), np.int32)),
                                                             idx.reshape(1, 2, 2), R1)),           # layout
        (ulacache.ResourceExhaustedError, lambda: planner.plan(0, 0, good, idx, desc[:1], R1)),           # rows: the step needs 4
        (ulacache.InvalidArgumentError, lambda: planner.plan(0, 0, good, idx, np.zeros(8, np.uint8), R1)),  # desc dtype
        (ulacache.NotFoundError, lambda: planner.step(0, 0, np.array([[[int(gone[0]), 1, 2, 3]]], np.int32), idx, R1)),  # stale
        (ulacache.InvalidArgumentError, lambda: planner.step(0, 0, np.array([[[-5, 1, 2, 3]]], np.int32), idx, R1)),
        (ulacache.OutOfRangeError, lambda: planner.step(0, 9, good, idx, R1)),
        (ulacache.NotFoundError, lambda: planner.step(0, 0, good, idx, np.array([3], np.uint64))),  # another request's
        (ulacache.NotFoundError, lambda: planner.step(0, 0, good, idx, np.array([2], np.uint64))),  # a freed request
        (ulacache.InvalidArgumentError, lambda: planner.step(0, 0, good, idx, np.array([1, 1], np.uint64))),  # rows
        (ulacache.InvalidArgumentError, lambda: planner.step(0, 0, good, idx, np.array([1], np.float32))),  # dtype (an integer width)
        (ulacache.NotFoundError, lambda: space.free(2)),                                              # freed request
        (ulacache.NotFoundError, lambda: space.allocate(2, 1)),
        (ulacache.NotFoundError, lambda: space.lookup(int(gone[1]), 0)),
        (ulacache.AlreadyExistsError, lambda: space.add_request(1)),
        (ulacache.InvalidArgumentError, lambda: space.write(int(addrs[0]), 0, np.zeros(ENTRY - 1, np.uint8))),
        (ulacache.InvalidArgumentError, lambda: space.write(int(addrs[0]), 0, np.zeros(ENTRY, np.int8))),
        (ulacache.InvalidArgumentError, lambda: space.read(int(addrs[0]), 0, np.zeros(2 * ENTRY, np.uint8)[::2])),
        (ulacache.NotFoundError, lambda: planner.complete(12345, np.zeros(0, np.uint8))),
        (ulacache.ResourceExhaustedError, lambda: space.allocate(1, 10_000)),
        (ulacache.InvalidArgumentError, lambda: ulacache.AddressSpace(ulacache.AddressSpaceConfig(entry_bytes=0))),
        (ulacache.InvalidArgumentError, lambda: ulacache.AddressSpaceConfig(policy="nope")),
        (ulacache.InvalidArgumentError, lambda: make_space(backend="gpu")),
    ]
    for exc, call in cases:
        with pytest.raises(exc) as info:
            call()
        assert isinstance(info.value, ulacache.Error)
        assert info.value.code and info.value.message
        assert snapshot(space, addrs) == before, info.value
        assert (idx == 7).all(), info.value
    space.check_invariants()


def test_pending_plan_refuses_another():
    space, planner, mem, addrs = engine_fixture()
    sel = addrs[20:28].astype(np.int32).reshape(1, 1, 8)
    idx = np.zeros_like(sel)
    desc = np.zeros(planner.max_descriptors, ulacache.DESCRIPTOR_DTYPE)
    fence, n, _ = planner.plan(0, 0, sel, idx, desc, R1)
    with pytest.raises(ulacache.FailedPreconditionError):
        planner.plan(0, 0, sel, idx, desc, R1)
    with pytest.raises(ulacache.InvalidArgumentError):
        planner.complete(fence, np.zeros(n - 1, np.uint8))
    assert planner.complete(fence, np.ones(n, np.uint8)) == (0, n)


def test_register_engine_memory_refuses_bad_arrays():
    space, planner, mem, addrs = engine_fixture()
    with pytest.raises(ulacache.InvalidArgumentError):   # fewer rows than the pool's slots
        planner.register_engine_memory("device", 0, 0, np.zeros((2, 4, ENTRY // 2), np.uint8))
    with pytest.raises(ulacache.InvalidArgumentError):   # layers x row bytes != entry bytes
        planner.register_engine_memory("device", 0, 0, np.zeros((3, 8, ENTRY // 2), np.uint8))
    # The same entry bytes split otherwise than the config's 2 layers of 32-byte rows.
    with pytest.raises(ulacache.InvalidArgumentError, match="1 layers of 64-byte rows, but the config's group is 2"):
        planner.register_engine_memory("device", 0, 0, np.zeros((1, 8, ENTRY), np.uint8))
    with pytest.raises(ulacache.InvalidArgumentError, match="4 layers of 16-byte rows"):
        planner.register_engine_memory("device", 0, 0, [np.zeros((8, ENTRY // 4), np.uint8) for _ in range(4)])
    with pytest.raises(ulacache.InvalidArgumentError):   # not C-contiguous
        planner.register_engine_memory("device", 0, 0, np.zeros((8, 2, ENTRY // 2), np.uint8).transpose(1, 0, 2))
    with pytest.raises(ulacache.InvalidArgumentError):
        planner.register_engine_memory("gpu", 0, 0, mem["device"])
    with pytest.raises(ulacache.OutOfRangeError):
        planner.register_engine_memory("device", 0, 5, mem["device"])
    # The registered arrays are still the ones the planner copies through.
    sel = addrs[30:38].astype(np.int32).reshape(1, 1, 8)
    idx = np.zeros_like(sel)
    desc = np.zeros(planner.max_descriptors, ulacache.DESCRIPTOR_DTYPE)
    fence, n, _ = planner.plan(0, 0, sel, idx, desc, R1)
    status = np.ones(n, np.uint8)
    planner.execute_on_engine_memory(desc[:n], status)
    assert not status.any()
    planner.complete(fence, status)
    for a in addrs:
        assert np.array_equal(entry_at(space, mem, a), pattern(int(a), 0))


def test_equal_dtype_objects_are_accepted_without_copy():
    space, addrs = filled(engine=True)
    planner = ulacache.StepPlanner(space, max_batch=1, max_q_len=1, max_top_k=4)
    i32 = np.dtype(np.int32).newbyteorder("=")       # equal to int32, another object
    assert i32 is not np.dtype(np.int32)
    sel = np.array([[[40, 41, 1, -1]]], dtype=i32)
    idx = np.zeros((1, 1, 4), dtype=i32)
    planner.step(0, 0, sel, idx, R1)
    assert [space.lookup(int(a), 0)[2] for a in sel.ravel()[:3]] == list(idx.ravel()[:3])  # written in place
    with pytest.raises(ulacache.InvalidArgumentError):  # other byte order: not equivalent
        planner.step(0, 0, sel.astype(">i4"), idx, R1)


def test_two_ranks_each_plan_their_own_entries():
    space = make_space(8, 32, ranks=2, engine=True)
    space.add_request(1, rank=0)
    space.add_request(2, rank=1)
    a0, a1 = space.allocate(1, 20), space.allocate(2, 20)
    space.advance_round()
    planner = ulacache.StepPlanner(space, max_batch=1, max_q_len=1, max_top_k=4)
    idx = np.zeros((1, 1, 4), np.int32)
    before = snapshot(space, list(a0) + list(a1))
    with pytest.raises(ulacache.InvalidArgumentError, match="rank 1, not rank 0"):
        planner.step(0, 0, a1[10:14].astype(np.int32).reshape(1, 1, 4), idx, np.array([2], np.uint64))
    assert snapshot(space, list(a0) + list(a1)) == before
    planner.step(1, 0, a1[10:14].astype(np.int32).reshape(1, 1, 4), idx, np.array([2], np.uint64))
    assert [space.lookup(int(a), 0) for a in a1[10:14]] == [("device", 1, int(i)) for i in idx.ravel()]
