#!/usr/bin/env python3
"""What a plan call costs from Python at vLLM's sizes, and where the time goes.

Two steps, each planned in 2 layer groups per round over a 'counting' space (the planner's
metadata only, as under an engine that owns its KV memory), rows of 656 bytes (FP8 MLA):
  decode  vLLM's flat batch of 32 requests, q_len 2 (one MTP draft): selections int32
          [64, 2048], requests int32 [32] with query_start_loc int32 [33], 8,192 tokens of
          history each;
  mixed   a full token budget of 8,192 rows: the 32 decodes beside 4 prefill chunks of
          2,032 tokens (causal: a chunk's early rows select fewer than 2,048, padded with -1).
Selections are distinct within a row, drawn at random from the row's request's history
(a fixed seed), so most of each step's distinct entries move: the device pool of each group
holds q_len / (q_len + 1) of the history (two thirds at the default q_len 2). The copy plan comes back as a dict of int32/int64 columns
(every field, or --columns: vllm_loop, the six examples/vllm_loop.py reads) or as
DESCRIPTOR_DTYPE records (--descriptors records); numpy arrays, or with --tensors torch CPU
torch tensors over the same memory (as vLLM hands them).

--q-len sets each decode's query rows (1 + drafts; default 2). --layout batched hands the
decode step over as SGLang's [batch, q_len, top_k] with one request per batch row instead of
vLLM's flat rows cut by query_start_loc (decode only). --reserve guaranteed,quantile plans
each shape on one planner per reservation mode (StepPlanner(reserve=...); the same space
layout, seed and selections), the modes alternated within each round (the first to plan
rotates), and reports each mode's medians and the median over paired plan calls (same round
and group) of each mode's planner time over the first mode's: the quantile mode's own cost
in a plan, its measurement of each request's distinct share (step/selection_share.h; it
reads a request's rows as one sample in the batched layout, a single row in the flat one).

Per plan call it reads perf_counter_ns around `planner.plan(...)` (the Python call) and,
where the module has it, `planner.last_plan_timing`: the nanoseconds the binding spent
taking its arguments (views and checks), inside the C++ planner (StepPlanner::Plan, which
writes the descriptors itself, records or columns) and writing its outputs (the result
tuple). The rest of the Python
call is pybind11's dispatch (argument parsing, the call, the returned objects). Prints the
median over --reps rounds (after --warmup rounds) of each part, per plan call.

Usage: python3 bench/plan_cost.py [--reps N] [--warmup N] [--shapes decode,mixed]
       [--descriptors columns|records] [--columns all|vllm_loop|F,F,...]
       [--tensors numpy|torch] [--q-len N] [--layout flat|batched]
       [--reserve guaranteed|quantile|guaranteed,quantile] [--quick] [--json] [--build-dir DIR]
--quick: small sizes (a smoke run, the ctest).
"""
import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "examples"))
try:
    import numpy as np
    from vllm_loop import import_ulacache  # finds the in-tree build (ULA_PYTHON_PATH, --build-dir)
except ImportError:
    # Another python3 first on PATH (without numpy): run with the one the package is built for.
    if __name__ == "__main__" and os.path.realpath(sys.executable) != "/usr/bin/python3":
        os.execv("/usr/bin/python3", ["/usr/bin/python3", *sys.argv])
    raise

ROW = 656      # bytes of one layer's row (GLM-5 / DeepSeek-V3.2 FP8 MLA)
LAYERS = 2     # layers per group (the descriptors name rows; the planner's time does not depend on it)
GROUPS = 2


class Shape:
    """One step's batch: `decodes` requests of `q_len` query rows over `history` tokens each,
    and `prefills` chunks of `chunk` tokens starting at position `prefill_at`."""

    def __init__(self, name, decodes, history, prefills, chunk, prefill_at, top_k, q_len=2):
        self.name, self.decodes, self.history = name, decodes, history
        self.prefills, self.chunk, self.prefill_at, self.top_k = prefills, chunk, prefill_at, top_k
        self.q_len = q_len

    @property
    def rows(self):
        return self.q_len * self.decodes + self.prefills * self.chunk

    def lengths(self):
        """Tokens each request holds (a prefill's chunk included: its KV is written first)."""
        return [self.history] * self.decodes + [self.prefill_at + self.chunk] * self.prefills


def shapes(quick, q_len):
    if quick:
        return {"decode": Shape("decode", 4, 512, 0, 0, 0, 64, q_len),
                "mixed": Shape("mixed", 4, 512, 2, 120, 256, 64, q_len)}
    return {"decode": Shape("decode", 32, 8192, 0, 0, 0, 2048, q_len),
            "mixed": Shape("mixed", 32, 8192, 4, 2032, 4096, 2048, q_len)}


def build(ulacache, shape, descriptors_form, columns, seed, reserve="guaranteed"):
    lengths = shape.lengths()
    history = sum(lengths)
    # q_len / (q_len + 1) of the history fits on device (two thirds at q_len 2), the rest on
    # host: a step's misses move, and the step's distinct entries (more rows, more of them)
    # still fit.
    device = history * shape.q_len // (shape.q_len + 1)
    host = history + device
    cfg = ulacache.AddressSpaceConfig(stable_new_entries=True, num_groups=GROUPS, entry_bytes=ROW * LAYERS,
                                      row_bytes=ROW, device_bytes_per_rank=GROUPS * device * ROW * LAYERS,
                                      host_bytes_per_rank=GROUPS * host * ROW * LAYERS)
    space = ulacache.AddressSpace(cfg, backend="counting")
    max_q = max(shape.q_len, shape.chunk)
    planner = ulacache.StepPlanner(space, max_batch=shape.rows, max_q_len=max_q, max_top_k=shape.top_k,
                                   max_rows=shape.rows, reserve=reserve)
    addrs = []
    for r, n in enumerate(lengths):
        space.add_request(r)
        got = []
        while sum(len(g) for g in got) < n:  # at most a device pool's worth per round
            got.append(space.allocate(r, min(n - sum(len(g) for g in got), 4096)))
            space.advance_round()
        addrs.append(np.concatenate(got).astype(np.int64))
    requests = np.arange(len(lengths), dtype=np.int32)
    qsl = np.zeros(len(lengths) + 1, np.int32)
    q_lens = [shape.q_len] * shape.decodes + [shape.chunk] * shape.prefills
    qsl[1:] = np.cumsum(q_lens)
    # Each row's visible prefix: a decode's q_len rows see all its tokens (a draft's row
    # more than the verified one's, all already written); a prefill row at position p
    # sees p + 1 tokens.
    rng = np.random.default_rng(seed)
    perms = [rng.permutation(n) for n in lengths]
    row_req = np.repeat(np.arange(len(lengths)), q_lens)
    visible = np.concatenate([np.full(shape.q_len * shape.decodes, shape.history)] +
                             [np.arange(shape.prefill_at + 1, shape.prefill_at + shape.chunk + 1)
                              for _ in range(shape.prefills)]).astype(np.int64)
    if descriptors_form == "columns":
        desc = ulacache.descriptor_columns(planner.max_descriptors, columns)
    else:
        desc = np.zeros(planner.max_descriptors, ulacache.DESCRIPTOR_DTYPE)

    def selections():
        """[rows, top_k] int32: distinct addresses of each row's visible prefix, -1 padded."""
        sel = np.full((shape.rows, shape.top_k), -1, np.int32)
        k = np.arange(shape.top_k)
        offsets = rng.integers(0, 1 << 30, shape.rows)
        for r in range(len(lengths)):
            rows = np.nonzero(row_req == r)[0]
            vis = visible[rows]
            # Row i takes perm-positions (offset + j) mod vis for j < min(vis, top_k): distinct,
            # and only positions below vis (the permutation restricted to the prefix).
            take = np.minimum(vis, shape.top_k)
            for i, row in enumerate(rows):
                v, t = int(vis[i]), int(take[i])
                pool = perms[r][perms[r] < v] if v < lengths[r] else perms[r]
                pick = pool[(offsets[row] + k[:t]) % v]
                sel[row, :t] = addrs[r][pick]
        return sel

    return space, planner, requests, qsl, desc, selections


# The columns examples/vllm_loop.py asks for: what its copy kernel and its checks read.
VLLM_LOOP_COLUMNS = ("src_slot", "dst_slot", "src_tier", "dst_tier", "op", "num_layers")


def columns_of(ulacache, spec):
    if spec == "all":
        return ulacache.DESCRIPTOR_FIELDS
    if spec == "vllm_loop":
        return VLLM_LOOP_COLUMNS
    return tuple(spec.split(","))


class Run:
    """One reservation mode's planner over its own space: what it drew and measured."""

    def __init__(self, ulacache, shape, args, reserve):
        self.reserve = reserve
        (self.space, self.planner, requests, qsl, desc,
         self.selections) = build(ulacache, shape, args.descriptors, columns_of(ulacache, args.columns), args.seed,
                                  reserve)
        batched = args.layout == "batched"
        self.dims = (shape.decodes, shape.q_len, shape.top_k) if batched else (shape.rows, shape.top_k)
        idx = np.empty(self.dims, np.int32)
        self.wrap = lambda a: a  # noqa: E731
        if args.tensors == "torch":  # CPU tensors over the same memory, handed over by DLPack
            import torch
            self.wrap = torch.from_numpy
            requests, qsl, idx = self.wrap(requests), self.wrap(qsl), self.wrap(idx)
            if isinstance(desc, dict):
                desc = {k: self.wrap(v) for k, v in desc.items()}
        self.requests, self.qsl, self.idx, self.desc = requests, (None if batched else qsl), idx, desc
        self.timed = hasattr(self.planner, "last_plan_timing")
        self.samples = {"python": [], "args": [], "planner": [], "outputs": []}
        self.stats = {"selections": [], "distinct": [], "misses": [], "descriptors": []}

    def round(self, measured):
        """Plans every group once (selections drawn before the timed calls), then the round ends."""
        step = [self.wrap(self.selections().reshape(self.dims)) for _ in range(GROUPS)]
        for g in range(GROUPS):
            t0 = time.perf_counter_ns()
            fence, n, st = self.planner.plan(0, g, step[g], self.idx, self.desc, self.requests,
                                             query_start_loc=self.qsl)
            t1 = time.perf_counter_ns()
            self.planner.complete(fence, np.zeros(n, np.uint8))
            if not measured:
                continue
            self.samples["python"].append(t1 - t0)
            if self.timed:
                t = self.planner.last_plan_timing
                self.samples["args"].append(t["args_ns"])
                self.samples["planner"].append(t["planner_ns"])
                self.samples["outputs"].append(t["outputs_ns"])
            self.stats["selections"].append(st.selections)
            self.stats["distinct"].append(st.distinct)
            self.stats["misses"].append(st.misses)
            self.stats["descriptors"].append(n)
        self.space.advance_round()

    def result(self, shape, args):
        samples = self.samples
        med = {k: statistics.median(v) / 1e3 for k, v in samples.items() if v}  # microseconds
        out = {"shape": shape.name, "rows": shape.rows, "top_k": shape.top_k, "q_len": shape.q_len,
               "layout": args.layout, "reserve": self.reserve, "groups": GROUPS,
               "descriptors_form": args.descriptors, "tensors": args.tensors,
               "columns": args.columns if args.descriptors == "columns" else None, "plans": len(samples["python"]),
               "median_us": {k: round(v, 1) for k, v in med.items()},
               "per_plan": {k: int(statistics.median(v)) for k, v in self.stats.items()}}
        if self.timed:
            med_dispatch = statistics.median(
                [p - (a + q + o) for p, a, q, o in zip(samples["python"], samples["args"], samples["planner"],
                                                       samples["outputs"])]) / 1e3
            out["median_us"]["dispatch"] = round(med_dispatch, 1)
            out["overhead_percent"] = round(100.0 * statistics.median(
                [(p - q) / q for p, q in zip(samples["python"], samples["planner"])]), 1)
        return out


def measure(ulacache, shape, args):
    """One result per reservation mode; with several, each round plans every mode in turn
    (round i starts at mode i mod n) and each result after the first carries the median over
    paired plan calls of its planner time over the first mode's (planner_ratio)."""
    runs = [Run(ulacache, shape, args, mode) for mode in args.reserve]
    for i in range(args.warmup + args.reps):
        for j in range(len(runs)):
            runs[(i + j) % len(runs)].round(measured=i >= args.warmup)
    results = [r.result(shape, args) for r in runs]
    base = runs[0].samples["planner"]
    for r, out in zip(runs[1:], results[1:]):
        if base and r.samples["planner"]:
            out["planner_ratio"] = {"to": runs[0].reserve, "median": round(statistics.median(
                [q / b for q, b in zip(r.samples["planner"], base)]), 3)}
    return results


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=15, help="rounds measured (each plans every group)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--shapes", default="decode,mixed")
    ap.add_argument("--descriptors", choices=["columns", "records"], default="columns")
    ap.add_argument("--columns", default="all",
                    help="with columns: all, vllm_loop (the six examples/vllm_loop.py reads) or field,field,...")
    ap.add_argument("--tensors", choices=["numpy", "torch"], default="numpy",
                    help="torch: every array a CPU torch tensor over the same memory (DLPack)")
    ap.add_argument("--q-len", type=int, default=2, help="query rows of each decode request (1 + drafts)")
    ap.add_argument("--layout", choices=["flat", "batched"], default="flat",
                    help="flat: vLLM's rows cut by query_start_loc; batched: [batch, q_len, top_k] (decode only)")
    ap.add_argument("--reserve", default="guaranteed",
                    help="reservation modes, comma-separated (guaranteed, quantile): one planner each, alternated")
    ap.add_argument("--seed", type=int, default=20261205)
    ap.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--build-dir")
    args = ap.parse_args(argv)
    if args.reps < 1 or args.warmup < 0:
        ap.error("--reps must be at least 1 and --warmup at least 0")
    if args.q_len < 1:
        ap.error(f"--q-len must be at least 1, got {args.q_len}")
    args.reserve = args.reserve.split(",")
    for mode in args.reserve:
        if mode not in ("guaranteed", "quantile"):
            ap.error(f"--reserve: unknown mode {mode!r} (guaranteed, quantile)")
    if len(set(args.reserve)) != len(args.reserve):
        ap.error(f"--reserve: a mode named twice ({','.join(args.reserve)})")
    table = shapes(args.quick, args.q_len)
    names = args.shapes.split(",")
    for name in names:
        if name not in table:
            ap.error(f"--shapes: unknown shape {name!r} (decode, mixed)")
        if args.layout == "batched" and name != "decode":
            ap.error(f"--layout batched: decode only (shape {name!r} has prefill chunks of their own q_len)")
    ulacache = import_ulacache(args.build_dir)
    results = []
    for name in names:
        results.extend(measure(ulacache, table[name], args))
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    print(f"plan cost from Python, per plan call, median of {args.reps} rounds x {GROUPS} groups "
          f"(descriptors as {args.descriptors}"
          f"{': ' + args.columns if args.descriptors == 'columns' else ''}; {args.tensors}; q_len {args.q_len}, "
          f"{args.layout} layout), microseconds")
    cols = ["python", "dispatch", "args", "planner", "outputs"]
    print(f"{'shape':8} {'reserve':>10} {'rows x top_k':>13} {'misses':>7} " + " ".join(f"{c:>9}" for c in cols) +
          f" {'overhead':>9} {'planner ratio':>13}")
    for r in results:
        m = r["median_us"]
        cells = " ".join(f"{m[c]:9.1f}" if c in m else f"{'-':>9}" for c in cols)
        over = f"{r['overhead_percent']:8.1f}%" if "overhead_percent" in r else f"{'-':>9}"
        ratio = f"{r['planner_ratio']['median']:13.3f}" if "planner_ratio" in r else f"{'-':>13}"
        print(f"{r['shape']:8} {r['reserve']:>10} {str(r['rows']) + ' x ' + str(r['top_k']):>13} "
              f"{r['per_plan']['misses']:7d} {cells} {over} {ratio}")
    print("python: the whole call; dispatch: pybind11's (parse, call, return); args: views and checks of the "
          "arguments; planner: StepPlanner::Plan (the descriptors included); outputs: the result; "
          "overhead: median of (python - planner) / planner; planner ratio: median over paired plan calls of the "
          "mode's planner time over the first --reserve mode's")
    return 0


if __name__ == "__main__":
    sys.exit(main())
