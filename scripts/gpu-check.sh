#!/usr/bin/env bash
# gpu-check.sh: the GPU check, on a bare GPU machine (the CUDA driver and toolkit, CMake,
# coreutils; none of this project's packages), from the prebuilt folder of scripts/gpu-build.sh.
# It builds nothing and runs no cmake: only the binaries of $GPU_DIST (default gpu-dist/).
# docs/BENCHMARKS.md, "GPU check", says what it prints. It has NOT run on a GPU yet.
#
# Steps (each under its own timeout, all under GPU_CHECK_BUDGET_S, default 450 s < 8 min):
#   gpu            nvidia-smi -L: a GPU is seen
#   probe          cuda_backend_test CudaBackend.FindsTheGpu: the CUDA runtime of the build
#                  finds it (device, sm, driver and runtime versions)
#   *_test         cuda_backend_test, device_step_test, tp_device_step_test,
#                  policy_test: every test passes and no CUDA test
#                  (a name with "Cuda") skips; other skips are listed
#   verify_*       ula verify --planner device, without and with faults (0 mismatches)
#   bench_*        ula bench planner --planner host; ula bench gather --backend
#                  cuda / cpu; ula_bench BM_DeviceStepRound
# Fails (exit 1) when a step fails or times out or a CUDA test skips; exit 3 when no GPU is
# seen (nothing after the probe runs); exit 2 when the prebuilt folder is missing.
# Output: $OUT when set (the folder whose files come back from the device machine), else
# gpu-check-out/: one log per step (<step>.log), summary.json, and everything on stdout.
# --smoke (a machine without a GPU): after "no GPU", runs each binary once cheaply (test
# lists, `ula --help`) to show the folder loads here; still exits 3.
set -uo pipefail
cd "$(dirname "$0")/.."
DIST=${GPU_DIST:-gpu-dist}
OUTDIR=${OUT:-gpu-check-out}
BUDGET=${GPU_CHECK_BUDGET_S:-450}
SMOKE=0
[[ ${1:-} == --smoke ]] && SMOKE=1
start=$(date +%s)
mkdir -p "$OUTDIR"
steps_json=""
failed=0
gpu_seen=false
gpu_name=""

json_str() {  # a JSON string of $1
  local s=${1//\\/\\\\}
  s=${s//\"/\\\"}
  s=${s//$'\n'/\\n}
  s=${s//$'\t'/ }
  printf '"%s"' "$(printf '%s' "$s" | tr -d '\000-\037')"
}

# run_step NAME TIMEOUT_S CMD... : runs CMD with its log in $OUTDIR/NAME.log, records it.
# Sets step_rc. A step that would start past the budget is not run (rc 124, "budget").
run_step() {
  local name=$1 limit=$2
  shift 2
  local now left note="" skipped="" cuda_skips=""
  now=$(date +%s)
  left=$(( BUDGET - (now - start) ))
  (( limit > left - 5 )) && limit=$(( left - 5 ))
  echo
  echo "== $name (timeout ${limit} s): $*"
  if (( limit < 5 )); then
    step_rc=124
    note="not run: the ${BUDGET} s budget is spent"
    echo "$note"
  else
    timeout --kill-after=5 "$limit" "$@" >"$OUTDIR/$name.log" 2>&1
    step_rc=$?
    cat "$OUTDIR/$name.log"
    (( step_rc == 124 || step_rc == 137 )) && note="timed out after ${limit} s"
    skipped=$(sed -n 's/^\[  SKIPPED \] \([A-Za-z0-9_/]*\.[A-Za-z0-9_./]*\).*/\1/p' "$OUTDIR/$name.log" | sort -u | tr '\n' ' ')
    skipped=${skipped% }
    cuda_skips=$(printf '%s\n' $skipped | grep -i cuda | tr '\n' ' ')
    cuda_skips=${cuda_skips% }
    if [[ -n $cuda_skips && $step_rc == 0 ]]; then
      step_rc=1
      note="CUDA tests skipped: $cuda_skips"
    fi
  fi
  local secs=$(( $(date +%s) - now ))
  (( step_rc != 0 )) && failed=1
  echo "-- $name: rc $step_rc, ${secs} s${note:+, $note}"
  [[ -n $steps_json ]] && steps_json+=","
  steps_json+=$'\n    '"{\"name\": $(json_str "$name"), \"command\": $(json_str "$*"), \"rc\": $step_rc, \"seconds\": $secs, \"log\": $(json_str "$name.log"), \"skipped\": $(json_str "$skipped"), \"note\": $(json_str "$note")}"
}

summary() {  # summary STATUS MESSAGE
  local commit=""
  [[ -f $DIST/MANIFEST.txt ]] && commit=$(sed -n 's/^commit: //p' "$DIST/MANIFEST.txt")
  cat >"$OUTDIR/summary.json" <<EOF
{
  "status": $(json_str "$1"),
  "message": $(json_str "$2"),
  "gpu_seen": $gpu_seen,
  "gpu": $(json_str "$gpu_name"),
  "prebuilt_commit": $(json_str "$commit"),
  "elapsed_s": $(( $(date +%s) - start )),
  "budget_s": $BUDGET,
  "steps": [$steps_json
  ]
}
EOF
  echo
  echo "gpu-check: $1: $2 ($(( $(date +%s) - start )) s; logs and summary.json in $OUTDIR)"
}

BIN=$DIST/bin
for b in ula ula_bench cuda_backend_test device_step_test tp_device_step_test policy_test; do
  if [[ ! -x $BIN/$b ]]; then
    summary "no-prebuilt" "$BIN/$b is missing: run scripts/gpu-build.sh on a machine with the CUDA toolkit"
    exit 2
  fi
done
echo "gpu-check: prebuilt $(sed -n 's/^commit: //p' "$DIST/MANIFEST.txt" 2>/dev/null), output in $OUTDIR"

# 1. A GPU: nvidia-smi sees one and the build's CUDA runtime finds it.
if command -v nvidia-smi >/dev/null 2>&1; then
  run_step gpu 30 nvidia-smi -L
  [[ $step_rc == 0 ]] && gpu_name=$(head -1 "$OUTDIR/gpu.log")
else
  echo "== gpu: nvidia-smi is not on PATH" | tee "$OUTDIR/gpu.log"
  step_rc=127
  steps_json+=$'\n    '"{\"name\": \"gpu\", \"command\": \"nvidia-smi -L\", \"rc\": 127, \"seconds\": 0, \"log\": \"gpu.log\", \"skipped\": \"\", \"note\": \"nvidia-smi not found\"}"
fi
gpu_rc=$step_rc
run_step probe 60 "$BIN/cuda_backend_test" --gtest_filter=CudaBackend.FindsTheGpu
probe_rc=$step_rc
if [[ $gpu_rc == 0 && $probe_rc == 0 ]]; then
  gpu_seen=true
else
  # A binary that does not load (an older glibc than MANIFEST.txt's "glibc needed") is not
  # "no GPU": say so.
  if loader=$(grep -m1 -E 'error while loading shared libraries|version .GLIBC.* not found' "$OUTDIR/probe.log"); then
    summary "fail" "the prebuilt binaries do not load here: $loader"
    exit 1
  fi
  why=$(grep -m1 -o 'no CUDA device: .*' "$OUTDIR/probe.log" 2>/dev/null)
  if (( SMOKE )); then
    for b in cuda_backend_test device_step_test tp_device_step_test policy_test; do
      run_step "smoke_$b" 30 "$BIN/$b" --gtest_list_tests
    done
    run_step smoke_ula 30 "$BIN/ula" --help
    run_step smoke_ula_bench 30 "$BIN/ula_bench" --benchmark_list_tests
  fi
  summary "no-gpu" "no GPU: nvidia-smi rc $gpu_rc, probe rc $probe_rc${why:+ ($why)}; nothing ran on a device"
  exit 3
fi

# 2. The tests of the CUDA forms, the cuda backend and the OpenMP kernels.
export OMP_WAIT_POLICY=passive
run_step cuda_backend_test 120 "$BIN/cuda_backend_test"
run_step device_step_test 120 "$BIN/device_step_test"
run_step tp_device_step_test 120 "$BIN/tp_device_step_test"
run_step policy_test 90 "$BIN/policy_test"
run_step verify_device 60 "$BIN/ula" verify --planner device --stable-new-entries --policy kernel_pb_lru --ops 2000 --attention-steps 0 --json
run_step verify_device_no_mismatch 5 grep -q '"invariant_failures":0,.*"mismatches":0' "$OUTDIR/verify_device.log"
run_step verify_device_faults 60 "$BIN/ula" verify --planner device --stable-new-entries --policy kernel_pb_lru --fault-rate 0.2 --ops 3000 --attention-steps 0 --json
run_step verify_device_faults_nothing_lost 5 grep -q '"early_publishes":0,.*"entries_lost":0' "$OUTDIR/verify_device_faults.log"

# 3. Measurements (docs/BENCHMARKS.md, "GPU check").
for planner in host; do
  run_step "bench_planner_$planner" 90 "$BIN/ula" bench planner --planner "$planner" --configs h200_dp_mtpoff \
    --batch-fractions 1 --threads 1 2 8 16 --steps 2 --warmup 2
done
run_step bench_gather_cuda 60 "$BIN/ula" bench gather --backend cuda --repeats 15
run_step bench_gather_cpu 60 "$BIN/ula" bench gather --backend cpu --repeats 5
run_step bench_device_step_round 90 "$BIN/ula_bench" --benchmark_filter=BM_DeviceStepRound --benchmark_min_time=0.05

if (( failed )); then
  summary "fail" "a step failed, timed out or skipped a CUDA test (see steps)"
  exit 1
fi
summary "pass" "every step passed on $gpu_name"
exit 0
