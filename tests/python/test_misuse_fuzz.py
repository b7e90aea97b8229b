"""No abort from misuse (docs/INTEGRATION.md "Scheduler"): random call orders on the
bindings, plan and complete interleaved with free, truncate, allocate, write, share_into,
release and advance_round, with wrong fences and stale addresses. Every call either returns
or raises ulacache.Error; the driver runs in a subprocess so that an abort (a ULA_CHECK
reached from Python) fails the test instead of killing pytest. Seeded and bounded."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import ulacache

DRIVER = textwrap.dedent(r'''
    import random, sys
    import numpy as np
    import ulacache

    seed, steps, tp = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "tp"
    rng = random.Random(seed)
    E = 32
    if tp:
        cfg = ulacache.TpConfig(num_ranks=2, num_groups=2, entry_bytes=E, device_bytes_per_rank=6 * E * 2,
                                host_bytes_per_rank=40 * E * 2, buffer_bytes_per_rank=8 * E * 2,
                                page_tokens=4, stable_new_entries=True)
        space = ulacache.TpAddressSpace(cfg)
        planner = ulacache.TpStepPlanner(space, max_batch=2, max_q_len=2, max_top_k=4)
    else:
        cfg = ulacache.AddressSpaceConfig(num_groups=2, entry_bytes=E, device_bytes_per_rank=6 * E * 2,
                                          host_bytes_per_rank=40 * E * 2, page_tokens=4, stable_new_entries=True)
        space = ulacache.AddressSpace(cfg)
        planner = ulacache.StepPlanner(space, max_batch=2, max_q_len=2, max_top_k=4)
    desc = np.zeros(planner.max_descriptors, ulacache.DESCRIPTOR_DTYPE)
    pending = None  # (fence, n)
    ok = refused = 0
    seen = set()  # addresses ever handed out (stale ones too)
    for step in range(steps):
        op = rng.randrange(12)
        req = rng.randrange(1, 5)
        addr = rng.choice(sorted(seen)) if seen and rng.random() < 0.9 else rng.randrange(0, 200)
        try:
            if op == 0:
                space.add_request(req) if tp else space.add_request(req, 0)
            elif op == 1:
                seen.update(int(a) for a in space.allocate(req, rng.randrange(0, 6)))
            elif op == 2:
                space.free(req)
            elif op == 3:
                space.truncate(req, rng.randrange(0, 12))
            elif op == 4:
                space.write(addr, rng.randrange(0, 3), np.full(E, step & 0xFF, np.uint8))
            elif op == 5:
                space.share_into(req, np.array([addr], np.uint32))
            elif op == 6:
                (space.retain if rng.random() < 0.5 else space.release)(np.array([addr], np.uint32))
            elif op == 7:
                space.advance_round()
            elif op in (8, 9):
                rows = [rng.randrange(1, 6) for _ in range(rng.randrange(1, 3))]
                sel = np.full((len(rows), rng.randrange(1, 3), 4), -1, np.int32)
                for b, r in enumerate(rows):
                    try:
                        mine = [int(a) for a in space.addresses_of(r)]
                    except ulacache.Error:
                        mine = []
                    pool = mine + [rng.randrange(0, 200)]
                    for q in range(sel.shape[1]):
                        for k in range(4):
                            if rng.random() < 0.8:
                                sel[b, q, k] = rng.choice(pool)
                idx_shape = ((len(planner.ranks),) if tp else ()) + sel.shape
                idx = np.zeros(idx_shape, np.int32)
                out = planner.plan(*(() if tp else (0,)), rng.randrange(0, 3), sel, idx, desc,
                                   np.array(rows, np.uint64))
                pending = (out[0], out[1])
            elif op == 10 and pending is not None:
                fence, n = pending
                status = np.zeros(n, np.uint8)
                if tp:
                    planner.execute_on_shards(desc[:n], status)
                else:
                    status[:] = 1  # the counting-free cpu space: no engine memory, copies never ran
                bad_fence = rng.random() < 0.2
                bad_len = rng.random() < 0.1
                if not tp and rng.random() < 0.5:
                    status[:] = 1  # nothing ran: publish nothing (a status of 0 claims the copy landed)
                planner.complete(fence + 1 if bad_fence else fence, status[:max(n - 1, 0)] if bad_len and n else status)
                pending = None  # only once complete accepted it
            elif op == 11:
                space.check_invariants()
            ok += 1
        except ulacache.Error:
            refused += 1
    if pending is not None:
        planner.complete(pending[0], np.ones(pending[1], np.uint8))  # never ran: publish nothing
    space.check_invariants()
    print("done", ok, refused)
''')


def run_driver(seed, steps, mode):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([p for p in sys.path if p])
    r = subprocess.run([sys.executable, "-c", DRIVER, str(seed), str(steps), mode], capture_output=True, text=True,
                       env=env, timeout=120)
    return r


@pytest.mark.parametrize("mode", ["dp", "tp"])
def test_random_call_orders_never_abort(mode):
    for seed in (20261243, 20261244, 20261245):
        r = run_driver(seed, 3000, mode)
        assert r.returncode == 0, f"seed {seed} ({mode}): exit {r.returncode}\n{r.stdout[-2000:]}{r.stderr[-2000:]}"
        words = r.stdout.split()
        assert words[0] == "done" and int(words[1]) > 300 and int(words[2]) > 300, r.stdout


def test_free_between_plan_and_complete_is_refused_and_changes_nothing():
    cfg = ulacache.AddressSpaceConfig(entry_bytes=32, device_bytes_per_rank=4 * 32, host_bytes_per_rank=32 * 32,
                                      stable_new_entries=True)
    space = ulacache.AddressSpace(cfg)
    planner = ulacache.StepPlanner(space, max_batch=1, max_q_len=1, max_top_k=4)
    space.add_request(1, 0)
    addrs = space.allocate(1, 12)
    space.advance_round()
    desc = np.zeros(planner.max_descriptors, ulacache.DESCRIPTOR_DTYPE)
    sel = addrs[8:12].astype(np.int32).reshape(1, 1, 4)
    fence, n, _ = planner.plan(0, 0, sel, np.zeros_like(sel), desc, np.array([1], np.uint64))
    before = space.debug_digest()
    for call in (lambda: space.free(1), lambda: space.truncate(1, 2), lambda: space.allocate(1, 1),
                 lambda: space.write(int(addrs[0]), 0, np.zeros(32, np.uint8))):
        with pytest.raises(ulacache.FailedPreconditionError, match="plan is pending"):
            call()
        assert space.debug_digest() == before
    planner.complete(fence, np.zeros(n, np.uint8))
    space.free(1)
    space.check_invariants()
