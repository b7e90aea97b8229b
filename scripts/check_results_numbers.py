#!/usr/bin/env python3
"""The serving comparison's numbers in docs/RESULTS.md, tied to the CSVs `ula compare --out
docs/img` wrote (docs/img/summary.csv, docs/img/compare.csv), as check_doc_numbers.py ties
constants to the code.

  check_results_numbers.py ROOT            every check below; exit 1 on a difference
  check_results_numbers.py --write ROOT    regenerate the generated tables in place
  check_results_numbers.py --self-test ROOT  each check reports a planted difference

Checks:
  tables   every region between "<!-- results-table: NAME -->" and "<!-- /results-table -->"
           equals what TABLES[NAME] makes of the CSVs (the per-term step decomposition at
           equal batch and at each system's peak).
  quotes   every number in prose followed by a marker names where it comes from and must
           equal it at the precision written (thousands separators, a trailing "x" or "%"
           allowed):
             12,345<!-- s:CONFIG:SYSTEM:FIELD -->        summary.csv
             23.86<!-- p:CONFIG:SYSTEM:BATCH:FIELD -->   compare.csv at that batch
             2.17x<!-- r:CONFIG:SYS_A:SYS_B:FIELD -->    summary.csv, A's FIELD / B's
           CONFIG is the CSV's config column (h200_tp_mtpon), SYSTEM its system column;
           "s@DIR:", "p@DIR:", "r@DIR:" read docs/img/DIR/ (a scenario's --out other than the
           default). A marker it cannot read (no number before it, a name outside [a-z0-9_])
           is an error, not skipped.
  stdout   every pasted `ula compare` table (a fenced block opening with "ula compare:
           scenario NAME") agrees with the CSVs of that scenario (default: docs/img/, else
           docs/img/NAME/) in every column at the precision printed: adm, fill, peak, @B,
           tpot1, hit1 (summary.csv), hit@B, host@B (h2d + d2h), pfkv@B, pfms@B
           (compare.csv at the peak batch) and vs ula (ulacache_home's peak in TP,
           ulacache's in DP, over the row's).
"""
import csv
import re
import shutil
import sys
import tempfile
from pathlib import Path

DOC = "docs/RESULTS.md"
SUMMARY = "docs/img/summary.csv"
POINTS = "docs/img/compare.csv"
ORDER = ["h200_tp_mtpoff", "h200_tp_mtpon", "h200_dp_mtpoff", "h200_dp_mtpon",
         "b300_tp_mtpoff", "b300_tp_mtpon", "b300_dp_mtpoff", "b300_dp_mtpon"]
# Terms of one step (ms), in the order COST_MODEL.md "One decode step on one GPU" adds them:
# gpu = dense + experts + attention + indexer + hbm copies; step = gpu + exposed transfer +
# collectives + planner + overhead. "arriving" is the prefill KV's host-link time (part of
# the transfer time, exposed only as far as it is not hidden).
TERMS = [("dense", "dense_ms"), ("experts", "experts_ms"), ("attention", "attention_ms"), ("indexer", "indexer_ms"),
         ("hbm copies", "hbm_copies_ms"), ("exposed", "transfer_exposed_ms"), ("coll", "collectives_ms"),
         ("planner", "planner_ms"), ("overhead", "overhead_ms")]


def load(root, sub=""):
    img = Path(root) / "docs" / "img" / sub
    summary = {(r["config"], r["system"]): r for r in csv.DictReader(open(img / "summary.csv"))}
    points = {}
    for r in csv.DictReader(open(img / "compare.csv")):
        points.setdefault((r["config"], r["system"]), {})[int(r["batch"])] = r
    return summary, points


def configs(summary):
    seen = {c for c, _ in summary}
    return [c for c in ORDER if c in seen] + sorted(seen - set(ORDER))


def systems_of(summary, config):
    return [s for c, s in summary if c == config]


def equal_batch(points, summary, config):
    """The largest batch every system of the config but all_gpu measured (0: none in common).
    TP all_gpu holds a full copy per GPU (5 requests on H200): it shows where it ran that batch."""
    common = None
    for s in systems_of(summary, config):
        if s == "all_gpu":
            continue
        b = set(points.get((config, s), {}))
        common = b if common is None else common & b
    return max(common) if common else 0


def row(config, system, summary, p):
    tag = summary[(config, system)].get("ships", "")
    cells = [config, f"{system} ({tag})" if tag else system, p["batch"], f"{float(p['tput']):.0f}",
             f"{float(p['step_ms']):.2f}"]
    cells += [f"{float(p[col]):.2f}" for _, col in TERMS]
    cells += [f"{float(p.get('arriving_ms', 0) or 0):.2f}"]
    return "| " + " | ".join(str(c) for c in cells) + " |"


def header():
    cols = ["config", "system", "batch", "tok/s", "step ms"] + [t for t, _ in TERMS] + ["arriving"]
    return "| " + " | ".join(cols) + " |\n| " + " | ".join(["---"] * 2 + ["---:"] * (len(cols) - 2)) + " |"


def table_equal(summary, points):
    lines = [header()]
    for c in configs(summary):
        b = equal_batch(points, summary, c)
        for s in systems_of(summary, c):
            if b and b in points.get((c, s), {}):
                lines.append(row(c, s, summary, points[(c, s)][b]))
    return "\n".join(lines)


def table_peak(summary, points):
    lines = [header()]
    for c in configs(summary):
        for s in systems_of(summary, c):
            b = int(summary[(c, s)]["peak_batch"])
            if b in points.get((c, s), {}):
                lines.append(row(c, s, summary, points[(c, s)][b]))
    return "\n".join(lines)


TABLES = {"decomposition-equal-batch": table_equal, "decomposition-peak": table_peak}
REGION = re.compile(r"(<!-- results-table: ([a-z0-9-]+) -->\n)(.*?)(\n<!-- /results-table -->)", re.S)
QUOTE = re.compile(r"([0-9][0-9,]*(?:\.[0-9]+)?)([x%]?)\*{0,2}<!-- ([spr])(?:@([a-z0-9_]+))?:([^ ]+) -->")


def decimals(text):
    return len(text.split(".")[1]) if "." in text else 0


# A marker QUOTE cannot read (a scenario or config name outside its character set, no number
# before it) would be skipped without a word: every marker must be one QUOTE reads.
MARKER = re.compile(r"<!-- [spr](?:@[^ :]*)?:[^ ]* -->")


def check_quotes(root, doc, summary, points):
    errors = []
    read = {m.start(3) - len("<!-- ") for m in QUOTE.finditer(doc)}
    errors += [f"{DOC}: marker {m.group(0)!r} is not read (no number before it, or a name outside [a-z0-9_])"
               for m in MARKER.finditer(doc) if m.start() not in read]
    scenarios = {}
    for m in QUOTE.finditer(doc):
        written, kind, sub, ref = m.group(1), m.group(3), m.group(4), m.group(5).split(":")
        try:
            if sub:
                if sub not in scenarios:
                    scenarios[sub] = load(root, sub)
                summary, points = scenarios[sub]
            else:
                summary, points = scenarios.setdefault("", load(root))
            if kind == "s":
                config, system, field = ref
                value = float(summary[(config, system)][field])
            elif kind == "p":
                config, system, batch, field = ref
                value = float(points[(config, system)][int(batch)][field])
            else:
                config, a, b, field = ref
                value = float(summary[(config, a)][field]) / float(summary[(config, b)][field])
        except (KeyError, ValueError, ZeroDivisionError, OSError) as e:
            errors.append(f"{DOC}: marker {m.group(0)!r} names nothing in the CSVs ({e})")
            continue
        number = float(written.replace(",", ""))
        d = decimals(written)
        if abs(round(value, d) - number) > 0.5 * 10 ** -d + 1e-9:
            errors.append(f"{DOC}: {m.group(0)!r} says {written}, the CSVs {value:.{d}f}")
    return errors


STDOUT = re.compile(r"```\nula compare: scenario ([a-z0-9_]+)[^\n]*\n(.*?)```", re.S)
STDOUT_ROW = re.compile(r"^(\d+)x([A-Za-z0-9_]+) (tp|dp) mtp=(on|off) +([a-z_]+) +([a-z]+) +\|(.*)$")


def stdout_config(hardware, mode, mtp):
    return f"{hardware.lower()}_{mode}_mtp{mtp}"


def check_stdout(root, doc):
    errors = []
    blocks = 0
    for m in STDOUT.finditer(doc):
        blocks += 1
        scenario = m.group(1)
        try:
            summary, points = load(root, "" if scenario == "default" else scenario)
        except OSError as e:
            errors.append(f"{DOC}: stdout of scenario {scenario}: no CSVs ({e})")
            continue
        for line in m.group(2).splitlines():
            r = STDOUT_ROW.match(line)
            if not r:
                continue
            _, hw, mode, mtp, system, _ships, rest = r.groups()
            config = stdout_config(hw, mode, mtp)
            cells = rest.replace("|", " ").split()
            try:
                srow = summary[(config, system)]
                b = int(srow["peak_batch"])
                prow = points[(config, system)][b]
                ref = "ulacache_home" if mode == "tp" else "ulacache"
                # (value, its rounding slack): the CSVs hold rounded values, so a printed figure
                # may sit half a CSV unit off (a sum two, a ratio its operands' relative slack).
                def csv_value(row, field):
                    return float(row[field]), 0.5 * 10 ** -decimals(row[field])
                h2d, d2h = csv_value(prow, "h2d_gb"), csv_value(prow, "d2h_gb")
                top, own = csv_value(summary[(config, ref)], "peak_tput"), csv_value(srow, "peak_tput")
                ratio = top[0] / own[0]
                expect = [csv_value(srow, "admitted"), csv_value(srow, "fill"), own, (float(b), 0.0),
                          csv_value(srow, "tpot_b1_ms"), csv_value(srow, "hit_b1"), csv_value(prow, "hit_rate"),
                          (h2d[0] + d2h[0], h2d[1] + d2h[1]), csv_value(prow, "arriving_gb"),
                          csv_value(prow, "arriving_ms"), (ratio, ratio * (top[1] / top[0] + own[1] / own[0]))]
            except (KeyError, ValueError, ZeroDivisionError) as e:
                errors.append(f"{DOC}: stdout row {line.strip()!r} names nothing in the CSVs ({e})")
                continue
            names = ["adm", "fill", "peak", "@B", "tpot1", "hit1", "hit@B", "host@B", "pfkv@B", "pfms@B", "vs ula"]
            if len(cells) != len(names):
                errors.append(f"{DOC}: stdout row {line.strip()!r} has {len(cells)} columns, not {len(names)}")
                continue
            for name, cell, (value, slack) in zip(names, cells, expect):
                written = cell.rstrip("x")
                d = decimals(written)
                if abs(value - float(written)) > 0.5 * 10 ** -d + slack + 1e-9:
                    errors.append(f"{DOC}: stdout {config} {system} {name} says {cell}, the CSVs {value:.{d}f}")
    if blocks == 0:
        errors.append(f"{DOC}: no pasted `ula compare` table")
    return errors


def run_all(root):
    doc = (Path(root) / DOC).read_text()
    summary, points = load(root)
    errors = []
    regions = 0
    for m in REGION.finditer(doc):
        regions += 1
        name = m.group(2)
        if name not in TABLES:
            errors.append(f"{DOC}: unknown results-table {name!r}")
        elif m.group(3) != TABLES[name](summary, points):
            errors.append(f"{DOC}: results-table {name!r} differs from the CSVs (run with --write)")
    if regions == 0:
        errors.append(f"{DOC}: no results-table region")
    quotes = check_quotes(root, doc, summary, points)
    if not QUOTE.search(doc):
        errors.append(f"{DOC}: no quoted number with a marker")
    return errors + quotes + check_stdout(root, doc)


def write(root):
    path = Path(root) / DOC
    summary, points = load(root)
    doc = path.read_text()
    doc = REGION.sub(lambda m: m.group(1) + TABLES[m.group(2)](summary, points) + m.group(4), doc)
    path.write_text(doc)
    return 0


def self_test(root):
    if run_all(root):
        print("self-test: the tree itself does not pass")
        return 1
    ok = True
    doc = (Path(root) / DOC).read_text()
    plants = []
    q = QUOTE.search(doc)
    if q:  # a quoted number one unit off in its last digit
        w = q.group(1)
        d = decimals(w)
        new = f"{float(w.replace(',', '')) + 10 ** -d * 3:.{d}f}"
        plants.append(("quotes", doc[:q.start(1)] + new + doc[q.end(1):]))
    if q:  # the same marker's scenario spelled with a character QUOTE does not read
        plants.append(("unread marker", doc[:q.start(3)] + q.group(3) + "@Bad" + doc[q.end(3):]))
    r = REGION.search(doc)
    if r:  # one cell of a generated table changed
        body = r.group(3)
        cell = re.search(r"\| ([0-9]+\.[0-9]{2}) \|", body)
        if cell:
            body2 = body[:cell.start(1)] + "999.99" + body[cell.end(1):]
            plants.append(("tables", doc[:r.start(3)] + body2 + doc[r.end(3):]))
    o = STDOUT.search(doc)
    row = next((r for r in re.finditer(r"^.*\| +(\d+) +[0-9.]+ +(\d+) ", o.group(2), re.M)), None) if o else None
    if row:  # one peak of a pasted table changed by 10 tok/s
        at = o.start(2) + row.start(2)
        plants.append(("stdout", doc[:at] + str(int(row.group(2)) + 10).rjust(len(row.group(2))) + doc[at + len(row.group(2)):]))
    if len(plants) < 4:
        print("self-test: nothing to plant (no marker, no table or no pasted output)")
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        for what, text in plants:
            scratch = Path(tmp) / what.replace(" ", "_")
            (scratch / "docs" / "img").mkdir(parents=True)
            shutil.copytree(Path(root) / "docs" / "img", scratch / "docs" / "img", dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns("*.png"))
            (scratch / DOC).write_text(text)
            if not run_all(scratch):
                print(f"self-test: a planted difference ({what}) went unreported")
                ok = False
    print("self-test:", "ok" if ok else "FAIL")
    return 0 if ok else 1


def main(argv):
    if len(argv) == 2 and argv[0] == "--self-test":
        return self_test(argv[1])
    if len(argv) == 2 and argv[0] == "--write":
        return write(argv[1])
    if len(argv) != 1:
        print(__doc__)
        return 2
    errors = run_all(argv[0])
    for e in errors:
        print(e)
    print("results numbers:", "ok" if not errors else f"{len(errors)} differences")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
