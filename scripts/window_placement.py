#!/usr/bin/env python3
"""Where a request's window KV lives in a TP space with kinds: striped a mod P by token, or
whole on one rank per request (its window home). docs/ARCHITECTURE.md, "Kinds under TP".

  window_placement.py [--model NAME] [--ranks P] [--batch B] [--context T] [--drafts D]
                      [--steps N] [--seed S] [--json]

Attention at home (docs/ARCHITECTURE.md, "TP attention at home") runs every head over a
rank's own entries and sends each head's partial record (kv width + 2 float32 values) to the
head's owner. Per decode step and rank, from the model config (configs/models/NAME.json):
  exchange  CSA and HCA layers: the C4 / C128 entries are striped a mod P, so every rank holds
            a part of every request past P compressed entries and sends a record per request,
            wherever the window is (its partial merges locally, by log-sum-exp, with the
            rank's C4 or C128 partial). Window-only layers: striped, every rank sends a record
            per request; whole, only the window home sends, for its B / P requests. The
            absorbed queries go the same way (to every rank, or to the window home only).
  memory    window KV per rank: a ring of window + drafts tokens per request in blocks of
            `--block` tokens; striped, each rank's part of every request sits in blocks of
            its own; whole, a request's ring sits on its window home, and the ranks differ by
            how many requests each holds. The imbalance is measured over N steps of a batch
            whose requests end at random (a geometric life of --life steps) while as many
            arrive on average (up to the batch), each placed on the rank with the fewest.
Exit 0 and a table (or --json); exit 2 with the option named for bad input.
"""
import argparse
import json
import math
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def positive(name):
    def parse(text):
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"--{name}: {text} is not a whole number")
        if v < 1:
            raise argparse.ArgumentTypeError(f"--{name}: {text} is not at least 1")
        return v
    return parse


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="deepseek_v4_flash")
    ap.add_argument("--ranks", type=positive("ranks"), default=8)
    ap.add_argument("--batch", type=positive("batch"), default=512)
    ap.add_argument("--context", type=positive("context"), default=32768, help="tokens per request")
    ap.add_argument("--drafts", type=int, default=1, help="draft tokens per step (MTP)")
    ap.add_argument("--block", type=positive("block"), default=64, help="tokens per window block")
    ap.add_argument("--steps", type=positive("steps"), default=20000)
    ap.add_argument("--life", type=positive("life"), default=2048, help="mean decode steps of a request")
    ap.add_argument("--seed", type=int, default=20261206)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    if a.drafts < 0:
        ap.error(f"--drafts: {a.drafts} is not at least 0")
    path = ROOT / "configs" / "models" / f"{a.model}.json"
    if not path.exists():
        ap.error(f"--model: {a.model}: no {path.relative_to(ROOT)}")
    m = json.loads(path.read_text())
    ratios = m.get("compress_ratios")
    if not ratios or "sliding_window" not in m:
        ap.error(f"--model: {a.model} has no layer kinds (compress_ratios, sliding_window)")
    layers = ratios[: m["num_layers"]]
    window_only = sum(1 for r in layers if r == 0)
    compressed = len(layers) - window_only
    P, B, q = a.ranks, a.batch, 1 + a.drafts
    heads, width = m["attention_heads"], m["kv_lora_rank"] + m["qk_rope_head_dim"]
    record = heads * (width + 2) * 4          # float32 partial records of every head, one query token
    query = heads * width * 2                 # bf16 absorbed query of every head
    away = (P - 1) / P                        # the share of heads another rank owns
    # A request has a part on every rank on a compressed layer once it has P entries of it.
    min_ratio = max([r for r in layers if r > 0], default=1)
    every_rank = a.context >= P * min_ratio
    per_compressed = B * q * (record + query) * away if every_rank else B / P * q * (record + query) * away
    striped = (compressed * per_compressed + window_only * B * q * (record + query) * away)
    whole = (compressed * per_compressed + window_only * (B / P) * q * (record + query) * away)

    ring = m["sliding_window"] + a.drafts
    entry = m["kv_entry_bytes_per_layer"]
    kv_layers = len(layers)                   # every layer keeps its window
    blocks_whole = math.ceil(ring / a.block) + 1
    blocks_striped = math.ceil(math.ceil(ring / P) / a.block) + 1
    per_request_whole = blocks_whole * a.block * entry * kv_layers
    per_rank_striped = B * blocks_striped * a.block * entry * kv_layers

    rng = random.Random(a.seed)
    count = [0] * P
    live = []  # the window home of each live request
    for _ in range(B):  # the batch admitted in turn, each to the rank with the fewest
        r = min(range(P), key=lambda x: (count[x], x))
        count[r] += 1
        live.append(r)
    worst = 0
    excess_sum = 0.0
    for _ in range(a.steps):
        # Requests end at random (mean life --life steps); as many arrive on average, up to
        # the batch, each placed on the rank with the fewest: the ranks differ by where the
        # ends fell since.
        kept = []
        for r in live:
            if rng.random() < 1.0 / a.life:
                count[r] -= 1
            else:
                kept.append(r)
        live = kept
        arrivals = sum(1 for _ in range(B) if rng.random() < 1.0 / a.life)
        for _ in range(min(arrivals, B - len(live))):
            r = min(range(P), key=lambda x: (count[x], x))
            count[r] += 1
            live.append(r)
        excess = max(count) - len(live) / P
        worst = max(worst, excess)
        excess_sum += excess
    mean_excess = excess_sum / a.steps
    out = {
        "model": a.model, "ranks": P, "batch": B, "context": a.context, "query_tokens": q,
        "layers": {"window_only": window_only, "compressed": compressed},
        "exchange_bytes_per_step_rank": {"striped": round(striped), "whole": round(whole),
                                         "striped_over_whole": striped / whole},
        "window_bytes_per_rank": {
            "striped": per_rank_striped, "whole_mean": per_request_whole * B / P,
            "whole_worst": per_request_whole * (B / P + worst),
            "whole_mean_excess_requests": mean_excess, "whole_worst_excess_requests": worst},
        "decision": "whole" if whole < striped and per_request_whole * (B / P + worst) <= per_rank_striped
                    else "striped",
    }
    if a.json:
        print(json.dumps(out, indent=1))
        return 0
    gb = 1e9
    print(f"{a.model}: P={P}, batch {B}, context {a.context}, {q} query tokens a step; "
          f"{window_only} window-only and {compressed} compressed layers")
    print(f"exchange per step and rank (partial records and queries): striped {striped / gb:.3f} GB, "
          f"whole {whole / gb:.3f} GB ({striped / whole:.4f}x)")
    print(f"window KV per rank: striped {per_rank_striped / gb:.3f} GB; whole {per_request_whole * B / P / gb:.3f} GB "
          f"mean, {per_request_whole * (B / P + worst) / gb:.3f} GB on the fullest rank "
          f"(+{worst:.0f} requests at worst, +{mean_excess:.2f} on average over {a.steps} steps)")
    print(f"decision: {out['decision']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
