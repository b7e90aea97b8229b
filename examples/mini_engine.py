#!/usr/bin/env python3
"""A mini inference engine over UlaCache: continuous-batching decode of the tiny sparse MLA
model (configs/models/tiny_glm.json) in numpy, in the order an SGLang DSA integration runs.

The loop is SGLang's scheduler loop, call for call (docs/INTEGRATION.md, "SGLang's loop"):
admission by capacity (allocate fills the prompt, device plus host) and by the next decode
round (planner.reserve_round over the running batch and the newcomers: the last admitted
wait when it does not hold, as SGLang's prefill adder leaves them queued); the round's
reservation (check_decode_mem: reserve_round, and while it is refused, retract_decode's
order: the request with the fewest output tokens is freed and queued again first, to be
prefilled over what it has); allocate every running request's new tokens (the last token and
q_len - 1 draft tokens of speculative decoding) and look up where their KV goes (SGLang's
out_cache_loc), before the forward. Then, per layer group, the model's lightning
indexer (the library's C++ indexer, ulacache.Indexer) picks the top-k past positions of every
query; the engine appends the step's new tokens up to the query itself, maps the positions to
UlaCache logical addresses in SGLang's flat page_table_1 form [batch * q_len, 64] (-1
padding), and UlaCache's engine step API writes the attention index array in the sparse MLA
kernels' layout (FlashMLA sparse decode: the device slot, -1 padding) and the copy plan; the
engine runs the copies, calls complete(), writes each layer's new KV at out_cache_loc, and
attention gathers every entry of every layer of the group, its own included, through the
index array. Verification rejects drafts at random (--reject); space.truncate frees the
rejected ones (SGLang's EAGLE worker frees their out_cache_loc) and the next round's
allocate gives their positions new entries. advance_round ends the round. The device and
host pools are each smaller than the history, so entries move.

The same model runs a second time over a dense store that never moves (entry of request r,
position t at a fixed row), replaying the first run's schedule (its admissions, deferrals and
retractions, which UlaCache's memory decided; the verification is a function of request and
position). The two runs must produce bit-identical logits; the script exits 1
if they do not. TP at home's reference splits the dense entries into the ranks' shards and
merges the partials in rank order as the TP run does (DenseAtHomeStore); the plain dense run,
one softmax per query, differs from it by float rounding and is reported beside it.

Execution of the copy plan (--exec):
  engine   (default) the engine owns the KV memory in FlashMLA's layout: per tier and group
           one region per layer [slots rounded up to 64, width] (torch tensors where torch is
           installed, --tensors), registered as a list of per-layer views; UlaCache runs on
           the counting backend (no bytes of its own), plan() returns descriptors, the
           engine runs them with numpy fancy indexing and calls complete(fence, status).
  library  UlaCache's CPU backend holds the bytes; planner.step() runs the copies; the
           engine writes entries with space.write() and attention reads the device pool
           view (space.device_pool) through the same index array.
  --tp N   TP over N in-process ranks with attention at home on the engine path
           (TpStepPlanner plan -> execute_on_shards -> complete; UlaCache's cpu backend
           holds the shard pools, the new KV is written into them at out_cache_loc): each
           rank attends over its own shard, partials merged.

Model (float32, fixed random weights): per layer an absorbed-MLA attention in the latent
space (query [heads, kv_lora_rank + rope dim] against latent entries [kv_lora_rank + rope
dim], values = the first kv_lora_rank values; no rotary), a tanh output projection with a
residual; per group a lightning indexer (index heads x index_head_dim, ReLU-weighted dot).
Prefill computes the prompt's entries with dense causal attention (the same code in both
runs); decode is sparse. The MTP layer of the config is not run.

Usage: python3 examples/mini_engine.py [--exec engine|library] [--tp N] [--q-len Q]
       [--groups 4,2] [--tensors auto|numpy|torch] [--json] [--requests N] [--reject P]
       [--device-slots N] [--reserve guaranteed|quantile|oracle|hisparse|none] [--reserve-quantile Q]
       (--no-reserve: --reserve none)
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
    """Fixed random weights for the tiny_glm shape; `groups` re-partitions its layers into
    layer groups (layer counts in order; default the config's: 4 + 2)."""

    def __init__(self, cfg, groups=None, vocab=128, hidden=64, seed=1234):
        rng = np.random.default_rng(seed)
        f32 = np.float32
        self.cfg = cfg
        self.vocab, self.hidden = vocab, hidden
        self.heads = cfg.attention_heads
        self.lora = cfg.kv_lora_rank
        self.width = cfg.kv_lora_rank + cfg.qk_rope_head_dim  # floats per layer entry
        assert self.width * 4 == cfg.kv_entry_bytes_per_layer, "tiny_glm entries are float32"
        self.num_layers = cfg.num_layers
        if groups is None:
            groups = [min(cfg.layers_per_group, cfg.num_layers - g) for g in range(0, cfg.num_layers, cfg.layers_per_group)]
        assert sum(groups) == cfg.num_layers and min(groups) >= 1, groups
        self.num_groups = len(groups)  # main groups (MTP not run)
        starts = np.cumsum([0] + list(groups))
        self.group_layers = [list(range(starts[g], starts[g + 1])) for g in range(self.num_groups)]
        self.layers_per_group = max(groups)  # the widest group: the TP space's entry (one entry size there)
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

    def _out(self, layer, x, out):
        return x + np.tanh(out.reshape(x.shape[0], self.heads * self.lora) @ self.w_o[layer])

    def attend(self, layer, x, entries, mask):
        """x [N, hidden] (one row per query); entries [N, K, width] read through the index
        array (0 where masked); mask [N, K]. A query's selection holds its own entry."""
        n = x.shape[0]
        q = (x @ self.w_q[layer]).reshape(n, self.heads, self.width)
        s = np.matmul(q, entries.transpose(0, 2, 1)) * self.scale          # [N, H, K]
        s = np.where(mask[:, None, :], s, np.float32(-np.inf))
        m = s.max(axis=2)
        m = np.where(np.isfinite(m), m, np.float32(0))                     # a padding row selects nothing
        p = np.exp(s - m[:, :, None])
        den = p.sum(axis=2)
        out = np.matmul(p, entries[:, :, :self.lora]) / np.where(den > 0, den, np.float32(1))[:, :, None]
        return self._out(layer, x, out)

    def attend_at_home(self, layer, x, parts):
        """TP attention at home: parts = [(entries, mask)] per rank, each rank's own shard;
        the partials [acc | max | sum] are merged in rank order (partial_attention.h)."""
        n = x.shape[0]
        q = (x @ self.w_q[layer]).reshape(n, self.heads, self.width)
        ms, sums, accs = [], [], []
        for entries, mask in parts:
            s = np.matmul(q, entries.transpose(0, 2, 1)) * self.scale
            s = np.where(mask[:, None, :], s, np.float32(-np.inf))
            m = s.max(axis=2)                                              # -inf: no entry on this rank
            p = np.exp(s - np.where(np.isfinite(m), m, 0)[:, :, None])
            p = np.where(mask[:, None, :], p, np.float32(0))
            ms.append(m), sums.append(p.sum(axis=2)), accs.append(np.matmul(p, entries[:, :, :self.lora]))
        big = np.max(ms, axis=0)
        num = np.zeros_like(accs[0])
        den = np.zeros_like(sums[0])
        for m, s_, acc in zip(ms, sums, accs):
            w = np.where(np.isfinite(m), np.exp(m - np.where(np.isfinite(big), big, 0)), np.float32(0))
            num += w[:, :, None] * acc
            den += w * s_
        return self._out(layer, x, num / np.where(den > 0, den, np.float32(1))[:, :, None])

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


def select_width(model, q_len):
    """Columns of the selection and index arrays: top-k of the history plus the step's own
    new tokens, rounded up to a multiple of 64 (FlashMLA's SM90 sparse decode: top_k % 64 == 0)."""
    return -(-(model.top_k + q_len) // 64) * 64


class DenseStore:
    """The reference: entry (request, position) at a fixed row, never moves."""

    def __init__(self, model, reqs, q_len):
        self.model = model
        self.max_len = max(len(r["prompt"]) + r["gen"] for r in reqs) + q_len
        self.kv = np.zeros((model.num_layers, len(reqs) * self.max_len, model.width), np.float32)

    def allocate_prompt(self, rid, n):
        return True

    def write_prefill(self, rid, entries):
        base = rid * self.max_len
        self.kv[:, base:base + entries.shape[1]] = entries

    def begin_step(self, rids, pos, q_len):
        self.new_rows = np.array([rid * self.max_len + pos[rid] + j if rid >= 0 else -1
                                  for rid in rids for j in range(q_len)])

    def prepare_group(self, g, rids, positions, q_len, refusable=False):
        self.mask = positions >= 0
        row_rid = np.repeat(np.asarray(rids), q_len)
        self.rows = np.where(self.mask, row_rid[:, None] * self.max_len + positions, 0)

    def write_new(self, g, li, layer, kv):
        live = self.new_rows >= 0
        self.kv[layer][self.new_rows[live]] = kv[live]

    def gather(self, g, li, layer):
        e = self.kv[layer][self.rows]
        e[~self.mask] = 0
        return e, self.mask

    def finish(self, rid):
        pass

    # No memory limits: every reservation holds (a reference run replays the schedule of the
    # run it checks), a rejected draft's row is simply written again.
    def reserve_decode(self, rids, new_tokens, max_selections):
        return True

    def truncate(self, rid, length):
        pass

    def drop_rows(self, b, q_len):
        self.new_rows[b * q_len:(b + 1) * q_len] = -1

    def end_step(self):
        pass


class DenseAtHomeStore(DenseStore):
    """The reference of TP attention at home: the dense store's entries, split into the ranks'
    shards as UlaCache homes them (address a on rank a mod P; a request's token at position t
    sits at offset t mod 64 of a page, so for P dividing 64 its rank is t mod P), each rank's
    partial over its own entries in selection order, merged in rank order. The same
    arithmetic as TpStore's, so the logits must be bit-identical; against DenseStore they
    differ by float rounding, and a near-tie in a later top-k can then pick other entries."""

    def __init__(self, model, reqs, q_len, ranks):
        super().__init__(model, reqs, q_len)
        assert 64 % ranks == 0, "a rank's share of a 64-token page"
        self.ranks = ranks

    def prepare_group(self, g, rids, positions, q_len, refusable=False):
        super().prepare_group(g, rids, positions, q_len)
        self.homes = [self.mask & (positions % self.ranks == r) for r in range(self.ranks)]

    def gather_parts(self, g, li):
        layer = self.model.group_layers[g][li]
        parts = []
        for home in self.homes:
            e = self.kv[layer][self.rows]
            e[~home] = 0
            parts.append((e, home))
        return parts


class UlaStore:
    """Entries placed by UlaCache over device and host pools smaller than the history, in the
    SGLang-style order: the step's new tokens are allocated before the forward; per layer
    group the indexer's selection (SGLang's flat page_table_1 [rows, top_k], the rows of a
    request consecutive) goes through plan, the descriptors and complete; then the engine
    looks the new tokens up, writes each layer's KV there, and attention reads every entry,
    its own included, through the index array (no KV handed to attention outside the cache)."""

    def __init__(self, ulacache, model, device_slots, host_slots, max_batch, q_len, mode, tensors, reserve="guaranteed",
                 quantile=0.99):
        self.u, self.model, self.mode, self.q_len = ulacache, model, mode, q_len
        self.device_slots = device_slots
        self.torch = None
        if tensors == "torch":
            import torch
            self.torch = torch
        lpg = model.layers_per_group
        row = model.width * 4                                    # one layer's row (FlashMLA: 656 B)
        self.glayers = [len(layers) for layers in model.group_layers]
        per_address = sum(self.glayers) * row                    # an address's entries in every group
        # Per-layer pools and groups of their own layer count (4 + 2: tiny_glm's).
        cfg = ulacache.AddressSpaceConfig(stable_new_entries=True, num_ranks=1, num_groups=model.num_groups, entry_bytes=lpg * row,
                                          row_bytes=row, group_layers=self.glayers,
                                          device_bytes_per_rank=device_slots * per_address,
                                          host_bytes_per_rank=host_slots * per_address)
        self.space = ulacache.AddressSpace(cfg, backend="counting" if mode == "engine" else "cpu")
        assert cfg.device_slots_per_group == device_slots and cfg.host_slots_per_group == host_slots
        width = select_width(model, q_len)
        self.planner = ulacache.StepPlanner(self.space, max_batch=max_batch, max_q_len=q_len, max_top_k=width,
                                            top_k_multiple=64,  # FlashMLA's SM90 sparse decode
                                            reserve="quantile" if reserve == "quantile" else "guaranteed",
                                            reserve_quantile=quantile)
        self.selections = self._array((max_batch * q_len, width), "int32", -1)
        self.indices = self._array((max_batch * q_len, width), "int32", -1)
        self.requests = self._array((max_batch,), "int64", 0)
        self.desc = np.zeros(self.planner.max_descriptors, ulacache.DESCRIPTOR_DTYPE)
        self.status = self._array((self.planner.max_descriptors,), "uint8", 0)
        self.addrs = {}
        self.stats = {"selections": 0, "distinct": 0, "hits": 0, "misses": 0, "evictions": 0, "bytes_moved": 0}
        self.mem = None
        if mode == "engine":
            # Engine-owned KV in FlashMLA's layout: per tier and group, one region per layer of
            # the group, [slots rounded up to 64][width] (layer l, slot s at row s of region l:
            # the k_cache view [slots / 64, 64, 1, width]), handed over as a list of per-layer
            # views (SGLang's pools).
            def regions(slots, layers):
                return self._array((layers, -(-slots // 64) * 64, model.width), "float32", 0)
            self.mem_t = {"device": [regions(device_slots, n) for n in self.glayers],
                          "host": [regions(host_slots, n) for n in self.glayers]}
            for tier, arrays in self.mem_t.items():
                for g, a in enumerate(arrays):
                    self.planner.register_engine_memory(tier, 0, g, [a[l] for l in range(a.shape[0])])
            self.mem = {t: [self._np(a) for a in arrays] for t, arrays in self.mem_t.items()}
        else:  # UlaCache's own per-layer pools: each layer's region is FlashMLA's k_cache
            self.pools = [[self.space.device_layer(0, g, l).view(np.float32) for l in range(n)]
                          for g, n in enumerate(self.glayers)]

    def _array(self, shape, dtype, fill):
        if self.torch is not None:
            return self.torch.full(shape, fill, dtype=getattr(self.torch, dtype))
        return np.full(shape, fill, getattr(np, dtype))

    def _np(self, a):
        return a.numpy() if self.torch is not None else a  # torch.Tensor.numpy(): the same memory

    def allocate_prompt(self, rid, n):
        """Admission by capacity (device plus host): the prompt's tokens, or False with the
        request gone again."""
        self.space.add_request(rid)
        try:
            self.addrs[rid] = [int(a) for a in self.space.allocate(rid, n)]
        except self.u.ResourceExhaustedError:
            self.space.free(rid)
            return False
        return True

    def reserve_decode(self, rids, new_tokens, max_selections):
        """check_decode_mem: the round of these requests, each with new_tokens new tokens and
        up to max_selections selections per group step."""
        n = len(rids)
        try:
            self.planner.reserve_round(0, np.array(rids, np.int64), np.full(n, new_tokens, np.uint32),
                                       np.broadcast_to(np.asarray(max_selections, np.uint32), (n,)).copy())
        except self.u.ResourceExhaustedError:
            return False
        return True

    def truncate(self, rid, length):
        """The rejected drafts' tokens go; the next allocate continues at position length."""
        self.space.truncate(rid, length)
        del self.addrs[rid][length:]

    def write_prefill(self, rid, entries):
        addrs = self.addrs[rid]
        for g, layers in enumerate(self.model.group_layers):
            for i, a in enumerate(addrs):
                if self.mode == "engine":  # the prefill's KV write, at the looked-up location
                    tier, _, slot = self.space.lookup(int(a), g)
                    self.mem[tier][g][:, slot] = entries[layers, i]
                else:
                    self.space.write(int(a), g, np.ascontiguousarray(entries[layers, i]).reshape(-1).view(np.uint8))

    def begin_step(self, rids, pos, q_len):
        """Allocates the step's new tokens (the last token and the drafts) before the forward."""
        self.new = []  # per selection row: the new token's address, or -1
        for rid in rids:
            if rid < 0:
                self.new += [-1] * q_len
                continue
            fresh = [int(a) for a in self.space.allocate(rid, q_len)]
            self.addrs[rid] += fresh
            self.new += fresh
        self.pending = {}  # library mode: the new tokens' entries, filled layer by layer
        # SGLang's out_cache_loc: where each new token's KV goes, looked up at schedule time,
        # before any plan of the step (a new entry is placed on device and is used in this
        # round, so no plan of the round moves it).
        self.out_cache_loc = [[self.space.lookup(a, g) if a >= 0 else None for a in self.new]
                              for g in range(self.model.num_groups)]

    def drop_rows(self, b, q_len):
        """Batch row b left the round (its request was retracted): no KV goes to its new tokens."""
        self.new[b * q_len:(b + 1) * q_len] = [-1] * q_len

    def prepare_group(self, g, rids, positions, q_len, refusable=False):
        """The group's plan; with refusable, False where it is refused for room (nothing changed)."""
        try:
            self._plan_group(g, rids, positions, q_len)
        except self.u.ResourceExhaustedError:
            if not refusable:
                raise
            return False
        return True

    def _plan_group(self, g, rids, positions, q_len):
        sel = self._np(self.selections)
        sel.fill(-1)
        for r in range(positions.shape[0]):
            rid = rids[r // q_len]
            if rid < 0:
                continue
            row = positions[r]
            k = int((row >= 0).sum())
            sel[r, :k] = np.asarray(self.addrs[rid], np.int64)[row[:k]]
        self._np(self.requests)[:] = [max(rid, 0) for rid in rids]  # padding rows: request 0, never looked up
        if self.mode == "engine":
            fence, n, st = self.planner.plan(0, g, self.selections, self.indices, self.desc, self.requests)
            self._run_descriptors(n)
            published, failed = self.planner.complete(fence, self.status[:n])
            assert failed == 0
        else:
            st = self.planner.step(0, g, self.selections, self.indices, self.requests)
        for key in self.stats:
            self.stats[key] += getattr(st, key)
        idx = self._np(self.indices)
        self.mask = idx >= 0
        self.safe = np.where(self.mask, idx, 0)
        # The new tokens' KV goes where the schedule looked it up; the plan did not move it,
        # and its own query reads it there.
        self.new_slot = np.full(len(self.new), -1, np.int64)
        for r, a in enumerate(self.new):
            if a < 0:
                continue
            tier, _, slot = self.out_cache_loc[g][r]
            assert tier == "device" and (tier, 0, slot) == self.space.lookup(a, g), (a, self.out_cache_loc[g][r])
            assert slot in idx[r], (a, slot)
            self.new_slot[r] = slot

    def _run_descriptors(self, n):
        """The engine's copy kernel: descriptors[:n] over its own memory (numpy), per layer."""
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
        self._np(self.status)[:n] = 0

    def write_new(self, g, li, layer, kv):
        for r, a in enumerate(self.new):
            if a < 0:
                continue
            if self.mode == "engine":
                self.mem["device"][g][li, self.new_slot[r]] = kv[r]
            else:  # space.write takes the whole entry: the layers computed so far
                buf = self.pending.setdefault((a, g), np.zeros((self.glayers[g], self.model.width), np.float32))
                buf[li] = kv[r]
                self.space.write(a, g, buf.reshape(-1).view(np.uint8))

    def gather(self, g, li, layer):
        if self.mode == "engine":
            e = self.mem["device"][g][li][self.safe]
        else:
            e = self.pools[g][li][self.safe]
        e[~self.mask] = 0
        return e, self.mask

    def finish(self, rid):
        # Paged addresses (page_tokens 64): token i at offset i % 64 of its request's page, so
        # the address list read as SGLang's page_table_1 row gives page ids at row[::64] // 64.
        row = np.asarray(self.addrs[rid], np.int64)
        i = np.arange(len(row))
        assert (row % 64 == i % 64).all() and (row // 64 == np.repeat(row[::64] // 64, 64)[:len(row)]).all(), rid
        self.space.free(rid)
        del self.addrs[rid]

    def end_step(self):
        self.space.advance_round()


class TpStore(UlaStore):
    """TP with attention at home over P in-process ranks, on the engine path
    (TpStepPlanner plan -> descriptors -> complete): per group, plan writes each rank's
    index array (its own shard's device slots, -1 for entries homed elsewhere) and every
    rank's home moves; the engine runs them (execute_on_shards, the CPU reference executor
    over the space's shard pools) and completes them; then each layer's new KV is written at
    out_cache_loc, the (tier, home rank, slot) looked up right after allocate, straight into
    that rank's shard pool (a writable view), and every rank attends over its own shard,
    the partials merged in rank order."""

    def __init__(self, ulacache, model, device_slots, host_slots, max_batch, q_len, ranks, reserve="guaranteed",
                 quantile=0.99):
        self.u, self.model, self.q_len, self.mode, self.torch = ulacache, model, q_len, "tp", None
        self.device_slots = device_slots
        lpg = model.layers_per_group
        self.entry_floats = lpg * model.width
        per = self.entry_floats * 4 * model.num_groups
        cfg = ulacache.TpConfig(stable_new_entries=True, num_ranks=ranks, num_groups=model.num_groups, entry_bytes=self.entry_floats * 4,
                                attention="at_home", device_bytes_per_rank=device_slots * per,
                                host_bytes_per_rank=host_slots * per)
        self.space = ulacache.TpAddressSpace(cfg)
        width = select_width(model, q_len)
        # The engine path needs the space's stable_new_entries (TpStepPlanner refuses it otherwise): a new token's
        # looked-up slot is where the round's attention reads it.
        self.planner = ulacache.TpStepPlanner(self.space, max_batch=max_batch, max_q_len=q_len, max_top_k=width,
                                              reserve="quantile" if reserve == "quantile" else "guaranteed",
                                              reserve_quantile=quantile)
        self.ranks = ranks
        self.selections = np.full((max_batch * q_len, width), -1, np.int32)
        self.indices = np.full((ranks, max_batch * q_len, width), -1, np.int32)
        self.requests = np.zeros(max_batch, np.int64)
        self.desc = np.zeros(self.planner.max_descriptors, ulacache.DESCRIPTOR_DTYPE)
        self.status = np.zeros(self.planner.max_descriptors, np.uint8)
        self.addrs = {}
        self.stats = {"selections": 0, "distinct": 0, "hits": 0, "misses": 0, "evictions": 0, "bytes_moved": 0,
                      "new_moved": 0}

        def view(pool, slots):
            return pool.view(np.float32).reshape(slots, lpg, model.width)
        self.pools = {"device": [[view(self.space.shard_device_pool(r, g, writable=True), device_slots)
                                  for g in range(model.num_groups)] for r in range(ranks)],
                      "host": [[view(self.space.shard_host_pool(r, g, writable=True), host_slots)
                                for g in range(model.num_groups)] for r in range(ranks)]}

    def reserve_decode(self, rids, new_tokens, max_selections):
        n = len(rids)  # every hosted rank bounded by all of a request's selections
        try:
            self.planner.reserve_round(np.array(rids, np.int64), np.full(n, new_tokens, np.uint32),
                                       np.broadcast_to(np.asarray(max_selections, np.uint32), (n,)).copy())
        except self.u.ResourceExhaustedError:
            return False
        return True

    def write_prefill(self, rid, entries):
        addrs = self.addrs[rid]
        for g, layers in enumerate(self.model.group_layers):
            for i, a in enumerate(addrs):  # the prefill's KV write, at the looked-up location
                tier, rank, slot = self.space.lookup(int(a), g)
                self.pools[tier][rank][g][slot, :len(layers)] = entries[layers, i]

    def _plan_group(self, g, rids, positions, q_len):
        sel = self.selections
        sel.fill(-1)
        for r in range(positions.shape[0]):
            rid = rids[r // q_len]
            if rid >= 0:
                k = int((positions[r] >= 0).sum())
                sel[r, :k] = np.asarray(self.addrs[rid], np.int64)[positions[r, :k]]
        self.requests[:] = [max(rid, 0) for rid in rids]
        fence, n, stats, _ = self.planner.plan(g, sel, self.indices, self.desc, self.requests)
        self.planner.execute_on_shards(self.desc[:n], self.status[:n])
        published, failed = self.planner.complete(fence, self.status[:n])
        assert failed == 0 and published == n
        self.stats["new_moved"] += sum(self.space.lookup(a, g) != loc
                                       for a, loc in zip(self.new, self.out_cache_loc[g]) if a >= 0)
        self.stats["selections"] += int((sel >= 0).sum())
        self.stats["distinct"] += sum(s.hits + s.misses for s in stats)  # each entry counted at its home
        self.stats["hits"] += sum(s.hits for s in stats)
        self.stats["misses"] += sum(s.misses for s in stats)
        self.stats["evictions"] += sum(s.evictions for s in stats)
        self.stats["bytes_moved"] += sum(s.bytes_moved for s in stats)
        self.masks = [self.indices[r] >= 0 for r in range(self.ranks)]
        self.safes = [np.where(m, self.indices[r], 0) for r, m in enumerate(self.masks)]
        # Every selection is read by exactly one rank: its home.
        assert (np.sum(self.masks, axis=0) == (sel >= 0)).all()

    def write_new(self, g, li, layer, kv):
        for r, a in enumerate(self.new):
            if a >= 0:
                tier, rank, slot = self.out_cache_loc[g][r]
                self.pools[tier][rank][g][slot, li] = kv[r]

    def finish(self, rid):
        self.space.free(rid)
        del self.addrs[rid]

    def gather_parts(self, g, li):
        parts = []
        for r in range(self.ranks):
            e = self.pools["device"][r][g][self.safes[r], li]
            e[~self.masks[r]] = 0
            parts.append((e, self.masks[r]))
        return parts


def draft(token, j, vocab):
    """The drafter of speculative decoding: a fixed rule (the verify below decides which drafts
    the target model keeps)."""
    return (token * 31 + 7 * j) % vocab


def accepted_drafts(seed, rid, pos, q_len, reject):
    """Verification with random rejection: drafts 1 .. q_len - 1 are kept in order while each
    passes (probability 1 - reject); the first rejected one and every later one are dropped.
    A function of (seed, request, position), so the reference run verifies alike."""
    rng = np.random.default_rng([seed, rid, pos])
    kept = 0
    while kept < q_len - 1 and rng.random() >= reject:
        kept += 1
    return kept


class Schedule:
    """The scheduler's memory decisions (admission, the round's reservation), asked of the
    store, or replayed from an earlier run so that a reference store that has no memory limits
    runs the same schedule (the same batches, retractions and re-prefills)."""

    def __init__(self, replay=None, reserve=True):
        self.replay, self.log, self.reserve = None if replay is None else iter(replay), [], reserve

    def decide(self, ask, reservation=False):
        if reservation and not self.reserve:
            ok = True  # by the batch size alone: a plan may then be refused for room
        else:
            ok = ask() if self.replay is None else next(self.replay)
        self.log.append(ok)
        return ok

    def plan(self, ask):
        """A group's plan: ask() plans it (False: refused for room, nothing changed); a replay
        plans where the run it replays did."""
        if self.replay is None:
            ok = ask()
        else:
            ok = next(self.replay)
            if ok:
                ask()
        self.log.append(ok)
        return ok


def retract_order(rows, out_len, prompt_len):
    """SGLang's ScheduleBatch.retract_decode order: sorted by (output tokens, -prompt length)
    descending and popped from the end, so the request with the fewest output tokens (the
    longest prompt among equals) goes first."""
    return sorted(rows, key=lambda b: (out_len[b], -prompt_len[b]), reverse=True)


RESERVE_MODES = ("guaranteed", "quantile", "oracle", "hisparse", "none")


def run(model, ulacache, reqs, store, max_batch, q_len=1, reject=0.0, seed=0, replay=None, reserve="guaranteed",
        shadow=None):
    """Continuous batching in SGLang's scheduler order. Per iteration: admit arrived requests
    into free batch rows (the prefill round: reserve_round for the prompt, else it stays
    queued); reserve the decode round for the running batch (check_decode_mem), retracting
    requests in retract_decode's order until it fits (a retracted request frees its KV and
    is queued again first, to be prefilled over its prompt and the tokens it has so far);
    allocate the round's new tokens (the last token and q_len - 1 drafts) and look up
    out_cache_loc; the forward (per group: indexer, plan, descriptors, complete, KV writes,
    attention through the indices); verify with random rejection and truncate the rejected
    drafts; advance the round.

    reserve: what admission and check_decode_mem ask of the round. guaranteed: reserve_round
    over each request's bound (q_len x width, capped by its history); quantile: the same call
    on a planner in quantile mode (its measured share of the bound); oracle: reserve_round
    over each request's true distinct selections of the round, drawn before admission by
    running the round's indexer over `shadow` (a dense store of the same entries); hisparse:
    SGLang HiSparse's fixed device buffer of 2 x top_k + q_len slots per request; none: the
    batch size alone. Under quantile, oracle and hisparse a plan refused for room is the
    engine's fallback: the request retract_decode picks leaves the round (freed and queued
    again, as a retraction) and the group is planned again (plan_refusals counts them);
    under guaranteed and none a refused plan raises."""
    b_rows = [-1] * max_batch
    pos = {}      # rid -> tokens with KV (the next position)
    left = {}     # rid -> tokens still to generate
    last = {}     # rid -> last generated token (its KV not yet computed)
    hist = {}     # rid -> the tokens with KV, in order
    prompt_len = {}
    out_len = {}
    ikeys = {}    # rid -> [groups, max_len, idim]
    logits_log, tokens_log = [], []
    indexer = ulacache.Indexer(model.ih, model.idim, model.top_k)
    width = select_width(model, q_len)
    sched = Schedule(replay, reserve != "none")
    fallback = reserve in ("quantile", "oracle", "hisparse")
    truth = {}    # oracle: rid -> the most distinct entries of one group step in this iteration's round

    def forward(st, rows, active, toks, tpos, keys, refused=None):
        """The round's forward over store st: per group the indexer's top-k, the plan (with
        refused: planned again after refused() took a request out of the round), the new
        KV written and attention. Returns x and, per batch row, its most distinct entries."""
        x = model.emb[toks.reshape(-1)]                      # [max_batch * q_len, hidden]
        used = {b: 0 for b in active}
        for g, layers in enumerate(model.group_layers):
            iq = x @ model.w_iq[g]
            iw = x @ model.w_iw[g]
            ik = x @ model.w_ik[g]
            positions = np.full((max_batch * q_len, width), -1, np.int32)
            for b in active:
                rid = rows[b]
                t = tpos[rid]
                for j in range(q_len):
                    r = b * q_len + j
                    top = indexer.select(iq[r], iw[r], keys[rid][g, :t])
                    positions[r, :len(top)] = top
                    positions[r, len(top):len(top) + j + 1] = t + np.arange(j + 1)  # the step's tokens up to itself
                keys[rid][g, t:t + q_len] = ik[b * q_len:(b + 1) * q_len]
                sel = positions[b * q_len:(b + 1) * q_len]
                used[b] = max(used[b], len(np.unique(sel[sel >= 0])))
            if refused is None:
                st.prepare_group(g, rows, positions, q_len)
            else:
                while not sched.plan(lambda: st.prepare_group(g, rows, positions, q_len, refusable=True)):
                    b = refused()
                    positions[b * q_len:(b + 1) * q_len] = -1
                    del used[b]
            for li, layer in enumerate(layers):
                kv = x @ model.w_kv[layer]                   # the new tokens' KV of this layer
                st.write_new(g, li, layer, kv)               # at the looked-up location
                if hasattr(st, "gather_parts"):
                    x = model.attend_at_home(layer, x, st.gather_parts(g, li))
                else:
                    entries, mask = st.gather(g, li, layer)
                    x = model.attend(layer, x, entries, mask)
        return x, used

    def drafts(toks, b, first):
        toks[b, 0] = first
        for j in range(1, q_len):
            toks[b, j] = draft(toks[b, j - 1], j, model.vocab)

    def draw(cands):
        """The oracle: the next round's selections of the running requests and cands, drawn
        over the shadow store (the cands prefilled there first). Each row's selections depend
        on its own request alone, so any subset of them selects the same."""
        rows, tpos, keys = [-1] * max_batch, {}, {}
        toks = np.zeros((max_batch, q_len), np.int64)
        for b in range(max_batch):
            if b_rows[b] >= 0:
                rid = b_rows[b]
                rows[b], tpos[rid], keys[rid] = rid, pos[rid], ikeys[rid]
                drafts(toks, b, last[rid])
        for b, r in cands:
            if r["gen"] <= 0:
                continue  # its prefill makes its last token: not in the round
            rid, tokens = r["id"], r["prompt"]
            entries, k, logits = model.prefill(tokens)
            shadow.write_prefill(rid, entries)
            n = len(tokens)
            keys[rid] = np.zeros((model.num_groups, n + r["gen"] + q_len, model.idim), np.float32)
            keys[rid][:, :n] = k
            rows[b], tpos[rid] = rid, n
            drafts(toks, b, int(np.argmax(logits)))
        active = [b for b in range(max_batch) if rows[b] >= 0]
        shadow.begin_step(rows, tpos, q_len)
        _, used = forward(shadow, rows, active, toks, tpos, keys)
        return {rows[b]: n for b, n in used.items()}

    def reserve_round(rids):
        if reserve == "hisparse":
            return len(rids) * (2 * model.top_k + q_len) <= store.device_slots
        if reserve == "oracle":
            return store.reserve_decode(rids, q_len, [truth.get(rid, 0) for rid in rids])
        return store.reserve_decode(rids, q_len, q_len * width)

    def retract(b, counter):
        """Batch row b's request leaves: freed and queued again first, with the tokens it has
        (its prefill recomputes their KV and the last one's; it then generates what is left)."""
        rid = b_rows[b]
        store.finish(rid)
        waiting.insert(0, {"id": rid, "arrival": step, "prompt": np.array(hist[rid] + [last[rid]], np.int64),
                           "gen": left[rid] - 1})
        b_rows[b] = -1
        active.remove(b)
        counts[counter] += 1
        return b

    def retract_refused():
        """A plan of the round was refused for room: retract_decode's pick leaves the round."""
        if len(active) == 1:
            raise RuntimeError("a plan of one request's round is refused for room")
        b = retract_order(active, {b: out_len[b_rows[b]] for b in active},
                          {b: prompt_len[b_rows[b]] for b in active})[-1]
        store.drop_rows(b, q_len)
        return retract(b, "plan_refusals")

    waiting = [dict(r) for r in reqs]
    step = 0
    decode_tokens = 0
    t_decode = 0.0
    counts = {"retractions": 0, "admissions_deferred": 0, "drafts_rejected": 0, "rounds_reserved": 0,
              "requests_decoded": 0,      # summed over the decode rounds: the mean batch is this / rounds
              "selections_reserved": 0,   # what reserve_round bounded each request's group step by, summed
              "selections_used": 0,       # the distinct entries each request's group step selected (most of its groups), summed
              "plan_refusals": 0}         # plans refused for room, each followed by a request retracted and a re-plan
    while waiting or any(r >= 0 for r in b_rows):
        # Admission (SGLang's prefill adder): the arrived requests that allocate fills, in
        # arrival order, into free rows; their prefill is a round of its own. Then the next
        # decode round must hold with them: the last admitted go back to the queue until it
        # does (a lone request is admitted regardless; check_decode_mem below then says
        # whether its round fits at all).
        cands = []
        free_rows = [b for b in range(max_batch) if b_rows[b] < 0]
        while free_rows and waiting and waiting[0]["arrival"] <= step:
            r = waiting[0]
            if not sched.decide(lambda: store.allocate_prompt(r["id"], len(r["prompt"]))):
                counts["admissions_deferred"] += 1
                break  # FCFS: the head waits, and so does everything behind it
            cands.append((free_rows.pop(0), waiting.pop(0)))
        if reserve == "oracle" and replay is None and (cands or any(r >= 0 for r in b_rows)):
            truth = draw(cands)
        if cands:
            store.end_step()
            running = [b_rows[b] for b in range(max_batch) if b_rows[b] >= 0]
            while cands and not sched.decide(lambda: reserve_round(running + [r["id"] for _, r in cands]),
                                             reservation=True):
                if not running and len(cands) == 1:
                    break
                _, r = cands.pop()
                store.finish(r["id"])
                waiting.insert(0, r)
                counts["admissions_deferred"] += 1
        for b, r in cands:
            rid, tokens = r["id"], r["prompt"]
            entries, keys, logits = model.prefill(tokens)
            store.write_prefill(rid, entries)
            if shadow is not None:
                shadow.write_prefill(rid, entries)
            n = len(tokens)
            ikeys[rid] = np.zeros((model.num_groups, n + r["gen"] + q_len, model.idim), np.float32)
            ikeys[rid][:, :n] = keys
            pos[rid], left[rid], hist[rid] = n, r["gen"], [int(v) for v in tokens]
            prompt_len.setdefault(rid, n)
            out_len.setdefault(rid, 0)
            last[rid] = int(np.argmax(logits))
            logits_log.append(logits)
            tokens_log.append((rid, last[rid]))
            if left[rid] <= 0:  # a retracted request whose prefill made its last token
                store.finish(rid)
                continue
            b_rows[b] = rid
        active = [b for b in range(max_batch) if b_rows[b] >= 0]
        if not active:
            step += 1
            continue
        # check_decode_mem: the round's reservation, retracting until it holds.
        while not sched.decide(lambda: reserve_round([b_rows[b] for b in active]), reservation=True):
            if len(active) == 1:
                raise RuntimeError("the device pool cannot hold one request's round")
            retract(retract_order(active, {b: out_len[b_rows[b]] for b in active},
                                  {b: prompt_len[b_rows[b]] for b in active})[-1], "retractions")
        counts["rounds_reserved"] += 1
        t0 = time.perf_counter()
        toks = np.zeros((max_batch, q_len), np.int64)
        for b in active:
            drafts(toks, b, last[b_rows[b]])
        store.begin_step(b_rows, pos, q_len)
        x, used = forward(store, b_rows, active, toks, pos, ikeys, retract_refused if fallback else None)
        if reserve == "oracle" and replay is None:
            # The oracle drew this round's selections before admission: the round selected no more.
            assert all(used[b] <= truth[b_rows[b]] for b in active), (used, truth)
        counts["requests_decoded"] += len(active)
        counts["selections_reserved"] += sum(min(q_len * width, pos[b_rows[b]] + q_len) for b in active)
        counts["selections_used"] += sum(used.values())
        logits = (x @ model.emb.T).reshape(max_batch, q_len, model.vocab)
        for b in active:
            rid = b_rows[b]
            for j in range(q_len):
                logits_log.append(logits[b, j].copy())
            kept = accepted_drafts(seed, rid, pos[rid], q_len, reject)
            hist[rid] += [int(v) for v in toks[b, :1 + kept]]
            pos[rid] += 1 + kept
            if kept < q_len - 1:  # the rejected drafts' KV goes (SGLang frees their out_cache_loc)
                store.truncate(rid, pos[rid])
                counts["drafts_rejected"] += q_len - 1 - kept
            left[rid] -= 1 + kept
            out_len[rid] += 1 + kept
            last[rid] = int(np.argmax(logits[b, kept]))  # the target model's token after the last kept one
            tokens_log.append((rid, last[rid]))
            decode_tokens += 1 + kept
            if left[rid] <= 0:
                store.finish(rid)
                b_rows[b] = -1
        store.end_step()
        t_decode += time.perf_counter() - t0
        step += 1
    return {"logits": np.stack(logits_log), "tokens": tokens_log, "decode_tokens": decode_tokens,
            "decode_seconds": t_decode, "steps": step, "schedule": sched.log, **counts}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--exec", dest="mode", choices=["engine", "library"], default="engine")
    ap.add_argument("--q-len", type=int, default=3, help="queries per request and step: 1 + draft tokens")
    ap.add_argument("--groups", default=None, help="layer counts of the groups, e.g. 3,2,1 (default: the config's)")
    ap.add_argument("--tensors", choices=["auto", "numpy", "torch"], default="auto",
                    help="the engine's arrays: torch tensors where torch is installed (auto), or numpy")
    ap.add_argument("--tp", type=int, default=1, help="TP ranks (attention at home; the library's copies)")
    ap.add_argument("--requests", type=int, default=24)
    ap.add_argument("--max-batch", type=int, default=4)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--reject", type=float, default=0.3,
                    help="probability that verification rejects a draft (the rest of the step's drafts go with it)")
    ap.add_argument("--reserve", choices=RESERVE_MODES, default="guaranteed",
                    help="admission and check_decode_mem: guaranteed (reserve_round's bound), quantile (reserve_round "
                         "in quantile mode; a refused plan retracts a request and plans again), oracle (reserve_round "
                         "over the round's true selections, drawn first), hisparse (2 x top-k + q_len device slots "
                         "per request), none (the batch size alone: a plan refused for room ends the run)")
    ap.add_argument("--no-reserve", dest="reserve", action="store_const", const="none", help="--reserve none")
    ap.add_argument("--reserve-quantile", type=float, default=0.99, help="--reserve quantile's quantile, in (0, 1]")
    ap.add_argument("--device-slots", type=int, default=None,
                    help="device slots per group (per rank with --tp); default sized from the peak history. "
                         "Small enough, rounds are reserved for fewer requests and running ones are retracted")
    ap.add_argument("--json", action="store_true", help="one JSON object on stdout")
    ap.add_argument("--build-dir", default=os.environ.get("ULA_BUILD_DIR"), help="in-tree build (default <repo>/build)")
    args = ap.parse_args(argv)

    ulacache = import_ulacache(args.build_dir)
    cfg = ulacache.load_model_config(str(REPO / "configs" / "models" / "tiny_glm.json"))
    model = TinyModel(cfg, [int(v) for v in args.groups.split(",")] if args.groups else None)
    reqs = make_requests(args.requests, args.seed)
    tensors = args.tensors
    if tensors == "auto":
        try:
            import torch  # noqa: F401
            tensors = "torch"
        except ImportError:
            tensors = "numpy"
    if args.tp > 1 or args.mode == "library":
        tensors = "numpy"  # the engine owns no tensors there: UlaCache's cpu backend holds the bytes
    q_len = args.q_len

    # Peak live history (entries per group) in the reference run's schedule decides the pool
    # sizes: device and host each hold well under the history; together they hold it.
    peak = peak_history(reqs, args.max_batch, q_len)
    step_working_set = args.max_batch * q_len * (model.top_k + 1)  # the most distinct entries one step can select
    if args.tp > 1:   # per rank: its shard of the history and of the step's working set
        device_slots = args.device_slots or max(step_working_set // args.tp + args.max_batch * q_len,
                                                peak * 2 // (5 * args.tp))
        host_slots = peak * 3 // (4 * args.tp) + peak // 8
        store = TpStore(ulacache, model, device_slots, host_slots, args.max_batch, q_len, args.tp, args.reserve,
                        args.reserve_quantile)
    else:
        device_slots = args.device_slots or max(step_working_set, peak * 2 // 5)
        host_slots = peak * 3 // 4
        store = UlaStore(ulacache, model, device_slots, host_slots, args.max_batch, q_len, args.mode, tensors,
                         args.reserve, args.reserve_quantile)
    sgl = dict(q_len=q_len, reject=args.reject, seed=args.seed, reserve=args.reserve)
    shadow = None
    if args.reserve == "oracle":  # the oracle draws each round's selections over the same entries, kept dense
        shadow = DenseStore(model, reqs, q_len) if args.tp == 1 else DenseAtHomeStore(model, reqs, q_len, args.tp)
    ula = run(model, ulacache, reqs, store, args.max_batch, shadow=shadow, **sgl)
    # The references replay UlaCache's schedule (admissions, retractions), which its memory
    # decided. TP at home merges per-rank partials: its bit-exact reference splits the dense
    # entries the same way (DenseAtHomeStore); the plain dense run is reported beside it.
    dense = run(model, ulacache, reqs, DenseStore(model, reqs, q_len), args.max_batch, replay=ula["schedule"], **sgl)
    reference = dense if args.tp == 1 else run(model, ulacache, reqs, DenseAtHomeStore(model, reqs, q_len, args.tp),
                                               args.max_batch, replay=ula["schedule"], **sgl)

    same = reference["logits"].shape == ula["logits"].shape and reference["logits"].tobytes() == ula["logits"].tobytes()
    max_diff = float(np.max(np.abs(dense["logits"] - ula["logits"]))) if dense["logits"].shape == ula["logits"].shape else None
    st = store.stats
    result = {
        "model": cfg.name,
        "exec": args.mode if args.tp == 1 else "engine",
        "tp": args.tp,
        "q_len": q_len,
        "groups": [len(layers) for layers in model.group_layers],
        "tensors": tensors,
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
        "new_tokens_moved": st.get("new_moved"),
        "reserve": args.reserve,
        "rounds_reserved": ula["rounds_reserved"],
        "plan_refusals": ula["plan_refusals"],
        "retractions": ula["retractions"],
        "admissions_deferred": ula["admissions_deferred"],
        "drafts_rejected": ula["drafts_rejected"],
        "mean_batch": round(ula["requests_decoded"] / max(ula["rounds_reserved"], 1), 3),
        # Of what the reservation set aside for the requests' selections, the share they used.
        "reserved_selections_used": round(ula["selections_used"] / max(ula["selections_reserved"], 1), 4),
        # SGLang's HiSparse: a fixed device buffer per request of 2 x top-k entries (4,096 for top-k
        # 2,048) plus its new tokens, so a pool of this size decodes at most this many at once.
        "hisparse_batch_bound": min(args.max_batch, device_slots // (2 * model.top_k + q_len)),  # TP: new tokens whose slot a plan of their round moved
        "logits_compared": int(dense["logits"].shape[0]),
        "reference": "dense" if args.tp == 1 else "dense_at_home",
        "max_abs_logit_diff": max_diff,  # against the plain dense run
        "bit_identical": bool(same),     # against the reference
        "matches_dense_reference": bool(same and reference["tokens"] == ula["tokens"]),
    }
    if args.json:
        print(json.dumps(result))
    else:
        print(f"mini engine: {cfg.name}, {len(reqs)} requests, batch <= {args.max_batch}, exec={result['exec']}, "
              f"tp={args.tp}, q_len={q_len}, groups={result['groups']}, tensors={tensors}")
        print(f"  pools per group: {device_slots} device + {host_slots} host slots; peak history {peak} entries")
        print(f"  decode: {result['decode_tokens']} tokens in {result['steps']} steps, "
              f"{result['tokens_per_s']} tokens/s (dense reference {result['dense_tokens_per_s']} tokens/s)")
        print(f"  scheduler (--reserve {args.reserve}): {result['rounds_reserved']} rounds reserved, "
              f"{result['retractions']} retractions, {result['admissions_deferred']} admissions deferred, "
              f"{result['plan_refusals']} plans refused (a request retracted, planned again), "
              f"{result['drafts_rejected']} drafts rejected")
        print(f"  mean batch {result['mean_batch']} (HiSparse's per-request buffers: at most "
              f"{result['hisparse_batch_bound']}); the rounds used {result['reserved_selections_used']:.1%} of the "
              f"selections reserved")
        print(f"  hit rate {result['hit_rate']:.2%}, entries fetched {st['misses']}, evicted {st['evictions']}, "
              f"{st['bytes_moved']} bytes moved")
        verdict = "bit-identical to" if result["matches_dense_reference"] else "DIFFERENT from"
        what = "dense reference" if args.tp == 1 else "dense reference of attention at home (partials merged in rank order)"
        print(f"  logits ({result['logits_compared']} rows): {verdict} the {what}")
        if args.tp > 1:
            print(f"  against the single-softmax dense run: max |logit diff| {max_diff:.1e}")
    return 0 if result["matches_dense_reference"] else 1


def peak_history(reqs, max_batch, q_len=1):
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
                live[r["id"]][0] += q_len
                live[r["id"]][1] -= q_len
        peak = max(peak, sum(v[0] for v in live.values()))
        for b in range(max_batch):
            r = rows[b]
            if r is not None and live[r["id"]][1] <= 0:
                del live[r["id"]]
                rows[b] = None
        step += 1
    return peak


if __name__ == "__main__":
    sys.exit(main())
