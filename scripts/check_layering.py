#!/usr/bin/env python3
"""The layering check: libraries depend only on libraries below them.

The layers, lowest first (docs/ARCHITECTURE.md, "Layers"), are the folders of src/:

    core < backend < policy < sparse < mpi < unified < prefix < model
         < config < workload < serving < verify

(`mpi` is src/backend/mpi: the MPI engine implements the TP fabric of `sparse`, so it sits
just above it.) A library may include the headers of, and link, only libraries of a lower
layer, or its own. The check reads two things and fails on any edge that points up:

  * every `#include "ula/X.h"` and `#include "<folder>/..."` in src/<layer>/ — a public
    header belongs to the layer whose folder implements it (include/ula/X.h <-> src/*/X.cc),
    or to the layer named in HEADER_LAYER for the headers without a .cc;
  * every `ula_<name>` in the DEPS of `ula_add_component` and in target_link_libraries of
    src/<layer>/CMakeLists.txt.

Usage: check_layering.py [SOURCE_ROOT]   exit 0 when clean, 1 with one line per violation.
       check_layering.py --self-test      builds a small tree with one upward include and one
                                          upward link and checks that both are reported.
"""
import os
import re
import sys
import tempfile

LAYERS = ["core", "backend", "policy", "sparse", "mpi", "unified", "prefix", "model",
          "config", "workload", "serving", "verify"]

# Public headers that no .cc of the same name implements: the layer they belong to.
HEADER_LAYER = {
    "backend": "backend",
    "baselines": "serving",
    "check": "core",
    "error": "core",
    "huge_page_allocator": "backend",
    "ids": "core",
    "location": "core",
    "residency_policy": "policy",
    "striped_indexer": "sparse",
    "tp_fabric": "sparse",
    "tp_mpi": "mpi",
}

INCLUDE_RE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
LINK_RE = re.compile(r"\bula_([a-z_]+)\b")


def layer_dirs(root):
    """{layer: folder} for the layers present in the tree."""
    out = {}
    for layer in LAYERS:
        d = os.path.join(root, "src", "backend", "mpi") if layer == "mpi" else os.path.join(root, "src", layer)
        if os.path.isdir(d):
            out[layer] = d
    return out


def header_owners(root, dirs):
    owners = dict(HEADER_LAYER)
    for layer, d in dirs.items():
        for name in os.listdir(d):
            if name.endswith(".cc"):
                owners.setdefault(name[:-3], layer)
    return owners


def source_files(d):
    for name in sorted(os.listdir(d)):
        if name.endswith((".h", ".cc")):
            yield os.path.join(d, name)


def check(root):
    dirs = layer_dirs(root)
    owners = header_owners(root, dirs)
    rank = {layer: i for i, layer in enumerate(LAYERS)}
    errors = []

    def upward(frm, to):
        return to in rank and rank[to] > rank[frm]

    for layer, d in dirs.items():
        for path in source_files(d):
            with open(path, encoding="utf-8") as f:
                text = f.read()
            rel = os.path.relpath(path, root)
            for inc in INCLUDE_RE.findall(text):
                if inc.startswith("ula/"):
                    name = os.path.splitext(os.path.basename(inc))[0]
                    target = owners.get(name)
                    if target is None:
                        errors.append(f"{rel}: includes {inc}, a public header with no layer "
                                      f"(add it to HEADER_LAYER in scripts/check_layering.py)")
                        continue
                else:
                    top = inc.split("/")[0]
                    target = "mpi" if inc.startswith("backend/mpi/") else top
                    if target not in rank:
                        continue  # a header next to the source, or a third-party one
                if upward(layer, target):
                    errors.append(f"{rel}: layer '{layer}' includes {inc} of the higher layer '{target}'")
        cml = os.path.join(d, "CMakeLists.txt")
        if os.path.exists(cml):
            with open(cml, encoding="utf-8") as f:
                text = re.sub(r"#.*", "", f.read())
            for dep in LINK_RE.findall(text):
                if upward(layer, dep):
                    errors.append(f"{os.path.relpath(cml, root)}: layer '{layer}' links ula_{dep} of a higher layer")
    return sorted(set(errors))


def self_test():
    """A tree in which core includes a serving header and policy links ula_sparse."""
    with tempfile.TemporaryDirectory() as root:
        def write(rel, text):
            p = os.path.join(root, rel)
            os.makedirs(os.path.dirname(p), exist_ok=True)
            with open(p, "w", encoding="utf-8") as f:
                f.write(text)
        write("src/core/ids.cc", '#include "ula/ids.h"\n')
        write("src/core/bad.cc", '#include "ula/serving_sim.h"\n')
        write("src/serving/serving_sim.cc", '#include "ula/ids.h"\n#include "workload/rng.h"\n')
        write("src/workload/rng.h", "\n")
        write("src/policy/CMakeLists.txt", "ula_add_component(policy DEPS ula_core ula_sparse)\n")
        write("src/sparse/planner.cc", '#include "ula/ids.h"\n')
        errors = check(root)
    want = ["src/core/bad.cc: layer 'core' includes ula/serving_sim.h of the higher layer 'serving'",
            "src/policy/CMakeLists.txt: layer 'policy' links ula_sparse of a higher layer"]
    if errors != want:
        print("self-test FAILED: got", errors)
        return 1
    print("self-test: both upward edges reported, the downward ones accepted")
    return 0


def main(argv):
    if len(argv) > 1 and argv[1] == "--self-test":
        return self_test()
    root = argv[1] if len(argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    errors = check(root)
    for e in errors:
        print(e)
    if errors:
        print(f"layering: {len(errors)} upward dependencies")
        return 1
    print(f"layering: clean ({', '.join(l for l in LAYERS if l in layer_dirs(root))})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
