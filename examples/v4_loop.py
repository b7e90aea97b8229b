#!/usr/bin/env python3
"""A DeepSeek-V4-shaped engine loop over UlaCache's kinds (docs/ARCHITECTURE.md, "Kinds";
docs/INTEGRATION.md, DeepSeek-V4), the Python twin of tests/step/v4_engine_loop_test.cc. No
model: the KV of a row is a byte pattern that names (request, position or entry, kind, layer,
version), and every row attention would read is compared with a dense reference in numpy.

The tiny model: 6 layers, each with a sliding window of WINDOW tokens; CSA layers 1, 3 and 4
add the top-k of their C4 entries (one per 4 tokens) through the engine step, HCA layers 2
and 5 every C128 entry (one per 128 tokens), layer 0 is window-only. Layers 1 and 3 form one
layer group that shares one selection (V4.1's reuse layers), layer 4 a group of its own. The
space's kinds: the window ring, C4 (the sparse kind: the space's addresses, over a device pool
smaller than the C4 history, with a host tier), its index keys, C128 and the compressor states.

Per round:
  1. admission: every decode (MTP: the verified token and one draft, q_len 2), then each
     waiting prefill chunk that `planner.reserve_round` still admits;
  2. `space.allocate`, and the KV write: each new token's window rows at the ring's page
     (`kind_pages_of`), each new C4 entry's rows at the slot `lookup` gives in each layer of
     its groups, each new C128 entry's rows at its page; the same rows go to the dense store;
  3. per group, the indexer's causal top-k of C4 entries of every query row (one selection
     for both layers of group 0) goes to `planner.plan` ([batch, 2, top_k] when every row is a
     decode, flat token rows with one request per row otherwise), the descriptors run on the
     engine's memory (`execute_on_engine_memory`), then `planner.complete`;
  4. attention's reads, checked: every window row of every layer through the ring's page
     table, the selected C4 rows at the plan's indices in each layer of the group, every C128
     row through its page table, each equal to the dense store's row;
  5. each decode's draft is rejected half the time (`space.truncate`), finished requests go
     and new ones arrive, `space.advance_round()`.
The window ring is the model's own, the window plus the drafts (ring_draft_tokens = DRAFT),
with prefill chunks far longer than the drafts: allocate frees the ring by the round's first
token (docs/ARCHITECTURE.md, "Kinds"), so a chunk's first row still reads the WINDOW - 1
tokens before its chunk, and advance_round frees the chunk's tokens no later round reads.

Prints one line (or --json) of counts; exits 1 if any row differs, a plan is refused, or a run
of 300 rounds or more never moved an entry, rolled a draft back, finished a request, ran
both shapes or read a C128 row.

With --tp P the same loop runs over a TP space with kinds at P ranks, attention at home
(docs/ARCHITECTURE.md, "Kinds under TP"; the C++ twin is tests/tp/tp_v4_engine_loop_test.cc):
`TpStepPlanner`'s reserve_round, plan, execute_on_shards and complete. A C4 entry is written on
its home (`write`) and read on that rank at its index of the plan (-1 on every other rank), the
window on the request's window home alone (`window_home_of`), C128 entry j on rank j mod P at its
local entry j / P (`kind_pages_of(request, kind, rank)`). A TP space has one entry size for every
group, so the TP model has four CSA layers (1, 3, 4, 6) in two groups of two.
Usage: python3 examples/v4_loop.py [--rounds N] [--seed S] [--json] [--build-dir DIR] [--tp P]
"""
import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
try:
    import numpy as np
    from vllm_loop import import_ulacache  # finds the in-tree build (ULA_PYTHON_PATH, --build-dir)
except ImportError:
    # Another python3 first on PATH (without numpy): run with the one the package is built for.
    if __name__ == "__main__" and os.path.realpath(sys.executable) != "/usr/bin/python3":
        os.execv("/usr/bin/python3", ["/usr/bin/python3", *sys.argv])
    raise

ROW, WINDOW, DRAFT, TOP_K, CHUNK, BATCH = 32, 24, 1, 8, 48, 5
Q_LEN = 1 + DRAFT
DEVICE_C4, HOST_C4 = 320, 4096   # C4 slots per group on each tier: the device far below the history
LAYERS = 6
CSA = [1, 3, 4]                  # the sparse kind's layers, in group order
GROUP_LAYERS = [2, 1]            # group 0: layers 1 and 3 (one selection), group 1: layer 4
GROUP_FIRST = [0, 2]             # the group's first sparse layer
HCA = [2, 5]
WINDOW_KIND, C4, C4_KEY, C128, C4_STATE, C128_STATE = range(6)
B = 64                           # KIND_BLOCK_ENTRIES: entries per block of a resident kind


def rows_of(req, index, kind, layer, ver):
    """[n, ROW] uint8 rows: index and request as 4 little-endian bytes each, kind, layer, the
    version as 4 bytes, then a pattern of them all (index, ver: int arrays of length n)."""
    index, ver = np.asarray(index, np.int64), np.asarray(ver, np.int64)
    n = len(index)
    base = (req * 131 + index * 31 + ver * 17 + kind * 5 + layer * 3)[:, None]
    out = ((np.arange(ROW)[None, :] * 7 + base) & 0xFF).astype(np.uint8)
    out[:, 0:4] = index.astype("<u4").view(np.uint8).reshape(n, 4)
    out[:, 4:8] = np.full(n, req, "<u4").view(np.uint8).reshape(n, 4)
    out[:, 8], out[:, 9] = kind, layer
    out[:, 10:14] = ver.astype("<u4").view(np.uint8).reshape(n, 4)
    return out


class Paged:
    """The engine's store of a resident kind: [blocks, layers, 64, ROW], indexed by the block
    ids of kind_pages_of (grown as the ids come)."""

    def __init__(self, layers):
        self.a = np.zeros((0, layers, B, ROW), np.uint8)

    def at(self, blocks):
        if len(blocks) and int(blocks.max()) >= len(self.a):
            grow = max(int(blocks.max()) + 1, 2 * len(self.a)) - len(self.a)
            self.a = np.concatenate([self.a, np.zeros((grow,) + self.a.shape[1:], np.uint8)])
        return self.a


def ring_rows(pages, positions):
    """(block ids, offsets) of live ring positions; raises if one is no longer in the ring."""
    first = pages.tokens - pages.entries
    if len(positions) and int(positions.min()) < first:
        raise AssertionError(f"position {int(positions.min())} left the ring (first live {first})")
    i = pages.first_offset + positions - first
    return np.asarray(pages.blocks)[i // pages.entries_per_block], i % pages.entries_per_block


def entry_rows(pages, entries):
    return np.asarray(pages.blocks)[entries // pages.entries_per_block], entries % pages.entries_per_block


class Request:
    def __init__(self, rid, prompt, target):
        self.rid, self.prompt, self.target, self.tokens, self.rows = rid, prompt, target, 0, 0
        cap = target + CHUNK + 2
        # The dense store: [layers, positions or entries, ROW]; lengths follow tokens.
        self.window = np.zeros((LAYERS, cap, ROW), np.uint8)
        self.c4 = np.zeros((len(CSA), cap // 4 + 1, ROW), np.uint8)
        self.c128 = np.zeros((len(HCA), cap // 128 + 1, ROW), np.uint8)

    @property
    def prefilling(self):
        return self.tokens < self.prompt


def make_config(ulacache):
    L, P = ulacache.KindLifetime, ulacache.KindPlacement
    cfg = ulacache.AddressSpaceConfig(num_groups=2, entry_bytes=2 * ROW, row_bytes=ROW, group_layers=GROUP_LAYERS,
                                      page_tokens=64, stable_new_entries=True,
                                      device_bytes_per_rank=DEVICE_C4 * len(CSA) * ROW,
                                      host_bytes_per_rank=HOST_C4 * len(CSA) * ROW)
    cfg.kinds = [
        ulacache.KvKind("window", 1, L.ring, ring_tokens=WINDOW + DRAFT, ring_draft_tokens=DRAFT, layers=LAYERS,
                        row_bytes=ROW),
        ulacache.KvKind("c4", 4, L.append, layers=len(CSA), row_bytes=ROW, placement=P.sparse),
        ulacache.KvKind("c4_index_key", 4, L.append, layers=len(CSA), row_bytes=16, companion_of=C4),
        ulacache.KvKind("c128", 128, L.append, layers=len(HCA), row_bytes=ROW),
        ulacache.KvKind("c4_state", 4, L.per_request, state_rows=8, layers=len(CSA), row_bytes=ROW),
        ulacache.KvKind("c128_state", 128, L.per_request, state_rows=128, layers=len(HCA), row_bytes=ROW),
    ]
    return cfg


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=300)
    ap.add_argument("--seed", type=int, default=20261206)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--build-dir")
    ap.add_argument("--tp", type=int, default=0, help="run over a TP space with kinds at this many ranks")
    args = ap.parse_args(argv)
    ulacache = import_ulacache(args.build_dir)
    rng = np.random.default_rng(args.seed)
    if args.tp:
        return run_tp(args, ulacache, rng)
    space = ulacache.AddressSpace(make_config(ulacache), backend="counting")   # the engine owns the bytes
    max_rows = BATCH * CHUNK
    planner = ulacache.StepPlanner(space, max_batch=max_rows, max_q_len=CHUNK, max_top_k=TOP_K, max_rows=max_rows)
    host_slots = space.config.host_slots_per_group
    c4_dev = [np.zeros((GROUP_LAYERS[g], DEVICE_C4, ROW), np.uint8) for g in range(2)]   # [layers, slots, ROW]
    c4_host = [np.zeros((GROUP_LAYERS[g], host_slots, ROW), np.uint8) for g in range(2)]
    for g in range(2):
        planner.register_engine_memory("device", 0, g, c4_dev[g])
        planner.register_engine_memory("host", 0, g, c4_host[g])
    c4_mem = {"device": c4_dev, "host": c4_host}
    window_mem, c128_mem = Paged(LAYERS), Paged(len(HCA))
    descriptors = np.zeros(planner.max_descriptors, ulacache.DESCRIPTOR_DTYPE)
    n = dict(rounds=0, q_len_2=0, flat=0, prefill_chunks=0, waited=0, decodes=0, drafts_rejected=0, finished=0,
             hits=0, misses=0, evictions=0, window_rows=0, c4_rows=0, c128_rows=0)
    running, next_id, next_version = [], 1, 1

    def arrive():
        nonlocal next_id
        prompt = 200 + int(rng.integers(0, 500))
        r = Request(next_id, prompt, prompt + 30 + int(rng.integers(0, 90)))
        next_id += 1
        space.add_request(r.rid)
        running.append(r)

    def allocate(r, count):
        """allocate and the KV write of every kind, in the engine's memory and the dense store."""
        nonlocal next_version
        fresh = space.allocate(r.rid, count)
        lo, r.tokens = r.tokens, r.tokens + count
        assert len(fresh) == r.tokens // 4 - lo // 4
        pos = np.arange(lo, r.tokens)
        ver = np.arange(next_version, next_version + count)
        next_version += count
        blk, off = ring_rows(space.kind_pages_of(r.rid, WINDOW_KIND), pos)
        mem = window_mem.at(blk)
        for l in range(LAYERS):
            r.window[l, lo:r.tokens] = mem[blk, l, off] = rows_of(r.rid, pos, WINDOW_KIND, l, ver)
        e = np.arange(lo // 4, r.tokens // 4)   # completed by tokens 4e + 3
        ev = ver[4 * e + 3 - lo]
        for g in range(2):
            where = [space.lookup(int(a), g) for a in fresh]
            for j in range(GROUP_LAYERS[g]):
                sl = GROUP_FIRST[g] + j
                rows = rows_of(r.rid, e, C4, CSA[sl], ev)
                r.c4[sl, e] = rows
                for (tier, _rank, slot), row in zip(where, rows):
                    c4_mem[tier][g][j, slot] = row
        e = np.arange(lo // 128, r.tokens // 128)
        if len(e):
            blk, off = entry_rows(space.kind_pages_of(r.rid, C128), e)
            mem = c128_mem.at(blk)
            for h, layer in enumerate(HCA):
                r.c128[h, e] = mem[blk, h, off] = rows_of(r.rid, e, C128, layer, ver[128 * e + 127 - lo])

    def demand(r, rows):
        return r.rid, (r.tokens + rows) // 4 - r.tokens // 4, rows * TOP_K

    def reserve(ds):
        try:
            planner.reserve_round(0, np.array([d[0] for d in ds], np.uint64), np.array([d[1] for d in ds], np.uint32),
                                  np.array([d[2] for d in ds], np.uint32))
            return True
        except ulacache.ResourceExhaustedError:
            return False

    for _ in range(BATCH):
        arrive()
    for rnd in range(args.rounds):
        # 1. admission
        ds = []
        for r in running:
            r.rows = 0 if r.prefilling else Q_LEN
            if r.rows:
                ds.append(demand(r, r.rows))
        assert reserve(ds), f"round {rnd}: the decodes alone were refused"
        for r in running:
            if r.prefilling:
                rows = min(CHUNK, r.prompt - r.tokens)
                if reserve(ds + [demand(r, rows)]):
                    ds.append(demand(r, rows))
                    r.rows = rows
                else:
                    n["waited"] += 1
        # 2. allocate and write
        sched = [r for r in running if r.rows]
        flat = any(r.prefilling for r in sched)
        row_req, row_pos, row_of = [], [], []
        for r in sched:
            n["prefill_chunks" if r.prefilling else "decodes"] += 1
            lo = r.tokens
            allocate(r, r.rows)
            row_req += [r.rid] * r.rows
            row_pos += list(range(lo, r.tokens))
            row_of += [r] * r.rows
        rows = len(row_req)
        n["flat" if flat else "q_len_2"] += 1
        requests = np.array(row_req if flat else [r.rid for r in sched], np.uint64)
        # 3. each group's indexer and step
        chosen, idx = [], []
        addrs = {r.rid: space.addresses_of(r.rid) for r in sched}
        for g in range(2):
            ch = np.full((rows, TOP_K), -1, np.int64)
            for i, q in enumerate(row_pos):
                visible = (q + 1) // 4
                k = min(TOP_K, visible)
                if k:
                    ch[i, :k] = rng.choice(visible, size=k, replace=False)
            sel = np.where(ch >= 0, addrs_of_rows(addrs, row_req, ch), -1).astype(np.int32)
            ix = np.full_like(sel, -2)
            shape = (rows, TOP_K) if flat else (rows // Q_LEN, Q_LEN, TOP_K)
            fence, count, stats = planner.plan(0, g, sel.reshape(shape), ix.reshape(shape), descriptors, requests)
            status = np.ones(count, np.uint8)
            planner.execute_on_engine_memory(descriptors[:count], status)
            assert not status.any(), f"round {rnd} group {g}: a descriptor did not run"
            published, failed = planner.complete(fence, status)
            assert failed == 0
            n["hits"] += stats.hits
            n["misses"] += stats.misses
            n["evictions"] += stats.evictions
            chosen.append(ch)
            idx.append(ix)
        # 4. attention's reads against the dense store
        pages = {r.rid: (space.kind_pages_of(r.rid, WINDOW_KIND), space.kind_pages_of(r.rid, C128)) for r in sched}
        for i, (r, q) in enumerate(zip(row_of, row_pos)):
            at = f"round {rnd} request {r.rid} position {q}"
            wp, cp = pages[r.rid]
            ps = np.arange(max(0, q + 1 - WINDOW), q + 1)
            blk, off = ring_rows(wp, ps)
            got = window_mem.a[blk, :, off]                       # [positions, layers, ROW]
            if not np.array_equal(got, r.window[:, ps].transpose(1, 0, 2)):
                raise AssertionError(f"{at}: a window row differs from the dense store")
            n["window_rows"] += got.shape[0] * got.shape[1]
            for g in range(2):
                ch, ix = chosen[g][i], idx[g][i]
                if not (ix[ch < 0] == -1).all():
                    raise AssertionError(f"{at}: a padding selection got an index")
                e, slots = ch[ch >= 0], ix[ch >= 0]
                if (slots < 0).any() or (slots >= DEVICE_C4).any():
                    raise AssertionError(f"{at} group {g}: an index off the device pool: {slots}")
                want = r.c4[GROUP_FIRST[g]:GROUP_FIRST[g] + GROUP_LAYERS[g]][:, e]
                if not np.array_equal(c4_dev[g][:, slots], want):
                    raise AssertionError(f"{at} group {g}: a C4 row at the plan's index differs from the dense store")
                n["c4_rows"] += want.shape[0] * want.shape[1]
            e = np.arange((q + 1) // 128)
            if len(e):
                blk, off = entry_rows(cp, e)
                got = c128_mem.a[blk, :, off]
                if not np.array_equal(got, r.c128[:, e].transpose(1, 0, 2)):
                    raise AssertionError(f"{at}: a C128 row differs from the dense store")
                n["c128_rows"] += got.shape[0] * got.shape[1]
        # 5. drafts verified, requests finish and arrive
        for r in sched:
            if r.tokens - r.rows >= r.prompt and rng.integers(0, 2):
                space.truncate(r.rid, r.tokens - DRAFT)
                r.tokens -= DRAFT
                n["drafts_rejected"] += 1
            assert len(space.addresses_of(r.rid)) == r.tokens // 4
            assert space.kind_pages_of(r.rid, C128).entries == r.tokens // 128
        for r in [r for r in running if r.tokens >= r.target]:
            space.free(r.rid)
            running.remove(r)
            n["finished"] += 1
        while len(running) < BATCH:
            arrive()
        space.advance_round()
        n["rounds"] += 1
    space.check_invariants()
    if args.rounds >= 300:   # the default run did what it names: entries moved, drafts rolled back,
        # requests came and went, both shapes ran, every kind's rows were read
        short = [k for k in ("q_len_2", "flat", "drafts_rejected", "finished", "misses", "evictions", "c128_rows")
                 if n[k] == 0]
        assert not short, f"the loop never exercised {short}"
    if args.json:
        print(json.dumps(n))
    else:
        print("v4 loop: " + ", ".join(f"{k} {v}" for k, v in n.items()))
    return 0


# The TP model: every group's entry is two CSA layers' rows (TpConfig has one entry size).
TP_LAYERS = 7
TP_CSA = [1, 3, 4, 6]            # group 0: layers 1 and 3, group 1: layers 4 and 6
TP_DEVICE_C4 = 384               # C4 slots per group over all ranks (DEVICE_C4 / P each)


def make_tp_config(ulacache, p):
    L, P = ulacache.KindLifetime, ulacache.KindPlacement
    slots = TP_DEVICE_C4 // p
    cfg = ulacache.TpConfig(num_ranks=p, num_groups=2, entry_bytes=2 * ROW, attention="at_home",
                            device_bytes_per_rank=slots * 2 * 2 * ROW, host_bytes_per_rank=HOST_C4 * 2 * 2 * ROW,
                            page_tokens=64, stable_new_entries=True)
    cfg.kinds = [
        ulacache.KvKind("window", 1, L.ring, ring_tokens=WINDOW + DRAFT, ring_draft_tokens=DRAFT, layers=TP_LAYERS,
                        row_bytes=ROW),
        ulacache.KvKind("c4", 4, L.append, layers=len(TP_CSA), row_bytes=ROW, placement=P.sparse),
        ulacache.KvKind("c4_index_key", 4, L.append, layers=len(TP_CSA), row_bytes=16, companion_of=C4),
        ulacache.KvKind("c128", 128, L.append, layers=len(HCA), row_bytes=ROW),
        ulacache.KvKind("c4_state", 4, L.per_request, state_rows=8, layers=len(TP_CSA), row_bytes=ROW),
        ulacache.KvKind("c128_state", 128, L.per_request, state_rows=128, layers=len(HCA), row_bytes=ROW),
    ]
    return cfg


def run_tp(args, ulacache, rng):
    """The loop over a TP space with kinds at P = args.tp ranks (the docstring's last part)."""
    p = args.tp
    space = ulacache.TpAddressSpace(make_tp_config(ulacache, p), backend="cpu")
    max_rows = BATCH * CHUNK
    planner = ulacache.TpStepPlanner(space, max_batch=max_rows, max_q_len=CHUNK, max_top_k=TOP_K, max_rows=max_rows)
    window_mem = [Paged(TP_LAYERS) for _ in range(p)]       # each rank's paged store
    c128_mem = [Paged(len(HCA)) for _ in range(p)]
    descriptors = np.zeros(planner.max_descriptors, ulacache.DESCRIPTOR_DTYPE)
    n = dict(rounds=0, q_len_2=0, flat=0, prefill_chunks=0, waited=0, decodes=0, drafts_rejected=0, finished=0,
             descriptors=0, window_rows=0, c4_rows=0, c128_rows=0)
    c4_on = [0] * p
    running, next_id, next_version = [], 1, 1

    def arrive():
        nonlocal next_id
        prompt = 200 + int(rng.integers(0, 500))
        r = Request(next_id, prompt, prompt + 30 + int(rng.integers(0, 90)))
        r.window = np.zeros((TP_LAYERS,) + r.window.shape[1:], np.uint8)
        r.c4 = np.zeros((len(TP_CSA),) + r.c4.shape[1:], np.uint8)
        next_id += 1
        space.add_request(r.rid)
        r.home = space.window_home_of(r.rid)
        running.append(r)

    def allocate(r, count):
        nonlocal next_version
        fresh = space.allocate(r.rid, count)
        lo, r.tokens = r.tokens, r.tokens + count
        assert len(fresh) == r.tokens // 4 - lo // 4
        pos = np.arange(lo, r.tokens)
        ver = np.arange(next_version, next_version + count)
        next_version += count
        blk, off = ring_rows(space.kind_pages_of(r.rid, WINDOW_KIND, r.home), pos)
        mem = window_mem[r.home].at(blk)
        for l in range(TP_LAYERS):
            r.window[l, lo:r.tokens] = mem[blk, l, off] = rows_of(r.rid, pos, WINDOW_KIND, l, ver)
        e = np.arange(lo // 4, r.tokens // 4)
        ev = ver[4 * e + 3 - lo]
        for g in range(2):   # each new C4 entry's group entry, written on its home
            rows = [rows_of(r.rid, e, C4, TP_CSA[2 * g + j], ev) for j in range(2)]
            for j in range(2):
                r.c4[2 * g + j, e] = rows[j]
            for k, a in enumerate(fresh):
                space.write(int(a), g, np.concatenate([rows[0][k], rows[1][k]]))
        for ent in range(lo // 128, r.tokens // 128):   # C128 entry j on rank j mod P, local j / P
            q = ent % p
            blk, off = entry_rows(space.kind_pages_of(r.rid, C128, q), np.array([ent // p]))
            mem = c128_mem[q].at(blk)
            for h, layer in enumerate(HCA):
                r.c128[h, ent] = mem[blk[0], h, off[0]] = rows_of(r.rid, [ent], C128, layer, [ver[128 * ent + 127 - lo]])[0]

    def demand(r, rows):
        return r.rid, (r.tokens + rows) // 4 - r.tokens // 4, rows * TOP_K

    def reserve(ds):
        try:
            planner.reserve_round(np.array([d[0] for d in ds], np.uint64), np.array([d[1] for d in ds], np.uint32),
                                  np.array([d[2] for d in ds], np.uint32))
            return True
        except ulacache.ResourceExhaustedError:
            return False

    for _ in range(BATCH):
        arrive()
    for rnd in range(args.rounds):
        ds = []
        for r in running:
            r.rows = 0 if r.prefilling else Q_LEN
            if r.rows:
                ds.append(demand(r, r.rows))
        assert reserve(ds), f"round {rnd}: the decodes alone were refused"
        for r in running:
            if r.prefilling:
                rows = min(CHUNK, r.prompt - r.tokens)
                if reserve(ds + [demand(r, rows)]):
                    ds.append(demand(r, rows))
                    r.rows = rows
                else:
                    n["waited"] += 1
        sched = [r for r in running if r.rows]
        flat = any(r.prefilling for r in sched)
        row_req, row_pos, row_of = [], [], []
        for r in sched:
            n["prefill_chunks" if r.prefilling else "decodes"] += 1
            lo = r.tokens
            allocate(r, r.rows)
            row_req += [r.rid] * r.rows
            row_pos += list(range(lo, r.tokens))
            row_of += [r] * r.rows
        rows = len(row_req)
        n["flat" if flat else "q_len_2"] += 1
        requests = np.array(row_req if flat else [r.rid for r in sched], np.uint64)
        chosen, sels, idx = [], [], []
        addrs = {r.rid: space.addresses_of(r.rid) for r in sched}
        for g in range(2):
            ch = np.full((rows, TOP_K), -1, np.int64)
            for i, q in enumerate(row_pos):
                visible = (q + 1) // 4
                k = min(TOP_K, visible)
                if k:
                    ch[i, :k] = rng.choice(visible, size=k, replace=False)
            sel = np.where(ch >= 0, addrs_of_rows(addrs, row_req, ch), -1).astype(np.int32)
            shape = (rows, TOP_K) if flat else (rows // Q_LEN, Q_LEN, TOP_K)
            ix = np.full((p,) + shape, -2, np.int32)
            fence, count, _stats, _first = planner.plan(g, sel.reshape(shape), ix, descriptors, requests)
            status = np.ones(count, np.uint8)
            planner.execute_on_shards(descriptors[:count], status)
            assert not status.any(), f"round {rnd} group {g}: a descriptor did not run"
            _published, failed = planner.complete(fence, status)
            assert failed == 0
            n["descriptors"] += count
            chosen.append(ch)
            sels.append(sel)
            idx.append(ix.reshape(p, rows, TOP_K))
        pools = [[space.shard_device_pool(h, g) for g in range(2)] for h in range(p)]   # [slots, 2 x ROW]
        for i, (r, q) in enumerate(zip(row_of, row_pos)):
            at = f"P {p} round {rnd} request {r.rid} position {q}"
            ps = np.arange(max(0, q + 1 - WINDOW), q + 1)   # the window: on its home alone
            blk, off = ring_rows(space.kind_pages_of(r.rid, WINDOW_KIND, r.home), ps)
            got = window_mem[r.home].a[blk, :, off]
            if not np.array_equal(got, r.window[:, ps].transpose(1, 0, 2)):
                raise AssertionError(f"{at}: a window row on its home differs from the dense store")
            n["window_rows"] += got.shape[0] * got.shape[1]
            for g in range(2):   # C4: each selection at its home's index, -1 on every other rank
                ch, sel = chosen[g][i], sels[g][i]
                for s_, (e, a) in enumerate(zip(ch, sel)):
                    home = int(a) % p if e >= 0 else -1
                    for h in range(p):
                        slot = int(idx[g][h, i, s_])
                        if h != home:
                            if slot != -1:
                                raise AssertionError(f"{at}: rank {h} got index {slot} for a selection homed on {home}")
                            continue
                        want = np.concatenate([r.c4[2 * g, e], r.c4[2 * g + 1, e]])
                        if not 0 <= slot < planner.device_slots or not np.array_equal(pools[h][g][slot], want):
                            raise AssertionError(f"{at} group {g}: C4 entry {e} differs on its home {h} at {slot}")
                        n["c4_rows"] += 2
                        c4_on[h] += 2
            for ent in range((q + 1) // 128):   # C128 entry j on rank j mod P
                owner = ent % p
                blk, off = entry_rows(space.kind_pages_of(r.rid, C128, owner), np.array([ent // p]))
                got = c128_mem[owner].a[blk[0], :, off[0]]
                if not np.array_equal(got, r.c128[:, ent]):
                    raise AssertionError(f"{at}: C128 entry {ent} differs on rank {owner}")
                n["c128_rows"] += len(HCA)
        for r in sched:
            if r.tokens - r.rows >= r.prompt and rng.integers(0, 2):
                space.truncate(r.rid, r.tokens - DRAFT)
                r.tokens -= DRAFT
                n["drafts_rejected"] += 1
            assert len(space.addresses_of(r.rid)) == r.tokens // 4
            stripes = [space.kind_pages_of(r.rid, C128, h).entries for h in range(p)]
            assert sum(stripes) == r.tokens // 128, f"C128 stripes {stripes} for {r.tokens} tokens"
            assert all(space.kind_pages_of(r.rid, WINDOW_KIND, h).entries == 0 for h in range(p) if h != r.home)
        for r in [r for r in running if r.tokens >= r.target]:
            space.free(r.rid)
            running.remove(r)
            n["finished"] += 1
        while len(running) < BATCH:
            arrive()
        space.advance_round()
        n["rounds"] += 1
    space.check_invariants()
    if args.rounds >= 300:
        short = [k for k in ("q_len_2", "flat", "drafts_rejected", "finished", "descriptors", "c128_rows")
                 if n[k] == 0] + [f"c4 rows on rank {h}" for h in range(p) if c4_on[h] == 0]
        assert not short, f"the loop never exercised {short}"
    n["ranks"] = p
    if args.json:
        print(json.dumps(n))
    else:
        print("v4 loop (TP): " + ", ".join(f"{k} {v}" for k, v in n.items()))
    return 0


def addrs_of_rows(addrs, row_req, ch):
    """The C4 addresses of chosen entries ch [rows, top_k] (-1 kept as entry 0, masked later)."""
    out = np.empty(ch.shape, np.int64)
    for i, rid in enumerate(row_req):
        out[i] = addrs[rid][np.maximum(ch[i], 0)] if len(addrs[rid]) else 0
    return out


if __name__ == "__main__":
    sys.exit(main())
