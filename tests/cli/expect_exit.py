#!/usr/bin/env python3
"""Runs a command; passes when it exits with CODE and its stdout+stderr match REGEX.

Usage: expect_exit.py CODE REGEX [--or CODE2 REGEX2] -- COMMAND...

(ctest's PASS_REGULAR_EXPRESSION ignores the exit status; this checks both.) With --or, the
command may instead exit with CODE2 and match REGEX2: a test of a refusal on a machine without
a GPU names what the same command must print where one is present.
"""
import re
import subprocess
import sys


def main():
    sep = sys.argv.index("--")
    head, cmd = sys.argv[1:sep], sys.argv[sep + 1:]
    wants = [(int(head[0]), head[1])]
    if len(head) == 5 and head[2] == "--or":
        wants.append((int(head[3]), head[4]))
    elif len(head) != 2:
        sys.exit("usage: expect_exit.py CODE REGEX [--or CODE2 REGEX2] -- COMMAND...")
    p = subprocess.run(cmd, capture_output=True, text=True)
    out = p.stdout + p.stderr
    sys.stdout.write(out[-4000:])
    ok = False
    for code, pattern in wants:
        found = re.search(pattern, out, re.S) is not None
        print(f"\nexpect_exit: exit {p.returncode} (want {code}); /{pattern}/ {'found' if found else 'NOT found'}")
        ok = ok or (p.returncode == code and found)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
