"""Fit a GP to columns of a CSV file through the ``gpchol`` command line, then predict.

Writes a small synthetic CSV (a noisy periodic signal) unless ``--csv`` is given, runs
``gpchol fit --csv ... --kernel SPEC`` and ``gpchol predict``, and prints the first
predictions.

Usage::

    python examples/fit_csv.py [--csv FILE --x COLS --y COL] [--kernel "rbf*periodic+white"]
                               [--steps 30] [--n 60] [--outdir DIR]
"""

from __future__ import annotations

import argparse
import os
import tempfile


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--csv", help="your CSV (default: a synthetic one)")
    ap.add_argument("--x", default="t", help="input column(s), comma-separated")
    ap.add_argument("--y", default="signal", help="target column")
    ap.add_argument("--kernel", default="rbf*periodic+white", help="kernel SPEC")
    ap.add_argument("--steps", type=int, default=30, help="max optimiser steps (default 30)")
    ap.add_argument("--n", type=int, default=60, help="synthetic data size (default 60)")
    ap.add_argument("--outdir", default=None, help="where to write files (default: a tmp dir)")
    args = ap.parse_args(argv)

    import numpy as np

    from gpchol.cli import main as gpchol_main

    outdir = args.outdir or tempfile.mkdtemp(prefix="gpchol-example-")
    os.makedirs(outdir, exist_ok=True)
    path = args.csv
    if path is None:
        rng = np.random.default_rng(0)
        t = np.sort(rng.uniform(0, 10, args.n))
        s = np.sin(2 * np.pi * t / 2.5) * np.exp(-t / 20) + 0.1 * rng.standard_normal(args.n)
        path = os.path.join(outdir, "data.csv")
        with open(path, "w") as f:
            f.write("t,signal\n" + "".join(f"{a},{b}\n" for a, b in zip(t, s, strict=True)))
    model = os.path.join(outdir, "model.json")
    rc = gpchol_main(
        [
            "fit",
            "--csv",
            path,
            "--x",
            args.x,
            "--y",
            args.y,
            "--kernel",
            args.kernel,
            "--steps",
            str(args.steps),
            "--out",
            model,
        ]
    )
    if rc not in (0, 1):
        return rc
    pred = os.path.join(outdir, "pred.csv")
    rc = gpchol_main(["predict", "--model", model, "--csv", path, "--out", pred])
    if rc != 0:  # gpchol printed why
        return rc
    with open(pred) as f:
        print("".join(f.readlines()[:6]), end="")
    print(f"files in {outdir}")
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
