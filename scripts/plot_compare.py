#!/usr/bin/python3
"""Plots of `ula compare`: one PNG per config, throughput against batch size, every system
on the same axes (admission limits marked); ulacache_home (attention at home) only in TP
configs. Usage: plot_compare.py COMPARE_CSV OUT_DIR.
Run with Debian's /usr/bin/python3 and python3-matplotlib."""
import csv
import os
import sys

try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError as e:  # the C++ program turns the exit code into a warning
    print(f"plot_compare.py: matplotlib is not available ({e})", file=sys.stderr)
    sys.exit(3)

STYLE = {
    "all_gpu": ("all-GPU", "tab:gray", "s"),
    "hisparse": ("HiSparse", "tab:orange", "^"),
    "ulacache": ("UlaCache", "tab:blue", "o"),
    "ulacache_home": ("UlaCache, attention at home", "tab:green", "D"),
    "dcp": ("DCP (vLLM)", "tab:red", "v"),
    "dcp_sglang": ("DCP (SGLang)", "tab:pink", "<"),
    "helix": ("Helix (TensorRT-LLM)", "tab:purple", ">"),
    "vllm_hisparse": ("HiSparse (vLLM)", "tab:brown", "x"),
    "trtllm_offload": ("sparse KV offload (TensorRT-LLM)", "tab:olive", "P"),
}
TP_ONLY = {"ulacache_home", "dcp", "dcp_sglang", "helix"}


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    rows = list(csv.DictReader(open(sys.argv[1])))
    out_dir = sys.argv[2]
    # summary.csv beside compare.csv says which systems their engines ship (ships = hyp:
    # hypothetical, drawn dashed).
    summary = os.path.join(os.path.dirname(sys.argv[1]), "summary.csv")
    ships = {}
    if os.path.exists(summary):
        for r in csv.DictReader(open(summary)):
            ships[(r["config"], r["system"])] = r.get("ships", "yes")
    configs = {}
    for r in rows:
        configs.setdefault(r["config"], []).append(r)
    for name, rs in configs.items():
        fig, ax = plt.subplots(figsize=(7, 4.5))
        first = rs[0]
        for system, (label, color, marker) in STYLE.items():
            if system in TP_ONLY and first["mode"] != "tp":
                continue
            pts = [(int(r["batch"]), float(r["tput"])) for r in rs if r["system"] == system]
            if not pts:
                ax.plot([], [], color=color, marker=marker, label=f"{label} (admits 0)")
                continue
            xs, ys = zip(*pts)
            hyp = ships.get((name, system)) == "hyp"
            ax.plot(xs, ys, color=color, marker=marker, markersize=4, linestyle="--" if hyp else "-",
                    label=f"{label}{' (hypothetical)' if hyp else ''} (runs to {xs[-1]})")
            ax.axvline(xs[-1], color=color, linestyle=":", linewidth=0.8)
        mtp = "MTP on" if first["mtp"] == "1" else "MTP off"
        ax.set_title(f"GLM-5 decode, {first['hardware']} {first['mode'].upper()}, {mtp}")
        ax.set_xlabel("requests decoding at once (batch)")
        ax.set_ylabel("output tokens / s (node)")
        ax.set_xscale("log", base=2)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(loc="upper left", fontsize="small")
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, f"{name}.png"), dpi=110)
        plt.close(fig)
    return 0


if __name__ == "__main__":
    sys.exit(main())
