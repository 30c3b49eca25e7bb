"""The one status of every factorization: LAPACK's ``info``, the 1-based index of the
first failing pivot (0 on success), and the error raised from it."""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.typing import ArrayLike

from gpchol._base.errors import NotPositiveDefiniteError
from gpchol._linalg.blocks import blocks


def first_bad_pivot_unblocked(t: jax.Array) -> jax.Array:
    """First failing pivot (1-based) of the unblocked Cholesky of one ``(m, m)`` matrix.

    Right-looking, column by column, in a ``fori_loop``; used only on tiles known to
    fail, so its O(m^3) sequential cost is off the success path. Returns 0 if none fails.
    """
    m = t.shape[-1]
    idx = jnp.arange(m)

    def body(i: jax.Array, carry: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
        w, bad = carry
        d = w[i, i]
        ok = d > 0  # False for NaN, too
        bad = jnp.where((bad == 0) & ~ok, i + 1, bad)
        s = jnp.sqrt(jnp.where(ok, d, 1.0))
        col = jnp.where(idx > i, w[:, i] / s, 0.0)
        w = w - col[:, None] * col[None, :]
        return w, bad

    _, bad = lax.fori_loop(0, m, body, (t, jnp.int32(0)))
    return bad


def nan_where_failed(L: jax.Array, status: jax.Array) -> jax.Array:
    return jnp.where((status == 0)[..., None, None], L, jnp.nan)


def locate_failed_pivot(
    w: jax.Array, tiles0: jax.Array, first: jax.Array, starts: jax.Array, nb: int
) -> jax.Array:
    """Exact first failing pivot after a failed tiled factorization (slow path).

    For the first failed block ``j:j+nb`` of each batch element, its Schur complement is
    rebuilt from the input's diagonal tile and the (intact, finite) factor rows to its
    left, ``S = A_jj - L[j:k, :j] L[j:k, :j]^T``, and searched by
    :func:`first_bad_pivot_unblocked`. A block whose LAPACK factor failed but whose search does not
    (a float32 rounding corner) still reports its first pivot rather than success.
    """
    n = w.shape[-1]
    npad = tiles0.shape[-3] * nb
    batch = w.shape[:-2]

    def one(wb: jax.Array, tb: jax.Array, fb: jax.Array) -> jax.Array:
        start = starts[fb]
        wp = jnp.pad(wb, [(0, npad - n), (0, 0)])
        rows = lax.dynamic_slice_in_dim(wp, start, nb, axis=0)
        rows = jnp.where(jnp.arange(n) < start, rows, 0.0)
        schur = tb[fb] - rows @ rows.T
        return start + jnp.maximum(first_bad_pivot_unblocked(schur), 1)

    flat = jax.vmap(one)(
        w.reshape((-1, n, n)),
        tiles0.reshape((-1,) + tiles0.shape[-3:]),
        first.reshape(-1),
    )
    return flat.reshape(batch)


def np_first_bad_pivot(m: ArrayLike, nb: int) -> int:
    """First failing pivot (1-based) of the Cholesky of one NumPy matrix; 0 if none.

    Blocked, in NumPy, on the host: each diagonal tile is factored with
    ``np.linalg.cholesky``; the first tile that fails is searched column by column.
    """
    w = np.array(m, dtype=np.float64, copy=True)
    n = w.shape[-1]
    for j, k in blocks(n, nb):
        tile = w[j:k, j:k]
        try:
            d = np.linalg.cholesky(tile)
            if not np.all(np.isfinite(np.diagonal(d))):
                raise np.linalg.LinAlgError
        except np.linalg.LinAlgError:
            t = tile.copy()
            for i in range(k - j):
                if not t[i, i] > 0:
                    return j + i + 1
                col = t[i + 1 :, i] / np.sqrt(t[i, i])
                t[i + 1 :, i + 1 :] -= np.outer(col, col)
            return j + 1  # LAPACK failed where the search did not (rounding corner)
        if k < n:
            c = np.linalg.solve(d, w[k:, j:k].T).T  # panel: A[k:, j:k] D^-T
            w[k:, k:] -= c @ c.T
    return 0


def host_pivot_search(a: jax.Array, nb: int, failed: jax.Array) -> jax.Array:
    """Exact first failing pivot of each matrix in ``a``, computed on the host (slow path).

    Called through ``jax.pure_callback`` only when a factorization failed, so that the
    search adds no device memory or compile time to the factorization itself. ``failed``
    (``a.shape[:-2]`` booleans) says which matrices to search; the others get 0 without
    any work (under ``vmap`` the call's ``lax.cond`` becomes a ``select`` and runs for
    every batch element).
    """

    def search(x: np.ndarray, f: np.ndarray) -> np.ndarray:
        x, f = np.asarray(x), np.broadcast_to(np.asarray(f), x.shape[:-2])
        out = np.zeros(x.shape[:-2], np.int32)
        for idx in np.ndindex(out.shape):
            if f[idx]:
                out[idx] = np_first_bad_pivot(x[idx], nb)
        return out

    return jax.pure_callback(
        search,
        jax.ShapeDtypeStruct(a.shape[:-2], jnp.int32),
        a,
        failed,
        vmap_method="expand_dims",
    )


def exact_status(failed: jax.Array, rebuild: Callable[[], jax.Array], nb: int) -> jax.Array:
    """LAPACK-style status: the exact first failing pivot where ``failed`` (0 elsewhere).

    The pivot is searched on the host (:func:`host_pivot_search`) in the matrices
    ``rebuild()`` returns, only when some element failed; ``rebuild`` lets a caller that
    factored its matrix in place recompute it for this rare case instead of keeping it.
    Every factorization path reports its status through here, so they all agree.
    """
    status = lax.cond(
        jnp.any(failed),
        lambda: host_pivot_search(lax.stop_gradient(rebuild()), nb, failed),
        lambda: jnp.zeros(failed.shape, jnp.int32),
    )
    return jnp.where(failed, jnp.maximum(status, 1), 0).astype(jnp.int32)


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
