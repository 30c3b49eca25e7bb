#!/usr/bin/env bash
# CI step: compile gpchol's CUDA kernels (kernels_cuda/) on a machine without a GPU.
#
# The build is kernels_cuda/CMakeLists.txt, driven by `python -m gpchol.build` (the one
# build description; needs cmake, nvcc 13). The CI machine's toolkit lacks cuBLAS/cuSOLVER,
# so their headers and libraries come from the nvidia-cublas / nvidia-cusolver wheels
# (pip's cache keeps the ~700 MB of downloads between runs). Any compile error, or warning,
# fails the step; so does a library that exports more than gpchol's own C symbols (the
# static CUDA runtime must stay hidden).
#
# The CPU emulation of the kernels (kernels_cuda/emulation) is compiled by the test that
# uses it (tests/test_cuda.py, with -Wall -Wextra -Werror), which CI runs with the suite.
#
# Usage: .ci/build_cuda.sh            (from anywhere; PYTHON=... to pick the interpreter)
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYTHON="${PYTHON:-python3}"
start=$(date +%s)

echo "== installing cuBLAS/cuSOLVER wheels (headers + libraries)"
"$PYTHON" -m pip install --disable-pip-version-check --quiet \
    "nvidia-cublas>=13,<14" "nvidia-cusolver>=12,<13"
after_pip=$(date +%s)

echo "== compiling kernels_cuda (CMake + nvcc, warnings are errors)"
"$PYTHON" -m gpchol.build --werror
after_build=$(date +%s)

echo "== checking the exported symbols"
lib=gpchol/_lib/libgpchol_cuda.so
# Global (non-weak) defined symbols: only gpchol's handlers and queries.
foreign=$(nm -D --defined-only "$lib" | awk '$2 ~ /^[TDBR]$/ && $3 !~ /^gpchol_/ { print $3 }')
if [ -n "$foreign" ]; then
    echo "error: $lib exports symbols that are not gpchol's:" >&2
    echo "$foreign" | head -n 20 >&2
    exit 1
fi
if nm -D --defined-only "$lib" | awk '{ print $3 }' | grep -E '^(cuda|cu[A-Z]|__cuda)' >&2; then
    echo "error: $lib exports CUDA runtime symbols (static cudart not hidden)" >&2
    exit 1
fi
count=$(nm -D --defined-only "$lib" | awk '$2 == "T" && $3 ~ /^gpchol_/' | wc -l)
echo "   $count gpchol_* functions exported, no CUDA runtime symbols"
end=$(date +%s)

echo "== done: pip $((after_pip - start)) s, build $((after_build - after_pip)) s," \
     "total $((end - start)) s"
