#!/usr/bin/env python3
"""One fitted selection-model parameter set, read by every consumer.

The fit lives in configs/selection/<name>.json (written by `ula bench trace --write-fit`).
This test fails if a consumer carries its own copy of it:
  - a scenario (configs/scenarios/*.json) whose "selection" is not {"fit", "seed"} or names
    a fit that does not exist;
  - any other file under configs/ that sets a selection-model parameter;
  - a source file of tools/, src/ or python/ outside the selection model itself
    (src/workload/) that assigns a number to a selection-model parameter.
"""
import json
import re
import sys
from pathlib import Path

root = Path(sys.argv[1])
PARAMS = ("keep_mean", "keep_stddev", "draft_keep", "heavy_skew", "return_fraction", "return_window")
errors = []

fits = {p.stem for p in (root / "configs/selection").glob("*.json")}
if not fits:
    errors.append("configs/selection/ holds no fitted parameter set")
for path in sorted((root / "configs/scenarios").glob("*.json")):
    sel = json.loads(path.read_text()).get("selection")
    rel = path.relative_to(root)
    if not isinstance(sel, dict) or set(sel) != {"fit", "seed"}:
        errors.append(f"{rel}: 'selection' must be {{\"fit\": NAME, \"seed\": S}}, not {sel!r}")
    elif sel["fit"] not in fits:
        errors.append(f"{rel}: selection fit '{sel['fit']}' is not in configs/selection/")


def keys(node):
    if isinstance(node, dict):
        for k, v in node.items():
            yield k
            yield from keys(v)
    elif isinstance(node, list):
        for v in node:
            yield from keys(v)


for path in sorted((root / "configs").rglob("*.json")):
    if path.parent == root / "configs/selection":
        continue
    found = sorted(set(keys(json.loads(path.read_text()))) & set(PARAMS))
    if found:
        errors.append(f"{path.relative_to(root)}: sets {', '.join(found)} (a copy of the selection fit)")

assign = re.compile(r"\b(" + "|".join(PARAMS) + r")\b\s*[=:]\s*[0-9.]")
for folder in ("tools", "src", "python"):
    for path in sorted((root / folder).rglob("*")):
        if path.suffix not in (".cc", ".h", ".py") or path.is_relative_to(root / "src/workload"):
            continue
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if assign.search(line):
                errors.append(f"{path.relative_to(root)}:{n}: a hand-set selection parameter: {line.strip()}")

if errors:
    print("\n".join(errors))
    sys.exit(1)
print(f"one selection fit source: configs/selection/{{{', '.join(sorted(fits))}}}; "
      f"{len(list((root / 'configs/scenarios').glob('*.json')))} scenarios name it")
