r"""Sharded GP posterior: the factor stays in its block-cyclic tiles, predictions are solves.

:func:`condition` runs the sharded likelihood's forward pass (:func:`gpchol.distributed.
gaussian_log_likelihood`: every device builds and factors only its own covariance tiles)
and keeps what it leaves behind: the factor ``L`` in its 2D block-cyclic layout (never
gathered) and the replicated ``alpha = K^-1 (y - m(X))``. At test inputs ``Xs``
(Rasmussen & Williams 2006, Alg. 2.1)

.. math::
    \mu_* = m(X_*) + K_*^T \alpha, \qquad
    \sigma^2_* = \operatorname{diag} k(X_*, X_*) - \operatorname{colsum}(V \circ V),
    \quad V = L^{-1} K_*, \quad K_* = k(X, X_*).

The test points are taken in chunks of ``mb`` (a multiple of the process-column count
``Pc``). Within a chunk, device ``(pr, pc)`` evaluates only its own tiles of ``K_*``: the
training rows of its process row's block-cyclic tile rows, times the ``pc``-th of ``Pc``
equal slices of the chunk's test points, so that every entry of ``K_*`` is built once on
the mesh. The mean is a local product with the device's rows of ``alpha`` and one ``psum``
of ``mb`` numbers; ``V`` comes from the sharded forward substitution
(:func:`gpchol.distributed._local.trsv_lower_local` with ``local_rows``), whose every
step moves one ``(T, mb)`` tile row of the right-hand side. Nothing ``n x n``, nor
``n x m``, is ever held by one device; ``V`` (``N x mb``, replicated) is the largest
buffer besides the factor's local block.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import PartitionSpec as P
from jax.typing import ArrayLike

from gpchol._base.errors import NotPositiveDefiniteError
from gpchol._base.validate import as_inputs, is_concrete
from gpchol.distributed import _api, _local
from gpchol.distributed._gp import Setup, factor, kernel_block, noise_vector, prepare

__all__ = ["ShardedPosterior", "condition"]


def _static_mean(mean: Any) -> bool:
    """A plain function (not a pytree with leaves) is kept as static data."""
    return callable(mean) and jax.tree_util.tree_leaves(mean) == [mean]


def _check_chunk(chunk_size: object) -> int | None:
    if chunk_size is None:
        return None
    if isinstance(chunk_size, (bool, np.bool_)) or not isinstance(chunk_size, (int, np.integer)):
        raise ValueError(
            f"chunk_size (test points per chunk) must be a positive int or None; got "
            f"{chunk_size!r}."
        )
    if chunk_size < 1:
        raise ValueError(
            f"chunk_size (test points per chunk) must be a positive int; got {chunk_size}."
        )
    return int(chunk_size)


def default_chunk(n: int, P_: int) -> int:
    """Test points per chunk by default: ``n / P`` clipped to ``[128, 2048]``.

    A chunk's replicated ``V`` (``n x chunk``) is then at most about one local block of
    the factor (``n^2 / P``) for ``n / P >= 128``.
    """
    return min(2048, max(128, -(-n // P_)))


@jax.tree_util.register_pytree_node_class
class ShardedPosterior:
    r"""The posterior of a GP whose covariance is factored across a mesh.

    Returned by :func:`condition`; a pytree (its arrays are children, the static set-up
    is auxiliary data), so it can be passed through ``jax.jit``.

    Attributes:
        L: the factor of ``K(X, X) + diag(noise)`` in its 2D block-cyclic layout, an
            ``(N, N)`` array sharded ``P(row_axis, col_axis)`` whose local blocks are the
            devices' cyclic tiles (``N >= n``: padded with an identity block; not the
            plain ``L``, which is never gathered).
        alpha: replicated ``(N, 1)``, ``K^-1 (y - m(X))`` (zero on the padding).
        log_marginal_likelihood: scalar ``log p(y)`` (NaN on a failed factorization).
        status: int32 Cholesky status (0, else the 1-based first failing pivot).
        jitter_used: the jitter added to the diagonal.
        params, X, noise, prior_mean: what the posterior was conditioned with.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from gpchol import distributed as gd, kernels
        >>> mesh = jax.make_mesh((1, 1), ("r", "c"))
        >>> X = jnp.linspace(0.0, 1.0, 16)[:, None]
        >>> k = kernels.ExpSquared(lengthscale=0.3)
        >>> post = gd.condition(k, k, X, jnp.sin(6 * X[:, 0]), noise=0.01, mesh=mesh)
        >>> Xs = jnp.array([[0.25], [0.5]])
        >>> post.mean(Xs).shape, post.variance(Xs, include_noise=True).shape
        ((2,), (2,))
    """

    def __init__(
        self,
        setup: Setup,
        params: Any,
        X: jax.Array,
        noise: jax.Array,
        prior_mean: Any,
        L: jax.Array,
        alpha: jax.Array,
        log_marginal_likelihood: jax.Array,
        status: jax.Array,
        jitter_used: jax.Array,
        chunk_size: int | None,
    ) -> None:
        self.setup = setup
        self.params = params
        self.X = X
        self.noise = noise
        self.prior_mean = prior_mean
        self.L = L
        self.alpha = alpha
        self.log_marginal_likelihood = log_marginal_likelihood
        self.status = status
        self.jitter_used = jitter_used
        self.chunk_size = chunk_size

    def tree_flatten(self) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
        static = _static_mean(self.prior_mean)
        children = (
            self.params,
            self.X,
            self.noise,
            None if static else self.prior_mean,
            self.L,
            self.alpha,
            self.log_marginal_likelihood,
            self.status,
            self.jitter_used,
        )
        aux = (self.setup, self.chunk_size, self.prior_mean if static else None, static)
        return children, aux

    @classmethod
    def tree_unflatten(cls, aux: tuple[Any, ...], children: tuple[Any, ...]) -> ShardedPosterior:
        setup, chunk, static_mean, static = aux
        params, X, noise, mean, L, alpha, value, status, used = children
        return cls(
            setup, params, X, noise, static_mean if static else mean, L, alpha, value, status,
            used, chunk,
        )  # fmt: skip

    def __repr__(self) -> str:
        g = self.setup.grid
        return (
            f"ShardedPosterior(n={self.setup.n}, grid={g.Pr}x{g.Pc}, T_A={g.T}, "
            f"chunk_size={self.chunk_size})"
        )

    # ------------------------------------------------------------------------ inputs
    def _Xs(self, Xs: ArrayLike | None) -> jax.Array:
        if Xs is None:
            return self.X
        Xs = as_inputs(Xs, "Xs")
        d = self.X.shape[1]
        if Xs.shape[1] != d:
            raise ValueError(
                f"Xs has {Xs.shape[1]} column(s) but the training inputs X have {d}; pass "
                f"test inputs of shape (m, {d})."
            )
        if is_concrete(Xs):
            bad = np.flatnonzero(~np.all(np.isfinite(np.asarray(Xs)), axis=1))
            if bad.size:
                raise ValueError(
                    f"Xs has NaN or inf in row(s) {bad[:5].tolist()}"
                    + (f" and {bad.size - 5} more" if bad.size > 5 else "")
                    + "; drop or impute those test points first."
                )
        return Xs.astype(self.X.dtype)

    def _chunk(self, m: int, chunk_size: object) -> int:
        c = _check_chunk(chunk_size)
        if c is None:
            c = self.chunk_size
        g = self.setup.grid
        if c is None:
            c = default_chunk(self.setup.n, g.Pr * g.Pc)
        c = max(1, min(c, m))
        return -(-c // g.Pc) * g.Pc

    def _run(self, Xs: jax.Array, chunk_size: object, want_var: bool) -> jax.Array:
        m = Xs.shape[0]
        if m == 0:
            return jnp.zeros((0,), self.X.dtype)
        mb = self._chunk(m, chunk_size)
        M = -(-m // mb) * mb
        Xp = jnp.pad(Xs, ((0, M - m), (0, 0)), mode="edge").reshape(M // mb, mb, -1)
        out = _predict_jitted(self.setup, mb, want_var)(self.params, self.X, self.L, self.alpha, Xp)
        return out.reshape(M)[:m]

    # ------------------------------------------------------------------- predictions
    def mean(self, Xs: ArrayLike | None = None, *, chunk_size: int | None = None) -> jax.Array:
        """Posterior mean of the latent function, ``m(Xs) + k(Xs, X) alpha``.

        Args:
            Xs: ``(m, d)`` test inputs (``None``: the training inputs).
            chunk_size: test points per chunk (default: the posterior's).

        Returns:
            ``(m,)`` means, replicated.
        """
        Xs = self._Xs(Xs)
        mu = self._run(Xs, chunk_size, want_var=False)
        return mu + _mean_at(self.prior_mean, Xs)

    def variance(
        self,
        Xs: ArrayLike | None = None,
        *,
        include_noise: bool = False,
        noise: ArrayLike | None = None,
        chunk_size: int | None = None,
    ) -> jax.Array:
        """Posterior marginal variance at each test input, ``k(x, x) - v^T v``.

        Args:
            Xs: ``(m, d)`` test inputs (``None``: the training inputs).
            include_noise: add the observation-noise variance (the predictive variance of
                ``y``): ``noise`` if given, else the training noise when it is a scalar
                (or when ``Xs`` is ``None``).
            noise: the test points' noise variance, a scalar or ``(m,)``; implies
                ``include_noise``.
            chunk_size: test points per chunk (default: the posterior's).

        Returns:
            ``(m,)`` variances (clipped at 0 before any noise is added), replicated.
        """
        is_train = Xs is None
        Xs = self._Xs(Xs)
        m = Xs.shape[0]
        var = jnp.maximum(self._run(Xs, chunk_size, want_var=True), 0.0)
        if noise is not None:
            return var + noise_vector(noise, m, var.dtype, "noise")
        if include_noise:
            tn = jnp.asarray(self.noise, var.dtype)
            if tn.ndim == 1 and tn.shape[0] != 1 and not is_train:
                raise ValueError(
                    "include_noise=True with per-point (heteroscedastic) training noise needs "
                    f"the test points' noise: pass noise=<scalar or ({m},) array>, or Xs=None."
                )
            var = var + (tn if tn.ndim == 0 else jnp.broadcast_to(tn, (m,)))
        return var


def _mean_at(mean: Any, Xs: jax.Array) -> jax.Array:
    m = Xs.shape[0]
    if mean is None:
        return jnp.zeros((m,), Xs.dtype)
    if callable(mean):
        v = jnp.asarray(mean(Xs))
        if v.shape not in ((), (1,), (m,)):
            raise ValueError(
                f"the mean function gave shape {tuple(v.shape)} at {m} test inputs; it must "
                f"give ({m},)."
            )
        return jnp.broadcast_to(v.astype(Xs.dtype), (m,))
    v = jnp.asarray(mean, Xs.dtype)
    if v.ndim != 0 and v.shape != (1,):
        raise ValueError(
            "the posterior's mean is an array of per-training-point values; predictions at "
            "new inputs need a constant or a mean function (X -> (n,)) instead."
        )
    return jnp.broadcast_to(v.reshape(()), (m,))


def _predict_body(
    s: Setup,
    mb: int,
    want_var: bool,
    params: Any,
    X: jax.Array,
    L: jax.Array,
    alpha: jax.Array,
    Xs: jax.Array,
) -> jax.Array:
    """Per device: its tiles of ``K_*`` for each chunk, then ``K_*^T alpha`` or ``sigma^2``.

    ``Xs``: replicated ``(chunks, mb, d)``; returns replicated ``(chunks, mb)``.
    """
    g = s.grid
    pr, pc = _local.coords(g)
    gr = _local.global_rows(g, pr)
    real = (gr < s.n)[:, None]
    Xr = jnp.take(X, jnp.minimum(gr, s.n - 1), axis=0)
    a_r = jnp.take(alpha[:, 0], gr)
    mbc = mb // g.Pc
    D = [_local.diag_tile(g, L, k) for k in range(g.nt)] if want_var else None

    def own_tiles(Xc: jax.Array) -> jax.Array:
        """``K(X[own rows], Xc[own slice])``, ``(mr T, mb / Pc)``, zero on padded rows."""
        Xmine = lax.dynamic_slice_in_dim(Xc, pc * mbc, mbc)
        Ks = kernel_block(s, params, Xr, Xmine)
        return jnp.where(real, Ks, jnp.zeros((), Ks.dtype))

    def chunk(Xc: jax.Array) -> jax.Array:
        Ks = own_tiles(Xc)
        if not want_var:
            part = lax.dynamic_update_slice(jnp.zeros((mb,), Ks.dtype), Ks.T @ a_r, (pc * mbc,))
            return _local.psum(part, g.axes)
        B = lax.dynamic_update_slice(jnp.zeros((Ks.shape[0], mb), Ks.dtype), Ks, (0 * pc, pc * mbc))
        V = _local.trsv_lower_local(g, L, B, D, local_rows=True)
        kss = jax.vmap(lambda x: kernel_block(s, params, x[None], x[None])[0, 0])(Xc)
        return kss - jnp.sum(V * V, axis=0)

    return lax.map(chunk, Xs)


@functools.lru_cache(maxsize=64)
def _predict_jitted(s: Setup, mb: int, want_var: bool) -> Callable[..., jax.Array]:
    """The jitted prediction for one static set-up and chunk (compiled once per shapes)."""
    body = functools.partial(_predict_body, s, mb, want_var)
    smap = jax.shard_map(
        body,
        mesh=s.mesh,
        in_specs=(P(), P(), s.spec, P(), P()),
        out_specs=P(),
        check_vma=False,
    )

    def run(params: Any, X: jax.Array, L: jax.Array, alpha: jax.Array, Xs: jax.Array) -> jax.Array:
        L = _api.place_traced(L, s.mesh, s.spec)
        X, alpha, Xs = (_api.replicated(v, s.mesh) for v in (X, alpha, Xs))
        return smap(params, X, L, alpha, Xs)

    return jax.jit(run)


@functools.lru_cache(maxsize=64)
def _factor_jitted(s: Setup) -> Callable[..., tuple[jax.Array, ...]]:
    return jax.jit(functools.partial(factor, s))


def condition(
    kernel_fn: Any,
    params: Any,
    X: ArrayLike,
    y: ArrayLike,
    *,
    noise: ArrayLike,
    mesh: _api.AnyMesh,
    mean: Any = None,
    jitter: float | None = None,
    T_A: int | None = None,
    axes: tuple[str | None, str | None] | None = None,
    chunk_size: int | None = None,
    check: bool = False,
) -> ShardedPosterior:
    r"""Condition a GP on ``y`` across a mesh; the factor is kept in its sharded tiles.

    The covariance ``K = k(X, X) + diag(noise) + jitter I`` is built, factored and solved
    exactly as by :func:`gaussian_log_likelihood` (each device only its own block-cyclic
    tiles; no device holds ``n x n``), and the posterior keeps the factor in that layout.
    :meth:`ShardedPosterior.mean` and :meth:`ShardedPosterior.variance` then evaluate only
    each device's own tiles of ``k(X, Xs)`` and use the sharded triangular solve, chunk by
    chunk of test points (see the module's notes). Not differentiated on this path (use
    :func:`gaussian_log_likelihood` for gradients).

    Args:
        kernel_fn, params: as for :func:`gaussian_log_likelihood` (a gpchol kernel passed
            twice, or a function ``(params, X1, X2) -> block`` and its parameters).
        X: ``(n, d)`` training inputs (replicated; small).
        y: ``(n,)`` observations.
        noise: observation-noise variance, a scalar or ``(n,)``.
        mesh: a 2-D mesh; its first two axes are the process rows and columns.
        mean: the prior mean: ``None`` (zero), a number, or a callable ``X -> (n,)`` (such
            as a :mod:`gpchol.means` mean), evaluated at the training and at the test
            inputs.
        jitter: a float added to the diagonal (not counted as noise by
            ``variance(include_noise=True)``).
        T_A: tile size (default as for the likelihood).
        axes: optional ``(row_axis, col_axis)`` names.
        chunk_size: test points per chunk of the predictions (rounded up to a multiple
            of the process-column count); default ``n / P`` clipped to ``[128, 2048]``.
        check: raise :class:`gpchol.NotPositiveDefiniteError` when the factorization
            fails (needs concrete values, outside ``jit``); without it the predictions
            are NaN and ``status`` says why.

    Returns:
        A :class:`ShardedPosterior`.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from gpchol import distributed as gd, kernels
        >>> mesh = jax.make_mesh((1, 1), ("r", "c"))
        >>> X = jnp.linspace(0.0, 1.0, 16)[:, None]
        >>> k = kernels.ExpSquared(lengthscale=0.3)
        >>> post = gd.condition(k, k, X, jnp.sin(6 * X[:, 0]), noise=0.01, mesh=mesh)
        >>> int(post.status), round(float(post.mean(jnp.array([[0.25]]))[0]), 2)
        (0, 0.99)
    """
    if jitter is not None and (
        isinstance(jitter, bool) or not isinstance(jitter, (int, float)) or not jitter >= 0
    ):
        raise ValueError(f"jitter must be a float >= 0 or None; got {jitter!r}.")
    chunk_size = _check_chunk(chunk_size)
    Xa = as_inputs(X)
    noise_arr = jnp.asarray(noise, Xa.dtype)
    s, Xa, r, noise_v = prepare(kernel_fn, Xa, y, noise_arr, mean, mesh, T_A, axes)
    extra = float(jitter or 0.0)
    value, status, L, _, alpha = _factor_jitted(s)(params, Xa, r, noise_v + extra)
    if check:
        if not is_concrete(status):
            raise ValueError(
                "condition(..., check=True) needs concrete values and cannot run inside "
                "jax.jit/vmap/grad tracing; test post.status == 0 instead."
            )
        if int(status) != 0:
            raise NotPositiveDefiniteError(
                f"the covariance k(X, X) + diag(noise) is not positive definite: the "
                f"sharded factorization failed at pivot {int(status)}. A larger noise "
                "variance, a jitter, float64, or removing duplicated inputs may help.",
                pivot=int(status),
                jitter=(extra,) if jitter else (),
            )
    return ShardedPosterior(
        s,
        params,
        Xa,
        noise_arr,
        mean,
        L,
        alpha,
        value,
        status,
        jnp.asarray(extra, Xa.dtype),
        chunk_size,
    )
