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

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P
from jax.typing import ArrayLike

from gpchol._base.errors import NotPositiveDefiniteError
from gpchol._base.pytrees import register_fields
from gpchol._base.validate import as_inputs, is_concrete
from gpchol._linalg import posterior_core as core
from gpchol.distributed import _api, _local
from gpchol.distributed._gp import Setup, factor, kernel_block, mean_values, prepare

__all__ = ["ShardedPosterior", "ShardedSolver", "condition"]


def _static_mean(mean: Any) -> bool:
    """A plain function (not a pytree with leaves) is kept as static data."""
    return callable(mean) and jax.tree_util.tree_leaves(mean) == [mean]


def default_block(n: int, P_: int) -> int:
    """Test points per block by default: ``n / P`` clipped to ``[128, 2048]``.

    A block's replicated ``V`` (``n x block``) is then at most about one local block of
    the factor (``n^2 / P``) for ``n / P >= 128``.
    """
    return min(2048, max(128, -(-n // P_)))


@jax.tree_util.register_pytree_node_class
class ShardedPosterior(core.Predictions):
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
        params: the kernel parameters the posterior was conditioned with.
        X: the training inputs it was conditioned on.
        noise: the noise variance (scalar or per point) it was conditioned with.
        prior_mean: the prior mean it was conditioned with.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from gpchol import distributed as gd, kernels
        >>> X, k = jnp.linspace(0.0, 1.0, 16)[:, None], kernels.ExpSquared(lengthscale=0.3)
        >>> post = gd.condition(k, k, X, jnp.sin(6 * X[:, 0]), noise=0.01,
        ...                     mesh=jax.make_mesh((1, 1), ("r", "c")))
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
        block_size: int | None,
        part_check: Callable[[Any, Any], Any] | None = None,
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
        self.block_size = block_size
        self.part_check = part_check

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
        aux = (
            self.setup,
            self.block_size,
            self.prior_mean if static else None,
            static,
            self.part_check,
        )
        return children, aux

    @classmethod
    def tree_unflatten(cls, aux: tuple[Any, ...], children: tuple[Any, ...]) -> ShardedPosterior:
        setup, chunk, static_mean, static, part_check = aux
        params, X, noise, mean, L, alpha, value, status, used = children
        return cls(
            setup, params, X, noise, static_mean if static else mean, L, alpha, value, status,
            used, chunk, part_check,
        )  # fmt: skip

    def __repr__(self) -> str:
        g = self.setup.grid
        return (
            f"ShardedPosterior(n={self.setup.n}, grid={g.Pr}x{g.Pc}, T_A={g.T}, "
            f"block_size={self.block_size})"
        )

    def _core_args(self, Xs: ArrayLike | None, kernel: Any, block_size: object) -> dict[str, Any]:
        """``kernel``: the parameters of one additive part of the covariance, read by the
        same block-building function (for a gpchol kernel: the part itself); that it is a
        part of the model is checked by ``part_check`` where the caller gave one (this
        layer knows no kernels)."""
        if kernel is not None and self.part_check is not None:
            kernel = self.part_check(self.params, kernel)  # None: the whole model
        return dict(
            dtype=self.X.dtype,
            part=kernel,
            model_noise=self.noise,
            block_size=block_size,
            own_block=self.block_size,
        )

    @property
    def _solver(self) -> ShardedSolver:
        return ShardedSolver.of(self)


@functools.partial(
    register_fields,
    data_fields=["params", "X", "L", "alpha", "mean"],
    meta_fields=["setup", "static_mean"],
)
@dataclasses.dataclass(frozen=True)
class ShardedSolver:
    """A :class:`ShardedPosterior`'s arrays for the posterior core: one block of ``mb``
    test points (a multiple of ``Pc``) per ``shard_map`` (see the module's notes); ``V`` is
    the replicated ``(N, mb)`` result of the sharded forward substitution. Its structure
    is the set-up's (not the posterior's ``part_check``): one program per set-up."""

    setup: Setup
    params: Any
    X: jax.Array
    L: jax.Array
    alpha: jax.Array
    mean: Any
    static_mean: Any

    @classmethod
    def of(cls, p: ShardedPosterior) -> ShardedSolver:
        static = _static_mean(p.prior_mean)
        m = p.prior_mean
        return cls(
            p.setup, p.params, p.X, p.L, p.alpha, None if static else m, m if static else None
        )

    @property
    def inputs(self) -> jax.Array:
        return self.X

    @property
    def outputs(self) -> tuple[int, ...]:
        return ()

    @property
    def block_multiple(self) -> int:
        return self.setup.grid.Pc

    def default_block(self, m: int) -> int:
        return default_block(self.setup.n, self.setup.grid.Pr * self.setup.grid.Pc)

    def _params(self, part: Any) -> Any:
        return self.params if part is None else part

    def project(self, xb: jax.Array, part: Any, whiten: bool) -> tuple[jax.Array, jax.Array | None]:
        run = _project_fn(self.setup, xb.shape[0], whiten)
        out = run(self._params(part), self.X, self.L, self.alpha, xb)
        return out[0], (out[1] if whiten else None)

    def prior_mean(self, xb: jax.Array) -> jax.Array:
        return mean_values(self.static_mean if self.mean is None else self.mean, xb, training=False)

    def prior_variance(self, xb: jax.Array, part: Any) -> jax.Array:
        s, params = self.setup, self._params(part)
        return jax.vmap(lambda x: kernel_block(s, params, x[None], x[None])[0, 0])(xb)

    def prior_covariance(self, xs: jax.Array, part: Any) -> jax.Array:
        return kernel_block(self.setup, self._params(part), xs, xs)


def _project_body(
    s: Setup,
    mb: int,
    whiten: bool,
    params: Any,
    X: jax.Array,
    L: jax.Array,
    alpha: jax.Array,
    xb: jax.Array,
) -> tuple[jax.Array, ...]:
    """Per device: its tiles of ``K_*`` for one block ``xb`` (replicated ``(mb, d)``), then
    ``K_*^T alpha`` (one ``psum``) and, with ``whiten``, ``V = L^-1 K_*`` (replicated)."""
    g = s.grid
    pr, pc = _local.coords(g)
    gr = _local.global_rows(g, pr)
    mbc = mb // g.Pc
    # K(X[own rows], xb[own slice]), (mr T, mb / Pc), zero on padded rows
    Xr = jnp.take(X, jnp.minimum(gr, s.n - 1), axis=0)
    Ks = kernel_block(s, params, Xr, lax.dynamic_slice_in_dim(xb, pc * mbc, mbc))
    Ks = jnp.where((gr < s.n)[:, None], Ks, jnp.zeros((), Ks.dtype))
    part = Ks.T @ jnp.take(alpha[:, 0], gr)
    mu = _local.psum(
        lax.dynamic_update_slice(jnp.zeros((mb,), Ks.dtype), part, (pc * mbc,)), g.axes
    )
    if not whiten:
        return (mu,)
    D = [_local.diag_tile(g, L, k) for k in range(g.nt)]
    at = (0 * pc, pc * mbc)  # indices of one integer type (pc is traced)
    B = lax.dynamic_update_slice(jnp.zeros((Ks.shape[0], mb), Ks.dtype), Ks, at)
    return mu, _local.trsv_lower_local(g, L, B, D, local_rows=True)


@functools.lru_cache(maxsize=64)
def _project_fn(s: Setup, mb: int, whiten: bool) -> Callable[..., tuple[jax.Array, ...]]:
    """The ``shard_map`` of :func:`_project_body` for one set-up and block size."""
    smap = jax.shard_map(
        functools.partial(_project_body, s, mb, whiten),
        mesh=s.mesh,
        in_specs=(P(), P(), s.spec, P(), P()),
        out_specs=(P(), P()) if whiten else (P(),),
        check_vma=False,
    )

    def run(
        params: Any, X: jax.Array, L: jax.Array, alpha: jax.Array, xb: jax.Array
    ) -> tuple[jax.Array, ...]:
        L = _api.place_traced(L, s.mesh, s.spec)
        X, alpha, xb = (_api.replicated(v, s.mesh) for v in (X, alpha, xb))
        return smap(params, X, L, alpha, xb)

    return run


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
    block_size: int | None = None,
    check: bool = False,
    part_check: Callable[[Any, Any], Any] | None = None,
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
        kernel_fn, params, X, y, noise, mesh: as for :func:`gaussian_log_likelihood`
            (``X`` ``(n, d)``, ``y`` ``(n,)``, ``noise`` a scalar or ``(n,)``).
        mean: the prior mean: ``None`` (zero), a number, or a callable ``X -> (n,)`` (such
            as a :mod:`gpchol.means` mean), evaluated at the training and at the test
            inputs.
        jitter: a float added to the diagonal (not counted as noise by
            ``variance(include_noise=True)``).
        T_A, axes: as for :func:`gaussian_log_likelihood`.
        block_size: test points per block of the predictions (rounded up to a multiple
            of the process-column count); default ``n / P`` clipped to ``[128, 2048]``.
        check: raise :class:`gpchol.NotPositiveDefiniteError` when the factorization
            fails (needs concrete values, outside ``jit``); without it the predictions
            are NaN and ``status`` says why.
        part_check: optional ``(params, part) -> part or None``, called on every
            ``kernel=`` of the predictions with the posterior's ``params`` (the GP layer
            passes its check that ``part`` is a part of the model kernel, ``params``;
            ``None`` returned means the whole model). A module-level function, static in
            the posterior's pytree: a closure over the model would be traced with it by
            ``jit`` (and leak), and a new one per call would retrace every jitted user of
            the posterior.

    Returns:
        A :class:`ShardedPosterior`.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from gpchol import distributed as gd, kernels
        >>> mesh = jax.make_mesh((1, 1), ("r", "c"))
        >>> X, k = jnp.linspace(0.0, 1.0, 16)[:, None], kernels.ExpSquared(lengthscale=0.3)
        >>> post = gd.condition(k, k, X, jnp.sin(6 * X[:, 0]), noise=0.01, mesh=mesh)
        >>> int(post.status), round(float(post.mean(jnp.array([[0.25]]))[0]), 2)
        (0, 0.99)
    """
    if jitter is not None and (
        isinstance(jitter, bool) or not isinstance(jitter, (int, float)) or not jitter >= 0
    ):
        raise ValueError(f"jitter must be a float >= 0 or None; got {jitter!r}.")
    block_size = core.check_block_size(block_size)
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
        block_size,
        part_check,
    )
