"""Finds the ulacache package: ULA_PYTHON_PATH (set by ctest to <build>/python), else the
in-tree build <repo>/build/python, else an installed one."""
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
_path = os.environ.get("ULA_PYTHON_PATH") or str(REPO / "build" / "python")
if Path(_path, "ulacache").is_dir():
    sys.path.insert(0, _path)
