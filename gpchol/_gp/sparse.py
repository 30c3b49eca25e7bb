r"""Sparse GP regression (SGPR): Titsias' collapsed evidence lower bound on ``M`` inducing inputs.

With inducing inputs ``Z`` ``(M, d)``, ``Kuu = k(Z, Z)`` (+ jitter), ``Kuf = k(Z, X)`` and
``Qff = Kfu Kuu^-1 Kuf``, the collapsed bound of Titsias (2009, AISTATS, eq. 9) on
``log p(y)`` is

.. math::
    \mathcal{L} = \log \mathcal{N}(y \mid m(X), Q_{ff} + \Lambda)
    - \tfrac12 \operatorname{tr}\big(\Lambda^{-1} (K_{ff} - Q_{ff})\big),
    \qquad \Lambda = \operatorname{diag}(\text{noise}).

With ``Kuu = Luu Luu^T`` (gpchol's factor), ``A = Luu^-1 Kuf Lambda^-1/2`` ``(M, n)``,
``B = I + A A^T = LB LB^T`` and ``e = Lambda^-1/2 (y - m(X))``, ``c = LB^-1 A e``, the matrix
inversion and determinant lemmas give

.. math::
    \mathcal{L} = -\tfrac{n}{2}\log 2\pi - \tfrac12 \sum_i \log \Lambda_{ii}
    - \sum_j \log (L_B)_{jj} - \tfrac12 e^T e + \tfrac12 c^T c
    - \tfrac12 \sum_i k(x_i, x_i) / \Lambda_{ii} + \tfrac12 \operatorname{tr}(A A^T).

Every term over the data is a sum over rows: ``A A^T``, ``A e``, ``e^T e``, ``sum k_ii /
Lambda_ii`` and ``sum log Lambda_ii``. They are accumulated over blocks of rows (a
``lax.scan``; ``Luu^-1`` is formed once, so a block's slice of ``A`` is one GEMM, and the
derivative a hand-derived rule, :func:`_rows_jvp`, whose blocks are rebuilt in the
reverse pass under ``jax.checkpoint``), so the value and its gradient take ``O(n M^2)``
time and ``O(b M + M^2)`` memory besides ``X`` and ``y``. With ``X`` placed on a mesh by
rows, each device sums its own rows and the statistics are added with one ``psum``
(:mod:`gpchol.distributed._rowsum`).

The predictive distribution of the latent function (Titsias 2009, eq. 6) at ``Xs``, with
``V1 = Luu^-1 k(Z, Xs)`` and ``V2 = LB^-1 V1``::

    mean = m(Xs) + V2^T c,     cov = k(Xs, Xs) - V1^T V1 + V2^T V2.

Example:
    >>> import jax.numpy as jnp
    >>> from gpchol import kernels, SparseGP
    >>> X = jnp.linspace(0.0, 1.0, 50)
    >>> gp = SparseGP(kernels.ExpSquared(0.3), X, inducing=X[::10], noise=0.01, jitter=1e-6)
    >>> bool(jnp.isfinite(gp.elbo(jnp.sin(6.0 * X))))
    True
"""

from __future__ import annotations

import dataclasses
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.typing import ArrayLike

from gpchol._base.errors import NotPositiveDefiniteError
from gpchol._base.pytrees import AttrPytree, register_fields
from gpchol._base.validate import (
    as_inputs,
    check_finite_rows,
    check_int,
    check_jitter,
    input_mesh,
    is_concrete,
    real_variance,
)
from gpchol._gp.posterior import KernelPrior, model_part
from gpchol._linalg import posterior_core as core
from gpchol._linalg.blocks import trsm
from gpchol._linalg.gaussian import LOG_2PI
from gpchol._linalg.status import raise_if_failed
from gpchol._routing import cholesky_with_status
from gpchol.kernels import Kernel, as_kernel
from gpchol.means import Mean, as_mean

__all__ = ["SparseGP", "SparsePosterior", "default_row_block"]

#: A block of rows holds at most this many elements of the ``(M, b)`` cross-covariance
#: (8 MiB in float64).
_BLOCK_ELEMENTS = 1 << 20


def default_row_block(n: int, M: int) -> int:
    """Rows per block of the bound's sums: ``2^20 / M`` clipped to ``[128, 8192]``, at most ``n``.

    Example:
        >>> default_row_block(10**6, 512), default_row_block(300, 64)
        (2048, 300)
    """
    b = max(128, min(8192, _BLOCK_ELEMENTS // max(M, 1)))
    return max(1, min(b, n))


def _check_row_block(block_size: object) -> int | None:
    if block_size is None:
        return None
    return check_int(block_size, "block_size", "rows per block")


# ----------------------------------------------------------------------------------------
# The bound as functions of the factors (one device, or one device's rows of a mesh)
# ----------------------------------------------------------------------------------------


def _block_inputs(
    kernel: Any,
    Z: jax.Array,
    Xb: jax.Array,
    rb: jax.Array,
    nzb: jax.Array,
    wb: jax.Array,
) -> tuple[jax.Array, ...]:
    """What one block of rows brings besides ``Luu``: ``Kuf_b = k(Z, X_b)`` ``(M, b)``, the
    row scales ``s = w / sqrt(noise)``, ``e = r s``, ``sum w k_ii / noise_i`` and ``sum w log
    noise_i`` (weights ``wb`` 0 on rows counted by another block)."""
    dtype = rb.dtype
    s = wb / jnp.sqrt(nzb)
    K = kernel(Z, Xb).astype(dtype)
    kd = kernel.diag(Xb).astype(dtype)
    return K, s, rb * s, jnp.sum(wb * kd / nzb), jnp.sum(wb * jnp.log(nzb))


def _block_slices(
    X: jax.Array, r: jax.Array, nz: jax.Array, j: jax.Array, b: int
) -> tuple[jax.Array, ...]:
    """Block ``j``'s rows ``(X_b, r_b, noise_b, w_b)``: the last block is shifted back
    to fit, and the rows it shares with the previous block are weighted 0."""
    n = X.shape[0]
    start = jnp.minimum(j * b, n - b)
    Xb = lax.dynamic_slice_in_dim(X, start, b)
    rb = lax.dynamic_slice_in_dim(r, start, b)[:, 0]
    nb = lax.dynamic_slice_in_dim(nz, start, b)[:, 0]
    w = (start + jnp.arange(b) >= j * b).astype(r.dtype)
    return Xb, rb, nb, w


def _sum_blocks(count: int, one: Any) -> Any:
    """The sum over ``j = 0 .. count - 1`` of the pytree ``one(j)``, a ``lax.scan``; the first
    block's sums start the carry (typed like the rows, also inside ``shard_map``)."""
    init = one(jnp.zeros((), jnp.int32))
    if count == 1:
        return init

    def step(acc: Any, j: jax.Array) -> tuple[Any, None]:
        return jax.tree_util.tree_map(lambda u, v: u + v, acc, one(j)), None

    return lax.scan(step, init, jnp.arange(1, count, dtype=jnp.int32))[0]


@partial(jax.custom_jvp, nondiff_argnums=(6,))
def _rows(
    kernel: Any,
    Z: jax.Array,
    Luu: jax.Array,
    X: jax.Array,
    r: jax.Array,
    nz: jax.Array,
    block: int,
) -> tuple[jax.Array, ...]:
    r"""The bound's row sums ``(S = A A^T, c = A e, e^T e, sum k_ii / noise_i, sum log
    noise_i)``, ``A = Luu^-1 Kuf Lambda^-1/2``, ``e = Lambda^-1/2 r`` (Titsias 2009, eq. 9,
    in the module docstring's form), ``block`` rows at a time.

    ``Luu^-1`` is formed once (one triangular solve against the identity), so block ``b``
    costs ``k(Z, X_b)``, one GEMM ``B_b = Luu^-1 Kuf_b`` and the rank-``b`` update of ``S``.
    The derivative is the rule :func:`_rows_jvp` (forward and reverse mode: JAX transposes
    it; each block is rebuilt in the reverse pass, nothing of size ``(M, b)`` is kept).
    """
    n = X.shape[0]
    M = Luu.shape[0]
    dtype = Luu.dtype
    b = max(1, min(block, n))
    Linv = trsm(Luu, jnp.eye(M, dtype=dtype), left=True)

    def one(j: jax.Array) -> tuple[jax.Array, ...]:
        Xb, rb, nb, w = _block_slices(X, r, nz, j, b)
        K, s, e, tk, ln = _block_inputs(kernel, Z, Xb, rb, nb, w)
        A = (Linv @ K) * s[None, :]
        return A @ A.T, A @ e, jnp.dot(e, e), tk, ln

    return _sum_blocks(-(-n // b), one)


@_rows.defjvp
def _rows_jvp(
    block: int, primals: tuple[Any, ...], tangents: tuple[Any, ...]
) -> tuple[tuple[jax.Array, ...], tuple[jax.Array, ...]]:
    r"""The derivative of :func:`_rows` (derived here for the sums of Titsias 2009, eq. 9).

    Block ``b``, with ``B_b = Luu^-1 Kuf_b``, ``A_b = B_b diag(s_b)``, ``e_b = r_b s_b``:

    * ``dA_b = Luu^-1 dKuf_b diag(s_b) + B_b diag(ds_b) + d(Luu^-1) Kuf_b diag(s_b)``; the
      last term is ``d(Luu^-1) Luu A_b = P A_b`` with ``P = -Luu^-1 dLuu``
      (``d(Luu^-1) = -Luu^-1 dLuu Luu^-1``; ``dLuu`` lower triangular as ``Luu``);
    * ``dS = sum_b (dA_b A_b^T + A_b dA_b^T) = T + T^T``, ``T = sum_b dA_b A_b^T``;
      ``dc = sum_b (dA_b e_b + A_b de_b)``; ``d(e^T e) = 2 sum_b e_b^T de_b``.

    The ``P`` terms sum over blocks to ``P S`` and ``P c``, added once after the blocks; so
    per block ``dA_b`` is one GEMM (``Luu^-1 dKuf_b``) and ``T`` one more. Transposed by JAX
    for the reverse pass this is ``dA_b = (G + G^T) A_b + g e_b^T`` and ``dKuf_b = Luu^-T
    (dA_b diag(s_b))`` (two GEMMs a block, ``G``, ``g`` the cotangents of ``S``, ``c``), and
    the blocks run under ``jax.checkpoint`` so only their index is kept between the passes.
    """
    kernel, Z, Luu, X, r, nz = primals
    tkern, tZ, tL, tX, tr, tnz = tangents
    n = X.shape[0]
    M = Luu.shape[0]
    dtype = Luu.dtype
    b = max(1, min(block, n))
    Linv = trsm(Luu, jnp.eye(M, dtype=dtype), left=True)

    def one(
        j: jax.Array, kernel: Any, Z: jax.Array, tkern: Any, tZ: jax.Array
    ) -> tuple[tuple[jax.Array, ...], tuple[jax.Array, ...]]:
        Xb, rb, nb, w = _block_slices(X, r, nz, j, b)
        tXb, trb, tnb, _ = _block_slices(tX, tr, tnz, j, b)
        (K, s, e, tk, ln), (dK, ds, de, dtk, dln) = jax.jvp(
            lambda k, z, x, rr, nn: _block_inputs(k, z, x, rr, nn, w),
            (kernel, Z, Xb, rb, nb),
            (tkern, tZ, tXb, trb, tnb),
        )
        B = Linv @ K
        A = B * s[None, :]
        dA = (Linv @ dK) * s[None, :] + B * ds[None, :]
        primal = (A @ A.T, A @ e, jnp.dot(e, e), tk, ln)
        tangent = (dA @ A.T, dA @ e + A @ de, 2.0 * jnp.dot(e, de), dtk, dln)
        return primal, tangent

    one_c = jax.checkpoint(one)
    (S, c, ee, tk, ln), (T, dc, dee, dtk, dln) = _sum_blocks(
        -(-n // b), lambda j: one_c(j, kernel, Z, tkern, tZ)
    )
    P = -Linv @ jnp.tril(tL)
    T = T + P @ S
    return (S, c, ee, tk, ln), (T + T.T, dc + P @ c, dee, dtk, dln)


def row_stats(
    shared: tuple[Any, jax.Array, jax.Array],
    X: jax.Array,
    r: jax.Array,
    nz: jax.Array,
    *,
    block: int,
) -> tuple[jax.Array, ...]:
    """The bound's sums over the rows of ``X``, ``block`` rows at a time.

    Args:
        shared: ``(kernel, Z, Luu)``.
        X: ``(n, d)`` inputs.
        r: ``(n, 1)``, the residual ``y - m(X)``.
        nz: ``(n, 1)``, the noise variance of each row.
        block: rows per block (static).

    Returns:
        ``(A A^T (M, M), A e (M,), e^T e, sum k_ii / noise_i, sum log noise_i)``.
    """
    kernel, Z, Luu = shared
    dtype = Luu.dtype
    return _rows(kernel, Z, Luu, X, r.astype(dtype), nz.astype(dtype), block)


def bound_from_stats(
    stats: tuple[jax.Array, ...], n: int
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``(bound, LB, c)`` from the row sums (see the module docstring)."""
    AAt, Ae, ee, tk, ln = stats
    M = AAt.shape[0]
    B = jnp.eye(M, dtype=AAt.dtype) + AAt
    LB, _ = cholesky_with_status(B)
    c = trsm(LB, Ae[:, None], left=True)[:, 0]
    value = (
        -0.5 * n * LOG_2PI
        - 0.5 * ln
        - jnp.sum(jnp.log(jnp.diagonal(LB)))
        - 0.5 * ee
        + 0.5 * jnp.dot(c, c)
        - 0.5 * tk
        + 0.5 * jnp.trace(AAt)
    )
    return value, LB, c


# ----------------------------------------------------------------------------------------
# The model
# ----------------------------------------------------------------------------------------


class SparseGP(AttrPytree):
    r"""Sparse GP regression on inducing inputs: Titsias' collapsed bound (SGPR).

    The model is that of :class:`gpchol.GaussianProcess` (``y = f(X) + eps``, Gaussian
    noise); its evidence is approximated from below through ``M`` inducing inputs ``Z``
    (see the module docstring), in ``O(n M^2)`` time and without any ``n x n`` or ``n x
    M`` matrix: the rows are summed in blocks of ``block_size``. :meth:`elbo` is what
    :func:`gpchol.fit` maximises for this model (its ``log_marginal_likelihood`` field is
    then the bound).

    Args:
        kernel: a :class:`gpchol.kernels.Kernel`.
        X: ``(n, d)`` training inputs (``(n,)`` is read as ``(n, 1)``). Placed on a mesh by
            rows (``NamedSharding(mesh, P(rows))``), the bound sums each device's rows
            where they live (one ``psum`` of the ``M x M`` and ``M``-vector sums).
        inducing: ``(M, d)`` inducing inputs ``Z``, ``1 <= M <= n``
            (:func:`gpchol.inducing_points` chooses them). Keyword-only.
        noise: observation-noise variance: a scalar or ``(n,)``, positive. Keyword-only.
        mean: the prior mean (as in :class:`gpchol.GaussianProcess`). Default ``0.0``.
        jitter: ``None``, a float added to the diagonal of ``Kuu = k(Z, Z)``, or a tuple
            tried in order until ``Kuu`` factors (see :func:`gpchol.cholesky_with_status`).
        fixed_inducing: keep ``Z`` out of the gradient (its cotangent is zero), so a fit
            that passes ``Z`` in its parameters leaves it where it is. Default: learnable.
        block_size: rows per block of the sums (``None``: ``2^20 / M`` rows, clipped to
            ``[128, 8192]``).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from gpchol import kernels, SparseGP
        >>> X = jnp.linspace(0.0, 1.0, 40)
        >>> def loss(ls):
        ...     gp = SparseGP(kernels.ExpSquared(ls), X, inducing=X[::8], noise=0.1)
        ...     return -gp.elbo(jnp.cos(4.0 * X))
        >>> bool(jnp.isfinite(jax.grad(loss)(0.3)))
        True
    """

    def __init__(
        self,
        kernel: Kernel,
        X: Any,
        *,
        inducing: Any,
        noise: Any,
        mean: Any = 0.0,
        jitter: Any = None,
        fixed_inducing: bool = False,
        block_size: int | None = None,
    ) -> None:
        if not isinstance(kernel, Kernel):
            kernel = as_kernel(kernel)
        X = as_inputs(X)
        n, d = X.shape
        Z = jnp.asarray(inducing)
        if Z.ndim == 1 and d == 1:
            Z = Z[:, None]
        if Z.ndim != 2 or Z.shape[1] != d:
            raise ValueError(
                f"inducing (the inducing inputs Z) must have shape (M, {d}), one column per "
                f"column of X; got shape {tuple(Z.shape)}."
            )
        M = Z.shape[0]
        if M < 1 or M > n:
            raise ValueError(
                f"inducing must hold between 1 and n = {n} points (M <= n); got M = {M}. "
                "With M >= n an exact gpchol.GaussianProcess is cheaper and exact."
            )
        if not jnp.issubdtype(Z.dtype, jnp.floating):
            Z = Z.astype(X.dtype)
        noise = real_variance(noise, X.dtype)
        if noise.ndim > 1 or (noise.ndim == 1 and noise.shape[0] not in (1, n)):
            raise ValueError(
                f"noise must be a scalar variance or have shape ({n},), one variance per "
                f"training point; got shape {tuple(noise.shape)}."
            )
        if is_concrete(X, Z, noise):
            check_finite_rows(X, "X", "drop or impute them")
            check_finite_rows(Z, "inducing (the inducing inputs Z)", "give finite inducing inputs")
            nz = np.asarray(noise)
            if not np.all(np.isfinite(nz)) or np.any(nz <= 0):
                raise ValueError(
                    "noise (the observation-noise variance) must be finite and > 0 for a "
                    "sparse GP (the bound divides by it); got "
                    f"{nz if nz.ndim == 0 else 'an array with non-positive or non-finite values'}."
                )
        self.kernel = kernel
        self.X = X
        self.inducing = Z
        self.noise = noise
        self.mean = as_mean(mean) if not isinstance(mean, Mean) else mean
        self.jitter = check_jitter(jitter)
        self.fixed_inducing = bool(fixed_inducing)
        self.block_size = _check_row_block(block_size)

    _CHILDREN = ("kernel", "X", "inducing", "noise", "mean")
    _AUX = ("jitter", "fixed_inducing", "block_size")

    def __repr__(self) -> str:
        return (
            f"SparseGP(kernel={type(self.kernel).__name__}, n={self.n}, M={self.M}, "
            f"jitter={self.jitter})"
        )

    @property
    def n(self) -> int:
        """Number of training points."""
        return self.X.shape[0]

    @property
    def M(self) -> int:
        """Number of inducing inputs."""
        return self.inducing.shape[0]

    # ------------------------------------------------------------------------ pieces
    def _Z(self) -> jax.Array:
        return lax.stop_gradient(self.inducing) if self.fixed_inducing else self.inducing

    def _dtype(self, y: jax.Array) -> Any:
        dtype = jnp.result_type(self.X.dtype, y.dtype, self.inducing.dtype)
        return dtype if jnp.issubdtype(dtype, jnp.floating) else self.X.dtype

    def _residual(self, y: ArrayLike) -> jax.Array:
        y = jnp.asarray(y)
        if y.ndim != 1 or y.shape[0] != self.n:
            raise ValueError(
                f"y must have shape ({self.n},), one value per row of X; got shape "
                f"{tuple(y.shape)}."
            )
        dtype = self._dtype(y)
        return y.astype(dtype) - self.mean(self.X).astype(dtype)

    def factor(self, dtype: Any = None) -> tuple[jax.Array, jax.Array, jax.Array]:
        """Cholesky factor of ``Kuu = k(Z, Z)`` (with the jitter schedule), with status.

        Returns:
            ``(Luu (M, M), status, jitter_used)``: ``Luu`` all NaN when ``Kuu`` is not
            positive definite, ``status`` 0 or the 1-based failing pivot.

        Example:
            >>> import jax.numpy as jnp
            >>> from gpchol import kernels, SparseGP
            >>> X = jnp.arange(6.0)
            >>> L, status, used = SparseGP(kernels.ExpSquared(), X, inducing=X[:3],
            ...                            noise=0.1).factor()
            >>> int(status), L.shape
            (0, (3, 3))
        """
        Z = self._Z()
        dtype = dtype or Z.dtype
        Kuu = self.kernel(Z, Z).astype(dtype)
        out = cholesky_with_status(Kuu, jitter=self.jitter)
        if self.jitter is None:
            L, status = out
            return L, status, jnp.zeros((), dtype)
        return out  # type: ignore[return-value]

    def _stats(self, Luu: jax.Array, r: jax.Array) -> tuple[jax.Array, ...]:
        nz = jnp.broadcast_to(self.noise.astype(r.dtype).reshape(-1), (self.n,))
        X = self.X.astype(r.dtype)
        b = self.block_size or default_row_block(self.n, self.M)
        shared = (self.kernel, self._Z().astype(r.dtype), Luu)
        mesh = input_mesh(self.X)
        if mesh is not None:
            from gpchol.distributed._rowsum import row_axes, row_sharded_sum

            axes = row_axes(self.X)
            if axes:
                parts = int(np.prod([mesh.shape[a] for a in axes]))
                local = partial(row_stats, block=min(b, max(1, self.n // parts)))
                return row_sharded_sum(local, mesh, axes, (X, r[:, None], nz[:, None]), shared)
        return row_stats(shared, X, r[:, None], nz[:, None], block=b)

    def _bound(self, y: ArrayLike) -> tuple[jax.Array, ...]:
        r = self._residual(y)
        if input_mesh(self.X) is None:
            return _bound_jit(self, r)
        return self._bound_of(r)

    def _bound_of(self, r: jax.Array) -> tuple[jax.Array, ...]:
        Luu, status, used = self.factor(r.dtype)
        stats = self._stats(Luu, r)
        value, LB, c = bound_from_stats(stats, self.n)
        return value, status, used, Luu, LB, c, stats[0]

    # ------------------------------------------------------------------- the bound
    def elbo_with_status(self, y: ArrayLike) -> tuple[jax.Array, jax.Array]:
        """The collapsed bound and the status of ``Kuu``'s factor (usable inside ``jit``).

        Arguments: as :meth:`elbo` (which adds ``check``).

        Returns:
            ``(elbo, status)``: a scalar (NaN when ``Kuu`` is not positive definite) and an
            int32 status (0 = success, else the 1-based failing pivot of ``Kuu``).

        Example:
            >>> import jax, jax.numpy as jnp
            >>> from gpchol import kernels, SparseGP
            >>> X = jnp.arange(8.0)
            >>> gp = SparseGP(kernels.ExpSquared(), X, inducing=X[::2], noise=0.1)
            >>> value, status = jax.jit(lambda g: g.elbo_with_status(jnp.zeros(8)))(gp)
            >>> int(status)
            0
        """
        value, status = self._bound(y)[:2]
        return value, status

    def elbo(self, y: ArrayLike, *, check: bool = False) -> jax.Array:
        r"""Titsias' collapsed evidence lower bound on ``log p(y)``, differentiable.

        Differentiable in every parameter (kernel, inducing inputs, noise, mean) and in
        ``y``; the factors of ``Kuu`` and ``B`` are gpchol's, their gradient its adjoint.

        Args:
            y: ``(n,)`` observations.
            check: raise :class:`gpchol.NotPositiveDefiniteError` (outside ``jit``) when
                ``Kuu`` is not positive definite; without it the bound is NaN.

        Returns:
            A scalar, at most the exact GP's ``log p(y)`` (equal to it when ``Z = X``).

        Example:
            >>> import jax.numpy as jnp
            >>> from gpchol import kernels, SparseGP, GaussianProcess
            >>> X = jnp.linspace(0.0, 3.0, 30)
            >>> y = jnp.sin(X)
            >>> k = kernels.ExpSquared(1.0)
            >>> sparse = SparseGP(k, X, inducing=X[::6], noise=0.1).elbo(y)
            >>> exact = GaussianProcess(k, X, noise=0.1).log_marginal_likelihood(y)
            >>> bool(sparse <= exact + 1e-4)
            True
        """
        value, status = self.elbo_with_status(y)
        if check:
            self._check(status, "elbo")
        return value

    def fit_objective(self, y: ArrayLike) -> jax.Array:
        """What :func:`gpchol.fit` maximises for this model: :meth:`elbo`."""
        return self.elbo(y)

    def _check(self, status: jax.Array, what: str) -> None:
        if not is_concrete(status):
            raise ValueError(
                f"SparseGP.{what}(..., check=True) needs concrete values and cannot run "
                "inside jax.jit/vmap/grad tracing; use elbo_with_status and test status == 0."
            )
        try:
            Z = self.inducing
            raise_if_failed(self.kernel(Z, Z), status, self.jitter)
        except NotPositiveDefiniteError as err:
            raise NotPositiveDefiniteError(
                f"SparseGP: the inducing covariance k(Z, Z) {err} Sparse GP hints: "
                "jitter=(1e-8, 1e-6, 1e-4) on the SparseGP, fewer or better separated "
                "inducing inputs (gpchol.inducing_points), float64.",
                pivot=err.pivot,
                batch_index=err.batch_index,
                min_diagonal=err.min_diagonal,
                jitter=err.jitter,
            ) from None

    def condition(self, y: ArrayLike, *, check: bool = False) -> SparsePosterior:
        """The approximate posterior given ``y`` (Titsias 2009's optimal ``q(u)``).

        Args:
            y: ``(n,)`` observations.
            check: raise :class:`gpchol.NotPositiveDefiniteError` (outside ``jit``) when
                ``Kuu`` is not positive definite (else predictions are NaN).

        Returns:
            A :class:`SparsePosterior` holding ``O(M^2)``: the factors ``Luu`` and ``LB``,
            ``c``, and what its predictions use (see :class:`SparsePosterior`).

        Example:
            >>> import jax.numpy as jnp
            >>> from gpchol import kernels, SparseGP
            >>> X = jnp.linspace(0.0, 1.0, 20)
            >>> post = SparseGP(kernels.ExpSquared(0.3), X, inducing=X[::4],
            ...                 noise=0.01).condition(jnp.sin(5.0 * X))
            >>> post.mean(jnp.array([0.5])).shape
            (1,)
        """
        value, status, used, Luu, LB, c, R, w = _condition_jit(self, jnp.asarray(y))
        if check:
            self._check(status, "condition")
        return SparsePosterior(self, Luu, LB, c, R, w, value, status, used)


@jax.jit
def _condition_jit(gp: SparseGP, y: jax.Array) -> tuple[jax.Array, ...]:
    """The bound's factors, and the posterior's ``R`` and ``w`` (see :class:`SparseSolver`)."""
    value, status, used, Luu, LB, c, AAt = gp._bound(y)
    # R^T R = I - B^-1 = B^-1 A A^T (B = I + A A^T; the two commute), so that
    # var = k - ||R Luu^-1 k(Z, x)||^2. R is the transposed Cholesky factor of that
    # product plus M eps (its largest entry) I: an eigendecomposition's square root has
    # no derivative where two of A A^T's eigenvalues meet or one is 0 (an inducing point
    # far from the data), and NaN gradients of the variance there; the shift lowers a
    # variance by at most M eps k(x, x).
    E = trsm(LB, trsm(LB, AAt, left=True), left=True, trans=True)
    E = 0.5 * (E + E.T)
    M = E.shape[0]
    shift = M * jnp.finfo(E.dtype).eps * jnp.maximum(jnp.max(jnp.diagonal(E)), 1.0)
    R = cholesky_with_status(E + shift * jnp.eye(M, dtype=E.dtype))[0].T
    w = trsm(Luu, trsm(LB, c[:, None], left=True, trans=True), left=True, trans=True)[:, 0]
    return value, status, used, Luu, LB, c, R, w


jax.tree_util.register_pytree_node_class(SparseGP)

# One program per model structure and shapes when called eagerly or under an eager
# jax.grad. Not inline=True (as gpchol/_gp/model.py's _lml_jit, whose status search
# re-evaluates the kernel): an inlined call's tangent is staged op by op and an eager
# gradient transposed one compiled operation at a time (tests/test_refit.py counts
# them); inside a caller's jit the nested call is inlined by XLA.
_bound_jit = jax.jit(SparseGP._bound_of)


# ----------------------------------------------------------------------------------------
# The posterior: a solver of the posterior core
# ----------------------------------------------------------------------------------------


@register_fields
@dataclasses.dataclass(frozen=True)
class SparseSolver(KernelPrior):
    r"""SGPR's predictive for the posterior core (:mod:`gpchol._linalg.posterior_core`).

    With ``Sigma = (Kuu + Kuf Lambda^-1 Kfu)^-1 = Luu^-T B^-1 Luu^-1`` the predictive of
    ``f`` (Titsias 2009, eq. 6) is ``mean = m(x) + k(x, Z) w`` with ``w = Kuu^-1 mu_u =
    Luu^-T LB^-T c``, and ``var = k(x, x) - k(x, Z) (Kuu^-1 - Sigma) k(Z, x)``. Since
    ``Kuu^-1 - Sigma = Luu^-T (I - B^-1) Luu^-1`` and ``I - B^-1 = R^T R`` (from the
    eigendecomposition of ``A A^T = B - I``, computed once when conditioning), the
    whitened cross-covariance is ``V = R Luu^-1 k(Z, x)``: the core's
    ``var = k(x, x) - ||V||^2`` form. A part of an additive kernel takes its own
    ``k_j(Z, x)`` in the same formulas (``Cov(f_j, u) = k_j(x, Z)``).
    """

    gp: Any
    Luu: jax.Array
    R: jax.Array
    w: jax.Array

    def default_block(self, m: int) -> int:
        return core.default_block_size(self.Luu.shape[-1], m)

    def project(self, xb: jax.Array, part: Any, whiten: bool) -> tuple[jax.Array, jax.Array | None]:
        Z = self.gp.inducing.astype(xb.dtype)
        Kus = self._kernel(part)(Z, xb).astype(xb.dtype)  # (M, b)
        mu = Kus.T @ self.w.astype(xb.dtype)
        if not whiten:
            return mu, None
        return mu, self.R.astype(xb.dtype) @ trsm(self.Luu, Kus, left=True)


class SparsePosterior(AttrPytree, core.Predictions):
    """The approximate posterior of a :class:`SparseGP` (from ``gp.condition(y)``).

    Holds ``O(M^2)``; predictions run through the posterior core (blocks of test points,
    one jitted program per shape and option) and cost ``O(M^2)`` per test point. Methods
    take the arguments of :class:`gpchol.Posterior`'s: ``kernel=`` (one additive part of
    the kernel), ``include_noise``/``noise=`` (new observations ``y*``), ``block_size``.

    Attributes:
        gp: the :class:`SparseGP`.
        Luu: ``(M, M)`` factor of ``k(Z, Z)`` (+ jitter).
        LB: ``(M, M)`` factor of ``B = I + A A^T``.
        c: ``(M,)``, ``LB^-1 A Lambda^-1/2 (y - m(X))``.
        R: ``(M, M)`` upper, ``R^T R = I - B^-1`` (plus ``M eps`` times its largest
            entry on the diagonal).
        w: ``(M,)``, ``Kuu^-1`` times the optimal ``q(u)``'s mean.
        elbo: the collapsed bound at ``y``.
        status: int32 status of ``Kuu``'s factor.
        jitter_used: the jitter added to ``Kuu``.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from gpchol import kernels, SparseGP
        >>> X = jnp.linspace(0.0, 1.0, 20)
        >>> post = SparseGP(kernels.ExpSquared(0.3), X, inducing=X[::4],
        ...                 noise=0.01).condition(X)
        >>> Xs = jnp.array([0.1, 0.7])
        >>> post.variance(Xs).shape, post.covariance(Xs).shape
        ((2,), (2, 2))
        >>> post.sample(jax.random.PRNGKey(0), Xs, 3).shape
        (3, 2)
    """

    def __init__(
        self,
        gp: SparseGP,
        Luu: jax.Array,
        LB: jax.Array,
        c: jax.Array,
        R: jax.Array,
        w: jax.Array,
        elbo: jax.Array,
        status: jax.Array,
        jitter_used: jax.Array,
    ) -> None:
        self.gp = gp
        self.Luu = Luu
        self.LB = LB
        self.c = c
        self.R = R
        self.w = w
        self.elbo = elbo
        self.status = status
        self.jitter_used = jitter_used

    _CHILDREN = ("gp", "Luu", "LB", "c", "R", "w", "elbo", "status", "jitter_used")

    def __repr__(self) -> str:
        return f"SparsePosterior(M={self.Luu.shape[-1]}, dtype={self.Luu.dtype})"

    @property
    def _solver(self) -> SparseSolver:
        return SparseSolver(self.gp, self.Luu, self.R, self.w)

    def _core_args(self, Xs: ArrayLike | None, kernel: Any, block_size: object) -> dict[str, Any]:
        return dict(
            dtype=self.Luu.dtype,
            part=model_part(self.gp.kernel, kernel),
            model_noise=self.gp.noise,
            block_size=block_size,
        )


jax.tree_util.register_pytree_node_class(SparsePosterior)
