#!/usr/bin/env bash
# The prepared check for a lent GPU (H200): build the CUDA kernels, run the tests marked
# `gpu`, benchmark, and write $OUT/gpu_results.json and $OUT/gpu_results.md.
#
#   benchmarks/gpu_check.sh            (from the repository root; no network needed)
#
# The machine's own python3 must have jax with CUDA, nvcc, and the nvidia-cublas /
# nvidia-cusolver wheels; gpchol is used from the checkout (PYTHONPATH), not installed.
# Each stage runs under `timeout`; a failed or timed-out stage is recorded and the next
# one runs. Whole script: under 8 minutes (stage limits 100 + 150 + 190 + 30 s).
set -u

cd "$(dirname "${BASH_SOURCE[0]}")/.."
export OUT="${OUT:-$PWD/gpu_out}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
# Leave room for cuBLAS/cuSOLVER workspaces outside XLA's pool.
export XLA_PYTHON_CLIENT_MEM_FRACTION="${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.85}"

: > "$OUT/stages.tsv"
rm -f "$OUT/pytest_gpu.xml" "$OUT/bench_raw.json"

# stage NAME LIMIT_S COMMAND...: runs COMMAND with a time limit, logs to $OUT/NAME.log and
# appends "NAME<TAB>rc<TAB>seconds" to $OUT/stages.tsv.
stage() {
    local name="$1" limit="$2"
    shift 2
    echo "== $name (limit ${limit} s): $*"
    local start end rc
    start=$(date +%s.%N)
    timeout --kill-after=10 "$limit" "$@" > "$OUT/$name.log" 2>&1
    rc=$?
    end=$(date +%s.%N)
    local secs
    secs=$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.1f", b - a }')
    printf '%s\t%s\t%s\n' "$name" "$rc" "$secs" >> "$OUT/stages.tsv"
    echo "   rc=$rc after ${secs} s; last lines:"
    tail -n 8 "$OUT/$name.log" | sed 's/^/   | /'
}

{
    date -u +"%Y-%m-%dT%H:%M:%SZ"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 || true
    command -v nvcc && nvcc --version 2>&1 | tail -n 2
    "$PY" -c "import jax; print('jax', jax.__version__)" 2>&1
} > "$OUT/environment.txt" 2>&1

stage build 100 "$PY" -m gpchol.build --verbose
stage tests 150 "$PY" -m pytest -m gpu tests/ -v -p no:cacheprovider \
    --junitxml="$OUT/pytest_gpu.xml"
# GPCHOL_BENCH_ARGS: extra arguments, e.g. "--smoke --fake-ffi" to try the script on a CPU.
# shellcheck disable=SC2086
stage bench 190 "$PY" benchmarks/bench_gpu.py run --budget-s 160 ${GPCHOL_BENCH_ARGS:-}
stage report 30 "$PY" benchmarks/bench_gpu.py report --command "benchmarks/gpu_check.sh $*"

cat "$OUT/gpu_results.md" 2>/dev/null || echo "no report was written (see $OUT/report.log)"
