#!/usr/bin/env bash
# `make fuzz`: runs every libFuzzer harness of fuzz/ (built in BUILD with -DULA_FUZZ=ON) for
# SECONDS each, starting from the committed corpus fuzz/corpus/NAME. New inputs go to
# BUILD/corpus/NAME (not the committed corpus: add an input there by hand when it is worth
# replaying in `make test`), crashes to BUILD/crashes/NAME-*. Prints one line per harness
# and exits 1 when any harness found a failing input.
set -u
BUILD=${1:-build-fuzz}
SECONDS_EACH=${2:-60}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
status=0
for fuzzer in "$BUILD"/fuzz/fuzz_*; do
  name=$(basename "$fuzzer"); name=${name#fuzz_}
  case "$name" in *_replay) continue ;; esac
  [ -x "$fuzzer" ] || continue
  mkdir -p "$BUILD/corpus/$name" "$BUILD/crashes"
  log="$BUILD/fuzz-$name.log"
  "$fuzzer" -max_total_time="$SECONDS_EACH" -print_final_stats=1 -timeout=10 -rss_limit_mb=2048 \
    -artifact_prefix="$BUILD/crashes/$name-" "$BUILD/corpus/$name" "$ROOT/fuzz/corpus/$name" >"$log" 2>&1
  rc=$?
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$')
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1)
  if [ $rc -eq 0 ]; then
    echo "fuzz $name: ${runs:-?} runs in ${SECONDS_EACH} s, ${cov:-cov: ?}, no failure"
  else
    status=1
    echo "fuzz $name: FAILED (exit $rc) after ${runs:-?} runs; input: $(ls -t "$BUILD"/crashes/"$name"-* 2>/dev/null | head -1); log: $log"
    grep -m3 -E 'fuzz property failed|ERROR: AddressSanitizer|runtime error|deadly signal' "$log" | sed 's/^/    /'
  fi
done
exit $status
