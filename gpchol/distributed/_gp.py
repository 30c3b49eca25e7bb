"""Sharded Gaussian-process log marginal likelihood: tiles built where they live.

The likelihood and its gradient run inside ``shard_map``; each device builds, factors and
differentiates only its own block-cyclic covariance tiles. The derivative is a
``custom_vjp`` around the whole sharded computation (derivation at :func:`_loglik_bwd`),
so that JAX's autodiff keeps nothing of the kernel evaluation: the residuals are the
factor's local blocks and two vectors, and the backward pass evaluates the kernel's VJP
one local tile row at a time.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import PartitionSpec as P
from jax.typing import ArrayLike

from gpchol._base.validate import (
    check_finite_rows,
    check_int,
    check_scalar_or_vector,
    is_concrete,
)
from gpchol._linalg.gaussian import LOG_2PI
from gpchol.distributed import _api, _local

__all__ = ["gaussian_log_likelihood"]


def as_kernel_fn(kernel_fn: Any) -> Callable[[Any, jax.Array, jax.Array], jax.Array]:
    """``(params, X1, X2) -> block`` from a callable pytree (a kernel) or such a function.

    This layer knows no kernel classes: an object whose pytree leaves are not the object
    itself (a registered pytree, such as a gpchol kernel, passed also as ``params``) is
    called as ``params(X1, X2)``; a plain callable is the block-building function.
    """
    if not callable(kernel_fn):
        raise TypeError(
            "kernel_fn must be a gpchol kernel (pass it also as params) or a function "
            f"(params, X1, X2) -> block; got {type(kernel_fn).__name__}."
        )
    if jax.tree_util.tree_leaves(kernel_fn) != [kernel_fn]:
        return _call_kernel
    return kernel_fn


def _call_kernel(params: Any, X1: jax.Array, X2: jax.Array) -> jax.Array:
    return params(X1, X2)


@dataclasses.dataclass(frozen=True)
class Setup:
    """Static description of one likelihood: grid, data size, kernel, mesh specs."""

    grid: _local.Grid
    n: int
    kfn: Callable
    mesh: _api.AnyMesh

    @property
    def spec(self) -> P:
        return P(self.grid.row_axis, self.grid.col_axis)


def _smap(s: Setup, body: Callable[..., Any], in_specs: Any, out_specs: Any) -> Callable[..., Any]:
    return jax.shard_map(body, mesh=s.mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False)


def indices(s: Setup) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """Global padded row/column indices of the local block and their 'real' flags."""
    pr, pc = _local.coords(s.grid)
    gr, gc = _local.global_rows(s.grid, pr), _local.global_cols(s.grid, pc)
    return gr, gc, gr < s.n, gc < s.n


def kernel_block(s: Setup, params: Any, X1: jax.Array, X2: jax.Array) -> jax.Array:
    return s.kfn(params, X1, X2).astype(X1.dtype)


def cov_block(s: Setup, params: Any, X: jax.Array, noise: jax.Array) -> jax.Array:
    """This device's cyclic block of the padded ``K + diag(noise)`` (identity on the padding).

    ``noise``: ``(n,)`` replicated, one variance per data point.
    """
    gr, gc, rr, rc = indices(s)
    Xr = jnp.take(X, jnp.minimum(gr, s.n - 1), axis=0)
    Xc = jnp.take(X, jnp.minimum(gc, s.n - 1), axis=0)
    K = kernel_block(s, params, Xr, Xc)
    on = gr[:, None] == gc[None, :]
    noise_r = jnp.take(noise, jnp.minimum(gr, s.n - 1))
    K = K + jnp.where(on, noise_r[:, None], 0.0).astype(K.dtype)
    real = rr[:, None] & rc[None, :]
    return jnp.where(real, K, jnp.where(on, 1.0, 0.0).astype(K.dtype))


def _fwd_body(
    s: Setup, with_residuals: bool, params: Any, X: jax.Array, y: jax.Array, noise: jax.Array
) -> tuple[jax.Array, ...]:
    """Per device: own tiles, factor, solve, log-likelihood (replicated), residuals."""
    g = s.grid
    K = cov_block(s, params, X, noise)
    L, status = _local.potrf_local(g, K)
    D = [_local.diag_tile(g, L, k) for k in range(g.nt)]
    N = g.nt * g.T
    yp = jnp.zeros((N, 1), y.dtype).at[: s.n, 0].set(y)
    z = _local.trsv_lower_local(g, L, yp, D)
    ld = _local.logdet_local(g, L)
    value = -0.5 * jnp.sum(z**2) - 0.5 * ld - 0.5 * s.n * LOG_2PI
    if not with_residuals:
        return value, status
    alpha = _local.trsv_upper_local(g, L, z, D)
    return value, status, L, z, alpha


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _loglik(
    s: Setup, params: Any, X: jax.Array, y: jax.Array, noise: jax.Array
) -> tuple[jax.Array, jax.Array]:
    body = functools.partial(_fwd_body, s, False)
    X, y, noise = (_api.replicated(v, s.mesh) for v in (X, y, noise))
    return _smap(s, body, (P(), P(), P(), P()), (P(), P()))(params, X, y, noise)


def factor(
    s: Setup, params: Any, X: jax.Array, y: jax.Array, noise: jax.Array
) -> tuple[jax.Array, ...]:
    """``(value, status, L, z, alpha)``: the likelihood with what it leaves behind.

    ``L`` is the factor in its block-cyclic layout, as one ``(N, N)`` array sharded
    ``P(row_axis, col_axis)`` whose local blocks are the devices' cyclic blocks (``N`` the
    padded size); ``z = L^-1 y`` and ``alpha = K^-1 y`` are replicated ``(N, 1)``, zero on
    the padding. Not differentiated itself (the likelihood's rule is :func:`_loglik_bwd`).
    """
    body = functools.partial(_fwd_body, s, True)
    out_specs = (P(), P(), s.spec, P(), P())
    X, y, noise = (_api.replicated(v, s.mesh) for v in (X, y, noise))
    return tuple(_smap(s, body, (P(), P(), P(), P()), out_specs)(params, X, y, noise))


def _loglik_fwd(
    s: Setup, params: Any, X: jax.Array, y: jax.Array, noise: jax.Array
) -> tuple[tuple[jax.Array, jax.Array], tuple[Any, ...]]:
    value, status, L, z, alpha = factor(s, params, X, y, noise)
    return (value, status), (params, X, noise, L, z, alpha)


# Derivation of the backward pass. With z = L^-1 y and alpha = L^-T z = K^-1 y, the value
# is v = -z^T z / 2 - sum_i log L_ii - n log(2 pi) / 2. Since dz = -L^-1 dL z,
#     dv = z^T L^-1 dL z - sum_i dL_ii / L_ii = alpha^T dL z - sum_i dL_ii / L_ii,
# so Lbar = alpha z^T - diag(1 / L_ii) (its lower triangle is what counts): a rank-one
# term plus a diagonal, built on each tile from the replicated vectors. Murray's blocked
# adjoint (arXiv:1602.07527; _local.adjoint_local) turns it into Abar, the exact
# transpose of the factorization's tangent map, which reads the lower triangle of K:
#     dv = sum_{i >= j} Abar_ij dK_ij.
# K is symmetric, so no symmetrisation is needed: the cotangent of every kernel
# parameter is sum_{i >= j} Abar_ij dK_ij / dtheta, i.e. the kernel's own VJP applied to
# the local tiles of Abar (lower part, real rows and columns), summed over devices; the
# noise variance of point i gets Abar_ii; X gets the VJP through both kernel arguments; y gets
# dv/dy = -K^-1 y = -alpha. The kernel tiles are recomputed from X one local tile row at
# a time, so the backward pass holds L, Abar (in place of Lbar) and O(n T) besides.
def _loglik_bwd(
    s: Setup, res: tuple[Any, ...], cts: tuple[jax.Array, Any]
) -> tuple[Any, jax.Array, jax.Array, jax.Array]:
    params, X, noise, L, z, alpha = res
    vbar = jnp.asarray(cts[0], L.dtype)
    body = functools.partial(_bwd_body, s)
    in_specs = (P(), P(), P(), s.spec, P(), P(), P())
    pbar, Xbar, nbar = _smap(s, body, in_specs, (P(), P(), P()))(
        params, X, noise, L, z, alpha, vbar
    )
    ybar = (-vbar * alpha[: s.n, 0]).astype(X.dtype)
    return pbar, Xbar, ybar, nbar.astype(noise.dtype)


_loglik.defvjp(_loglik_fwd, _loglik_bwd)


def _bwd_body(
    s: Setup,
    params: Any,
    X: jax.Array,
    noise: jax.Array,
    L: jax.Array,
    z: jax.Array,
    alpha: jax.Array,
    vbar: jax.Array,
) -> tuple[Any, jax.Array, jax.Array]:
    g = s.grid
    gr, gc, rr, rc = indices(s)
    on = gr[:, None] == gc[None, :]
    a_r = jnp.take(alpha[:, 0], gr)
    z_c = jnp.take(z[:, 0], gc)
    inv_d = jnp.where(on & rr[:, None], 1.0 / jnp.where(on, L, 1.0), 0.0)
    Lbar = vbar * (a_r[:, None] * z_c[None, :] - inv_d)
    Abar = _local.adjoint_local(g, L, Lbar)
    keep = (gr[:, None] >= gc[None, :]) & rr[:, None] & rc[None, :]
    G = jnp.where(keep, Abar, jnp.zeros((), Abar.dtype))
    # noise_i enters K_ii only: its cotangent is Abar_ii (one n-vector over the mesh)
    d_loc = jnp.sum(jnp.where(on, G, 0.0), axis=1)
    N = g.nt * g.T
    nbar = _local.psum(jnp.zeros((N,), G.dtype).at[gr].add(d_loc), g.axes)[: s.n]
    pbar, Xbar = _kernel_vjp(s, params, X, G)
    return pbar, Xbar, nbar


def _kernel_vjp(s: Setup, params: Any, X: jax.Array, G: jax.Array) -> tuple[Any, jax.Array]:
    """``(params_bar, X_bar)`` of ``sum(G * K_local)``, one local tile row at a time."""
    g, n, T = s.grid, s.n, s.grid.T
    pr, pc = _local.coords(g)
    gr, gc = _local.global_rows(g, pr), _local.global_cols(g, pc)
    gr, gc = jnp.minimum(gr, n - 1), jnp.minimum(gc, n - 1)
    Xc = jnp.take(X, gc, axis=0)
    leaves, tdef = jax.tree.flatten(params)
    diff = [jnp.issubdtype(jnp.result_type(x), jnp.inexact) for x in leaves]
    dleaves = [x for x, d in zip(leaves, diff, strict=True) if d]

    def kblock(dl: list[jax.Array], X1: jax.Array, X2: jax.Array) -> jax.Array:
        it = iter(dl)
        full = [next(it) if d else x for x, d in zip(leaves, diff, strict=True)]
        return kernel_block(s, jax.tree.unflatten(tdef, full), X1, X2)

    def row(
        i: jax.Array, carry: tuple[Any, jax.Array, jax.Array]
    ) -> tuple[Any, jax.Array, jax.Array]:
        pb, xb, xcb = carry
        rows = lax.dynamic_slice_in_dim(gr, i * T, T)
        Gi = lax.dynamic_slice_in_dim(G, i * T, T, axis=0)
        _, vjp = jax.vjp(kblock, dleaves, jnp.take(X, rows, axis=0), Xc)
        dp, dxi, dxc = vjp(Gi)
        pb = [a + b for a, b in zip(pb, dp, strict=True)]
        return pb, xb.at[rows].add(dxi), xcb + dxc

    init = ([jnp.zeros_like(x) for x in dleaves], jnp.zeros_like(X), jnp.zeros_like(Xc))
    pb, xb, xcb = lax.fori_loop(0, g.mr, row, init)
    xb = xb.at[gc].add(xcb)
    pb, xb = _local.psum((pb, xb), g.axes)
    it = iter(pb)
    full = [next(it) if d else None for d in diff]
    return jax.tree.unflatten(tdef, full), xb


def mean_values(mean: Any, X: jax.Array, *, training: bool = True) -> jax.Array:
    """The prior mean at ``X`` as ``(n,)``: ``None`` (zero), a number, a function
    ``X -> (n,)``, or (at the ``training`` inputs only) an ``(n,)`` array."""
    n = X.shape[0]
    if mean is None:
        return jnp.zeros((n,), X.dtype)
    v = jnp.asarray(mean(X) if callable(mean) else mean)
    if not training and not callable(mean) and v.shape not in ((), (1,)):
        raise ValueError(
            "the posterior's mean is an array of per-training-point values; predictions at "
            "new inputs need a constant or a mean function (X -> (n,)) instead."
        )
    if v.shape not in ((), (1,), (n,)):
        raise ValueError(
            f"mean must be a number, an ({n},) array or a function X -> ({n},); got "
            f"values of shape {tuple(v.shape)}."
            if training
            else f"the mean function gave shape {tuple(v.shape)} at {n} test inputs; it must "
            f"give ({n},)."
        )
    return jnp.broadcast_to(v.astype(X.dtype), (n,))


def noise_vector(noise: ArrayLike, n: int, dtype: Any, name: str = "noise") -> jax.Array:
    """``noise`` (a scalar or ``(n,)`` variance) as ``(n,)``; differentiable (a broadcast)."""
    v = jnp.asarray(noise, dtype)
    check_scalar_or_vector(v.shape, n, f"{name} (the observation-noise variance)", "per point")
    if is_concrete(v):
        a = np.asarray(v)
        if not (np.all(np.isfinite(a)) and np.all(a >= 0)):
            # a negative noise factored fine and gave variances below the prior's
            raise ValueError(
                f"{name} (the observation-noise variance) must be finite and >= 0; got "
                f"{a if a.ndim == 0 else 'an array with negative or non-finite values'}."
            )
    return jnp.broadcast_to(v, (n,))


def prepare(
    kernel_fn: Any,
    X: ArrayLike,
    y: ArrayLike,
    noise: ArrayLike,
    mean: Any,
    mesh: _api.AnyMesh,
    T_A: int | None,
    axes: tuple[str | None, str | None] | None,
) -> tuple[Setup, jax.Array, jax.Array, jax.Array]:
    """Validate the likelihood's arguments: ``(Setup, X (n, d), y - m(X) (n,), noise (n,))``."""
    kfn = as_kernel_fn(kernel_fn)
    X = jnp.asarray(X)
    if not jnp.issubdtype(X.dtype, jnp.inexact):
        X = X.astype(jnp.result_type(float))
    if X.ndim == 1:
        X = X[:, None]
    if X.ndim != 2:
        raise ValueError(f"X must have shape (n, d); got {tuple(X.shape)}.")
    n = X.shape[0]
    if n == 0:
        raise ValueError("X has no rows (n = 0); the likelihood of no data is not defined here.")
    y = jnp.asarray(y, X.dtype)
    if y.shape != (n,):
        raise ValueError(f"y must have shape ({n},) to match X; got {tuple(y.shape)}.")
    check_finite_rows(X, "X", "drop or impute those rows first")
    check_finite_rows(y[:, None], "y", "drop or impute those points first")
    r, c = axes if axes is not None else tuple(_api.default_spec(mesh))
    _api.axes_of(P(r, c), mesh)
    Pr = mesh.shape[r] if r else 1
    Pc = mesh.shape[c] if c else 1
    Lc = math.lcm(Pr, Pc)
    if T_A is None:
        # 16 tiles (at least 4 lcm(Pr, Pc)): more tiles compile slower for no gain in
        # run time (benchmarks/results/design-measurements.md)
        T_A = _api.default_tile(n, Pr, Pc, tiles=16)
    T_A = check_int(T_A, "T_A", "tile size", strict=False)
    most = -(-n // Lc)  # larger tiles only add padding (lcm(Pr, Pc) tiles at the least)
    if T_A > most:
        raise ValueError(
            f"T_A = {T_A} is larger than n / lcm(Pr, Pc) = {n} / {Lc} on a {Pr}x{Pc} grid: "
            f"the grid would be mostly padding; use T_A <= {most} (or leave it None)."
        )
    tiles = -(-n // T_A)
    nt = -(-tiles // Lc) * Lc
    grid = _local.Grid(Pr, Pc, nt, T_A, r, c)
    resid = y - mean_values(mean, X)
    return Setup(grid, n, kfn, mesh), X, resid, noise_vector(noise, n, X.dtype)


def gaussian_log_likelihood(
    kernel_fn: Any,
    params: Any,
    X: ArrayLike,
    y: ArrayLike,
    noise: ArrayLike,
    mesh: _api.AnyMesh,
    T_A: int | None = None,
    *,
    mean: Any = None,
    axes: tuple[str | None, str | None] | None = None,
) -> tuple[jax.Array, jax.Array]:
    r"""Exact GP log marginal likelihood ``log N(y | m(X), K(X, X) + diag(noise))``, sharded.

    Each device evaluates the kernel only on its own block-cyclic covariance tiles (row and
    column subsets of the replicated ``X``), factors them with the sharded Cholesky and
    solves; no device holds an ``n x n`` array. Any ``n`` works (the tiles are padded
    internally). Differentiate it with ``jax.grad`` / ``jax.value_and_grad`` with respect
    to ``params``, ``noise``, ``mean``'s parameters, ``X`` or ``y``: the reverse pass runs
    Murray's blocked adjoint on the same tiles and then the kernel's own VJP tile row by
    tile row, so the value-and-gradient needs about three local blocks (``n^2 / P``
    entries) per device plus ``O(n T_A)``. Reverse mode only (no ``jax.jvp``), first
    order. Called eagerly or inside the caller's ``jit``/``grad`` alike, it runs one
    jitted program, compiled once per static set-up (mesh, axes, ``T_A``, ``n``, kernel
    function) and argument shapes; the mean (``O(n)``, replicated) is evaluated outside it.
    An eager ``jax.grad`` over an *Explicit* mesh needs ``jax.set_mesh(mesh)`` around it
    (JAX seeds the cotangent on the output's mesh; see :mod:`gpchol.distributed`).

    Args:
        kernel_fn: a gpchol kernel object (then ``params`` must be the kernel itself, a
            pytree: ``params(X1, X2)`` gives a block) or a function
            ``(params, X1, X2) -> (n1, n2) block``.
        params: the kernel parameters (a pytree), differentiated through.
        X: ``(n, d)`` inputs (replicated; small).
        y: ``(n,)`` observations.
        noise: observation-noise variance, a scalar or ``(n,)`` (one per point), added to
            the diagonal.
        mesh: a 2-D mesh; its first two axes are the process rows and columns (or pass
            ``axes=(row_axis, col_axis)``).
        T_A: tile size (default picks one).
        mean: the prior mean ``m(X)``: ``None`` (zero), a number or ``(n,)`` array, or a
            callable ``X -> (n,)`` such as a :mod:`gpchol.means` mean (differentiated
            through like any JAX function).
        axes: optional ``(row_axis, col_axis)`` names.

    Returns:
        ``(value, status)``: the scalar log-likelihood (NaN if not positive definite) and
        the Cholesky status.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from gpchol import distributed as gd, kernels
        >>> mesh = jax.make_mesh((1, 1), ("r", "c"))
        >>> X, k = jnp.linspace(0.0, 1.0, 16)[:, None], kernels.ExpSquared(lengthscale=0.3)
        >>> v, s = gd.gaussian_log_likelihood(k, k, X, jnp.sin(6 * X[:, 0]), 0.1, mesh, 4)
        >>> int(s)
        0
    """
    s, X, r, noise_v = prepare(kernel_fn, X, y, noise, mean, mesh, T_A, axes)
    return _loglik_jitted(s)(params, X, r, noise_v)


@functools.lru_cache(maxsize=64)
def _loglik_jitted(s: Setup) -> Callable[..., tuple[jax.Array, jax.Array]]:
    """:func:`_loglik` jitted for one static set-up (cached: compiled once per shapes).

    Called eagerly, the ``shard_map`` program otherwise ran op by op (minutes at n = 30
    on a simulated 2x4 mesh); inside the caller's ``jit`` it is inlined as a nested call.
    ``X``, ``y`` and ``noise`` are replicated before the custom-VJP core (whose cotangents
    are replicated), so that inputs laid out otherwise (e.g. ``X`` by rows on an Explicit
    mesh) get their gradients back in their own layout through the constraint's transpose.
    """

    def run(params: Any, X: jax.Array, y: jax.Array, noise: jax.Array) -> Any:
        X, y, noise = (_api.replicated(v, s.mesh) for v in (X, y, noise))
        return _loglik(s, params, X, y, noise)

    return jax.jit(run)
