"""The triangular solve and the Cholesky factor that every one-device path calls.

Two primitives with JAX's own semantics (``lax.linalg.triangular_solve``,
``lax.linalg.cholesky(symmetrize_input=False)``) and JAX's derivative rules, whose CPU
lowering runs a batch of matrices one after another on the calling thread, through
gpchol's compiled handlers (:mod:`gpchol._cpu.ffi`). jaxlib 0.10.2's own batched CPU
kernels hand a batch to XLA's intra-op thread pool and block until it is done: when XLA
runs as many of them at once as the pool has threads (two on a 2-core machine: the solves
of two independent posterior draws under ``vmap``, or two Cholesky factors of a
vectorised sampler), all threads wait and the program never returns. Unbatched calls,
other platforms, other dtypes, and a CPU without the compiled handlers lower to JAX's
operations unchanged.

Derivatives (the same rules as JAX's; Murray 2016, "Differentiation of the Cholesky
decomposition", eq. 9, for the factor): with ``op(A) X = B``,

* ``dX = op(A)^-1 (dB - op(dA) X)`` (left; mirrored for the right), linear in ``dB`` and
  transposed by the solve with ``op`` transposed;
* ``L = chol(A)``: ``dL = L Phi(L^-1 dA L^-T)``, ``Phi`` the lower triangle with its
  diagonal halved (:func:`chol_tangent`, the package's one forward-mode Cholesky rule).

The layout-aware block solve :func:`trsm` (re-exported by :mod:`gpchol._linalg.blocks`)
lives here too, below everything that uses it.
"""

from __future__ import annotations

from functools import cache, partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

from gpchol._cpu import ffi as cpu_ffi

__all__ = ["chol_tangent", "cholesky", "mT", "phi", "triangular_solve", "trsm"]

_HANDLED = (np.dtype(np.float32), np.dtype(np.float64))


def mT(x: jax.Array) -> jax.Array:
    return jnp.swapaxes(x, -1, -2)


def phi(x: jax.Array) -> jax.Array:
    """Lower triangle of ``x`` with its diagonal halved: ``Phi(X)``."""
    n = x.shape[-1]
    return jnp.tril(x) - 0.5 * x * jnp.eye(n, dtype=x.dtype)


def trsm(
    a: jax.Array, b: jax.Array, *, left: bool, lower: bool = True, trans: bool = False
) -> jax.Array:
    """Triangular solve ``op(a) x = b`` (left) or ``x op(a) = b`` (right), batched.

    XLA's CPU triangular solve (LAPACK) wants column-major operands. Handed slices of a
    large row-major work buffer, XLA's layout assignment would relayout (copy) the whole
    buffer at every block step; so the solve is posed on the transposes, which are
    column-major views of the row-major slices: ``op(a) x = b  <=>  x^T op(a)^T = b^T``.
    The solve (:func:`triangular_solve`) also needs equal batch
    dimensions, so ``a`` is broadcast to ``b``'s batch shape when they differ.
    """
    batch = jnp.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    a = jnp.broadcast_to(a, batch + a.shape[-2:])
    b = jnp.broadcast_to(b, batch + b.shape[-2:])
    xt = triangular_solve(mT(a), mT(b), left_side=not left, lower=not lower, transpose_a=trans)
    return mT(xt)


def chol_tangent(L: jax.Array, a_dot: jax.Array) -> jax.Array:
    """Forward-mode map ``dA -> L Phi(L^-1 dA L^-T)`` (``dA`` symmetric)."""
    x = trsm(L, a_dot, left=True)
    x = trsm(L, x, left=False, trans=True)
    return L @ phi(x)


def triangular_solve(
    a: jax.Array,
    b: jax.Array,
    *,
    left_side: bool,
    lower: bool,
    transpose_a: bool = False,
) -> jax.Array:
    """``op(a) x = b`` (``left_side``) or ``x op(a) = b``, as ``lax.linalg.triangular_solve``.

    Args:
        a: ``(..., k, k)`` triangular; its batch dimensions equal ``b``'s.
        b: ``(..., m, p)`` right-hand sides (``k = m`` from the left, else ``k = p``).
        left_side: solve from the left.
        lower: ``a`` is lower triangular (the other triangle is not read).
        transpose_a: ``op(a) = a^T``.

    Returns:
        ``(..., m, p)`` ``x``.

    Example:
        >>> import jax.numpy as jnp
        >>> from gpchol._linalg.triangular import triangular_solve
        >>> a = jnp.array([[2.0, 0.0], [1.0, 1.0]])
        >>> triangular_solve(a, jnp.array([[2.0], [3.0]]), left_side=True, lower=True).tolist()
        [[1.0], [2.0]]
    """
    return _trsm_p.bind(
        a, b, left_side=bool(left_side), lower=bool(lower), transpose_a=bool(transpose_a)
    )


def cholesky(a: jax.Array) -> jax.Array:
    """Lower Cholesky factor of each ``(..., n, n)`` matrix (its lower triangle read).

    As ``lax.linalg.cholesky(a, symmetrize_input=False)``: NaN where ``a`` does not factor.

    Example:
        >>> import jax.numpy as jnp
        >>> from gpchol._linalg.triangular import cholesky
        >>> cholesky(jnp.array([[4.0, 2.0], [2.0, 2.0]])).tolist()
        [[2.0, 0.0], [1.0, 1.0]]
    """
    return _potrf_p.bind(a)


def _batched(*xs: jax.Array) -> bool:
    return any(int(np.prod(x.shape[:-2], dtype=np.int64)) > 1 for x in xs)


def _host(dtype: Any) -> bool:
    return np.dtype(dtype) in _HANDLED and cpu_ffi.cpu_unavailable_reason() is None


@cache
def _compiled(prim: Primitive, **params: Any) -> Any:
    return jax.jit(partial(prim.bind, **params))


def _eager(prim: Primitive, fallback: Any) -> Any:
    """The eager rule of ``prim``: one compiled call of it, or, under
    :func:`jax.disable_jit` (where that call would bind ``prim`` again, endlessly),
    ``fallback``, JAX's own operations (one at a time there, so they cannot fill XLA's
    thread pool)."""

    def impl(*args: jax.Array, **params: Any) -> jax.Array:
        if jax.config.jax_disable_jit:  # type: ignore[attr-defined]
            return fallback(*args, **params)
        return _compiled(prim, **params)(*args)

    return impl


# ---- the triangular solve --------------------------------------------------------------

_trsm_p = Primitive("gpchol_triangular_solve")
_trsm_p.def_abstract_eval(lambda a, b, **p: b)


def _trsm_jax(a: jax.Array, b: jax.Array, **p: Any) -> jax.Array:
    a = jnp.broadcast_to(a, b.shape[:-2] + a.shape[-2:])
    return lax.linalg.triangular_solve(a, b, **p)


_trsm_p.def_impl(_eager(_trsm_p, _trsm_jax))


def _trsm_lowering(ctx: Any, a: Any, b: Any, **p: Any) -> Any:
    return mlir.lower_fun(partial(_trsm_jax, **p), multiple_results=False)(ctx, a, b)


def _trsm_cpu_lowering(ctx: Any, a: Any, b: Any, **p: Any) -> Any:
    a_aval, b_aval = ctx.avals_in
    if _batched(a_aval, b_aval) and _host(b_aval.dtype):

        def host(a: jax.Array, b: jax.Array) -> jax.Array:
            return cpu_ffi.trsm(
                a, b, left=p["left_side"], lower=p["lower"], transpose=p["transpose_a"]
            )

        return mlir.lower_fun(host, multiple_results=False)(ctx, a, b)
    return _trsm_lowering(ctx, a, b, **p)


mlir.register_lowering(_trsm_p, _trsm_lowering)
mlir.register_lowering(_trsm_p, _trsm_cpu_lowering, platform="cpu")


def _front(x: jax.Array, d: int | None, size: int) -> jax.Array:
    """``x`` with its batch dimension ``d`` first (``None``: not batched, broadcast)."""
    if d is None:
        return jnp.broadcast_to(x, (size, *x.shape))
    return jnp.moveaxis(x, d, 0)


def _trsm_batch(args: tuple[jax.Array, jax.Array], dims: tuple[Any, Any], **p: Any) -> Any:
    a, b = args
    da, db = dims
    size = next(x.shape[d] for x, d in zip(args, dims, strict=True) if d is not None)
    b = _front(b, db, size)
    if da is None and a.ndim == 2:
        return _trsm_p.bind(a, b, **p), 0  # one matrix for every right-hand side
    a = jnp.broadcast_to(_front(a, da, size), b.shape[:-2] + a.shape[-2:])
    return _trsm_p.bind(a, b, **p), 0


batching.primitive_batchers[_trsm_p] = _trsm_batch


_matmul = partial(jnp.matmul, precision=lax.Precision.HIGHEST)


def _op(a: jax.Array, transpose_a: bool) -> jax.Array:
    return mT(a) if transpose_a else a


def _trsm_jvp_a(g_a: Any, x: jax.Array, a: jax.Array, b: jax.Array, **p: Any) -> jax.Array:
    # op(a) x = b  =>  dx = -op(a)^-1 op(da) x  (left);  x op(a) = b  =>  dx = -x op(da) op(a)^-1
    g_a = jnp.tril(g_a) if p["lower"] else jnp.triu(g_a)
    g = _op(g_a, p["transpose_a"])
    rhs = _matmul(g, x) if p["left_side"] else _matmul(x, g)
    return _trsm_p.bind(a, -rhs, **p)


ad.defjvp2(
    _trsm_p,
    _trsm_jvp_a,
    lambda g_b, x, a, b, **p: _trsm_p.bind(a, g_b, **p),
)


def _trsm_transpose(ct: Any, a: Any, b: Any, **p: Any) -> tuple[None, Any]:
    # x = op(a)^-1 b is linear in b; its transpose is the solve with op(a)^T (same side).
    assert not ad.is_undefined_primal(a)
    if type(ct) is ad.Zero:
        return None, ad.Zero(b.aval)
    return None, _trsm_p.bind(a, ct, **{**p, "transpose_a": not p["transpose_a"]})


ad.primitive_transposes[_trsm_p] = _trsm_transpose


# ---- the Cholesky factor ---------------------------------------------------------------

_potrf_p = Primitive("gpchol_cholesky")
_potrf_p.def_abstract_eval(lambda a: a)


def _potrf_jax(a: jax.Array) -> jax.Array:
    return lax.linalg.cholesky(a, symmetrize_input=False)


_potrf_p.def_impl(_eager(_potrf_p, _potrf_jax))


def _potrf_host(a: jax.Array) -> jax.Array:
    # chol_solve's factor: NaN where potrf fails (XLA's is NaN in the lower triangle)
    return cpu_ffi.chol_solve(a, jnp.zeros(a.shape[:-1], a.dtype), column_major=True)[0]


def _potrf_cpu_lowering(ctx: Any, a: Any) -> Any:
    (a_aval,) = ctx.avals_in
    if _batched(a_aval) and _host(a_aval.dtype):
        return mlir.lower_fun(_potrf_host, multiple_results=False)(ctx, a)
    return mlir.lower_fun(_potrf_jax, multiple_results=False)(ctx, a)


mlir.register_lowering(_potrf_p, mlir.lower_fun(_potrf_jax, multiple_results=False))
mlir.register_lowering(_potrf_p, _potrf_cpu_lowering, platform="cpu")


def _potrf_batch(args: tuple[jax.Array], dims: tuple[Any]) -> Any:
    (a,), (d,) = args, dims
    return _potrf_p.bind(jnp.moveaxis(a, d, 0)), 0


batching.primitive_batchers[_potrf_p] = _potrf_batch


ad.defjvp2(_potrf_p, lambda da, L, a: chol_tangent(L, da))
