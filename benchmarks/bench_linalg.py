"""Benchmark of gpchol's core: forward passes, the Murray adjoint, Gaussian log-likelihood.

Prints, for float64 and each n (median of ``--repeats`` runs after a warm-up, all
numbers of one run on one machine):

* forward time of each backend against ``jax.lax.linalg.cholesky``;
* the reverse pass (Murray's blocked adjoint, given ``L`` and ``Lbar``) over the forward;
* ``jit(value_and_grad(mvn_logpdf))`` with respect to the covariance and to a kernel
  lengthscale, for gpchol (both gradient rules) against the same function written with
  ``jnp.linalg.cholesky`` + ``jax.scipy.linalg.cho_solve`` (JAX's default rules).

Targets (issue 2, n = 4000): reverse <= 2.5x forward; value-and-gradient >= 2x faster
than the JAX default; the "tiled" forward within 1.5x of ``jax.lax.linalg.cholesky``.

Usage::

    python benchmarks/bench_linalg.py                 # n = 1000, 2000, 4000
    python benchmarks/bench_linalg.py --quick         # n = 500, 1000
    python benchmarks/bench_linalg.py --sizes 4000 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", True)

import gpchol  # noqa: E402
from gpchol._internal import backend, default_tile_size  # noqa: E402


def median_time(fn, *args, repeats=5):
    """Median wall time of ``fn(*args)`` over ``repeats`` runs after one warm-up run."""
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def problem(n, seed=0):
    """ExpSquared covariance on 3-D inputs plus noise, and data, all float64."""
    rng = np.random.default_rng(seed)
    X = jnp.asarray(rng.uniform(0, 10, (n, 3)))
    y = jnp.asarray(rng.standard_normal(n))
    return X, y


def kernel_matrix(X, lengthscale, noise=0.1):
    d2 = jnp.sum((X[:, None, :] - X[None, :, :]) ** 2, axis=-1)
    return jnp.exp(-0.5 * d2 / lengthscale**2) + noise * jnp.eye(X.shape[0])


def jax_default_logpdf(y, K):
    L = jnp.linalg.cholesky(K)
    alpha = jax.scipy.linalg.cho_solve((L, True), y)
    n = y.shape[0]
    return -0.5 * y @ alpha - jnp.sum(jnp.log(jnp.diag(L))) - 0.5 * n * jnp.log(2 * jnp.pi)


def run(sizes, repeats):
    rows = []
    for n in sizes:
        row = measure(n, repeats)
        rows.append(row)
        print_row(row)
    return rows


def measure(n, repeats):
    """All figures for one size ``n``."""
    X, y = problem(n)
    K = jax.jit(kernel_matrix)(X, 1.5)
    nb = default_tile_size(n, K.dtype)
    row = {"n": n, "tile_size": nb}

    t_lax = median_time(jax.jit(jax.lax.linalg.cholesky), K, repeats=repeats)
    row["forward_lax_s"] = t_lax
    for be in ("xla", "tiled"):
        f = jax.jit(lambda a, be=be: gpchol.cholesky(a, backend=be))
        row[f"forward_{be}_s"] = median_time(f, K, repeats=repeats)

    L = jax.jit(jnp.linalg.cholesky)(K)
    Lbar = jnp.tril(jnp.asarray(np.random.default_rng(1).standard_normal((n, n))))
    rev = jax.jit(lambda L, Lb: backend("xla").adjoint(L, Lb, nb))
    row["reverse_s"] = median_time(rev, L, Lbar, repeats=repeats)

    # value and gradient wrt the covariance
    vg_jax = jax.jit(jax.value_and_grad(jax_default_logpdf, argnums=1))
    row["vg_cov_jax_s"] = median_time(vg_jax, y, K, repeats=repeats)
    for rule in ("composed", "whole"):
        vg = jax.jit(
            jax.value_and_grad(
                lambda y, K, rule=rule: gpchol.mvn_logpdf(y, 0.0, K, gradient=rule), argnums=1
            )
        )
        row[f"vg_cov_{rule}_s"] = median_time(vg, y, K, repeats=repeats)

    # value and gradient wrt a kernel lengthscale (the covariance is built inside)
    def lml_jax(ell):
        return jax_default_logpdf(y, kernel_matrix(X, ell))

    def lml_ours(ell, rule):
        return gpchol.mvn_logpdf(y, 0.0, kernel_matrix(X, ell), gradient=rule)

    ell = jnp.asarray(1.5)
    row["vg_ell_jax_s"] = median_time(jax.jit(jax.value_and_grad(lml_jax)), ell, repeats=repeats)
    for rule in ("composed", "whole"):
        vg = jax.jit(jax.value_and_grad(lambda e, rule=rule: lml_ours(e, rule)))
        row[f"vg_ell_{rule}_s"] = median_time(vg, ell, repeats=repeats)
    return row


def print_row(r):
    fwd = r["forward_xla_s"]
    print(
        f"n={r['n']:6d} (tile {r['tile_size']}): lax.cholesky {r['forward_lax_s'] * 1e3:8.1f} ms | "
        f"xla {r['forward_xla_s'] / r['forward_lax_s']:4.2f}x lax, "
        f"tiled {r['forward_tiled_s'] / r['forward_lax_s']:4.2f}x lax | "
        f"reverse/forward {r['reverse_s'] / fwd:4.2f} "
        f"(reverse/lax {r['reverse_s'] / r['forward_lax_s']:4.2f})"
    )
    for wrt in ("cov", "ell"):
        j = r[f"vg_{wrt}_jax_s"]
        c, w = r[f"vg_{wrt}_composed_s"], r[f"vg_{wrt}_whole_s"]
        print(
            f"          value+grad wrt {wrt:3s}: JAX default {j * 1e3:8.1f} ms "
            f"({j / r['forward_lax_s']:4.1f}x fwd) | gpchol composed {c * 1e3:8.1f} ms "
            f"({j / c:4.2f}x faster) | whole-likelihood {w * 1e3:8.1f} ms ({j / w:4.2f}x faster)"
        )
    sys.stdout.flush()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--sizes", type=int, nargs="+", default=[1000, 2000, 4000])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--quick", action="store_true", help="n = 500, 1000; 3 repeats")
    p.add_argument("--json", help="also write the figures to this JSON file")
    args = p.parse_args(argv)
    sizes, repeats = (args.sizes, args.repeats)
    if args.quick:
        sizes, repeats = [500, 1000], 3
    print(
        f"gpchol {gpchol.__version__}, jax {jax.__version__}, {jax.default_backend()}, "
        f"{os.cpu_count()} CPUs, {platform.processor() or platform.machine()}; float64; "
        f"median of {repeats} after warm-up"
    )
    rows = run(sizes, repeats)
    if args.json:
        meta = {
            "command": " ".join([sys.executable, *sys.argv]),
            "jax": jax.__version__,
            "gpchol": gpchol.__version__,
            "cpus": os.cpu_count(),
            "machine": platform.machine(),
            "date": time.strftime("%Y-%m-%d"),
        }
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
