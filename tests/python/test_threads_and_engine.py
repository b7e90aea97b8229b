"""The GIL is released while planning (two threads plan on two spaces at once), and the
mini engine matches its dense reference bit for bit."""
import sys
import threading
import time
from pathlib import Path

import numpy as np

import ulacache

REPO = Path(__file__).resolve().parents[2]


def big_space(seed):
    entry = 64
    # Steps of 16 x 2048 selections, mostly misses: a few ms of planning each, far longer
    # than a waiting thread needs to wake up and take the GIL.
    cfg = ulacache.AddressSpaceConfig(stable_new_entries=True, num_groups=1, entry_bytes=entry, device_bytes_per_rank=entry * 40000,
                                      host_bytes_per_rank=entry * 200000)
    space = ulacache.AddressSpace(cfg, backend="counting")
    space.add_request(1)
    addrs = space.allocate(1, 200000)
    space.advance_round()
    planner = ulacache.StepPlanner(space, max_batch=16, max_q_len=1, max_top_k=2048)
    rng = np.random.default_rng(seed)
    sels = [rng.choice(addrs, 16 * 2048, replace=False).astype(np.int32).reshape(16, 1, 2048) for _ in range(6)]
    return space, planner, sels


def plan_and_complete(space, planner, sel, idx, desc, status):
    fence, n, _ = planner.plan(0, 0, sel, idx, desc, np.ones(sel.shape[0], np.uint64))  # every row: request 1
    planner.complete(fence, status[:n])
    space.advance_round()


def test_two_threads_plan_on_two_spaces_at_once():
    a = big_space(1)
    b = big_space(2)
    bufs = [(np.empty((16, 1, 2048), np.int32), np.zeros(p.max_descriptors, ulacache.DESCRIPTOR_DTYPE),
             np.zeros(p.max_descriptors, np.uint8)) for p in (a[1], b[1])]
    counter = [0]
    started = threading.Event()
    stop = threading.Event()

    def other():
        space, planner, sels = b
        idx, desc, status = bufs[1]
        started.set()
        i = 0
        while not stop.is_set():
            plan_and_complete(space, planner, sels[i % len(sels)], idx, desc, status)
            counter[0] += 1
            i += 1
            time.sleep(0)  # gives the GIL up here even if a binding never does

    old = sys.getswitchinterval()
    # Switch only where a thread gives the GIL up itself (5 s is longer than this thread's
    # loop, which stops after 3 s even on a loaded machine): a binding that kept the GIL
    # during its C++ call would let the other thread run no step while this one plans.
    sys.setswitchinterval(5.0)
    try:
        t = threading.Thread(target=other)
        t.start()
        started.wait()
        space, planner, sels = a
        idx, desc, status = bufs[0]
        during = 0
        deadline = time.monotonic() + 3.0  # well under the switch interval
        i = 0
        while i < len(sels) or (during == 0 and time.monotonic() < deadline):
            c0 = counter[0]
            plan_and_complete(space, planner, sels[i % len(sels)], idx, desc, status)
            during += counter[0] - c0
            i += 1
        stop.set()
        t.join()
    finally:
        sys.setswitchinterval(old)
    assert during > 0, "the other thread never planned while this one was in C++"
    for space, planner, sels in (a, b):
        space.check_invariants()
        idx = bufs[0][0]
        planner.step(0, 0, sels[0], idx, np.ones(16, np.uint64))  # the last selection reads from device now
        for addr, slot in zip(sels[0].ravel()[:64], idx.ravel()[:64]):
            assert space.lookup(int(addr), 0) == ("device", 0, int(slot))


def test_engine_path_runs_its_descriptors_and_publishes_only_the_done_ones():
    """Against bytes this test wrote, not against the planner's own tables: the engine
    path's descriptors really run (execute_on_engine_memory) and every slot an index names
    holds its entry's bytes; a descriptor reported failed publishes nothing (the entry stays
    where it was, with its bytes)."""
    entry, dev_slots, host_slots = 32, 12, 60
    cfg = ulacache.AddressSpaceConfig(stable_new_entries=True, num_groups=1, entry_bytes=entry, device_bytes_per_rank=entry * dev_slots,
                                      host_bytes_per_rank=entry * host_slots)
    space = ulacache.AddressSpace(cfg, backend="counting")  # the engine owns the bytes
    space.add_request(1)
    addrs = space.allocate(1, dev_slots + host_slots)
    planner = ulacache.StepPlanner(space, max_batch=1, max_q_len=1, max_top_k=8)
    mem = {"device": np.zeros((1, dev_slots, entry), np.uint8), "host": np.zeros((1, host_slots, entry), np.uint8)}
    for tier, m in mem.items():
        planner.register_engine_memory(tier, 0, 0, m)

    def pattern(a):
        return ((int(a) * 131 + np.arange(entry)) & 0xFF).astype(np.uint8)

    for a in addrs:  # the engine's KV write, where UlaCache put each entry
        tier, _, slot = space.lookup(int(a), 0)
        mem[tier][0, slot] = pattern(a)
    rng = np.random.default_rng(7)
    idx = np.empty((1, 1, 8), np.int32)
    desc = np.zeros(planner.max_descriptors, ulacache.DESCRIPTOR_DTYPE)
    status = np.zeros(planner.max_descriptors, np.uint8)
    failed_total = 0
    for step in range(40):
        space.advance_round()
        sel = rng.choice(addrs, 8, replace=False).astype(np.int32).reshape(1, 1, 8)
        fence, n, _ = planner.plan(0, 0, sel, idx, desc, np.ones(1, np.uint64))
        # One descriptor in three steps does not run and is reported failed, as by an engine
        # whose copy failed; the others run over the engine's memory.
        j = int(rng.integers(n)) if n > 0 and step % 3 == 0 else -1
        run = np.array([i for i in range(n) if i != j], np.int64)
        ran = np.ones(len(run), np.uint8)
        planner.execute_on_engine_memory(desc[run], ran)
        assert not ran.any()
        status[:n] = 0
        fail = set()
        if j >= 0:
            status[j] = 1
            fail.add(int(desc[j]["addr"]))
        published, failed = planner.complete(fence, status[:n])
        assert (published, failed) == (n - len(fail), len(fail))
        failed_total += failed
        for a, slot in zip(sel.ravel(), idx.ravel()):
            tier, _, where = space.lookup(int(a), 0)
            if int(a) in fail:
                assert tier == "host", f"step {step}: address {a} of a failed descriptor was published"
                assert (mem["host"][0, where] == pattern(a)).all(), f"step {step}: address {a} lost its bytes"
            else:
                assert (mem["device"][0, slot] == pattern(a)).all(), f"step {step}: slot {slot} lacks address {a}"
        space.check_invariants()
    assert failed_total > 5



def test_engine_planner_threads_plan_as_one_thread():
    """The engine planner takes StepPlanner's threads (the same host step): on twin spaces, a
    planner at 3 threads writes the indices and descriptors of one at one thread; a bad
    value is refused and keeps the old options."""
    (s1, p1, sels), (s3, p3, _) = big_space(11), big_space(11)
    p3.set_options(threads=3, parallel_claim_min_victims=1)
    assert p3.options["threads"] == 3 and p1.options["threads"] == 1
    try:
        p3.set_options(threads=0)
        raise AssertionError("threads=0 was accepted")
    except ulacache.InvalidArgumentError:
        pass
    assert p3.options["threads"] == 3
    for sel in sels[:3]:
        outs = []
        for space, planner in ((s1, p1), (s3, p3)):
            idx = np.empty_like(sel)
            desc = np.zeros(planner.max_descriptors, ulacache.DESCRIPTOR_DTYPE)
            fence, n, _ = planner.plan(0, 0, sel, idx, desc, np.ones(sel.shape[0], np.uint64))
            planner.complete(fence, np.zeros(n, np.uint8))
            space.advance_round()
            outs.append((idx.copy(), desc[:n].copy()))
        assert (outs[0][0] == outs[1][0]).all()
        assert (outs[0][1] == outs[1][1]).all()
    assert s1.debug_digest() == s3.debug_digest()
    assert p3.counters["victims"] == p1.counters["victims"] > 0
