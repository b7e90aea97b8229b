#!/usr/bin/env bash
# gpu-check.sh: the GPU check, on a bare GPU machine (the CUDA driver and toolkit, CMake, bash,
# coreutils, grep, sed; none of this project's packages), from the prebuilt folder of
# scripts/gpu-build.sh. It builds nothing and runs no cmake: only the binaries of $GPU_DIST.
# docs/BENCHMARKS.md, "GPU check", says what it prints. It has NOT run on a GPU yet.
#
# Usage: gpu-check.sh [--smoke | --plan]
#   (none)   the check: every step below, in order, each under its own limit
#   --smoke  on the machine that built the folder (or any without a GPU): only that every
#            binary loads and answers (load), then gpu and probe for the record; "smoke-pass"
#   --plan   prints each step's limit, their sum and the budget; runs nothing
#
# Steps and their limits (s): correctness first, then measurements; the limits sum to less
# than the budget (467 < 470 s, --plan; the script refuses to start otherwise), so the whole check
# ends within 8 minutes.
#   load            each binary once cheaply (test lists, --help): the folder loads here
#   gpu             nvidia-smi -L: a GPU is seen
#   probe           cuda_backend_test CudaBackend.FindsTheGpu: the build's CUDA runtime finds
#                   it (device, sm, driver and runtime versions; the versions also without one)
#   *_test          cuda_backend_test, device_step_test, tp_device_step_test,
#                   policy_test: every test passes and no CUDA test
#                   (a name with "Cuda") skips; other skips are listed
#   graph_replay    device_step_test's DeviceStepCudaGraph printed its "graph:" line: a
#                   decode iteration (every group's Check, Claim, reference copies, Complete,
#                   then AdvanceRound) captured once and replayed against the OpenMP form
#   graph_replay_place  its "graph place:" line: device placement's iteration (Place with its
#                   counts in memory, the eviction copies, CompletePlace, AdvanceRound)
#                   captured once and replayed while requests arrive and finish
#   conformance_cuda, conformance_cuda_tp
#                   the conformance suites' CUDA cells (step_conformance_test,
#                   tp_step_conformance_test, --gtest_filter='*Cuda*'): no skip, no failure
#   verify_*        ula verify --planner device, without and with faults (0 mismatches)
#   bench_*         ula bench planner --planner host; ula bench gather --backend
#                   cuda / cpu; ula_bench BM_DeviceStepRound
#   *_cuda*         the device step's CUDA form: ula verify --planner device --cuda (DP, TP at
#                   home), ula bench planner --planner device --cuda (DP, TP at home: ns per
#                   selection by CUDA events beside the host step's, launches and syncs per
#                   step), ula bench gather --backend cuda --pattern random (the random-read
#                   reference in GB/s beside the device-to-device copy)
# A step that would start with too little of the budget left is not run (a timeout).
#
# Verdicts (summary.json "status", and the last line "gpu-check: VERDICT: ...") and exit codes:
#   pass 0          every step passed on a GPU        smoke-pass 0   --smoke: every binary loads
#   fail 1          a step failed                     cuda-skipped 6 a CUDA test skipped on a GPU
#   timeout 7       a step ran past its limit (or the budget was spent before it)
#   bad-input 2     the prebuilt folder or configs/ is missing, a bad argument or setting
#   no-gpu 3        no GPU seen (no nvidia-smi, no device, no driver): nothing ran on a device
#   old-driver 4    a driver is installed but older than the CUDA runtime the folder was built with
#   no-load 5       a prebuilt binary does not load here (a library, or an older glibc than
#                   MANIFEST.txt's "glibc needed")
# Where several steps fail, the verdict is the first failed step's.
#
# Settings (environment):
#   GPU_DIST             the prebuilt folder (default gpu-dist/ in the working tree)
#   OUT                  where logs and summary.json go (default gpu-check-out/)
#   GPU_CHECK_BUDGET_S   the whole check's budget in s (default 470; more than the limits' sum)
#   GPU_CHECK_MAX_STEP_S caps every step's limit (default none; the self-test shrinks it to
#                        provoke a timeout)
# ULA_CONFIG_DIR is exported as the working tree's configs/, so the binaries find the configs
# wherever the folder lies.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
ROOT=$(pwd -P)
DIST=${GPU_DIST:-gpu-dist}
OUTDIR=${OUT:-gpu-check-out}
BUDGET=${GPU_CHECK_BUDGET_S:-470}
MAX_STEP=${GPU_CHECK_MAX_STEP_S:-}
TESTS=(cuda_backend_test device_step_test tp_device_step_test policy_test)
# Run by steps of their own (a filter), shipped and loaded as the others.
CELLS=(step_conformance_test tp_step_conformance_test)
BINARIES=(ula ula_bench "${TESTS[@]}" "${CELLS[@]}")

# The steps in order, with their limits in seconds.
STEPS=(load:20 gpu:10 probe:20
  cuda_backend_test:45 device_step_test:45 tp_device_step_test:30 policy_test:30
  graph_replay:2 graph_replay_place:2 conformance_cuda:15 conformance_cuda_tp:12
  verify_device:10 verify_device_no_mismatch:3 verify_device_faults:10 verify_device_faults_nothing_lost:3
  bench_planner_host:40 bench_planner_device:30 bench_gather_cuda:20 bench_gather_cpu:10 bench_device_step_round:25
  verify_device_cuda:15 verify_device_cuda_tp:15 bench_planner_device_cuda:25 bench_planner_device_cuda_tp:20
  bench_gather_random:10)
declare -A LIMIT=()
limits_sum=0
for s in "${STEPS[@]}"; do
  LIMIT[${s%%:*}]=${s##*:}
  limits_sum=$(( limits_sum + ${s##*:} ))
done

usage_error() {
  echo "gpu-check: $1" >&2
  echo "usage: scripts/gpu-check.sh [--smoke | --plan] (settings: GPU_DIST, OUT, GPU_CHECK_BUDGET_S, GPU_CHECK_MAX_STEP_S)" >&2
  exit 2
}
MODE=check
case $# in
  0) ;;
  1) case $1 in
       --smoke) MODE=smoke ;;
       --plan) MODE=plan ;;
       *) usage_error "unknown argument '$1'" ;;
     esac ;;
  *) usage_error "at most one argument, got $#" ;;
esac
[[ $BUDGET =~ ^[0-9]+$ ]] || usage_error "GPU_CHECK_BUDGET_S='$BUDGET': not a whole number of seconds"
[[ -z $MAX_STEP || $MAX_STEP =~ ^[1-9][0-9]*$ ]] || usage_error "GPU_CHECK_MAX_STEP_S='$MAX_STEP': not a positive whole number"
if (( limits_sum >= BUDGET )); then
  usage_error "the step limits sum to ${limits_sum} s, not less than the ${BUDGET} s budget (GPU_CHECK_BUDGET_S)"
fi
if [[ $MODE == plan ]]; then
  for s in "${STEPS[@]}"; do printf '%-36s %4d s\n' "${s%%:*}" "${s##*:}"; done
  printf 'limits_sum %d s\nbudget %d s\n' "$limits_sum" "$BUDGET"
  exit 0
fi

printf -v start '%(%s)T' -1
mkdir -p "$OUTDIR" || usage_error "cannot make the output folder '$OUTDIR'"
steps_json=""
figures_json=""  # "step": the JSON its measurement wrote (null when it wrote none), for summary.json
verdict=""   # the first failed step's verdict
gpu_seen=false
gpu_name=""

# The helpers below run no subprocess (no `$(...)`, no pipeline): the check runs some twenty
# steps, and its self-test runs it a dozen times over stubs, where forks are most of its cost.
json_str_to() {  # json_str_to VAR TEXT: VAR = TEXT as a JSON string (control characters dropped)
  local s=${2//\\/\\\\}
  s=${s//\"/\\\"}
  s=${s//$'\n'/\\n}
  s=${s//$'\t'/ }
  s=${s//[$'\001'-$'\037']/}
  printf -v "$1" '"%s"' "$s"
}

json_str() {  # a JSON string of $1, on standard output
  local out
  json_str_to out "$1"
  printf '%s' "$out"
}

record() {  # record NAME COMMAND RC SECONDS SKIPPED NOTE
  local name command log skipped note
  json_str_to name "$1"
  json_str_to command "$2"
  json_str_to log "$1.log"
  json_str_to skipped "$5"
  json_str_to note "$6"
  [[ -n $steps_json ]] && steps_json+=","
  steps_json+=$'\n    '"{\"name\": $name, \"command\": $command, \"rc\": $3, \"seconds\": $4, "
  steps_json+="\"limit_s\": ${LIMIT[$1]}, \"log\": $log, \"skipped\": $skipped, \"note\": $note}"
}

now_s() {  # now_s VAR: VAR = the epoch second (bash's own clock, no `date` process)
  printf -v "$1" '%(%s)T' -1
}

# skips_of LOG: sets `skipped` (the tests the gtest log reports SKIPPED, sorted, unique,
# space-separated) and `cuda_skips` (those whose name holds "cuda", any case).
skips_of() {
  local line re='^\[  SKIPPED \] ([A-Za-z0-9_/]*\.[A-Za-z0-9_./]*)'
  local -A seen=()
  skipped=""
  cuda_skips=""
  while IFS= read -r line || [[ -n $line ]]; do
    [[ $line =~ $re ]] && seen[${BASH_REMATCH[1]}]=1
  done <"$1"
  local names=("${!seen[@]}") sorted=() n
  if (( ${#names[@]} )); then
    readarray -t sorted < <(printf '%s\n' "${names[@]}" | LC_ALL=C sort)
  fi
  for n in "${sorted[@]}"; do
    skipped+="${skipped:+ }$n"
    [[ ${n,,} == *cuda* ]] && cuda_skips+="${cuda_skips:+ }$n"
  done
}

# run_step NAME CMD... : runs CMD under NAME's limit (capped by GPU_CHECK_MAX_STEP_S and by
# what is left of the budget) with its log in $OUTDIR/NAME.log, and records it. Sets step_rc
# and, on the first failure, the verdict (timeout, cuda-skipped or fail).
run_step() {
  local name=$1
  shift
  local limit=${LIMIT[$name]:?"gpu-check: step $name has no limit"}
  local now left note="" skipped="" cuda_skips="" kind=""
  [[ -n $MAX_STEP ]] && (( limit > MAX_STEP )) && limit=$MAX_STEP
  now_s now
  left=$(( BUDGET - (now - start) - 5 ))  # 5 s for --kill-after
  (( limit > left )) && limit=$left
  echo
  echo "== $name (limit ${limit} s): $*"
  if (( limit < 1 )); then
    step_rc=124
    kind=timeout
    note="not run: the ${BUDGET} s budget is spent"
    : >"$OUTDIR/$name.log"
    echo "$note"
  else
    timeout --kill-after=5 "$limit" "$@" >"$OUTDIR/$name.log" 2>&1
    step_rc=$?
    cat "$OUTDIR/$name.log"
    if (( step_rc == 124 || step_rc == 137 )); then
      kind=timeout
      note="timed out after ${limit} s"
    fi
    skips_of "$OUTDIR/$name.log"
    if [[ -n $cuda_skips && $step_rc == 0 ]]; then
      step_rc=1
      kind=cuda-skipped
      note="CUDA tests skipped: $cuda_skips"
    fi
  fi
  local secs end
  now_s end
  secs=$(( end - now ))
  if (( step_rc != 0 )) && [[ -z $verdict ]]; then
    verdict=${kind:-fail}
    first_failed="$name${note:+ ($note)}"
  fi
  echo "-- $name: rc $step_rc, ${secs} s${note:+, $note}"
  record "$name" "$*" "$step_rc" "$secs" "$skipped" "$note"
}

# measure NAME JSON_FILE CMD...: run_step NAME CMD with CMD's standard output (one JSON
# document: `--json`) written to JSON_FILE instead of the log, then figure NAME JSON_FILE.
measure() {
  local name=$1 file=$2
  shift 2
  rm -f "$file"
  # shellcheck disable=SC2016
  run_step "$name" bash -c 'f=$1; shift; "$@" >"$f"' measure "$file" "$@"
  figure "$name" "$file"
}

# figure NAME JSON_FILE: summary.json's figures gain "NAME": the file's JSON document, or null
# when the step wrote none (a failed or timed-out step, or output that is not one object).
figure() {
  local doc=null text="" bare name
  if [[ -s $2 ]]; then
    IFS= read -r -d '' text <"$2"
    bare=${text//[$' \t\r\n']/}
    if [[ ${bare:0:1} == "{" && ${bare: -1} == "}" ]]; then
      doc=$text
      while [[ $doc == *$'\n' ]]; do doc=${doc%$'\n'}; done
    fi
  fi
  json_str_to name "$1"
  [[ -n $figures_json ]] && figures_json+=","
  figures_json+=$'\n    '"$name: $doc"
}

finish() {  # finish VERDICT EXIT_CODE MESSAGE: writes summary.json, prints the verdict, exits
  local commit=""
  [[ -f $DIST/MANIFEST.txt ]] && commit=$(sed -n 's/^commit: //p' "$DIST/MANIFEST.txt")
  cat >"$OUTDIR/summary.json" <<EOF
{
  "status": $(json_str "$1"),
  "exit_code": $2,
  "message": $(json_str "$3"),
  "mode": $(json_str "$MODE"),
  "gpu_seen": $gpu_seen,
  "gpu": $(json_str "$gpu_name"),
  "prebuilt_commit": $(json_str "$commit"),
  "elapsed_s": $(( $(date +%s) - start )),
  "budget_s": $BUDGET,
  "limits_sum_s": $limits_sum,
  "steps": [$steps_json
  ],
  "figures": {$figures_json
  }
}
EOF
  echo
  echo "gpu-check: $1: $3 ($(( $(date +%s) - start )) s; logs and summary.json in $OUTDIR)"
  exit "$2"
}

for b in "${BINARIES[@]}"; do
  [[ -x $DIST/bin/$b ]] ||
    finish bad-input 2 "$DIST/bin/$b is missing: run scripts/gpu-build.sh on a machine with the CUDA toolkit"
done
[[ -d $ROOT/configs ]] || finish bad-input 2 "$ROOT/configs is missing: run from a working tree of the project"
export ULA_CONFIG_DIR=$ROOT/configs
BIN=$(cd "$DIST/bin" && pwd -P)
echo "gpu-check: prebuilt $(sed -n 's/^commit: //p' "$DIST/MANIFEST.txt" 2>/dev/null), output in $OUTDIR"

# 0. Every binary loads here and answers a cheap question.
# shellcheck disable=SC2016
run_step load bash -c 'set -e
  for t in "${@:2}"; do echo "-- $t"; "$1/$t" --gtest_list_tests; done
  echo "-- ula"; "$1/ula" --help
  echo "-- ula_bench"; "$1/ula_bench" --benchmark_list_tests' load "$BIN" "${TESTS[@]}" "${CELLS[@]}"
load_rc=$step_rc
loader=$(grep -m1 -E 'error while loading shared libraries|version .GLIBC.* not found|cannot execute' "$OUTDIR/load.log")
if [[ $step_rc != 0 && -n $loader ]]; then
  finish no-load 5 "the prebuilt binaries do not load here: $loader"
fi

# 1. A GPU: nvidia-smi sees one and the build's CUDA runtime finds it.
if command -v nvidia-smi >/dev/null 2>&1; then
  run_step gpu nvidia-smi -L
  [[ $step_rc == 0 ]] && gpu_name=$(head -1 "$OUTDIR/gpu.log")
else
  echo "== gpu: nvidia-smi is not on PATH" | tee "$OUTDIR/gpu.log"
  step_rc=127
  record gpu "nvidia-smi -L" 127 0 "" "nvidia-smi not found"
fi
gpu_rc=$step_rc
run_step probe "$BIN/cuda_backend_test" --gtest_filter=CudaBackend.FindsTheGpu
probe_rc=$step_rc
if [[ $MODE == smoke ]]; then
  [[ $gpu_rc == 0 && $probe_rc == 0 ]] && gpu_seen=true
  if [[ $load_rc == 0 ]]; then
    finish smoke-pass 0 "every prebuilt binary loads and answers here (GPU seen: $gpu_seen; nothing ran on a device)"
  fi
  finish fail 1 "the load step failed without a loader error: see load.log"
fi
if [[ $gpu_rc == 0 && $probe_rc == 0 ]]; then
  gpu_seen=true
else
  if loader=$(grep -m1 -E 'error while loading shared libraries|version .GLIBC.* not found' "$OUTDIR/probe.log"); then
    finish no-load 5 "the prebuilt binaries do not load here: $loader"
  fi
  driver=$(sed -n 's/^cuda versions: driver \([0-9]*\), runtime \([0-9]*\).*/\1 \2/p' "$OUTDIR/probe.log" | head -1)
  if grep -q cudaErrorInsufficientDriver "$OUTDIR/probe.log" && [[ -n $driver && ${driver%% *} -gt 0 ]]; then
    finish old-driver 4 "the CUDA driver (${driver%% *}) is older than the folder's CUDA runtime (${driver##* }): update the driver; nothing ran on a device"
  fi
  why=$(grep -m1 -o 'no CUDA device: .*' "$OUTDIR/probe.log" 2>/dev/null)
  finish no-gpu 3 "no GPU: nvidia-smi rc $gpu_rc, probe rc $probe_rc${why:+ ($why)}; nothing ran on a device"
fi

# 2. Correctness: the tests of the CUDA forms, the cuda backend and the OpenMP kernels, and
# the verifier over the device step.
export OMP_WAIT_POLICY=passive
for t in "${TESTS[@]}"; do
  run_step "$t" "$BIN/$t"
done
# The decode iteration captured in one CUDA graph and replayed against the OpenMP form
# (device_step_test's DeviceStepCudaGraph): its line says the graph ran, with the step's
# launches per iteration and the replay's time by CUDA events.
run_step graph_replay grep -m1 '^graph: ' "$OUTDIR/device_step_test.log"
run_step graph_replay_place grep -m1 '^graph place: ' "$OUTDIR/device_step_test.log"
# The step's conformance suite in its CUDA cells: the device step's CUDA form makes the host
# step's decisions in every scenario (DP; TP at home).
run_step conformance_cuda "$BIN/step_conformance_test" --gtest_filter='*Cuda*'
run_step conformance_cuda_tp "$BIN/tp_step_conformance_test" --gtest_filter='*Cuda*'
run_step verify_device "$BIN/ula" verify --planner device --stable-new-entries --policy kernel_pb_lru --ops 2000 --attention-steps 0 --json
run_step verify_device_no_mismatch grep -q '"invariant_failures":0,.*"mismatches":0' "$OUTDIR/verify_device.log"
run_step verify_device_faults "$BIN/ula" verify --planner device --stable-new-entries --policy kernel_pb_lru --fault-rate 0.2 --ops 3000 --attention-steps 0 --json
run_step verify_device_faults_nothing_lost grep -q '"early_publishes":0,.*"entries_lost":0' "$OUTDIR/verify_device_faults.log"

# 3. Measurements (docs/BENCHMARKS.md, "GPU check"): each writes one JSON document, which
# summary.json carries under "figures" (null where the step wrote none).
measure bench_planner_host "$OUTDIR/bench_planner_host.json" "$BIN/ula" bench planner --planner host \
  --configs h200_dp_mtpoff --batch-fractions 1 --threads 1 2 8 16 --steps 2 --warmup 2 --json
# The device step's OpenMP form beside the host planner on a quarter batch, with its launches
# and syncs per (rank, group) step (the CUDA form's: bench_planner_device_cuda below).
measure bench_planner_device "$OUTDIR/bench_planner_device.json" "$BIN/ula" bench planner --planner device \
  --configs h200_dp_mtpoff --batch-fractions 0.25 --threads 16 --steps 2 --warmup 1 --json
measure bench_gather_cuda "$OUTDIR/bench_gather_cuda.json" "$BIN/ula" bench gather --backend cuda --repeats 15 --json
measure bench_gather_cpu "$OUTDIR/bench_gather_cpu.json" "$BIN/ula" bench gather --backend cpu --repeats 5 --json
rm -f "$OUTDIR/bench_device_step_round.json"
run_step bench_device_step_round "$BIN/ula_bench" --benchmark_filter=BM_DeviceStepRound --benchmark_min_time=0.05 \
  --benchmark_out="$OUTDIR/bench_device_step_round.json" --benchmark_out_format=json
figure bench_device_step_round "$OUTDIR/bench_device_step_round.json"
# The device step's CUDA form (docs/BENCHMARKS.md, "GPU check"): the verifiers on it (a
# mismatch exits 1: the step fails), then its timing by CUDA events beside the host step, and
# the random-read reference it is compared with.
measure verify_device_cuda "$OUTDIR/verify_device_cuda.json" "$BIN/ula" verify --planner device --cuda \
  --stable-new-entries --policy kernel_pb_lru --ops 1000 --attention-steps 0 --json
measure verify_device_cuda_tp "$OUTDIR/verify_device_cuda_tp.json" "$BIN/ula" verify --mode tp --planner device --cuda \
  --stable-new-entries --policy kernel_pb_lru --tp-attention at_home --ranks 4 --ops 300 --json
measure bench_planner_device_cuda "$OUTDIR/bench_planner_device_cuda.json" "$BIN/ula" bench planner --planner device \
  --cuda --configs h200_dp_mtpoff --batch-fractions 0.25 --threads 16 --steps 2 --warmup 1 --json
measure bench_planner_device_cuda_tp "$OUTDIR/bench_planner_device_cuda_tp.json" "$BIN/ula" bench planner \
  --planner device --cuda --mode tp --ranks 2 --configs h200_tp_mtpoff --batch-fractions 0.01 --device-fraction 0.01 \
  --groups 4 --threads 16 --steps 2 --warmup 1 --json
measure bench_gather_random "$OUTDIR/bench_gather_random.json" "$BIN/ula" bench gather --backend cuda --pattern random \
  --repeats 15 --json

case $verdict in
  "") finish pass 0 "every step passed on $gpu_name" ;;
  timeout) finish timeout 7 "a step ran past its limit: $first_failed" ;;
  cuda-skipped) finish cuda-skipped 6 "a CUDA test skipped on a GPU: $first_failed" ;;
  *) finish fail 1 "a step failed: $first_failed" ;;
esac
