"""gpchol's compiled CPU handlers (``lapack_ffi.cc``) as JAX functions, through the XLA FFI.

The handlers run LAPACK on XLA's own buffers inside the compiled program: no Python
callback, no GIL, nothing that can deadlock XLA's CPU runtime or turn Ctrl-C into an
internal error. They are built by the normal install (``pip install .`` or ``pip install
-e .`` compiles ``gpchol/_cpu/lapack_ffi.cc`` as the extension ``gpchol._cpu._lapack_ffi``;
see ``setup.py``) and take SciPy's LAPACK: the routines of the OpenBLAS SciPy's wheel
bundles (found by name, without importing ``scipy.linalg``), or for other SciPy builds the
function pointers of ``scipy.linalg.cython_lapack`` / ``cython_blas``.

Nothing happens at import: the library is loaded, handed its LAPACK routines and its
handlers registered for the ``"cpu"`` platform on first use, once per process.

Contract used by :mod:`gpchol._linalg`:

* :func:`cpu_unavailable_reason` -- ``None`` when the handlers can run, else why not
  (then :mod:`gpchol._linalg` uses XLA operations instead: slower, never a callback);
* :func:`chol_solve` -- ``(L, alpha, quad, logdet, status)``, ``K`` factored in place;
* :func:`potri` -- ``A^-1`` from a factor, in place;
* :func:`potrf_info` -- LAPACK ``potrf``'s ``info`` of the masked matrices (the status
  search);
* :func:`trsm` -- a stack of triangular solves, one after another on the calling thread.

All four are traceable (``jit``, ``vmap``: the batch dimensions are looped over inside
the handler, ``vmap_method="broadcast_all"``); none is differentiable by itself.
"""

from __future__ import annotations

import ctypes
import importlib.machinery
import importlib.util
import os
import threading
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from gpchol._base.validate import check_int

__all__ = [
    "TARGETS",
    "chol_solve",
    "cpu_unavailable_reason",
    "library_path",
    "one_thread_max_n",
    "potrf_info",
    "potri",
    "trsm",
]

_STEM = "_lapack_ffi"
_SUFFIX = {np.dtype(np.float32): "f32", np.dtype(np.float64): "f64"}

TARGETS = tuple(
    f"gpchol_cpu_{op}_{suffix}"
    for op in ("chol_solve", "potri", "potrf_info", "trsm")
    for suffix in ("f32", "f64")
)
"""The FFI targets of the library, all registered for the ``"cpu"`` platform."""

# SciPy's routines handed to gpchol_cpu_set_lapack, in its argument order.
_ROUTINES = (
    ("cython_lapack", "spotrf"),
    ("cython_lapack", "dpotrf"),
    ("cython_lapack", "spotri"),
    ("cython_lapack", "dpotri"),
    ("cython_blas", "strsv"),
    ("cython_blas", "dtrsv"),
)

# gpchol_cpu_set_blas3's, in its argument order: float's, then double's.
_BLAS3 = tuple(
    ("cython_lapack" if op in ("trtri", "lauum") else "cython_blas", prefix + op)
    for prefix in "sd"
    for op in ("trsm", "trmm", "syrk", "gemm", "trtri", "lauum")
)

SPLIT_ABOVE = 8192
"""Above this order the handlers factor and invert by halving (BLAS-3 on blocks) instead of
one potrf / potri call, which crashes in SciPy's threaded OpenBLAS at large orders (see
``lapack_ffi.cc``)."""

_lock = threading.Lock()
_state: dict[str, Any] = {}  # "reason": str | None once loading was tried


def library_path() -> Path | None:
    """Where the built extension is, or ``None`` when it was not built."""
    here = Path(__file__).resolve().parent
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        p = here / f"{_STEM}{suffix}"
        if p.is_file():
            return p
    return None


def _capsule_pointer(capsule: object) -> int:
    get_name = ctypes.pythonapi.PyCapsule_GetName
    get_name.restype = ctypes.c_char_p
    get_name.argtypes = [ctypes.py_object]
    get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
    get_pointer.restype = ctypes.c_void_p
    get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
    ptr = get_pointer(capsule, get_name(capsule))
    if not ptr:
        raise RuntimeError("a SciPy LAPACK capsule holds a null pointer")
    return int(ptr)


def _load() -> str | None:
    path = library_path()
    if path is None:
        return (
            "the compiled CPU handlers (gpchol/_cpu/_lapack_ffi*.so) are not built: "
            "reinstall gpchol with `pip install .` (or `pip install -e .`), which compiles them"
        )
    try:
        lib = ctypes.CDLL(str(path))
        found = _bundled_openblas()
        failed = _hand_over(lib, found if found is not None else _cython_routines())
        if failed is not None:
            return failed
        lib.gpchol_cpu_one_thread_max_n.restype = ctypes.c_int64
        _state["one_thread_max_n"] = int(lib.gpchol_cpu_one_thread_max_n())
        for name in TARGETS:
            jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(getattr(lib, name)), platform="cpu")
    except (OSError, AttributeError, ImportError, KeyError, RuntimeError) as e:
        return f"loading the compiled CPU handlers from {path} failed: {e}"
    _state["lib"] = lib  # keep the library loaded for the life of the process
    return None


_Routines = tuple[dict[str, int], "tuple[int, int] | None"]


def _hand_over(lib: ctypes.CDLL, routines: _Routines) -> str | None:
    """Gives the library its LAPACK/BLAS routines (and OpenBLAS's thread functions when
    known); ``None``, or why it refused."""
    addresses, threads = routines
    ptrs = [addresses[name] for _, name in _ROUTINES]
    lib.gpchol_cpu_set_lapack.restype = ctypes.c_int
    lib.gpchol_cpu_set_lapack.argtypes = [ctypes.c_void_p] * len(ptrs)
    if lib.gpchol_cpu_set_lapack(*ptrs) != 0:
        return "gpchol_cpu_set_lapack rejected SciPy's LAPACK routines"
    blas3 = [addresses[name] for _, name in _BLAS3]
    lib.gpchol_cpu_set_blas3.restype = ctypes.c_int
    lib.gpchol_cpu_set_blas3.argtypes = [ctypes.c_void_p] * len(blas3)
    if lib.gpchol_cpu_set_blas3(*blas3) != 0:
        return "gpchol_cpu_set_blas3 rejected SciPy's BLAS-3 routines"
    if threads is not None:
        lib.gpchol_cpu_set_threads.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        lib.gpchol_cpu_set_threads(*threads)
    return None


def _bundled_openblas() -> _Routines | None:
    """SciPy's routines taken from the OpenBLAS its wheel bundles, without importing
    ``scipy.linalg`` (slow at a fit's start otherwise): ``(address by routine name,
    OpenBLAS's get/set_num_threads)``, or ``None`` when that library or one of its
    ``scipy_``-prefixed symbols is not there (another SciPy build: then the Cython path).

    The ``cython_lapack``/``cython_blas`` functions of such a wheel only jump to these
    symbols, arguments untouched, so both paths call the same code the same way (a test
    runs the handlers through each).
    """
    spec = importlib.util.find_spec("scipy")  # finds the package, imports nothing
    if spec is None or not spec.submodule_search_locations:
        return None
    libs = Path(next(iter(spec.submodule_search_locations))).parent / "scipy.libs"
    for lib_path in sorted(libs.glob("libscipy_openblas*.so*")):
        try:
            so = ctypes.CDLL(str(lib_path))
            addresses = {
                name: _address(getattr(so, f"scipy_{name}_")) for _, name in _ROUTINES + _BLAS3
            }
        except (OSError, AttributeError):
            continue
        get = getattr(so, "scipy_openblas_get_num_threads", None)
        set_ = getattr(so, "scipy_openblas_set_num_threads", None)
        threads = (_address(get), _address(set_)) if get is not None and set_ else None
        return addresses, threads
    return None


def _address(fn: Any) -> int:
    return int(ctypes.cast(fn, ctypes.c_void_p).value or 0)


def _cython_routines() -> _Routines:
    """SciPy's routines from the function pointers ``scipy.linalg.cython_lapack`` and
    ``cython_blas`` export (any SciPy build), and OpenBLAS's thread functions if found."""
    import scipy.linalg.cython_blas as cython_blas
    import scipy.linalg.cython_lapack as cython_lapack

    modules = {"cython_lapack": cython_lapack, "cython_blas": cython_blas}
    addresses = {
        name: _capsule_pointer(modules[m].__pyx_capi__[name]) for m, name in _ROUTINES + _BLAS3
    }
    return addresses, _openblas_thread_functions()


def _openblas_thread_functions() -> tuple[int, int] | None:
    """Addresses of ``get``/``set_num_threads`` of the OpenBLAS SciPy's LAPACK comes from.

    Found among the libraries this process has loaded (Linux ``/proc/self/maps``) in
    SciPy's wheel's ``scipy.libs`` folder; ``None`` elsewhere (another LAPACK, another
    system): the handlers then leave OpenBLAS's threads alone.
    """
    import scipy

    libs = os.path.dirname(scipy.__file__) + ".libs" + os.sep
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if libs in line and "openblas" in line}
    except OSError:
        return None
    for path in sorted(paths):
        try:
            so = ctypes.CDLL(path)
        except OSError:
            continue
        for prefix in ("scipy_openblas", "openblas"):
            get = getattr(so, f"{prefix}_get_num_threads", None)
            set_ = getattr(so, f"{prefix}_set_num_threads", None)
            if get is not None and set_ is not None:
                return (
                    ctypes.cast(get, ctypes.c_void_p).value or 0,
                    ctypes.cast(set_, ctypes.c_void_p).value or 0,
                )
    return None


def one_thread_max_n() -> int:
    """The order up to which the handlers run OpenBLAS on one thread (``0`` when not loaded).

    A failing pivot found by rounding can depend on OpenBLAS's thread count, so a SciPy
    ``potrf`` reference must run the same way to compare exactly.

    Example:
        >>> from gpchol._cpu.ffi import one_thread_max_n
        >>> one_thread_max_n() > 0
        True
    """
    cpu_unavailable_reason()
    return int(_state.get("one_thread_max_n", 0))


def cpu_unavailable_reason() -> str | None:
    """``None`` when the compiled CPU handlers are loaded and registered, else why not.

    Loads and registers them on the first call (thread-safe, once per process).

    Example:
        >>> from gpchol._cpu.ffi import cpu_unavailable_reason
        >>> cpu_unavailable_reason() is None  # built by the install
        True
    """
    with _lock:
        if "reason" not in _state:
            _state["reason"] = _load()
        reason: str | None = _state["reason"]
        return reason


def _target(op: str, dtype: Any) -> str:
    suffix = _SUFFIX.get(np.dtype(dtype))
    if suffix is None:
        raise TypeError(f"gpchol's CPU handlers take float32 or float64; got {np.dtype(dtype)}")
    reason = cpu_unavailable_reason()
    if reason is not None:
        raise RuntimeError(reason)
    return f"gpchol_cpu_{op}_{suffix}"


def _column_major(x: Any) -> tuple[int, ...] | None:
    """``ffi_call``'s layout (major-to-minor axes) of ``x``, a ``(..., n, n)`` column-major
    stack; ``None`` (the default layout) for an empty one, which holds no data either way
    (XLA's CPU compiler divided by zero on a column-major empty operand: SIGFPE)."""
    return (*range(x.ndim - 2), x.ndim - 1, x.ndim - 2) if x.size else None


def chol_solve(
    K: jax.Array,
    r: jax.Array,
    *,
    column_major: bool = False,
    symmetric: bool = False,
    split_above: int = SPLIT_ABOVE,
) -> tuple[jax.Array, ...]:
    """``(L, alpha, quad, logdet, status)`` of ``K`` and ``r`` by LAPACK, ``K`` in place.

    ``K``'s buffer becomes ``L``'s. A failed factorization gives LAPACK's ``info`` as
    status and NaN elsewhere.

    Args:
        K: ``(..., n, n)`` symmetric positive definite (lower triangle read).
        r: ``(..., n)`` right-hand sides, same batch shape as ``K``.
        column_major: lay ``K`` and ``L`` out column-major (XLA's layouts for the call):
            LAPACK then factors ``K`` as it is, as XLA's own Cholesky does, where the
            row-major default costs two in-place ``O(n^2)`` relayout passes. ``L`` is then
            best consumed as such (``potri(L, column_major=True)``).
        symmetric: the caller guarantees ``K`` equals its transpose bit for bit (e.g.
            ``(A + A^T) / 2``): the row-major form then skips its first relayout pass
            (the result is the same).
        split_above: the order above which the handler halves (:data:`SPLIT_ABOVE`).

    Returns:
        ``L (..., n, n)`` (lower, zero strict upper), ``alpha = K^-1 r (..., n)``,
        ``quad = r^T K^-1 r (...)``, ``logdet (...)``, int32 ``status (...)``.

    Example:
        >>> import jax.numpy as jnp
        >>> from gpchol._cpu.ffi import chol_solve
        >>> L, alpha, quad, logdet, status = chol_solve(4.0 * jnp.eye(2), jnp.ones(2))
        >>> L.tolist(), alpha.tolist(), float(quad), int(status)
        ([[2.0, 0.0], [0.0, 2.0]], [0.25, 0.25], 0.5, 0)
    """
    batch = K.shape[:-2]
    out = (
        jax.ShapeDtypeStruct(K.shape, K.dtype),
        jax.ShapeDtypeStruct(r.shape, K.dtype),
        jax.ShapeDtypeStruct(batch, K.dtype),
        jax.ShapeDtypeStruct(batch, K.dtype),
        jax.ShapeDtypeStruct(batch, jnp.int32),
    )
    cm = _column_major(K) if column_major else None
    call = jax.ffi.ffi_call(
        _target("chol_solve", K.dtype),
        out,
        input_output_aliases={0: 0},
        vmap_method="broadcast_all",
        input_layouts=[cm, None],
        output_layouts=[cm, None, None, None, None],
    )
    return tuple(
        call(
            K,
            r.astype(K.dtype),
            column_major=column_major,
            symmetric=symmetric,
            split_above=_order_bound(split_above),
        )
    )


def _order_bound(split_above: int) -> np.int64:
    return np.int64(check_int(split_above, "split_above", strict=False))


def potri(
    F: jax.Array,
    *,
    upper: bool = False,
    column_major: bool = False,
    split_above: int = SPLIT_ABOVE,
) -> jax.Array:
    """``A^-1`` from the Cholesky factor of ``A``, by LAPACK ``potri``, in place.

    Args:
        F: ``(..., n, n)`` the lower factor ``L`` (its strict upper triangle is ignored),
            or with ``upper`` its transpose ``L^T`` (strict lower ignored).
        upper: ``F`` holds ``L^T``.
        column_major: ``F`` is the lower factor ``L`` laid out column-major (as
            ``chol_solve(..., column_major=True)`` leaves it), and so is the result (the
            full symmetric inverse: the same numbers in either layout). No relayout.
        split_above: as for :func:`chol_solve`.

    Returns:
        ``(..., n, n)`` the full symmetric ``A^-1``; NaN where the factor is singular.

    Example:
        >>> import jax.numpy as jnp
        >>> from gpchol._cpu.ffi import potri
        >>> potri(jnp.array([[2.0, 0.0], [1.0, 1.0]])).tolist()  # A = [[4, 2], [2, 2]]
        [[0.5, -0.5], [-0.5, 1.0]]
    """
    if column_major and upper:
        raise ValueError("potri: column_major=True takes the lower factor L (upper=False)")
    cm = _column_major(F) if column_major else None
    call = jax.ffi.ffi_call(
        _target("potri", F.dtype),
        jax.ShapeDtypeStruct(F.shape, F.dtype),
        input_output_aliases={0: 0},
        vmap_method="broadcast_all",
        input_layouts=[cm],
        output_layouts=cm,
    )
    # a column-major L is, byte for byte, a row-major L^T: the handler's ``upper`` case
    return call(F, upper=bool(upper or column_major), split_above=_order_bound(split_above))


def potrf_info(a: jax.Array, mask: jax.Array, *, split_above: int = SPLIT_ABOVE) -> jax.Array:
    """LAPACK ``potrf``'s ``info`` for each matrix of ``a`` where ``mask`` is true.

    The status search: each masked matrix is copied and factored in the working
    precision; the others are not read and get 0.

    Args:
        a: ``(..., n, n)`` symmetric (lower triangle read).
        mask: ``a.shape[:-2]`` booleans.
        split_above: as for :func:`chol_solve`.

    Returns:
        int32 ``(...)``: 0, or the 1-based order of the first failing leading minor.

    Example:
        >>> import jax.numpy as jnp
        >>> from gpchol._cpu.ffi import potrf_info
        >>> a = jnp.array([[[1.0, 0.0], [0.0, 1.0]], [[1.0, 2.0], [2.0, 1.0]]])
        >>> potrf_info(a, jnp.array([True, True])).tolist()
        [0, 2]
    """
    call = jax.ffi.ffi_call(
        _target("potrf_info", a.dtype),
        jax.ShapeDtypeStruct(a.shape[:-2], jnp.int32),
        vmap_method="broadcast_all",
    )
    return call(
        a,
        jnp.broadcast_to(jnp.asarray(mask, bool), a.shape[:-2]),
        split_above=_order_bound(split_above),
    )


def trsm(a: jax.Array, b: jax.Array, *, left: bool, lower: bool, transpose: bool) -> jax.Array:
    """Solve ``op(a) x = b`` (``left``) or ``x op(a) = b`` for each matrix, by BLAS ``trsm``.

    The batch is looped over on the calling thread (jaxlib's batched kernels can deadlock
    XLA's thread pool; see ``lapack_ffi.cc``); both operands are column-major, as for
    jaxlib's own triangular solve.

    Args:
        a: ``(..., k, k)`` triangular (only the triangle named by ``lower`` is read), or
            ``(k, k)`` for every right-hand side.
        b: ``(..., m, p)``, with ``k = m`` (``left``) or ``k = p``.
        left: solve from the left.
        lower: ``a`` is lower triangular.
        transpose: ``op(a) = a^T`` (else ``a``).

    Returns:
        ``x``, shaped like ``b``, in ``b``'s buffer.

    Example:
        >>> import jax.numpy as jnp
        >>> from gpchol._cpu.ffi import trsm
        >>> a = jnp.array([[2.0, 0.0], [1.0, 1.0]])
        >>> trsm(a, jnp.array([[2.0], [3.0]]), left=True, lower=True, transpose=False).tolist()
        [[1.0], [2.0]]
    """
    call = jax.ffi.ffi_call(
        _target("trsm", b.dtype),
        jax.ShapeDtypeStruct(b.shape, b.dtype),
        input_output_aliases={1: 0},
        vmap_method="broadcast_all",
        input_layouts=[_column_major(a), _column_major(b)],
        output_layouts=_column_major(b),
    )
    return call(a, b, left=bool(left), lower=bool(lower), transpose=bool(transpose))
