"""Draft rollback from Python (docs/ARCHITECTURE.md "Draft rollback and the engine step's
contract with the scheduler"): space.truncate frees a request's rejected drafts; the next
tokens get the same addresses back at the same positions; an MTP loop against a dense
reference."""
import numpy as np
import pytest

import ulacache


def test_truncate_rolls_drafts_back_in_place():
    cfg = ulacache.AddressSpaceConfig(entry_bytes=32, device_bytes_per_rank=64 * 32, host_bytes_per_rank=64 * 32,
                                      page_tokens=8, stable_new_entries=True)
    space = ulacache.AddressSpace(cfg)
    space.add_request(1, 0)
    a = space.allocate(1, 13)
    space.truncate(1, 10)  # three drafts rejected
    assert not space.is_live(int(a[10])) and space.num_live_addresses == 10
    b = space.allocate(1, 3)
    assert list(b) == list(a[10:13])  # the same positions get the same addresses back
    before = space.debug_digest()
    with pytest.raises(ulacache.OutOfRangeError):
        space.truncate(1, 14)
    space.retain(a[12:13])
    with pytest.raises(ulacache.FailedPreconditionError):
        space.truncate(1, 12)
    assert space.debug_digest() != before  # the retain; the refused truncate changed nothing more
    after_retain = space.debug_digest()
    with pytest.raises(ulacache.FailedPreconditionError):
        space.truncate(1, 0)
    assert space.debug_digest() == after_retain
    space.check_invariants()


def test_mtp_loop_with_random_acceptance_matches_the_dense_reference():
    """Engine path, q_len 3 (a token and two drafts), 0-2 drafts rejected at random and
    truncated, the device smaller than the history: every gathered row holds the KV of the
    token its address names now (a version per computation, so a stale draft row differs)."""
    rng = np.random.default_rng(20261246)
    row, layers, dev, host = 16, 2, 96, 1024
    cfg = ulacache.AddressSpaceConfig(entry_bytes=row * layers, row_bytes=row, device_bytes_per_rank=dev * row * layers,
                                      host_bytes_per_rank=host * row * layers, page_tokens=64, stable_new_entries=True)
    space = ulacache.AddressSpace(cfg, backend="counting")
    planner = ulacache.StepPlanner(space, max_batch=3, max_q_len=3, max_top_k=8)
    mem = {"device": np.zeros((layers, dev, row), np.uint8), "host": np.zeros((layers, host, row), np.uint8)}
    for tier, a in mem.items():
        planner.register_engine_memory(tier, 0, 0, a)
    version, counter = {}, [0]

    def kv(v):
        return ((np.arange(layers * row).reshape(layers, row) + v * 37) & 0xFF).astype(np.uint8)

    def write(a, v):
        tier, _, slot = space.lookup(int(a), 0)
        mem[tier][:, slot] = kv(v)

    for r in (1, 2, 3):
        space.add_request(r, 0)
        for a in space.allocate(r, 40 + 10 * r):
            counter[0] += 1
            version[int(a)] = counter[0]
            write(a, counter[0])
        space.advance_round()
    desc = np.zeros(planner.max_descriptors, ulacache.DESCRIPTOR_DTYPE)
    rows_checked = rejected_total = 0
    for _ in range(40):
        reqs = [1, 2, 3]
        fresh = {}
        for r in reqs:
            new = space.allocate(r, 3)
            fresh[r] = [(int(a), space.lookup(int(a), 0)) for a in new]
            for a in new:
                counter[0] += 1
                version[int(a)] = counter[0]
        sel = np.full((3, 3, 8), -1, np.int32)
        for b, r in enumerate(reqs):
            held = space.addresses_of(r)
            for q in range(3):
                visible = held[:len(held) - 2 + q]
                picks = rng.choice(visible[:-1], size=7, replace=False)
                sel[b, q, 0] = visible[-1]
                sel[b, q, 1:] = picks
        idx = np.zeros_like(sel)
        fence, n, _ = planner.plan(0, 0, sel, idx, desc, np.array(reqs, np.uint64))
        status = np.zeros(n, np.uint8)
        planner.execute_on_engine_memory(desc[:n], status)
        planner.complete(fence, status)
        for r in reqs:
            for a, loc in fresh[r]:
                assert space.lookup(a, 0) == loc  # a new token's slot never moves in its round
                tier, _, slot = loc
                mem[tier][:, slot] = kv(version[a])
        for a, i in zip(sel.ravel(), idx.ravel()):
            if a >= 0:
                assert np.array_equal(mem["device"][:, i], kv(version[int(a)])), f"address {a}"
                rows_checked += 1
        for r in reqs:  # verification: roll the rejected drafts back
            rejected = int(rng.integers(0, 3))
            if rejected:
                held = space.addresses_of(r)
                for a in held[len(held) - rejected:]:
                    del version[int(a)]
                space.truncate(r, len(held) - rejected)
                rejected_total += rejected
        space.advance_round()
    assert rows_checked > 2000 and rejected_total > 20
    assert space.num_live_addresses == len(version)
    space.check_invariants()
