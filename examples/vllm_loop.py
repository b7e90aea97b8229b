#!/usr/bin/env python3
"""A vLLM-shaped scheduler loop over UlaCache's engine step API, beside the mini engine's
SGLang-shaped one (examples/mini_engine.py). No model: the KV of a token is a byte pattern
that names (request, position, version, group, layer), and every row attention would gather
is compared with a dense reference that never moves.

Two sizes (--scale): `toy` (the default and the ctest: 32-byte rows, top-k 32, a token budget
of 128) and `vllm` (vLLM's sparse MLA: FP8 MLA rows of 656 bytes, top-k 2,048, a token budget
of 8,192, prefill chunks of 2,048). Either way the device pool of each group is smaller than
the history, so entries move every round.

Per round, as a vLLM v1 scheduler and its model runner would:
  1. schedule: running requests first (decodes: the verified token and one MTP draft, q_len
     2), then chunked prefill of the others (at most --chunk tokens each), within the token
     budget (max_num_batched_tokens) and max_num_seqs; then `planner.reserve_round(rank,
     requests, new_tokens, max_selections)` and, while it raises ResourceExhaustedError,
     defer the last scheduled request and ask again (a deferred request keeps its KV and runs
     in a later round);
  2. allocate each scheduled request's new tokens and fill vLLM's slot_mapping for every
     layer group in one call (`space.slot_mapping(addrs, out[num_groups, tokens])`); the KV
     write puts each new row there, in each layer of the group;
  3. per group: the indexer's selections [tokens, top_k] (min(top_k, p + 1) distinct past
     positions of a token at position p of its request, causal, -1 padding; drawn as a random
     arithmetic progression modulo p + 1, so that 2^24 of them are drawn in numpy) go to
     `planner.plan(..., requests, query_start_loc=...)` with the descriptors as columns (a
     structure of arrays); the "copy kernel" runs them from the columns alone (index_copy_
     per layer with torch, fancy indexing with numpy), then `planner.complete(fence,
     status)`; every gathered row is checked against the reference;
  4. verify the drafts: each decode's draft is rejected at random (half the time) and rolled
     back with `space.truncate(request, length)`; the next round recomputes that position (a
     new version of its KV, so a stale row would differ);
  5. `space.advance_round()`.

The check of step 3 covers every gathered row (selection (i, j) gathers the row at device
slot indices[i, j]) without materialising them: it checks that every selection of an
address maps to one slot that no other address of the step maps to, and that each slot so
named holds its address's reference bytes, in every layer. Its cost follows the distinct
entries of the step, not the 2^24 selections of a full budget.

Engine memory is vLLM's: per layer a [num_blocks, 64, row_bytes] tensor (torch where
installed, numpy otherwise), handed to register_engine_memory as register_kv_caches' dict;
the host pool's layers are [slots, row_bytes]. With --host-shadows the space keeps clean
host copies of fetched entries (AddressSpaceConfig.host_shadows): the plan then also holds
EVICT descriptors (the victim's device row to its host slot evict_slot first, then the host
source to the device slot), and the copy kernel reads the evict_slot column too.

Prints one line (or --json): rounds; plans, plans refused (0 when every round is reserved);
deferrals; rows checked; descriptors by op; the plans' misses and evictions; plan time per
group call (the whole Python call: medians over every plan, over the plans of full-budget
rounds and over those of decode-only rounds, and the largest) and the planner's own share
(StepPlanner.last_plan_timing). Exits 1 if a gathered row differs from the reference or
a reserved round's plan was refused.

Usage: python3 examples/vllm_loop.py [--scale toy|vllm] [--tensors auto|numpy|torch]
       [--requests N] [--seed S] [--budget TOKENS] [--chunk TOKENS] [--max-seqs N]
       [--device-slots N] [--top-k K] [--host-shadows] [--no-reserve] [--json] [--build-dir DIR]
--no-reserve schedules by the token budget alone, as vLLM's scheduler does: it stops at the
first plan refused after its round's tokens were allocated (exit 1).
"""
import argparse
import json
import os
import sys
import time
from pathlib import Path

DEBIAN_PYTHON = "/usr/bin/python3"  # the interpreter the package is built for (CMakeLists.txt)


def reexec_with_debian_python():
    if os.path.exists(DEBIAN_PYTHON) and os.path.realpath(sys.executable) != os.path.realpath(DEBIAN_PYTHON):
        os.execv(DEBIAN_PYTHON, [DEBIAN_PYTHON, *sys.argv])


try:
    import numpy as np
except ImportError:
    if __name__ == "__main__":
        reexec_with_debian_python()
    raise

REPO = Path(__file__).resolve().parent.parent
BLOCK = 64   # vLLM's block_size and UlaCache's page_tokens
GROUPS, LAYERS = 2, 2   # layer groups, layers per group

# The two sizes. host_slots 0: enough for every request's tokens (rounded up to pages).
SCALES = {
    "toy": dict(row=32, top_k=32, budget=128, chunk=128, max_seqs=8, device_slots=640, host_slots=16384,
                requests=24, prompt=(60, 400), output=(8, 24)),
    # DeepSeek V3.2's sparse MLA in vLLM: FP8 rows of 656 bytes (512 quantised + 4 x 4 scales
    # + 64 x 2 rope), top-k 2,048; vLLM's max_num_batched_tokens 8,192, chunks of 2,048.
    "vllm": dict(row=656, top_k=2048, budget=8192, chunk=2048, max_seqs=16, device_slots=32768, host_slots=0,
                 requests=16, prompt=(2048, 12288), output=(16, 48)),
}


def import_ulacache(build_dir):
    b = Path(build_dir) if build_dir else Path(os.environ.get("ULA_PYTHON_PATH", REPO / "build" / "python")).parent
    if (b / "python" / "ulacache").is_dir():
        sys.path.insert(0, str(b / "python"))
    try:
        import ulacache
    except ImportError:
        reexec_with_debian_python()
        raise
    return ulacache


def kv_rows(req, pos, ver, group, layer, row):
    """The reference KV rows [n, row] of tokens (req, pos, ver arrays) in (group, layer): the
    position and the request as 4 little-endian bytes each, then version, group and layer,
    then a pattern of them all; no two tokens, versions, groups or layers share a row."""
    n = len(req)
    base = (req.astype(np.int64) * 131 + pos * 31 + ver * 17 + group * 5 + layer * 3)[:, None]
    out = ((np.arange(row)[None, :] * 7 + base) & 0xFF).astype(np.uint8)
    out[:, 0:4] = pos.astype("<u4").view(np.uint8).reshape(n, 4)
    out[:, 4:8] = req.astype("<u4").view(np.uint8).reshape(n, 4)
    out[:, 8], out[:, 9], out[:, 10] = ver & 0xFF, group, layer
    return out


def draw_selections(rng, addrs, pos, top_k):
    """The indexer of one request's rows: [len(pos), top_k] int32 addresses, row i holding
    min(top_k, p + 1) distinct positions of [0, p] (p = pos[i]) mapped through the request's
    addresses, then -1. The positions are s + j * step modulo p + 1 (j < top_k) with s and
    step random and step coprime to p + 1: distinct, and drawn for every row at once."""
    m = pos.astype(np.int64) + 1
    s = rng.integers(0, m)
    step = rng.integers(1, np.maximum(m, 2))
    while True:
        bad = np.gcd(step, m) != 1
        if not bad.any():
            break
        step[bad] = rng.integers(1, np.maximum(m[bad], 2))
    j = np.arange(top_k, dtype=np.int64)[None, :]
    p = (s[:, None] + j * step[:, None]) % m[:, None]
    sel = addrs[p].astype(np.int32)
    sel[j >= m[:, None]] = -1
    return sel


class Request:
    def __init__(self, rid, prompt, output):
        self.rid, self.prompt, self.output = rid, prompt, output
        self.addrs = np.zeros(0, np.uint32)   # the KV it holds, in position order
        self.versions = np.full(prompt + output + 2, -1, np.int64)   # [position] times computed
        self.generated = 0                    # tokens verified past the prompt

    @property
    def computed(self):
        return len(self.addrs)

    @property
    def prefilling(self):
        return self.computed < self.prompt

    @property
    def done(self):
        return self.generated >= self.output


class Reference:
    """The dense reference: address -> the token it holds now (request, position, version)."""

    def __init__(self):
        self.req, self.pos, self.ver = (np.full(1 << 16, -1, np.int64) for _ in range(3))

    def set(self, addrs, req, pos, ver):
        if len(addrs) and int(addrs.max()) >= len(self.req):
            grow = max(int(addrs.max()) + 1, 2 * len(self.req)) - len(self.req)
            self.req, self.pos, self.ver = (np.concatenate([a, np.full(grow, -1, np.int64)])
                                            for a in (self.req, self.pos, self.ver))
        self.req[addrs], self.pos[addrs], self.ver[addrs] = req, pos, ver

    def rows(self, addrs, group, layer, row):
        return kv_rows(self.req[addrs], self.pos[addrs], self.ver[addrs], group, layer, row)


def run_descriptors(ulacache, c, dev_layers, host_layers, torch):
    """The copy kernel over the descriptor columns c (the plan's first n entries), per layer:
    COPY host src -> device dst; SWAP exchanges the two rows; EVICT copies the device dst row
    to host evict_slot, then host src -> device dst. Every row is read before any is written;
    that equals running the descriptors in order because no row one descriptor writes is
    another's (asserted: distinct device slots, distinct host rows read or written)."""
    as_np = (lambda t: t.numpy()) if torch is not None else (lambda t: t)
    op = as_np(c["op"])
    if not len(op):
        return
    swaps, evicts = op == ulacache.SWAP, op == ulacache.EVICT
    if evicts.any() and "evict_slot" not in c:
        raise RuntimeError("the plan holds EVICT descriptors (a space with host shadows) but the copy kernel was "
                           "given no evict_slot column")
    assert ((op == ulacache.COPY) | swaps | evicts).all(), f"an op this copy kernel does not know: {set(op.tolist())}"
    src, dst = as_np(c["src_slot"]), as_np(c["dst_slot"])
    host_rows = np.concatenate([src, as_np(c["evict_slot"])[evicts]]) if evicts.any() else src
    assert len(np.unique(dst)) == len(dst) and len(np.unique(host_rows)) == len(host_rows), \
        "two descriptors of one plan touch the same row: their order would matter"
    for d, h in zip(dev_layers, host_layers):
        if torch is not None:   # a torch copy kernel over the columns
            dt, ht = torch.from_numpy(d), torch.from_numpy(h)
            tsrc, tdst = c["src_slot"].long(), c["dst_slot"].long()
            tswaps, tevicts = torch.from_numpy(swaps), torch.from_numpy(evicts)
            wanted, victims = ht[tsrc], dt[tdst]   # gathers: copies
            ht.index_copy_(0, tsrc[tswaps], victims[tswaps])
            if evicts.any():
                ht.index_copy_(0, c["evict_slot"].long()[tevicts], victims[tevicts])
            dt.index_copy_(0, tdst, wanted)
        else:
            s64, d64 = src.astype(np.int64), dst.astype(np.int64)
            wanted, victims = h[s64], d[d64]
            h[s64[swaps]] = victims[swaps]
            if evicts.any():
                h[c["evict_slot"][evicts].astype(np.int64)] = victims[evicts]
            d[d64] = wanted


def check_gathered(ref, sel, idx, dev_layers, group, row):
    """Every gathered row against the reference: selection (i, j) of address sel[i, j] reads
    the device row idx[i, j]. None if they all match, else what differs. Each address of the
    step must map to one slot and each slot to one address (slot_addr below), and each slot so
    named must hold its address's reference row, in every layer."""
    valid = sel >= 0
    if not ((idx >= 0) == valid).all():
        return "an index is -1 where its selection is not padding, or the reverse"
    a, s = sel[valid].astype(np.int64), idx[valid].astype(np.int64)
    slot_addr = np.full(len(dev_layers[0]), -1, np.int64)
    slot_addr[s] = a
    if not (slot_addr[s] == a).all():
        return "two addresses of one step read the same device slot"
    slots = np.flatnonzero(slot_addr >= 0)
    addr = slot_addr[slots]
    if len(np.unique(addr)) != len(addr):
        return "an address of the step reads two device slots"
    for l, d in enumerate(dev_layers):
        bad = (d[slots] != ref.rows(addr, group, l, row)).any(axis=1)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            return (f"layer {l}: device slot {int(slots[i])} (address {int(addr[i])}) differs from the reference "
                    f"({int(bad.sum())} of {len(slots)} slots differ)")
    return None


def median(xs):
    return round(float(np.median(xs)), 2) if xs else 0.0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scale", choices=sorted(SCALES), default="toy",
                    help="toy (default): 32-byte rows, top-k 32, budget 128; vllm: 656-byte rows, top-k 2,048, "
                         "budget 8,192, chunks of 2,048. The options below override the scale's values.")
    ap.add_argument("--tensors", choices=["auto", "numpy", "torch"], default="auto")
    ap.add_argument("--requests", type=int)
    ap.add_argument("--seed", type=int, default=20261243)
    ap.add_argument("--budget", type=int, help="max_num_batched_tokens")
    ap.add_argument("--chunk", type=int, help="the largest prefill chunk of one request")
    ap.add_argument("--max-seqs", type=int, help="max_num_seqs")
    ap.add_argument("--device-slots", type=int, help="device slots per group")
    ap.add_argument("--top-k", type=int)
    ap.add_argument("--host-shadows", action="store_true",
                    help="keep clean host copies of fetched entries: the plans hold EVICT descriptors")
    ap.add_argument("--no-reserve", action="store_true",
                    help="schedule by the token budget alone (no reserve_round): stops at the first refused plan")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--build-dir")
    args = ap.parse_args(argv)
    sc = dict(SCALES[args.scale])
    for k in ("requests", "budget", "chunk", "max_seqs", "device_slots", "top_k"):
        if getattr(args, k) is not None:
            sc[k] = getattr(args, k)
    ulacache = import_ulacache(args.build_dir)
    torch = None
    if args.tensors in ("auto", "torch"):
        try:
            import torch
        except ImportError:
            if args.tensors == "torch":
                raise
    t0 = time.perf_counter()
    rng = np.random.default_rng(args.seed)
    row, top_k, budget_tokens, chunk = sc["row"], sc["top_k"], sc["budget"], min(sc["chunk"], sc["budget"])
    waiting = [Request(r, int(rng.integers(*sc["prompt"])), int(rng.integers(*sc["output"])))
               for r in range(sc["requests"])]
    history = sum(r.prompt + r.output for r in waiting)
    dev = sc["device_slots"]
    host = sc["host_slots"] or -(-(history + BLOCK * len(waiting)) // BLOCK) * BLOCK
    cfg = ulacache.AddressSpaceConfig(stable_new_entries=True, host_shadows=args.host_shadows, num_groups=GROUPS,
                                      entry_bytes=LAYERS * row, row_bytes=row, page_tokens=BLOCK,
                                      device_bytes_per_rank=GROUPS * dev * LAYERS * row,
                                      host_bytes_per_rank=GROUPS * host * LAYERS * row)
    space = ulacache.AddressSpace(cfg, backend="counting")
    # One planner row per token of the round (query_start_loc cuts them by request); a
    # request's selections are bounded by chunk x top_k (a whole prefill chunk).
    planner = ulacache.StepPlanner(space, max_batch=budget_tokens, max_q_len=chunk, max_top_k=top_k,
                                         max_rows=budget_tokens)

    def zeros(shape):
        return torch.zeros(shape, dtype=torch.uint8) if torch is not None else np.zeros(shape, np.uint8)

    def as_np(t):
        return t.numpy() if torch is not None else t

    # vLLM's kv_caches: per layer [num_blocks, 64, row]; the host pool per layer [slots, row].
    mem = {}   # (tier, group) -> [numpy [slots, row] view per layer], the same memory
    for g in range(GROUPS):
        kv_caches = {f"model.layers.{g * LAYERS + l}.self_attn.attn": zeros((dev // BLOCK, BLOCK, row))
                     for l in range(LAYERS)}
        host_layers = [zeros((host, row)) for _ in range(LAYERS)]
        planner.register_engine_memory("device", 0, g, kv_caches)
        planner.register_engine_memory("host", 0, g, host_layers)
        mem[("device", g)] = [as_np(t).reshape(-1, row) for t in kv_caches.values()]
        mem[("host", g)] = [as_np(t) for t in host_layers]
    fields = ["src_slot", "dst_slot", "src_tier", "dst_tier", "op", "num_layers"]
    if args.host_shadows:
        fields.append("evict_slot")
    cols = ulacache.descriptor_columns(planner.max_descriptors, fields)
    if torch is not None:
        cols = {k: torch.from_numpy(v) for k, v in cols.items()}
    ref = Reference()

    running = []
    m = dict(rounds=0, full_rounds=0, decode_rounds=0, plans=0, plans_refused=0, deferrals=0, chunks_shrunk=0,
             reserve_calls=0, rows_checked=0, tokens=0,
             history=history, device_slots=dev, drafts=0, drafts_rejected=0, descriptors=0, copies=0, swaps=0, evicts=0,
             misses=0, evictions=0, shadow_evictions=0, max_device_needed=0)
    # plan time per group call (ms): every plan, the plans of full-budget rounds, of decode-only rounds
    plan_ms, planner_ms, full_plan_ms, decode_plan_ms, max_rows = [], [], [], [], 0
    while waiting or running:
        # 1. schedule within the token budget; decodes (q_len 2) first, then prefill chunks.
        while waiting and len(running) < sc["max_seqs"]:
            r = waiting.pop(0)
            space.add_request(r.rid)
            running.append(r)
        budget, batch = budget_tokens, []
        for r in running:
            n = min(r.prompt - r.computed, budget, chunk) if r.prefilling else (2 if budget >= 2 else 0)
            if n > 0:
                batch.append((r, n))
                budget -= n
        while not args.no_reserve:
            m["reserve_calls"] += 1
            try:
                needed, _room = planner.reserve_round(
                    0, np.array([r.rid for r, _ in batch], np.int32), np.array([n for _, n in batch], np.uint32),
                    np.array([n * top_k for _, n in batch], np.uint32))
                m["max_device_needed"] = max(m["max_device_needed"], needed)
                break
            except ulacache.ResourceExhaustedError:
                r, n = batch[-1]
                if len(batch) == 1:           # alone and too large: a smaller prefill chunk
                    if n == 1 or not r.prefilling:
                        raise
                    batch[-1] = (r, n // 2)
                    m["chunks_shrunk"] += 1
                    continue
                batch.pop()                   # deferred to a later round, its KV kept
                m["deferrals"] += 1
        decode_only = all(not r.prefilling for r, _ in batch)
        full = sum(n for _, n in batch) == budget_tokens
        # 2. allocate; vLLM's slot_mapping for every group in one call; the KV write.
        qsl = np.zeros(len(batch) + 1, np.int32)
        for b, (r, n) in enumerate(batch):
            new = space.allocate(r.rid, n)
            pos = np.arange(r.computed, r.computed + n)
            r.addrs = np.concatenate([r.addrs, new])
            r.versions[pos] += 1
            ref.set(new, r.rid, pos, r.versions[pos])
            qsl[b + 1] = qsl[b] + n
        new_addrs = np.concatenate([r.addrs[-n:] for r, n in batch])
        slots = np.zeros((GROUPS, len(new_addrs)), np.int64)
        space.slot_mapping(new_addrs, slots)
        for g in range(GROUPS):
            for l in range(LAYERS):
                mem[("device", g)][l][slots[g]] = ref.rows(new_addrs, g, l, row)
        m["tokens"] += len(new_addrs)
        max_rows = max(max_rows, len(new_addrs))
        requests = np.array([r.rid for r, _ in batch], np.int64)
        # 3. per group: selections -> plan -> the copies from the columns -> complete -> check.
        for g in range(GROUPS):
            sel = np.concatenate([draw_selections(rng, r.addrs, np.arange(r.computed - n, r.computed), top_k)
                                  for r, n in batch])
            idx = np.zeros_like(sel)
            try:
                t = time.perf_counter()
                fence, n, stats = planner.plan(0, g, sel, idx, cols, requests, query_start_loc=qsl)
                plan_ms.append((time.perf_counter() - t) * 1e3)
            except ulacache.ResourceExhaustedError as e:
                m["plans_refused"] += 1     # the round's tokens are allocated: it cannot be taken back
                print(f"round {m['rounds']} group {g}: plan refused after the round was scheduled: {e.message}")
                print(" ".join(f"{k}={v}" for k, v in m.items()))
                return 1
            planner_ms.append(planner.last_plan_timing["planner_ns"] / 1e6)
            if decode_only:
                decode_plan_ms.append(plan_ms[-1])
            if full:
                full_plan_ms.append(plan_ms[-1])
            m["plans"] += 1
            m["descriptors"] += n
            m["misses"] += stats.misses
            m["evictions"] += stats.evictions
            m["shadow_evictions"] += stats.shadow_evictions
            c = {k: v[:n] for k, v in cols.items()}
            op = as_np(c["op"])
            m["copies"] += int((op == ulacache.COPY).sum())
            m["swaps"] += int((op == ulacache.SWAP).sum())
            m["evicts"] += int((op == ulacache.EVICT).sum())
            if n:
                assert (as_np(c["src_tier"]) == ulacache.HOST).all() and (as_np(c["dst_tier"]) == ulacache.DEVICE).all()
            run_descriptors(ulacache, c, mem[("device", g)], mem[("host", g)], torch)
            planner.complete(fence, np.zeros(n, np.uint8))
            wrong = check_gathered(ref, sel, idx, mem[("device", g)], g, row)
            if wrong:
                print(f"round {m['rounds']} group {g}: a gathered row differs from the reference: {wrong}")
                return 1
            m["rows_checked"] += int((sel >= 0).sum()) * LAYERS
        # 4. verify the drafts: reject half at random and roll them back.
        for r, n in batch:
            if r.prefilling:
                continue
            if n == 2 and r.computed - 2 >= r.prompt:   # a decode step: the verified token + a draft
                m["drafts"] += 1
                if rng.random() < 0.5:
                    space.truncate(r.rid, r.computed - 1)
                    r.addrs = r.addrs[:-1]
                    m["drafts_rejected"] += 1
                    r.generated += 1
                else:
                    r.generated += 2
            # (the round that finished a prompt produced its first token: nothing to verify)
        for r in [r for r in running if r.done]:
            space.free(r.rid)
            running.remove(r)
        space.advance_round()
        m["rounds"] += 1
        m["full_rounds"] += full
        m["decode_rounds"] += decode_only
    space.check_invariants()
    m.update(max_round_tokens=max_rows, plan_ms=median(plan_ms), planner_ms=median(planner_ms),
             full_plan_ms=median(full_plan_ms), decode_plan_ms=median(decode_plan_ms),
             max_plan_ms=round(max(plan_ms, default=0), 2))
    m["seconds"] = round(time.perf_counter() - t0, 2)
    m["tensors"] = "torch" if torch is not None else "numpy"
    m["bit_identical"] = True
    if args.json:
        print(json.dumps(m))
    else:
        print(" ".join(f"{k}={v}" for k, v in m.items()))
    return 0 if m["plans_refused"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
