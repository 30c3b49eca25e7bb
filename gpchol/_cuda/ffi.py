"""gpchol's CUDA kernels (``kernels_cuda/``) as JAX functions, through the XLA FFI.

Nothing happens at import: the shared library is located, loaded with :mod:`ctypes` and
its handlers registered for the ``"CUDA"`` platform on first use (the first call of
:func:`cuda_unavailable_reason`, :func:`potrf` or :func:`potrf_adjoint`), once per process.

Where the library is looked for, in order:

1. the path in the environment variable ``GPCHOL_CUDA_LIB`` (read at call time);
2. ``gpchol/_lib/libgpchol_cuda.so`` (where ``python -m gpchol.build`` puts it);
3. ``build/libgpchol_cuda.so`` next to the package (``cmake -S kernels_cuda -B build &&
   cmake --build build``).

Contract used by :mod:`gpchol._linalg` (backend ``"cuda"``):

* :func:`cuda_unavailable_reason` -- ``None`` when the kernels can run, else why not;
* :func:`potrf` -- ``(L, status)`` of ``(..., n, n)`` matrices (lower triangle read);
* :func:`potrf_adjoint` -- the symmetric gradient ``G`` from ``L`` and ``Lbar``.

For tests and diagnostics (through :mod:`gpchol._internal`, as ``cuda_ffi``):
:func:`potrf_impl` / :func:`potrf_adjoint_impl` (the kernel choice exposed),
:func:`registered_library`, :func:`loaded_library_paths`, :func:`default_candidates`,
:func:`gpu_reason`, :func:`ensure_registered`, :func:`build_info`.

Both are traceable (``jit``, ``vmap``: ``vmap_method="broadcast_all"``) and work in place
(``a``, resp. ``Lbar``, is aliased to the output: donate it).
"""

from __future__ import annotations

import ctypes
import os
import re
import sys
import threading
from functools import partial
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike, DTypeLike

from gpchol._base.validate import check_int

__all__ = [
    "ENV_VAR",
    "TARGETS",
    "build_info",
    "cuda_unavailable_reason",
    "default_candidates",
    "ensure_registered",
    "gpu_reason",
    "library_path",
    "loaded_library_paths",
    "potrf",
    "potrf_adjoint",
    "potrf_adjoint_impl",
    "potrf_impl",
    "registered_library",
    "small_max_n",
]

ENV_VAR = "GPCHOL_CUDA_LIB"
LIBRARY_NAME = "libgpchol_cuda.so"
BUILD_HINT = (
    "build it with `python -m gpchol.build` (needs nvcc and `pip install nvidia-cublas "
    "nvidia-cusolver`), or point GPCHOL_CUDA_LIB at a built libgpchol_cuda.so"
)

# Largest n of the shared-memory kernels (kSmallMaxF32 / kSmallMaxF64 in small.h).
_SMALL_MAX_N = {np.dtype(np.float32): 128, np.dtype(np.float64): 64}
_SUFFIX = {np.dtype(np.float32): "f32", np.dtype(np.float64): "f64"}

# The FFI targets of the library, all registered for the "CUDA" platform.
TARGETS = tuple(
    f"gpchol_{op}_{suffix}"
    for op in ("potrf", "potrf_adjoint", "potrf_small", "potrf_adjoint_small")
    for suffix in ("f32", "f64")
)

# The libraries cuSOLVER and cuBLAS need, in load order (nvidia-* wheels, CUDA 13 layout).
_WHEEL_LIBRARIES = ("libnvJitLink", "libcusparse", "libcublasLt", "libcublas", "libcusolver")

_lock = threading.Lock()
_libraries: dict[str, ctypes.CDLL] = {}  # resolved path -> loaded library
_load_errors: dict[str, str] = {}  # resolved path -> why it did not load
_registered: str | None = None  # path of the library whose targets are registered


# ----------------------------------------------------------------------------------------
# Finding, loading and registering the library
# ----------------------------------------------------------------------------------------


def default_candidates() -> list[Path]:
    """The default build locations, in search order (see the module docstring).

    Example:
        >>> [p.name for p in default_candidates()]
        ['libgpchol_cuda.so', 'libgpchol_cuda.so']
    """
    package = Path(__file__).resolve().parent.parent
    return [package / "_lib" / LIBRARY_NAME, package.parent / "build" / LIBRARY_NAME]


def registered_library() -> str | None:
    """Resolved path of the library whose targets are registered, ``None`` before that."""
    return _registered


def loaded_library_paths() -> list[str]:
    """Resolved paths of the kernels libraries loaded (with :mod:`ctypes`) so far."""
    return sorted(_libraries)


def library_path() -> Path | None:
    """Path of the CUDA kernels library that would be used, or ``None`` if none exists.

    ``GPCHOL_CUDA_LIB``, when set, wins even if the file is missing (the reason then names
    it); otherwise :func:`default_candidates` are searched.
    """
    override = os.environ.get(ENV_VAR)
    if override:
        return Path(override).expanduser()
    for candidate in default_candidates():
        if candidate.is_file():
            return candidate
    return None


def _preload_wheel_libraries() -> bool:
    """Loads cuBLAS/cuSOLVER and their dependencies from the ``nvidia-*`` wheels.

    Only used when loading the kernels library failed because a dependency was not found
    (its RUNPATH points at the wheels of the machine that built it).
    """
    found = False
    for entry in sys.path:
        lib_dir = Path(entry or ".") / "nvidia" / "cu13" / "lib"
        if not lib_dir.is_dir():
            continue
        for stem in _WHEEL_LIBRARIES:
            pattern = re.compile(re.escape(stem) + r"\.so\.\d+$")
            for file in sorted(lib_dir.iterdir()):
                if pattern.match(file.name):
                    try:
                        ctypes.CDLL(str(file), mode=ctypes.RTLD_GLOBAL)
                        found = True
                    except OSError:
                        pass
        if found:
            return True
    return found


def _load(path: Path) -> ctypes.CDLL | str:
    """Loads the library at ``path`` (cached); returns it, or the error text."""
    key = str(path.resolve())
    if key in _libraries:
        return _libraries[key]
    if key in _load_errors:
        return _load_errors[key]
    try:
        lib = ctypes.CDLL(key)
    except OSError as first:
        if _preload_wheel_libraries():
            try:
                lib = ctypes.CDLL(key)
            except OSError as second:
                _load_errors[key] = str(second)
                return _load_errors[key]
        else:
            _load_errors[key] = str(first)
            return _load_errors[key]
    _libraries[key] = lib
    return lib


def gpu_reason() -> str | None:
    """``None`` when JAX sees an NVIDIA GPU, else why not (one sentence)."""
    try:
        devices = jax.devices("cuda")
    except RuntimeError as err:
        return (
            f"no NVIDIA GPU is visible to JAX ({err}); the CUDA kernels need jax with CUDA "
            "support (e.g. `pip install 'jax[cuda13]'`) on a machine with an NVIDIA GPU"
        )
    if not devices:
        return "JAX's CUDA backend reports no devices"
    return None


def _version_text(v: int) -> str:
    return f"{v // 1000}.{(v % 1000) // 10}"


def _version_reason(lib: ctypes.CDLL, path: Path) -> str | None:
    """``None`` when the driver can run code built against the library's CUDA runtime."""
    try:
        runtime = int(lib.gpchol_cuda_runtime_version())
        driver = int(lib.gpchol_cuda_driver_version())
    except AttributeError as err:
        return f"{path} is not a gpchol CUDA kernels library ({err}); {BUILD_HINT}"
    if driver <= 0:
        return "the NVIDIA driver could not be queried (is a driver installed?)"
    if driver // 1000 < runtime // 1000:
        return (
            f"the NVIDIA driver supports CUDA {_version_text(driver)}, but {path} was built "
            f"with CUDA {_version_text(runtime)}; update the driver or rebuild with a CUDA "
            f"{driver // 1000} toolkit"
        )
    return None


def ensure_registered() -> str | None:
    """Loads and registers the kernels once; returns ``None`` or why they cannot be used."""
    global _registered
    with _lock:
        if _registered is not None:
            return None
        path = library_path()
        if path is None:
            return f"the gpchol CUDA kernels are not built; {BUILD_HINT}"
        if not path.is_file():
            return f"{ENV_VAR} is set to {path}, which does not exist; {BUILD_HINT}"
        reason = gpu_reason()
        if reason is not None:
            return reason
        lib = _load(path)
        if isinstance(lib, str):
            return f"loading {path} failed: {lib}"
        reason = _version_reason(lib, path)
        if reason is not None:
            return reason
        try:
            for name in TARGETS:
                jax.ffi.register_ffi_target(
                    name, jax.ffi.pycapsule(getattr(lib, name)), platform="CUDA"
                )
        except Exception as err:  # a missing symbol or a registration refused by jax
            return f"registering the CUDA kernels of {path} with JAX failed: {err}"
        _registered = str(path.resolve())
        return None


def cuda_unavailable_reason() -> str | None:
    """Why the CUDA backend cannot be used (one sentence with the fix), or ``None``.

    The first call that finds everything in place loads and registers the library (once
    per process; a later ``GPCHOL_CUDA_LIB`` does not replace it).
    """
    return ensure_registered()


def _require() -> None:
    reason = ensure_registered()
    if reason is not None:
        raise RuntimeError(f"gpchol's CUDA kernels are unavailable: {reason}")


def build_info() -> dict[str, Any]:
    """Versions and limits reported by the loaded kernels library (reports, benchmarks).

    Returns:
        A dict with the library path, the CUDA runtime / driver / cuBLAS / cuSOLVER
        versions (compiled against and loaded), the first GPU's opt-in shared memory per
        block and the scratch alignment asked of XLA; or ``{"unavailable": reason}``.

    Example:
        >>> info = build_info()
        >>> "unavailable" in info or "cuda_driver" in info
        True
    """
    reason = ensure_registered()
    if reason is not None or _registered is None:
        return {"unavailable": reason}
    lib = _libraries[_registered]
    device = jax.devices("cuda")[0].id
    return {
        "library": _registered,
        "cuda_runtime_compiled": _version_text(lib.gpchol_cuda_runtime_version()),
        "cuda_driver": _version_text(lib.gpchol_cuda_driver_version()),
        "cublas_compiled": int(lib.gpchol_cublas_header_version()),
        "cublas_loaded": int(lib.gpchol_cublas_loaded_version()),
        "cusolver_compiled": int(lib.gpchol_cusolver_header_version()),
        "cusolver_loaded": int(lib.gpchol_cusolver_loaded_version()),
        "shared_memory_per_block_optin": int(lib.gpchol_device_smem_optin(device)),
        "scratch_request_alignment": int(lib.gpchol_scratch_request_alignment()),
    }


# ----------------------------------------------------------------------------------------
# Argument checks
# ----------------------------------------------------------------------------------------


def small_max_n(dtype: DTypeLike) -> int:
    """Largest ``n`` of the shared-memory batched kernels for ``dtype`` (float32 or float64).

    A device with too little shared memory runs such a batch on the large path (same
    results).

    Example:
        >>> small_max_n(np.float32), small_max_n(np.float64)
        (128, 64)
    """
    return _SMALL_MAX_N[_check_dtype(dtype, "small_max_n")]


def _check_dtype(dtype: DTypeLike, fn: str) -> np.dtype:
    dt = np.dtype(dtype)
    if dt not in _SUFFIX:
        raise TypeError(
            f"{fn}: gpchol's CUDA kernels support float32 and float64 matrices; got {dt}. "
            "Cast the input (e.g. a.astype(jnp.float32))."
        )
    return dt


def _as_batch_of_squares(x: ArrayLike, fn: str, name: str) -> jax.Array:
    x = jnp.asarray(x)
    if x.ndim < 2 or x.shape[-1] != x.shape[-2]:
        raise ValueError(
            f"{fn}: {name} must have shape (..., n, n) (a batch of square matrices); "
            f"got shape {x.shape}"
        )
    _check_dtype(x.dtype, fn)
    return x


def _check_tile_size(tile_size: object, fn: str) -> int:
    """0 for ``None`` (the kernels' default), else a positive int."""
    return 0 if tile_size is None else check_int(tile_size, f"{fn}: tile_size")


def _pick_method(method: str, n: int, dtype: np.dtype, fn: str) -> str:
    if method == "auto":
        return "small" if n <= _SMALL_MAX_N[dtype] else "large"
    if method == "small" and n > _SMALL_MAX_N[dtype]:
        raise ValueError(
            f"{fn}: n = {n} exceeds the small-kernel limit {_SMALL_MAX_N[dtype]} for {dtype}"
        )
    if method not in ("small", "large"):
        raise ValueError(f"{fn}: method must be 'auto', 'small' or 'large'; got {method!r}")
    return method


# ----------------------------------------------------------------------------------------
# The operations
# ----------------------------------------------------------------------------------------


def _ffi_call(fn: str, kind: str, dtype: np.dtype, tile: int, out_types: Any, alias: int) -> Any:
    """The FFI call of ``fn``'s ``kind`` kernel (``"small"``: no tile size), its input
    ``alias`` written in place as the first output."""
    if kind == "small":
        target, attrs = f"gpchol_{fn}_small_{_SUFFIX[dtype]}", {}
    else:
        target, attrs = f"gpchol_{fn}_{_SUFFIX[dtype]}", {"tile_size": np.int64(tile)}
    call = jax.ffi.ffi_call(
        target, out_types, vmap_method="broadcast_all", input_output_aliases={alias: 0}
    )
    return partial(call, **attrs)


def potrf(a: ArrayLike, *, tile_size: int | None = None) -> tuple[jax.Array, jax.Array]:
    r"""Cholesky factorization ``A = L L^T`` of a batch of matrices on an NVIDIA GPU.

    Only the lower triangle of ``a`` is read (the caller symmetrizes). Matrices with
    ``n <= 128`` (float32) or ``n <= 64`` (float64) go to the shared-memory batched kernel
    (one matrix per thread block); larger ones to cuSOLVER's ``potrf`` per matrix
    (``tile_size=None``) or to gpchol's tiled right-looking factorization (cuSOLVER on the
    ``tile_size x tile_size`` diagonal tiles, cuBLAS TRSM/SYRK for the panels and updates).

    ``a`` is aliased to ``L``: donate it (``jax.jit(..., donate_argnums=...)``) to work in
    place.

    Args:
        a: ``(..., n, n)`` float32 or float64 array, symmetric positive definite.
        tile_size: ``None`` for one cuSOLVER call per matrix, else the tile size of the
            tiled algorithm (ignored by the small-matrix kernel).

    Returns:
        ``(L, status)``: ``L`` of shape ``(..., n, n)``, lower triangular with zeros above
        the diagonal, all NaN where the factorization failed; ``status`` int32 of shape
        ``(...)``, 0 on success else the 1-based index of the first pivot that is not
        positive or is NaN (LAPACK's ``info``: an infinite pivot is positive).

    Raises:
        TypeError: ``a`` is not float32/float64, or ``tile_size`` is not an int.
        ValueError: ``a`` is not a batch of square matrices, or ``tile_size < 1``.
        RuntimeError: the CUDA kernels are unavailable (see :func:`cuda_unavailable_reason`).

    Example:
        >>> L, status = potrf(jnp.zeros((2, 0, 0)))  # empty: needs no GPU
        >>> L.shape, status.shape
        ((2, 0, 0), (2,))
    """
    return potrf_impl(a, tile_size=tile_size)


def potrf_impl(
    a: ArrayLike, *, tile_size: int | None = None, method: str = "auto"
) -> tuple[jax.Array, jax.Array]:
    """:func:`potrf` with the kernel choice ``method`` exposed: ``"auto"`` (the
    shared-memory kernel for ``n <= small_max_n``), ``"small"`` (that target; it falls back
    to the large path where the device's shared memory is too small) or ``"large"``."""
    a = _as_batch_of_squares(a, "potrf", "a")
    tile = _check_tile_size(tile_size, "potrf")
    dtype = np.dtype(a.dtype)
    n = a.shape[-1]
    kind = _pick_method(method, n, dtype, "potrf")
    batch_shape = a.shape[:-2]
    if a.size == 0:
        return a, jnp.zeros(batch_shape, jnp.int32)
    _require()
    out_types = (
        jax.ShapeDtypeStruct(a.shape, dtype),
        jax.ShapeDtypeStruct(batch_shape, np.int32),
    )
    L, status = _ffi_call("potrf", kind, dtype, tile, out_types, 0)(a)
    return L, status


def potrf_adjoint(L: ArrayLike, Lbar: ArrayLike, *, tile_size: int | None = None) -> jax.Array:
    r"""Reverse-mode derivative of the Cholesky factorization (Murray's blocked adjoint).

    For ``L = chol(A)`` and ``Lbar = df/dL``, the symmetric gradient

    .. math:: G = \tfrac12 (\bar\Sigma + \bar\Sigma^T),\quad
        \bar\Sigma = \Phi(L^{-T} (P + P^T) L^{-1}),\quad P = \Phi(L^T \bar L),

    (``Phi``: lower triangle, diagonal halved), the same as ``jax.grad`` through
    ``jnp.linalg.cholesky``. Large matrices use the blocked, level-3 form of I. Murray,
    "Differentiation of the Cholesky decomposition" (arXiv:1602.07527): cuBLAS TRSM/GEMM
    plus gpchol's kernels for the diagonal blocks, about twice the forward's flops.
    Small ones use the shared-memory kernel, as in :func:`potrf`. ``Lbar`` is aliased to
    the result: donate it to work in place.

    Args:
        L: ``(..., n, n)`` lower Cholesky factors (strict upper triangle not read).
        Lbar: ``(..., n, n)`` cotangent of ``L``, same dtype (strict upper triangle
            ignored).
        tile_size: block size of the blocked adjoint; ``None`` for the default (256, or
            512 for ``n >= 16384``). Ignored by the small-matrix kernel.

    Returns:
        ``G`` of shape ``(..., n, n)``, symmetric.

    Raises:
        TypeError, ValueError, RuntimeError: as for :func:`potrf`; also ``L`` and ``Lbar``
            of different dtypes (TypeError) or shapes (ValueError).
    """
    return potrf_adjoint_impl(L, Lbar, tile_size=tile_size)


def potrf_adjoint_impl(
    L: ArrayLike, Lbar: ArrayLike, *, tile_size: int | None = None, method: str = "auto"
) -> jax.Array:
    """:func:`potrf_adjoint` with the kernel choice exposed (``method`` as in
    :func:`potrf_impl`)."""
    L = _as_batch_of_squares(L, "potrf_adjoint", "L")
    Lbar = _as_batch_of_squares(Lbar, "potrf_adjoint", "Lbar")
    if L.shape != Lbar.shape:
        raise ValueError(
            f"potrf_adjoint: L and Lbar must have the same shape; got {L.shape} and {Lbar.shape}"
        )
    if L.dtype != Lbar.dtype:
        raise TypeError(
            f"potrf_adjoint: L and Lbar must have the same dtype; got {L.dtype} and {Lbar.dtype}"
        )
    tile = _check_tile_size(tile_size, "potrf_adjoint")
    dtype = np.dtype(L.dtype)
    kind = _pick_method(method, L.shape[-1], dtype, "potrf_adjoint")
    if L.size == 0:
        return jnp.zeros_like(Lbar)
    _require()
    out_type = jax.ShapeDtypeStruct(L.shape, dtype)
    G: jax.Array = _ffi_call("potrf_adjoint", kind, dtype, tile, out_type, 1)(L, Lbar)
    return G
