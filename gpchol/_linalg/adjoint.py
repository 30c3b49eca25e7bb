"""Murray's blocked adjoint of the Cholesky factor (I. Murray, "Differentiation of the
Cholesky decomposition", arXiv:1602.07527, 2016); the forward-mode tangent is
:func:`gpchol._linalg.triangular.chol_tangent`."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from gpchol._linalg.blocks import blocks, mT, phi, put, trsm


def chol_rev_symbolic(L: jax.Array, Lbar: jax.Array) -> jax.Array:
    """Murray's symbolic reverse step on one block, in his lower-triangular convention.

    ``P = Phi(L^T Lbar)``; ``Abar = Phi(L^-T (P + P^T) L^-1)``. The symmetric gradient is
    ``(Abar + Abar^T) / 2``.
    """
    P = phi(mT(L) @ jnp.tril(Lbar))
    S = P + mT(P)
    S = trsm(L, S, left=True, trans=True)
    S = trsm(L, S, left=False)
    return phi(S)


def chol_rev_blocked(L: jax.Array, Lbar: jax.Array, nb: int) -> jax.Array:
    """Murray's blocked (level-3) Cholesky adjoint, lower-triangular convention.

    Walks block columns ``j:k`` from the last to the first with, for the factor,
    ``R = L[j:k, :j]``, ``D = L[j:k, j:k]``, ``B = L[k:, :j]``, ``C = L[k:, j:k]`` and the
    same names barred for the gradient being accumulated (Murray 2016, Sec. 3.2,
    "blocked algorithm")::

        Cbar <- Cbar D^-1                        (TRSM)
        Bbar <- Bbar - Cbar R                    (GEMM)
        Dbar <- tril(Dbar) - tril(Cbar^T C)
        Dbar <- symbolic reverse on D            (chol_rev_symbolic)
        Rbar <- Rbar - Cbar^T B - (Dbar + Dbar^T) R

    About ``2 n^3 / 3`` flops: twice the forward factorization.

    Args:
        L: ``(..., n, n)`` lower Cholesky factor.
        Lbar: ``(..., n, n)`` cotangent of ``L``; its strict upper triangle is ignored.
        nb: block size.

    Returns:
        ``(..., n, n)`` lower-triangular ``Abar`` (Murray's convention).
    """
    n = L.shape[-1]
    g = jnp.tril(Lbar)
    for j, k in reversed(blocks(n, nb)):
        # Every read of ``g`` is of its newest version: a slice of an older version that is
        # still live after an in-place update makes XLA copy the whole buffer.
        D = L[..., j:k, j:k]
        if k < n:
            C = L[..., k:, j:k]
            Cb = trsm(D, g[..., k:, j:k], left=False)
            g = put(g, Cb, k, j)
            if j > 0:
                g = put(g, g[..., k:, :j] - Cb @ L[..., j:k, :j], k, 0)
            Db = jnp.tril(g[..., j:k, j:k]) - jnp.tril(mT(Cb) @ C)
        else:
            Db = g[..., j:k, j:k]
        Db = chol_rev_symbolic(D, Db)
        g = put(g, Db, j, j)
        if j > 0:
            R = L[..., j:k, :j]
            upd = (Db + mT(Db)) @ R
            if k < n:
                upd = upd + mT(g[..., k:, j:k]) @ L[..., k:, :j]
            g = put(g, g[..., j:k, :j] - upd, j, 0)
    return g
