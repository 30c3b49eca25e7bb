r"""Initial inducing inputs for a sparse GP: greedy conditional variance or k-means.

*Greedy conditional variance* (Burt, Rasmussen & van der Wilk 2020, JMLR 21(131), Alg. 1)
is a pivoted Cholesky of ``k(X, X)``: the next point is the one whose prior variance
conditioned on the points chosen so far, ``d_i = k(x_i, x_i) - ||L^-1 k(Z, x_i)||^2``, is
largest. One step costs ``O(c m)`` for ``c`` candidate rows; the ``(m, c)`` rows of the
partial factor are kept. *k-means* runs Lloyd's iterations from ``m`` distinct random
points. Both search the distinct rows of ``X`` (repeated rows would give equal inducing
inputs), above ``candidates`` rows a uniform random subset of that many, so their memory
is ``O(candidates * m)`` whatever ``n``.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from gpchol._base.validate import as_inputs, check_finite_rows, check_int, is_concrete
from gpchol.kernels import Kernel, as_kernel

__all__ = ["inducing_points"]


@partial(jax.jit, static_argnames=("m",))
def _greedy(kernel: Any, X: jax.Array, m: int) -> jax.Array:
    c = X.shape[0]
    d0 = kernel.diag(X).astype(X.dtype)

    def step(i: jax.Array, state: tuple[jax.Array, ...]) -> tuple[jax.Array, ...]:
        L, d, idx = state
        j = jnp.argmax(d)
        krow = kernel(X[j][None, :], X)[0].astype(X.dtype)
        # rows not filled yet are zero, so the whole product is the filled rows' one
        e = (krow - L[:, j] @ L) / jnp.sqrt(jnp.maximum(d[j], jnp.finfo(X.dtype).tiny))
        e = jnp.where(d[j] > 0, e, 0.0)
        L = L.at[i].set(e)
        d = (d - e * e).at[j].set(-jnp.inf)  # chosen: never again
        return L, d, idx.at[i].set(j.astype(jnp.int32))

    init = (jnp.zeros((m, c), X.dtype), d0, jnp.zeros((m,), jnp.int32))
    return jax.lax.fori_loop(0, m, step, init)[2]


@partial(jax.jit, static_argnames=("m", "iters"))
def _kmeans(X: jax.Array, key: jax.Array, m: int, iters: int) -> jax.Array:
    C = X[jax.random.choice(key, X.shape[0], (m,), replace=False)]

    def step(_: int, C: jax.Array) -> jax.Array:
        d2 = jnp.sum(X * X, 1)[:, None] - 2.0 * X @ C.T + jnp.sum(C * C, 1)[None, :]
        one = jax.nn.one_hot(jnp.argmin(d2, axis=1), m, dtype=X.dtype)  # (c, m)
        count = jnp.sum(one, 0)
        total = one.T @ X
        return jnp.where(count[:, None] > 0, total / jnp.maximum(count, 1.0)[:, None], C)

    return jax.lax.fori_loop(0, iters, step, C)


def _distinct_candidates(X: jax.Array, m: int, cap: int, key: jax.Array) -> jax.Array:
    """At most ``cap`` distinct rows of ``X`` (in their order), a uniform random subset when
    there are more; at least ``m`` of them, or a ``ValueError``. Repeated rows (repeated
    measurements) made both methods return repeated inducing inputs, whose ``k(Z, Z)`` is
    singular: the greedy one once the distinct rows ran out (conditional variance 0), and
    k-means from two equal starting centres. A traced ``X`` or ``key`` (inside ``jit`` or
    ``vmap``) cannot be searched for repeats: its rows are taken as they are."""

    def distinct(A: jax.Array) -> jax.Array:
        first = np.unique(np.asarray(A), axis=0, return_index=True)[1]
        return A if first.size == A.shape[0] else A[np.sort(first)]

    n = X.shape[0]
    picked = X[jnp.sort(jax.random.choice(key, n, (cap,), replace=False))] if n > cap else X
    if not (is_concrete(X) and is_concrete(key)):  # under jit or vmap: rows as they are
        return picked
    out = distinct(picked)
    if out.shape[0] < m and n > cap:  # the subset had too few: all of X's distinct rows
        out = distinct(X)
        if out.shape[0] > cap:
            out = out[jnp.sort(jax.random.choice(key, out.shape[0], (cap,), replace=False))]
    if out.shape[0] < m:
        raise ValueError(
            f"X has {out.shape[0]} distinct rows, fewer than m = {m} inducing inputs (equal "
            "inducing inputs make k(Z, Z) singular); pass m <= "
            f"{out.shape[0]}."
        )
    return out


def inducing_points(
    X: Any,
    m: int,
    *,
    kernel: Kernel | None = None,
    method: str = "greedy",
    key: jax.Array | None = None,
    candidates: int = 20_000,
    iters: int = 30,
) -> jax.Array:
    """``m`` inducing inputs chosen from the training inputs, to start a :class:`SparseGP`.

    Args:
        X: ``(n, d)`` training inputs (``(n,)`` read as ``(n, 1)``).
        m: number of inducing inputs, ``1 <= m <=`` the number of distinct rows of ``X``
            (the inducing inputs are distinct).
        kernel: the prior's kernel (needed by ``"greedy"``).
        method: ``"greedy"`` (conditional variance, Burt et al. 2020: rows of ``X``) or
            ``"kmeans"`` (cluster centres, not rows of ``X``).
        key: a ``jax.random`` key for the candidate subset and k-means' start (default
            ``jax.random.PRNGKey(0)``).
        candidates: above this many rows, a random subset of this size is searched.
        iters: Lloyd iterations of ``"kmeans"``.

    Returns:
        ``(m, d)`` inducing inputs.

    Raises:
        ValueError: ``m`` out of range or above the number of distinct rows of ``X``, an
            unknown method, ``"greedy"`` without a kernel, NaN in ``X``.
        TypeError: ``m``, ``candidates`` or ``iters`` not an int (a bool is not).

    Example:
        >>> import jax.numpy as jnp
        >>> from gpchol import inducing_points, kernels
        >>> X = jnp.linspace(0.0, 1.0, 100)
        >>> Z = inducing_points(X, 5, kernel=kernels.ExpSquared(0.2))
        >>> Z.shape
        (5, 1)
    """
    X = as_inputs(X)
    n = X.shape[0]
    m = check_int(m, "m", "the number of inducing inputs", minimum=0, kind="an int")
    if not 1 <= m <= n:
        raise ValueError(
            f"m (the number of inducing inputs) must be between 1 and n = {n}; got {m}."
        )
    candidates = check_int(candidates, "candidates", "the rows searched")
    iters = check_int(iters, "iters", "Lloyd iterations", minimum=0)
    if method not in ("greedy", "kmeans"):
        raise ValueError(f"method must be 'greedy' or 'kmeans'; got {method!r}.")
    check_finite_rows(X, "X", "drop or impute those rows first")
    key = jax.random.PRNGKey(0) if key is None else key
    sub, key2 = jax.random.split(key)
    X = _distinct_candidates(X, m, max(candidates, m), sub)
    if method == "kmeans":
        return _kmeans(X, key2, m, iters)
    if kernel is None:
        raise ValueError("method='greedy' needs the kernel: inducing_points(X, m, kernel=k).")
    if not isinstance(kernel, Kernel):
        kernel = as_kernel(kernel)
    return X[_greedy(kernel, X, m)]
