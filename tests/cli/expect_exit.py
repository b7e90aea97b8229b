#!/usr/bin/env python3
"""Runs a command; passes when it exits with CODE and its stdout+stderr match REGEX.

Usage: expect_exit.py CODE REGEX -- COMMAND...

(ctest's PASS_REGULAR_EXPRESSION ignores the exit status; this checks both.)
"""
import re
import subprocess
import sys


def main():
    sep = sys.argv.index("--")
    code, pattern, cmd = int(sys.argv[1]), sys.argv[2], sys.argv[sep + 1:]
    p = subprocess.run(cmd, capture_output=True, text=True)
    out = p.stdout + p.stderr
    sys.stdout.write(out[-4000:])
    ok = p.returncode == code and re.search(pattern, out, re.S) is not None
    print(f"\nexpect_exit: exit {p.returncode} (want {code}); /{pattern}/ {'found' if re.search(pattern, out, re.S) else 'NOT found'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
