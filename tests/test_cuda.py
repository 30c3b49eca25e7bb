"""gpchol's CUDA kernels: the CPU-side plumbing, the CPU emulation, and the GPU tests.

Three groups:

* plumbing (always run): availability reasons, no loading at import, the CMake driver
  ``python -m gpchol.build``, argument checks, the StableHLO the FFI calls lower to for
  the CUDA platform, the stages and early stops of ``benchmarks/gpu_check.sh`` (with a
  stand-in python), and one compiled program per configuration in the GPU tests' helpers;
* emulation (always run, needs g++): the exact host drivers and shared-memory kernel bodies
  of ``kernels_cuda`` compiled for the CPU (``kernels_cuda/emulation``), with cuBLAS and
  cuSOLVER replaced by reference loops and XLA's scratch allocator by one with its rules,
  against float64 NumPy references; this file holds the one compile command of the
  emulation;
* GPU (marked ``gpu``, skipped unless ``cuda_unavailable_reason()`` is None), in three
  groups that ``benchmarks/gpu_check.sh`` runs in separate processes (a CUDA fault in one
  cannot poison the others): ``test_gpu_small_*`` (shared-memory kernels),
  ``test_gpu_large_*`` (cuSOLVER/cuBLAS path, scratch memory, errors, threads) and
  ``test_gpu_api_*`` (gpchol's public API on the GPU with the auto backend).

Inputs come from the seeded ``rng`` fixture (tests/conftest.py; ``GPCHOL_TEST_SEED``);
outputs are poisoned (NaN-filled strict upper triangles, donated buffers) on the GPU.
"""

from __future__ import annotations

import ast
import ctypes
import functools
import os
import re
import shutil
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg.lapack as lapack
from helpers import backend_compiles, lapack_info, random_spd
from scipy.linalg import solve_triangular

from gpchol import build
from gpchol._internal import cuda_ffi

REPO = Path(__file__).resolve().parents[1]
EMULATION_SOURCE = REPO / "kernels_cuda" / "emulation" / "emulate.cpp"
EPS = {
    np.dtype(np.float32): np.finfo(np.float32).eps,
    np.dtype(np.float64): np.finfo(np.float64).eps,
}
# Relative (Frobenius) tolerances against float64 references, for the well-conditioned
# matrices of random_spd (condition number below ~10).
RTOL = {np.dtype(np.float32): 2e-4, np.dtype(np.float64): 1e-10}
DTYPES = [np.float32, np.float64]
GPU_GROUPS = ("test_gpu_small_", "test_gpu_large_", "test_gpu_api_")


# ----------------------------------------------------------------------------------------
# References and helpers
# ----------------------------------------------------------------------------------------


def _spd(rng, batch_shape, n, dtype):
    """Random symmetric positive-definite matrices, condition number below ~10."""
    return random_spd(rng, n, tuple(batch_shape), dtype)


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


def _adversarial(rng, n, dtype):
    """Six matrices: SPD, pivot 18 negative, -I, pivot 31 infinite, row 25 NaN from pivot 26
    on, SPD; with reference LAPACK's status ``[0, 18, 1, 0, 26, 0]`` (an infinite pivot is
    positive: the factorization goes on with a zero column under it)."""
    a = _spd(rng, (6,), n, dtype)
    a[1, 17, 17] = -100.0
    a[2] = -np.eye(n, dtype=dtype)
    a[3, 30, 30] = np.inf
    a[4, 25, 3] = np.nan
    return a


def _check_adversarial(a, L, status):
    """The status and factors of :func:`_adversarial`'s batch, as reference LAPACK's."""
    expected = [0, 18, 1, 0, 26, 0]
    assert status.tolist() == expected == lapack_info(a).tolist()
    for b, s in enumerate(expected):
        if s:
            assert np.isnan(L[b]).all()
        elif b == 3:  # LAPACK's own factor: inf at (30, 30), zeros under it
            potrf = lapack.spotrf if a.dtype == np.float32 else lapack.dpotrf
            ref = np.tril(potrf(a[b], lower=1)[0])
            assert np.array_equal(np.isinf(L[b]), np.isinf(ref)) and L[b][30, 30] == np.inf
            assert np.all(L[b][31:, 30] == 0) and np.isfinite(L[b][~np.isinf(ref)]).all()
            finite = ~np.isinf(ref)
            assert _rel(np.where(finite, L[b], 0), np.where(finite, ref, 0)) < RTOL[a.dtype]
        else:
            assert np.isfinite(L[b]).all() and _residual_ratio(a[b], L[b]) < 30


def _subprocess_env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    return env


# ----------------------------------------------------------------------------------------
# Plumbing (no GPU needed)
# ----------------------------------------------------------------------------------------


def test_reason_is_a_helpful_sentence():
    reason = cuda_ffi.cuda_unavailable_reason()
    if reason is None:
        pytest.skip("the CUDA backend is available here")
    assert isinstance(reason, str) and len(reason) > 30
    hints = ("python -m gpchol.build", "GPU", "driver", "GPCHOL_CUDA_LIB", "loading")
    assert any(h in reason for h in hints), reason


def test_reason_names_a_missing_override(monkeypatch, tmp_path):
    if cuda_ffi.registered_library() is not None:
        pytest.skip("a library is already registered in this process")
    missing = tmp_path / "nowhere" / "libgpchol_cuda.so"
    monkeypatch.setenv(cuda_ffi.ENV_VAR, str(missing))
    reason = cuda_ffi.cuda_unavailable_reason()
    assert str(missing) in reason and cuda_ffi.ENV_VAR in reason
    assert "python -m gpchol.build" in reason


def test_reason_without_a_build(monkeypatch):
    if cuda_ffi.registered_library() is not None:
        pytest.skip("a library is already registered in this process")
    monkeypatch.delenv(cuda_ffi.ENV_VAR, raising=False)
    monkeypatch.setattr(cuda_ffi, "default_candidates", list)
    reason = cuda_ffi.cuda_unavailable_reason()
    assert "not built" in reason and "python -m gpchol.build" in reason


def test_reason_for_a_file_that_is_not_a_library(monkeypatch, tmp_path):
    if cuda_ffi.registered_library() is not None:
        pytest.skip("a library is already registered in this process")
    if cuda_ffi.gpu_reason() is not None:
        pytest.skip("no GPU: the GPU check comes before loading")
    bogus = tmp_path / "libgpchol_cuda.so"
    bogus.write_text("not an ELF file")
    monkeypatch.setenv(cuda_ffi.ENV_VAR, str(bogus))
    reason = cuda_ffi.cuda_unavailable_reason()
    assert reason is not None and "loading" in reason


def test_import_does_not_load_the_library():
    code = (
        "import gpchol\n"
        "from gpchol._internal import cuda_ffi as f\n"
        "maps = open('/proc/self/maps').read()\n"
        "assert 'libgpchol_cuda' not in maps, 'library mapped at import'\n"
        "assert f.loaded_library_paths() == [] and f.registered_library() is None\n"
        "print('ok')\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=_subprocess_env(),
        cwd=REPO,
    )
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr


def test_build_help():
    proc = subprocess.run(
        [sys.executable, "-m", "gpchol.build", "--help"],
        capture_output=True,
        text=True,
        env=_subprocess_env(),
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr
    for word in ("nvcc", "cmake", "--arch", "--werror", "CMAKE_CUDA_ARCHITECTURES"):
        assert word in proc.stdout, word


def test_build_errors_are_clear(tmp_path):
    with pytest.raises(build.BuildError, match="no executable"):
        build.find_nvcc(str(tmp_path / "nvcc"))
    with pytest.raises(build.BuildError, match="no executable"):
        build.find_cmake(str(tmp_path / "cmake"))
    with pytest.raises(build.BuildError, match="cannot read"):
        build.cmake_architectures("hopper")
    with pytest.raises(build.BuildError, match="at least one"):
        build.cmake_architectures(" ; ")
    assert build.cmake_architectures("sm_80,sm_90") == "80;90"
    assert build.cmake_architectures("compute_90") == "90"
    assert build.cmake_architectures("80;90-real") == "80;90-real"
    assert build.main(["--nvcc", str(tmp_path / "nvcc")]) == 1


def test_build_outside_a_checkout_says_so(monkeypatch, tmp_path, capsys):
    """An installed package has no kernels_cuda/: the error says a checkout is needed."""
    monkeypatch.setattr(build, "source_dir", lambda: tmp_path / "kernels_cuda")
    with pytest.raises(build.BuildError, match="source checkout"):
        build.build(tmp_path / "lib.so")
    assert build.main(["--output", str(tmp_path / "lib.so")]) == 1
    assert "source checkout" in capsys.readouterr().err


def test_build_configure_command():
    libs = build.CudaLibs("/w/include", "/w/lib/libcublas.so.13", "/w/lib/libcusolver.so.12")
    cmd = build.configure_command(
        "/bin/cmake",
        Path("/src/kernels_cuda"),
        Path("/b"),
        nvcc="/cuda/bin/nvcc",
        jax_include="/jax/include",
        libs=libs,
        ninja="/bin/ninja",
        arch="sm_90",
        werror=True,
        nvcc_flags=" -lineinfo  -Xptxas=-warn-spills ",
    )
    assert cmd[:5] == ["/bin/cmake", "-S", "/src/kernels_cuda", "-B", "/b"]
    for option in (
        "-GNinja" if "-GNinja" in cmd else "Ninja",
        "-DCMAKE_MAKE_PROGRAM=/bin/ninja",
        "-DCMAKE_CUDA_COMPILER=/cuda/bin/nvcc",
        "-DCMAKE_BUILD_TYPE=Release",
        "-DGPCHOL_JAX_INCLUDE=/jax/include",
        "-DGPCHOL_WERROR=ON",
        "-DGPCHOL_CUDA_LIBS_INCLUDE=/w/include",
        "-DGPCHOL_CUBLAS_LIBRARY=/w/lib/libcublas.so.13",
        "-DGPCHOL_CUSOLVER_LIBRARY=/w/lib/libcusolver.so.12",
        "-DCMAKE_CUDA_ARCHITECTURES=90",
        "-DGPCHOL_EXTRA_CUDA_FLAGS=-lineinfo -Xptxas=-warn-spills",
    ):
        assert option in cmd, option
    default = build.configure_command(
        "cmake", Path("s"), Path("b"), nvcc="nvcc", jax_include="i", libs=None, debug=True
    )
    assert "-DGPCHOL_WERROR=OFF" in default and "-DCMAKE_BUILD_TYPE=Debug" in default
    assert "-UCMAKE_CUDA_ARCHITECTURES" in default and "-G" not in default
    assert "-DGPCHOL_EXTRA_CUDA_FLAGS=" in default  # always given: no stale cached flags
    assert not any("CUBLAS" in c for c in default)


def test_one_build_description_and_one_architecture_list():
    """CMakeLists.txt is the only build description; its default is the one arch list."""
    cmake = (REPO / "kernels_cuda" / "CMakeLists.txt").read_text()
    assert len(re.findall(r"set\(CMAKE_CUDA_ARCHITECTURES ", cmake)) == 1
    assert "--exclude-libs,ALL" in cmake and "CUDA_RUNTIME_LIBRARY Static" in cmake
    source = Path(build.__file__).read_text()
    assert "-gencode" not in source and not hasattr(build, "DEFAULT_ARCH")
    ci = (REPO / ".ci" / "build_cuda.sh").read_text()
    assert "gpchol.build --werror" in ci
    assert "-gencode" not in ci and "emulate.cpp" not in ci  # compiled by this file alone
    # CI compiles the whole list (A100 and H100/H200); the GPU check, the H200's alone.
    assert "set(CMAKE_CUDA_ARCHITECTURES 80 90)" in cmake and "--arch" not in ci
    check = (REPO / "benchmarks" / "gpu_check.sh").read_text()
    assert 'ARCH="${GPCHOL_CUDA_ARCH:-90}"' in check and '--arch "$ARCH"' in check


def test_kernels_have_launch_bounds_and_ptxas_reports_registers():
    """Every CUDA kernel caps its block size (so ptxas caps registers per thread) and the
    build log shows each kernel's registers and spills."""
    sources = [p for p in (REPO / "kernels_cuda" / "src").iterdir() if p.suffix in (".h", ".cu")]
    kernels = 0
    for path in sources:
        for m in re.finditer(r"__global__\s+void\s+([^(]*)\(", path.read_text()):
            kernels += 1
            assert "__launch_bounds__" in m.group(1), f"{path.name}: {m.group(0)}"
    assert kernels >= 3
    assert "-Xptxas=-v" in (REPO / "kernels_cuda" / "CMakeLists.txt").read_text()


def test_build_says_how_to_get_cublas(monkeypatch, tmp_path):
    monkeypatch.setattr(build, "site_dirs", list)
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
    monkeypatch.setattr(build, "site_dirs", lambda: [tmp_path])
    libs = build.find_cuda_libs(None)
    assert libs == build.CudaLibs(
        str(inc), str(lib / "libcublas.so.13"), str(lib / "libcusolver.so.12")
    )


def test_build_versions_are_logged():
    versions = build.tool_versions(None, None, None)
    assert set(versions) == {"jax", "jaxlib", "nvidia-cublas", "nvidia-cusolver"}
    assert versions["jax"] == jax.__version__


def test_argument_checks():
    with pytest.raises(TypeError, match="float32 and float64"):
        cuda_ffi.potrf(jnp.eye(3, dtype=jnp.int32))
    with pytest.raises(TypeError, match="float32 and float64"):
        cuda_ffi.potrf(jnp.eye(3, dtype=jnp.bfloat16))
    with pytest.raises(ValueError, match=r"\(\.\.\., n, n\)"):
        cuda_ffi.potrf(jnp.ones((3, 4)))
    with pytest.raises(ValueError, match=r"\(\.\.\., n, n\)"):
        cuda_ffi.potrf(jnp.ones(3))
    with pytest.raises(ValueError, match="tile_size must be >= 1; got 0"):
        cuda_ffi.potrf(jnp.eye(3), tile_size=0)
    with pytest.raises(TypeError, match="tile_size"):
        cuda_ffi.potrf(jnp.eye(3), tile_size=2.5)
    with pytest.raises(TypeError, match="tile_size"):
        cuda_ffi.potrf(jnp.eye(3), tile_size=True)
    with pytest.raises(ValueError, match="same shape"):
        cuda_ffi.potrf_adjoint(jnp.eye(3), jnp.eye(4))
    with pytest.raises(TypeError, match="same dtype"):
        cuda_ffi.potrf_adjoint(jnp.eye(3, dtype=jnp.float32), jnp.eye(3, dtype=jnp.float64))
    with pytest.raises(ValueError, match="small-kernel limit"):
        cuda_ffi.potrf_impl(jnp.eye(129), method="small")
    with pytest.raises(ValueError, match="method"):
        cuda_ffi.potrf_impl(jnp.eye(3), method="tiny")
    assert cuda_ffi.small_max_n(np.float32) == 128 and cuda_ffi.small_max_n(np.float64) == 64


def test_empty_inputs_need_no_gpu():
    L, status = cuda_ffi.potrf(jnp.zeros((3, 0, 0)))
    assert L.shape == (3, 0, 0) and status.shape == (3,) and status.dtype == jnp.int32
    L, status = cuda_ffi.potrf(jnp.zeros((0, 5, 5)))
    assert L.shape == (0, 5, 5) and status.shape == (0,)
    assert cuda_ffi.potrf_adjoint(jnp.zeros((2, 0, 0)), jnp.zeros((2, 0, 0))).shape == (2, 0, 0)


def _lower_for_cuda(fn, *args, donate=()):
    text = (
        jax.jit(fn, donate_argnums=donate)
        .trace(*args)
        .lower(lowering_platforms=("cuda",))
        .as_text()
    )
    return [line for line in text.splitlines() if "custom_call" in line], text


@pytest.mark.parametrize("dtype", DTYPES)
def test_lowering_for_cuda(monkeypatch, dtype):
    """The FFI calls lower to the right targets, attributes, aliases and batch shapes."""
    monkeypatch.setattr(cuda_ffi, "ensure_registered", lambda: None)
    suffix = "f32" if dtype == np.float32 else "f64"
    small = cuda_ffi.small_max_n(dtype)
    big = jax.ShapeDtypeStruct((2, 3, small + 5, small + 5), dtype)
    calls, _ = _lower_for_cuda(partial(cuda_ffi.potrf, tile_size=64), big)
    (call,) = calls
    assert f"@gpchol_potrf_{suffix}(" in call and "tile_size = 64 : i64" in call
    assert "operand_index = 0" in call and "output_tuple_indices = [0]" in call
    assert f"-> (tensor<2x3x{small + 5}x{small + 5}x" in call and "tensor<2x3xi32>" in call
    assert "dense<[3, 2, 1, 0]>" in call  # row-major operands, as the kernels assume

    calls, _ = _lower_for_cuda(cuda_ffi.potrf, jax.ShapeDtypeStruct((7, small, small), dtype))
    assert f"@gpchol_potrf_small_{suffix}(" in calls[0]

    x = jax.ShapeDtypeStruct((small + 1, small + 1), dtype)
    calls, _ = _lower_for_cuda(cuda_ffi.potrf_adjoint, x, x)
    (call,) = calls
    assert f"@gpchol_potrf_adjoint_{suffix}(" in call and "tile_size = 0 : i64" in call
    assert "operand_index = 1" in call  # Lbar is aliased to the gradient

    # vmap with one unbatched operand: broadcast, then one batched call.
    xs = jax.ShapeDtypeStruct((4, 8, 8), dtype)
    x1 = jax.ShapeDtypeStruct((8, 8), dtype)
    calls, _ = _lower_for_cuda(jax.vmap(cuda_ffi.potrf_adjoint, in_axes=(0, None)), xs, x1)
    (call,) = calls
    assert f"@gpchol_potrf_adjoint_small_{suffix}(" in call and "tensor<4x8x8x" in call

    # Donating the input makes the whole call in place.
    _, text = _lower_for_cuda(cuda_ffi.potrf, jax.ShapeDtypeStruct((5, 10, 10), dtype), donate=0)
    assert "tf.aliasing_output = 0" in text


def test_every_gpu_test_is_in_one_group_of_the_gpu_check():
    """benchmarks/gpu_check.sh runs the gpu tests in three processes, selected by name."""
    tree = ast.parse(Path(__file__).read_text())
    functions = [node for node in tree.body if isinstance(node, ast.FunctionDef)]
    gpu_tests = {
        node.name
        for node in functions
        if any(ast.unparse(d) == "pytest.mark.gpu" for d in node.decorator_list)
    }
    assert len(gpu_tests) >= 20
    for node in functions:
        if node.name.startswith("test_gpu"):
            assert node.name in gpu_tests, f"{node.name} is not marked gpu"
    for name in gpu_tests:
        assert sum(name.startswith(g) for g in GPU_GROUPS) == 1, name
    script = (REPO / "benchmarks" / "gpu_check.sh").read_text()
    for group in GPU_GROUPS:
        assert f"-k {group.removeprefix('test_').rstrip('_')}" in script, group


# A stand-in for the GPU machine's python3 in benchmarks/gpu_check.sh: it logs its
# arguments, and its build and smoke print what the real ones print on failure or success.
_FAKE_PYTHON = r"""#!/usr/bin/env bash
echo "$*" >> "$FAKE_CALLS"
case "$*" in
    *gpchol.build*)
        if [ "$FAKE_BUILD_RC" != 0 ]; then
            echo "+ cmake -DGPCHOL_WERROR=OFF -DGPCHOL_EXTRA_CUDA_FLAGS=--no-such-flag"
            echo "FAILED: CMakeFiles/gpchol_cuda.dir/src/handlers_f32.cu.o"
            echo "nvcc fatal   : Unknown option '--no-such-flag'"
            echo "gpchol.build: error: command failed with exit code 1:"
            exit "$FAKE_BUILD_RC"
        fi
        k=_ZN6gpchol4cuda18small_potrf_kernelIfEEvPKT_PS2_Pii
        echo "ptxas info    : Compiling entry function '$k' for 'sm_90'"
        echo "ptxas info    : Function properties for $k"
        echo "    0 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads"
        echo "ptxas info    : Used 31 registers, used 1 barriers"
        echo "gpchol.build: wrote libgpchol_cuda.so" ;;
    *" smoke "*)
        echo "$FAKE_SMOKE"
        [ "${FAKE_SMOKE#OK}" = "$FAKE_SMOKE" ] && exit 1 ;;
    "-") cat > /dev/null; echo "python (stand-in)" ;;
esac
exit 0
"""


def _gpu_check(tmp_path, *args, build_rc=0, smoke="OK    gpchol_potrf_f32", nvcc_flags=""):
    """Runs benchmarks/gpu_check.sh with the stand-in python; (exit code, output, summary,
    the stand-in's calls)."""
    tmp_path.mkdir(exist_ok=True)
    fake = tmp_path / "python"
    fake.write_text(_FAKE_PYTHON)
    fake.chmod(0o755)
    calls = tmp_path / "calls.log"
    calls.write_text("")
    env = dict(os.environ, PYTHON=str(fake), OUT=str(tmp_path / "out"), TMPDIR=str(tmp_path))
    env.update(FAKE_CALLS=str(calls), FAKE_BUILD_RC=str(build_rc), FAKE_SMOKE=smoke)
    env.update(GPCHOL_NVCC_FLAGS=nvcc_flags, GPCHOL_BENCH_ARGS="--smoke --fake-ffi")
    proc = subprocess.run(
        ["bash", str(REPO / "benchmarks" / "gpu_check.sh"), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    summary_path = tmp_path / "out" / "summary.txt"
    summary = summary_path.read_text() if summary_path.exists() else ""
    return proc.returncode, proc.stdout + proc.stderr, summary, calls.read_text().splitlines()


def test_the_gpu_check_stops_after_a_failed_build(tmp_path):
    """A failed build ends the check at once, with the build's errors in the summary."""
    rc, out, summary, calls = _gpu_check(tmp_path, build_rc=1, nvcc_flags="--no-such-flag")
    assert rc == 1, out
    assert [c for c in calls if c != "-"] == [
        "-m gpchol.build --verbose --arch 90 --nvcc-flags=--no-such-flag"
    ]
    assert "stopped: the build failed (rc 1)" in summary
    errors = summary.split("build errors (build.log):")[1].split("last lines of build.log")[0]
    assert "nvcc fatal   : Unknown option '--no-such-flag'" in errors
    assert "FAILED: CMakeFiles/gpchol_cuda.dir/src/handlers_f32.cu.o" in errors
    assert "GPCHOL_WERROR" not in errors  # echoed commands are not errors
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "build.log", "gpu_logs.tar.gz", "summary.txt"
    ]  # fmt: skip


def test_the_gpu_check_stops_when_no_smoke_target_passes(tmp_path):
    rc, out, summary, calls = _gpu_check(tmp_path, smoke="FAIL  gpchol_potrf_f32 unavailable")
    assert rc == 1, out
    assert "stopped: no FFI target passed the smoke test" in summary
    assert not any("pytest" in c or " run " in c for c in calls), calls
    # the build log's ptxas report, one line per kernel
    assert re.search(r"sm_90 +31 regs +spill 8/4 B +.*small_potrf_kernel", summary), summary


def test_the_gpu_check_first_then_rest(tmp_path):
    """`first` is build and smoke only; `rest` builds (incrementally) and runs the rest."""
    rc, out, _, calls = _gpu_check(tmp_path, "first")
    assert rc == 0, out
    assert [c.split()[1] for c in calls if c != "-"] == ["gpchol.build", "smoke"]
    rc, out, _, calls = _gpu_check(tmp_path, "rest")
    assert rc == 0, out
    steps = [c for c in calls if c != "-"]
    assert "gpchol.build" in steps[0] and not any(" smoke " in c for c in steps)
    assert sum("-m pytest -m gpu" in c for c in steps) == 3
    assert "bench_gpu.py run" in steps[-2] and "bench_gpu.py report" in steps[-1]
    rc, out, _, calls = _gpu_check(tmp_path / "x", "everything")
    assert rc == 2 and "usage: bash benchmarks/gpu_check.sh [all|first|rest]" in out
    assert calls == []


# ----------------------------------------------------------------------------------------
# CPU emulation of the kernels (kernels_cuda/emulation)
# ----------------------------------------------------------------------------------------

PATH_SHARED_MEMORY, PATH_LARGE = 1, 2


class _Options(ctypes.Structure):
    """gpchol_emu_options of emulate.cpp."""

    _fields_ = [
        ("seed", ctypes.c_uint64),
        ("shared_memory_limit", ctypes.c_int64),
        ("scratch_budget", ctypes.c_int64),
        ("path", ctypes.c_int32),
    ]


class EmulationError(RuntimeError):
    pass


class _Emulation:
    def __init__(self, path: Path):
        self.lib = ctypes.CDLL(str(path))
        self.lib.gpchol_emu_small_smem_bytes.restype = ctypes.c_longlong
        self.last_path = None

    def _call(self, name, *args):
        err = ctypes.create_string_buffer(1024)
        rc = getattr(self.lib, name)(*args, err, ctypes.c_int(1024))
        if rc != 0:
            raise EmulationError(f"{name}: {err.value.decode()}")

    @staticmethod
    def _ptr(x):
        assert x.flags.c_contiguous
        return x.ctypes.data_as(ctypes.c_void_p)

    @staticmethod
    def _suffix(x):
        return {np.dtype(np.float32): "f32", np.dtype(np.float64): "f64"}[x.dtype]

    @staticmethod
    def _options(seed, shared_memory_limit, scratch_budget):
        return _Options(seed, shared_memory_limit, scratch_budget, 0)

    def potrf(self, a, *, tile=0, in_place=False, seed=0, small=False, smem=0, budget=-1):
        """The forward; ``small``: what the gpchol_potrf_small_* targets run."""
        a = np.ascontiguousarray(a)
        n = a.shape[-1]
        batch = int(np.prod(a.shape[:-2], dtype=np.int64))
        out = a if in_place else np.full_like(a, 12345.0)
        status = np.full(a.shape[:-2], -7, np.int32)
        common = (ctypes.c_int64(batch), ctypes.c_int64(n))
        opt = self._options(seed, smem, budget)
        if small:
            self._call(
                f"gpchol_emu_small_potrf_{self._suffix(a)}",
                self._ptr(a), self._ptr(out), self._ptr(status), *common, ctypes.byref(opt),
            )  # fmt: skip
            self.last_path = opt.path
        else:
            self._call(
                f"gpchol_emu_potrf_{self._suffix(a)}",
                self._ptr(a), self._ptr(out), self._ptr(status), *common,
                ctypes.c_int64(tile), ctypes.byref(opt),
            )  # fmt: skip
        return out, status

    def adjoint(self, L, Lbar, *, block=0, in_place=False, seed=0, small=False, smem=0, budget=-1):
        L = np.ascontiguousarray(L)
        Lbar = np.ascontiguousarray(Lbar)
        n = L.shape[-1]
        batch = int(np.prod(L.shape[:-2], dtype=np.int64))
        g = Lbar if in_place else np.full_like(Lbar, 12345.0)
        common = (ctypes.c_int64(batch), ctypes.c_int64(n))
        opt = self._options(seed, smem, budget)
        if small:
            self._call(
                f"gpchol_emu_small_adjoint_{self._suffix(L)}",
                self._ptr(L), self._ptr(Lbar), self._ptr(g), *common, ctypes.byref(opt),
            )  # fmt: skip
            self.last_path = opt.path
        else:
            self._call(
                f"gpchol_emu_adjoint_{self._suffix(L)}",
                self._ptr(L), self._ptr(Lbar), self._ptr(g), *common,
                ctypes.c_int64(block), ctypes.byref(opt),
            )  # fmt: skip
        return g

    def allocate(self, nbytes, alignment):
        """The emulated XLA allocator; returns the pointer modulo the scratch alignment."""
        offset = ctypes.c_uint64(999)
        self._call(
            "gpchol_emu_allocate",
            ctypes.c_uint64(nbytes), ctypes.c_uint64(alignment), ctypes.byref(offset),
        )  # fmt: skip
        return offset.value

    def scratch(self, nbytes, budget=-1):
        """Be::scratch as the drivers call it; returns the pointer modulo the alignment."""
        offset = ctypes.c_uint64(999)
        opt = self._options(0, 0, budget)
        self._call(
            "gpchol_emu_scratch", ctypes.c_uint64(nbytes), ctypes.byref(opt), ctypes.byref(offset)
        )
        return offset.value

    def smem_bytes(self, dtype, n, adjoint):
        return int(self.lib.gpchol_emu_small_smem_bytes(np.dtype(dtype).itemsize, n, int(adjoint)))


@pytest.fixture(scope="module")
def emu(tmp_path_factory):
    """The emulation library, compiled here: the one compile command of this artefact."""
    cxx = shutil.which(os.environ.get("CXX", "g++")) or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler for the CPU emulation of the CUDA kernels")
    out = tmp_path_factory.mktemp("emu") / "libgpchol_emu.so"
    cmd = [
        cxx, "-O2", "-std=c++17", "-shared", "-fPIC", "-Wall", "-Wextra", "-Werror",
        "-I", str(REPO / "kernels_cuda" / "include"), str(EMULATION_SOURCE), "-o", str(out),
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lib = _Emulation(out)
    assert lib.lib.gpchol_emu_small_max_n(4) == cuda_ffi.small_max_n(np.float32)
    assert lib.lib.gpchol_emu_small_max_n(8) == cuda_ffi.small_max_n(np.float64)
    return lib


FORWARD_CASES = [  # (n, tile); tile 0 = one library potrf per matrix
    (1, 0), (2, 1), (5, 2), (17, 0), (37, 8), (64, 16), (100, 37), (129, 32), (130, 0),
    (70, 200),
]  # fmt: skip


@pytest.mark.slow_cases("1-0-float32")
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("n", "tile"), FORWARD_CASES)
def test_emulated_forward(emu, rng, dtype, n, tile):
    dt = np.dtype(dtype)
    a = _spd(rng, (3,), n, dtype)
    ref = np.linalg.cholesky(a.astype(np.float64))
    for in_place in (False, True):
        L, status = emu.potrf(_poison_upper(a), tile=tile, in_place=in_place, seed=n)
        assert (status == 0).all()
        assert (np.triu(L, 1) == 0).all()
        assert _rel(L, ref) < RTOL[dt]
        assert _residual_ratio(a, L) < 30
    if n <= cuda_ffi.small_max_n(dtype):
        L, status = emu.potrf(_poison_upper(a), small=True, seed=n)
        assert emu.last_path == PATH_SHARED_MEMORY
        assert (status == 0).all() and (np.triu(L, 1) == 0).all()
        assert _rel(L, ref) < RTOL[dt] and _residual_ratio(a, L) < 30


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["whole", "tiled", "small", "small_fallback"])
def test_emulated_status(emu, rng, dtype, kind):
    n = 40
    a = _adversarial(rng, n, dtype)
    kwargs = {
        "whole": {"tile": 0},
        "tiled": {"tile": 16},
        "small": {"small": True},
        "small_fallback": {"small": True, "smem": emu.smem_bytes(dtype, n, False) - 1},
    }[kind]
    L, status = emu.potrf(a, **kwargs)
    if kind.startswith("small"):
        assert emu.last_path == (PATH_LARGE if kind == "small_fallback" else PATH_SHARED_MEMORY)
    _check_adversarial(a, L, status)


@pytest.mark.slow_cases("37-8-float64")
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("n", "block"), [(1, 0), (2, 1), (5, 2), (37, 8), (64, 16),
                                          (100, 37), (130, 0), (70, 200), (96, 32)])  # fmt: skip
def test_emulated_adjoint(emu, rng, dtype, n, block):
    dt = np.dtype(dtype)
    a = _spd(rng, (2,), n, np.float64)
    L64 = np.linalg.cholesky(a)
    L = L64.astype(dtype)
    Lbar = rng.standard_normal((2, n, n)).astype(dtype)
    ref = _adjoint_reference(L, Lbar)
    # Same convention as jax.grad through jnp.linalg.cholesky (float64, CPU).
    _, vjp = jax.vjp(jnp.linalg.cholesky, jnp.asarray(a))
    (g_jax,) = vjp(jnp.asarray(Lbar, jnp.float64))
    if dt == np.float64:
        assert _rel(ref, g_jax) < 1e-12
    for in_place in (False, True):
        g = emu.adjoint(_poison_upper(L), _poison_upper(Lbar), block=block, in_place=in_place)
        assert np.array_equal(g, np.swapaxes(g, -1, -2))
        assert _rel(g, ref) < 5 * RTOL[dt]
    if n <= cuda_ffi.small_max_n(dtype):
        g = emu.adjoint(_poison_upper(L), _poison_upper(Lbar), small=True, seed=n)
        assert emu.last_path == PATH_SHARED_MEMORY
        assert np.array_equal(g, np.swapaxes(g, -1, -2))
        assert _rel(g, ref) < 5 * RTOL[dt]


@pytest.mark.slow_cases("float64")
@pytest.mark.parametrize("dtype", DTYPES)
def test_emulated_small_kernels_at_their_limit(emu, rng, dtype):
    n = cuda_ffi.small_max_n(dtype)
    a = _spd(rng, (2,), n, dtype)
    L, status = emu.potrf(a, small=True)
    assert emu.last_path == PATH_SHARED_MEMORY
    assert (status == 0).all() and _residual_ratio(a, L) < 30
    Lbar = rng.standard_normal((2, n, n)).astype(dtype)
    g = emu.adjoint(L, Lbar, small=True)
    assert emu.last_path == PATH_SHARED_MEMORY
    assert _rel(g, _adjoint_reference(L, Lbar)) < 5 * RTOL[np.dtype(dtype)]


@pytest.mark.parametrize("dtype", DTYPES)
def test_emulated_small_kernels_launch_within_their_launch_bounds(emu, dtype):
    """The CUDA backend launches small_threads(n) threads per block; a block larger than
    the kernel's __launch_bounds__ (small_max_threads) would fail to launch."""
    itemsize = np.dtype(dtype).itemsize
    bound = emu.lib.gpchol_emu_small_max_threads(itemsize)
    threads = [
        emu.lib.gpchol_emu_small_threads(n) for n in range(1, cuda_ffi.small_max_n(dtype) + 1)
    ]
    assert threads == sorted(threads) and max(threads) == bound <= 1024
    assert bound == {4: 512, 8: 256}[itemsize]


# Opt-in shared memory per block of an A100 and of an H100/H200.
A100_SMEM, H200_SMEM = 166_912, 232_448


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("device", ["lowered", "A100", "H200"])
def test_emulated_small_batches_fall_back_when_shared_memory_is_short(emu, rng, dtype, device):
    """The small targets take the large path when the device's per-block limit is too low
    for the configuration, and give the same results."""
    dt = np.dtype(dtype)
    n = cuda_ffi.small_max_n(dtype)
    need_fwd, need_adj = emu.smem_bytes(dtype, n, False), emu.smem_bytes(dtype, n, True)
    assert need_fwd == n * (n + 1) * dt.itemsize and need_adj == 3 * need_fwd
    limit = {"lowered": need_fwd - 1, "A100": A100_SMEM, "H200": H200_SMEM}[device]
    a = _spd(rng, (3,), n, dtype)
    L, status = emu.potrf(_poison_upper(a), small=True, smem=limit)
    assert emu.last_path == (PATH_SHARED_MEMORY if need_fwd <= limit else PATH_LARGE)
    assert (status == 0).all() and (np.triu(L, 1) == 0).all()
    assert _rel(L, np.linalg.cholesky(a.astype(np.float64))) < RTOL[dt]
    Lbar = rng.standard_normal(a.shape).astype(dtype)
    g = emu.adjoint(_poison_upper(L), _poison_upper(Lbar), small=True, smem=limit)
    assert emu.last_path == (PATH_SHARED_MEMORY if need_adj <= limit else PATH_LARGE)
    assert np.array_equal(g, np.swapaxes(g, -1, -2))
    assert _rel(g, _adjoint_reference(L, Lbar)) < 5 * RTOL[dt]
    if device == "A100" and dt == np.float32:
        assert emu.last_path == PATH_LARGE  # 198 KB for the adjoint at n = 128
    if device == "H200":
        assert emu.last_path == PATH_SHARED_MEMORY
    # Exactly at the limit the shared-memory kernel still runs.
    emu.adjoint(L, Lbar, small=True, smem=need_adj)
    assert emu.last_path == PATH_SHARED_MEMORY


def test_emulated_scratch_follows_xlas_alignment_rule(emu):
    """XLA's FFI allocator refuses alignments above 16 bytes; so does the emulated one,
    and every scratch request of the drivers is made at alignment 16."""
    assert emu.lib.gpchol_emu_scratch_request_alignment() == 16
    assert emu.lib.gpchol_emu_scratch_alignment() == 256
    for alignment in (256, 32, 24, 0):
        with pytest.raises(EmulationError, match=f"Unsupported alignment: {alignment}"):
            emu.allocate(1000, alignment)
    for alignment in (1, 2, 8, 16):
        offset = emu.allocate(1000, alignment)
        assert offset % alignment == 0 and offset % 256 != 0  # no more than asked for
    # What the drivers get is 256-aligned nevertheless (padded request, rounded up).
    for nbytes in (0, 1, 4, 255, 256, 1000, 65_537):
        assert emu.scratch(nbytes) == 0


@pytest.mark.parametrize("kind", ["tiled_forward", "adjoint", "scratch"])
def test_emulated_scratch_errors_say_size_alignment_and_why(emu, rng, kind):
    n = 50
    a = _spd(rng, (2,), n, np.float64)
    with pytest.raises(EmulationError) as info:
        if kind == "tiled_forward":
            emu.potrf(a, tile=16, budget=100)  # the 4-byte info word needs 244 bytes
        elif kind == "adjoint":
            emu.adjoint(np.linalg.cholesky(a), a, block=32, budget=1000)
        else:
            emu.scratch(10**6, budget=10**6)
    message = str(info.value)
    nbytes = {"tiled_forward": 4, "adjoint": 32 * 32 * 8, "scratch": 10**6}[kind]
    assert f"could not allocate {nbytes} bytes of scratch device memory" in message
    assert f"requested {nbytes + 240} bytes at alignment 16" in message
    assert "Out of memory" in message  # the allocator's own reason


def test_emulated_empty_and_scalar(emu):
    L, status = emu.potrf(np.zeros((4, 0, 0)))
    assert status.tolist() == [0, 0, 0, 0]
    L, status = emu.potrf(np.array([[[4.0]], [[-1.0]]]), tile=0)
    assert status.tolist() == [0, 1] and L[0, 0, 0] == 2.0 and np.isnan(L[1, 0, 0])
    g = emu.adjoint(np.array([[[2.0]]]), np.array([[[3.0]]]))
    assert g[0, 0, 0] == pytest.approx(3.0 / 4.0)  # d sqrt(a) / da = 1 / (2 sqrt(a))


# ----------------------------------------------------------------------------------------
# GPU tests: helpers
# ----------------------------------------------------------------------------------------


@pytest.fixture
def cuda():
    reason = cuda_ffi.cuda_unavailable_reason()
    if reason is not None:
        pytest.skip(reason)


# The jitted callables of the helpers below, one per configuration: a fresh
# jax.jit(partial(...)) on every call would trace and compile anew each time (a partial
# hashes by identity), about a hundred needless XLA compiles in the GPU check's stages.
@functools.cache
def _jitted_potrf(tile, method):
    return jax.jit(partial(cuda_ffi.potrf_impl, tile_size=tile, method=method), donate_argnums=0)


@functools.cache
def _jitted_adjoint(tile, method):
    return jax.jit(
        partial(cuda_ffi.potrf_adjoint_impl, tile_size=tile, method=method), donate_argnums=1
    )


def _clear_jitted_helpers():
    _jitted_potrf.cache_clear()
    _jitted_adjoint.cache_clear()


def _gpu_potrf(a, *, tile=None, method="auto"):
    """Forward on the GPU with the input donated and its strict upper triangle NaN."""
    L, status = _jitted_potrf(tile, method)(jnp.asarray(_poison_upper(a)))
    return np.asarray(L), np.asarray(status)


def _gpu_adjoint(L, Lbar, *, tile=None, method="auto"):
    """Adjoint on the GPU; L and Lbar with NaN strict upper triangles, Lbar donated."""
    fn = _jitted_adjoint(tile, method)
    return np.asarray(fn(jnp.asarray(_poison_upper(L)), jnp.asarray(_poison_upper(Lbar))))


# JAX's own factorization and its reverse-mode rule: the references on the same device.
_xla_cholesky_jit = jax.jit(jnp.linalg.cholesky)


@jax.jit
def _xla_cholesky_vjp(a, Lbar):
    _, vjp = jax.vjp(jnp.linalg.cholesky, a)
    return vjp(Lbar)[0]


def _xla_cholesky(a):
    return np.asarray(_xla_cholesky_jit(jnp.asarray(a)))


def _xla_adjoint(a, Lbar):
    return np.asarray(_xla_cholesky_vjp(jnp.asarray(a), jnp.asarray(Lbar)))


@pytest.mark.slow
def test_helpers_of_gpu_tests_compile_once_per_configuration(monkeypatch, request, rng):
    """The GPU tests' helpers compile one XLA program per distinct configuration (helper,
    tile, method, shape, dtype) and reuse it. Checked on any device, with JAX stand-ins
    for the FFI calls, which the helpers' jitted callables trace in their place."""

    def fake_potrf(a, *, tile_size=None, method="auto"):
        lower = jnp.tril(a)
        L = jnp.linalg.cholesky(lower + jnp.swapaxes(jnp.tril(a, -1), -1, -2))
        return L, jnp.zeros(a.shape[:-2], jnp.int32)

    def fake_adjoint(L, Lbar, *, tile_size=None, method="auto"):
        del tile_size, method
        return _xla_cholesky_vjp(L @ jnp.swapaxes(L, -1, -2), jnp.tril(Lbar))

    monkeypatch.setattr(cuda_ffi, "potrf_impl", fake_potrf)
    monkeypatch.setattr(cuda_ffi, "potrf_adjoint_impl", fake_adjoint)
    _clear_jitted_helpers()
    request.addfinalizer(_clear_jitted_helpers)  # later GPU tests trace the real targets

    configs = [  # (batch shape, n, tile, method): repeated shapes with other tiles/methods
        ((), 9, None, "small"), ((2, 3), 9, None, "small"), ((), 9, None, "auto"),
        ((), 70, None, "large"), ((), 70, 16, "large"), ((4,), 70, 16, "large"),
    ]  # fmt: skip
    inputs = {}
    for batch_shape, n, _, _ in configs:
        for dtype in DTYPES:
            a = _spd(rng, batch_shape, n, dtype)
            inputs[batch_shape, n, dtype] = (a, np.linalg.cholesky(a), np.ones_like(a))
    programs = set()

    def run_all():
        for batch_shape, n, tile, method in configs:
            for dtype in DTYPES:
                a, L, Lbar = inputs[batch_shape, n, dtype]
                _gpu_potrf(a, tile=tile, method=method)
                _gpu_adjoint(L, Lbar, tile=tile, method=method)
                _xla_cholesky(a)
                _xla_adjoint(a, Lbar)
                shape = (*batch_shape, n, n, np.dtype(dtype).name)
                programs.update([("potrf", tile, method, shape), ("adjoint", tile, method, shape)])
                programs.update([("xla_cholesky", shape), ("xla_adjoint", shape)])

    # jit(stage): jnp.asarray's transfer, compiled once per shape and dtype by JAX itself.
    first = [name for name in backend_compiles(run_all) if name != "jit(stage)"]
    assert 0 < len(first) <= len(programs), first  # fewer where already compiled before
    again = backend_compiles(lambda: [run_all() for _ in range(2)])
    assert again == [], f"{len(again)} programs compiled again: {again}"
    assert _jitted_potrf(16, "large") is _jitted_potrf(16, "large")
    assert _jitted_adjoint(None, "small") is _jitted_adjoint(None, "small")


def _check_forward(a, L, status, dtype):
    dt = np.dtype(dtype)
    assert L.shape == a.shape and status.shape == a.shape[:-2]
    assert (status == 0).all()
    assert (np.triu(L, 1) == 0).all()
    assert _rel(L, np.linalg.cholesky(a.astype(np.float64))) < RTOL[dt]
    assert _residual_ratio(a, L) < 30


def _check_adjoint(a, L, Lbar, g, dtype, against_xla=True):
    dt = np.dtype(dtype)
    assert g.shape == a.shape and np.isfinite(g).all()
    assert np.array_equal(g, np.swapaxes(g, -1, -2))
    assert _rel(g, _adjoint_reference(L, Lbar)) < 5 * RTOL[dt]
    if against_xla:  # JAX's own rule on the same GPU, at the same dtype
        assert _rel(g, _xla_adjoint(a.astype(dtype), Lbar)) < 20 * RTOL[dt]


def _device_memory_bytes():
    try:
        stats = jax.devices("cuda")[0].memory_stats() or {}
    except Exception:
        return 0
    return int(stats.get("bytes_limit", 0))


# ----------------------------------------------------------------------------------------
# GPU: the shared-memory kernels (test_gpu_small_*)
# ----------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 7, 32, 33, 64])
@pytest.mark.parametrize("batch_shape", [(), (2, 3)])
def test_gpu_small_forward(cuda, rng, dtype, n, batch_shape):
    a = _spd(rng, batch_shape, n, dtype)
    L, status = _gpu_potrf(a, method="small")
    _check_forward(a, L, status, dtype)
    assert _rel(L, _xla_cholesky(a)) < RTOL[np.dtype(dtype)]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 5, 64])
@pytest.mark.parametrize("batch_shape", [(), (2, 3)])
def test_gpu_small_adjoint(cuda, rng, dtype, n, batch_shape):
    a = _spd(rng, batch_shape, n, np.float64)
    L = np.linalg.cholesky(a).astype(dtype)
    Lbar = rng.standard_normal(a.shape).astype(dtype)
    g = _gpu_adjoint(L, Lbar, method="small")
    _check_adjoint(a, L, Lbar, g, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_small_at_the_shared_memory_limit(cuda, rng, dtype):
    """The largest n of the small kernels (float32: 198 KB of shared memory per block for
    the adjoint, opt-in above 48 KB); where the device allows less, the large path runs."""
    n = cuda_ffi.small_max_n(dtype)
    a = _spd(rng, (300,), n, dtype)
    L, status = _gpu_potrf(a, method="small")
    _check_forward(a, L, status, dtype)
    Lbar = rng.standard_normal(a.shape).astype(dtype)
    g = _gpu_adjoint(L, Lbar, method="small")
    idx = rng.choice(300, size=30, replace=False)
    _check_adjoint(a[idx], L[idx], Lbar[idx], g[idx], dtype, against_xla=False)
    info = cuda_ffi.build_info()
    print("shared memory per block (opt-in):", info.get("shared_memory_per_block_optin"))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_small_batch_of_one_and_status(cuda, rng, dtype):
    a = _spd(rng, (1,), 50, dtype)
    L, status = _gpu_potrf(a, method="small")
    _check_forward(a, L, status, dtype)
    Lbar = rng.standard_normal(a.shape).astype(dtype)
    _check_adjoint(a, L, Lbar, _gpu_adjoint(L, Lbar, method="small"), dtype, against_xla=False)
    a = _adversarial(rng, 60, dtype)
    L, status = _gpu_potrf(a, method="small")
    _check_adversarial(a, L, status)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [16, 64])
def test_gpu_small_batch_of_10000(cuda, rng, dtype, n):
    a = _spd(rng, (10_000,), n, dtype)
    L, status = _gpu_potrf(a)
    _check_forward(a, L, status, dtype)
    Lbar = rng.standard_normal(a.shape).astype(dtype)
    g = _gpu_adjoint(L, Lbar)
    assert np.isfinite(g).all()
    idx = rng.choice(10_000, size=300, replace=False)  # spot-check against the reference
    _check_adjoint(a[idx], L[idx], Lbar[idx], g[idx], dtype, against_xla=False)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_small_vmap_and_jit(cuda, rng, dtype):
    a = _spd(rng, (4,), 40, dtype)
    L_batched, s_batched = jax.jit(cuda_ffi.potrf)(jnp.asarray(a))
    L_vmapped, s_vmapped = jax.jit(jax.vmap(cuda_ffi.potrf))(jnp.asarray(a))
    np.testing.assert_array_equal(np.asarray(L_batched), np.asarray(L_vmapped))
    np.testing.assert_array_equal(np.asarray(s_batched), np.asarray(s_vmapped))
    Lbar = jnp.asarray(rng.standard_normal((40, 40)).astype(dtype))
    g1 = jax.vmap(cuda_ffi.potrf_adjoint, in_axes=(0, None))(L_batched, Lbar)
    g2 = cuda_ffi.potrf_adjoint(L_batched, jnp.broadcast_to(Lbar, L_batched.shape))
    np.testing.assert_array_equal(np.asarray(g1), np.asarray(g2))


@pytest.mark.gpu
def test_gpu_small_more_than_2_31_elements(cuda, rng):
    """A float32 batch of 2^31 + 4096 elements (8.6 GB): offsets past int32 in the kernels."""
    if _device_memory_bytes() < 48 * 2**30:
        pytest.skip("needs about 40 GB of GPU memory")
    n, batch = 64, 2**31 // 4096 + 1
    key = jax.random.key(int(rng.integers(2**31)))

    @jax.jit
    def make(key):
        m = jax.random.normal(key, (batch, n, n), jnp.float32)
        eye = jnp.eye(n, dtype=jnp.float32)
        return jnp.einsum("bij,bkj->bik", m, m, precision="highest") / n + eye

    a = make(key)
    tail = np.asarray(a[-3:])  # the matrices past element 2^31
    L, status = jax.jit(cuda_ffi.potrf, donate_argnums=0)(a)
    assert int(jnp.max(jnp.abs(status))) == 0
    L_tail = np.asarray(L[-3:])
    _check_forward(tail, L_tail, np.zeros(3, np.int32), np.float32)
    Lbar = jax.random.normal(jax.random.key(1), L.shape, jnp.float32)
    Lbar_tail = np.asarray(Lbar[-3:])
    g = jax.jit(cuda_ffi.potrf_adjoint, donate_argnums=1)(L, Lbar)
    assert bool(jnp.all(jnp.isfinite(g[-1000:])))
    _check_adjoint(tail, L_tail, Lbar_tail, np.asarray(g[-3:]), np.float32, against_xla=False)


# ----------------------------------------------------------------------------------------
# GPU: the large path, scratch memory, errors, threads (test_gpu_large_*)
# ----------------------------------------------------------------------------------------

GPU_LARGE_FORWARD_CASES = [
    # (n, tile): tile None = one cuSOLVER call per matrix (with its scratch workspace),
    # else gpchol's tiled algorithm (scratch for the pivot info)
    (65, None), (300, None), (1000, None), (300, 64), (333, 100), (1000, 256), (130, 1),
]  # fmt: skip


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("n", "tile"), GPU_LARGE_FORWARD_CASES)
@pytest.mark.parametrize("batch_shape", [(), (2, 3)])
def test_gpu_large_forward(cuda, rng, dtype, n, tile, batch_shape):
    if n > 300 and batch_shape == (2, 3):
        pytest.skip("large batches of large matrices are covered elsewhere")
    a = _spd(rng, batch_shape, n, dtype)
    L, status = _gpu_potrf(a, tile=tile, method="large")
    _check_forward(a, L, status, dtype)
    assert _rel(L, _xla_cholesky(a)) < RTOL[np.dtype(dtype)]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("n", "tile"), [(65, None), (300, None), (300, 64), (1000, 200), (777, None), (130, 1)]
)
@pytest.mark.parametrize("batch_shape", [(), (2, 3)])
def test_gpu_large_adjoint(cuda, rng, dtype, n, tile, batch_shape):
    if n > 300 and batch_shape == (2, 3):
        pytest.skip("large batches of large matrices are covered elsewhere")
    a = _spd(rng, batch_shape, n, np.float64)
    L = np.linalg.cholesky(a).astype(dtype)
    Lbar = rng.standard_normal(a.shape).astype(dtype)
    g = _gpu_adjoint(L, Lbar, tile=tile, method="large")
    _check_adjoint(a, L, Lbar, g, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tile", [None, 16])
def test_gpu_large_batch_of_one_and_status(cuda, rng, dtype, tile):
    a = _spd(rng, (1,), 200, dtype)
    L, status = _gpu_potrf(a, tile=tile, method="large")
    _check_forward(a, L, status, dtype)
    Lbar = rng.standard_normal(a.shape).astype(dtype)
    g = _gpu_adjoint(L, Lbar, tile=tile, method="large")
    _check_adjoint(a, L, Lbar, g, dtype, against_xla=False)
    a = _adversarial(rng, 150, dtype)
    L, status = _gpu_potrf(a, tile=tile, method="large")
    _check_adversarial(a, L, status)
    # The status buffer is fresh on every call: a good batch after a failed one reads 0.
    L, status = _gpu_potrf(_spd(rng, (6,), 150, dtype), tile=tile, method="large")
    assert (status == 0).all()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_large_batch_of_10000_just_above_the_small_kernels(cuda, rng, dtype):
    n = cuda_ffi.small_max_n(dtype) + 3
    a = _spd(rng, (10_000,), n, dtype)
    L, status = _gpu_potrf(a)
    assert (status == 0).all() and (np.triu(L, 1) == 0).all() and np.isfinite(L).all()
    idx = rng.choice(10_000, size=100, replace=False)  # spot-check against the reference
    _check_forward(a[idx], L[idx], status[idx], dtype)
    Lbar = rng.standard_normal(a.shape).astype(dtype)
    g = _gpu_adjoint(L, Lbar)
    assert np.isfinite(g).all()
    _check_adjoint(a[idx[:30]], L[idx[:30]], Lbar[idx[:30]], g[idx[:30]], dtype, against_xla=False)


@pytest.mark.gpu
def test_gpu_large_vmap_and_jit(cuda, rng):
    a = _spd(rng, (4,), 200, np.float64)
    L_batched, s_batched = jax.jit(cuda_ffi.potrf)(jnp.asarray(a))
    L_vmapped, s_vmapped = jax.jit(jax.vmap(cuda_ffi.potrf))(jnp.asarray(a))
    np.testing.assert_array_equal(np.asarray(L_batched), np.asarray(L_vmapped))
    np.testing.assert_array_equal(np.asarray(s_batched), np.asarray(s_vmapped))


@pytest.mark.gpu
def test_gpu_large_handler_errors_reach_python_with_their_message(cuda, rng):
    """An error returned by a handler arrives in Python with the handler's text, and the
    process stays usable afterwards."""
    a = jnp.asarray(_spd(rng, (), 80, np.float64))
    wrong_status = jax.ffi.ffi_call(
        "gpchol_potrf_f64",
        (jax.ShapeDtypeStruct((80, 80), jnp.float64), jax.ShapeDtypeStruct((3,), jnp.int32)),
        vmap_method="broadcast_all",
    )
    with pytest.raises(Exception, match="gpchol_potrf: output shapes do not match the input"):
        jax.block_until_ready(wrong_status(a, tile_size=np.int64(0)))
    too_big = jax.ffi.ffi_call(
        "gpchol_potrf_small_f64",
        (jax.ShapeDtypeStruct((80, 80), jnp.float64), jax.ShapeDtypeStruct((), jnp.int32)),
        vmap_method="broadcast_all",
    )
    with pytest.raises(Exception, match="n = 80 exceeds the small-kernel limit 64"):
        jax.block_until_ready(too_big(a))
    L, status = _gpu_potrf(np.asarray(a))
    _check_forward(np.asarray(a), L, status, np.float64)


@pytest.mark.gpu
def test_gpu_large_concurrent_calls(cuda, rng):
    """Calls from several threads at once (handle pool, shared-memory opt-in, scratch)."""
    cases = [(n, dt, tile) for n in (40, 128, 300) for dt in DTYPES for tile in (None, 64)]
    inputs = [
        (_spd(rng, (3,), n, dt), rng.standard_normal((3, n, n)).astype(dt)) for n, dt, _ in cases
    ]
    fwd = {tile: jax.jit(partial(cuda_ffi.potrf, tile_size=tile)) for tile in (None, 64)}
    adj = {tile: jax.jit(partial(cuda_ffi.potrf_adjoint, tile_size=tile)) for tile in (None, 64)}
    barrier = threading.Barrier(8)

    def work(i):
        (_, _, tile), (a, Lbar) = cases[i % len(cases)], inputs[i % len(cases)]
        if i < 8:
            barrier.wait(timeout=60)
        results = []
        for _ in range(3):
            L, status = fwd[tile](jnp.asarray(a))
            g = adj[tile](L, jnp.asarray(Lbar))
            results.append((np.asarray(L), np.asarray(status), np.asarray(g)))
        return i, results

    with ThreadPoolExecutor(max_workers=8) as pool:
        outcomes = list(pool.map(work, range(3 * len(cases))))
    for i, results in outcomes:
        (_, dt, _), (a, Lbar) = cases[i % len(cases)], inputs[i % len(cases)]
        for L, status, g in results:
            _check_forward(a, L, status, dt)
            _check_adjoint(a, L, Lbar, g, dt, against_xla=False)


@pytest.mark.gpu
@pytest.mark.parametrize("tile", [None, 8192])
def test_gpu_large_more_than_2_31_elements(cuda, tile):
    """One float32 matrix of n = 46341 (n^2 > 2^31, 8.6 GB): tridiagonal, so that its
    factor is known (bidiagonal, exact zeros elsewhere) and cheap to check on the GPU."""
    if _device_memory_bytes() < 48 * 2**30:
        pytest.skip("needs about 30 GB of GPU memory")
    n, d, s = 46_341, 2.0, 0.5
    assert n * n > 2**31

    @jax.jit
    def make():
        i = jnp.arange(n)
        a = jnp.zeros((n, n), jnp.float32)
        a = a.at[i, i].set(jnp.where(i == 0, d * d, d * d + s * s))
        a = a.at[i[1:], i[:-1]].set(s * d)
        return a.at[i[:-1], i[1:]].set(s * d)

    @jax.jit
    def check(L):
        i = jnp.arange(n)
        diag_err = jnp.max(jnp.abs(L[i, i] - d))
        sub_err = jnp.max(jnp.abs(L[i[1:], i[:-1]] - s))
        rest = L.at[i, i].set(0.0).at[i[1:], i[:-1]].set(0.0)
        return diag_err, sub_err, jnp.max(jnp.abs(rest)), jnp.all(jnp.isfinite(L))

    L, status = jax.jit(partial(cuda_ffi.potrf, tile_size=tile), donate_argnums=0)(make())
    assert int(status) == 0
    diag_err, sub_err, rest, finite = (float(x) for x in check(L))
    assert finite and rest == 0.0
    assert diag_err < 1e-5 and sub_err < 1e-5


# ----------------------------------------------------------------------------------------
# GPU: the public API with the auto backend (test_gpu_api_*)
# ----------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_gpu_api_auto_backend_is_cuda_on_a_gpu(cuda, rng):
    import gpchol

    a = jnp.asarray(_spd(rng, (), 200, np.float64))
    lowered = jax.jit(gpchol.cholesky).lower(a).as_text()
    assert "gpchol_potrf_f64" in lowered, "auto should pick the CUDA kernels on a GPU"
    lowered = jax.jit(jax.grad(lambda x: jnp.sum(gpchol.cholesky(x)))).lower(a).as_text()
    assert "gpchol_potrf_adjoint_f64" in lowered


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [20, 100, 513])
@pytest.mark.parametrize("choice", ["auto", "cuda"])
def test_gpu_api_cholesky_and_grad(cuda, rng, dtype, n, choice):
    import gpchol

    dt = np.dtype(dtype)
    a = _spd(rng, (2,), n, dtype)
    L = np.asarray(gpchol.cholesky(jnp.asarray(a), backend=choice))
    assert _rel(L, np.linalg.cholesky(a.astype(np.float64))) < RTOL[dt]
    assert _residual_ratio(a, L) < 30

    w = jnp.asarray(rng.standard_normal(a.shape).astype(dtype))

    def loss(chol, x):
        return jnp.sum(chol(x) * w)

    ours = jax.jit(jax.grad(partial(loss, partial(gpchol.cholesky, backend=choice))))
    xla = jax.jit(jax.grad(partial(loss, jnp.linalg.cholesky)))
    g = np.asarray(ours(jnp.asarray(a)))
    assert _rel(g, np.asarray(xla(jnp.asarray(a)))) < 20 * RTOL[dt]
    assert _rel(g, _adjoint_reference(L, np.asarray(w))) < 5 * RTOL[dt]


@pytest.mark.gpu
@pytest.mark.parametrize("n", [50, 400])
def test_gpu_api_log_likelihood_grad_through_cholesky(cuda, rng, n):
    import gpchol

    a = jnp.asarray(_spd(rng, (), n, np.float64))
    y = jnp.asarray(rng.standard_normal(n))

    def loglik(chol, k):
        L = chol(k)
        z = jax.scipy.linalg.solve_triangular(L, y, lower=True)
        return -0.5 * z @ z - jnp.sum(jnp.log(jnp.diagonal(L)))

    ours = jax.jit(jax.value_and_grad(partial(loglik, gpchol.cholesky)))
    v1, g1 = ours(a)
    v2, g2 = jax.jit(jax.value_and_grad(partial(loglik, jnp.linalg.cholesky)))(a)
    assert abs(float(v1) - float(v2)) <= 1e-10 * abs(float(v2))
    assert _rel(g1, g2) < 1e-9


@pytest.mark.gpu
def test_gpu_api_status_and_jitter_retries_with_backend_cuda(cuda, rng):
    import gpchol

    a = _spd(rng, (3,), 90, np.float64)
    a[1, 40, 40] = -1.0
    L, status = gpchol.cholesky_with_status(jnp.asarray(a), backend="cuda")
    assert np.asarray(status).tolist() == [0, 41, 0]
    assert np.isnan(np.asarray(L)[1]).all() and np.isfinite(np.asarray(L)[[0, 2]]).all()

    # Element 1 has one eigenvalue -1e-3: jitter 1e-4 fails there, 1e-2 succeeds.
    for n in (20, 90):  # small kernel and large path
        q, _ = np.linalg.qr(rng.standard_normal((n, n)))
        lam = np.linspace(1.0, 2.0, n)
        lam[0] = -1e-3
        b = _spd(rng, (2,), n, np.float64)
        b[1] = (q * lam) @ q.T
        b = 0.5 * (b + np.swapaxes(b, -1, -2))
        fn = jax.jit(partial(gpchol.cholesky_with_status, backend="cuda", jitter=(1e-4, 1e-2)))
        L, status, used = (np.asarray(x) for x in fn(jnp.asarray(b)))
        assert status.tolist() == [0, 0]
        assert used.tolist() == [1e-4, 1e-2]
        for k, j in enumerate(used):
            ref = np.linalg.cholesky(b[k] + j * np.eye(n))
            assert _rel(L[k], ref) < 1e-8
        with pytest.raises(gpchol.NotPositiveDefiniteError):
            gpchol.cholesky(jnp.asarray(b), backend="cuda", jitter=1e-4, check=True)


@pytest.mark.gpu
@pytest.mark.parametrize("n", [40, 300])
def test_gpu_api_mvn_logpdf_and_grad(cuda, rng, n):
    """mvn_logpdf with the auto backend (the CUDA kernels) against its XLA backend and
    against jax.scipy's density, on the same GPU."""
    import gpchol

    cov = jnp.asarray(_spd(rng, (), n, np.float64))
    y, mu = jnp.asarray(rng.standard_normal(n)), jnp.asarray(rng.standard_normal(n))

    def value_and_grads(logpdf):
        return jax.jit(jax.value_and_grad(logpdf, argnums=(0, 1, 2)))(cov, y, mu)

    v, g = value_and_grads(lambda c, y, m: gpchol.mvn_logpdf(y, m, c))
    v_xla, g_xla = value_and_grads(lambda c, y, m: gpchol.mvn_logpdf(y, m, c, backend="xla"))
    v_ref, g_ref = value_and_grads(
        lambda c, y, m: jax.scipy.stats.multivariate_normal.logpdf(y, m, 0.5 * (c + c.T))
    )
    for value in (v_xla, v_ref):
        assert abs(float(v) - float(value)) <= 1e-9 * abs(float(value))
    for ours, xla, ref in zip(g, g_xla, g_ref, strict=True):
        assert _rel(ours, xla) < 1e-8 and _rel(ours, ref) < 1e-8


@pytest.mark.gpu
@pytest.mark.parametrize("n", [60, 500])
def test_gpu_api_gaussian_process_lml_and_grad(cuda, rng, n):
    """GaussianProcess with the auto backend (the CUDA kernels) against the XLA backend on
    the same GPU: log marginal likelihood and its gradient in every hyperparameter."""
    import gpchol
    from gpchol import kernels

    X = jnp.asarray(rng.uniform(0.0, 3.0, (n, 2)))
    y = jnp.asarray(np.sin(np.asarray(X[:, 0])) + 0.1 * rng.standard_normal(n))

    def lml(params, backend):
        amp, ls, noise = params
        gp = gpchol.GaussianProcess(amp * kernels.ExpSquared(ls), X, noise=noise, backend=backend)
        return gp.log_marginal_likelihood(y)

    params = (jnp.asarray(1.3), jnp.asarray(0.7), jnp.asarray(0.05))
    vg = jax.jit(jax.value_and_grad(lml), static_argnums=1)
    v, g = vg(params, "auto")
    v_xla, g_xla = vg(params, "xla")
    assert abs(float(v) - float(v_xla)) <= 1e-8 * abs(float(v_xla))
    np.testing.assert_allclose(np.asarray(g), np.asarray(g_xla), rtol=1e-7)


@pytest.mark.gpu
@pytest.mark.parametrize("n", [30, 200])
def test_gpu_api_numpyro_multivariate_normal(cuda, rng, n):
    """gpchol.numpyro.MultivariateNormal (auto backend: the CUDA kernels) against NumPyro's
    own distribution on the same GPU; -inf where the covariance is not positive definite."""
    import numpyro.distributions as dist

    import gpchol.numpyro as gnp

    cov = jnp.asarray(_spd(rng, (2,), n, np.float64))
    x = jnp.asarray(rng.standard_normal((2, n)))

    def value_and_grad(distribution):
        return jax.jit(jax.value_and_grad(lambda c: jnp.sum(distribution(0.5, c).log_prob(x))))(cov)

    v, g = value_and_grad(gnp.MultivariateNormal)
    v_ref, g_ref = value_and_grad(dist.MultivariateNormal)
    assert abs(float(v) - float(v_ref)) <= 1e-9 * abs(float(v_ref))
    # NumPyro differentiates through jnp.linalg.cholesky, whose gradient is symmetric too.
    assert _rel(g, g_ref) < 1e-8
    bad = np.array(cov)
    bad[0, 3, 3] = -5.0
    checked_later = gnp.MultivariateNormal(0.5, jnp.asarray(bad), validate_args=False)
    assert float(checked_later.log_prob(x)[0]) == -np.inf
