#!/usr/bin/env python3
"""A vLLM-shaped scheduler loop over UlaCache's engine step API, beside the mini engine's
SGLang-shaped one (examples/mini_engine.py). No model: the KV of a token is a byte pattern
of (request, position, version, group, layer), and every row attention would gather is
compared with a dense reference that never moves.

Per round, as a vLLM v1 scheduler and its model runner would:
  1. schedule: running requests first (decodes: the verified token and one MTP draft, q_len
     2), then chunked prefill of the others, within the token budget (max_num_batched_tokens)
     and max_num_seqs; then `planner.reserve_round(rank, requests, new_tokens, max_selections)`
     and, while it raises ResourceExhaustedError, defer the last scheduled request and ask
     again (a deferred request keeps its KV and runs in a later round);
  2. allocate each scheduled request's new tokens and fill vLLM's slot_mapping for every
     layer group in one call (`space.slot_mapping(addrs, out[num_groups, tokens])`); the KV
     write puts each new row there, in each layer of the group;
  3. per group: the indexer's selections [tokens, top_k] (random past positions of each
     token's request, causal, -1 padding) go to `planner.plan(..., requests,
     query_start_loc=...)` with the descriptors as columns (a structure of arrays); the
     "copy kernel" runs them from the columns alone (index_copy_ per layer with torch, fancy
     indexing with numpy), then `planner.complete(fence, status)`; every gathered row
     (device slot from the indices) is checked against the reference;
  4. verify the drafts: each decode's draft is rejected at random (half the time) and rolled
     back with `space.truncate(request, length)`; the next round recomputes that position (a
     new version of its KV, so a stale row would differ);
  5. `space.advance_round()`.
The device pool of each group is smaller than the history, so entries move every round.

Engine memory is vLLM's: per layer a [num_blocks, 64, row_bytes] tensor (torch where
installed, numpy otherwise), handed to register_engine_memory as register_kv_caches' dict;
the host pool's layers are [slots, row_bytes].

Prints one line (or --json) with rounds, plans, plans refused (0 when every round is
reserved), deferrals, rows checked; exits 1 if a gathered row differs from the reference or
a reserved round's plan was refused.

Usage: python3 examples/vllm_loop.py [--tensors auto|numpy|torch] [--requests N] [--seed S]
       [--budget TOKENS] [--device-slots N] [--no-reserve] [--json] [--build-dir DIR]
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
    """The reference KV rows [n, row] of tokens (req, pos, ver arrays) in (group, layer)."""
    base = (req.astype(np.int64) * 131 + pos * 31 + ver * 17 + group * 5 + layer * 3)[:, None]
    return ((np.arange(row)[None, :] * 7 + base) & 0xFF).astype(np.uint8)


class Request:
    def __init__(self, rid, prompt, output):
        self.rid, self.prompt, self.output = rid, prompt, output
        self.addrs = np.zeros(0, np.uint32)   # the KV it holds, in position order
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


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tensors", choices=["auto", "numpy", "torch"], default="auto")
    ap.add_argument("--requests", type=int, default=24)
    ap.add_argument("--seed", type=int, default=20261243)
    ap.add_argument("--budget", type=int, default=128, help="max_num_batched_tokens")
    ap.add_argument("--max-seqs", type=int, default=8, help="max_num_seqs")
    ap.add_argument("--device-slots", type=int, default=640, help="device slots per group")
    ap.add_argument("--top-k", type=int, default=32)
    ap.add_argument("--no-reserve", action="store_true",
                    help="schedule by the token budget alone (no reserve_round): stops at the first refused plan")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--build-dir")
    args = ap.parse_args(argv)
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
    groups, layers, row, top_k = 2, 2, 32, args.top_k
    dev, host = args.device_slots, 16384
    cfg = ulacache.AddressSpaceConfig(stable_new_entries=True, num_groups=groups, entry_bytes=layers * row,
                                      row_bytes=row, page_tokens=BLOCK,
                                      device_bytes_per_rank=groups * dev * layers * row,
                                      host_bytes_per_rank=groups * host * layers * row)
    space = ulacache.AddressSpace(cfg, backend="counting")
    # One planner row per token of the round (query_start_loc cuts them by request); a
    # request's selections are bounded by budget x top_k (a whole prefill chunk).
    planner = ulacache.EngineStepPlanner(space, max_batch=args.budget, max_q_len=args.budget, max_top_k=top_k,
                                         max_rows=args.budget)

    def zeros(shape):
        return torch.zeros(shape, dtype=torch.uint8) if torch is not None else np.zeros(shape, np.uint8)

    def as_np(t):
        return t.numpy() if torch is not None else t

    # vLLM's kv_caches: per layer [num_blocks, 64, row]; the host pool per layer [slots, row].
    mem = {}   # (tier, group) -> [numpy [slots, row] view per layer], the same memory
    for g in range(groups):
        kv_caches = {f"model.layers.{g * layers + l}.self_attn.attn": zeros((dev // BLOCK, BLOCK, row))
                     for l in range(layers)}
        host_layers = [zeros((host, row)) for _ in range(layers)]
        planner.register_engine_memory("device", 0, g, kv_caches)
        planner.register_engine_memory("host", 0, g, host_layers)
        mem[("device", g)] = [as_np(t).reshape(-1, row) for t in kv_caches.values()]
        mem[("host", g)] = [as_np(t) for t in host_layers]
    cols = {k: np.zeros(planner.max_descriptors, np.int64 if k.endswith("_offset") else np.int32)
            for k in ("src_slot", "dst_slot", "src_tier", "dst_tier", "op", "num_layers")}
    if torch is not None:
        cols = {k: torch.from_numpy(v) for k, v in cols.items()}
    # addr -> the token it holds now (the reference): request, position, version.
    extent = 1 << 16
    a_req, a_pos, a_ver = (np.full(extent, -1, np.int64) for _ in range(3))
    versions = {}   # (request, position) -> times computed

    waiting = [Request(r, int(rng.integers(60, 400)), int(rng.integers(8, 24))) for r in range(args.requests)]
    running = []
    m = dict(rounds=0, plans=0, plans_refused=0, deferrals=0, chunks_shrunk=0, reserve_calls=0, rows_checked=0, tokens=0,
             drafts=0, drafts_rejected=0, descriptors=0, max_device_needed=0)
    while waiting or running:
        # 1. schedule within the token budget; decodes (q_len 2) first, then prefill chunks.
        while waiting and len(running) < args.max_seqs:
            r = waiting.pop(0)
            space.add_request(r.rid)
            running.append(r)
        budget, batch = args.budget, []
        for r in running:
            n = min(r.prompt - r.computed, budget) if r.prefilling else (2 if budget >= 2 else 0)
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
        # 2. allocate; vLLM's slot_mapping for every group in one call; the KV write.
        qsl = np.zeros(len(batch) + 1, np.int32)
        positions, owners = [], []
        for b, (r, n) in enumerate(batch):
            new = space.allocate(r.rid, n)
            pos = np.arange(r.computed, r.computed + n)
            r.addrs = np.concatenate([r.addrs, new])
            for p in pos:
                versions[(r.rid, int(p))] = versions.get((r.rid, int(p)), -1) + 1
            a_req[new], a_pos[new] = r.rid, pos
            a_ver[new] = [versions[(r.rid, int(p))] for p in pos]
            qsl[b + 1] = qsl[b] + n
            positions.append(pos)
            owners.append(np.full(n, b))
        new_addrs = np.concatenate([r.addrs[-n:] for r, n in batch])
        slots = np.zeros((groups, len(new_addrs)), np.int64)
        space.slot_mapping(new_addrs, slots)
        for g in range(groups):
            for l in range(layers):
                mem[("device", g)][l][slots[g]] = kv_rows(a_req[new_addrs], a_pos[new_addrs], a_ver[new_addrs], g, l, row)
        m["tokens"] += len(new_addrs)
        positions, owners = np.concatenate(positions), np.concatenate(owners)
        requests = np.array([r.rid for r, _ in batch], np.int64)
        # 3. per group: selections -> plan -> the copies from the columns -> complete -> check.
        for g in range(groups):
            sel = np.full((len(positions), top_k), -1, np.int32)
            for i, (b, p) in enumerate(zip(owners, positions)):
                k = min(top_k, int(p) + 1)
                sel[i, :k] = batch[b][0].addrs[rng.choice(int(p) + 1, k, replace=False)]
            idx = np.zeros_like(sel)
            try:
                fence, n, _ = planner.plan(0, g, sel, idx, cols, requests, query_start_loc=qsl)
            except ulacache.ResourceExhaustedError as e:
                m["plans_refused"] += 1     # the round's tokens are allocated: it cannot be taken back
                print(f"round {m['rounds']} group {g}: plan refused after the round was scheduled: {e.message}")
                print(" ".join(f"{k}={v}" for k, v in m.items()))
                return 1
            m["plans"] += 1
            m["descriptors"] += n
            c = {k: v[:n] for k, v in cols.items()}
            if n:
                assert (as_np(c["src_tier"]) == ulacache.HOST).all() and (as_np(c["dst_tier"]) == ulacache.DEVICE).all()
            for l in range(layers):
                d, h = mem[("device", g)][l], mem[("host", g)][l]
                if torch is not None:       # a torch copy kernel over the columns
                    dt, ht = torch.from_numpy(d), torch.from_numpy(h)
                    src, dst = c["src_slot"].long(), c["dst_slot"].long()
                    wanted, victims = ht[src].clone(), dt[dst].clone()
                    dt.index_copy_(0, dst, wanted)
                    swaps = c["op"] == ulacache.SWAP
                    ht.index_copy_(0, src[swaps], victims[swaps])
                else:
                    src, dst = c["src_slot"].astype(np.int64), c["dst_slot"].astype(np.int64)
                    wanted, victims = h[src].copy(), d[dst].copy()
                    d[dst] = wanted
                    swaps = c["op"] == ulacache.SWAP
                    h[src[swaps]] = victims[swaps]
            planner.complete(fence, np.zeros(n, np.uint8))
            valid = sel >= 0
            assert ((idx >= 0) == valid).all()
            a = sel[valid]
            for l in range(layers):
                got = mem[("device", g)][l][idx[valid]]
                want = kv_rows(a_req[a], a_pos[a], a_ver[a], g, l, row)
                if not (got == want).all():
                    print(f"round {m['rounds']} group {g} layer {l}: a gathered row differs from the reference")
                    return 1
            m["rows_checked"] += int(valid.sum()) * layers
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
    space.check_invariants()
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
