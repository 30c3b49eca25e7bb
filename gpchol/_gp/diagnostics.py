"""The conditioning diagnostic of a GP's covariance and its warning.

LAPACK, and every GP library built on it, factors an exactly singular covariance (say,
duplicated inputs with zero noise) whenever rounding leaves every pivot positive: the
factorization then succeeds (status 0) and the log-likelihood is finite, but its value and
gradient are mostly rounding error. :class:`GPDiagnostics` reports the factorization's
status with its *pivot ratio* ``rcond = (min_j L_jj / max_j L_jj)^2``, which is never below
the true ``1 / cond_2(K)``, and flags as ``singular`` a covariance that factored although
``rcond < n * eps``: such a ``K`` is certainly numerically singular in the working precision.
Eager (un-traced) GP methods warn with :class:`SingularCovarianceWarning` when a finite
result comes from such a covariance.
"""

from __future__ import annotations

import warnings
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from gpchol._base.validate import is_concrete
from gpchol._linalg.status import diagonal_rcond, pivot_rcond, singular_threshold

__all__ = ["GPDiagnostics", "SingularCovarianceWarning", "diagnose_factor"]


class SingularCovarianceWarning(RuntimeWarning):
    """A finite likelihood or posterior came from a numerically singular covariance.

    Issued by eager (un-traced) :class:`gpchol.GaussianProcess` methods, once per call
    site (its text does not change; Python's default warning filter shows it once per
    line that triggers it). The instance carries ``rcond`` (the smallest pivot ratio
    found) and ``threshold`` (``n * eps``); silence it with
    ``warnings.filterwarnings("ignore", category=SingularCovarianceWarning)``.
    """

    def __init__(self, message: str, *, rcond: float = float("nan"), threshold: float = 0.0):
        super().__init__(message)
        self.rcond = rcond
        self.threshold = threshold


class GPDiagnostics(NamedTuple):
    """Status and conditioning of a GP covariance's factorization (a pytree of arrays).

    Attributes:
        status: int32, LAPACK ``potrf``'s ``info``: 0 when the covariance factored, else
            the 1-based first failing pivot.
        rcond: the pivot ratio ``(min_j L_jj / max_j L_jj)^2`` of the factor, an upper
            bound on ``1 / cond_2(K)`` in ``[0, 1]`` (0 when the factorization failed;
            1 for an empty covariance).
        threshold: ``n * eps`` of the working precision, the bound below which ``rcond``
            means numerically singular.
        singular: bool, ``status == 0`` and ``rcond < threshold``: the factorization
            succeeded, but on a numerically singular covariance, so a finite likelihood
            from it is dominated by rounding.
        jitter_used: the jitter the factorization added to the diagonal (0 if none).

    Under ``vmap`` every field gains the batch dimensions.

    Example:
        >>> import jax.numpy as jnp
        >>> from gpchol import GaussianProcess, kernels
        >>> X = jnp.array([0.0, 1.0, 1.0005, 2.0])  # nearly duplicated, no noise (float32)
        >>> d = GaussianProcess(kernels.ExpSquared(), X, noise=0.0).diagnostics()
        >>> int(d.status), bool(d.singular), bool(d.rcond < d.threshold)
        (0, True, True)
    """

    status: jax.Array
    rcond: jax.Array
    threshold: jax.Array
    singular: jax.Array
    jitter_used: jax.Array

    def warn_if_singular(self, what: str = "GaussianProcess", *, stacklevel: int = 2) -> bool:
        """Warn (:class:`SingularCovarianceWarning`) if a concrete diagnostic is singular.

        Does nothing on traced values (inside ``jit``, ``vmap`` or ``grad``), so it is
        safe to call anywhere; with a batch, warns when any element is singular.

        Args:
            what: the operation named in the message, e.g.
                ``"GaussianProcess.log_marginal_likelihood"``.
            stacklevel: as in :func:`warnings.warn`, counted from the caller of this
                method (the default, 2, names the caller's caller).

        Returns:
            Whether the warning was issued.
        """
        if not is_concrete(self.singular, self.rcond) or not np.any(np.asarray(self.singular)):
            return False
        rcond = np.asarray(self.rcond)
        singular = np.asarray(self.singular)
        worst = float(np.min(rcond[singular])) if rcond.ndim else float(rcond)
        threshold = float(np.max(np.asarray(self.threshold)))
        warnings.warn(
            SingularCovarianceWarning(
                f"{what}: the covariance k(X, X) + diag(noise) factored, but it is "
                "numerically singular (its pivot ratio, an upper bound on 1/cond_2, is below "
                "n * eps), so the finite result is dominated by rounding. Typical causes: "
                "duplicated inputs with zero or tiny noise, a very long lengthscale. Add "
                "noise (or a lower bound on it), jitter=(1e-8, 1e-6, 1e-4) on the "
                "GaussianProcess, or remove duplicated inputs; `gp.diagnostics()` gives "
                "the numbers.",
                rcond=worst,
                threshold=threshold,
            ),
            stacklevel=stacklevel + 1,
        )
        return True


# Jitted: called outside jit (diagnostics(), the eager singular check) it compiles one
# program, not six small ones op by op; GaussianProcess.condition computes it inside its own.
@jax.jit
def diagnose_factor(
    L: jax.Array, status: jax.Array, jitter_used: jax.Array, mask: jax.Array | None = None
) -> GPDiagnostics:
    """:class:`GPDiagnostics` of a factor ``L`` (``(..., n, n)``) and its status.

    With ``mask`` (``(n,)``, False on padded rows) the padded rows' unit pivots are left
    out: the report is that of the real points' covariance. Costs ``O(n)``; works on
    traced values.
    """
    if mask is None:
        rcond = pivot_rcond(L)
        threshold = jnp.asarray(singular_threshold(L.shape[-1], L.dtype), rcond.dtype)
    else:
        d = jnp.abs(jnp.diagonal(L, axis1=-2, axis2=-1))
        real = jnp.max(jnp.where(mask, d, jnp.zeros((), d.dtype)), axis=-1, keepdims=True)
        # no real point (all padding): an empty covariance, rcond 1 (as for n = 0)
        real = jnp.where(jnp.any(mask), real, jnp.ones((), d.dtype))
        rcond = diagonal_rcond(jnp.where(mask, d, real))
        n_real = jnp.maximum(jnp.sum(mask), 1).astype(rcond.dtype)
        threshold = n_real * jnp.finfo(L.dtype).eps
    status = jnp.asarray(status, jnp.int32)
    rcond = jnp.where(status == 0, rcond, jnp.zeros((), rcond.dtype))
    singular = (status == 0) & (rcond < threshold)
    return GPDiagnostics(status, rcond, threshold, singular, jnp.asarray(jitter_used))
