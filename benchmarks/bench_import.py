"""Import times in fresh processes: what every script, ``gpchol`` command and test
subprocess pays before its first line of work.

Each module is imported in a new Python process (``sys.executable``) after the modules
before it in the list, so a row is that module's own cost on top of the rows above
(``numpy``, then ``ml_dtypes``, then ``jax`` ...); the table gives the median over
``--repeats`` processes, with the versions of NumPy, ml_dtypes and JAX.

Usage::

    python -m benchmarks.bench_import [--repeats R] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

MODULES = ("numpy", "ml_dtypes", "jax", "jax.numpy", "gpchol", "gpchol.sklearn")

_CHILD = """
import importlib, json, sys, time
before, target = sys.argv[1].split(",") if sys.argv[1] else [], sys.argv[2]
for m in before:
    importlib.import_module(m)
t = time.perf_counter()
importlib.import_module(target)
print(json.dumps(time.perf_counter() - t))
"""


def _one(before: list[str], target: str) -> float:
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, ",".join(before), target],
        capture_output=True,
        text=True,
        check=True,
    )
    return float(json.loads(out.stdout.strip().splitlines()[-1]))


def _versions() -> dict[str, str]:
    code = (
        "import numpy, ml_dtypes, jax, sys; print(numpy.__version__, ml_dtypes.__version__,"
        " jax.__version__, sys.version.split()[0])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    numpy, ml_dtypes, jax, python = out.stdout.split()
    return {"numpy": numpy, "ml_dtypes": ml_dtypes, "jax": jax, "python": python}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", default=None, help="write the table here")
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error("--repeats must be a positive integer")
    record: dict = {"versions": _versions(), "repeats": args.repeats, "median_s": {}}
    print(" ".join(f"{k} {v}" for k, v in record["versions"].items()))
    print(f"{'module':<16} {'own import (median s)':>22}")
    for i, m in enumerate(MODULES):
        times = [_one(list(MODULES[:i]), m) for _ in range(args.repeats)]
        record["median_s"][m] = statistics.median(times)
        print(f"{m:<16} {record['median_s'][m]:>22.3f}", flush=True)
    total = sum(record["median_s"].values())
    print(f"{'all of them':<16} {total:>22.3f}")
    if args.json:
        from benchmarks._common import write_record

        write_record(args.json, record)
    return record


if __name__ == "__main__":
    main()
