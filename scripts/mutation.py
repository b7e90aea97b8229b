#!/usr/bin/env python3
"""`make mutation`: deliberate bugs the tests must catch.

Reads tests/mutations.json. For each mutation alone: replace one exact source line, rebuild
only the listed targets in a tree of its own (build-mutation/, ccache when present), run
the listed ctests, restore the source. A mutation is caught when a test fails; one that
does not compile is reported as such and not counted as caught. A mutated run still going
after MUTATED_RUN_LIMIT_S is killed and counted as caught, printed "caught (timed out)": a
test that can only fail by hanging should get a watchdog of its own. Prints `caught N of M`
and exits 0 only when every mutation is caught.

Before anything changes, every `find` line must occur exactly once in its file (else the
code moved on: update the list), and the unmutated tests must pass. The source is restored
after each mutation, also on Ctrl-C; a copy of the original file is kept in the build tree
until then, and a later run restores it first if a run was killed.

--check only does that matching (every `find` line once in its file, every name once) and
exits 0 or 2: the ctest `mutation_list_matches_the_code` runs it in `make test`, so a change
that moves a mutation's line fails there, not in the next `make mutation`.

Usage: scripts/mutation.py [--build-dir DIR] [--jobs N] [--only NAME...] [--list] [--check]
                           [--mutations FILE]
"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIST = ROOT / "tests" / "mutations.json"


def sh(cmd, log=None, timeout=None):
    """Runs cmd; past timeout seconds its whole process group (ctest and the test it runs) is
    killed and 124 returned."""
    with open(log, "a") if log else open(os.devnull, "w") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            return proc.wait(timeout=timeout)
        except KeyboardInterrupt:
            os.killpg(proc.pid, signal.SIGKILL)
            raise
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # ctest and every test it started
            proc.wait()
            out.write(f"\nmutation: killed after {timeout} s\n")
            return 124


def configure(build, log):
    # CUDA off: the mutations are caught by the kernels' OpenMP form; an nvcc rebuild of
    # step_kernels.cu per kernel mutation would add minutes each and test nothing more here.
    args = ["cmake", "-S", ".", "-B", str(build), "-DCMAKE_BUILD_TYPE=Release", "-DULA_BUILD_BENCH=OFF",
            "-DULA_WITH_CUDA=OFF"]
    if shutil.which("ccache"):
        args.append("-DCMAKE_CXX_COMPILER_LAUNCHER=ccache")
    if sh(args, log) != 0:
        sys.exit(f"mutation: configuring {build} failed (see {log})")


def build_targets(build, targets, jobs, log):
    return sh(["cmake", "--build", str(build), "-j", str(jobs), "--target", *targets], log) == 0


# A mutation may make a test hang. ctest's --timeout bounds only the tests without a TIMEOUT
# property of their own (every ula_add_test has one, 600 s by default), so a mutated run is
# bounded here: past MUTATED_RUN_LIMIT_S its ctest and tests are killed, and the hang counts
# as caught (the listed tests did not pass), printed as "caught (timed out)" so that a test
# which only fails by hanging shows. The unmutated baseline runs without this bound.
MUTATED_RUN_LIMIT_S = 300


def run_tests(build, regex, log, timeout=None):
    return sh(["ctest", "--test-dir", str(build), "-R", regex, "--timeout", "180", "--output-on-failure"], log,
              timeout=timeout)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build-dir", default="build-mutation")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--check", action="store_true", help="only check that the list matches the code")
    ap.add_argument("--mutations", default=str(LIST), help="the list (default tests/mutations.json)")
    ap.add_argument("--self-test", action="store_true", help="check that a hung run is killed whole, then exit")
    a = ap.parse_args()
    if a.self_test:
        return self_test()
    mutations = json.loads(Path(a.mutations).read_text())["mutations"]
    if a.only:
        unknown = set(a.only) - {m["name"] for m in mutations}
        if unknown:
            sys.exit(f"mutation: unknown names {sorted(unknown)}")
        mutations = [m for m in mutations if m["name"] in a.only]
    if a.list:
        for m in mutations:
            print(f"{m['name']:50} {m['file']}: {m['why']}")
        return 0
    if not a.check:
        build = (ROOT / a.build_dir).resolve()
        build.mkdir(parents=True, exist_ok=True)
        backup_dir = build / "mutation-backup"
        restore_leftovers(backup_dir)

    # Every mutation must still match the code, exactly once, under a name of its own.
    stale = []
    names = [m["name"] for m in mutations]
    stale += [f"{n}: the name is used {names.count(n)} times" for n in sorted(set(names)) if names.count(n) > 1]
    for m in mutations:
        text = (ROOT / m["file"]).read_text()
        lines = text.split("\n")
        hits = sum(1 for line in lines if line == m["find"])
        if hits != 1:
            stale.append(f"{m['name']}: the line {m['find']!r} occurs {hits} times in {m['file']} (want 1)")
    if stale:
        print("\n".join("mutation: " + s for s in stale))
        print("the code changed: update tests/mutations.json")
        return 2
    if a.check:
        print(f"mutation: all {len(mutations)} mutations match the code, each line once")
        return 0

    log = build / "mutation.log"
    log.write_text("")
    configure(build, log)
    all_targets = sorted({t for m in mutations for t in m["targets"]})
    all_tests = "|".join(f"({m['tests']})" for m in mutations)
    t0 = time.time()
    print(f"baseline: building {len(all_targets)} targets in {build.name}/ ...", flush=True)
    if not build_targets(build, all_targets, a.jobs, log):
        sys.exit(f"mutation: the unmutated tree does not build (see {log})")
    if run_tests(build, all_tests, log) != 0:
        sys.exit(f"mutation: the unmutated tests fail (see {log}); nothing to measure")
    print(f"baseline: the unmutated tests pass ({time.time() - t0:.0f} s)", flush=True)

    caught, results = 0, []
    for i, m in enumerate(mutations, 1):
        path = ROOT / m["file"]
        original = path.read_text()
        backup = backup_dir / m["file"]
        backup.parent.mkdir(parents=True, exist_ok=True)
        backup.write_text(original)
        old = signal.signal(signal.SIGINT, signal.SIG_IGN)  # no Ctrl-C between write and restore setup
        try:
            lines = original.split("\n")
            lines[lines.index(m["find"])] = m["replace"]
            path.write_text("\n".join(lines))
            signal.signal(signal.SIGINT, old)
            t = time.time()
            with open(log, "a") as f:
                f.write(f"\n===== mutation {m['name']}\n")
            if not build_targets(build, m["targets"], a.jobs, log):
                verdict = "DID NOT COMPILE"
            else:
                rc = run_tests(build, m["tests"], log, timeout=MUTATED_RUN_LIMIT_S)
                verdict = "caught (timed out)" if rc == 124 else "caught" if rc != 0 else "NOT CAUGHT"
        finally:
            path.write_text(original)
            backup.unlink()
        caught += verdict.startswith("caught")
        results.append((m["name"], verdict))
        print(f"[{i:2}/{len(mutations)}] {verdict:16} {m['name']} ({time.time() - t:.0f} s)", flush=True)
    # Leave the tree built from the restored source.
    build_targets(build, all_targets, a.jobs, log)
    timed_out = [n for n, v in results if v == "caught (timed out)"]
    print(f"caught {caught} of {len(mutations)}" + (f" ({len(timed_out)} by the time limit only: "
                                                      + ", ".join(timed_out) + ")" if timed_out else ""))
    missed = [n for n, v in results if not v.startswith("caught")]
    if missed:
        print("not caught: " + ", ".join(missed) + f" (log: {log.relative_to(ROOT)})")
    return 0 if caught == len(mutations) else 1


def running(pid):
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def self_test():
    """A run past its limit is killed with everything it started: here a shell whose child
    would sleep on (what a hung test under ctest is), which must be gone when sh returns."""
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        pid_file = Path(tmp) / "child.pid"
        t = time.time()
        rc = sh(["bash", "-c", f"sleep 300 & echo $! > {pid_file}; wait"], timeout=2)
        took = time.time() - t
        child = int(pid_file.read_text())
        alive = True
        for _ in range(50):  # killed, it may stay a zombie until its new parent reaps it
            alive = running(child)
            if not alive:
                break
            time.sleep(0.1)
        if alive:
            os.kill(child, signal.SIGKILL)
    problems = []
    if rc != 124:
        problems.append(f"a hung run returned {rc}, want 124")
    if alive:
        problems.append("the hung run's child outlived the kill")
    if took > 30:
        problems.append(f"the kill took {took:.0f} s for a 2 s limit")
    if problems:
        print("mutation self-test: " + "; ".join(problems))
        return 1
    print(f"mutation self-test: a hung run killed whole after {took:.1f} s (limit 2 s), rc 124")
    return 0


def restore_leftovers(backup_dir):
    if not backup_dir.exists():
        return
    for f in backup_dir.rglob("*"):
        if f.is_file():
            rel = f.relative_to(backup_dir)
            print(f"mutation: restoring {rel} left mutated by an interrupted run")
            (ROOT / rel).write_text(f.read_text())
            f.unlink()


if __name__ == "__main__":
    sys.exit(main())
