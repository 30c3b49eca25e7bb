#!/usr/bin/env bash
# CI step: compile gpchol's CUDA kernels (kernels_cuda/) on a machine without a GPU.
#
# The CI machine has nvcc 13 but its toolkit lacks cuBLAS/cuSOLVER, so their headers and
# libraries come from the nvidia-cublas / nvidia-cusolver wheels (pip's cache keeps the
# ~700 MB of downloads between runs). Any compile error, or warning, fails the step.
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

echo "== compiling kernels_cuda with nvcc"
"$PYTHON" -m gpchol.build --werror
after_nvcc=$(date +%s)

echo "== compiling the CPU emulation of the kernels (used by tests/test_cuda.py)"
CXX="${CXX:-g++}"
emu_out="$(mktemp -d)"
trap 'rm -rf "$emu_out"' EXIT
"$CXX" -O2 -std=c++17 -shared -fPIC -Wall -Wextra -Werror -I kernels_cuda/include \
    kernels_cuda/emulation/emulate.cpp -o "$emu_out/libgpchol_emu.so"
end=$(date +%s)

echo "== done: pip $((after_pip - start)) s, nvcc $((after_nvcc - after_pip)) s," \
     "emulation $((end - after_nvcc)) s, total $((end - start)) s"
