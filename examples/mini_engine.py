#!/usr/bin/env python3
"""A mini inference engine over UlaCache: continuous-batching decode of the tiny sparse MLA
model (configs/models/tiny_glm.json) in numpy.

Each decode step, per layer group: the model's lightning indexer (the library's C++
indexer, ulacache.Indexer) picks the top-k past positions of every request; the engine
maps them to UlaCache logical addresses and fills a fixed-shape selection array
[max_batch, 1, top_k] (-1 padding); UlaCache's engine step API writes the attention index
array in the sparse MLA kernels' layout (FlashMLA sparse decode: the device slot, -1
padding) and the copy plan; the engine runs the copies, calls complete(), and attention
gathers the latent KV entries of every layer of the group through the index array.
The device and host pools are each smaller than the history, so entries move every step.

The same model runs a second time over a dense store that never moves (entry of request r,
position t at a fixed row). The two runs must produce bit-identical logits; the script
exits 1 if they do not.

Execution of the copy plan (--exec):
  engine   (default) the engine owns the KV memory: per group, numpy arrays
           [layers, slots, entry] for the device and host tiers (vLLM's per-layer caches,
           stacked), registered with the planner; UlaCache runs on the counting backend (no
           bytes of its own), plan() returns descriptors, the engine runs them with numpy
           fancy indexing and calls complete(fence, status).
  library  UlaCache's CPU backend holds the bytes; planner.step() runs the copies; the
           engine writes entries with space.write() and attention reads the device pool
           view (space.device_pool) through the same index array.

Model (float32, fixed random weights): per layer an absorbed-MLA attention in the latent
space (query [heads, kv_lora_rank + rope dim] against latent entries [kv_lora_rank + rope
dim], values = the first kv_lora_rank values; no rotary), a tanh output projection with a
residual; per group a lightning indexer (index heads x index_head_dim, ReLU-weighted dot).
A decoding token attends to the top-k of its history plus itself. Prefill computes the
prompt's entries with dense causal attention (the same code in both runs); decode is sparse.
The MTP layer of the config is not run (no speculative decoding here).

Usage: python3 examples/mini_engine.py [--exec engine|library] [--json] [--requests N]
The in-tree build is found without installing (<repo>/build/python, or --build-dir).
"""
import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

DEBIAN_PYTHON = "/usr/bin/python3"  # the interpreter the package is built for (CMakeLists.txt)


def reexec_with_debian_python():
    """When another python3 comes first on PATH (without numpy, or another ABI than the
    built extension), run this script with Debian's interpreter instead."""
    if os.path.exists(DEBIAN_PYTHON) and os.path.realpath(sys.executable) != os.path.realpath(DEBIAN_PYTHON):
        os.execv(DEBIAN_PYTHON, [DEBIAN_PYTHON, *sys.argv])


try:
    import numpy as np
except ImportError:
    if __name__ == "__main__":
        reexec_with_debian_python()
    raise

REPO = Path(__file__).resolve().parent.parent


def import_ulacache(build_dir):
    candidates = [Path(build_dir)] if build_dir else [REPO / "build"]
    for b in candidates:
        if (b / "python" / "ulacache").is_dir():
            sys.path.insert(0, str(b / "python"))
            break
    try:
        import ulacache  # noqa: F401  (installed, or the in-tree build found above)
    except ImportError:
        reexec_with_debian_python()
        raise
    return ulacache


class TinyModel:
    """Fixed random weights for the tiny_glm shape."""

    def __init__(self, cfg, vocab=128, hidden=64, seed=1234):
        rng = np.random.default_rng(seed)
        f32 = np.float32
        self.cfg = cfg
        self.vocab, self.hidden = vocab, hidden
        self.heads = cfg.attention_heads
        self.lora = cfg.kv_lora_rank
        self.width = cfg.kv_lora_rank + cfg.qk_rope_head_dim  # floats per layer entry
        assert self.width * 4 == cfg.kv_entry_bytes_per_layer, "tiny_glm entries are float32"
        self.num_layers = cfg.num_layers
        self.num_groups = math.ceil(cfg.num_layers / cfg.layers_per_group)  # main groups (MTP not run)
        self.group_layers = [list(range(g * cfg.layers_per_group, min(cfg.num_layers, (g + 1) * cfg.layers_per_group)))
                             for g in range(self.num_groups)]
        self.layers_per_group = cfg.layers_per_group
        self.ih, self.idim, self.top_k = cfg.index_heads, cfg.index_head_dim, cfg.top_k
        s = 1.0 / math.sqrt(hidden)
        self.emb = rng.standard_normal((vocab, hidden)).astype(f32)
        self.w_kv = [(rng.standard_normal((hidden, self.width)) * s).astype(f32) for _ in range(self.num_layers)]
        self.w_q = [(rng.standard_normal((hidden, self.heads * self.width)) * s).astype(f32)
                    for _ in range(self.num_layers)]
        self.w_o = [(rng.standard_normal((self.heads * self.lora, hidden)) * (1.0 / math.sqrt(self.heads * self.lora)))
                    .astype(f32) for _ in range(self.num_layers)]
        self.w_iq = [(rng.standard_normal((hidden, self.ih * self.idim)) * s).astype(f32) for _ in range(self.num_groups)]
        self.w_iw = [(rng.standard_normal((hidden, self.ih)) * s).astype(f32) for _ in range(self.num_groups)]
        self.w_ik = [(rng.standard_normal((hidden, self.idim)) * s).astype(f32) for _ in range(self.num_groups)]
        self.scale = np.float32(1.0 / math.sqrt(self.width))

    def attend(self, layer, x, kv_self, entries, mask):
        """x [B, hidden]; kv_self [B, width]; entries [B, K, width] (0 where masked); mask [B, K]."""
        b = x.shape[0]
        q = (x @ self.w_q[layer]).reshape(b, self.heads, self.width)
        s = np.matmul(q, entries.transpose(0, 2, 1)) * self.scale          # [B, H, K]
        s = np.where(mask[:, None, :], s, np.float32(-np.inf))
        s_self = np.sum(q * kv_self[:, None, :], axis=2) * self.scale      # [B, H]
        m = np.maximum(s.max(axis=2), s_self)
        p = np.exp(s - m[:, :, None])
        p_self = np.exp(s_self - m)
        denom = p.sum(axis=2) + p_self
        out = np.matmul(p, entries[:, :, :self.lora]) + p_self[:, :, None] * kv_self[:, None, :self.lora]
        out = out / denom[:, :, None]
        return x + np.tanh(out.reshape(b, self.heads * self.lora) @ self.w_o[layer])

    def prefill(self, tokens):
        """Dense causal prefill of one prompt: (entries [layers, P, width], index keys
        [groups, P, idim], logits of the last token)."""
        x = self.emb[tokens]
        n = len(tokens)
        entries = np.zeros((self.num_layers, n, self.width), np.float32)
        ikeys = np.zeros((self.num_groups, n, self.idim), np.float32)
        causal = np.tril(np.ones((n, n), bool))
        for g, layers in enumerate(self.group_layers):
            ikeys[g] = x @ self.w_ik[g]
            for layer in layers:
                kv = x @ self.w_kv[layer]
                entries[layer] = kv
                q = (x @ self.w_q[layer]).reshape(n, self.heads, self.width)
                s = np.einsum("ihc,jc->hij", q, kv) * self.scale
                s = np.where(causal[None], s, np.float32(-np.inf))
                p = np.exp(s - s.max(axis=2, keepdims=True))
                out = np.einsum("hij,jc->ihc", p, kv[:, :self.lora]) / p.sum(axis=2).T[:, :, None]
                x = x + np.tanh(out.reshape(n, self.heads * self.lora) @ self.w_o[layer])
        return entries, ikeys, x[-1] @ self.emb.T


def make_requests(n, seed):
    rng = np.random.default_rng(seed)
    reqs = []
    for i in range(n):
        reqs.append({"id": i, "arrival": int(i * 2), "prompt": rng.integers(0, 128, int(rng.integers(40, 121))).astype(np.int64),
                     "gen": int(rng.integers(12, 41))})
    return reqs


class DenseStore:
    """The reference: entry (request, position) at a fixed row, never moves."""

    def __init__(self, model, reqs):
        self.model = model
        self.max_len = max(len(r["prompt"]) + r["gen"] for r in reqs)
        self.kv = np.zeros((model.num_layers, len(reqs) * self.max_len, model.width), np.float32)

    def admit(self, rid, entries):
        base = rid * self.max_len
        self.kv[:, base:base + entries.shape[1]] = entries

    def append(self, rid, pos, entry_per_layer):
        self.kv[:, rid * self.max_len + pos] = entry_per_layer

    def gather_group(self, g, rids, positions):
        """positions [B, K] int32 (-1 padding) -> per layer of the group (entries, mask)."""
        mask = positions >= 0
        rows = np.where(mask, np.asarray(rids)[:, None] * self.max_len + positions, 0)
        out = []
        for layer in self.model.group_layers[g]:
            e = self.kv[layer][rows]
            e[~mask] = 0
            out.append(e)
        return out, mask

    def finish(self, rid):
        pass


class UlaStore:
    """Entries placed by UlaCache over device and host pools smaller than the history."""

    def __init__(self, ulacache, model, device_slots, host_slots, max_batch, mode):
        self.u, self.model, self.mode = ulacache, model, mode
        self.entry_floats = model.layers_per_group * model.width  # widest group: the slot size
        cfg = ulacache.AddressSpaceConfig(num_ranks=1, num_groups=model.num_groups, entry_bytes=self.entry_floats * 4,
                                          device_bytes_per_rank=device_slots * self.entry_floats * 4 * model.num_groups,
                                          host_bytes_per_rank=host_slots * self.entry_floats * 4 * model.num_groups)
        self.space = ulacache.AddressSpace(cfg, backend="counting" if mode == "engine" else "cpu")
        self.planner = ulacache.EngineStepPlanner(self.space, max_batch=max_batch, max_q_len=1, max_top_k=model.top_k)
        self.indices = np.full((max_batch, 1, model.top_k), -1, np.int32)
        self.desc = np.zeros(self.planner.max_descriptors, ulacache.DESCRIPTOR_DTYPE)
        self.status = np.zeros(self.planner.max_descriptors, np.uint8)
        self.addrs = {}
        self.stats = {"selections": 0, "distinct": 0, "hits": 0, "misses": 0, "evictions": 0, "bytes_moved": 0}
        self.mem = None
        if mode == "engine":
            # Engine-owned KV: [tier][group] -> [layers_per_group, slots, width] float32.
            lpg = model.layers_per_group
            self.mem = {"device": [np.zeros((lpg, device_slots, model.width), np.float32) for _ in range(model.num_groups)],
                        "host": [np.zeros((lpg, host_slots, model.width), np.float32) for _ in range(model.num_groups)]}
            for tier, arrays in self.mem.items():
                for g, a in enumerate(arrays):
                    self.planner.register_engine_memory(tier, 0, g, a)
        else:
            self.pools = [self.space.device_pool(0, g).view(np.float32).reshape(device_slots, model.layers_per_group,
                                                                                model.width)
                          for g in range(model.num_groups)]

    def _write(self, addr, g, entry):  # entry [layers of g, width]
        if self.mode == "engine":
            tier, _, slot = self.space.lookup(addr, g)
            self.mem[tier][g][:entry.shape[0], slot] = entry
        else:
            buf = np.zeros((self.model.layers_per_group, self.model.width), np.float32)
            buf[:entry.shape[0]] = entry
            self.space.write(addr, g, buf.reshape(-1).view(np.uint8))

    def admit(self, rid, entries):
        self.space.add_request(rid)
        addrs = self.space.allocate(rid, entries.shape[1])  # ResourceExhaustedError if it cannot fit
        self.addrs[rid] = list(addrs)
        for g, layers in enumerate(self.model.group_layers):
            for i, a in enumerate(addrs):
                self._write(int(a), g, entries[layers, i])

    def append(self, rid, pos, entry_per_layer):
        (a,) = self.space.allocate(rid, 1)
        self.addrs[rid].append(a)
        for g, layers in enumerate(self.model.group_layers):
            self._write(int(a), g, entry_per_layer[layers])

    def _run_descriptors(self, n):
        """The engine's copy kernel: descriptors[:n] over its own memory (numpy)."""
        d = self.desc[:n]
        g = d["group"]
        for group in np.unique(g):
            sel = d[g == group]
            dev, host = self.mem["device"][group], self.mem["host"][group]
            for op_rows in (sel[sel["op"] == self.u.COPY], sel[sel["op"] == self.u.SWAP]):
                src, dst = op_rows["src_slot"], op_rows["dst_slot"]
                if op_rows.size and op_rows["op"][0] == self.u.SWAP:
                    victim = dev[:, dst].copy()
                    dev[:, dst] = host[:, src]
                    host[:, src] = victim
                else:
                    dev[:, dst] = host[:, src]
        self.status[:n] = 0

    def gather_group(self, g, rids, positions):
        mask = positions >= 0
        sel = np.full(self.indices.shape, -1, np.int32)
        for b, rid in enumerate(rids):
            if rid < 0:
                continue
            row = positions[b]
            k = int(mask[b].sum())
            if k:
                sel[b, 0, :k] = np.asarray(self.addrs[rid], np.int64)[row[:k]]
        if self.mode == "engine":
            fence, n, st = self.planner.plan(0, g, sel, self.indices, self.desc)
            self._run_descriptors(n)
            published, failed = self.planner.complete(fence, self.status[:n])
            assert failed == 0
        else:
            st = self.planner.step(0, g, sel, self.indices)
        for key in self.stats:
            self.stats[key] += getattr(st, key)
        idx = self.indices[:, 0, :]
        safe = np.where(idx >= 0, idx, 0)
        out = []
        for li, _ in enumerate(self.model.group_layers[g]):
            if self.mode == "engine":
                e = self.mem["device"][g][li][safe]
            else:
                e = self.pools[g][safe, li]
            e[~mask] = 0
            out.append(e)
        return out, mask

    def finish(self, rid):
        self.space.free(rid)
        del self.addrs[rid]

    def end_step(self):
        self.space.advance_round()


def run(model, ulacache, reqs, store, max_batch):
    """Continuous batching: admit arrived requests into free batch rows, decode, finish."""
    b_rows = [-1] * max_batch
    pos = {}      # rid -> next position
    left = {}     # rid -> tokens still to generate
    last = {}     # rid -> last generated token
    ikeys = {}    # rid -> [groups, max_len, idim]
    logits_log, tokens_log = [], []
    indexer = ulacache.Indexer(model.ih, model.idim, model.top_k)
    waiting = list(reqs)
    step = 0
    decode_tokens = 0
    t_decode = 0.0
    while waiting or any(r >= 0 for r in b_rows):
        for b in range(max_batch):
            if b_rows[b] < 0 and waiting and waiting[0]["arrival"] <= step:
                r = waiting.pop(0)
                entries, keys, logits = model.prefill(r["prompt"])
                store.admit(r["id"], entries)
                rid = r["id"]
                n = len(r["prompt"])
                ikeys[rid] = np.zeros((model.num_groups, n + r["gen"], model.idim), np.float32)
                ikeys[rid][:, :n] = keys
                pos[rid], left[rid] = n, r["gen"]
                last[rid] = int(np.argmax(logits))
                logits_log.append(logits)
                tokens_log.append((rid, last[rid]))
                b_rows[b] = rid
        active = [b for b in range(max_batch) if b_rows[b] >= 0]
        if not active:
            step += 1
            continue
        t0 = time.perf_counter()
        toks = np.array([last[b_rows[b]] if b_rows[b] >= 0 else 0 for b in range(max_batch)])
        x = model.emb[toks]
        new_entries = np.zeros((max_batch, model.num_layers, model.width), np.float32)
        for g, layers in enumerate(model.group_layers):
            iq = x @ model.w_iq[g]
            iw = x @ model.w_iw[g]
            ik = x @ model.w_ik[g]
            positions = np.full((max_batch, model.top_k), -1, np.int32)
            for b in active:
                rid = b_rows[b]
                t = pos[rid]
                top = indexer.select(iq[b], iw[b], ikeys[rid][g, :t])
                positions[b, :len(top)] = top
                ikeys[rid][g, t] = ik[b]
            per_layer, mask = store.gather_group(g, b_rows, positions)
            for li, layer in enumerate(layers):
                kv_self = x @ model.w_kv[layer]
                new_entries[:, layer] = kv_self
                x = model.attend(layer, x, kv_self, per_layer[li], mask)
        logits = x @ model.emb.T
        for b in active:
            rid = b_rows[b]
            store.append(rid, pos[rid], new_entries[b])
            pos[rid] += 1
            left[rid] -= 1
            last[rid] = int(np.argmax(logits[b]))
            logits_log.append(logits[b].copy())
            tokens_log.append((rid, last[rid]))
            decode_tokens += 1
            if left[rid] == 0:
                store.finish(rid)
                b_rows[b] = -1
        if hasattr(store, "end_step"):
            store.end_step()
        t_decode += time.perf_counter() - t0
        step += 1
    return {"logits": np.stack(logits_log), "tokens": tokens_log, "decode_tokens": decode_tokens,
            "decode_seconds": t_decode, "steps": step}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--exec", dest="mode", choices=["engine", "library"], default="engine")
    ap.add_argument("--requests", type=int, default=24)
    ap.add_argument("--max-batch", type=int, default=8)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--json", action="store_true", help="one JSON object on stdout")
    ap.add_argument("--build-dir", default=os.environ.get("ULA_BUILD_DIR"), help="in-tree build (default <repo>/build)")
    args = ap.parse_args(argv)

    ulacache = import_ulacache(args.build_dir)
    cfg = ulacache.load_model_config(str(REPO / "configs" / "models" / "tiny_glm.json"))
    model = TinyModel(cfg)
    reqs = make_requests(args.requests, args.seed)

    dense = run(model, ulacache, reqs, DenseStore(model, reqs), args.max_batch)

    # Peak live history (entries per group) in the reference run's schedule decides the pool
    # sizes: device and host each hold well under the history; together they hold it.
    peak = peak_history(reqs, args.max_batch)
    device_slots = max(args.max_batch * model.top_k + args.max_batch, peak * 2 // 5)
    host_slots = peak * 3 // 4
    store = UlaStore(ulacache, model, device_slots, host_slots, args.max_batch, args.mode)
    ula = run(model, ulacache, reqs, store, args.max_batch)

    same = dense["logits"].shape == ula["logits"].shape and dense["logits"].tobytes() == ula["logits"].tobytes()
    st = store.stats
    result = {
        "model": cfg.name,
        "exec": args.mode,
        "requests": len(reqs),
        "max_batch": args.max_batch,
        "steps": ula["steps"],
        "decode_tokens": ula["decode_tokens"],
        "decode_seconds": round(ula["decode_seconds"], 4),
        "tokens_per_s": round(ula["decode_tokens"] / ula["decode_seconds"], 1),
        "dense_tokens_per_s": round(dense["decode_tokens"] / dense["decode_seconds"], 1),
        "peak_history_entries_per_group": peak,
        "device_slots_per_group": device_slots,
        "host_slots_per_group": host_slots,
        "hit_rate": round(st["hits"] / st["distinct"], 4) if st["distinct"] else 0.0,
        "entries_moved": st["misses"] + st["evictions"],  # host->device fetches + device->host victims
        "entries_fetched": st["misses"],
        "entries_evicted": st["evictions"],
        "bytes_moved": st["bytes_moved"],
        "logits_compared": int(dense["logits"].shape[0]),
        "matches_dense_reference": bool(same and dense["tokens"] == ula["tokens"]),
    }
    if args.json:
        print(json.dumps(result))
    else:
        print(f"mini engine: {cfg.name}, {len(reqs)} requests, batch <= {args.max_batch}, exec={args.mode}")
        print(f"  pools per group: {device_slots} device + {host_slots} host slots; peak history {peak} entries")
        print(f"  decode: {result['decode_tokens']} tokens in {result['steps']} steps, "
              f"{result['tokens_per_s']} tokens/s (dense reference {result['dense_tokens_per_s']} tokens/s)")
        print(f"  hit rate {result['hit_rate']:.2%}, entries fetched {st['misses']}, evicted {st['evictions']}, "
              f"{st['bytes_moved']} bytes moved")
        verdict = "bit-identical to" if result["matches_dense_reference"] else "DIFFERENT from"
        print(f"  logits ({result['logits_compared']} rows): {verdict} the dense reference")
    return 0 if result["matches_dense_reference"] else 1


def peak_history(reqs, max_batch):
    """Largest live entries (prompt + generated so far) over the schedule of `run`."""
    rows = [None] * max_batch
    waiting = list(reqs)
    step, peak = 0, 0
    live = {}
    while waiting or any(r is not None for r in rows):
        for b in range(max_batch):
            if rows[b] is None and waiting and waiting[0]["arrival"] <= step:
                r = waiting.pop(0)
                rows[b] = r
                live[r["id"]] = [len(r["prompt"]), r["gen"]]
        for b in range(max_batch):
            r = rows[b]
            if r is not None:
                live[r["id"]][0] += 1
                live[r["id"]][1] -= 1
        peak = max(peak, sum(v[0] for v in live.values()))
        for b in range(max_batch):
            r = rows[b]
            if r is not None and live[r["id"]][1] == 0:
                del live[r["id"]]
                rows[b] = None
        step += 1
    return peak


if __name__ == "__main__":
    sys.exit(main())
