#!/usr/bin/env bash
# The prepared check for a lent GPU (H200): build the CUDA kernels, run the tests marked
# `gpu`, benchmark, and write $OUT/gpu_results.json and $OUT/gpu_results.md.
#
#   benchmarks/gpu_check.sh            (from the repository root; no network needed)
#
# The machine's own python3 must have jax with CUDA, nvcc, and the nvidia-cublas /
# nvidia-cusolver wheels; gpchol is used from the checkout (PYTHONPATH), not installed.
# Each stage runs under `timeout`; a failed or timed-out stage is recorded and the next
# one runs. Whole script: under 9 minutes (stage limits 90 + 210 + 170 + 30 s), so give
# the device call a timeout_s of 600. The build takes ~36 s on 2 cores here; the ~110 GPU
# tests each compile 2-4 small XLA programs (GPU compiles), hence the larger test stage.
#
# The device tool returns at most 8 files from $OUT, so the last step packs the raw logs
# into $OUT/gpu_logs.tar.gz and leaves 5 files: gpu_results.{md,json} (the report, with
# log tails), tests.log (pytest -v, --durations), bench_raw.json and the archive.
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

stage build 90 "$PY" -m gpchol.build --verbose
# Only tests/test_cuda.py holds tests marked gpu: collecting the whole suite would import
# every test module (and stop the run at the first module whose imports fail there).
stage tests 210 "$PY" -m pytest -m gpu tests/test_cuda.py -v -p no:cacheprovider \
    --durations=25 --junitxml="$OUT/pytest_gpu.xml"
# GPCHOL_BENCH_ARGS: extra arguments, e.g. "--smoke --fake-ffi" to try the script on a CPU.
# shellcheck disable=SC2086
stage bench 170 "$PY" benchmarks/bench_gpu.py run --budget-s 140 ${GPCHOL_BENCH_ARGS:-}
stage report 30 "$PY" benchmarks/bench_gpu.py report --command "benchmarks/gpu_check.sh $*"

cat "$OUT/gpu_results.md" 2>/dev/null \
    || echo "no report was written (see report.log in $OUT/gpu_logs.tar.gz)"

# At most 8 files come back from $OUT: pack everything but the key files into one archive.
(
    cd "$OUT" || exit 1
    packed=()
    for f in *; do
        case "$f" in
            gpu_results.md | gpu_results.json | tests.log | bench_raw.json | gpu_logs.tar.gz) ;;
            *) packed+=("$f") ;;
        esac
    done
    if [ "${#packed[@]}" -gt 0 ] && tar czf gpu_logs.tar.gz "${packed[@]}"; then
        rm -rf -- "${packed[@]}"
    fi
    echo "files in $OUT: $(ls | tr '\n' ' ')"
)
