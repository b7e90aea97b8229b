#!/usr/bin/env python3
"""Scenario variants differ from the default scenario only where they say they do.

configs/scenarios/selections_with_memory.json is the default scenario with the selection
model fitted with reuse distances (docs/WORKLOADS.md); every other field must equal the
default's, so that `ula compare --scenario` on it changes the selections and nothing else.
"""
import json
import sys
from pathlib import Path

root = Path(sys.argv[1])
default = json.loads((root / "configs/scenarios/default.json").read_text())
variant = json.loads((root / "configs/scenarios/selections_with_memory.json").read_text())
allowed = {"name", "selection"}
diff = sorted(k for k in set(default) | set(variant) if k not in allowed and default.get(k) != variant.get(k))
if diff:
    print("selections_with_memory.json differs from default.json in:", ", ".join(diff))
    sys.exit(1)
sel_diff = sorted(k for k in set(default["selection"]) | set(variant["selection"])
                  if default["selection"].get(k) != variant["selection"].get(k))
if not {"heavy_skew", "return_fraction"} <= set(sel_diff):
    print("the variant's selection must set heavy_skew and return_fraction, differs only in", sel_diff)
    sys.exit(1)
print("selections_with_memory = default + selection", sel_diff)
