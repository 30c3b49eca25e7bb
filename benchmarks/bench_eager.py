"""First eager calls: the programs XLA compiles and the wall time, each case in a fresh process.

A user's eager call (no ``jax.jit`` of their own) of a gpchol function, and its first
eager gradient, in float64 on a fresh interpreter with no persistent compilation cache:

* **programs**: XLA compilations during the call (``/jax/core/compile/backend_compile_duration``
  events), **s**: its wall time (tracing, lowering, compiling and running);
* first the value (``f(x)``), then the reverse-mode derivative (``jax.vjp(f, x)`` and its
  pullback of ones), then the same derivative at new values of the same shape (**again**,
  which compiles nothing when the programs are cached).

Cases (``--cases``): ``cholesky`` (n = 40), ``cho_solve``, ``mvn_logpdf``, ``exact_lml``
(``GaussianProcess.log_marginal_likelihood``, n = 150, d = 2, ExpSquared, derivative in
the lengthscale and noise) and ``sgpr_bound`` (``SparseGP.elbo``, n = 150, M = 22).

Usage::

    python -m benchmarks.bench_eager [--cases cholesky,sgpr_bound] [--repeats 3] [--json F]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

CASES = ("cholesky", "cho_solve", "mvn_logpdf", "exact_lml", "sgpr_bound")

_CHILD = r"""
import json, sys, time
t_start = time.perf_counter()
import numpy as np
import jax, jax.numpy as jnp
jax.config.update("jax_enable_x64", True)
import gpchol
from gpchol import kernels

case = sys.argv[1]
names = []
jax.monitoring.register_event_duration_secs_listener(
    lambda event, secs, **kw: names.append(kw.get("fun_name"))
    if event == "/jax/core/compile/backend_compile_duration" else None
)
rng = np.random.default_rng(0)
if case in ("cholesky", "cho_solve", "mvn_logpdf"):
    n = 40
    A = rng.standard_normal((n, n))
    x = A @ A.T + n * np.eye(n)
    b = rng.standard_normal(n)
    f = {
        "cholesky": lambda s: gpchol.cholesky(s),
        "cho_solve": lambda s: gpchol.cho_solve(gpchol.cholesky(s), b),
        "mvn_logpdf": lambda s: gpchol.mvn_logpdf(b, 0.0, s),
    }[case]
else:
    X = rng.uniform(0.0, 4.0, (150, 2))
    y = np.sin(X[:, 0])
    Z = X[::7]
    x = np.array([0.6, 0.1])

    def f(p):
        k = 1.0 * kernels.ExpSquared(p[0])
        if case == "exact_lml":
            return gpchol.GaussianProcess(k, X, noise=p[1]).log_marginal_likelihood(y)
        return gpchol.SparseGP(k, X, inducing=Z, noise=p[1]).elbo(y)

x = jnp.asarray(x)
x2 = x * 1.01
jax.block_until_ready((x, x2))


def gradient(x):
    value, pullback = jax.vjp(f, x)
    return pullback(jnp.ones_like(value))


out = {}
for label, run in (("value", lambda: f(x)), ("gradient", lambda: gradient(x)),
                   ("again", lambda: gradient(x2))):
    names.clear()
    t = time.perf_counter()
    jax.block_until_ready(run())
    out[label] = {"s": time.perf_counter() - t, "programs": len(names)}
print(json.dumps(out))
"""


def run_case(case: str) -> dict:
    """One fresh process: ``{value|gradient|again: {s, programs}}``."""
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, case],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args(argv)
    cases = [c for c in args.cases.split(",") if c]
    unknown = sorted(set(cases) - set(CASES))
    if unknown:
        ap.error(f"unknown case(s) {unknown}; choose from {', '.join(CASES)}")
    if args.repeats < 1:
        ap.error("--repeats must be >= 1")
    record: dict = {"repeats": args.repeats, "cases": {}}
    print(f"{'case':12s} {'value':>16s} {'gradient':>16s} {'again':>16s}  (programs, median s)")
    for case in cases:
        runs = [run_case(case) for _ in range(args.repeats)]
        row = {}
        for label in ("value", "gradient", "again"):
            row[label] = {
                "programs": runs[0][label]["programs"],
                "median_s": statistics.median(r[label]["s"] for r in runs),
            }
        record["cases"][case] = row
        cells = [f"{row[k]['programs']:4d} {row[k]['median_s']:9.3f} s" for k in row]
        print(f"{case:12s} " + " ".join(f"{c:>16s}" for c in cells), flush=True)
    if args.json:
        from benchmarks._common import command_line, machine_info, versions

        record.update(machine=machine_info(), versions=versions(), command=command_line())
        Path(args.json).write_text(json.dumps(record, indent=1) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
