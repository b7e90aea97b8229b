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
holds two thirds of the history. The copy plan comes back as a dict of int32/int64 columns
(every field, or --columns: vllm_loop, the six examples/vllm_loop.py reads) or as
DESCRIPTOR_DTYPE records (--descriptors records); numpy arrays, or with --tensors torch CPU
torch tensors over the same memory (as vLLM hands them).

Per plan call it reads perf_counter_ns around `planner.plan(...)` (the Python call) and,
where the module has it, `planner.last_plan_timing`: the nanoseconds the binding spent
taking its arguments (views and checks), inside the C++ planner (StepPlanner::Plan)
and writing its outputs (the descriptor columns, the result tuple). The rest of the Python
call is pybind11's dispatch (argument parsing, the call, the returned objects). Prints the
median over --reps rounds (after --warmup rounds) of each part, per plan call.

Usage: python3 bench/plan_cost.py [--reps N] [--warmup N] [--shapes decode,mixed]
       [--descriptors columns|records] [--columns all|vllm_loop|F,F,...]
       [--tensors numpy|torch] [--quick] [--json] [--build-dir DIR]
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
    """One step's batch: `decodes` requests of q_len 2 over `history` tokens each, and
    `prefills` chunks of `chunk` tokens starting at position `prefill_at`."""

    def __init__(self, name, decodes, history, prefills, chunk, prefill_at, top_k):
        self.name, self.decodes, self.history = name, decodes, history
        self.prefills, self.chunk, self.prefill_at, self.top_k = prefills, chunk, prefill_at, top_k

    @property
    def rows(self):
        return 2 * self.decodes + self.prefills * self.chunk

    def lengths(self):
        """Tokens each request holds (a prefill's chunk included: its KV is written first)."""
        return [self.history] * self.decodes + [self.prefill_at + self.chunk] * self.prefills


def shapes(quick):
    if quick:
        return {"decode": Shape("decode", 4, 512, 0, 0, 0, 64), "mixed": Shape("mixed", 4, 512, 2, 120, 256, 64)}
    return {"decode": Shape("decode", 32, 8192, 0, 0, 0, 2048),
            "mixed": Shape("mixed", 32, 8192, 4, 2032, 4096, 2048)}


def build(ulacache, shape, descriptors_form, columns, seed):
    lengths = shape.lengths()
    history = sum(lengths)
    # Two thirds of the history fits on device, the rest on host: a step's misses move.
    device = history * 2 // 3
    host = history + device
    cfg = ulacache.AddressSpaceConfig(stable_new_entries=True, num_groups=GROUPS, entry_bytes=ROW * LAYERS,
                                      row_bytes=ROW, device_bytes_per_rank=GROUPS * device * ROW * LAYERS,
                                      host_bytes_per_rank=GROUPS * host * ROW * LAYERS)
    space = ulacache.AddressSpace(cfg, backend="counting")
    max_q = max(2, shape.chunk)
    planner = ulacache.StepPlanner(space, max_batch=shape.rows, max_q_len=max_q, max_top_k=shape.top_k,
                                         max_rows=shape.rows)
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
    q_lens = [2] * shape.decodes + [shape.chunk] * shape.prefills
    qsl[1:] = np.cumsum(q_lens)
    # Each row's visible prefix: a decode's two rows see all its tokens (the draft's row
    # one more than the verified one's, both already written); a prefill row at position p
    # sees p + 1 tokens.
    rng = np.random.default_rng(seed)
    perms = [rng.permutation(n) for n in lengths]
    row_req = np.repeat(np.arange(len(lengths)), q_lens)
    visible = np.concatenate([np.full(2 * shape.decodes, shape.history)] +
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


def measure(ulacache, shape, args):
    space, planner, requests, qsl, desc, selections = build(ulacache, shape, args.descriptors,
                                                            columns_of(ulacache, args.columns), args.seed)
    idx = np.empty((shape.rows, shape.top_k), np.int32)
    wrap = lambda a: a  # noqa: E731
    if args.tensors == "torch":  # CPU tensors over the same memory, handed over by DLPack
        import torch
        wrap = torch.from_numpy
        requests, qsl, idx = wrap(requests), wrap(qsl), wrap(idx)
        if isinstance(desc, dict):
            desc = {k: wrap(v) for k, v in desc.items()}
    timed = hasattr(planner, "last_plan_timing")
    samples = {"python": [], "args": [], "planner": [], "outputs": []}
    stats = {"selections": [], "distinct": [], "misses": [], "descriptors": []}
    rounds = args.warmup + args.reps
    for i in range(rounds):
        step = [wrap(selections()) for _ in range(GROUPS)]  # drawn before the timed calls
        for g in range(GROUPS):
            sel = step[g]
            t0 = time.perf_counter_ns()
            fence, n, st = planner.plan(0, g, sel, idx, desc, requests, query_start_loc=qsl)
            t1 = time.perf_counter_ns()
            planner.complete(fence, np.zeros(n, np.uint8))
            if i < args.warmup:
                continue
            samples["python"].append(t1 - t0)
            if timed:
                t = planner.last_plan_timing
                samples["args"].append(t["args_ns"])
                samples["planner"].append(t["planner_ns"])
                samples["outputs"].append(t["outputs_ns"])
            stats["selections"].append(st.selections)
            stats["distinct"].append(st.distinct)
            stats["misses"].append(st.misses)
            stats["descriptors"].append(n)
        space.advance_round()
    med = {k: statistics.median(v) / 1e3 for k, v in samples.items() if v}  # microseconds
    out = {"shape": shape.name, "rows": shape.rows, "top_k": shape.top_k, "groups": GROUPS,
           "descriptors_form": args.descriptors, "tensors": args.tensors,
           "columns": args.columns if args.descriptors == "columns" else None, "plans": len(samples["python"]),
           "median_us": {k: round(v, 1) for k, v in med.items()},
           "per_plan": {k: int(statistics.median(v)) for k, v in stats.items()}}
    if timed:
        med_dispatch = statistics.median(
            [p - (a + q + o) for p, a, q, o in zip(samples["python"], samples["args"], samples["planner"],
                                                   samples["outputs"])]) / 1e3
        out["median_us"]["dispatch"] = round(med_dispatch, 1)
        out["overhead_percent"] = round(100.0 * statistics.median(
            [(p - q) / q for p, q in zip(samples["python"], samples["planner"])]), 1)
    return out


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
    ap.add_argument("--seed", type=int, default=20261205)
    ap.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--build-dir")
    args = ap.parse_args(argv)
    if args.reps < 1 or args.warmup < 0:
        ap.error("--reps must be at least 1 and --warmup at least 0")
    ulacache = import_ulacache(args.build_dir)
    table = shapes(args.quick)
    results = []
    for name in args.shapes.split(","):
        if name not in table:
            ap.error(f"--shapes: unknown shape {name!r} (decode, mixed)")
        results.append(measure(ulacache, table[name], args))
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    print(f"plan cost from Python, per plan call, median of {args.reps} rounds x {GROUPS} groups "
          f"(descriptors as {args.descriptors}"
          f"{': ' + args.columns if args.descriptors == 'columns' else ''}; {args.tensors}), microseconds")
    cols = ["python", "dispatch", "args", "planner", "outputs"]
    print(f"{'shape':8} {'rows x top_k':>13} {'misses':>7} " + " ".join(f"{c:>9}" for c in cols) + f" {'overhead':>9}")
    for r in results:
        m = r["median_us"]
        cells = " ".join(f"{m[c]:9.1f}" if c in m else f"{'-':>9}" for c in cols)
        over = f"{r['overhead_percent']:8.1f}%" if "overhead_percent" in r else f"{'-':>9}"
        print(f"{r['shape']:8} {str(r['rows']) + ' x ' + str(r['top_k']):>13} {r['per_plan']['misses']:7d} {cells} {over}")
    print("python: the whole call; dispatch: pybind11's (parse, call, return); args: views and checks of the "
          "arguments; planner: StepPlanner::Plan; outputs: descriptor columns and the result; "
          "overhead: median of (python - planner) / planner")
    return 0


if __name__ == "__main__":
    sys.exit(main())
