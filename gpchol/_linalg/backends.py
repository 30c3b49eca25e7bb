"""The factorization backends as objects: one table instead of string comparisons.

A :class:`Backend` names its forward factorization (``(a, nb) -> (L, status)``), its
adjoint (``(L, Lbar, nb) -> symmetric Abar``), whether LAPACK on the host may stand in for
it on the CPU, and whether it picks its own tile size. :func:`resolve_backend` maps a
user's choice (``"auto"``, ``"xla"``, ``"tiled"``, ``"cuda"``) and the array's platform to
one of them; :func:`prepare` validates a matrix argument and resolves both the backend
and the tile size.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax.typing import DTypeLike

from gpchol._base.validate import (
    as_float_array,
    check_square,
    check_tile_size,
    replicated_if_explicit,
)
from gpchol._linalg.adjoint import chol_rev_blocked
from gpchol._linalg.blocks import default_tile_size, mT, nan_where_failed
from gpchol._linalg.host_lapack import factor_cpu_large, refactor_where
from gpchol._linalg.status import exact_status, near_failure
from gpchol._linalg.tiled import tiled_factor
from gpchol._linalg.triangular import cholesky

__all__ = [
    "BACKEND_CHOICES",
    "Backend",
    "array_platform",
    "backend",
    "prepare",
    "resolve_backend",
]

BACKEND_CHOICES = ("auto", "xla", "tiled", "cuda")


def potrf_xla(
    a: jax.Array, nb: int, rebuild: Callable[[], jax.Array] | None = None
) -> tuple[jax.Array, jax.Array]:
    """LAPACK's ``potrf`` on the CPU, cuSOLVER's on the GPU (as ``jax.lax.linalg.cholesky``;
    :func:`gpchol._linalg.triangular.cholesky`), with exact status.

    XLA reports failure as an all-NaN factor; the status is then LAPACK's ``info`` for
    the same matrix (:func:`gpchol._linalg.status.exact_status`, only when some batch
    element failed), in ``rebuild()`` when given (``a`` is then not kept alive for it).
    Large matrices on the CPU are factored by gpchol's handlers instead
    (:func:`gpchol._linalg.host_lapack.factor_cpu_large`: the same LAPACK ``potrf``, on
    blocks that OpenBLAS's threads do not crash on).
    """

    def xla(a: jax.Array) -> tuple[jax.Array, jax.Array]:
        L = cholesky(a)
        failed = ~jnp.all(jnp.isfinite(jnp.diagonal(L, axis1=-2, axis2=-1)), axis=-1)
        again = rebuild or (lambda: a)
        status = exact_status(failed, again, nb)
        # failed on OpenBLAS's threads, not in the search: take the search's factor
        L = refactor_where(failed & (status == 0), again, L, cholesky)
        # XLA's failed factor is NaN in its lower triangle only; make the whole matrix
        # NaN, like the other backends.
        return nan_where_failed(L, status), status

    return factor_cpu_large(a, xla)


def potrf_tiled_exact(
    a: jax.Array, nb: int, rebuild: Callable[[], jax.Array] | None = None
) -> tuple[jax.Array, jax.Array]:
    """gpchol's tiled factorization (:func:`gpchol._linalg.tiled.tiled_factor`) whose
    status is LAPACK's.

    Another blocking of the same arithmetic can fail where LAPACK does not, or succeed
    where it fails, only when a pivot comes within rounding of zero
    (:func:`gpchol._linalg.status.near_failure`). Those matrices, and the failed ones, get
    LAPACK's ``info`` (:func:`gpchol._linalg.status.exact_status`; off the CPU, the tiled
    search); a matrix that failed here but not in LAPACK takes LAPACK's factor, so the
    factor and the status always agree.

    Those rare cases need the input again: ``rebuild()`` recomputes it when given;
    otherwise ``a`` is kept alive for them (the work buffer is then a copy of ``a``
    rather than ``a`` itself: ``n^2`` more memory when ``a`` is an intermediate).
    """
    again = rebuild or (lambda: a)
    W, failed, locate, diag = tiled_factor(a, nb)
    suspect = failed | near_failure(W, diag)
    status = exact_status(suspect, again, nb, fallback=locate)
    W = refactor_where(failed & (status == 0), again, W, cholesky)
    return nan_where_failed(W, status), status


def potrf_cuda(
    a: jax.Array, nb: int | None, rebuild: Callable[[], jax.Array] | None = None
) -> tuple[jax.Array, jax.Array]:
    """gpchol's CUDA kernels (``kernels_cuda``) through the XLA FFI (their own status)."""
    from gpchol._cuda import ffi

    del rebuild
    return ffi.potrf(a, tile_size=nb)


def adjoint_jax(L: jax.Array, Lbar: jax.Array, nb: int | None) -> jax.Array:
    """Symmetric gradient ``dF/dA`` by Murray's blocked adjoint written in JAX."""
    g = chol_rev_blocked(L, Lbar, nb or default_tile_size(L.shape[-1], L.dtype))
    return 0.5 * (g + mT(g))


def adjoint_cuda(L: jax.Array, Lbar: jax.Array, nb: int | None) -> jax.Array:
    """Symmetric gradient ``dF/dA`` by the CUDA kernels' blocked adjoint."""
    from gpchol._cuda import ffi

    return ffi.potrf_adjoint(L, Lbar, tile_size=nb)


@dataclasses.dataclass(frozen=True)
class Backend:
    """One way of factoring and differentiating.

    Attributes:
        name: ``"xla"``, ``"tiled"`` or ``"cuda"``.
        forward: ``(a, nb, rebuild=None) -> (L, status)`` for ``(..., n, n)`` symmetric
            ``a``; ``rebuild()``, when given, recomputes ``a`` for the rare status search
            so that ``a`` need not be kept alive.
        adjoint: ``(L, Lbar, nb) -> Abar``, the symmetric gradient.
        host_lapack: on the CPU, host LAPACK may factor in place instead of ``forward``.
        own_tile_size: ``nb=None`` lets the backend choose its own blocking.
        whole_rule_default: the Gaussian whole-likelihood rule is the faster default.
    """

    name: str
    forward: Callable[..., tuple[jax.Array, jax.Array]]
    adjoint: Callable[..., jax.Array]
    host_lapack: bool = False
    own_tile_size: bool = False
    whole_rule_default: bool = True

    def __repr__(self) -> str:
        return f"Backend({self.name!r})"


_TABLE = {
    "xla": Backend("xla", potrf_xla, adjoint_jax, host_lapack=True),
    "tiled": Backend("tiled", potrf_tiled_exact, adjoint_jax),
    "cuda": Backend("cuda", potrf_cuda, adjoint_cuda, own_tile_size=True, whole_rule_default=False),
}


def backend(name: str) -> Backend:
    """The :class:`Backend` called ``name`` (``"xla"``, ``"tiled"`` or ``"cuda"``)."""
    return _TABLE[name]


def array_platform(a: object) -> str:
    """Platform of a concrete array, else of the default backend (inside ``jit``)."""
    try:
        devs = a.devices()  # type: ignore[attr-defined]
        return next(iter(devs)).platform
    except Exception:
        return jax.default_backend()


def cuda_reason() -> str | None:
    """``None`` when the CUDA kernels can run here, else why not."""
    from gpchol._cuda import ffi

    return ffi.cuda_unavailable_reason()


def resolve_backend(choice: str | Backend, a: object) -> Backend:
    """Map a user's backend choice to a concrete :class:`Backend`.

    Args:
        choice: ``"auto"``, ``"xla"``, ``"tiled"``, ``"cuda"`` or a :class:`Backend`.
        a: the array to factor (its platform decides ``"auto"``).

    Returns:
        The backend.

    Raises:
        ValueError: an unknown choice, or ``"cuda"`` for an array not on a GPU.
        RuntimeError: ``"cuda"`` asked for but the kernels are not available.

    Example:
        >>> import jax.numpy as jnp
        >>> resolve_backend("auto", jnp.eye(2)).name  # on a CPU
        'xla'
    """
    if isinstance(choice, Backend):
        return choice
    if choice not in BACKEND_CHOICES:
        raise ValueError(f"backend must be one of {BACKEND_CHOICES}; got {choice!r}.")
    platform = array_platform(a)
    if choice == "auto":
        if platform == "gpu" and cuda_reason() is None:
            return _TABLE["cuda"]
        return _TABLE["xla"]
    if choice == "cuda":
        if platform != "gpu":
            raise ValueError(
                "backend='cuda' needs the input on an NVIDIA GPU; this array is on "
                f"'{platform}'. Use backend='auto', 'xla' or 'tiled'."
            )
        reason = cuda_reason()
        if reason is not None:
            raise RuntimeError(f"backend='cuda' is unavailable: {reason}")
    return _TABLE[choice]


def tile_for(be: Backend, n: int, dtype: DTypeLike, tile_size: int | None) -> int | None:
    """The tile size to use: the user's (clipped to ``[1, n]``), else the default.

    A backend that picks its own blocking (CUDA) keeps ``None`` when none was given.
    """
    if tile_size is None:
        if be.own_tile_size:
            return None
        tile_size = default_tile_size(n, dtype)
    return max(1, min(tile_size, max(n, 1)))


def prepare(
    a: object, tile_size: object, choice: str | Backend, name: str = "a"
) -> tuple[jax.Array, int | None, Backend]:
    """Validate ``a``; return ``(a, tile_size, backend)`` with both resolved.

    For the CUDA backend a tile size the user did not give stays ``None``: the kernels then
    pick their own (one cuSOLVER call for the forward pass, a GPU-sized adjoint block).
    """
    x = replicated_if_explicit(as_float_array(a, name))
    check_square(x, name)
    nb = check_tile_size(tile_size)
    be = resolve_backend(choice, x)
    return x, tile_for(be, x.shape[-1], x.dtype, nb), be
