#!/usr/bin/env bash
# The prepared check for a lent GPU (H200): build the CUDA kernels, call each FFI target
# once, run the tests marked `gpu`, benchmark, and report into $OUT.
#
#   bash benchmarks/gpu_check.sh [all|first|rest]      (from anywhere; no network needed)
#   GPCHOL_BENCH_ARGS="--smoke --fake-ffi" bash benchmarks/gpu_check.sh   (dry run on a CPU)
#
#   all    (default) every stage below, 540 s of limits
#   first  build and smoke only, 95 s of limits: a first device call that shows within
#          about 100 s whether the library compiles and runs, so that a fix and a second
#          call (`rest`) can follow while the machine is still warm
#   rest   build (incremental: the device machine keeps build/ between calls, so only what
#          changed is compiled), tests, bench and report, 515 s of limits
#
# Environment: GPCHOL_CUDA_ARCH (default 90: the H200 only; CI compiles the CMake default,
# 80 and 90), GPCHOL_NVCC_FLAGS (extra nvcc options, e.g. -lineinfo; a bad one, such as
# --no-such-flag, makes the build fail on purpose to try the early stop on a CPU),
# GPCHOL_BENCH_ARGS (below), PYTHON (default python3), OUT (default ./gpu_out).
#
# The machine's own python3 must have jax with CUDA, nvcc, cmake (ninja if possible) and
# the nvidia-cublas / nvidia-cusolver wheels; gpchol is used from the checkout (PYTHONPATH).
#
# Stages, each under `timeout`. The check stops (exit 1) after a failed build (with the
# build's errors in summary.txt) and after a smoke stage where no target printed OK: the
# later stages could only skip or fail, and their time is better spent on a second call.
# Otherwise a failed or cut stage is recorded and the next one runs.
#
#   build        70 s  python -m gpchol.build --arch 90 (CMake + nvcc; logs nvcc and wheel
#                      versions, and ptxas's registers and spills of every kernel)
#   smoke        25 s  each of the 8 FFI targets once on tiny inputs, one verdict per line;
#                      builds nothing (a broken library shows here, within seconds)
#   tests_small  70 s  pytest -m gpu -k gpu_small: the shared-memory kernels  } one process
#   tests_large 140 s  pytest -m gpu -k gpu_large: cuSOLVER/cuBLAS path,      } each: a CUDA
#                      scratch, handler errors, threads, > 2^31 elements      } fault cannot
#   tests_api    85 s  pytest -m gpu -k gpu_api: gpchol's public API on GPU   } poison the rest
#   bench       130 s  bench_gpu.py run --budget-s 100: n = 4096, batched, 16384, 32768
#   report       20 s  gpu_results.{md,json}
#
# Sum of the limits: 540 s, so a device call with timeout_s=600 keeps a margin of 60 s.
# (The first check on an H200, 2026-12-04, cut tests_large at 110 s and tests_api at 65 s,
# each about 90% through: JAX compiles each test's programs for the GPU.)
#
# Raw logs go to a work directory; after EVERY stage the most useful files are refreshed
# in $OUT and everything is packed into $OUT/gpu_logs.tar.gz, so that a run cut at any
# point returns what it had. $OUT never holds more than 7 files (the device tool returns
# at most 8): summary.txt (environment, stage table, why the check stopped, the build's
# errors or else each kernel's registers and spills, smoke verdicts), build.log, tests.log
# (the three pytest -v logs), bench_raw.json, gpu_results.md, gpu_results.json,
# gpu_logs.tar.gz.
set -u

MODE="${1:-all}"
case "$MODE" in
    all | first | rest) ;;
    *)
        echo "usage: bash benchmarks/gpu_check.sh [all|first|rest]" >&2
        exit 2
        ;;
esac
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export OUT="${OUT:-$PWD/gpu_out}"
mkdir -p "$OUT"
rm -f "$OUT"/summary.txt "$OUT"/build.log "$OUT"/tests.log "$OUT"/bench_raw.json \
    "$OUT"/gpu_results.md "$OUT"/gpu_results.json "$OUT"/gpu_logs.tar.gz
WORK="$(mktemp -d "${TMPDIR:-/tmp}/gpchol-gpu-check.XXXXXX")"
PY="${PYTHON:-python3}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
# Leave room for cuBLAS/cuSOLVER workspaces outside XLA's pool.
export XLA_PYTHON_CLIENT_MEM_FRACTION="${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.85}"
BENCH_ARGS="${GPCHOL_BENCH_ARGS:-}"
ARCH="${GPCHOL_CUDA_ARCH:-90}"
NVCC_FLAGS="${GPCHOL_NVCC_FLAGS:-}"
SMOKE_ARGS=""
case " $BENCH_ARGS " in *" --fake-ffi "*) SMOKE_ARGS="--fake-ffi" ;; esac
: > "$WORK/stages.tsv"
T0=$(date +%s.%N)

# stage_rc NAME: the exit code recorded for stage NAME (empty if it has not run).
stage_rc() {
    awk -F '\t' -v s="$1" '$1 == s { rc = $2 } END { print rc }' "$WORK/stages.tsv"
}

# build_errors LOG: the lines of a failed build that say why (nvcc, the host compiler,
# CMake, ninja, gpchol.build), each cut to 300 characters, without repeats. Whole words
# only: the echoed commands' -DGPCHOL_WERROR and -Werror are not errors.
build_errors() {
    grep -E -i '\b(error|fatal)\b|FAILED|undefined reference|No such file' "$1" \
        | cut -c 1-300 | awk '!seen[$0]++' | head -n 40
}

# ptxas_report LOG: one line per compiled kernel (architecture, registers per thread,
# spill stores/loads in bytes, name) from ptxas's -v output in the build log.
ptxas_report() {
    awk '
        /Compiling entry function/ { split($0, q, "\047"); name = q[2]; arch = q[4] }
        /bytes spill stores/ { stores = $5; loads = $9 }
        /Used [0-9]+ registers/ {
            for (i = 1; i < NF; i++) if ($i == "Used") regs = $(i + 1)
            printf "%s  %3s regs  spill %s/%s B  %s\n", arch, regs, stores, loads, name
        }
    ' "$1" | { if command -v c++filt > /dev/null; then c++filt; else cat; fi; } \
        | sed -e 's/gpchol::cuda:://g' -e 's/gpchol:://g' | cut -c 1-140 | sort -u
}

# refresh: the key files into $OUT, the whole work directory into the archive.
refresh() {
    {
        echo "# gpchol GPU check ($MODE): $(date -u +%Y-%m-%dT%H:%M:%SZ)"
        cat "$WORK/environment.txt" 2>/dev/null
        echo
        echo "stage	rc	seconds	(rc 124/137: cut by its time limit)"
        cat "$WORK/stages.tsv"
        if [ -f "$WORK/stopped.txt" ]; then
            echo
            cat "$WORK/stopped.txt"
        fi
        local build_rc
        build_rc=$(stage_rc build)
        if [ -n "$build_rc" ] && [ "$build_rc" != 0 ]; then
            echo
            echo "build errors (build.log):"
            build_errors "$WORK/build.log"
            echo "last lines of build.log:"
            tail -n 5 "$WORK/build.log" | cut -c 1-300
        elif [ -f "$WORK/build.log" ] && grep -q 'Used [0-9]* registers' "$WORK/build.log"; then
            echo
            echo "registers per thread and spills (ptxas -v):"
            ptxas_report "$WORK/build.log"
        fi
        if [ -f "$WORK/smoke.log" ]; then
            echo
            echo "smoke:"
            grep -E '^(OK|FAIL|SKIP|device|library|smoke)' "$WORK/smoke.log"
        fi
    } > "$OUT/summary.txt.tmp" && mv "$OUT/summary.txt.tmp" "$OUT/summary.txt"
    [ -f "$WORK/build.log" ] && cp "$WORK/build.log" "$OUT/build.log"
    local logs=()
    for g in small large api; do
        [ -f "$WORK/tests_$g.log" ] && logs+=("$WORK/tests_$g.log")
    done
    if [ "${#logs[@]}" -gt 0 ]; then
        for f in "${logs[@]}"; do echo "===== $(basename "$f")"; cat "$f"; done \
            > "$OUT/tests.log.tmp" && mv "$OUT/tests.log.tmp" "$OUT/tests.log"
    fi
    for f in bench_raw.json gpu_results.md gpu_results.json; do
        [ -f "$WORK/$f" ] && cp "$WORK/$f" "$OUT/$f.tmp" && mv "$OUT/$f.tmp" "$OUT/$f"
    done
    tar czf "$OUT/gpu_logs.tar.gz.tmp" -C "$WORK" . 2>/dev/null \
        && mv "$OUT/gpu_logs.tar.gz.tmp" "$OUT/gpu_logs.tar.gz"
    return 0
}

# stage NAME LIMIT_S COMMAND...: runs COMMAND with a time limit, logs to $WORK/NAME.log,
# appends "NAME<TAB>rc<TAB>seconds" to $WORK/stages.tsv, then refreshes $OUT.
stage() {
    local name="$1" limit="$2"
    shift 2
    echo "== $name (limit ${limit} s): $*"
    local start end rc secs
    start=$(date +%s.%N)
    timeout --kill-after=5 "$limit" "$@" > "$WORK/$name.log" 2>&1
    rc=$?
    end=$(date +%s.%N)
    secs=$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.1f", b - a }')
    printf '%s\t%s\t%s\n' "$name" "$rc" "$secs" >> "$WORK/stages.tsv"
    echo "   rc=$rc after ${secs} s; last lines:"
    tail -n 8 "$WORK/$name.log" | cut -c 1-300 | sed 's/^/   | /'
    refresh
}

# finish: the report (or the summary) on stdout, the work directory removed.
finish() {
    cat "$OUT/gpu_results.md" 2>/dev/null || cat "$OUT/summary.txt"
    local total
    total=$(awk -v a="$T0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.0f", b - a }')
    echo "gpu_check ($MODE): ${total} s in all; files in $OUT: $(cd "$OUT" && ls | tr '\n' ' ')"
    rm -rf "$WORK"
}

# stop WHY: ends the check early (exit 1), the reason in summary.txt.
stop() {
    echo "stopped: $1; the later stages were not run." > "$WORK/stopped.txt"
    echo "== $(cat "$WORK/stopped.txt")"
    refresh
    finish
    exit 1
}

{
    date -u +"%Y-%m-%dT%H:%M:%SZ"
    if command -v nvidia-smi > /dev/null; then
        nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1
    else
        echo "nvidia-smi: not available"
    fi
    (command -v nvcc && nvcc --version | tail -n 2) 2>&1 || echo "nvcc: not found"
    "$PY" - <<'EOF' 2>&1
import importlib.metadata as md
import platform
names = ["jax", "jaxlib", "jax-cuda13-plugin", "jax-cuda13-pjrt", "nvidia-cublas",
         "nvidia-cusolver", "cmake", "ninja", "numpyro", "numpy", "scipy"]
versions = []
for name in names:
    try:
        versions.append(f"{name} {md.version(name)}")
    except md.PackageNotFoundError:
        pass
print("python", platform.python_version() + ";", ", ".join(versions))
EOF
} > "$WORK/environment.txt" 2>&1
refresh

stage build 70 "$PY" -m gpchol.build --verbose --arch "$ARCH" --nvcc-flags="$NVCC_FLAGS"
[ "$(stage_rc build)" = 0 ] || stop "the build failed (rc $(stage_rc build))"
if [ "$MODE" != rest ]; then
    # shellcheck disable=SC2086
    stage smoke 25 "$PY" benchmarks/bench_gpu.py smoke --budget-s 20 $SMOKE_ARGS
    grep -q '^OK' "$WORK/smoke.log" || stop "no FFI target passed the smoke test"
fi
if [ "$MODE" = first ]; then
    echo "== first: build and smoke done; run the rest with: bash benchmarks/gpu_check.sh rest"
    finish
    exit 0
fi
# Only tests/test_cuda.py holds tests marked gpu; each group in its own process.
PYTEST=("$PY" -m pytest -m gpu tests/test_cuda.py -v -p no:cacheprovider --durations=10)
stage tests_small 70 "${PYTEST[@]}" -k gpu_small --junitxml="$WORK/pytest_small.xml"
stage tests_large 140 "${PYTEST[@]}" -k gpu_large --junitxml="$WORK/pytest_large.xml"
stage tests_api 85 "${PYTEST[@]}" -k gpu_api --junitxml="$WORK/pytest_api.xml"
# GPCHOL_BENCH_ARGS: extra arguments, e.g. "--smoke --fake-ffi" to try the script on a CPU.
# shellcheck disable=SC2086
stage bench 130 env OUT="$WORK" "$PY" benchmarks/bench_gpu.py run --budget-s 100 $BENCH_ARGS
stage report 20 env OUT="$WORK" "$PY" benchmarks/bench_gpu.py report \
    --command "benchmarks/gpu_check.sh $MODE${BENCH_ARGS:+ (GPCHOL_BENCH_ARGS=$BENCH_ARGS)}"

finish
