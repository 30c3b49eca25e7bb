r"""Exact Gaussian-process regression on gpchol's differentiable Cholesky factorization.

A :class:`GaussianProcess` is a small pytree: the kernel, the training inputs ``X``, the
observation-noise variance and the mean function are its children (so ``jax.grad`` with
respect to a GP gives a GP of gradients, and ``jax.vmap`` maps over a batch of GPs); the
jitter schedule, the Cholesky backend and the tile size are static.

The model is ``y = f(X) + eps`` with ``f ~ GP(m, k)`` and ``eps_i ~ N(0, noise_i)``, so
``y ~ N(m(X), K)`` with ``K = k(X, X) + diag(noise)``. Its log marginal likelihood is

.. math::
    \log p(y) = -\tfrac12 (y - m)^T K^{-1} (y - m) - \sum_i \log L_{ii}
    - \tfrac{n}{2} \log 2\pi, \qquad K = L L^T,

with ``L`` gpchol's factor; its gradient is the whole-likelihood rule
``Kbar = (alpha alpha^T - K^-1) / 2`` (:mod:`gpchol._linalg.gaussian`, with ``K`` built
inside the rule and factored in place, ``K^-1`` by LAPACK ``potri`` on the CPU, the
kernel's VJP by tiles of the lower triangle: :class:`_GPCovariance`), never
``jnp.linalg.cholesky``'s rule. The posterior at test inputs
``Xs`` (Rasmussen & Williams 2006, Alg. 2.1): ``mean = m(Xs) + Ks^T alpha`` with
``alpha = K^-1 (y - m)``, ``cov = k(Xs, Xs) - V^T V`` with ``V = L^-1 Ks``.

An exactly singular ``K`` (duplicated inputs, zero noise) can factor with status 0 and give
a finite likelihood, as in LAPACK and every peer library. :meth:`GaussianProcess.diagnostics`
reports the factor's pivot ratio (an upper bound on ``1 / cond_2(K)``) and flags such a
``K`` as ``singular``; the eager methods (called outside ``jit``/``vmap``/``grad``) warn
with :class:`~gpchol._gp.diagnostics.SingularCovarianceWarning` when a finite result comes
from it.

Example:
    >>> import jax, jax.numpy as jnp
    >>> from gpchol import GaussianProcess, kernels
    >>> X = jnp.linspace(0.0, 1.0, 5)
    >>> y = jnp.sin(3.0 * X)
    >>> gp = GaussianProcess(kernels.ExpSquared(lengthscale=0.3), X, noise=1e-2)
    >>> lml = gp.log_marginal_likelihood(y)
    >>> post = gp.condition(y)
    >>> post.mean(jnp.array([0.5])).shape
    (1,)
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike, DTypeLike

from gpchol._base.errors import NotPositiveDefiniteError
from gpchol._base.pytrees import AttrPytree
from gpchol._base.validate import (
    as_inputs,
    check_finite_rows,
    check_jitter,
    check_scalar_or_vector,
    check_tile_size,
    input_mesh,
    is_concrete,
    real_variance,
    residual_dtype,
)
from gpchol._gp.diagnostics import GPDiagnostics, diagnose_factor
from gpchol._gp.posterior import Posterior, model_part
from gpchol._linalg.backends import resolve_backend, tile_for
from gpchol._linalg.blocks import trsm
from gpchol._linalg.cholesky import linear_chol_tangent
from gpchol._linalg.gaussian import (
    LOG_2PI,
    DenseCovariance,
    GaussianRule,
    gaussian_factor,
    gaussian_loglik,
    is_symbolic_zero,
    padded_rows_as_identity,
)
from gpchol._linalg.status import raise_if_failed
from gpchol._routing import cholesky_with_status
from gpchol.kernels import Kernel, as_kernel
from gpchol.means import Mean, as_mean

if TYPE_CHECKING:
    from gpchol.distributed import ShardedPosterior

__all__ = ["GaussianProcess", "Posterior"]


def _check_mask(mask: Any, n: int) -> jax.Array | None:
    """``None``, or the mask as an ``(n,)`` boolean array (or a clear error)."""
    if mask is None:
        return None
    m = jnp.asarray(mask)
    if m.dtype != jnp.bool_ or m.shape != (n,):
        raise ValueError(
            f"mask must be None or a boolean array of shape ({n},), True on the real points "
            f"and False on padded rows; got dtype {m.dtype} and shape {tuple(m.shape)}."
        )
    return m


def _concrete_check(X: ArrayLike, noise: ArrayLike) -> None:
    """Checks that only make sense on concrete values (skipped inside ``jit``)."""
    if not is_concrete(X, noise):
        return
    check_finite_rows(X, "X", "drop or impute those rows first")
    nz = np.asarray(noise)
    if not np.all(np.isfinite(nz)) or np.any(nz < 0):
        raise ValueError(
            "noise (the observation-noise variance) must be finite and >= 0; got "
            f"{nz if nz.ndim == 0 else 'an array with negative or non-finite values'}."
        )


# ----------------------------------------------------------------------------------------
# The lean likelihood core: the covariance is built inside, factored in place and rebuilt
# (never stored) for the derivative
# ----------------------------------------------------------------------------------------


def _gp_tile(
    gp: GaussianProcess, r0: jax.Array | int, c0: jax.Array | int, rows: int, cols: int
) -> jax.Array:
    """The block ``[r0:r0+rows, c0:c0+cols]`` of ``k(X, X) + diag(noise)``.

    ``r0`` and ``c0`` may be traced (``lax.dynamic_slice``); kernels are tile-exact, so a
    block equals the same block of the whole matrix. (A jitter is a constant: no tangent.)
    """
    n = gp.X.shape[0]
    Xr = jax.lax.dynamic_slice_in_dim(gp.X, r0, rows, axis=0)
    Xc = gp.X if cols == n else jax.lax.dynamic_slice_in_dim(gp.X, c0, cols, axis=0)
    Kb = gp.kernel(Xr, Xc)
    noise = jnp.broadcast_to(gp.noise.astype(Kb.dtype), (n,))
    noise = jax.lax.dynamic_slice_in_dim(noise, r0, rows)
    on = (r0 + jnp.arange(rows))[:, None] == (c0 + jnp.arange(cols))[None, :]
    Kb = Kb + jnp.where(on, noise[:, None], jnp.zeros((), Kb.dtype))
    if gp.mask is None:
        return Kb
    mr = jax.lax.dynamic_slice_in_dim(gp.mask, r0, rows)
    mc = gp.mask if cols == n else jax.lax.dynamic_slice_in_dim(gp.mask, c0, cols)
    return padded_rows_as_identity(Kb, mr, mc, on)


# Up to this n the contraction <W, dK> takes the whole tangent at once (see contract);
# up to _WHOLE_FEW_MAX_N too when few parameter arrays are differentiated.
_WHOLE_MAX_N = 256
_WHOLE_FEW_MAX_N = 512
_WHOLE_FEW_LEAVES = 5


def _whole_contraction(n: int, live: int) -> bool:
    """Whether :meth:`_GPCovariance.contract` takes the whole ``(n, n)`` tangent at once.

    Each differentiated parameter array costs the whole form one reduction over an
    ``n x n`` cotangent (a vector lengthscale of a stationary kernel one matrix product),
    which the tiled form does in cache: so the whole form is taken at small ``n``, and up
    to ``_WHOLE_FEW_MAX_N`` for a GP with few parameter arrays (an ARD kernel with an
    amplitude and a noise), where the tiles' loop costs more than the passes it saves.
    benchmarks/results/ has the measurements.
    """
    return n <= _WHOLE_MAX_N or (n <= _WHOLE_FEW_MAX_N and live <= _WHOLE_FEW_LEAVES)


def _contraction_tile(n: int) -> int:
    """Tile side of the blocked contraction for ``n > _WHOLE_MAX_N``: ``n`` split evenly
    into tiles of at most 128 (``n <= 2048``) or 256 rows, so that no tile is padded
    (the fastest of the sizes tried: ``benchmarks/results/design-measurements.md``).
    """
    cap = 128 if n <= 2048 else 256
    count = -(-n // cap)
    return -(-n // count)


@jax.tree_util.register_pytree_node_class
class _GPCovariance(AttrPytree):
    """The GP's covariance as a source for :func:`gpchol._linalg.gaussian.gaussian_loglik`.

    ``K = k(X, X) + diag(noise) + jitter I`` is built inside the rule (and rebuilt, never
    kept, for a failed pivot's search); ``<W, dK>`` is contracted by tiles of its lower triangle
    (:meth:`contract`), so no ``n x n`` intermediate of the kernel is stored.
    """

    def __init__(self, gp: GaussianProcess) -> None:
        self.gp = gp

    _CHILDREN = ("gp",)

    def build(self, dtype: DTypeLike, jitter: float) -> jax.Array:
        return DenseCovariance(self.gp.covariance_matrix()).build(dtype, jitter)

    def contract(self, source_dot: _GPCovariance, alpha: jax.Array, kinv: jax.Array) -> jax.Array:
        """``<W, dK>``, ``W = (alpha alpha^T - K^-1) / 2``, summed over the lower triangle.

        ``W`` and ``dK`` are both symmetric, so ``<W, dK> = sum_I <W_II, dK_II> +
        2 sum_{I > J} <W_IJ, dK_IJ>`` over square tiles: a ``lax.scan`` over the
        ``T (T + 1) / 2`` tiles on and below the diagonal, each step re-evaluating one
        kernel tile and its tangent (under ``jax.checkpoint``), so the kernel is evaluated
        on about half the matrix and no ``n x n`` intermediate of it is stored. In reverse
        mode (JAX transposes this linear map) the scan runs backwards, one tile and its VJP
        at a time. The last tile row and column are shifted back to fit (tiles are equal),
        and their overlap with the previous ones is masked.
        """
        dtype = alpha.dtype
        n = self.gp.X.shape[0]
        # Only the differentiated leaves are pushed forward (the inputs X usually are
        # not): the kernels' rules then see the others as symbolic zeros and skip them.
        dots, treedef = jax.tree.flatten(source_dot.gp, is_leaf=is_symbolic_zero)
        leaves = treedef.flatten_up_to(self.gp)  # type: ignore[attr-defined]
        live = [i for i, t in enumerate(dots) if not is_symbolic_zero(t)]
        if not live:
            return jnp.zeros((), dtype)
        primals = tuple(leaves[i] for i in live)
        tangents = tuple(dots[i] for i in live)

        def tile_tangent(r0: Any, c0: Any, rows: int, cols: int) -> jax.Array:
            def tile(*values: jax.Array) -> jax.Array:
                full = list(leaves)
                for i, v in zip(live, values, strict=True):
                    full[i] = v
                return _gp_tile(jax.tree.unflatten(treedef, full), r0, c0, rows, cols)

            return jax.jvp(tile, primals, tangents)[1]

        if _whole_contraction(n, len(live)):
            # One block: the whole tangent at once, no loop. At small n the step's cost
            # is its number of operations, and the scan, remat and masking below only
            # add to it (same numbers, same n x n buffer).
            Kd = tile_tangent(0, 0, n, n)
            W = 0.5 * (alpha[:, None] * alpha[None, :] - kinv)
            return jnp.sum(W * Kd.astype(dtype))
        t = _contraction_tile(n)
        rows, cols = np.tril_indices(-(-n // t))
        idx = jnp.arange(t)

        @jax.checkpoint
        def step(acc: jax.Array, ij: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, None]:
            i, j = ij
            r0 = jnp.minimum(i * t, n - t)  # the last tile is shifted back ...
            c0 = jnp.minimum(j * t, n - t)
            Kd = tile_tangent(r0, c0, t, t)
            keep = (r0 + idx >= i * t)[:, None] & (c0 + idx >= j * t)[None, :]  # ... masked
            a_r = jax.lax.dynamic_slice_in_dim(alpha, r0, t)
            a_c = jax.lax.dynamic_slice_in_dim(alpha, c0, t)
            W = 0.5 * (a_r[:, None] * a_c[None, :] - jax.lax.dynamic_slice(kinv, (r0, c0), (t, t)))
            twice = jnp.where(i == j, 1.0, 2.0).astype(dtype)
            return acc + twice * jnp.sum(jnp.where(keep, W * Kd.astype(dtype), 0.0)), None

        return jax.lax.scan(step, jnp.zeros((), dtype), (jnp.asarray(rows), jnp.asarray(cols)))[0]


# ----------------------------------------------------------------------------------------
# Conditioning: the likelihood's lean forward pass, with the factor and alpha kept
# ----------------------------------------------------------------------------------------


@partial(jax.custom_jvp, nondiff_argnums=(2,))
def _conditioned(gp: GaussianProcess, r: jax.Array, rule: GaussianRule) -> tuple[jax.Array, ...]:
    """``(L, value, alpha, status, jitter_used)`` of ``K = k(X, X) + diag(noise)``.

    ``K`` is built inside and factored in place (host LAPACK on the CPU): one ``n x n``
    buffer, the factor.
    """
    return gaussian_factor(_GPCovariance(gp), r, rule)


@_conditioned.defjvp
def _conditioned_jvp(
    rule: GaussianRule, primals: tuple[Any, ...], tangents: tuple[Any, ...]
) -> tuple[tuple[jax.Array, ...], tuple[Any, ...]]:
    # With K = L L^T (K + jitter I; the jitter is a constant), alpha = K^-1 r and
    # value = -r.alpha / 2 - sum_i log L_ii - n log(2 pi) / 2:
    #   dL     = L Phi(L^-1 dK L^-T)                 (the package's one Cholesky rule,
    #                                                  linear_chol_tangent; Murray 2016)
    #   dalpha = K^-1 (dr - dK alpha)                (differentiating K alpha = r)
    #   dvalue = -alpha.dr + alpha^T dK alpha / 2 - sum_i dL_ii / L_ii
    # (R&W 2006, eq. 5.9 for the last). Linear in (dK, dr), so JAX transposes it for
    # reverse mode. dK is formed (n x n) only when differentiating.
    gp, r = primals
    gp_dot, r_dot = tangents
    out = _conditioned(gp, r, rule)
    L, _, alpha, status, used = out
    _, dK = jax.jvp(lambda g: g.covariance_matrix(), (gp,), (gp_dot,))
    dK = dK.astype(L.dtype)
    dL = linear_chol_tangent(L, dK, rule.backend, rule.nb)
    Ka = dK @ alpha
    z = trsm(L, (r_dot - Ka)[:, None], left=True)
    dalpha = trsm(L, z, left=True, trans=True)[:, 0]
    dvalue = (
        -jnp.dot(alpha, r_dot)
        + 0.5 * jnp.dot(alpha, Ka)
        - jnp.sum(jnp.diagonal(dL) / jnp.diagonal(L))
    )
    float0 = np.zeros(status.shape, jax.dtypes.float0)
    return out, (dL, dvalue, dalpha, float0, jnp.zeros_like(used))


@jax.jit
def _condition_jit(gp: GaussianProcess, y: jax.Array) -> tuple[Any, ...]:
    """The conditioning program, traced once per shape and GP structure:
    ``(L, value, alpha, status, jitter_used, diagnostics)`` (the diagnostics cost O(n)
    here, and a program of their own when asked for eagerly afterwards). The residual
    ``y - m(X)`` is formed inside: eagerly, each of its operations would compile a small
    program of its own per shape."""
    r = gp._residual(y)
    be = resolve_backend(gp.backend, gp.X)
    nb = tile_for(be, gp.n, r.dtype, check_tile_size(gp.tile_size))
    L, value, alpha, status, used = _conditioned(gp, r, GaussianRule(be, nb, gp.jitter))
    value = value + gp._padded_correction(used, value.dtype)
    return L, value, alpha, status, used, diagnose_factor(L, status, used, gp.mask)


class GaussianProcess(AttrPytree):
    r"""An exact Gaussian process with Gaussian observation noise.

    Args:
        kernel: a :class:`gpchol.kernels.Kernel` (a pytree of its parameters).
        X: ``(n, d)`` training inputs (``(n,)`` is read as ``(n, 1)``).
        noise: observation-noise *variance*: a scalar, or ``(n,)`` for heteroscedastic
            noise (one variance per point). Keyword-only.
        mean: the prior mean: ``None``/a number (constant mean), a
            :class:`gpchol.means.Mean`, or a callable ``X -> (n,)``. Default ``0.0``.
        jitter: ``None`` (no jitter, the default), a float added to the diagonal, or a
            tuple of floats tried in order until the factorization succeeds (see
            :func:`gpchol.cholesky_with_status`).
        backend: Cholesky backend, ``"auto"``, ``"xla"``, ``"tiled"`` or ``"cuda"``.
        tile_size: block size of the factorization and its adjoint (``None``: automatic).
        mask: ``None``, or ``(n,)`` booleans, False on *padded* rows: points that are not
            data, there only to give ``n`` a fixed size (so that programs compile once per
            size bucket). A padded point is an identity row and column of the covariance
            with a zero residual: the likelihood, its gradient and the posterior are those
            of the real points alone, whatever the padded rows of ``X``, ``noise`` and
            ``y`` hold (as long as the kernel is finite there).

    Shapes: ``X (n, d)``, ``noise () or (n,)``, ``y (n,)``, ``mask (n,)``; test inputs
    ``Xs (m, d)``.

    Note:
        With ``X`` placed on a multi-device mesh (a ``NamedSharding``), the likelihood
        runs on :func:`gpchol.distributed.gaussian_log_likelihood`: each device builds and
        factors only its own covariance tiles.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from gpchol import GaussianProcess, kernels
        >>> X = jnp.linspace(0.0, 1.0, 8)
        >>> y = jnp.cos(4.0 * X)
        >>> def loss(ls):
        ...     gp = GaussianProcess(kernels.ExpSquared(ls), X, noise=0.01)
        ...     return -gp.log_marginal_likelihood(y)
        >>> g = jax.jit(jax.grad(loss))(0.3)
        >>> bool(jnp.isfinite(g))
        True
    """

    def __init__(
        self,
        kernel: Kernel,
        X: Any,
        *,
        noise: Any,
        mean: Any = 0.0,
        jitter: Any = None,
        backend: str = "auto",
        tile_size: int | None = None,
        mask: Any = None,
    ) -> None:
        if not isinstance(kernel, Kernel):
            kernel = as_kernel(kernel)  # a function f(x1, x2) -> scalar, or TypeError
        X = as_inputs(X)
        noise = real_variance(noise, X.dtype)
        n = X.shape[0]
        check_scalar_or_vector(noise.shape, n, "noise", "variance per training point")
        _concrete_check(X, noise)
        self.kernel = kernel
        self.X = X
        self.noise = noise
        self.mean = as_mean(mean) if not isinstance(mean, Mean) else mean
        self.jitter = check_jitter(jitter)
        self.backend = backend
        self.tile_size = tile_size
        self.mask = _check_mask(mask, n)
        self._check_padding()

    # ------------------------------------------------------------------ pytree protocol
    _CHILDREN = ("kernel", "X", "noise", "mean", "mask")
    _AUX = ("jitter", "backend", "tile_size")

    @classmethod
    def tree_unflatten(cls, aux: Any, children: Any) -> GaussianProcess:
        # four children: a model saved before the mask existed (gpchol.load)
        return super().tree_unflatten(aux, (*children, None)[:5])

    def with_mask(self, mask: Any) -> GaussianProcess:
        """This GP with padded rows marked (see ``mask`` in :class:`GaussianProcess`).

        Args:
            mask: ``(n,)`` booleans, False on padded rows; ``None`` removes the mask.

        Returns:
            A new :class:`GaussianProcess` sharing every other field.

        Example:
            >>> import jax.numpy as jnp
            >>> from gpchol import GaussianProcess, kernels
            >>> X, y = jnp.array([0.0, 1.0, 1.0]), jnp.array([0.3, -0.2, 9.0])
            >>> gp = GaussianProcess(kernels.ExpSquared(), X, noise=0.1)
            >>> a = gp.with_mask(jnp.array([True, True, False])).log_marginal_likelihood(y)
            >>> b = GaussianProcess(kernels.ExpSquared(), X[:2], noise=0.1)
            >>> bool(jnp.allclose(a, b.log_marginal_likelihood(y[:2])))
            True
        """
        children, aux = self.tree_flatten()
        gp = self.tree_unflatten(aux, (*children[:4], _check_mask(mask, self.n)))
        gp._check_padding()
        return gp

    def _check_padding(self) -> None:
        if self.mask is None:
            return
        if self.jitter is not None and len(self.jitter) > 1:
            raise ValueError(
                "a GaussianProcess with padded rows (mask) takes one jitter value, not a "
                f"schedule (got {self.jitter}): the jitter used must be known to remove the "
                "padded rows' share of the log-determinant."
            )
        if input_mesh(self.X) is not None:
            raise ValueError(
                "padded rows (mask) are not supported with X sharded over a device mesh; "
                "pass the real points only."
            )

    def __repr__(self) -> str:
        shape = getattr(self.X, "shape", None)
        return (
            f"GaussianProcess(kernel={type(self.kernel).__name__}, X shape={shape}, "
            f"jitter={self.jitter}, backend={self.backend!r})"
        )

    # ------------------------------------------------------------------------ pieces
    @property
    def n(self) -> int:
        """Number of training points."""
        return self.X.shape[0]

    def covariance_matrix(self) -> jax.Array:
        """``(n, n)`` covariance of the observations, ``k(X, X) + diag(noise)``."""
        K = self.kernel(self.X, self.X)
        noise = jnp.broadcast_to(self.noise.astype(K.dtype), (K.shape[0],))
        K = K + jnp.diag(noise)
        if self.mask is None:
            return K
        return padded_rows_as_identity(K, self.mask, self.mask, jnp.eye(self.n, dtype=bool))

    def mean_vector(self) -> jax.Array:
        """``(n,)`` prior mean at the training inputs."""
        return self.mean(self.X)

    def factor(self) -> tuple[jax.Array, ...]:
        """Cholesky factor of the observation covariance, with status.

        Returns:
            ``(L, status, jitter_used)``: ``L`` is ``(n, n)`` lower triangular (all NaN
            when the factorization failed), ``status`` an int32 scalar (0 on success, else
            the 1-based first failing pivot), ``jitter_used`` the jitter added (0 if none).

        Example:
            >>> import jax.numpy as jnp
            >>> from gpchol import GaussianProcess, kernels
            >>> gp = GaussianProcess(kernels.ExpSquared(), jnp.arange(3.0), noise=0.1)
            >>> L, status, used = gp.factor()
            >>> int(status), L.shape
            (0, (3, 3))
        """
        K = self.covariance_matrix()
        out = cholesky_with_status(
            K, tile_size=self.tile_size, backend=self.backend, jitter=self.jitter
        )
        if self.jitter is None:
            L, status = out
            used = jnp.zeros((), K.dtype)
        else:
            L, status, used = out
        return L, status, used

    def diagnostics(self) -> GPDiagnostics:
        """Status and conditioning of the covariance's factorization (usable inside ``jit``).

        Factors ``k(X, X) + diag(noise)`` (with the GP's jitter schedule) and reports
        LAPACK's status with the pivot ratio ``rcond = (min_j L_jj / max_j L_jj)^2``, an
        upper bound on ``1 / cond_2(K)``; ``singular`` flags a covariance that factored
        although ``rcond < n * eps`` (numerically singular: a finite likelihood from it is
        dominated by rounding). One factorization, ``O(n^3 / 3)``; under ``vmap`` each
        field gets the batch dimensions. A posterior has the same report for free:
        :meth:`Posterior.diagnostics`.

        Returns:
            A :class:`~gpchol._gp.diagnostics.GPDiagnostics` ``(status, rcond, threshold,
            singular, jitter_used)``; ``.warn_if_singular()`` on it issues the warning the
            eager methods issue.

        Example:
            >>> import jax.numpy as jnp
            >>> from gpchol import GaussianProcess, kernels
            >>> X = jnp.array([0.0, 5e-4, 1.0])  # nearly duplicated inputs (float32)
            >>> d = GaussianProcess(kernels.ExpSquared(), X, noise=0.0).diagnostics()
            >>> int(d.status), bool(d.singular)  # it factors, but is numerically singular
            (0, True)
            >>> d = GaussianProcess(kernels.ExpSquared(), X, noise=0.1).diagnostics()
            >>> int(d.status), bool(d.singular), bool(d.rcond > 100 * d.threshold)
            (0, False, True)
        """
        if input_mesh(self.X) is not None:
            return self._diagnostics_of()
        return _diagnostics_jit(self)

    def _diagnostics_of(self) -> GPDiagnostics:
        L, status, used = self.factor()
        return diagnose_factor(L, status, used, self.mask)

    def _warn_if_singular(self, value: jax.Array, what: str) -> None:
        """Eager methods only: warn when a finite ``value`` comes from a singular ``K``.

        Traced values (``jit``, ``vmap``, ``grad``) are left alone, as is the sharded path
        (its factor is never gathered). Costs one more factorization, eagerly only, when
        the value is finite.
        """
        if not is_concrete(value) or input_mesh(self.X) is not None:
            return
        if not bool(np.all(np.isfinite(np.asarray(value)))):
            return
        self.diagnostics().warn_if_singular(f"GaussianProcess.{what}", stacklevel=3)

    def _check_y(self, y: ArrayLike) -> None:
        shape = np.shape(y)
        if len(shape) != 1 or shape[0] != self.n:
            raise ValueError(
                f"y must have shape ({self.n},), one value per row of X; got shape {tuple(shape)}."
            )

    def _residual(self, y: ArrayLike) -> jax.Array:
        self._check_y(y)
        y = jnp.asarray(y)
        m = self.mean_vector()
        dtype = residual_dtype(self.X.dtype, y.dtype)
        r = y.astype(dtype) - m.astype(dtype)
        return r if self.mask is None else jnp.where(self.mask, r, jnp.zeros((), dtype))

    def _padded_correction(self, jitter_used: ArrayLike, dtype: DTypeLike) -> jax.Array:
        """What the padded rows take from the log-likelihood, to be added back: each is a
        standard normal with a zero residual, ``-log(2 pi) / 2`` (``- log(1 + jitter) / 2``
        with a jitter on the diagonal). Zero without a mask."""
        if self.mask is None:
            return jnp.zeros((), dtype)
        n_pad = jnp.sum(~self.mask).astype(dtype)
        return n_pad * (0.5 * LOG_2PI + 0.5 * jnp.log1p(jnp.asarray(jitter_used, dtype)))

    def _check(self, status: jax.Array, check: bool, what: str) -> None:
        if not check:
            return
        if not is_concrete(status):
            raise ValueError(
                f"{what}(..., check=True) needs concrete values and cannot run inside "
                "jax.jit/vmap/grad tracing; inside jit use "
                "`log_marginal_likelihood_with_status` and test status == 0."
            )
        try:
            raise_if_failed(self.covariance_matrix(), status, self.jitter)
        except NotPositiveDefiniteError as err:
            raise NotPositiveDefiniteError(
                f"GaussianProcess: the covariance k(X, X) + diag(noise) {err} GP hints: a "
                "larger noise variance or a lower bound on it, jitter=(1e-8, 1e-6, 1e-4) on "
                "the GaussianProcess, float64 (jax.config.update('jax_enable_x64', True)), "
                "and removing duplicated inputs.",
                pivot=err.pivot,
                batch_index=err.batch_index,
                min_diagonal=err.min_diagonal,
                jitter=err.jitter,
            ) from None

    # ------------------------------------------------------------------- likelihood
    def log_marginal_likelihood_with_status(self, y: ArrayLike) -> tuple[jax.Array, jax.Array]:
        """Log marginal likelihood and factorization status (usable inside ``jit``).

        Arguments and warning: as :meth:`log_marginal_likelihood` (which adds ``check``).

        Returns:
            ``(lml, status)``: a scalar (NaN when the covariance is not positive definite)
            and an int32 scalar status (0 = success, else the 1-based failing pivot).

        Example:
            >>> import jax, jax.numpy as jnp
            >>> from gpchol import GaussianProcess, kernels
            >>> gp = GaussianProcess(kernels.ExpSquared(), jnp.arange(3.0), noise=0.1)
            >>> lml, status = jax.jit(lambda g: g.log_marginal_likelihood_with_status(
            ...     jnp.zeros(3)))(gp)
            >>> int(status)
            0
        """
        value, status = self._lml_with_status(y)
        self._warn_if_singular(value, "log_marginal_likelihood_with_status")
        return value, status

    def _lml_with_status(self, y: ArrayLike) -> tuple[jax.Array, jax.Array]:
        mesh = input_mesh(self.X)
        if mesh is not None:
            return self._sharded_lml(self._residual(y), mesh)
        return _lml_jit(self, jnp.asarray(y))

    def _lml_of(self, y: jax.Array) -> tuple[jax.Array, jax.Array]:
        r = self._residual(y)
        if self.n == 0:
            return jnp.zeros((), r.dtype), jnp.zeros((), jnp.int32)
        # k(X, X) is read by its lower triangle (kernels are symmetric)
        be = resolve_backend(self.backend, self.X)
        nb = tile_for(be, self.n, r.dtype, check_tile_size(self.tile_size))
        value, status = gaussian_loglik(_GPCovariance(self), r, GaussianRule(be, nb, self.jitter))
        jitter = self.jitter[0] if self.jitter else 0.0
        return value + self._padded_correction(jitter, value.dtype), status

    def _sharded_lml(self, r: jax.Array, mesh: Any) -> tuple[jax.Array, jax.Array]:
        """The likelihood on ``gpchol.distributed``: covariance tiles built where they live."""
        from gpchol.distributed import gaussian_log_likelihood

        extra = self._sharded_jitter()
        X = self.X if self.X.ndim == 2 else self.X[:, None]
        return gaussian_log_likelihood(
            self.kernel, self.kernel, X, r, jnp.asarray(self.noise) + extra, mesh, self.tile_size
        )

    def _sharded_jitter(self) -> float:
        if self.jitter is not None and len(self.jitter) > 1:
            raise ValueError(
                "X is sharded over a device mesh; the sharded path takes one jitter value, "
                f"not a schedule (got {self.jitter})."
            )
        return self.jitter[0] if self.jitter else 0.0

    def log_marginal_likelihood(self, y: ArrayLike, *, check: bool = False) -> jax.Array:
        r"""``log p(y | X, theta)``, differentiable in every parameter and in ``y``.

        Args:
            y: ``(n,)`` observations.
            check: raise :class:`gpchol.NotPositiveDefiniteError` (with hints) when the
                covariance is not positive definite; needs concrete values (outside
                ``jit``). Without it a failure gives NaN.

        Returns:
            A scalar; NaN when the covariance is not positive definite.

        Warns:
            SingularCovarianceWarning: called eagerly (outside ``jit``/``vmap``/``grad``)
            when the value is finite but the covariance numerically singular (see
            :meth:`diagnostics`; checking costs one more factorization).

        Example:
            >>> import jax.numpy as jnp
            >>> from gpchol import GaussianProcess, kernels
            >>> gp = GaussianProcess(kernels.White(1e-9), jnp.arange(2.0), noise=1.0)
            >>> round(float(gp.log_marginal_likelihood(jnp.zeros(2))), 4)  # -log(2 pi)
            -1.8379
        """
        value, status = self._lml_with_status(y)
        self._check(status, check, "log_marginal_likelihood")
        self._warn_if_singular(value, "log_marginal_likelihood")
        return value

    def condition(
        self, y: ArrayLike, *, check: bool = False, block_size: int | None = None
    ) -> Posterior | ShardedPosterior:
        """The posterior given observations ``y`` at the training inputs.

        ``K = k(X, X) + diag(noise)`` is built and factored in place inside one jitted
        program (the likelihood's forward pass: host LAPACK on the CPU): the posterior
        keeps one ``n x n`` buffer, the factor, and ``O(n)`` vectors. Differentiable in
        every parameter and in ``y`` (forming ``dK`` only when differentiated).

        Args:
            y: ``(n,)`` observations.
            check: raise :class:`gpchol.NotPositiveDefiniteError` outside ``jit`` when
                the covariance is not positive definite (else results are NaN).
            block_size: the default number of test points per block of the posterior's
                predictions (``None``: chosen from ``n``, see :class:`Posterior`).

        Returns:
            A :class:`Posterior` (a pytree) holding the factor and ``alpha = K^-1 (y - m)``.
            With ``X`` placed on a multi-device mesh: a
            :class:`gpchol.distributed.ShardedPosterior` (same ``mean``, ``variance`` and
            ``mean_and_variance``), whose factor stays in its block-cyclic tiles.

        Warns:
            SingularCovarianceWarning: called eagerly when the likelihood is finite but the
            covariance numerically singular (:meth:`Posterior.diagnostics`; no extra cost).

        Example:
            >>> import jax.numpy as jnp
            >>> from gpchol import GaussianProcess, kernels
            >>> X = jnp.arange(4.0)
            >>> post = GaussianProcess(kernels.ExpSquared(), X, noise=1e-4).condition(X)
            >>> post.variance(X).shape
            (4,)
        """
        self._check_y(y)
        mesh = input_mesh(self.X)
        if mesh is not None:  # the factor stays in its block-cyclic tiles, never gathered
            from gpchol.distributed import condition as sharded_condition

            extra = self._sharded_jitter()
            return sharded_condition(
                self.kernel,
                self.kernel,
                self.X if self.X.ndim == 2 else self.X[:, None],
                y,
                noise=self.noise,
                mean=self.mean,
                mesh=mesh,
                jitter=extra or None,
                T_A=self.tile_size,
                block_size=block_size,
                check=check,
                part_check=model_part,  # (params = self.kernel, part)
            )
        if not isinstance(y, (jax.Array, np.ndarray)):
            y = np.asarray(y)  # a list or a number: one argument, not a pytree of them
        L, value, alpha, status, used, diagnostics = _condition_jit(self, y)
        if check and (not is_concrete(status) or bool(np.any(np.asarray(status) != 0))):
            self._check(status, check, "condition")
        post = Posterior(self, L, alpha, value, status, used, block_size)
        if is_concrete(value) and bool(np.all(np.isfinite(np.asarray(value)))):
            diagnostics.warn_if_singular("GaussianProcess.condition", stacklevel=2)
        return post

    def numpyro_dist(self) -> Any:
        """This GP's marginal distribution over ``y`` as a NumPyro distribution.

        Returns:
            ``gpchol.numpyro.GaussianProcessMarginal(kernel, X, noise=..., mean=...)``.

        Example:
            >>> import jax.numpy as jnp
            >>> from gpchol import GaussianProcess, kernels
            >>> gp = GaussianProcess(kernels.ExpSquared(), jnp.arange(3.0), noise=0.1)
            >>> dist = gp.numpyro_dist()  # doctest: +SKIP
        """
        from gpchol import numpyro as _gnp

        if self.mask is not None:
            raise ValueError(
                "numpyro_dist() of a GaussianProcess with padded rows (mask) is not "
                "supported; build the GP on the real points only."
            )

        # X placed on a multi-device mesh: the distribution's log_prob takes the sharded path.
        return _gnp.GaussianProcessMarginal(
            self.kernel, self.X, noise=self.noise, mean=self.mean, mesh=input_mesh(self.X)
        )


jax.tree_util.register_pytree_node_class(GaussianProcess)

# One program per model structure and shapes when called eagerly or under an eager
# jax.grad (each operation would otherwise compile a small program of its own, and an
# eager lax.cond closing over the data one per call); inlined into a caller's jit, so
# the caller's program is the one it was without them. (A nested call would compile an
# eager gradient as a few programs instead of about thirty small ones, but where kernel
# parameters are constants of the caller's program XLA then rebuilds the covariance for
# a failed factor's status search with other rounding than the factored one -- a
# division where the factored one multiplies by the reciprocal -- and the status of
# near-singular covariances is no longer LAPACK's: tests/test_status.py, tiled backend.)
_lml_jit = jax.jit(GaussianProcess._lml_of, inline=True)
_diagnostics_jit = jax.jit(GaussianProcess._diagnostics_of, inline=True)
