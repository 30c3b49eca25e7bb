"""The scale problem's log marginal likelihood by SciPy's LAPACK in one n x n buffer.

An independent reference for the largest-n runs (issue 34), where
:func:`benchmarks._common.reference_numpy` (several n x n buffers) does not fit: the
covariance ``K = a exp(-|x - x'|^2 / (2 l^2)) + s I`` of :func:`benchmarks._common.problem`
is built row block by row block into one C-ordered float64 buffer, factored in place by
LAPACK ``dpotrf`` (through ``scipy.linalg.lapack``, no gpchol and no JAX), and the value is
``-1/2 y^T K^-1 y - sum log L_ii - n/2 log 2 pi``. With ``--grad`` the buffer is then
inverted in place (``dpotri``) and the gradient with respect to ``(a, l, s)`` is
``1/2 sum_ij (alpha alpha^T - K^-1)_ij dK_ij/dt`` (Rasmussen & Williams 2006, eq. 5.9),
summed over the lower triangle block by block (off-diagonal terms twice).

Peak memory is one n x n buffer plus O(n * block) temporaries. SciPy's bundled OpenBLAS
crashes in its threaded ``dpotrf`` at large n on the project's CPU machine
(``benchmarks/results/cpu-scale-2026-11-30.md``), so run it with
``OPENBLAS_NUM_THREADS=1`` there::

    OPENBLAS_NUM_THREADS=1 python -m benchmarks.reference_blockwise --n 45255

It prints one JSON line: ``n``, ``value``, ``grad`` (or null), seconds and peak RSS.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from benchmarks import _common as C


def build_lower(X: np.ndarray, theta, block: int) -> np.ndarray:
    """``K`` (n, n) C-ordered; only the lower triangle and diagonal are written."""
    a, ell, s = (float(t) for t in theta)
    n = X.shape[0]
    K = np.empty((n, n))
    for r0 in range(0, n, block):
        r1 = min(n, r0 + block)
        d2 = np.zeros((r1 - r0, r1))
        for k in range(X.shape[1]):  # the same summation order as _common.reference_numpy
            d2 += (X[r0:r1, None, k] - X[None, :r1, k]) ** 2
        K[r0:r1, :r1] = a * np.exp(-0.5 * d2 / ell**2)
        K[np.arange(r0, r1), np.arange(r0, r1)] += s
    return K


def cross(Xs: np.ndarray, X: np.ndarray, theta) -> np.ndarray:
    """``k(Xs, X)`` (m, n), the same summation order as :func:`build_lower`."""
    a, ell, _ = (float(t) for t in theta)
    d2 = np.zeros((Xs.shape[0], X.shape[0]))
    for k in range(X.shape[1]):
        d2 += (Xs[:, None, k] - X[None, :, k]) ** 2
    return a * np.exp(-0.5 * d2 / ell**2)


def value_and_grad(X, y, theta=C.THETA, block: int = 1024, grad: bool = False, test=None):
    """``(value, grad or None)``; ``K``'s buffer is factored (and inverted) in place.

    With ``test`` (m, d) test inputs, returns ``(value, grad, (mean (m,), variance (m,)))``:
    the posterior mean ``k(Xs, X) alpha`` and latent variance ``a - |L^-1 k(X, Xs)|^2``.
    """
    from scipy.linalg import lapack

    a, ell, _ = (float(t) for t in theta)
    n = X.shape[0]
    K = build_lower(X, theta, block)
    # K.T is Fortran-ordered: LAPACK works on it without a copy; its upper triangle is
    # K's lower triangle, so 'U' there leaves L (K = L L^T) in K's lower triangle.
    F = K.T
    _, info = lapack.dpotrf(F, lower=0, clean=0, overwrite_a=1)
    if info != 0:
        raise RuntimeError(f"dpotrf failed: info = {info}")
    diag = np.diagonal(K).copy()
    alpha, info = lapack.dpotrs(F, y, lower=0)
    if info != 0:
        raise RuntimeError(f"dpotrs failed: info = {info}")
    value = -0.5 * float(y @ alpha) - float(np.sum(np.log(diag))) - 0.5 * n * np.log(2 * np.pi)
    post = None
    if test is not None:
        Ks = cross(test, X, theta)
        v, info = lapack.dtrtrs(F, Ks.T, lower=0, trans=1)  # U^T v = k(X, Xs), U = L^T
        if info != 0:
            raise RuntimeError(f"dtrtrs failed: info = {info}")
        post = (Ks @ alpha, a - np.sum(v * v, axis=0))
    if not grad:
        return (value, None) if test is None else (value, None, post)
    _, info = lapack.dpotri(F, lower=0, overwrite_c=1)
    if info != 0:
        raise RuntimeError(f"dpotri failed: info = {info}")
    g = np.zeros(3)
    for r0 in range(0, n, block):
        r1 = min(n, r0 + block)
        d2 = np.zeros((r1 - r0, r1))
        for k in range(X.shape[1]):
            d2 += (X[r0:r1, None, k] - X[None, :r1, k]) ** 2
        E = np.exp(-0.5 * d2 / ell**2)
        W = np.outer(alpha[r0:r1], alpha[:r1]) - K[r0:r1, :r1]  # lower rows of K^-1
        # weights: 2 below the diagonal (the symmetric partner), 1 on it, 0 above
        wgt = np.tril(np.full((r1 - r0, r1), 2.0), k=r0 - 1)
        wgt[np.arange(r1 - r0), np.arange(r0, r1)] = 1.0
        WE = np.where(wgt > 0, wgt * W * E, 0.0)  # the upper triangle is never written
        g[0] += 0.5 * float(np.sum(WE))
        g[1] += 0.5 * a * float(np.sum(WE * d2)) / ell**3
        g[2] += 0.5 * float(np.sum(np.diagonal(W[:, r0:r1])))
    return (value, g) if test is None else (value, g, post)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, required=True)
    p.add_argument("--block", type=int, default=1024)
    p.add_argument("--grad", action="store_true", help="also the gradient (dpotri: 2x longer)")
    p.add_argument(
        "--test-points",
        type=int,
        default=0,
        help="also the posterior mean and variance at the first 256 of bench_posterior's "
        "test points for m = this many",
    )
    args = p.parse_args(argv)
    X, y = C.problem(args.n)
    test = None
    if args.test_points:
        test = C.problem(args.test_points, seed=1)[0][:256]  # bench_posterior.CHECK_POINTS
    t0 = time.perf_counter()
    out = value_and_grad(X, y, block=args.block, grad=args.grad, test=test)
    value, g = out[0], out[1]
    rec = {
        "n": args.n,
        "value": value,
        "grad": None if g is None else [float(v) for v in g],
        "seconds": time.perf_counter() - t0,
        "peak_rss": C.peak_rss(),
    }
    if test is not None:
        rec["mean"] = out[2][0].tolist()
        rec["var"] = out[2][1].tolist()
    print(json.dumps(rec), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
