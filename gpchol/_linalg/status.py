"""The one status of every factorization: LAPACK's ``info``, the 1-based index of the
first failing pivot (0 on success), its search, the conditioning diagnostic, and the
error raised from the status.

The status of a factorization is *defined* as reference LAPACK ``potrf``'s ``info`` for
the same matrix in the same precision (float32 or float64), called as XLA and
``scipy.linalg.lapack.?potrf(a, lower=1)`` call it: the first pivot that is not positive,
a NaN pivot included (reference ``dpotrf2`` tests ``ajj <= 0 || disnan(ajj)``; OpenBLAS's
own ``potrf``, which SciPy and jaxlib ship, misses NaN pivots and gpchol adds that test).
An ``inf`` pivot is positive: like LAPACK, the factorization goes on and fails later only
if a NaN or non-positive pivot follows.

On the CPU this holds exactly, whatever the backend, tile size or ``vmap``: XLA's own
Cholesky is that ``potrf``, the Gaussian likelihoods call it in place through gpchol's
compiled handlers (:mod:`gpchol._cpu.ffi`), and every other factorization, when it fails
or comes near failing, asks the same ``potrf`` for the status (:func:`exact_status`). On
other platforms (the GPU) the search runs gpchol's tiled factorization in XLA operations
instead: the first failing pivot in the working precision, by that blocking.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.typing import ArrayLike, DTypeLike

from gpchol._base.errors import NotPositiveDefiniteError
from gpchol._base.platform import platform_dependent
from gpchol._cpu import ffi as cpu_ffi
from gpchol._linalg.tiled import potrf_tiled

__all__ = [
    "exact_status",
    "near_failure",
    "pivot_rcond",
    "raise_if_failed",
    "singular_threshold",
]


def exact_status(
    mask: jax.Array,
    rebuild: Callable[[], jax.Array],
    nb: int,
    fallback: Callable[[], jax.Array] | None = None,
) -> jax.Array:
    """LAPACK's status of the matrices ``rebuild()`` returns, searched where ``mask``.

    Runs only when some element is masked (one ``lax.cond``; under ``vmap`` it becomes a
    ``select``, and the compiled search then skips the unmasked elements itself), so the
    success path pays nothing. ``rebuild`` lets a caller that factored its matrix in
    place recompute it for this rare case instead of keeping it alive.

    Args:
        mask: ``(...)`` booleans: where a factorization failed or came near failing.
        rebuild: ``() -> (..., n, n)`` the matrices that were factored.
        nb: tile size of the XLA search (platforms other than the CPU).
        fallback: ``() -> status`` to use instead of the XLA search off the CPU (a
            backend that already located its failed pivot).

    Returns:
        int32 ``(...)``: LAPACK ``potrf``'s ``info`` where ``mask``, 0 elsewhere.
    """

    def elsewhere(m: jax.Array) -> jax.Array:
        if fallback is not None:
            return fallback()
        return potrf_tiled(lax.stop_gradient(rebuild()), nb)[1]

    def on_cpu(m: jax.Array) -> jax.Array:
        return cpu_ffi.potrf_info(lax.stop_gradient(rebuild()), m)

    def search() -> jax.Array:
        if cpu_ffi.cpu_unavailable_reason() is None:
            s = platform_dependent(mask, cpu=on_cpu, default=elsewhere)
        else:
            s = elsewhere(mask)
        return jnp.where(mask, s, 0).astype(jnp.int32)

    return lax.cond(jnp.any(mask), search, lambda: jnp.zeros(mask.shape, jnp.int32))


def pivot_rcond(L: jax.Array) -> jax.Array:
    """Reciprocal condition estimate from a Cholesky factor: ``(min_j L_jj / max_j L_jj)^2``.

    The squared diagonal of ``L`` holds the pivots ``d_j`` (the Schur complements met by the
    factorization), and ``lambda_min(A) <= d_j <= max_i A_ii <= lambda_max(A)``; so this
    ratio is never below the true ``1 / cond_2(A)``: when it is tiny, ``A`` is certainly
    numerically singular. It costs ``O(n)``. 0 for a failed or non-finite factor.

    Args:
        L: ``(..., n, n)`` lower Cholesky factor.

    Returns:
        ``(...)`` in ``[0, 1]``.

    Example:
        >>> import jax.numpy as jnp
        >>> float(pivot_rcond(jnp.array([[2.0, 0.0], [1.0, 0.5]])))
        0.0625
    """
    return diagonal_rcond(jnp.abs(jnp.diagonal(L, axis1=-2, axis2=-1)))


def diagonal_rcond(d: jax.Array) -> jax.Array:
    """:func:`pivot_rcond` from the factor's diagonal ``d`` (``(..., n)``, non-negative)."""
    if d.shape[-1] == 0:
        return jnp.ones(d.shape[:-1], d.dtype)
    lo, hi = jnp.min(d, axis=-1), jnp.max(d, axis=-1)
    ok = jnp.all(jnp.isfinite(d), axis=-1) & (hi > 0)
    return jnp.where(ok, (lo / jnp.where(ok, hi, 1.0)) ** 2, 0.0)


def singular_threshold(n: int, dtype: DTypeLike) -> float:
    """``n * eps``: a pivot ratio (:func:`pivot_rcond`) below it means numerically singular.

    Example:
        >>> import numpy as np
        >>> singular_threshold(1000, np.float64)
        2.220446049250313e-13
    """
    return max(n, 1) * float(np.finfo(dtype).eps)


def near_failure(L: jax.Array, diag: jax.Array) -> jax.Array:
    """``(...)`` booleans: a factorization that failed, or whose smallest pivot is so close
    to zero that another order of the same arithmetic (LAPACK's blocking rather than
    gpchol's tiles) could fail on it.

    The pivots ``d_j = L_jj^2`` of two backward-stable orderings differ by at most about
    ``(n + 1) eps A_jj`` (Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd
    ed., Thm. 10.3: ``A + dA = L L^T`` with ``|dA| <= gamma_{n+1} |L| |L^T|``, whose diagonal
    is ``gamma_{n+1} A_jj``); twice that is the margin used here.
    """
    n = L.shape[-1]
    eps = float(np.finfo(np.dtype(L.dtype)).eps)
    d = jnp.diagonal(L, axis1=-2, axis2=-1) ** 2
    ad = jnp.abs(diag)
    close = d <= 2.0 * (n + 1) * eps * ad
    return jnp.any(close | ~jnp.isfinite(d), axis=-1)


def raise_if_failed(a: ArrayLike, status: ArrayLike, jitter: tuple[float, ...] | None) -> None:
    status = np.asarray(status)
    if not np.any(status != 0):
        return
    bad = np.argwhere(status != 0)
    index = tuple(int(i) for i in bad[0]) if status.ndim else ()
    pivot = int(status[index]) if status.ndim else int(status)
    a_el = np.asarray(a)[index] if index else np.asarray(a)
    diag = np.diagonal(a_el)
    min_diag = float(np.min(diag)) if diag.size else float("nan")
    where = f" (batch element {index}, {bad.shape[0]} failed in all)" if index else ""
    tried = f" after trying jitter {jitter}" if jitter else ""
    hint = (
        "try a larger jitter, e.g. jitter=(1e-6, 1e-4, 1e-2) scaled to your matrix"
        if jitter
        else "add explicit jitter, e.g. `gpchol.cholesky(a, jitter=(1e-8, 1e-6, 1e-4))`"
    )
    raise NotPositiveDefiniteError(
        f"matrix is not positive definite{where}{tried}: the leading minor of order "
        f"{pivot} is not positive definite (pivot {pivot}, 1-based); the smallest diagonal "
        f"entry of the input is {min_diag:.6g}. Check for NaN/inf or duplicated inputs, "
        f"use float64, or {hint}.",
        pivot=pivot,
        batch_index=index,
        min_diagonal=min_diag,
        jitter=jitter or (),
    )
