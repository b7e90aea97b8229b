#!/usr/bin/env bash
# gpu-build.sh: builds, on a machine with the CUDA toolkit (no GPU needed), the prebuilt
# folder that scripts/gpu-check.sh runs on a bare GPU machine (docs/BENCHMARKS.md, "GPU check").
#
# The GPU machine has the CUDA driver, toolkit and CMake but none of this project's Debian
# packages and reaches no registry, so the folder carries everything but glibc and the driver:
#   - nvcc for sm_90 only (the H200), Release, ULA_WITH_MPI=OFF, ULA_BUILD_PYTHON=OFF, the
#     Google Benchmark micro-benchmarks on (ula_bench);
#   - linked statically where Debian ships an archive: the CUDA runtime (libcudart_static.a,
#     through CUDA_cudart_LIBRARY), GoogleTest (libgtest.a), fmt compiled header-only
#     (FMT_HEADER_ONLY: Debian ships no libfmt.a; --as-needed then drops libfmt.so);
#   - the shared libraries Debian ships only as .so (libstdc++, libgcc_s, libgomp,
#     libbenchmark, libcrypto) copied into $DIST/lib, found through each binary's RPATH $ORIGIN/../lib.
#     RPATH, not RUNPATH (-Wl,--disable-new-dtags): a RUNPATH covers only the binary's own
#     dependencies, an RPATH also those of the libraries it loads (libbenchmark's libstdc++), and
#     the copied libraries carry none of their own. After collecting, every binary is checked
#     with ldd: each library that is neither glibc's nor the driver's resolves inside $DIST/lib;
#   - only the CUDA-relevant targets: the tests of the CUDA forms and of the OpenMP kernels,
#     the cuda backend's test, the `ula` program (bench planner, bench gather, verify) and
#     ula_bench; stripped, then the folder is measured and refused above GPU_DIST_MAX_MIB
#     (default 60: the device machine takes at most 64 MiB with the working tree).
# Output: $DIST (default gpu-dist/, ignored by git) with bin/, lib/ and MANIFEST.txt (commit,
# toolkit, sizes, each binary's dynamic dependencies). Build tree: $BUILD (default build-gpu/).
# The build is slow on a shared machine: GPU_BUILD_JOBS (default 1) and nice 10. Ninja when it
# is installed (Debian's ninja-build), Unix Makefiles otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${GPU_BUILD_DIR:-build-gpu}
DIST=${GPU_DIST_DIR:-gpu-dist}
JOBS=${GPU_BUILD_JOBS:-1}
MAX_MIB=${GPU_DIST_MAX_MIB:-60}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
# [target] -> the file name the build gives it
TESTS=(cuda_backend_test device_step_test tp_device_step_test policy_test step_conformance_test tp_step_conformance_test)
PROGRAMS=(ula_cli ula_bench)
declare -A FILE_OF=([ula_cli]=ula)

if [[ ! -x $CUDA_HOME/bin/nvcc ]]; then
  echo "gpu-build: no nvcc under $CUDA_HOME (set CUDA_HOME)" >&2
  exit 2
fi
GENERATOR="Unix Makefiles"
command -v ninja >/dev/null 2>&1 && GENERATOR=Ninja
if [[ -f $BUILD/CMakeCache.txt ]]; then  # a tree keeps the generator it was made with
  GENERATOR=$(sed -n 's/^CMAKE_GENERATOR:INTERNAL=//p' "$BUILD/CMakeCache.txt")
fi
start=$(date +%s)
mkdir -p "$BUILD"
# GNU ld, not the test trees' gold (cmake/UlaLinker.cmake): the folder's RPATH and the copied
# libraries' loading were tried as the GPU machine runs them with ld's output.
echo "== configure $BUILD ($GENERATOR; sm_90, Release, MPI off, Python off, bench on)"
nice -n 10 cmake -S . -B "$BUILD" -G "$GENERATOR" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CUDA_COMPILER="$CUDA_HOME/bin/nvcc" -DULA_WITH_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DULA_LINKER=DEFAULT -DULA_WITH_MPI=OFF -DULA_BUILD_PYTHON=OFF -DULA_BUILD_BENCH=ON -DULA_BUILD_TESTS=ON -DULA_BUILD_TOOLS=ON \
  -DCUDA_cudart_LIBRARY="$CUDA_HOME/lib64/libcudart_static.a" \
  -DCMAKE_CXX_FLAGS="-DFMT_HEADER_ONLY=1" \
  -DCMAKE_EXE_LINKER_FLAGS="-Wl,--as-needed -Wl,--disable-new-dtags" \
  '-DCMAKE_BUILD_RPATH=$ORIGIN/../lib' >"$BUILD/configure.log" 2>&1 ||
  { tail -40 "$BUILD/configure.log"; exit 1; }

echo "== build (-j$JOBS, nice 10): ${PROGRAMS[*]} ${TESTS[*]}"
nice -n 10 cmake --build "$BUILD" -j"$JOBS" --target "${PROGRAMS[@]}" "${TESTS[@]}"
echo "built in $(( $(date +%s) - start )) s"

echo "== collect into $DIST"
rm -rf "$DIST"
mkdir -p "$DIST/bin" "$DIST/lib"
for t in "${PROGRAMS[@]}" "${TESTS[@]}"; do
  name=${FILE_OF[$t]:-$t}
  path=$(find "$BUILD" -type f -name "$name" -perm -u+x -not -path '*/CMakeFiles/*' | head -1)
  if [[ -z $path ]]; then
    echo "gpu-build: target $t built no file named $name under $BUILD" >&2
    exit 1
  fi
  cp "$path" "$DIST/bin/$name"
  strip --strip-unneeded "$DIST/bin/$name"
done
# Shared libraries that are neither glibc's nor the driver's travel in lib/.
is_system() {
  case "$1" in
    linux-vdso.so*|ld-linux*|libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|libcuda.so*) return 0 ;;
  esac
  return 1
}
for b in "$DIST"/bin/*; do
  while read -r so _ path _; do
    [[ $path == /* ]] || continue
    is_system "$so" && continue
    if [[ ! -e $DIST/lib/$so ]]; then
      cp -L "$path" "$DIST/lib/$so"
      strip --strip-unneeded "$DIST/lib/$so"
    fi
  done < <(ldd "$b" | grep '=>')
done
# Every binary loads from the folder: each library that is not glibc's or the driver's resolves
# inside $DIST/lib (through the RPATH, also for the copied libraries' own dependencies), and
# none is missing.
abs_lib=$(cd "$DIST/lib" && pwd -P)
for b in "$DIST"/bin/*; do
  if [[ $(readelf -d "$b" | grep -c '(RUNPATH)') != 0 || $(readelf -d "$b" | grep -c '(RPATH)') != 1 ]]; then
    echo "gpu-build: $b has a RUNPATH or no RPATH (needs -Wl,--disable-new-dtags):" >&2
    readelf -d "$b" | grep -E 'R(UN)?PATH' >&2
    exit 1
  fi
  while read -r so _ path _; do
    is_system "$so" && continue
    [[ $path == /* ]] && path=$(realpath "$path") || path="nowhere (not found)"
    if [[ $path != "$abs_lib/$so" ]]; then
      echo "gpu-build: $(basename "$b") loads $so from $path, not from $DIST/lib" >&2
      exit 1
    fi
  done < <(ldd "$b" | grep '=>')
done
if ls "$DIST"/lib/libfmt* "$DIST"/lib/libcudart* >/dev/null 2>&1; then
  echo "gpu-build: fmt or the CUDA runtime was linked dynamically (expected static):" "$DIST"/lib/* >&2
  exit 1
fi

{
  echo "gpu-dist: prebuilt for scripts/gpu-check.sh (scripts/gpu-build.sh)"
  echo "commit: $(git rev-parse HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (with uncommitted changes)')"
  echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "nvcc: $("$CUDA_HOME/bin/nvcc" --version | tail -1)"
  echo "cuda architectures: 90"
  echo "glibc: $(ldd --version | head -1)"
  echo "glibc needed: $(for f in "$DIST"/bin/* "$DIST"/lib/*; do objdump -T "$f"; done |
    grep -o 'GLIBC_[0-9.]*' | sort -V -u | tail -1) (the GPU machine's must be at least this)"
  echo
  echo "sizes (bytes):"
  (cd "$DIST" && find bin lib -type f -printf '%s %p\n' | sort -k2)
  echo
  echo "dynamic dependencies:"
  for b in "$DIST"/bin/*; do
    echo "$(basename "$b"): $(readelf -d "$b" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | tr '\n' ' ')"
  done
} >"$DIST/MANIFEST.txt"

bytes=$(du -sb "$DIST" | cut -f1)
mib=$(( (bytes + 1048575) / 1048576 ))
echo "gpu-dist: $bytes bytes ($mib MiB) in $DIST: $(ls "$DIST/bin" | tr '\n' ' ')"
echo "total: $bytes bytes" >>"$DIST/MANIFEST.txt"
if (( mib > MAX_MIB )); then
  echo "gpu-build: $DIST is $mib MiB, over the $MAX_MIB MiB limit" >&2
  exit 1
fi
echo "gpu-build: done in $(( $(date +%s) - start )) s"
