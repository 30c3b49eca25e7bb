"""gpchol's CUDA kernels: the CPU-side plumbing, the CPU emulation, and the GPU tests.

Three groups:

* plumbing (always run): availability reasons, no loading at import, the build command,
  argument checks, and the StableHLO the FFI calls lower to for the CUDA platform;
* emulation (always run, needs g++): the exact host drivers and shared-memory kernel bodies
  of ``kernels_cuda`` compiled for the CPU (``kernels_cuda/emulation``), with cuBLAS and
  cuSOLVER replaced by reference loops, against float64 NumPy references;
* GPU (marked ``gpu``, skipped unless ``gpchol._cuda.ffi.cuda_unavailable_reason()`` is None):
  every kernel, forward and gradient, against float64 NumPy references and against
  ``jnp.linalg.cholesky`` on the same GPU, directly through ``gpchol._cuda.ffi`` and through
  ``gpchol.cholesky(..., backend="cuda")``.

Inputs are fresh random matrices on every run (the seed is in each failure message);
outputs are poisoned (NaN-filled donated buffers) before each GPU run.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
from functools import partial
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.linalg import solve_triangular

from gpchol import build
from gpchol._cuda import ffi as _ffi

REPO = Path(__file__).resolve().parents[1]
EMULATION_SOURCE = REPO / "kernels_cuda" / "emulation" / "emulate.cpp"
EPS = {
    np.dtype(np.float32): np.finfo(np.float32).eps,
    np.dtype(np.float64): np.finfo(np.float64).eps,
}
# Relative (Frobenius) tolerances against float64 references, for the well-conditioned
# matrices of _spd (condition number below ~10).
RTOL = {np.dtype(np.float32): 2e-4, np.dtype(np.float64): 1e-10}
DTYPES = [np.float32, np.float64]


# ----------------------------------------------------------------------------------------
# References and helpers
# ----------------------------------------------------------------------------------------


@pytest.fixture
def x64():
    previous = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", previous)


class _SeededGenerator(np.random.Generator):
    """A NumPy generator that remembers its seed (printed in assertion messages)."""

    def __init__(self, seed: int):
        super().__init__(np.random.PCG64(seed))
        self.seed_value = seed


@pytest.fixture
def rng():
    """A fresh generator per test: new random inputs on every run."""
    return _SeededGenerator(int(np.random.SeedSequence().entropy % (2**63)))


def _spd(rng, batch_shape, n, dtype):
    """Random symmetric positive-definite matrices, condition number below ~10."""
    m = rng.standard_normal((*batch_shape, n, n))
    a = m @ np.swapaxes(m, -1, -2) / max(n, 1) + np.eye(n)
    return a.astype(dtype)


def _poison_upper(x):
    """Copy of x with NaN in the strict upper triangle (the kernels must not read it)."""
    y = np.array(x, copy=True)
    n = y.shape[-1]
    iu = np.triu_indices(n, 1)
    y[..., iu[0], iu[1]] = np.nan
    return y


def _phi(x):
    y = np.tril(x)
    idx = np.arange(x.shape[-1])
    y[..., idx, idx] *= 0.5
    return y


def _adjoint_reference(L, Lbar):
    """Float64 symmetric gradient from Murray's unblocked symbolic formula (one by one)."""
    L = np.asarray(L, np.float64)
    Lbar = np.tril(np.asarray(Lbar, np.float64))
    n = L.shape[-1]
    flat_L = L.reshape(-1, n, n)
    flat_B = Lbar.reshape(-1, n, n)
    out = np.empty_like(flat_L)
    for b in range(flat_L.shape[0]):
        Lb = flat_L[b]
        P = _phi(Lb.T @ flat_B[b])
        S = P + P.T
        Z = solve_triangular(Lb, S, lower=True, trans="T")  # L^-T S
        Y = solve_triangular(Lb, Z.T, lower=True, trans="T").T  # Z L^-1
        Sb = _phi(Y)
        out[b] = 0.5 * (Sb + Sb.T)
    return out.reshape(L.shape)


def _rel(x, ref):
    x = np.asarray(x, np.float64)
    ref = np.asarray(ref, np.float64)
    return np.linalg.norm(x - ref) / max(np.linalg.norm(ref), np.finfo(np.float64).tiny)


def _residual_ratio(a, L):
    """max over the batch of ||A - L L^T||_1 / (n ||A||_1 eps)  (LAPACK's test ratio)."""
    dtype = np.dtype(L.dtype)
    a64 = np.asarray(a, np.float64)
    L64 = np.asarray(L, np.float64)
    n = a64.shape[-1]
    r = a64 - L64 @ np.swapaxes(L64, -1, -2)
    num = np.abs(r).sum(axis=-2).max(axis=-1)
    den = n * np.abs(a64).sum(axis=-2).max(axis=-1) * EPS[dtype]
    return float(np.max(num / den))


# ----------------------------------------------------------------------------------------
# Plumbing (no GPU needed)
# ----------------------------------------------------------------------------------------


def test_reason_is_a_helpful_sentence():
    reason = _ffi.cuda_unavailable_reason()
    if reason is None:
        pytest.skip("the CUDA backend is available here")
    assert isinstance(reason, str) and len(reason) > 30
    hints = ("python -m gpchol.build", "GPU", "driver", "GPCHOL_CUDA_LIB", "loading")
    assert any(h in reason for h in hints), reason


def test_reason_names_a_missing_override(monkeypatch, tmp_path):
    if _ffi._registered is not None:
        pytest.skip("a library is already registered in this process")
    missing = tmp_path / "nowhere" / "libgpchol_cuda.so"
    monkeypatch.setenv(_ffi.ENV_VAR, str(missing))
    reason = _ffi.cuda_unavailable_reason()
    assert str(missing) in reason and _ffi.ENV_VAR in reason
    assert "python -m gpchol.build" in reason


def test_reason_without_a_build(monkeypatch):
    if _ffi._registered is not None:
        pytest.skip("a library is already registered in this process")
    monkeypatch.delenv(_ffi.ENV_VAR, raising=False)
    monkeypatch.setattr(_ffi, "_default_candidates", list)
    reason = _ffi.cuda_unavailable_reason()
    assert "not built" in reason and "python -m gpchol.build" in reason


def test_reason_for_a_file_that_is_not_a_library(monkeypatch, tmp_path):
    if _ffi._registered is not None:
        pytest.skip("a library is already registered in this process")
    if _ffi._gpu_reason() is not None:
        pytest.skip("no GPU: the GPU check comes before loading")
    bogus = tmp_path / "libgpchol_cuda.so"
    bogus.write_text("not an ELF file")
    monkeypatch.setenv(_ffi.ENV_VAR, str(bogus))
    reason = _ffi.cuda_unavailable_reason()
    assert reason is not None and "loading" in reason


def test_import_does_not_load_the_library():
    code = (
        "import gpchol, gpchol._cuda.ffi as f\n"
        "maps = open('/proc/self/maps').read()\n"
        "assert 'libgpchol_cuda' not in maps, 'library mapped at import'\n"
        "assert f._libraries == {} and f._registered is None\n"
        "print('ok')\n"
    )
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO
    )
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr


def test_build_help():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, "-m", "gpchol.build", "--help"],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr
    assert "nvcc" in proc.stdout and "--arch" in proc.stdout


def test_build_errors_are_clear(tmp_path):
    with pytest.raises(build.BuildError, match="no executable"):
        build.find_nvcc(str(tmp_path / "nvcc"))
    with pytest.raises(build.BuildError, match="cannot read"):
        build._arch_flags("hopper")
    assert build._arch_flags("sm_80,sm_90") == [
        "-gencode",
        "arch=compute_80,code=sm_80",
        "-gencode",
        "arch=compute_90,code=sm_90",
        "-gencode",
        "arch=compute_90,code=compute_90",
    ]
    assert build.main(["--nvcc", str(tmp_path / "nvcc")]) == 1


def test_build_says_how_to_get_cublas(monkeypatch, tmp_path):
    monkeypatch.setattr(build, "_site_dirs", list)
    with pytest.raises(build.BuildError, match="pip install nvidia-cublas nvidia-cusolver"):
        build.find_cuda_libs(tmp_path)


def test_build_finds_wheel_layout(monkeypatch, tmp_path):
    lib = tmp_path / "nvidia" / "cu13" / "lib"
    inc = tmp_path / "nvidia" / "cu13" / "include"
    lib.mkdir(parents=True)
    inc.mkdir(parents=True)
    for name in ("cublas_v2.h", "cusolverDn.h"):
        (inc / name).write_text("")
    for name in ("libcublas.so.12", "libcublas.so.13", "libcublasLt.so.13", "libcusolver.so.12"):
        (lib / name).write_text("")
    monkeypatch.setattr(build, "_site_dirs", lambda: [tmp_path])
    libs = build.find_cuda_libs(None)
    assert libs.include_dirs == (str(inc),) and libs.lib_dirs == (str(lib),)
    assert libs.link_names == (":libcublas.so.13", ":libcusolver.so.12")


def test_argument_checks(x64):
    with pytest.raises(TypeError, match="float32 and float64"):
        _ffi.potrf(jnp.eye(3, dtype=jnp.int32))
    with pytest.raises(TypeError, match="float32 and float64"):
        _ffi.potrf(jnp.eye(3, dtype=jnp.bfloat16))
    with pytest.raises(ValueError, match=r"\(\.\.\., n, n\)"):
        _ffi.potrf(jnp.ones((3, 4)))
    with pytest.raises(ValueError, match=r"\(\.\.\., n, n\)"):
        _ffi.potrf(jnp.ones(3))
    with pytest.raises(ValueError, match="positive"):
        _ffi.potrf(jnp.eye(3), tile_size=0)
    with pytest.raises(TypeError, match="tile_size"):
        _ffi.potrf(jnp.eye(3), tile_size=2.5)
    with pytest.raises(TypeError, match="tile_size"):
        _ffi.potrf(jnp.eye(3), tile_size=True)
    with pytest.raises(ValueError, match="same shape"):
        _ffi.potrf_adjoint(jnp.eye(3), jnp.eye(4))
    with pytest.raises(TypeError, match="same dtype"):
        _ffi.potrf_adjoint(jnp.eye(3, dtype=jnp.float32), jnp.eye(3, dtype=jnp.float64))
    with pytest.raises(ValueError, match="small-kernel limit"):
        _ffi._potrf_impl(jnp.eye(129), method="small")
    assert _ffi.small_max_n(np.float32) == 128 and _ffi.small_max_n(np.float64) == 64


def test_empty_inputs_need_no_gpu():
    L, status = _ffi.potrf(jnp.zeros((3, 0, 0)))
    assert L.shape == (3, 0, 0) and status.shape == (3,) and status.dtype == jnp.int32
    L, status = _ffi.potrf(jnp.zeros((0, 5, 5)))
    assert L.shape == (0, 5, 5) and status.shape == (0,)
    assert _ffi.potrf_adjoint(jnp.zeros((2, 0, 0)), jnp.zeros((2, 0, 0))).shape == (2, 0, 0)


def _lower_for_cuda(fn, *args, donate=()):
    text = (
        jax.jit(fn, donate_argnums=donate)
        .trace(*args)
        .lower(lowering_platforms=("cuda",))
        .as_text()
    )
    return [line for line in text.splitlines() if "custom_call" in line], text


@pytest.mark.parametrize("dtype", DTYPES)
def test_lowering_for_cuda(monkeypatch, x64, dtype):
    """The FFI calls lower to the right targets, attributes, aliases and batch shapes."""
    monkeypatch.setattr(_ffi, "_ensure_registered", lambda: None)
    suffix = "f32" if dtype == np.float32 else "f64"
    small = _ffi.small_max_n(dtype)
    big = jax.ShapeDtypeStruct((2, 3, small + 5, small + 5), dtype)
    calls, _ = _lower_for_cuda(partial(_ffi.potrf, tile_size=64), big)
    (call,) = calls
    assert f"@gpchol_potrf_{suffix}(" in call and "tile_size = 64 : i64" in call
    assert "operand_index = 0" in call and "output_tuple_indices = [0]" in call
    assert f"-> (tensor<2x3x{small + 5}x{small + 5}x" in call and "tensor<2x3xi32>" in call
    assert "dense<[3, 2, 1, 0]>" in call  # row-major operands, as the kernels assume

    calls, _ = _lower_for_cuda(_ffi.potrf, jax.ShapeDtypeStruct((7, small, small), dtype))
    assert f"@gpchol_potrf_small_{suffix}(" in calls[0]

    x = jax.ShapeDtypeStruct((small + 1, small + 1), dtype)
    calls, _ = _lower_for_cuda(_ffi.potrf_adjoint, x, x)
    (call,) = calls
    assert f"@gpchol_potrf_adjoint_{suffix}(" in call and "tile_size = 0 : i64" in call
    assert "operand_index = 1" in call  # Lbar is aliased to the gradient

    # vmap with one unbatched operand: broadcast, then one batched call.
    xs = jax.ShapeDtypeStruct((4, 8, 8), dtype)
    x1 = jax.ShapeDtypeStruct((8, 8), dtype)
    calls, _ = _lower_for_cuda(jax.vmap(_ffi.potrf_adjoint, in_axes=(0, None)), xs, x1)
    (call,) = calls
    assert f"@gpchol_potrf_adjoint_small_{suffix}(" in call and "tensor<4x8x8x" in call

    # Donating the input makes the whole call in place.
    _, text = _lower_for_cuda(_ffi.potrf, jax.ShapeDtypeStruct((5, 10, 10), dtype), donate=0)
    assert "tf.aliasing_output = 0" in text


# ----------------------------------------------------------------------------------------
# CPU emulation of the kernels (kernels_cuda/emulation)
# ----------------------------------------------------------------------------------------


class _Emulation:
    def __init__(self, path: Path):
        self.lib = ctypes.CDLL(str(path))

    def _call(self, name, *args):
        err = ctypes.create_string_buffer(512)
        rc = getattr(self.lib, name)(*args, err, ctypes.c_int(512))
        assert rc == 0, f"{name}: {err.value.decode()}"

    @staticmethod
    def _ptr(x):
        assert x.flags.c_contiguous
        return x.ctypes.data_as(ctypes.c_void_p)

    @staticmethod
    def _suffix(x):
        return {np.dtype(np.float32): "f32", np.dtype(np.float64): "f64"}[x.dtype]

    def potrf(self, a, *, tile=0, in_place=False, seed=0, small=False):
        a = np.ascontiguousarray(a)
        n = a.shape[-1]
        batch = int(np.prod(a.shape[:-2], dtype=np.int64))
        out = a if in_place else np.full_like(a, 12345.0)
        status = np.full(a.shape[:-2], -7, np.int32)
        common = (ctypes.c_int64(batch), ctypes.c_int64(n))
        if small:
            self._call(
                f"gpchol_emu_small_potrf_{self._suffix(a)}",
                self._ptr(a), self._ptr(out), self._ptr(status), *common,
                ctypes.c_uint64(seed),
            )  # fmt: skip
        else:
            self._call(
                f"gpchol_emu_potrf_{self._suffix(a)}",
                self._ptr(a), self._ptr(out), self._ptr(status), *common,
                ctypes.c_int64(tile), ctypes.c_uint64(seed),
            )  # fmt: skip
        return out, status

    def adjoint(self, L, Lbar, *, block=0, in_place=False, seed=0, small=False):
        L = np.ascontiguousarray(L)
        Lbar = np.ascontiguousarray(Lbar)
        n = L.shape[-1]
        batch = int(np.prod(L.shape[:-2], dtype=np.int64))
        g = Lbar if in_place else np.full_like(Lbar, 12345.0)
        common = (ctypes.c_int64(batch), ctypes.c_int64(n))
        if small:
            self._call(
                f"gpchol_emu_small_adjoint_{self._suffix(L)}",
                self._ptr(L), self._ptr(Lbar), self._ptr(g), *common, ctypes.c_uint64(seed),
            )  # fmt: skip
        else:
            self._call(
                f"gpchol_emu_adjoint_{self._suffix(L)}",
                self._ptr(L), self._ptr(Lbar), self._ptr(g), *common,
                ctypes.c_int64(block), ctypes.c_uint64(seed),
            )  # fmt: skip
        return g


@pytest.fixture(scope="module")
def emu(tmp_path_factory):
    cxx = shutil.which(os.environ.get("CXX", "g++")) or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler for the CPU emulation of the CUDA kernels")
    out = tmp_path_factory.mktemp("emu") / "libgpchol_emu.so"
    cmd = [
        cxx, "-O2", "-std=c++17", "-shared", "-fPIC", "-Wall", "-Werror",
        "-I", str(REPO / "kernels_cuda" / "include"), str(EMULATION_SOURCE), "-o", str(out),
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lib = _Emulation(out)
    assert lib.lib.gpchol_emu_small_max_n(4) == _ffi.small_max_n(np.float32)
    assert lib.lib.gpchol_emu_small_max_n(8) == _ffi.small_max_n(np.float64)
    return lib


FORWARD_CASES = [  # (n, tile); tile 0 = one library potrf per matrix
    (1, 0), (2, 1), (5, 2), (17, 0), (37, 8), (64, 16), (100, 37), (129, 32), (130, 0),
    (70, 200),
]  # fmt: skip


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("n", "tile"), FORWARD_CASES)
def test_emulated_forward(emu, rng, dtype, n, tile):
    dt = np.dtype(dtype)
    a = _spd(rng, (3,), n, dtype)
    ref = np.linalg.cholesky(a.astype(np.float64))
    msg = f"seed={rng.seed_value}"
    for in_place in (False, True):
        L, status = emu.potrf(_poison_upper(a), tile=tile, in_place=in_place, seed=n)
        assert (status == 0).all(), msg
        assert (np.triu(L, 1) == 0).all(), msg
        assert _rel(L, ref) < RTOL[dt], msg
        assert _residual_ratio(a, L) < 30, msg
    if n <= _ffi.small_max_n(dtype):
        L, status = emu.potrf(_poison_upper(a), small=True, seed=n)
        assert (status == 0).all() and (np.triu(L, 1) == 0).all(), msg
        assert _rel(L, ref) < RTOL[dt] and _residual_ratio(a, L) < 30, msg


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["whole", "tiled", "small"])
def test_emulated_status(emu, rng, dtype, kind):
    n = 40
    a = _spd(rng, (6,), n, dtype)
    a[1, 17, 17] = -100.0  # pivot 18 fails
    a[2] = -np.eye(n, dtype=dtype)  # pivot 1 fails
    a[3, 30, 30] = np.inf  # pivot 31 is infinite
    a[4, 25, 3] = np.nan  # row 25 is NaN from pivot 26 on
    expected = [0, 18, 1, 31, 26, 0]
    kwargs = {"whole": {"tile": 0}, "tiled": {"tile": 16}, "small": {"small": True}}[kind]
    L, status = emu.potrf(a, **kwargs)
    assert status.tolist() == expected
    for b, s in enumerate(expected):
        if s:
            assert np.isnan(L[b]).all()
        else:
            assert np.isfinite(L[b]).all() and _residual_ratio(a[b], L[b]) < 30


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("n", "block"), [(1, 0), (2, 1), (5, 2), (37, 8), (64, 16),
                                          (100, 37), (130, 0), (70, 200), (96, 32)])  # fmt: skip
def test_emulated_adjoint(emu, rng, x64, dtype, n, block):
    dt = np.dtype(dtype)
    a = _spd(rng, (2,), n, np.float64)
    L64 = np.linalg.cholesky(a)
    L = L64.astype(dtype)
    Lbar = rng.standard_normal((2, n, n)).astype(dtype)
    ref = _adjoint_reference(L, Lbar)
    msg = f"seed={rng.seed_value}"
    # Same convention as jax.grad through jnp.linalg.cholesky (float64, CPU).
    _, vjp = jax.vjp(jnp.linalg.cholesky, jnp.asarray(a))
    (g_jax,) = vjp(jnp.asarray(Lbar, jnp.float64))
    if dt == np.float64:
        assert _rel(ref, g_jax) < 1e-12
    for in_place in (False, True):
        g = emu.adjoint(_poison_upper(L), _poison_upper(Lbar), block=block, in_place=in_place)
        assert np.array_equal(g, np.swapaxes(g, -1, -2)), msg
        assert _rel(g, ref) < 5 * RTOL[dt], msg
    if n <= _ffi.small_max_n(dtype):
        g = emu.adjoint(_poison_upper(L), _poison_upper(Lbar), small=True, seed=n)
        assert np.array_equal(g, np.swapaxes(g, -1, -2)), msg
        assert _rel(g, ref) < 5 * RTOL[dt], msg


@pytest.mark.parametrize("dtype", DTYPES)
def test_emulated_small_kernels_at_their_limit(emu, rng, dtype):
    n = _ffi.small_max_n(dtype)
    a = _spd(rng, (2,), n, dtype)
    L, status = emu.potrf(a, small=True)
    assert (status == 0).all() and _residual_ratio(a, L) < 30
    Lbar = rng.standard_normal((2, n, n)).astype(dtype)
    g = emu.adjoint(L, Lbar, small=True)
    assert _rel(g, _adjoint_reference(L, Lbar)) < 5 * RTOL[np.dtype(dtype)]


def test_emulated_empty_and_scalar(emu):
    L, status = emu.potrf(np.zeros((4, 0, 0)))
    assert status.tolist() == [0, 0, 0, 0]
    L, status = emu.potrf(np.array([[[4.0]], [[-1.0]]]), tile=0)
    assert status.tolist() == [0, 1] and L[0, 0, 0] == 2.0 and np.isnan(L[1, 0, 0])
    g = emu.adjoint(np.array([[[2.0]]]), np.array([[[3.0]]]))
    assert g[0, 0, 0] == pytest.approx(3.0 / 4.0)  # d sqrt(a) / da = 1 / (2 sqrt(a))


# ----------------------------------------------------------------------------------------
# GPU tests
# ----------------------------------------------------------------------------------------


@pytest.fixture
def cuda():
    reason = _ffi.cuda_unavailable_reason()
    if reason is not None:
        pytest.skip(reason)


def _gpu_potrf(a, *, tile=None, method="auto"):
    """Forward on the GPU with the input donated and its strict upper triangle NaN."""
    poisoned = jnp.asarray(_poison_upper(a))
    fn = jax.jit(partial(_ffi._potrf_impl, tile_size=tile, method=method), donate_argnums=0)
    L, status = fn(poisoned)
    return np.asarray(L), np.asarray(status)


def _gpu_adjoint(L, Lbar, *, tile=None, method="auto"):
    """Adjoint on the GPU; L and Lbar with NaN strict upper triangles, Lbar donated."""
    fn = jax.jit(partial(_ffi._potrf_adjoint_impl, tile_size=tile, method=method), donate_argnums=1)
    return np.asarray(fn(jnp.asarray(_poison_upper(L)), jnp.asarray(_poison_upper(Lbar))))


def _xla_cholesky(a):
    return np.asarray(jax.jit(jnp.linalg.cholesky)(jnp.asarray(a)))


def _xla_adjoint(a, Lbar):
    _, vjp = jax.vjp(jnp.linalg.cholesky, jnp.asarray(a))
    return np.asarray(jax.jit(vjp)(jnp.asarray(Lbar))[0])


GPU_FORWARD_CASES = [
    # (method, n, tile)
    ("small", 1, None), ("small", 7, None), ("small", 32, None), ("small", 33, None),
    ("small", 64, None),
    ("large", 65, None), ("large", 300, None), ("large", 1000, None),
    ("large", 300, 64), ("large", 333, 100), ("large", 1000, 256), ("large", 130, 1),
]  # fmt: skip


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("method", "n", "tile"), GPU_FORWARD_CASES)
@pytest.mark.parametrize("batch_shape", [(), (2, 3)])
def test_gpu_forward(cuda, x64, rng, dtype, method, n, tile, batch_shape):
    dt = np.dtype(dtype)
    if n > 300 and batch_shape == (2, 3):
        pytest.skip("large batches of large matrices are covered elsewhere")
    a = _spd(rng, batch_shape, n, dtype)
    msg = f"seed={rng.seed_value}"
    L, status = _gpu_potrf(a, tile=tile, method=method)
    assert L.shape == a.shape and status.shape == batch_shape
    assert (status == 0).all(), msg
    assert (np.triu(L, 1) == 0).all(), msg
    ref = np.linalg.cholesky(a.astype(np.float64))
    assert _rel(L, ref) < RTOL[dt], msg
    assert _residual_ratio(a, L) < 30, msg
    assert _rel(L, _xla_cholesky(a)) < RTOL[dt], msg


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("method", "n", "tile"),
    [("small", 1, None), ("small", 5, None), ("small", 64, None), ("large", 65, None),
     ("large", 300, None), ("large", 300, 64), ("large", 1000, 200), ("large", 777, None),
     ("large", 130, 1)],
)  # fmt: skip
@pytest.mark.parametrize("batch_shape", [(), (2, 3)])
def test_gpu_adjoint(cuda, x64, rng, dtype, method, n, tile, batch_shape):
    dt = np.dtype(dtype)
    if n > 300 and batch_shape == (2, 3):
        pytest.skip("large batches of large matrices are covered elsewhere")
    a = _spd(rng, batch_shape, n, np.float64)
    L = np.linalg.cholesky(a).astype(dtype)
    Lbar = rng.standard_normal(a.shape).astype(dtype)
    msg = f"seed={rng.seed_value}"
    g = _gpu_adjoint(L, Lbar, tile=tile, method=method)
    assert g.shape == a.shape and np.isfinite(g).all(), msg
    assert np.array_equal(g, np.swapaxes(g, -1, -2)), msg
    assert _rel(g, _adjoint_reference(L, Lbar)) < 5 * RTOL[dt], msg
    # Against JAX's own rule on the same GPU (at the same dtype).
    assert _rel(g, _xla_adjoint(a.astype(dtype), Lbar)) < 20 * RTOL[dt], msg


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("method", "tile"), [("small", None), ("large", None), ("large", 48)])
def test_gpu_batch_of_one(cuda, x64, rng, dtype, method, tile):
    dt = np.dtype(dtype)
    n = 50 if method == "small" else 200
    a = _spd(rng, (1,), n, dtype)
    msg = f"seed={rng.seed_value}"
    L, status = _gpu_potrf(a, tile=tile, method=method)
    assert L.shape == (1, n, n) and status.tolist() == [0], msg
    assert _residual_ratio(a, L) < 30 and (np.triu(L, 1) == 0).all(), msg
    Lbar = rng.standard_normal(a.shape).astype(dtype)
    g = _gpu_adjoint(L, Lbar, tile=tile, method=method)
    assert _rel(g, _adjoint_reference(L, Lbar)) < 5 * RTOL[dt], msg


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("method", "tile"), [("small", None), ("large", None), ("large", 16)])
def test_gpu_status_on_non_pd(cuda, x64, rng, dtype, method, tile):
    n = 60 if method == "small" else 150
    a = _spd(rng, (6,), n, dtype)
    a[1, 17, 17] = -100.0
    a[2] = -np.eye(n, dtype=dtype)
    a[3, 30, 30] = np.inf
    a[4, 25, 3] = np.nan
    expected = [0, 18, 1, 31, 26, 0]
    L, status = _gpu_potrf(a, tile=tile, method=method)
    assert status.tolist() == expected
    for b, s in enumerate(expected):
        if s:
            assert np.isnan(L[b]).all()
        else:
            assert (np.triu(L[b], 1) == 0).all() and _residual_ratio(a[b], L[b]) < 30
    # The status buffer is fresh on every call: a good batch after a failed one reads 0.
    L, status = _gpu_potrf(_spd(rng, (6,), n, dtype), tile=tile, method=method)
    assert (status == 0).all()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [16, 32, 64])
def test_gpu_batch_of_10000_small(cuda, x64, rng, dtype, n):
    a = _spd(rng, (10_000,), n, dtype)
    msg = f"seed={rng.seed_value}"
    L, status = _gpu_potrf(a)
    assert (status == 0).all() and (np.triu(L, 1) == 0).all(), msg
    assert _residual_ratio(a, L) < 30, msg
    assert _rel(L, np.linalg.cholesky(a.astype(np.float64))) < RTOL[np.dtype(dtype)], msg
    Lbar = rng.standard_normal(a.shape).astype(dtype)
    g = _gpu_adjoint(L, Lbar)
    assert np.isfinite(g).all(), msg
    idx = rng.choice(10_000, size=500, replace=False)  # spot-check against the reference
    assert _rel(g[idx], _adjoint_reference(L[idx], Lbar[idx])) < 5 * RTOL[np.dtype(dtype)], msg


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_batch_of_10000_large_path(cuda, x64, rng, dtype):
    n = _ffi.small_max_n(dtype) + 3  # just above the shared-memory kernel
    a = _spd(rng, (10_000,), n, dtype)
    msg = f"seed={rng.seed_value}"
    L, status = _gpu_potrf(a)
    assert (status == 0).all() and _residual_ratio(a, L) < 30, msg
    Lbar = rng.standard_normal(a.shape).astype(dtype)
    g = _gpu_adjoint(L, Lbar)
    idx = rng.choice(10_000, size=50, replace=False)  # spot-check against the reference
    assert _rel(g[idx], _adjoint_reference(L[idx], Lbar[idx])) < 5 * RTOL[np.dtype(dtype)], msg


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [40, 200])
def test_gpu_vmap_and_jit(cuda, x64, rng, dtype, n):
    a = _spd(rng, (4,), n, dtype)
    L_batched, s_batched = jax.jit(_ffi.potrf)(jnp.asarray(a))
    L_vmapped, s_vmapped = jax.jit(jax.vmap(_ffi.potrf))(jnp.asarray(a))
    np.testing.assert_array_equal(np.asarray(L_batched), np.asarray(L_vmapped))
    np.testing.assert_array_equal(np.asarray(s_batched), np.asarray(s_vmapped))
    Lbar = jnp.asarray(rng.standard_normal((n, n)).astype(dtype))
    g1 = jax.vmap(_ffi.potrf_adjoint, in_axes=(0, None))(L_batched, Lbar)
    g2 = _ffi.potrf_adjoint(L_batched, jnp.broadcast_to(Lbar, L_batched.shape))
    np.testing.assert_array_equal(np.asarray(g1), np.asarray(g2))


# ---- through the public API (gpchol.cholesky(..., backend="cuda")) ----------------------


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [20, 100, 513])
def test_gpu_public_cholesky_and_grad(cuda, x64, rng, dtype, n):
    import gpchol

    dt = np.dtype(dtype)
    a = _spd(rng, (2,), n, dtype)
    msg = f"seed={rng.seed_value}"
    L = np.asarray(gpchol.cholesky(jnp.asarray(a), backend="cuda"))
    assert _rel(L, np.linalg.cholesky(a.astype(np.float64))) < RTOL[dt], msg
    assert _residual_ratio(a, L) < 30, msg

    w = jnp.asarray(rng.standard_normal(a.shape).astype(dtype))

    def loss(chol, x):
        return jnp.sum(chol(x) * w)

    ours = jax.jit(jax.grad(partial(loss, partial(gpchol.cholesky, backend="cuda"))))
    xla = jax.jit(jax.grad(partial(loss, jnp.linalg.cholesky)))
    g = np.asarray(ours(jnp.asarray(a)))
    assert _rel(g, np.asarray(xla(jnp.asarray(a)))) < 20 * RTOL[dt], msg
    assert _rel(g, _adjoint_reference(L, np.asarray(w))) < 5 * RTOL[dt], msg


@pytest.mark.gpu
@pytest.mark.parametrize("n", [50, 400])
def test_gpu_public_log_likelihood_grad(cuda, x64, rng, n):
    import gpchol

    a = jnp.asarray(_spd(rng, (), n, np.float64))
    y = jnp.asarray(rng.standard_normal(n))

    def loglik(chol, k):
        L = chol(k)
        z = jax.scipy.linalg.solve_triangular(L, y, lower=True)
        return -0.5 * z @ z - jnp.sum(jnp.log(jnp.diagonal(L)))

    v1, g1 = jax.jit(jax.value_and_grad(partial(loglik, partial(gpchol.cholesky, backend="cuda"))))(
        a
    )
    v2, g2 = jax.jit(jax.value_and_grad(partial(loglik, jnp.linalg.cholesky)))(a)
    assert abs(float(v1) - float(v2)) <= 1e-10 * abs(float(v2))
    assert _rel(g1, g2) < 1e-9, f"seed={rng.seed_value}"


@pytest.mark.gpu
def test_gpu_public_status(cuda, x64, rng):
    import gpchol

    a = _spd(rng, (3,), 90, np.float64)
    a[1, 40, 40] = -1.0
    L, status = gpchol.cholesky_with_status(jnp.asarray(a), backend="cuda")
    assert np.asarray(status).tolist() == [0, 41, 0]
    assert np.isnan(np.asarray(L)[1]).all() and np.isfinite(np.asarray(L)[[0, 2]]).all()
