"""Sharded Gaussian-process log marginal likelihood: tiles built where they live."""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from . import _api, _core, _local

__all__ = ["gaussian_log_likelihood"]


def _as_kernel_fn(kernel_fn):
    """``(params, X1, X2) -> block`` from a kernel object or such a function."""
    from .._kernels import Kernel

    if isinstance(kernel_fn, Kernel):
        return lambda params, X1, X2: params(X1, X2)
    if callable(kernel_fn):
        return kernel_fn
    raise TypeError(
        "kernel_fn must be a gpchol kernel (pass it also as params) or a function "
        f"(params, X1, X2) -> block; got {type(kernel_fn).__name__}."
    )


def _body(grid, n, kfn, params, X, y, noise):
    """Per-device: build own cyclic tiles, factor, solve, log-likelihood (replicated)."""
    pr, pc = _local.coords(grid)
    gr, gc = _local.global_rows(grid, pr), _local.global_cols(grid, pc)
    rr, rc = gr < n, gc < n
    Xr = jnp.take(X, jnp.minimum(gr, n - 1), axis=0)
    Xc = jnp.take(X, jnp.minimum(gc, n - 1), axis=0)
    K = kfn(params, Xr, Xc).astype(X.dtype)
    on = gr[:, None] == gc[None, :]
    K = K + jnp.where(on, noise, 0.0).astype(K.dtype)
    real = rr[:, None] & rc[None, :]
    K = jnp.where(real, K, jnp.where(on, 1.0, 0.0).astype(K.dtype))
    L, status = _core._chol_cyclic(grid, K)
    N = grid.nt * grid.T
    yp = jnp.zeros((N, 1), y.dtype).at[:n, 0].set(y)
    z = _local.trsv_lower_local(grid, L, yp)
    ld = _local.logdet_local(grid, L)
    return -0.5 * jnp.sum(z**2) - 0.5 * ld - 0.5 * n * math.log(2 * math.pi), status


def gaussian_log_likelihood(kernel_fn, params, X, y, noise, mesh, T_A=None, *, axes=None):
    r"""Exact GP log marginal likelihood ``log N(y | 0, K(X, X) + noise I)``, sharded.

    Each device evaluates the kernel only on its own block-cyclic covariance tiles (row and
    column subsets of the replicated ``X``), factors them with the sharded Cholesky and
    solves; no device holds an ``n x n`` array. Differentiate it with ``jax.grad`` /
    ``jax.value_and_grad`` with respect to ``params``, ``noise``, ``X`` or ``y``: the
    reverse pass runs Murray's blocked adjoint on the same tiles, and the kernel's own VJP
    tile by tile.

    Args:
        kernel_fn: a gpchol kernel object (then ``params`` must be the kernel itself, a
            pytree: ``params(X1, X2)`` gives a block) or a function
            ``(params, X1, X2) -> (n1, n2) block``.
        params: the kernel parameters (a pytree), differentiated through.
        X: ``(n, d)`` inputs (replicated; small).
        y: ``(n,)`` observations (zero mean; subtract a mean yourself).
        noise: observation noise variance (scalar), added to the diagonal.
        mesh: a 2-D mesh; its first two axes are the process rows and columns (or pass
            ``axes=(row_axis, col_axis)``).
        T_A: tile size (default picks one).
        axes: optional ``(row_axis, col_axis)`` names.

    Returns:
        ``(value, status)``: the scalar log-likelihood (NaN if not positive definite) and
        the Cholesky status.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from gpchol import distributed as gd, kernels
        >>> mesh = jax.make_mesh((1, 1), ("r", "c"))
        >>> X = jnp.linspace(0.0, 1.0, 16)[:, None]
        >>> k = kernels.ExpSquared(lengthscale=0.3)
        >>> v, s = gd.gaussian_log_likelihood(k, k, X, jnp.sin(6 * X[:, 0]), 0.1, mesh, 4)
        >>> int(s)
        0
    """
    kfn = _as_kernel_fn(kernel_fn)
    X = jnp.asarray(X)
    if X.ndim == 1:
        X = X[:, None]
    if X.ndim != 2:
        raise ValueError(f"X must have shape (n, d); got {tuple(X.shape)}.")
    n = X.shape[0]
    y = jnp.asarray(y, X.dtype)
    if y.shape != (n,):
        raise ValueError(f"y must have shape ({n},) to match X; got {tuple(y.shape)}.")
    r, c = axes if axes is not None else tuple(_api._default_spec(mesh))
    _api._axes_of(P(r, c), mesh)
    Pr = mesh.shape[r] if r else 1
    Pc = mesh.shape[c] if c else 1
    Lc = math.lcm(Pr, Pc)
    if T_A is None:
        T_A = max(1, min(256, -(-n // (2 * Lc))))
    if isinstance(T_A, bool) or not isinstance(T_A, int) or T_A < 1:
        raise ValueError(f"T_A (tile size) must be an int >= 1; got {T_A!r}.")
    tiles = -(-n // T_A)
    nt = -(-tiles // Lc) * Lc
    grid = _local.Grid(Pr, Pc, nt, T_A, r, c)
    body = functools.partial(_body, grid, n, kfn)
    f = jax.shard_map(
        body, mesh=mesh, in_specs=(P(), P(), P(), P()), out_specs=(P(), P()), check_vma=False
    )
    return f(params, X, y, jnp.asarray(noise, X.dtype))
