"""``A^-1`` from the lower Cholesky factor: LAPACK ``potri`` on the CPU, tiled elsewhere."""

from __future__ import annotations

from functools import partial

import jax

from gpchol._linalg.host_lapack import cho_inverse_cpu
from gpchol._linalg.tiled import cho_inverse_tiled

__all__ = ["inverse_from_factor"]


def inverse_from_factor(L: jax.Array, nb: int) -> jax.Array:
    """``(..., n, n)`` ``A^-1 = L^-T L^-1`` from the lower factor ``L`` (strict upper ignored).

    The platform is chosen at lowering: LAPACK ``potri`` on the host CPU (in place), the
    tiled ``trtri`` + ``lauum`` in JAX elsewhere and for small ``n``. Differentiable.

    Example:
        >>> import jax.numpy as jnp
        >>> inverse_from_factor(jnp.array([[2.0, 0.0], [1.0, 1.0]]), 2).tolist()
        [[0.5, -0.5], [-0.5, 1.0]]
    """
    return cho_inverse_cpu(L, partial(cho_inverse_tiled, nb=nb))
