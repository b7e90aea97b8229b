#!/usr/bin/env bash
# Where `make test`'s time goes (docs/BENCHMARKS.md, "The test loop").
#   phase.sh start              forget the previous run's phases; snapshot ccache's counters
#   phase.sh run NAME CMD...    run CMD, record its wall time under NAME (its exit status is kept)
#   phase.sh report             print each phase's wall time, the total, and ccache's hits and
#                               misses since `start` (with the hit rate)
# The record lives in .test-phases/ at the repository root (ignored by git).
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
dir="$here/.test-phases"
stats() {  # "hits misses" from ccache's machine-readable counters, or nothing without ccache
  command -v ccache >/dev/null 2>&1 || return 0
  CCACHE_CONFIGPATH="$here/ccache.conf" ccache --print-stats 2>/dev/null |
    awk '$1=="direct_cache_hit"||$1=="preprocessed_cache_hit"{h+=$2} $1=="cache_miss"{m+=$2} END{print h+0, m+0}'
}
case "${1:-}" in
  start)
    rm -rf "$dir" && mkdir -p "$dir"
    # On a machine without ccache yet, the package phase installs it: its counters start at 0.
    if command -v ccache >/dev/null 2>&1; then stats >"$dir/ccache-before"; else echo "0 0 installed" >"$dir/ccache-before"; fi
    date +%s >"$dir/start"
    ;;
  run)
    name=$2; shift 2
    t0=$(date +%s.%N)
    "$@"; rc=$?
    t1=$(date +%s.%N)
    mkdir -p "$dir"
    awk -v n="$name" -v a="$t0" -v b="$t1" -v rc=$rc 'BEGIN{printf "%s\t%.1f\t%s\n", n, b - a, rc}' >>"$dir/phases"
    exit $rc
    ;;
  report)
    [ -f "$dir/phases" ] || { echo "phase.sh: no phases recorded"; exit 0; }
    echo "---- where the time went (wall seconds) ----"
    awk -F'\t' '{printf "  %-28s %8.1f s%s\n", $1, $2, ($3=="0" ? "" : "  (exit " $3 ")"); t+=$2}
                END{printf "  %-28s %8.1f s (%.1f min)\n", "total", t, t/60}' "$dir/phases"
    if [ -s "$dir/ccache-before" ]; then
      read -r h0 m0 how <"$dir/ccache-before"
      read -r h1 m1 < <(stats)
      h=$((${h1:-0} - h0)); m=$((${m1:-0} - m0))
      if [ -z "${h1:-}" ]; then
        echo "  ccache: not in use"
      elif [ $((h + m)) -gt 0 ]; then
        awk -v h=$h -v m=$m -v how="${how:-}" 'BEGIN{printf "  ccache: %d hits, %d misses, hit rate %.1f %%%s\n", h, m, 100*h/(h+m),
                                            how == "installed" ? " (installed by this run: a cold cache)" : ""}'
      else
        echo "  ccache: no compilations in this run"
      fi
    else
      echo "  ccache: not in use"
    fi
    ;;
  *) echo "usage: phase.sh start | run NAME CMD... | report" >&2; exit 2 ;;
esac
