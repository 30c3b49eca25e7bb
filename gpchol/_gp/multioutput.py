r"""Multi-output exact GPs: intrinsic / linear coregionalisation on gpchol's Cholesky.

The model (the *linear model of coregionalisation*, LMC; with one latent kernel the
*intrinsic coregionalisation model*, ICM) has ``p`` outputs observed at ``n`` inputs:

.. math::
    \operatorname{cov}(f_a(x), f_b(x')) = \sum_q B_q[a, b]\, k_q(x, x'), \qquad
    B_q = W_q W_q^T + \operatorname{diag}(\kappa_q),

with ``W_q`` of shape ``(p, rank)`` and ``kappa_q > 0`` of shape ``(p,)``
(:class:`Coregionalization`), and ``y[i, a] = f_a(X[i]) + eps``, ``eps ~ N(0, noise[a])``
(one noise variance per output). The observations are stacked *output-major*:
``vec(y) = y.T.reshape(-1)``, entry ``a * n + i`` is output ``a`` at input ``i``, so the
``(np, np)`` covariance is ``K = sum_q kron(B_q, k_q(X, X)) + kron(diag(noise), I_n)``.

Missing entries (``mask[i, a]`` False) are dropped from the likelihood: the density is
that of the observed entries, whose covariance is ``K`` restricted to them. Under ``jit``
shapes are static, so instead of deleting rows the masked entries get an identity row and
column and a zero residual: the matrix is block diagonal (observed block, identity) up to
a permutation, its log-determinant and quadratic form are the observed block's, and the
``-log(2 pi) / 2`` of each masked entry is added back. The value and gradient equal those
of the observed block exactly (the tests compare with NumPy on the deleted rows).

Two factorizations, both gpchol's Cholesky:

* **dense**: ``K`` (masked as above) is factored whole; the likelihood and its gradient
  are the package's one Gaussian rule (:func:`gpchol._linalg.gaussian.gaussian_loglik`).
  With ``X`` on a multi-device mesh the dense ``K`` is factored and solved by
  :mod:`gpchol.distributed` (:func:`~gpchol.distributed.potrf`, ``potrs``, ``logdet``).
* **Kronecker** (ICM, every entry observed, all noise variances positive): with
  ``D = diag(noise)`` and the eigendecomposition of the whitened ``p x p`` matrix
  ``D^-1/2 B D^-1/2 = Q diag(lam) Q^T``, ``P = D^-1/2 Q`` gives
  ``K = (P^-T kron I) blockdiag(lam_j Kx + I) (P^-1 kron I)`` (Stegle et al. 2011,
  "Efficient inference in matrix-variate Gaussian models with iid observation noise").
  So ``log N(vec R | 0, K) = sum_j log N((R P)[:, j] | 0, lam_j Kx + I)
  - (n / 2) sum_a log noise_a``: ``p`` Cholesky factorizations of ``n x n`` matrices
  (``O(p n^3)``, against ``O(p^3 n^3)`` dense), each ``lam_j Kx + I`` positive definite
  whenever ``Kx`` is semidefinite. The gradient is the same whole-likelihood rule
  ``d log p = -alpha . dr + <W, dK>`` contracted in that basis (:func:`_kron_loglik`), so
  the eigenvectors are never differentiated (their derivative is singular where
  eigenvalues repeat, e.g. at ``B = I``).

Example:
    >>> import jax.numpy as jnp
    >>> from gpchol import Coregionalization, MultiOutputGP, kernels
    >>> X = jnp.linspace(0.0, 1.0, 6)
    >>> y = jnp.stack([jnp.sin(3 * X), jnp.cos(3 * X)], axis=1)  # (n, p) = (6, 2)
    >>> B = Coregionalization(jnp.array([[1.0], [0.5]]), jnp.array([0.1, 0.1]))
    >>> gp = MultiOutputGP(kernels.ExpSquared(0.3), B, X, noise=jnp.array([1e-2, 1e-2]))
    >>> gp.condition(y).mean(jnp.array([0.5])).shape
    (1, 2)
"""

from __future__ import annotations

import dataclasses
import functools
import operator
from collections.abc import Iterable, Sequence
from functools import partial
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec
from jax.typing import ArrayLike

from gpchol._base.pytrees import AttrPytree, register_fields
from gpchol._base.transforms import Positive
from gpchol._base.validate import (
    as_inputs,
    check_jitter,
    check_tile_size,
    input_mesh,
    is_concrete,
    residual_dtype,
)
from gpchol._linalg import posterior_core as core
from gpchol._linalg.backends import resolve_backend, tile_for
from gpchol._linalg.blocks import default_tile_size, trsm
from gpchol._linalg.cholesky import first_factoring
from gpchol._linalg.gaussian import (
    LOG_2PI,
    DenseCovariance,
    GaussianRule,
    gaussian_loglik,
    gaussian_value,
    padded_rows_as_identity,
)
from gpchol._linalg.inverse import inverse_from_factor
from gpchol._routing import cholesky_with_status
from gpchol.kernels import Kernel, as_kernel

__all__ = ["Coregionalization", "MultiOutputGP", "MultiOutputPosterior", "MultiOutputSolver"]


# ---------------------------------------------------------------------- coregionalisation


@jax.tree_util.register_pytree_node_class
class Coregionalization(AttrPytree):
    r"""A coregionalisation matrix ``B = W W^T + diag(kappa)`` over ``p`` outputs.

    Args:
        W: ``(p, rank)`` mixing weights, ``1 <= rank <= p``.
        kappa: ``(p,)`` positive per-output variances (a scalar is broadcast).

    Both are pytree leaves (differentiable; :meth:`default_transforms` keeps ``kappa``
    positive).

    Example:
        >>> import jax.numpy as jnp
        >>> from gpchol import Coregionalization
        >>> c = Coregionalization(jnp.array([[1.0], [2.0]]), 0.5)
        >>> c.matrix().tolist()
        [[1.5, 2.0], [2.0, 4.5]]
    """

    def __init__(self, W: ArrayLike, kappa: ArrayLike = 1.0) -> None:
        W = jnp.asarray(W)
        if not jnp.issubdtype(W.dtype, jnp.floating):
            W = W.astype(jnp.result_type(float))
        if W.ndim != 2 or W.shape[0] == 0 or W.shape[1] == 0:
            raise ValueError(
                "W (the coregionalisation weights) must have shape (p, rank) with p outputs "
                f"and 1 <= rank <= p; got shape {tuple(W.shape)}."
            )
        p, rank = W.shape
        if rank > p:
            raise ValueError(
                f"the coregionalisation rank ({rank}, W's second dimension) is larger than the "
                f"number of outputs ({p}, W's first dimension); use rank <= {p}: W of shape "
                f"({p}, {p}) already gives every positive semidefinite B."
            )
        kappa_host = np.asarray(kappa) if is_concrete(kappa) else None
        kappa = per_output(kappa, p, "kappa", W.dtype)
        if kappa_host is not None and not bool(np.all(kappa_host > 0)):
            raise ValueError(
                "kappa (the per-output variances of B = W W^T + diag(kappa)) must be > 0; got "
                f"{kappa_host.tolist()}."
            )
        self.W = W
        self.kappa = kappa

    _CHILDREN = ("W", "kappa")

    def __repr__(self) -> str:
        return f"Coregionalization(num_outputs={self.num_outputs}, rank={self.rank})"

    @property
    def num_outputs(self) -> int:
        """``p``, the number of outputs."""
        return int(self.W.shape[0])

    @property
    def rank(self) -> int:
        """The number of columns of ``W``."""
        return int(self.W.shape[1])

    def matrix(self) -> jax.Array:
        """``(p, p)`` ``B = W W^T + diag(kappa)``."""
        W = self.W
        return W @ W.T + jnp.diag(self.kappa.astype(W.dtype))

    def default_transforms(self) -> Coregionalization:
        """Transforms for :func:`gpchol.fit`: identity for ``W``, positive ``kappa``.

        Example:
            >>> import jax.numpy as jnp
            >>> from gpchol import Coregionalization
            >>> t = Coregionalization(jnp.ones((2, 1))).default_transforms()
            >>> print(t.W, t.kappa)
            None Positive(lower=0.0)
        """
        return self.tree_unflatten(None, (None, Positive()))


# ------------------------------------------------------------------------- helpers


def per_output(value: Any, p: int, name: str, dtype: Any) -> jax.Array:
    """``value`` (a scalar or ``(p,)``) as a floating ``(p,)`` array, one per output."""
    v = jnp.asarray(value)
    if not jnp.issubdtype(v.dtype, jnp.floating):
        v = v.astype(dtype)
    if v.ndim == 0:
        v = jnp.broadcast_to(v, (p,))
    if v.shape != (p,):
        raise ValueError(
            f"{name} must be a scalar or have shape ({p},), one value per output; got "
            f"shape {tuple(v.shape)}."
        )
    return v


def _as_tuple(x: Any, kind: type) -> tuple[Any, ...]:
    if isinstance(x, kind):
        return (x,)
    if isinstance(x, (list, tuple)):
        return tuple(x)
    return (x,)


def _sum(terms: Iterable[jax.Array]) -> jax.Array:
    """The sum of a non-empty sequence of arrays (one term per latent kernel)."""
    return functools.reduce(operator.add, terms)


def _observed_jitter(K: jax.Array, obs: jax.Array, j: float) -> jax.Array:
    """``K`` plus ``j`` on the observed entries' diagonal (the identity rows stay 1)."""
    return K + jnp.diag(jnp.where(obs, jnp.asarray(j, K.dtype), 0.0)) if j else K


# -------------------------------------------------------------- the Kronecker shortcut


def _kron_parts(
    B: jax.Array, Kx: jax.Array, noise: jax.Array, be: Any, nb: int | None
) -> tuple[jax.Array, ...]:
    """``(P, lam, L, status)`` of ``K = kron(B, Kx) + kron(diag(noise), I)``.

    ``D^-1/2 B D^-1/2 = Q diag(lam) Q^T``, ``P = D^-1/2 Q`` (``(p, p)``), ``L`` the
    ``(p, n, n)`` factors of ``lam_j Kx + I`` and ``status`` the largest of their statuses.
    """
    n = Kx.shape[0]
    s = lax.rsqrt(noise)
    lam, Q = jnp.linalg.eigh(s[:, None] * B * s[None, :])
    P = s[:, None] * Q
    M = lam[:, None, None] * Kx[None] + jnp.eye(n, dtype=Kx.dtype)
    L, status = cholesky_with_status(M, backend=be, tile_size=nb)
    return P, lam, L, jnp.max(status)


def _kron_value(
    B: jax.Array, Kx: jax.Array, noise: jax.Array, R: jax.Array, be: Any, nb: int | None
) -> tuple[jax.Array, ...]:
    """``(value, A, P, lam, L, status)``; ``A`` is ``(n, p)`` with ``vec(A) = K^-1 vec(R)``."""
    n = Kx.shape[0]
    P, lam, L, status = _kron_parts(B, Kx, noise, be, nb)
    vals, At = gaussian_value((R @ P).T, L)  # per block j: log N((R P)[:, j] | 0, M_j)
    value = jnp.sum(vals) - 0.5 * n * jnp.sum(jnp.log(noise))
    value = jnp.where(status == 0, value, jnp.nan)
    return value, At.T @ P.T, P, lam, L, status


@partial(jax.custom_jvp, nondiff_argnums=(4, 5))
def _kron_loglik(
    B: jax.Array, Kx: jax.Array, noise: jax.Array, R: jax.Array, be: Any, nb: int | None
) -> tuple[jax.Array, jax.Array]:
    """``(log N(vec R | 0, kron(B, Kx) + kron(diag(noise), I)), status)``."""
    value, *_, status = _kron_value(B, Kx, noise, R, be, nb)
    return value, status


@_kron_loglik.defjvp
def _kron_loglik_jvp(
    be: Any, nb: int | None, primals: tuple[jax.Array, ...], tangents: tuple[jax.Array, ...]
) -> tuple[tuple[jax.Array, jax.Array], tuple[jax.Array, Any]]:
    # The package's one Gaussian rule (R&W 2006 eq. 5.9), d log p = -alpha . dr + <Kbar, dK>
    # with Kbar = (alpha alpha^T - K^-1) / 2, contracted with dK = kron(dB, Kx) +
    # kron(B, dKx) + kron(dD, I) through the Kronecker basis above, never forming np x np:
    # with vec(A) = alpha, K^-1 = (P kron I) blockdiag(M_j^-1) (P kron I)^T, P^T B P = diag(lam):
    #   <alpha alpha^T, kron(dB, Kx)> = <A^T Kx A, dB>,
    #   <K^-1, kron(dB, Kx)> = <P diag(c) P^T, dB>,  c_j = <M_j^-1, Kx>;
    #   <alpha alpha^T, kron(B, dKx)> = <A B A^T, dKx>,
    #   <K^-1, kron(B, dKx)> = <sum_j lam_j M_j^-1, dKx>;
    #   <alpha alpha^T, kron(dD, I)> = sum_a dD_a |A[:, a]|^2,
    #   <K^-1, kron(dD, I)> = sum_a dD_a sum_j P[a, j]^2 tr(M_j^-1).
    # Linear in the tangents, so JAX transposes it for reverse mode; the eigenvectors of the
    # p x p matrix are values only, never differentiated.
    B, Kx, noise, R = primals
    dB, dKx, dnoise, dR = tangents
    value, A, P, lam, L, status = _kron_value(B, Kx, noise, R, be, nb)
    Minv = inverse_from_factor(L, nb or default_tile_size(L.shape[-1], L.dtype))
    c = jnp.sum(Minv * Kx[None], axis=(-2, -1))
    tr = jnp.trace(Minv, axis1=-2, axis2=-1)
    Bbar = 0.5 * (A.T @ Kx @ A - (P * c[None, :]) @ P.T)
    Kxbar = 0.5 * (A @ B @ A.T - jnp.einsum("j,jab->ab", lam, Minv))
    nbar = 0.5 * (jnp.sum(A * A, axis=0) - (P * P) @ tr)
    out = (
        -jnp.sum(A * dR)
        + jnp.sum(Bbar * dB)
        + jnp.sum(Kxbar * dKx)
        + jnp.sum(nbar * jnp.broadcast_to(dnoise, nbar.shape))
    )
    out = jnp.where(status == 0, out, jnp.nan)
    return (value, status), (out, np.zeros(status.shape, jax.dtypes.float0))


# The posterior's alpha = K^-1 vec(R) and whitened cross-covariance W (W^T W = Ks^T K^-1 Ks)
# from the shortcut's parts P, lam, L hold no derivative of the eigendecomposition: where
# two of lam meet (W = 0 with equal kappa and noise) its eigenvectors have none, though
# alpha and W^T W do. Their rules are the dense ones (d(K^-1 z) = K^-1 (dz - dK K^-1 z);
# dW = C^-T (dKs - dK K^-1 Ks / 2) with C^T C = K, C^-T = blockdiag(L_j^-1)(P^T kron I),
# so that d(W^T W) is exact), with K and its tangent applied in matrix form:
# K vec(Y) = vec(Kx Y B + Y diag(noise)) for Y (n, p) (output a in column a).


def _kron_solve_parts(P: jax.Array, L: jax.Array, Z: jax.Array) -> jax.Array:
    """``K^-1`` applied to each ``Z[:, :, c]`` ``(n, p)`` of ``Z`` ``(n, p, c)``."""
    Y = jnp.einsum("iac,aj->jic", Z, P)
    X = trsm(L, trsm(L, Y, left=True), left=True, trans=True)
    return jnp.einsum("jic,aj->iac", X, P)


def _kron_dK(
    B: jax.Array, Kx: jax.Array, dB: jax.Array, dKx: jax.Array, dnoise: jax.Array, Y: jax.Array
) -> jax.Array:
    """``dK`` applied to each ``Y[:, :, c]``: ``dKx Y B + Kx Y dB + Y diag(dnoise)``."""
    out = jnp.einsum("ik,kbc,ba->iac", dKx, Y, B) + jnp.einsum("ik,kbc,ba->iac", Kx, Y, dB)
    return out + Y * jnp.broadcast_to(dnoise, (Y.shape[1],))[None, :, None]


@jax.custom_jvp
def _kron_alpha(
    B: jax.Array,
    Kx: jax.Array,
    noise: jax.Array,
    R: jax.Array,
    P: jax.Array,
    L: jax.Array,
    A: jax.Array,
) -> jax.Array:
    """``A`` ``(n, p)``, ``vec(A) = K^-1 vec(R)`` as the forward pass solved it from the
    parts ``P``, ``L`` of ``K``, with the derivative of ``K^-1 vec(R)`` in ``B``, ``Kx``,
    the noise and ``R``."""
    return A


@_kron_alpha.defjvp
def _kron_alpha_jvp(
    primals: tuple[jax.Array, ...], tangents: tuple[jax.Array, ...]
) -> tuple[jax.Array, jax.Array]:
    B, Kx, _, _, P, L, A = primals
    dB, dKx, dnoise, dR, *_ = tangents  # P, L and A follow from B, Kx, the noise and R
    dZ = dR[:, :, None] - _kron_dK(B, Kx, dB, dKx, dnoise, A[:, :, None])
    return A, _kron_solve_parts(P, L, dZ)[:, :, 0]


def _kron_cross(kx: jax.Array, B: jax.Array) -> jax.Array:
    """``Ks`` ``(n, p, b p)``: ``Ks[i, a', (s, a)] = kx[i, s] B[a', a]``."""
    n, b = kx.shape
    p = B.shape[0]
    return jnp.einsum("is,ca->icsa", kx, B).reshape(n, p, b * p)


@jax.custom_jvp
def _kron_whitened(
    B: jax.Array, Kx: jax.Array, noise: jax.Array, kx: jax.Array, P: jax.Array, L: jax.Array
) -> jax.Array:
    """``W`` ``(p n, b p)`` of ``kx = k(X, xb)`` ``(n, b)``, ``W^T W = Ks^T K^-1 Ks``."""
    p, (n, b) = B.shape[0], kx.shape
    V = trsm(L, kx[None], left=True)  # (p, n, b)
    return jnp.einsum("jis,aj->jisa", V, B @ P).reshape(p * n, b * p)


@_kron_whitened.defjvp
def _kron_whitened_jvp(
    primals: tuple[jax.Array, ...], tangents: tuple[jax.Array, ...]
) -> tuple[jax.Array, jax.Array]:
    B, Kx, noise, kx, P, L = primals
    dB, dKx, dnoise, dkx, _, _ = tangents  # P and L follow from B, Kx and the noise
    W = _kron_whitened(B, Kx, noise, kx, P, L)
    A = _kron_solve_parts(P, L, _kron_cross(kx, B))
    G = _kron_cross(dkx, B) + _kron_cross(kx, dB) - 0.5 * _kron_dK(B, Kx, dB, dKx, dnoise, A)
    dW = trsm(L, jnp.einsum("iac,aj->jic", G, P), left=True)
    return W, dW.reshape(W.shape)


# ------------------------------------------------------------------------- the model


class MultiOutputGP(AttrPytree):
    r"""An exact multi-output GP with (intrinsic or linear) coregionalisation.

    Args:
        kernel: a :class:`gpchol.kernels.Kernel` (ICM) or a sequence of ``Q`` of them
            (LMC), the latent kernels ``k_q``; a function ``f(x1, x2) -> scalar`` of one
            pair of points is wrapped by :func:`gpchol.kernels.as_kernel`.
        coregionalization: a :class:`Coregionalization` or a sequence of ``Q`` of them
            (one per kernel), all over the same ``p`` outputs.
        X: ``(n, d)`` inputs shared by the outputs (``(n,)`` is read as ``(n, 1)``).
        noise: observation-noise variances, a scalar or ``(p,)`` (one per output).
            Keyword-only.
        mask: ``None`` (every entry observed) or an ``(n, p)`` boolean array, True where
            ``y[i, a]`` is observed; the others are left out of the likelihood (their
            values in ``y`` are ignored, NaN allowed).
        mean: constant prior mean, a scalar or ``(p,)`` (one per output). Default 0.
        jitter: ``None``, a float added to the observed diagonal, or a tuple tried in order.
        backend: Cholesky backend, ``"auto"``, ``"xla"``, ``"tiled"`` or ``"cuda"``.
        tile_size: block size of the factorization (``None``: automatic).
        kronecker: ``"auto"`` (the Kronecker shortcut when it applies: one kernel, no entry
            missing, no noise variance known to be zero, ``X`` not sharded), ``True``
            (require it) or ``False`` (always dense). Inside ``jit`` the noise is not known:
            a traced zero noise variance on the shortcut gives NaN (use ``False``).

    Shapes: ``X (n, d)``, ``y (n, p)``, ``mask (n, p)``; test inputs ``Xs (m, d)``; the
    posterior's means and variances are ``(m, p)``.

    Note:
        With ``X`` placed on a multi-device mesh (a ``NamedSharding``) the dense ``np x np``
        covariance is factored and solved by :mod:`gpchol.distributed` (padded with
        identity rows to a multiple of the mesh size, which changes nothing).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from gpchol import Coregionalization, MultiOutputGP, kernels
        >>> X = jnp.linspace(0.0, 1.0, 5)
        >>> y = jnp.stack([X, -X, X ** 2], axis=1)
        >>> mask = jnp.ones((5, 3), bool).at[0, 1].set(False)
        >>> def nll(W):
        ...     gp = MultiOutputGP(kernels.Matern32(0.5), Coregionalization(W, 0.1), X,
        ...                        noise=0.01, mask=mask)
        ...     return -gp.log_marginal_likelihood(y)
        >>> jax.grad(nll)(jnp.ones((3, 2))).shape
        (3, 2)
    """

    def __init__(
        self,
        kernel: Kernel | Sequence[Kernel],
        coregionalization: Coregionalization | Sequence[Coregionalization],
        X: Any,
        *,
        noise: Any,
        mask: Any = None,
        mean: Any = 0.0,
        jitter: Any = None,
        backend: str = "auto",
        tile_size: int | None = None,
        kronecker: bool | str = "auto",
    ) -> None:
        # a function f(x1, x2) -> scalar is wrapped as GaussianProcess does; else TypeError
        ks = tuple(as_kernel(k) for k in _as_tuple(kernel, Kernel))
        cs = _as_tuple(coregionalization, Coregionalization)
        for c in cs:
            if not isinstance(c, Coregionalization):
                raise TypeError(
                    "coregionalization must be a Coregionalization or a sequence of them; got "
                    f"{type(c).__name__}."
                )
        if not ks or len(ks) != len(cs):
            raise ValueError(
                f"give one Coregionalization per latent kernel; got {len(ks)} kernel(s) and "
                f"{len(cs)} coregionalization(s)."
            )
        p = cs[0].num_outputs
        if any(c.num_outputs != p for c in cs):
            raise ValueError(
                "every Coregionalization must have the same number of outputs (rows of W); got "
                f"{[c.num_outputs for c in cs]}."
            )
        X = as_inputs(X)
        n = X.shape[0]
        # values known on the host are read before any conversion (inside jit, jnp.asarray
        # of a NumPy constant is a tracer)
        noise_host = np.asarray(noise) if is_concrete(noise) else None
        mask_host = np.asarray(mask) if mask is not None and is_concrete(mask) else None
        noise = per_output(noise, p, "noise", X.dtype)
        mean = per_output(mean, p, "mean", X.dtype)
        if noise_host is not None:
            nz = noise_host
            if not np.all(np.isfinite(nz)) or np.any(nz < 0):
                raise ValueError(
                    f"noise (the per-output noise variances) must be finite and >= 0; got "
                    f"{nz.tolist()}."
                )
        if mask is not None:
            mask = jnp.asarray(mask) if mask_host is None else mask_host
            if mask.shape != (n, p):
                raise ValueError(
                    f"mask must have shape (n, p) = ({n}, {p}), one flag per entry of y (True = "
                    f"observed); got shape {tuple(mask.shape)}."
                )
            if mask.dtype != jnp.bool_:
                raise TypeError(f"mask must be a boolean array; got dtype {mask.dtype}.")
        full = mask is None or (mask_host is not None and bool(np.all(mask_host)))
        # the shortcut whitens by noise^-1/2: a zero variance (known here) takes the dense path
        positive = noise_host is None or bool(np.all(noise_host > 0))
        if kronecker not in ("auto", True, False):
            raise ValueError(f"kronecker must be 'auto', True or False; got {kronecker!r}.")
        if kronecker is True and (len(ks) != 1 or not full or not positive):
            raise ValueError(
                "kronecker=True needs one latent kernel (ICM), every entry of y observed and "
                f"positive noise variances (got {len(ks)} kernel(s), mask "
                f"{'complete' if full else 'with missing entries'}, noise "
                f"{'positive' if positive else 'with a zero'}); pass kronecker='auto' to use "
                "the dense factorization there."
            )
        self.kernels = ks
        self.coregionalizations = cs
        self.X = X
        self.noise = noise
        self.mask = mask
        self.mean = mean
        self.jitter = check_jitter(jitter)
        self.backend = backend
        self.tile_size = tile_size
        self.kronecker = kronecker
        self._full = full and positive  # the shortcut's static condition, besides Q = 1

    _CHILDREN = ("kernels", "coregionalizations", "X", "noise", "mask", "mean")
    _AUX = ("jitter", "backend", "tile_size", "kronecker", "_full")

    def __repr__(self) -> str:
        return (
            f"MultiOutputGP(Q={len(self.kernels)}, n={self.n}, p={self.p}, "
            f"kronecker={self.uses_kronecker})"
        )

    # ------------------------------------------------------------------------ pieces
    @property
    def n(self) -> int:
        """Number of inputs."""
        return int(self.X.shape[0])

    @property
    def p(self) -> int:
        """Number of outputs."""
        return self.coregionalizations[0].num_outputs

    @property
    def uses_kronecker(self) -> bool:
        """Whether the likelihood and posterior take the Kronecker shortcut (static)."""
        if self.kronecker is False or len(self.kernels) != 1 or not self._full:
            return False
        return input_mesh(self.X) is None

    def observed(self) -> jax.Array:
        """``(n, p)`` boolean mask of the observed entries (all True without a mask)."""
        if self.mask is None:
            return jnp.ones((self.n, self.p), bool)
        return self.mask

    def covariance_matrix(self) -> jax.Array:
        """``(np, np)`` covariance of ``vec(y) = y.T.reshape(-1)`` (every entry, unmasked).

        ``sum_q kron(B_q, k_q(X, X)) + kron(diag(noise), I_n)``.
        """
        K = _sum(
            jnp.kron(c.matrix(), k(self.X, self.X))
            for k, c in zip(self.kernels, self.coregionalizations, strict=True)
        )
        noise = jnp.repeat(self.noise.astype(K.dtype), self.n)
        return K + jnp.diag(noise)

    def _residual(self, y: ArrayLike) -> jax.Array:
        y = jnp.asarray(y)
        if y.ndim != 2:
            raise ValueError(
                f"y must have shape (n, p) = ({self.n}, {self.p}), one column per output; got "
                f"shape {tuple(y.shape)}"
                + (". For one output reshape y to (n, 1)." if y.ndim == 1 else ".")
            )
        if y.shape != (self.n, self.p):
            raise ValueError(
                f"y must have shape (n, p) = ({self.n}, {self.p}) to match X's {self.n} rows and "
                f"the {self.p} outputs of the coregionalization; got shape {tuple(y.shape)}."
            )
        y = y.astype(residual_dtype(self.X.dtype, y.dtype))
        R = y - self.mean.astype(y.dtype)[None, :]
        return jnp.where(self.observed(), R, jnp.zeros((), R.dtype))

    def _masked_dense(self, dtype: Any, pad: int = 0) -> tuple[jax.Array, jax.Array]:
        """``(K, obs)``: ``K`` with identity rows/columns at the masked entries (and ``pad``
        extra identity rows), ``obs`` the ``(np + pad,)`` observed flags."""
        K = self.covariance_matrix().astype(dtype)
        obs = self.observed().T.reshape(-1)
        if pad:
            obs = jnp.concatenate([obs, jnp.zeros((pad,), bool)])
            K = jnp.pad(K, ((0, pad), (0, pad)))
        return padded_rows_as_identity(K, obs, obs, jnp.eye(K.shape[0], dtype=bool)), obs

    def _dense_inputs(self, R: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array, Any, Any]:
        """``(K, obs, r, backend, tile)`` of the dense path for residuals ``R``."""
        K, obs = self._masked_dense(R.dtype)
        return K, obs, R.T.reshape(-1), *self._rule_parts(K.shape[0], R.dtype)

    def _kron_inputs(self, dtype: Any) -> tuple[jax.Array, jax.Array, Any, Any]:
        """``(B, Kx, backend, tile)`` of the Kronecker shortcut."""
        B = self.coregionalizations[0].matrix().astype(dtype)
        Kx = self.kernels[0](self.X, self.X).astype(dtype)
        return B, Kx, *self._rule_parts(self.n, dtype)

    def _rule_parts(self, N: int, dtype: Any) -> tuple[Any, int | None]:
        be = resolve_backend(self.backend, self.X)
        return be, tile_for(be, N, dtype, check_tile_size(self.tile_size))

    def _unobserved_constant(self, obs: jax.Array, dtype: Any) -> jax.Array:
        """``+ log(2 pi) / 2`` per identity row: they are not part of the density."""
        return 0.5 * jnp.sum(~obs).astype(dtype) * LOG_2PI

    # ------------------------------------------------------------------ likelihood
    def log_marginal_likelihood_with_status(self, y: ArrayLike) -> tuple[jax.Array, jax.Array]:
        """``(log p(y_obs), status)``, usable inside ``jit``.

        Args:
            y: ``(n, p)`` observations (entries outside the mask are ignored).

        Returns:
            ``(value, status)``: the log density of the observed entries (NaN when the
            covariance does not factor) and an int32 status (0 = success).

        Example:
            >>> import jax.numpy as jnp
            >>> from gpchol import Coregionalization, MultiOutputGP, kernels
            >>> c = Coregionalization(jnp.ones((2, 1)), 1.0)
            >>> gp = MultiOutputGP(kernels.ExpSquared(), c, jnp.arange(3.0), noise=0.1)
            >>> int(gp.log_marginal_likelihood_with_status(jnp.zeros((3, 2)))[1])
            0
        """
        R = self._residual(y)
        dtype = R.dtype
        mesh = input_mesh(self.X)
        if mesh is not None:
            return self._sharded_lml(R, mesh)
        schedule = self.jitter or (0.0,)
        if self.uses_kronecker:
            B, Kx, be, nb = self._kron_inputs(dtype)
            noise = self.noise.astype(dtype)
            out = first_factoring(lambda j: _kron_loglik(B, Kx, noise + j, R, be, nb), schedule, -1)
            return out[0], out[1]
        K, obs, r, be, nb = self._dense_inputs(R)
        rule = GaussianRule(be, nb, None)

        def attempt(j: float) -> tuple[jax.Array, jax.Array]:
            return gaussian_loglik(DenseCovariance(_observed_jitter(K, obs, j)), r, rule)

        value, status = first_factoring(attempt, schedule, -1)
        return value + self._unobserved_constant(obs, dtype), status

    def _replicated(self, mesh: Any) -> MultiOutputGP:
        """This model with ``X`` (``n x d`` numbers) replicated over ``mesh``: a kernel on
        row-sharded ``X`` on both sides is ill-sharded on an Explicit mesh."""
        children, aux = self.tree_flatten()
        X = jax.sharding.reshard(self.X, NamedSharding(mesh, PartitionSpec()))
        return type(self).tree_unflatten(aux, (*children[:2], X, *children[3:]))

    def _sharded_lml(self, R: jax.Array, mesh: Any) -> tuple[jax.Array, jax.Array]:
        """The dense likelihood factored and solved by :mod:`gpchol.distributed`."""
        from gpchol import distributed as gd

        if self.jitter is not None and len(self.jitter) > 1:
            raise ValueError(
                "X is sharded over a device mesh; the sharded path takes one jitter value, "
                f"not a schedule (got {self.jitter})."
            )
        dtype = R.dtype
        N = self.n * self.p
        pad = (-N) % mesh.size  # potrf needs a multiple of each sharded mesh axis size
        # X (n x d numbers) replicated: the np x np covariance is built whole, then placed
        # on the mesh by potrf (a kernel on row-sharded X on both sides is ill-sharded)
        K, obs = self._replicated(mesh)._masked_dense(dtype, pad)
        if self.jitter:
            K = _observed_jitter(K, obs, self.jitter[0])
        r = jnp.concatenate([R.T.reshape(-1), jnp.zeros((pad,), dtype)])
        T = self.tile_size
        L, status = gd.potrf(K, T, mesh, donate=False, return_status=True)
        alpha = gd.potrs(L, r, T)
        value = -0.5 * (r @ alpha + gd.logdet(L) + (N + pad) * LOG_2PI)
        value = jnp.where(status == 0, value, jnp.nan)
        return value + self._unobserved_constant(obs, dtype), status

    def log_marginal_likelihood(self, y: ArrayLike) -> jax.Array:
        r"""``log p(y_obs | X, theta)`` of the observed entries, differentiable.

        Args:
            y: ``(n, p)`` observations (entries outside the mask are ignored).

        Returns:
            A scalar; NaN when the covariance is not positive definite.

        Example:
            >>> import jax.numpy as jnp
            >>> from gpchol import Coregionalization, MultiOutputGP, kernels
            >>> c = Coregionalization(jnp.zeros((2, 1)), 1e-12)
            >>> gp = MultiOutputGP(kernels.ExpSquared(), c, jnp.arange(1.0), noise=1.0)
            >>> round(float(gp.log_marginal_likelihood(jnp.zeros((1, 2)))), 4)  # -log(2 pi)
            -1.8379
        """
        return self.log_marginal_likelihood_with_status(y)[0]

    def condition(self, y: ArrayLike) -> MultiOutputPosterior:
        """The posterior given ``y`` (on one device: a sharded ``X`` is replicated first).

        Args:
            y: ``(n, p)`` observations (entries outside the mask are ignored).

        Returns:
            A :class:`MultiOutputPosterior`.

        Example:
            >>> import jax.numpy as jnp
            >>> from gpchol import Coregionalization, MultiOutputGP, kernels
            >>> c = Coregionalization(jnp.ones((2, 1)), 0.1)
            >>> gp = MultiOutputGP(kernels.ExpSquared(), c, jnp.arange(4.0), noise=0.01)
            >>> gp.condition(jnp.zeros((4, 2))).variance(jnp.array([0.5, 9.0])).shape
            (2, 2)
        """
        mesh = input_mesh(self.X)
        return (self if mesh is None else self._replicated(mesh))._condition(y)

    def _condition(self, y: ArrayLike) -> MultiOutputPosterior:
        """:meth:`condition` with ``X`` on one device or replicated."""
        R = self._residual(y)
        dtype = R.dtype
        schedule = self.jitter or (0.0,)
        if self.uses_kronecker:
            B, Kx, be, nb = self._kron_inputs(dtype)

            def kron(j: float) -> tuple[jax.Array, ...]:
                return _kron_value(B, Kx, self.noise.astype(dtype) + j, R, be, nb)

            value, A, P, _, L, status = first_factoring(kron, schedule, -1)
            A = _kron_alpha(B, Kx, self.noise.astype(dtype), R, P, L, A)
            return MultiOutputPosterior(self, A, value, status, L, P=P)
        K, obs, r, be, nb = self._dense_inputs(R)

        def dense(j: float) -> tuple[jax.Array, ...]:
            L, status = cholesky_with_status(_observed_jitter(K, obs, j), backend=be, tile_size=nb)
            value, alpha = gaussian_value(r, L.astype(dtype))
            return value, alpha, L, status

        value, alpha, L, status = first_factoring(dense, schedule, -1)
        value = jnp.where(status == 0, value, jnp.nan) + self._unobserved_constant(obs, dtype)
        return MultiOutputPosterior(self, alpha.reshape(self.p, self.n).T, value, status, L)


jax.tree_util.register_pytree_node_class(MultiOutputGP)


class MultiOutputPosterior(AttrPytree):
    r"""The posterior of a :class:`MultiOutputGP` (from ``gp.condition(y)``).

    Attributes:
        gp: the prior :class:`MultiOutputGP`.
        alpha: ``(n, p)`` with ``vec(alpha) = K^-1 vec(y - m)`` (zero at masked entries).
        log_marginal_likelihood: scalar ``log p(y_obs)``.
        status: int32 factorization status (0 = success).
        L: the dense ``(np, np)`` factor, or the ``(p, n, n)`` factors of
            ``lam_j Kx + I`` (Kronecker shortcut).
        P: ``(p, p)`` ``D^-1/2 Q`` of the Kronecker shortcut, else ``None``.

    Example:
        >>> import jax.numpy as jnp
        >>> from gpchol import Coregionalization, MultiOutputGP, kernels
        >>> X = jnp.linspace(0.0, 1.0, 4)
        >>> c = Coregionalization(jnp.array([[1.0], [-1.0]]), 0.1)
        >>> post = MultiOutputGP(kernels.ExpSquared(0.5), c, X, noise=0.01).condition(
        ...     jnp.stack([X, -X], axis=1))
        >>> post.mean().shape
        (4, 2)
    """

    def __init__(
        self,
        gp: MultiOutputGP,
        alpha: jax.Array,
        log_marginal_likelihood: jax.Array,
        status: jax.Array,
        L: jax.Array,
        P: jax.Array | None = None,
    ) -> None:
        self.gp = gp
        self.alpha = alpha
        self.log_marginal_likelihood = log_marginal_likelihood
        self.status = status
        self.L = L
        self.P = P

    _CHILDREN = ("gp", "alpha", "log_marginal_likelihood", "status", "L", "P")

    @property
    def _solver(self) -> MultiOutputSolver:
        return MultiOutputSolver(self.gp, self.alpha, self.L, self.P)

    def _args(self, block_size: int | None) -> dict[str, Any]:
        return dict(dtype=self.alpha.dtype, model_noise=self.gp.noise, block_size=block_size)

    def mean(self, Xs: ArrayLike | None = None, *, block_size: int | None = None) -> jax.Array:
        """Posterior mean of each output's latent function, in blocks of test points.

        Args:
            Xs: ``(m, d)`` test inputs (``None``: the training inputs).
            block_size: test points per block (``None``: the default; results do not
                depend on it).

        Returns:
            ``(m, p)``: ``mean[s, a] = m_a + sum_q sum_b B_q[a, b] k_q(Xs_s, X) alpha[:, b]``.
        """
        return core.predict(self._solver, Xs, want_var=False, **self._args(block_size))[0]

    def variance(
        self,
        Xs: ArrayLike | None = None,
        *,
        include_noise: bool = False,
        block_size: int | None = None,
    ) -> jax.Array:
        """Posterior marginal variance of each output's latent function (arguments as for
        :meth:`mean_and_variance`).

        Returns:
            ``(m, p)`` variances ``var[s, a] = sum_q B_q[a, a] k_q(x, x) - v^T v`` (clipped
            at 0), ``v = L^-1 cov(vec y, f_a(Xs_s))``.
        """
        return self.mean_and_variance(Xs, include_noise=include_noise, block_size=block_size)[1]

    def mean_and_variance(
        self,
        Xs: ArrayLike | None = None,
        *,
        include_noise: bool = False,
        block_size: int | None = None,
    ) -> tuple[jax.Array, jax.Array]:
        """:meth:`mean` and :meth:`variance` in one pass (one cross-covariance per block).

        Args:
            Xs: ``(m, d)`` test inputs (``None``: the training inputs).
            include_noise: add each output's noise variance (the predictive variance of y).
            block_size: test points per block (``None``: the default).

        Returns:
            ``(mean, variance)``, each ``(m, p)``.

        Example:
            >>> import jax.numpy as jnp
            >>> from gpchol import Coregionalization, MultiOutputGP, kernels
            >>> c = Coregionalization(jnp.array([[1.0], [0.5]]), 0.1)
            >>> post = MultiOutputGP(kernels.ExpSquared(), c, jnp.arange(4.0), noise=0.01
            ...                      ).condition(jnp.zeros((4, 2)))
            >>> [a.shape for a in post.mean_and_variance(jnp.arange(5.0), block_size=2)]
            [(5, 2), (5, 2)]
        """
        args = self._args(block_size)
        return core.predict(self._solver, Xs, include_noise=include_noise, **args)

    def covariance(
        self,
        Xs: ArrayLike | None = None,
        *,
        include_noise: bool = False,
        block_size: int | None = None,
    ) -> jax.Array:
        """Joint posterior covariance of all outputs' latent functions at the test points.

        For a moderate number of test points: the result holds ``(m p)^2`` numbers.

        Args:
            Xs: ``(m, d)`` test inputs (``None``: the training inputs).
            include_noise: add each output's noise variance on the diagonal (the
                covariance of new observations ``y*``; independent across outputs).
            block_size: test points per block (``None``: the default).

        Returns:
            ``(m, p, m, p)``: ``cov[s, a, t, b] = cov(f_a(Xs_s), f_b(Xs_t) | y)
            = sum_q B_q[a, b] k_q(Xs_s, Xs_t) - v_{sa}^T v_{tb}``,
            ``v_{sa} = L^-1 cov(vec y, f_a(Xs_s))``; symmetric (``cov[s, a, t, b] =
            cov[t, b, s, a]``), its diagonal is :meth:`variance` (before that clips at 0).

        Example:
            >>> import jax.numpy as jnp
            >>> from gpchol import Coregionalization, MultiOutputGP, kernels
            >>> c = Coregionalization(jnp.array([[1.0], [0.5]]), 0.1)
            >>> post = MultiOutputGP(kernels.ExpSquared(), c, jnp.arange(4.0), noise=0.01
            ...                      ).condition(jnp.zeros((4, 2)))
            >>> post.covariance(jnp.array([0.5, 9.0])).shape
            (2, 2, 2, 2)
        """
        args = self._args(block_size)
        return core.covariance(self._solver, Xs, include_noise=include_noise, **args)

    def sample(
        self,
        key: jax.Array,
        Xs: ArrayLike | None = None,
        num: int = 1,
        *,
        include_noise: bool = False,
        jitter: float | Sequence[float] | str | None = core.SAMPLE_JITTER,
        block_size: int | None = None,
    ) -> jax.Array:
        """Joint samples of all outputs from the posterior: of ``f``, or of new ``y*``.

        Args:
            key: a ``jax.random`` key.
            Xs: ``(m, d)`` test inputs (``None``: the training inputs).
            num: number of samples, a non-negative Python int (static).
            include_noise: sample ``y* = f + eps`` with each output's noise variance.
            jitter: schedule of diagonal jitter, relative to the largest posterior
                variance, tried in order when factoring the ``(m p, m p)`` covariance
                (``"auto"``: as :meth:`gpchol.Posterior.sample`).
            block_size: test points per block (``None``: the default).

        Returns:
            ``(num, m, p)`` samples: jointly Gaussian with mean :meth:`mean` and covariance
            :meth:`covariance`, correlated across test points and outputs.

        Raises:
            TypeError: ``num`` is not an integer. ValueError: ``num`` is negative.

        Example:
            >>> import jax, jax.numpy as jnp
            >>> from gpchol import Coregionalization, MultiOutputGP, kernels
            >>> c = Coregionalization(jnp.array([[1.0], [0.5]]), 0.1)
            >>> post = MultiOutputGP(kernels.ExpSquared(), c, jnp.arange(4.0), noise=0.01
            ...                      ).condition(jnp.zeros((4, 2)))
            >>> post.sample(jax.random.PRNGKey(0), jnp.array([0.5, 9.0]), 3).shape
            (3, 2, 2)
        """
        return core.sample(
            self._solver,
            key,
            Xs,
            num,
            jitter=jitter,
            include_noise=include_noise,
            **self._args(block_size),
        )


jax.tree_util.register_pytree_node_class(MultiOutputPosterior)


@register_fields
@dataclasses.dataclass(frozen=True)
class MultiOutputSolver:
    """A conditioned :class:`MultiOutputGP` for the posterior core (``p`` outputs per
    test point; blocks of ``b`` points make ``V`` of shape ``(n p, b p)``).

    ``cov(vec y, f_a(x)) = sum_q kron(B_q[:, a], k_q(X, x))``. Dense: ``V = L^-1`` of it,
    masked entries' rows zero. Kronecker shortcut: ``K^-1 = (P kron I) M^-1 (P kron I)^T``
    with ``M = blockdiag(L_j L_j^T)``, so with ``V_j = L_j^-1 k(X, xb)`` and ``C = B P``,
    ``V[(j, i), (s, a)] = C[a, j] V_j[i, s]`` (``V^T V`` the same product).
    """

    gp: MultiOutputGP
    alpha: jax.Array
    L: jax.Array
    P: jax.Array | None
    block_multiple: ClassVar[int] = 1

    @property
    def inputs(self) -> jax.Array:
        return self.gp.X

    @property
    def outputs(self) -> tuple[int, ...]:
        return (self.gp.p,)

    def default_block(self, m: int) -> int:
        return max(1, core.default_block_size(self.gp.n * self.gp.p, m) // self.gp.p)

    def _latents(self, dtype: Any) -> Iterable[tuple[Kernel, jax.Array]]:
        """``(k_q, B_q)`` for each latent kernel, ``B_q`` in ``dtype``."""
        for k, c in zip(self.gp.kernels, self.gp.coregionalizations, strict=True):
            yield k, c.matrix().astype(dtype)

    def project(self, xb: jax.Array, part: Any, whiten: bool) -> tuple[jax.Array, jax.Array | None]:
        dtype, gp = xb.dtype, self.gp
        X, alpha = gp.X.astype(dtype), self.alpha.astype(dtype)
        kx = [(k(X, xb).astype(dtype), B) for k, B in self._latents(dtype)]  # (n, b), (p, p)
        mu = _sum(Kq.T @ alpha @ B for Kq, B in kx)
        if not whiten:
            return mu, None
        (n, b), p = kx[0][0].shape, gp.p
        if self.P is not None:
            # k(X, X) enters the rule's tangent only (unused, it is not computed otherwise)
            Kx = gp.kernels[0](X, X).astype(dtype)
            noise = gp.noise.astype(dtype)
            return mu, _kron_whitened(kx[0][1], Kx, noise, kx[0][0], self.P, self.L)
        Ks = _sum(jnp.kron(B, Kq) for Kq, B in kx)  # (n p, p b), columns (a, s)
        Ks = Ks.reshape(n * p, p, b).transpose(0, 2, 1).reshape(n * p, b * p)
        obs = gp.observed().T.reshape(-1)
        Ks = jnp.where(obs[:, None], Ks, jnp.zeros((), dtype))
        return mu, trsm(self.L.astype(dtype), Ks, left=True)

    def prior_mean(self, xb: jax.Array) -> jax.Array:
        return jnp.broadcast_to(self.gp.mean.astype(xb.dtype), (xb.shape[0], self.gp.p))

    def prior_variance(self, xb: jax.Array, part: Any) -> jax.Array:
        return _sum(k.diag(xb)[:, None] * jnp.diagonal(B)[None] for k, B in self._latents(xb.dtype))

    def prior_covariance(self, xs: jax.Array, part: Any) -> jax.Array:
        C = _sum(
            k(xs, xs)[:, None, :, None] * B[None, :, None, :] for k, B in self._latents(xs.dtype)
        )
        return C.reshape(xs.shape[0] * self.gp.p, -1)
