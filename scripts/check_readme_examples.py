#!/usr/bin/env python3
"""README.md quotes the programs of examples/cpp verbatim.

Each quote is a marker line followed by a fenced block:

    <!-- example: examples/cpp/dp.cc -->
    ```cpp
    ... the whole file, byte for byte ...
    ```

The check fails (exit 1, one line per problem) when a quoted block differs from its file,
a marker names a missing file, or a program of examples/cpp (*.cc) is not quoted.

Usage: check_readme_examples.py [SOURCE_ROOT]
       check_readme_examples.py --self-test [SOURCE_ROOT]   plants a one-character change
                                 in a copy of the README and an unquoted example, and
                                 requires both reported.
"""
import os
import re
import sys
import tempfile

MARKER_RE = re.compile(r"^<!-- example: (\S+) -->\n```[a-z]*\n(.*?)^```$", re.M | re.S)


def problems(root, readme_text):
    out = []
    quoted = set()
    for m in MARKER_RE.finditer(readme_text):
        rel, block = m.group(1), m.group(2)
        quoted.add(rel)
        path = os.path.join(root, rel)
        if not os.path.isfile(path):
            out.append(f"README.md quotes {rel}, which does not exist")
            continue
        with open(path, encoding="utf-8") as f:
            text = f.read()
        if text != block:
            a, b = text.splitlines(), block.splitlines()
            line = next((i + 1 for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)) + 1)
            out.append(f"README.md's quote of {rel} differs from the file (first at line {line} of the file)")
    ex_dir = os.path.join(root, "examples", "cpp")
    if os.path.isdir(ex_dir):
        for name in sorted(os.listdir(ex_dir)):
            rel = f"examples/cpp/{name}"
            if name.endswith(".cc") and rel not in quoted:
                out.append(f"{rel} is not quoted in README.md")
    return out


def read_readme(root):
    with open(os.path.join(root, "README.md"), encoding="utf-8") as f:
        return f.read()


def self_test(root):
    text = read_readme(root)
    if problems(root, text):
        print("self-test: the README must be clean first")
        return 1
    m = MARKER_RE.search(text)
    if not m:
        print("self-test: README.md quotes no example")
        return 1
    i = m.start(2) + len(m.group(2)) // 2
    changed = text[:i] + ("X" if text[i] != "X" else "Y") + text[i + 1:]
    found_change = any("differs" in p for p in problems(root, changed))
    with tempfile.TemporaryDirectory() as tmp:
        os.makedirs(os.path.join(tmp, "examples", "cpp"))
        with open(os.path.join(tmp, "examples", "cpp", "extra.cc"), "w") as f:
            f.write("int main() {}\n")
        found_unquoted = any("not quoted" in p for p in problems(tmp, ""))
    if found_change and found_unquoted:
        print("self-test: both planted problems were reported")
        return 0
    print(f"self-test FAILED: change reported {found_change}, unquoted example reported {found_unquoted}")
    return 1


def main(argv):
    args = [a for a in argv[1:] if a != "--self-test"]
    root = args[0] if args else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if "--self-test" in argv:
        return self_test(root)
    found = problems(root, read_readme(root))
    for p in found:
        print(p)
    if not found:
        print("README.md quotes every example verbatim")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
