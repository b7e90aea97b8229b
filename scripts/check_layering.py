#!/usr/bin/env python3
"""The layering check: every folder depends only on what is below it.

The layers, lowest first (docs/ARCHITECTURE.md, "Layers"), are the folders of src/:

    core < backend < kernels < policy < space < step < attention < tp < indexer < unified
         < prefix < model < config < workload < serving < verify

(`space` holds the requests, addresses and pools of DP and TP; `step` the step over a space in
its forms; `tp` what distributes it over ranks: fabrics, prefetch, attention at home, and the
MPI engine in src/tp/mpi, which implements the fabric interface of the backend layer;
`kernels` is src/kernels, the step's data-parallel kernels.) Above every layer sit tools/,
python/, bench/, tests/ and fuzz/.

Headers come in two kinds:

  * public, include/ula/X.h, included as "ula/X.h": the engine-facing API, installed.
    Each belongs to the layer whose folder implements it (src/<layer>/X.cc), or to the
    layer named in HEADER_LAYER for the few without a .cc;
  * internal, src/<layer>/X.h, included as "<layer>/X.h": never installed; it belongs to
    the layer of its folder.

The check reads every #include of src/, include/, python/ and tools/, the CMake links of
src/, and the consumers of the installed package (examples/cpp/, tests/install/consumer/),
and reports:

  1. an include or a link of src/<layer> that points to a higher layer;
  2. a public header that includes a higher layer's public header or any internal header
     (an installed header must compile against include/ alone);
  3. an include of "ula/X.h" where include/ula/X.h does not exist, or of "<layer>/X.h"
     where src/<layer>/X.h does not exist;
  4. a consumer of the installed package that includes anything but "ula/..." headers;
  5. a CUDA, CUB or Thrust header, or a .cu file, outside src/kernels/ and
     src/backend/cuda/ (docs/ARCHITECTURE.md, "Layers": nothing above the backend and the
     kernels includes a CUDA header), and <mpi.h> outside src/tp/mpi/;
  6. a public header that names a class of src/ (an internal class): the one exception is
     the `internal::` namespace, whose single accessor (src/space/space_access.h) is how
     the step reaches a space's state.

Usage: check_layering.py [SOURCE_ROOT]   exit 0 when clean, 1 with one line per violation.
       check_layering.py --self-test      builds a small tree with one violation of each
                                          rule and checks that each is reported, and no more.
"""
import os
import re
import sys
import tempfile

LAYERS = ["core", "backend", "kernels", "policy", "space", "step", "attention", "tp", "indexer",
          "unified", "prefix", "model", "config", "workload", "serving", "verify"]
TOP = "top"  # tools/, python/: above every layer

# Public headers that no .cc of the same name implements: the layer they belong to.
HEADER_LAYER = {
    "check": "core",
    "host_device": "core",  # ULA_HD: host and device code share the headers below
    "ids": "core",
    "location": "core",
    "location_bits": "core",  # the one location layout, device-callable
    "tier": "core",
    "step_arrays": "core",
    "step_stats": "step",  # the one stats type of every step (DP, TP)  # plain arrays: read by the kernels and the engine step above
    "tp_fabric": "backend",  # the transport interface between ranks; src/tp implements it
    "tp_mpi": "tp",  # src/tp/mpi/tp_mpi.cc, the optional MPI engine
    "prefix_events": "prefix",  # the prefix caches' event types (prefix_cache.h, kv_event_publisher.h)
}

# Where accelerator headers may appear (rule 5).
CUDA_DIRS = ("src/kernels/", "src/backend/cuda/")
CUDA_HEADER_RE = re.compile(r"^(cuda\.h|cuda_runtime(_api)?\.h|cuda_fp16\.h|cuda_bf16\.h|cuda/|cub/|thrust/|nv/)")
MPI_DIRS = ("src/tp/mpi/",)

INCLUDE_RE = re.compile(r'^\s*#\s*include\s+(["<])([^">]+)[">]', re.M)
LINK_RE = re.compile(r"\bula_([a-z_]+)\b")
SOURCE_EXT = (".h", ".cc", ".cu", ".cuh", ".cpp")
# A class or struct defined (not only declared): `class X {`, `struct X : Base {`, `class X final {`.
CLASS_DEF_RE = re.compile(r"^\s*(?:class|struct)\s+([A-Z]\w*)\s*(?:final\s*)?(?:\{|:(?!:))", re.M)
COMMENT_RE = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
WORD_RE = re.compile(r"(?<![\w:])([A-Z]\w*)\b(?!\s*\()")  # a type's name, not a call


def layer_dir(root, layer):
    return os.path.join(root, "src", layer)


def layer_of_path(rel):
    """The layer of a file under src/, or None."""
    parts = rel.split("/")
    if parts[0] != "src" or len(parts) < 3:
        return None
    return parts[1] if parts[1] in LAYERS else None


def public_owners(root):
    owners = dict(HEADER_LAYER)
    for layer in LAYERS:
        d = layer_dir(root, layer)
        if os.path.isdir(d):
            for name in os.listdir(d):
                if name.endswith(".cc"):
                    owners.setdefault(name[:-3], layer)
    return owners


def walk(root, top):
    base = os.path.join(root, top)
    if not os.path.isdir(base):
        return
    for dirpath, dirnames, filenames in os.walk(base):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith((".", "build")))
        for name in sorted(filenames):
            if name.endswith(SOURCE_EXT):
                yield os.path.relpath(os.path.join(dirpath, name), root)


def check(root):
    owners = public_owners(root)
    rank = {layer: i for i, layer in enumerate(LAYERS)}
    rank[TOP] = len(LAYERS)
    errors = []

    def target_of(inc):
        """(layer, kind) of a quoted include, kind 'public' or 'internal'; None for others."""
        if inc.startswith("ula/"):
            name = os.path.splitext(os.path.basename(inc))[0]
            return owners.get(name, "?"), "public"
        top = inc.split("/")[0]
        return (top, "internal") if top in LAYERS and "/" in inc else (None, None)

    def exists(inc, kind):
        if kind == "public":
            return os.path.isfile(os.path.join(root, "include", inc))
        return os.path.isfile(os.path.join(root, "src", inc))

    scanned = []
    for top in ("src", "include", "python", "tools"):
        scanned.extend(walk(root, top))

    def classes_of(prefix):
        names = set()
        for rel in scanned:
            if rel.startswith(prefix) and rel.endswith(".h"):
                with open(os.path.join(root, rel), encoding="utf-8") as f:
                    names.update(CLASS_DEF_RE.findall(COMMENT_RE.sub("", f.read())))
        return names

    internal_classes = classes_of("src/") - classes_of("include/")
    for rel in scanned:
        with open(os.path.join(root, rel), encoding="utf-8") as f:
            text = f.read()
        if rel.startswith("include/"):
            name = os.path.splitext(os.path.basename(rel))[0]
            layer, public = owners.get(name), True
            if layer is None:
                errors.append(f"{rel}: a public header with no layer (no src/<layer>/{name}.cc; "
                              f"add it to HEADER_LAYER in scripts/check_layering.py)")
                continue
        elif rel.startswith("src/"):
            layer, public = layer_of_path(rel), False
            if layer is None:
                errors.append(f"{rel}: not in a layer's folder ({', '.join(LAYERS)})")
                continue
        else:
            layer, public = TOP, False
        if public:
            code = COMMENT_RE.sub("", text)
            code = re.sub(r'"(?:[^"\\\n]|\\.)*"', '""', code)
            code = re.sub(r"namespace\s+internal\s*\{[^{}]*\}", "", code)
            for name in sorted(set(WORD_RE.findall(code)) & internal_classes):
                errors.append(f"{rel}: a public header names the internal class {name} "
                              f"(reach a space's state through internal::SpaceAccess)")
        if rel.endswith((".cu", ".cuh")) and not rel.startswith(CUDA_DIRS):
            errors.append(f"{rel}: a CUDA source outside {' and '.join(CUDA_DIRS)}")
        for quote, inc in INCLUDE_RE.findall(text):
            if CUDA_HEADER_RE.match(inc) and not rel.startswith(CUDA_DIRS):
                errors.append(f"{rel}: includes the accelerator header {inc} outside {' and '.join(CUDA_DIRS)}")
                continue
            if inc == "mpi.h" and not rel.startswith(MPI_DIRS):
                errors.append(f"{rel}: includes mpi.h outside src/tp/mpi/")
                continue
            if quote != '"':
                continue
            target, kind = target_of(inc)
            if target is None:
                continue  # a header next to the source, or a third-party one
            if not exists(inc, kind):
                where = "include/" if kind == "public" else "src/"
                errors.append(f"{rel}: includes {inc}, which is not in {where}")
                continue
            if public and kind == "internal":
                errors.append(f"{rel}: a public header includes the internal header {inc} "
                              f"(installed headers see include/ only)")
                continue
            if target in rank and rank[target] > rank[layer]:
                errors.append(f"{rel}: layer '{layer}' includes {inc} of the higher layer '{target}'")
    for layer in LAYERS:
        cml = os.path.join(layer_dir(root, layer), "CMakeLists.txt")
        if os.path.exists(cml):
            with open(cml, encoding="utf-8") as f:
                text = re.sub(r"#.*", "", f.read())
            for dep in LINK_RE.findall(text):
                if dep in rank and rank[dep] > rank[layer]:
                    errors.append(f"{os.path.relpath(cml, root)}: layer '{layer}' links ula_{dep} of a higher layer")
    for top in ("examples/cpp", "tests/install/consumer"):
        for rel in walk(root, top):
            with open(os.path.join(root, rel), encoding="utf-8") as f:
                text = f.read()
            for quote, inc in INCLUDE_RE.findall(text):
                if quote == '"' and not inc.startswith("ula/"):
                    errors.append(f"{rel}: a consumer of the installed package includes {inc} (only ula/ headers are installed)")
                elif quote == '"' and not exists(inc, "public"):
                    errors.append(f"{rel}: includes {inc}, which is not in include/")
    return sorted(set(errors))


def self_test():
    """A tree with one violation of each rule, beside downward edges that must pass."""
    with tempfile.TemporaryDirectory() as root:
        def write(rel, text):
            p = os.path.join(root, rel)
            os.makedirs(os.path.dirname(p), exist_ok=True)
            with open(p, "w", encoding="utf-8") as f:
                f.write(text)
        write("include/ula/ids.h", "\n")
        write("include/ula/planner.h", '#include "ula/ids.h"\n#include "core/bits.h"\n')
        write("include/ula/shallow.h", '#include "ula/planner.h"\n')
        write("include/ula/space.h", '// Plans (PlannerState)\nnamespace internal { struct Access; }\n'
              'class Space {\n  friend struct internal::Access;\n  friend class PlannerState;\n};\n')
        write("src/core/space.cc", "\n")
        write("src/core/planner_state.h", "class PlannerState {\n};\nstruct Access : Base {\n};\n")
        write("src/core/ids.cc", '#include "ula/ids.h"\n')
        write("src/core/shallow.cc", "\n")
        write("src/core/bits.h", "\n")
        write("src/core/bad.cc", '#include "serving/sim.h"\n')
        write("src/serving/sim.h", '#include "ula/ids.h"\n#include "workload/rng.h"\n')
        write("src/serving/sim.cc", '#include "serving/sim.h"\n#include "core/missing.h"\n')
        write("src/workload/rng.h", "\n")
        write("src/policy/CMakeLists.txt", "ula_add_component(policy DEPS ula_core ula_step)\n")
        write("src/step/planner.cc", '#include "ula/ids.h"\n#include <thrust/scan.h>\n')
        write("src/kernels/scan.h", "#include <thrust/scan.h>\n#include <cuda/atomic>\n")
        write("tools/main.cc", '#include "serving/sim.h"\n#include "ula/nope.h"\n')
        write("examples/cpp/dp.cc", '#include "ula/planner.h"\n#include "core/bits.h"\n')
        errors = check(root)
    want = sorted([
        "examples/cpp/dp.cc: a consumer of the installed package includes core/bits.h (only ula/ headers are installed)",
        "include/ula/planner.h: a public header includes the internal header core/bits.h (installed headers see include/ only)",
        "include/ula/shallow.h: layer 'core' includes ula/planner.h of the higher layer 'step'",
        "include/ula/space.h: a public header names the internal class PlannerState (reach a space's state through internal::SpaceAccess)",
        "src/core/bad.cc: layer 'core' includes serving/sim.h of the higher layer 'serving'",
        "src/policy/CMakeLists.txt: layer 'policy' links ula_step of a higher layer",
        "src/serving/sim.cc: includes core/missing.h, which is not in src/",
        "src/step/planner.cc: includes the accelerator header thrust/scan.h outside src/kernels/ and src/backend/cuda/",
        "tools/main.cc: includes ula/nope.h, which is not in include/",
    ])
    if errors != want:
        print("self-test FAILED")
        for e in sorted(set(errors) - set(want)):
            print("  unexpected:", e)
        for e in sorted(set(want) - set(errors)):
            print("  missed:    ", e)
        return 1
    print(f"self-test: all {len(want)} violations reported, the downward edges accepted")
    return 0


def main(argv):
    if len(argv) > 1 and argv[1] == "--self-test":
        return self_test()
    root = argv[1] if len(argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    errors = check(root)
    for e in errors:
        print(e)
    if errors:
        print(f"layering: {len(errors)} violations")
        return 1
    present = [l for l in LAYERS if os.path.isdir(layer_dir(root, l))]
    print(f"layering: clean (src layers {', '.join(present)}; include/, python/, tools/, consumers)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
