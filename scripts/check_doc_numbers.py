#!/usr/bin/env python3
"""Constants the docs state, tied to the code, as check_readme_examples.py
ties the README's programs.

  check_doc_numbers.py ROOT [--ula PATH]   every check below (metadata only with --ula)
  check_doc_numbers.py --self-test ROOT [--ula PATH]
                                           every check of the tree first (as above), then
                                           each check reports a planted difference; one run
                                           of `ula bench metadata` serves both (ctest doc_numbers)

Checks:
  metadata    docs/BENCHMARKS.md's metadata table (the one under "<!-- metadata-table -->")
              against `ula bench metadata --json --policy P`, every cell to 0.01 B, and its
              "N B to spare" against 16 B minus the default policy's total.
  pb_lru_bits docs/ARCHITECTURE.md's "R = R0 costs N bits per device slot (R + 2 = M bucket
              bits and a 32-bit round stamp" against the default R of residency_policy.h and
              its cost "(R + 2) bits + a 32-bit stamp per slot"; its "at most X pp" against the
              header's "R = R0 at most X pp".
  lru_sets    the number of LRU sets the prefix cache's DebugDigest covers, in the header
              comment and in ARCHITECTURE.md, against the std::set<LruKey> members of
              include/ula/prefix_cache.h, and the digest loop of src/prefix/ naming each.
  layers      every folder of src/ in README's layout and ARCHITECTURE's layer diagram, and
              every residency policy of the PolicyKind enum in both layer lists.
"""
import functools
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

NUMBERS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8}
# How the layer lists name each PolicyKind.
POLICY_NAMES = {"kPbLru": "PB-LRU", "kExactLruScan": "exact LRU (scan", "kExactLruList": "list)",
                "kClock": "CLOCK", "kLfuAged": "LFU-aged", "kKernelPbLru": "kernel PB-LRU"}
METADATA_ROWS = {"location table": "location_table", "device owner map": "device_owner",
                 "residency policy": "policy_bytes", "free bitmaps": "free_bitmaps",
                 "request lists + owner tags + reference counts": "request_lists",
                 "**total**": "total_bytes_per_entry_per_group"}


def read(root, rel):
    return (Path(root) / rel).read_text()


def comment_text(src):
    """The // comments of a source, joined into one line of words."""
    return " ".join(line.split("//", 1)[1].strip() for line in src.splitlines() if "//" in line)


@functools.lru_cache(maxsize=None)
def bench_metadata(ula, policy):
    """`ula bench metadata` of one policy, run once per process: the self-test's plants change
    the docs, never the program, so its second pass reads the first's figures (3 s a policy)."""
    return subprocess.run([ula, "bench", "metadata", "--json", "--policy", policy], capture_output=True, text=True)


def check_metadata(root, ula):
    errors = []
    doc = read(root, "docs/BENCHMARKS.md")
    at = doc.find("<!-- metadata-table -->")
    if at < 0:
        return ["BENCHMARKS.md: no <!-- metadata-table --> marker"]
    lines = doc[at:].splitlines()[1:]
    rows = [l for l in lines[: next((i for i, l in enumerate(lines) if l.strip() == "" and i > 0), len(lines))]
            if l.startswith("|")]
    if len(rows) < 3:
        return ["BENCHMARKS.md: the metadata table is missing"]
    header = [c.strip() for c in rows[0].strip("|").split("|")]
    policies = [re.sub(r"\s*\(.*\)", "", h) for h in header[1:]]
    measured = {}
    for p in policies:
        out = bench_metadata(ula, p)
        if out.returncode != 0:
            return [f"ula bench metadata --policy {p}: exit {out.returncode}: {out.stderr.strip()}"]
        measured[p] = json.loads(out.stdout)
    seen = set()
    for row in rows[2:]:
        cells = [c.strip() for c in row.strip("|").split("|")]
        key = METADATA_ROWS.get(cells[0])
        if key is None:
            errors.append(f"BENCHMARKS.md metadata table: unknown row {cells[0]!r}")
            continue
        seen.add(cells[0])
        for p, cell in zip(policies, cells[1:]):
            want = f"{measured[p][key]:.2f} B"
            if cell.strip("*") != want:
                errors.append(f"BENCHMARKS.md metadata table, {cells[0]} / {p}: says {cell}, "
                              f"`ula bench metadata --policy {p}` gives {want}")
    for name in set(METADATA_ROWS) - seen:
        errors.append(f"BENCHMARKS.md metadata table: row {name!r} missing")
    spare = re.search(r"with ([0-9.]+) B to spare for ([\w-]+)", doc[at:])
    if not spare:
        errors.append("BENCHMARKS.md metadata: no 'with N B to spare for P' sentence after the table")
    else:
        p = spare.group(2)
        if p not in measured:
            errors.append(f"BENCHMARKS.md metadata: spare stated for {p}, not a column")
        else:
            want = f"{16 - measured[p]['total_bytes_per_entry_per_group']:.2f}"
            if spare.group(1) != want:
                errors.append(f"BENCHMARKS.md metadata: {spare.group(1)} B to spare for {p}, measured {want} B")
    return errors


def check_pb_lru_bits(root):
    errors = []
    header = comment_text(read(root, "include/ula/residency_policy.h"))
    src = read(root, "include/ula/residency_policy.h")
    default = re.search(r"std::uint32_t recent_buckets = (\d+);", src)
    cost = "Costs (R + 2) bits + a 32-bit stamp per slot"
    if not default or cost not in header:
        return ["residency_policy.h: no default recent_buckets or no cost sentence"]
    r = int(default.group(1))
    arch = " ".join(read(root, "docs/ARCHITECTURE.md").split())
    m = re.search(r"R = (\d+) costs (\d+) bits per device slot \(R \+ 2 = (\d+) bucket bits and a 32-bit round stamp", arch)
    if not m:
        return ["ARCHITECTURE.md: no 'R = R0 costs N bits per device slot (R + 2 = M bucket bits and a 32-bit round stamp'"]
    if int(m.group(1)) != r:
        errors.append(f"ARCHITECTURE.md: R = {m.group(1)}, the default is {r}")
    if int(m.group(3)) != r + 2 or int(m.group(2)) != r + 2 + 32:
        errors.append(f"ARCHITECTURE.md: {m.group(2)} bits ({m.group(3)} bucket bits) per slot, "
                      f"residency_policy.h gives {r + 2} + 32 = {r + 34}")
    pp_doc = re.search(r"brings the gap to at most ([0-9.]+) pp", arch)
    pp_hdr = re.search(rf"R = {r} at most ([0-9.]+) pp", header)
    if not pp_doc or not pp_hdr:
        errors.append("ARCHITECTURE.md or residency_policy.h: no 'at most X pp' for the default R")
    elif pp_doc.group(1) != pp_hdr.group(1):
        errors.append(f"ARCHITECTURE.md: at most {pp_doc.group(1)} pp, residency_policy.h says {pp_hdr.group(1)} pp")
    return errors


def check_lru_sets(root):
    errors = []
    header = read(root, "include/ula/prefix_cache.h")
    names = []
    for m in re.finditer(r"std::set<LruKey>\s+([^;]+);", header):
        names += [n.strip() for n in m.group(1).split(",")]
    if not names:
        return ["prefix_cache.h: no std::set<LruKey> members"]
    n = len(names)
    for rel, text in (("include/ula/prefix_cache.h", comment_text(header)),
                      ("docs/ARCHITECTURE.md", " ".join(read(root, "docs/ARCHITECTURE.md").split()))):
        found = re.findall(r"the (\w+) LRU sets in order", text)
        if not found:
            errors.append(f"{rel}: no 'the N LRU sets in order'")
        for word in found:
            if NUMBERS.get(word) != n:
                errors.append(f"{rel}: the digest covers '{word}' LRU sets; prefix_cache.h declares {n} ({', '.join(names)})")
    loops = []
    for f in sorted((Path(root) / "src" / "prefix").glob("*.cc")):
        loops += re.findall(r"for \(const auto\* set : \{([^}]*)\}\)", f.read_text())
    if len(loops) != 1:
        errors.append(f"src/prefix/: {len(loops)} digest loops over the LRU sets (want 1)")
    else:
        listed = [s.strip().lstrip("&") for s in loops[0].split(",")]
        if sorted(listed) != sorted(names):
            errors.append(f"src/prefix/: the digest hashes {listed}, prefix_cache.h declares {names}")
    return errors


def check_layers(root):
    errors = []
    readme = read(root, "README.md")
    layout = readme[readme.find("## Layout"):]
    arch = read(root, "docs/ARCHITECTURE.md")
    diagram = arch[arch.find("```", arch.find("Layers")):]
    diagram = diagram[: diagram.find("```", 3)]
    for d in sorted(p.name for p in (Path(root) / "src").iterdir() if p.is_dir()):
        if f"src/{d}/" not in layout:
            errors.append(f"README.md layout: src/{d}/ missing")
        if not re.search(rf"^ {d}\s", diagram, re.M):
            errors.append(f"ARCHITECTURE.md layer diagram: {d} missing")
    enum = re.search(r"enum class PolicyKind[^{]*\{([^}]*)\}", read(root, "include/ula/residency_policy.h"))
    kinds = re.findall(r"\b(k\w+)\b", re.sub(r"//[^\n]*", "", enum.group(1))) if enum else []
    if not kinds:
        return errors + ["residency_policy.h: no PolicyKind enum"]
    for rel, text in (("README.md", re.search(r"^src/policy/.*$", layout, re.M)),
                      ("docs/ARCHITECTURE.md", re.search(r"^ policy .*$", diagram, re.M))):
        line = text.group(0) if text else ""
        for k in kinds:
            if k not in POLICY_NAMES:
                errors.append(f"check_doc_numbers.py: PolicyKind {k} has no display name (POLICY_NAMES)")
            elif POLICY_NAMES[k] not in line:
                errors.append(f"{rel}: the policy layer line does not name {POLICY_NAMES[k]} ({k})")
    return errors


def run_all(root, ula):
    errors = check_pb_lru_bits(root) + check_lru_sets(root) + check_layers(root)
    if ula:
        errors += check_metadata(root, ula)
    return errors


def self_test(root, ula):
    plants = [
        ("docs/ARCHITECTURE.md", "costs 98 bits per device slot", "costs 96 bits per device slot", "pb_lru_bits"),
        ("docs/ARCHITECTURE.md", "brings the gap to at most 0.014 pp", "brings the gap to at most 0.01 pp", "pb_lru_bits"),
        ("include/ula/prefix_cache.h", "the five LRU", "the three LRU", "lru_sets"),
        ("docs/ARCHITECTURE.md", "the five LRU sets in order", "the four LRU sets in order", "lru_sets"),
        ("README.md", "CLOCK, LFU-aged", "CLOCK", "layers"),
    ]
    if ula:
        plants.append(("docs/BENCHMARKS.md", "B to spare for pb_lru", "B to spare for pb_lru", "metadata-spare"))
    ok = True
    errors = run_all(root, ula)
    for e in errors:
        print(e)
    if errors:
        print("self-test: the tree itself does not pass")
        return 1
    print("doc numbers: ok", "(metadata table included)" if ula else "(metadata table not checked: no --ula)")
    with tempfile.TemporaryDirectory() as tmp:
        for rel, old, new, what in plants:
            scratch = Path(tmp) / "t"
            if scratch.exists():
                shutil.rmtree(scratch)
            # What the checks read: the docs, the public headers, the prefix sources, and the
            # folders of src/ (empty but for src/prefix).
            for sub in ("docs", "include/ula", "src/prefix", "README.md"):
                src = Path(root) / sub
                dst = scratch / sub
                dst.parent.mkdir(parents=True, exist_ok=True)
                if src.is_dir():
                    shutil.copytree(src, dst)
                else:
                    shutil.copy(src, dst)
            for d in (Path(root) / "src").iterdir():
                if d.is_dir():
                    (scratch / "src" / d.name).mkdir(parents=True, exist_ok=True)
            f = scratch / rel
            text = f.read_text()
            if what == "metadata-spare":
                text = re.sub(r"with ([0-9.]+) B to spare", "with 9.99 B to spare", text, count=1)
            else:  # the doc may wrap the phrase: any run of spaces, newlines and comment marks
                pattern = r"(?:\s|//)+".join(re.escape(w) for w in old.split())
                if not re.search(pattern, text):
                    print(f"self-test: {rel} lacks {old!r}")
                    ok = False
                    continue
                text = re.sub(pattern, new, text, count=1)
            f.write_text(text)
            if not run_all(scratch, ula if what.startswith("metadata") else None):
                print(f"self-test: a planted difference in {rel} ({what}) went unreported")
                ok = False
    print("self-test:", "ok" if ok else "FAIL")
    return 0 if ok else 1


def main(argv):
    ula = None
    if "--ula" in argv:
        i = argv.index("--ula")
        ula = argv[i + 1]
        del argv[i:i + 2]
    if argv[:1] == ["--self-test"] and len(argv) == 2:
        return self_test(argv[1], ula)
    if len(argv) != 1:
        print(__doc__)
        return 2
    errors = run_all(argv[0], ula)
    for e in errors:
        print(e)
    print("doc numbers:", "ok" if not errors else f"{len(errors)} differences",
          "(metadata table included)" if ula else "(metadata table not checked: no --ula)")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
