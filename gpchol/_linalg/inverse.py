"""``A^-1`` from the lower Cholesky factor: LAPACK ``potri`` on the CPU, tiled elsewhere."""

from __future__ import annotations

from functools import partial

import jax

from gpchol._linalg.host_lapack import cho_inverse_cpu
from gpchol._linalg.tiled import cho_inverse_tiled

__all__ = ["inverse_from_factor"]


def inverse_from_factor(L: jax.Array, nb: int, *, column_major: bool = False) -> jax.Array:
    """``(..., n, n)`` ``A^-1 = L^-T L^-1`` from the lower factor ``L`` (strict upper ignored).

    The platform is chosen at lowering: LAPACK ``potri`` on the host CPU (in place), the
    tiled ``trtri`` + ``lauum`` in JAX elsewhere and for small ``n``. Differentiable.
    ``column_major`` is a layout hint for the host call: true when ``L`` comes straight
    from a LAPACK ``potrf`` that left it column-major (XLA's Cholesky, or
    ``chol_solve_cpu(..., column_major=True)``); the values are the same either way.

    Example:
        >>> import jax.numpy as jnp
        >>> inverse_from_factor(jnp.array([[2.0, 0.0], [1.0, 1.0]]), 2).tolist()
        [[0.5, -0.5], [-0.5, 1.0]]
    """
    return cho_inverse_cpu(L, partial(cho_inverse_tiled, nb=nb), column_major=column_major)
