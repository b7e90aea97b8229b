#!/usr/bin/env python3
"""One seed helper, and it refuses malformed seeds.

  check_seed_refusal.py PROGRAM      a test program that includes tests/test_seed.h: run it
                                     with ULA_TEST_SEED=42x, then (only the tests that drew a
                                     seed) with ULA_TEST_SEED=abc. Each test that drew a seed
                                     (property ula_seed in its --gtest_output report) must fail
                                     with the helper's message, the program must exit non-zero,
                                     and at least one test must have drawn a seed. A program
                                     that draws its seed at namespace scope must abort with the
                                     message instead.
  check_seed_refusal.py --lint ROOT  no test source but tests/test_seed.h reads ULA_TEST_SEED,
                                     and every test source that makes a random engine includes
                                     test_seed.h (directly).
  check_seed_refusal.py --self-test  the lint finds a planted private parser and an engine
                                     without the helper.
"""
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

MESSAGE = "is not a decimal 64-bit unsigned integer"


def run(program, value, gtest_filter=None):
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        cmd = [program, f"--gtest_output=json:{report}"]
        if gtest_filter:
            cmd.append(f"--gtest_filter={gtest_filter}")
        env = dict(os.environ, ULA_TEST_SEED=value)
        p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
        data = json.loads(report.read_text()) if report.exists() else None
        return p.returncode, p.stdout, data


def check_value(program, value, gtest_filter=None):
    """Returns (errors, seeded test names) for one malformed value."""
    rc, out, data = run(program, value, gtest_filter)
    name = Path(program).name
    if data is None:  # no report: the program stopped before the tests (a namespace-scope seed)
        if rc != 0 and MESSAGE in out:
            return [], None
        return [f"{name}: ULA_TEST_SEED={value}: no report, exit {rc}, no refusal message"], []
    seeded, errors = [], []
    for suite in data.get("testsuites", []):
        for t in suite.get("testsuite", []):
            if "ula_seed" not in t:
                continue
            full = f"{suite['name']}.{t['name']}"
            seeded.append(full)
            if not any(MESSAGE in f.get("failure", "") for f in t.get("failures", [])):
                errors.append(f"{name}: ULA_TEST_SEED={value}: {full} drew a seed and did not refuse it")
    if not seeded:
        errors.append(f"{name}: ULA_TEST_SEED={value}: no test drew a seed (is the program randomized?)")
    if rc == 0:
        errors.append(f"{name}: ULA_TEST_SEED={value}: the program exited 0")
    return errors, seeded


def check_program(program):
    errors, seeded = check_value(program, "42x")
    if not errors:
        more, seeded2 = check_value(program, "abc", ":".join(seeded) if seeded else None)
        errors += more
        if seeded is not None and seeded2 is not None and sorted(seeded2) != sorted(seeded):
            errors.append(f"{Path(program).name}: the tests that drew a seed differ between runs")
    for e in errors:
        print(e)
    n = "the program (namespace-scope seed)" if seeded is None else f"{len(seeded)} seeded tests"
    print(f"{Path(program).name}: {n}: {'refuse' if not errors else 'FAIL'} ULA_TEST_SEED=42x and =abc")
    return 1 if errors else 0


ENGINE = re.compile(r"\bstd::(mt19937(_64)?|minstd_rand0?|default_random_engine|ranlux\w*)\b|\bstd::rand\(")
PRIVATE = re.compile(r"getenv\(\s*\"ULA_TEST_SEED\"")


def lint(root):
    root = Path(root)
    errors = []
    for f in sorted((root / "tests").rglob("*")):
        if f.suffix not in (".cc", ".h") or f.name == "test_seed.h":
            continue
        text = f.read_text()
        rel = f.relative_to(root)
        if PRIVATE.search(text):
            errors.append(f"{rel}: reads ULA_TEST_SEED itself (use tests/test_seed.h)")
        if ENGINE.search(text) and '#include "test_seed.h"' not in text:
            errors.append(f"{rel}: makes a random engine without tests/test_seed.h")
    return errors


def self_test():
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp) / "tests"
        t.mkdir()
        (t / "ok_test.cc").write_text('#include "test_seed.h"\nstd::mt19937 rng(seed);\n')
        (t / "private_test.cc").write_text('#include "test_seed.h"\nauto s = std::getenv("ULA_TEST_SEED");\n')
        (t / "bare_test.cc").write_text("std::mt19937_64 rng(7);\n")
        errors = lint(tmp)
    want = ["tests/bare_test.cc: makes a random engine", "tests/private_test.cc: reads ULA_TEST_SEED"]
    ok = len(errors) == 2 and all(any(e.startswith(w) for e in errors) for w in want)
    print("self-test:", "ok" if ok else f"FAIL {errors}")
    return 0 if ok else 1


def main(argv):
    if argv[:1] == ["--self-test"]:
        return self_test()
    if argv[:1] == ["--lint"] and len(argv) == 2:
        errors = lint(argv[1])
        for e in errors:
            print(e)
        print("seed lint:", "ok" if not errors else f"{len(errors)} problems")
        return 1 if errors else 0
    if len(argv) == 1:
        return check_program(argv[0])
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
