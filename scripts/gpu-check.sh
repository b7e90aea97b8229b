#!/usr/bin/env bash
# gpu-check.sh: the GPU session's check , in one run of under 8 minutes on one
# GPU (the device machine: one H200, 16 cores). It has NOT run on a GPU yet (docs/BENCHMARKS.md,
# "The step's kernels").
#
# What it runs, in order (each step prints its command; the first failure stops the script):
#   1. nvidia-smi -L                                  the GPU it found
#   2. cmake -DULA_WITH_CUDA=ON, Release, sm_90 (CMAKE_CUDA_ARCHITECTURES=90: the H200 only,
#      to save compile time), and a build of ula_kernels_cuda, ula_backend_cuda,
#      kernel_step_planner_test, device_step_test, tp_device_step_test, policy_test and the
#      ula program
#   3. ctest: kernel_step_planner_test (the OpenMP kernels against the CPU planner),
#      device_step_test (the device step's OpenMP form against EngineStepPlanner, and
#      DeviceStep.CudaFormMatchesOpenMpForm: the CUDA form against the OpenMP form on the GPU),
#      tp_device_step_test (TP at home, per rank, against TpEngineStepPlanner, and
#      TpDeviceStep.CudaFormMatchesOpenMpForm on the GPU),
#      policy_test (kernel_pb_lru in the conformance suite), cli_verify_kernels,
#      cli_verify_kernels_faults, layering
#   4. ula bench planner --planner kernels at 1, 2, 8 and 16 OpenMP threads (h200_dp_mtpoff,
#      the admission limit), and the CPU planner beside it (--planner cpu) in the same run
#   5. ula bench gather --backend cuda (the cuda backend's gather kernel against a
#      device-to-device copy of the same bytes), and --backend cpu beside it
# Output: everything to stdout; GPU_CHECK_OUT (default gpu-check-out/) keeps the logs.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${GPU_CHECK_OUT:-gpu-check-out}
BUILD=${GPU_CHECK_BUILD:-build-gpu}
JOBS=${GPU_CHECK_JOBS:-$(nproc)}
mkdir -p "$OUT"
step() { echo; echo "== $*"; }
run() { echo "+ $*"; "$@"; }
start=$(date +%s)

step "1. the GPU"
if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L; then
  echo "gpu-check: no GPU found (nvidia-smi -L failed): the CUDA targets are compiled, nothing runs on a device"
fi

step "2. configure and build (ULA_WITH_CUDA=ON, sm_90)"
run cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DULA_WITH_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DULA_BUILD_BENCH=OFF -DULA_BUILD_PYTHON=OFF >"$OUT/configure.log"
run cmake --build "$BUILD" -j"$JOBS" --target ula_kernels_cuda ula_backend_cuda kernel_step_planner_test \
  device_step_test tp_device_step_test policy_test ula_cli >"$OUT/build.log"
echo "built in $(( $(date +%s) - start )) s"

step "3. tests"
run ctest --test-dir "$BUILD" -R '^(kernel_step_planner_test|device_step_test|tp_device_step_test|policy_test|cli_verify_kernels|cli_verify_kernels_faults|layering)$' \
  --output-on-failure | tee "$OUT/ctest.log"

step "4. bench planner, kernels (OpenMP) and cpu, same run"
for planner in kernels cpu; do
  run "$BUILD/tools/ula/ula" bench planner --planner "$planner" --configs h200_dp_mtpoff --batch-fractions 1 \
    --threads 1 2 8 16 --steps 2 --warmup 2 | tee "$OUT/bench_planner_$planner.txt"
done

step "5. the CUDA form's own test (verbose: skipped or run) and bench gather, cuda and cpu"
run "$BUILD/tests/sparse/device_step_test" --gtest_filter='DeviceStep.CudaFormMatchesOpenMpForm' | tee "$OUT/device_step_cuda.txt"
run "$BUILD/tests/tp/tp_device_step_test" --gtest_filter='TpDeviceStep.CudaFormMatchesOpenMpForm' | tee "$OUT/tp_device_step_cuda.txt"
run "$BUILD/tools/ula/ula" bench gather --backend cuda --repeats 15 | tee "$OUT/bench_gather_cuda.txt"
run "$BUILD/tools/ula/ula" bench gather --backend cpu --repeats 5 | tee "$OUT/bench_gather_cpu.txt"

echo
echo "gpu-check: done in $(( $(date +%s) - start )) s"
