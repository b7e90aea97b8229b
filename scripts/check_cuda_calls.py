#!/usr/bin/env python3
"""The CUDA error check: no CUDA runtime call's result goes unchecked in src/.

It reads every .cc, .cu, .cuh, .inl and .h file under src/ (comments and string literals
blanked out) and finds each CUDA runtime call, an identifier `cuda[A-Z]...` followed by `(`
(cudaGetErrorString and cudaGetErrorName, which return text, are not errors to check; a name
ending in `_t` is a type). A call is checked when one of these holds:

  1. consumed: it sits, at any depth, inside the parentheses of a checking form:
     ULA_CUDA_RETURN_IF_ERROR(...), CudaStatus(...), CudaError(...) or CudaDiscard(...)
     (src/backend/cuda/cuda_status.h; CudaDiscard is for teardown, where no caller can take
     an error);
  2. propagated: it is the whole operand of `return` (the function returns the cudaError_t,
     and such a function is declared [[nodiscard]]);
  3. stored and tested: it is the right-hand side of `NAME =` (a declaration such as
     `const cudaError_t e = cudaX(...)`, an if-initializer, or an assignment), and before
     the enclosing block ends NAME is compared with a CUDA value (`NAME != cudaSuccess`,
     `cudaErrorX == NAME`), passed first to a checking form, or returned.

Casting to void, passing the result to any other function, or dropping it are violations.
Kernel launches count too: after each `kernel<<<...>>>(...)`, a checked
cudaGetLastError() or cudaPeekAtLastError() must follow before the enclosing block ends.

Usage: check_cuda_calls.py [SOURCE_ROOT] [--allow PATH]...   (PATH relative to the root)
    exit 0 when every violation is in an allowed file, 1 otherwise; an allowed file with no
    violation (or none at all) is itself an error, so the allow list only shrinks.
check_cuda_calls.py --self-test   plants violations in a scratch tree and requires exactly
    those reported.
"""
import os
import re
import sys
import tempfile

EXTENSIONS = (".cc", ".cu", ".cuh", ".inl", ".h")
CALL_RE = re.compile(r"\b(cuda[A-Z]\w*)\s*\(")
NOT_ERRORS = {"cudaGetErrorString", "cudaGetErrorName"}
CHECKERS = {"ULA_CUDA_RETURN_IF_ERROR", "CudaStatus", "CudaError", "CudaDiscard"}
LAST_ERROR = {"cudaGetLastError", "cudaPeekAtLastError"}
LAUNCH_RE = re.compile(r"<<<[^;]*?>>>\s*\(")


def blank(text):
    """Comments, string and character literals replaced by spaces (newlines kept)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(c + " " * (j - i - 2) + c if j - i >= 2 else c)
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def block_end(text, pos):
    """The index of the `}` that closes the block holding `pos` (len(text) at file scope)."""
    depth = 0
    for i in range(pos, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            if depth == 0:
                return i
            depth -= 1
    return len(text)


def call_end(text, open_paren):
    """The index just after the `)` matching the `(` at open_paren."""
    depth = 0
    for i in range(open_paren, len(text)):
        if text[i] == "(":
            depth += 1
        elif text[i] == ")":
            depth -= 1
            if depth == 0:
                return i + 1
    return len(text)


def enclosing_parens(text, pos):
    """Positions of the `(` still open at `pos`, innermost last."""
    stack = []  # positions of open `(`; None marks an open `{` (a lambda body starts afresh)
    for i in range(pos):
        c = text[i]
        if c == "(" or c == "{":
            stack.append(i if c == "(" else None)
        elif c == ")" and stack and stack[-1] is not None:
            stack.pop()
        elif c == "}":
            while stack and stack.pop() is not None:
                pass
    inner = []
    for p in reversed(stack):
        if p is None:
            break
        inner.append(p)
    return inner[::-1]


def statement_start(text, pos, stop=";{}"):
    i = pos - 1
    while i >= 0 and text[i] not in stop:
        i -= 1
    return i + 1


def tested_later(text, name, start, end):
    body = text[start:end]
    n = re.escape(name)
    patterns = [
        rf"(?<![\w.>]){n}\s*[!=]=\s*cuda\w+",
        rf"\bcuda\w+\s*[!=]=\s*{n}(?![\w.])",
        rf"\b(?:{'|'.join(CHECKERS)})\s*\(\s*{n}(?![\w.])",
        rf"\breturn\s+{n}\s*;",
    ]
    return any(re.search(p, body) for p in patterns)


def is_checked(text, start, open_paren):
    """Whether the call whose name starts at `start` (its `(` at open_paren) is checked."""
    for p in enclosing_parens(text, start):
        m = re.search(r"(\w+)\s*$", text[:p])
        if m and m.group(1) in CHECKERS:
            return True  # rule 1
    end = call_end(text, open_paren)
    after = text[end:].lstrip()
    whole = after.startswith(";")
    before = text[statement_start(text, start):start].strip()
    if before == "return" and whole:
        return True  # rule 2
    lhs = text[statement_start(text, start, ";{}("):start].rstrip()
    if lhs.endswith("=") and (len(lhs) < 2 or lhs[-2] not in "=!<>+-*/|&^%") and (whole or after.startswith(")")):
        m = re.search(r"([A-Za-z_][\w.]*(?:->\w+)*)\s*=$", lhs)
        if m and tested_later(text, m.group(1), end, block_end(text, end)):
            return True  # rule 3
    return False


def check_file(path, rel):
    with open(path, encoding="utf-8", errors="replace") as f:
        text = blank(f.read())
    line_of = lambda pos: text.count("\n", 0, pos) + 1
    errors = []
    for m in CALL_RE.finditer(text):
        name = m.group(1)
        if name in NOT_ERRORS or name.endswith("_t"):
            continue
        if not is_checked(text, m.start(1), m.end() - 1):
            errors.append(f"{rel}:{line_of(m.start(1))}: the result of {name}() is not checked")
    for m in LAUNCH_RE.finditer(text):
        end = call_end(text, m.end() - 1)
        limit = block_end(text, end)
        ok = False
        for c in CALL_RE.finditer(text, end, limit):
            if c.group(1) in LAST_ERROR and is_checked(text, c.start(1), c.end() - 1):
                ok = True
                break
        if not ok:
            errors.append(f"{rel}:{line_of(m.start())}: a kernel launch without a checked cudaGetLastError() after it")
    return errors


def check(root, allowed=()):
    """(violations outside the allow list, violations inside it, stale allow entries)."""
    found = {}
    src = os.path.join(root, "src")
    for d, _, files in os.walk(src):
        for f in sorted(files):
            if f.endswith(EXTENSIONS):
                path = os.path.join(d, f)
                rel = os.path.relpath(path, root).replace(os.sep, "/")
                found[rel] = check_file(path, rel)
    bad, tolerated = [], []
    for rel in sorted(found):
        (tolerated if rel in allowed else bad).extend(found[rel])
    stale = [f"{a}: on the allow list but {'clean' if a in found else 'not in src/'}: remove it"
             for a in sorted(allowed) if not found.get(a)]
    return bad, tolerated, stale


OK_CC = """
#include "backend/cuda/cuda_status.h"
// cudaFree(p) in a comment, and a string: "cudaMalloc(&p, 1)"
Status A(void* p, cudaStream_t s) {
  ULA_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(p, 0, 4, s));
  Status st = CudaStatus(cudaStreamSynchronize(s), "sync");
  if (const cudaError_t e = cudaGetDevice(nullptr); e != cudaSuccess) return std::unexpected(CudaError(e, "x"));
  cudaError_t later = cudaSetDevice(0);
  Touch();
  if (cudaSuccess != later) return Fail(cudaGetErrorString(later));
  r.status = cudaEventQuery(ev);
  if (r.status == cudaErrorNotReady) return Ok();
  return st;
}
cudaError_t B(cudaStream_t s) { K<<<1, 32, 0, s>>>(1); return cudaGetLastError(); }
Holder::~Holder() { CudaDiscard(cudaFree(p_)); }
"""
BAD_CU = """
void C(void* p, cudaStream_t s) {
  cudaFree(p);
  (void)cudaMemsetAsync(p, 0, 4, s);
  Log(cudaStreamSynchronize(s));
  cudaError_t e = cudaMemcpy(p, p, 4, cudaMemcpyDefault);
  Use(e);
}
void D(cudaStream_t s) {
  K<<<1, 1, 0, s>>>();
  cudaGetLastError();
}
void E() {
  cudaError_t e = cudaDeviceSynchronize();
}
"""
BAD_INL = "inline void F() { cudaMemcpyAsync(nullptr, nullptr, 0, cudaMemcpyDefault, 0); }\n"
ALLOWED_H = "inline void G() { cudaStreamSynchronize(0); }\n"


def self_test():
    with tempfile.TemporaryDirectory() as root:
        def write(rel, text):
            p = os.path.join(root, rel)
            os.makedirs(os.path.dirname(p), exist_ok=True)
            with open(p, "w", encoding="utf-8") as f:
                f.write(text)
        write("src/backend/cuda/ok.cc", OK_CC)
        write("src/kernels/bad.cu", BAD_CU)
        write("src/kernels/bad.inl", BAD_INL)
        write("src/step/allowed.h", ALLOWED_H)
        write("src/step/clean.cc", "int H() { return 0; }\n")
        write("src/kernels/notes.txt", "cudaFree(p);\n")
        bad, tolerated, stale = check(root, {"src/step/allowed.h", "src/step/clean.cc", "src/gone.cc"})
    want_bad = [
        "src/kernels/bad.cu:3: the result of cudaFree() is not checked",
        "src/kernels/bad.cu:4: the result of cudaMemsetAsync() is not checked",
        "src/kernels/bad.cu:5: the result of cudaStreamSynchronize() is not checked",
        "src/kernels/bad.cu:6: the result of cudaMemcpy() is not checked",
        "src/kernels/bad.cu:10: a kernel launch without a checked cudaGetLastError() after it",
        "src/kernels/bad.cu:11: the result of cudaGetLastError() is not checked",
        "src/kernels/bad.cu:14: the result of cudaDeviceSynchronize() is not checked",
        "src/kernels/bad.inl:1: the result of cudaMemcpyAsync() is not checked",
    ]
    want_tolerated = ["src/step/allowed.h:1: the result of cudaStreamSynchronize() is not checked"]
    want_stale = [
        "src/gone.cc: on the allow list but not in src/: remove it",
        "src/step/clean.cc: on the allow list but clean: remove it",
    ]
    failed = False
    for what, got, want in (("violations", bad, want_bad), ("allowed", tolerated, want_tolerated),
                            ("stale", stale, want_stale)):
        if sorted(got) != sorted(want):
            failed = True
            print(f"self-test FAILED ({what})")
            for e in sorted(set(got) - set(want)):
                print("  unexpected:", e)
            for e in sorted(set(want) - set(got)):
                print("  missed:    ", e)
    if failed:
        return 1
    print(f"self-test: all {len(want_bad)} violations, {len(want_tolerated)} allowed and {len(want_stale)} stale "
          "entries reported, the checked forms accepted")
    return 0


def main(argv):
    args = argv[1:]
    if args == ["--self-test"]:
        return self_test()
    root, allowed = None, set()
    while args:
        a = args.pop(0)
        if a == "--allow" and args:
            allowed.add(args.pop(0))
        elif not a.startswith("-") and root is None:
            root = a
        else:
            print(__doc__)
            return 2
    root = root or os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    bad, tolerated, stale = check(root, allowed)
    for e in tolerated:
        print(e, "[allowed]")
    for e in bad + stale:
        print(e)
    if bad or stale:
        print(f"cuda calls: {len(bad)} unchecked outside the allow list, {len(stale)} stale allow entries")
        return 1
    if allowed:
        print(f"cuda calls: every CUDA call in src/ is checked, but {len(tolerated)} in the allowed files "
              f"({', '.join(sorted(allowed))})")
    else:
        print("cuda calls: every CUDA call in src/ is checked (no file allowed)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
