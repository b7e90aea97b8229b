#!/usr/bin/env python3
"""Self-test of scripts/gpu-check.sh, without a GPU: the check runs over a fake prebuilt folder
(GPU_DIST) of stub executables that print canned output, with a stub nvidia-smi first on PATH,
one scenario at a time (FAKE_SCENARIO, read by the stubs). Each scenario must give its verdict:
the exit code, summary.json's "status" and the last line "gpu-check: VERDICT: ...".

Scenarios: pass (a GPU, every step passes, every measurement's JSON carried whole in summary.json's
"figures", the CUDA form's steps among them), cuda-skipped (a CUDA test skips on a GPU), no-gpu
(no nvidia-smi answer, no driver), old-driver (a driver older than the runtime), no-load (a
binary whose library is missing), timeout (a step that sleeps past GPU_CHECK_MAX_STEP_S), fail
(a test fails, and so does every step of the CUDA form: their figures are null), smoke (--smoke without a GPU), and bad input (no folder, a bad argument, a budget
below the step limits). It also checks, from --plan and independently of the script's own
refusal, that the step limits sum to less than the budget and that the budget is under 8 minutes.

Usage: gpu_check_selftest.py [REPO_ROOT]   (default: this file's repository)
"""
import json
import os
import pathlib
import stat
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parents[2])
SCRIPT = ROOT / "scripts" / "gpu-check.sh"
TESTS = ["cuda_backend_test", "device_step_test", "tp_device_step_test", "policy_test"]
# The conformance suites, whose CUDA cells run as steps of their own.
CELLS = ["step_conformance_test", "tp_step_conformance_test"]
# The measurement steps of the device step's CUDA form, each a figure of summary.json.
CUDA_FIGURES = ["verify_device_cuda", "verify_device_cuda_tp", "bench_planner_device_cuda",
                "bench_planner_device_cuda_tp", "bench_gather_random"]

# One stub for every binary: it answers by its own name, its arguments and FAKE_SCENARIO.
STUB = r"""#!/bin/bash
me=$(basename "$0")
sc=${FAKE_SCENARIO:?}
if [[ $sc == no-load && $me == ula_bench ]]; then
  echo "$0: error while loading shared libraries: libbenchmark.so.1: cannot open shared object file: No such file or directory" >&2
  exit 127
fi
case "$*" in
  --gtest_list_tests) echo "Fake."; echo "  Test"; exit 0 ;;
  --help) echo "ula: the fake's help"; exit 0 ;;
  --benchmark_list_tests) echo "BM_DeviceStepRound"; exit 0 ;;
esac
if [[ $me == cuda_backend_test && $* == --gtest_filter=CudaBackend.FindsTheGpu ]]; then
  case $sc in
    no-gpu|smoke)
      echo "cuda versions: driver 0, runtime 13000"
      echo "[ RUN      ] CudaBackend.FindsTheGpu"
      echo "tests/core/cuda_backend_test.cc:49: Skipped"
      echo "no CUDA device: FAILED_PRECONDITION: cuda backend: no CUDA device is present (cudaErrorInsufficientDriver, CUDA driver version is insufficient for CUDA runtime version)"
      echo "[  SKIPPED ] CudaBackend.FindsTheGpu (0 ms)"
      exit 0 ;;
    old-driver)
      echo "cuda versions: driver 12020, runtime 13000"
      echo "[ RUN      ] CudaBackend.FindsTheGpu"
      echo "no CUDA device: FAILED_PRECONDITION: cuda backend: no CUDA device is present (cudaErrorInsufficientDriver, CUDA driver version is insufficient for CUDA runtime version)"
      echo "[  SKIPPED ] CudaBackend.FindsTheGpu (0 ms)"
      exit 0 ;;
    *)
      echo "cuda versions: driver 13000, runtime 13000"
      echo "gpu 0: NVIDIA H200, sm_90, 139.8 GiB; driver 13000, runtime 13000"
      echo "[       OK ] CudaBackend.FindsTheGpu (1 ms)"
      exit 0 ;;
  esac
fi
case $me in
  device_step_test)
    if [[ $sc == cuda-skipped ]]; then
      echo "[  SKIPPED ] DeviceStep.CudaFormIsMadeExactlyWhereADeviceIs (0 ms)"
      echo "[  PASSED  ] 40 tests."
      exit 0
    fi
    echo "[  SKIPPED ] DeviceStepArena.SomethingElse (0 ms)"  # a skip that is not a CUDA test's
    # DeviceStepCudaGraph's line on a GPU: the graph_replay step looks for it.
    echo "graph: 2 groups, 8 step launches + 2 copy launches per iteration, 24 replays, median 0.210 ms per replay (cuda_events); 1587 misses, 1587 evictions, 0 refused steps, 2260 selections read equal"
    echo "graph place: 2 place launches (Place, CompletePlace) + 1 step launch (AdvanceRound) + 1 copy launch per iteration, 24 replays, median 0.050 ms per replay (cuda_events); 185 seats, 70 evictions, 120 releases, 1234 live entries read equal"
    echo "[  PASSED  ] 41 tests."; exit 0 ;;
  policy_test)
    [[ $sc == timeout ]] && exec sleep 30
    echo "[  PASSED  ] 90 tests."; exit 0 ;;
  tp_device_step_test)
    if [[ $sc == fail ]]; then echo "[  FAILED  ] TpDeviceStep.Something"; exit 1; fi
    echo "[  PASSED  ] 12 tests."; exit 0 ;;
  ula)
    if [[ $sc == fail && ( $* == *--cuda* || $* == *"--pattern random"* ) ]]; then
      echo "ula $1: the CUDA form failed: an illegal memory access" >&2; exit 1
    elif [[ $1 == verify && $* == *--cuda* ]]; then
      echo "{\"cuda\":true,\"invariant_failures\":0,\"mismatches\":0,\"planner\":\"device\",\"fake\":\"$3\"}"
    elif [[ $1 == verify ]]; then
      echo '{"invariant_failures":0,"x":1,"mismatches":0,"early_publishes":0,"y":2,"entries_lost":0}'
    elif [[ $1 == bench && $2 == planner && $* == *--cuda* ]]; then
      [[ $* == *"--mode tp"* ]] && mode=tp launches=31 || mode=dp launches=30
      echo "{\"rows\": [{\"ns_per_distinct\": 41.9}], \"device_rows\": [{\"form\": \"cuda\", \"timing\": \"cuda_events\", \"mode\": \"$mode\", \"ns_per_distinct\": 12.5, \"host_ns_per_distinct\": 41.9, \"launches_per_step\": {\"total\": $launches}, \"syncs_per_step\": {\"total\": 0}}]}"
    elif [[ $1 == bench && $2 == gather && $* == *"--pattern random"* ]]; then
      echo '{"backend": "cuda", "pattern": "random", "copy_gbps": 1500.0, "random_read_gbps": 95.5, "random_read_ns": 0.084}'
    elif [[ $1 == bench && $2 == gather && $* == *cuda* && $sc == fail ]]; then
      echo "ula bench gather: --backend cuda: no kernel image" >&2; exit 1
    elif [[ $1 == bench && $2 == planner && $* == *device* ]]; then
      echo "a warning on standard error" >&2
      echo '{"rows": [{"ns_per_distinct": 41.9}],'
      echo ' "device_rows": [{"form": "openmp", "ns_per_distinct": 143.8, "launches_per_step": {"total": 30}, "syncs_per_step": {"total": 0}}]}'
    elif [[ $1 == bench ]]; then
      echo "{\"fake\": \"$2\", \"gather_gbps\": 1.5}"
    else
      echo "fake $*"
    fi
    exit 0 ;;
  ula_bench)
    for a in "$@"; do
      [[ $a == --benchmark_out=* ]] && printf '{"benchmarks": [{"name": "BM_DeviceStepRound", "real_time": 12.5}]}\n' >"${a#--benchmark_out=}"
    done
    echo "BM_DeviceStepRound 12.5 us"; exit 0 ;;
  *) echo "[  PASSED  ] 7 tests."; exit 0 ;;
esac
"""

NVIDIA_SMI = r"""#!/bin/bash
case ${FAKE_SCENARIO:?} in
  no-gpu|smoke) echo "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver." >&2; exit 9 ;;
  *) echo "GPU 0: NVIDIA H200 (UUID: GPU-fake)"; exit 0 ;;
esac
"""

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print(f"FAIL: {what}")


def write_exe(path, text):
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def run(tmp, scenario, args=(), dist=None, env_extra=None, timeout=120):
    out = tmp / f"out-{scenario}"
    env = dict(os.environ)
    env.update({"FAKE_SCENARIO": scenario, "GPU_DIST": str(dist or tmp / "dist"), "OUT": str(out),
                "PATH": f"{tmp / 'stubs'}:{env['PATH']}"})
    env.pop("GPU_CHECK_BUDGET_S", None)
    env.pop("GPU_CHECK_MAX_STEP_S", None)
    env.update(env_extra or {})
    p = subprocess.run(["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=timeout)
    summary = None
    if (out / "summary.json").exists():
        summary = json.loads((out / "summary.json").read_text())
    return p, summary


def expect(tmp, scenario, code, status, args=(), **kw):
    p, summary = run(tmp, scenario, args, **kw)
    name = f"{scenario}{' ' + ' '.join(args) if args else ''}"
    check(p.returncode == code, f"{name}: exit {p.returncode}, expected {code}\n{p.stdout[-1500:]}{p.stderr[-800:]}")
    last = p.stdout.strip().splitlines()[-1] if p.stdout.strip() else ""
    check(last.startswith(f"gpu-check: {status}: "), f"{name}: last line '{last}', expected verdict {status}")
    check(summary is not None and summary["status"] == status and summary["exit_code"] == code,
          f"{name}: summary.json {summary and (summary['status'], summary['exit_code'])}, expected {(status, code)}")
    print(f"ok: {name} -> {status}, exit {code}")
    return p, summary


def main():
    check(SCRIPT.is_file(), f"{SCRIPT} exists")
    with tempfile.TemporaryDirectory() as t:
        tmp = pathlib.Path(t)
        (tmp / "dist" / "bin").mkdir(parents=True)
        (tmp / "stubs").mkdir()
        for b in ["ula", "ula_bench", *TESTS, *CELLS]:
            write_exe(tmp / "dist" / "bin" / b, STUB)
        (tmp / "dist" / "MANIFEST.txt").write_text("commit: fake\n")
        write_exe(tmp / "stubs" / "nvidia-smi", NVIDIA_SMI)

        # The plan: limits, their sum and the budget, checked here, not taken from the script.
        p = subprocess.run(["bash", str(SCRIPT), "--plan"], capture_output=True, text=True,
                           env={k: v for k, v in os.environ.items() if not k.startswith("GPU_CHECK_")})
        check(p.returncode == 0, f"--plan: exit {p.returncode}: {p.stderr}")
        limits, budget = {}, None
        for line in p.stdout.splitlines():
            f = line.split()
            if f[0] == "budget":
                budget = int(f[1])
            elif f[0] != "limits_sum":
                limits[f[0]] = int(f[1])
        total = sum(limits.values())
        check(budget is not None and total < budget, f"the step limits sum to {total} s, not below the budget {budget} s")
        check(budget is not None and budget + 5 < 8 * 60, f"the budget {budget} s leaves the check over 8 minutes")
        steps = list(limits)
        check(steps.index("policy_test") < steps.index("bench_planner_host"), "correctness steps before measurements")
        check(all(name in steps and steps.index(name) > steps.index("policy_test") for name in CUDA_FIGURES),
              f"the CUDA form's measurements are planned after the correctness steps: {steps}")
        print(f"ok: {len(limits)} steps, limits sum {total} s < budget {budget} s")

        _, s = expect(tmp, "pass", 0, "pass")
        if s:
            check([x["name"] for x in s["steps"]] == steps, f"pass: the steps run are the plan's: {[x['name'] for x in s['steps']]}")
            check(all(x["rc"] == 0 for x in s["steps"]), "pass: every step rc 0")
            check(s["gpu_seen"] is True and "H200" in s["gpu"], "pass: the GPU is named")
            dst = next(x for x in s["steps"] if x["name"] == "device_step_test")
            check(dst["skipped"] == "DeviceStepArena.SomethingElse", "pass: a non-CUDA skip is listed and allowed")
            # Every measurement's JSON is carried whole under "figures" (its standard error stays in the log).
            f = s.get("figures", {})
            check(sorted(f) == sorted(["bench_device_step_round", "bench_gather_cpu", "bench_gather_cuda",
                                       "bench_planner_device", "bench_planner_host", *CUDA_FIGURES]),
                  f"pass: one figure per measurement: {sorted(f)}")
            # The CUDA form's figures: ns per selection by CUDA events beside the host step's, its
            # launches (DP 30, TP 31), the random read beside the copy, the verifiers' counts.
            for name, mode, launches in [("bench_planner_device_cuda", "dp", 30), ("bench_planner_device_cuda_tp", "tp", 31)]:
                row = (f.get(name) or {}).get("device_rows", [{}])[0]
                check(row.get("form") == "cuda" and row.get("timing") == "cuda_events" and row.get("mode") == mode
                      and row.get("ns_per_distinct") == 12.5 and row.get("host_ns_per_distinct") == 41.9
                      and row.get("launches_per_step", {}).get("total") == launches,
                      f"pass: {name}'s CUDA-form row reaches summary.json: {row}")
            rnd = f.get("bench_gather_random") or {}
            check(rnd.get("random_read_gbps") == 95.5 and rnd.get("copy_gbps") == 1500.0,
                  f"pass: the random read and the copy reach summary.json: {rnd}")
            for name in ("verify_device_cuda", "verify_device_cuda_tp"):
                v = f.get(name) or {}
                check(v.get("cuda") is True and v.get("mismatches") == 0, f"pass: {name}'s counts reach summary.json: {v}")
            dev = (f.get("bench_planner_device") or {}).get("device_rows", [{}])[0]
            check(dev.get("launches_per_step", {}).get("total") == 30 and dev.get("ns_per_distinct") == 143.8,
                  f"pass: the device step's launches and ns per selection reach summary.json: {dev}")
            check((f.get("bench_device_step_round") or {}).get("benchmarks", [{}])[0].get("real_time") == 12.5,
                  "pass: ula_bench's JSON reaches summary.json")
            check(all(v is not None for v in f.values()), f"pass: no measurement without its figure: {f}")
        _, s = expect(tmp, "cuda-skipped", 6, "cuda-skipped")
        if s:
            check("DeviceStep.CudaFormIsMadeExactlyWhereADeviceIs" in s["message"], "cuda-skipped: the test is named")
        _, s = expect(tmp, "no-gpu", 3, "no-gpu")
        if s:
            check(not s["gpu_seen"] and [x["name"] for x in s["steps"]] == ["load", "gpu", "probe"],
                  "no-gpu: nothing runs after the probe")
        _, s = expect(tmp, "old-driver", 4, "old-driver")
        if s:
            check("12020" in s["message"] and "13000" in s["message"], "old-driver: both versions named")
        _, s = expect(tmp, "no-load", 5, "no-load")
        if s:
            check("libbenchmark.so.1" in s["message"], "no-load: the missing library is named")
        _, s = expect(tmp, "timeout", 7, "timeout", env_extra={"GPU_CHECK_MAX_STEP_S": "2"})
        if s:
            pol = next(x for x in s["steps"] if x["name"] == "policy_test")
            check(pol["rc"] in (124, 137) and "timed out" in pol["note"], f"timeout: policy_test {pol}")
            check(s["steps"][-1]["name"] == steps[-1], "timeout: the steps after it still run")
        _, s = expect(tmp, "fail", 1, "fail")
        if s:
            check("tp_device_step_test" in s["message"], "fail: the failed step is named")
            f = s.get("figures", {})
            check("bench_gather_cuda" in f and f["bench_gather_cuda"] is None and f.get("bench_gather_cpu") is not None,
                  f"fail: a failed measurement's figure is null, the others are kept: {f}")
            check(all(name in f and f[name] is None for name in CUDA_FIGURES) and f.get("bench_planner_device") is not None,
                  f"fail: the failed CUDA-form steps' figures are null, the OpenMP form's kept: {f}")
            failed = {x["name"] for x in s["steps"] if x["rc"] != 0}
            check(set(CUDA_FIGURES) <= failed, f"fail: every CUDA-form step is recorded failed: {sorted(failed)}")
        expect(tmp, "smoke", 0, "smoke-pass", args=("--smoke",))
        expect(tmp, "no-load", 5, "no-load", args=("--smoke",))
        expect(tmp, "pass", 2, "bad-input", dist=tmp / "nowhere")

        for args, env, what in [(("--fast",), {}, "unknown argument"),
                                (("--smoke", "--plan"), {}, "at most one argument"),
                                ((), {"GPU_CHECK_BUDGET_S": "100"}, "not less than the 100 s budget"),
                                ((), {"GPU_CHECK_BUDGET_S": "4x"}, "not a whole number"),
                                ((), {"GPU_CHECK_MAX_STEP_S": "0"}, "not a positive whole number")]:
            p, _ = run(tmp, "pass", args, env_extra=env)
            check(p.returncode == 2 and what in p.stderr, f"bad input {args} {env}: exit {p.returncode}, stderr {p.stderr!r}")
        print("ok: bad arguments and settings are refused with exit 2")

    if failures:
        print(f"gpu_check_selftest: {len(failures)} failure(s)")
        return 1
    print("gpu_check_selftest: every verdict as expected")
    return 0


if __name__ == "__main__":
    sys.exit(main())
