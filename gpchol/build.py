"""Build gpchol's CUDA kernels: ``python -m gpchol.build``.

Compiles ``kernels_cuda/src/*.cu`` with nvcc into ``gpchol/_lib/libgpchol_cuda.so``, where
:mod:`gpchol._cuda.ffi` finds it. Needs:

* ``nvcc`` (CUDA 12.x or 13.x; found through ``--nvcc``, ``$CUDACXX``, ``$PATH``,
  ``$CUDA_HOME/bin`` or ``/usr/local/cuda/bin``);
* cuBLAS and cuSOLVER headers and libraries, taken from the ``nvidia-cublas`` /
  ``nvidia-cusolver`` wheels (``pip install nvidia-cublas nvidia-cusolver``, also
  ``pip install 'gpchol[cuda]'``) or from the CUDA toolkit when it has them;
* the XLA FFI headers shipped with jaxlib (``jax.ffi.include_dir()``).

The library's RUNPATH points at the cuBLAS/cuSOLVER directory used for linking, so it
loads without ``LD_LIBRARY_PATH``. The same build is available through CMake::

    cmake -S kernels_cuda -B build && cmake --build build

Nothing is built on import of ``gpchol``; this module only runs when executed.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

__all__ = ["BuildError", "CudaLibs", "build", "find_cuda_libs", "find_nvcc", "main"]

PACKAGE_DIR = Path(__file__).resolve().parent
DEFAULT_OUTPUT = PACKAGE_DIR / "_lib" / "libgpchol_cuda.so"
DEFAULT_ARCH = "sm_90"


class BuildError(RuntimeError):
    """Something needed for the build is missing, or nvcc failed."""


@dataclass(frozen=True)
class CudaLibs:
    """Where cuBLAS/cuSOLVER headers and libraries were found.

    Attributes:
        include_dirs: directories holding ``cublas_v2.h`` and ``cusolverDn.h``.
        lib_dirs: directories holding the shared libraries.
        link_names: ``-l`` arguments, e.g. ``":libcublas.so.13"``.
    """

    include_dirs: tuple[str, ...]
    lib_dirs: tuple[str, ...]
    link_names: tuple[str, ...]


def source_dir() -> Path:
    """The ``kernels_cuda`` directory (next to the package in a source checkout)."""
    return PACKAGE_DIR.parent / "kernels_cuda"


def find_nvcc(explicit: str | None = None) -> str:
    """Path of nvcc.

    Args:
        explicit: a path given by the user, tried first.

    Returns:
        The nvcc executable.

    Raises:
        BuildError: nvcc was not found.
    """
    if explicit is not None:
        if Path(explicit).is_file() and os.access(explicit, os.X_OK):
            return explicit
        raise BuildError(f"--nvcc {explicit}: no executable file there")
    candidates = [os.environ.get("CUDACXX"), shutil.which("nvcc")]
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home:
            candidates.append(str(Path(home) / "bin" / "nvcc"))
    for c in candidates:
        if c and Path(c).is_file() and os.access(c, os.X_OK):
            return c
    raise BuildError(
        "nvcc was not found. Install the CUDA toolkit (12.x or 13.x) and put nvcc on PATH, "
        "or pass --nvcc /path/to/nvcc (or set CUDACXX)."
    )


def _site_dirs() -> list[Path]:
    seen, out = set(), []
    for entry in sys.path:
        p = Path(entry or ".").resolve()
        if p.is_dir() and p not in seen:
            seen.add(p)
            out.append(p)
    return out


def _soname(lib_dir: Path, stem: str) -> str | None:
    """``libX.so.N`` (the versioned soname) or ``libX.so`` in ``lib_dir``, if present."""
    pattern = re.compile(re.escape(stem) + r"\.so\.(\d+)$")
    versioned = sorted(
        (f.name for f in lib_dir.glob(stem + ".so.*") if pattern.match(f.name)),
        key=lambda name: int(pattern.match(name).group(1)),
    )
    if versioned:
        return versioned[-1]
    if (lib_dir / (stem + ".so")).exists():
        return stem + ".so"
    return None


def find_cuda_libs(cuda_home: Path | None = None) -> CudaLibs:
    """Locates cuBLAS and cuSOLVER: the nvidia-* wheels first, then the CUDA toolkit.

    Wheel layouts: ``nvidia/cu13/{include,lib}`` (CUDA 13 wheels, both libraries in one
    directory) and ``nvidia/{cublas,cusolver}/{include,lib}`` (CUDA 12 wheels).

    Args:
        cuda_home: the toolkit root, tried after the wheels.

    Returns:
        The include and library directories and the link names.

    Raises:
        BuildError: neither the wheels nor the toolkit provide both libraries.
    """
    layouts: list[tuple[Path, Path, Path, Path]] = []  # (blas inc, blas lib, sol inc, sol lib)
    for site in _site_dirs():
        nv = site / "nvidia"
        if not nv.is_dir():
            continue
        for sub in sorted(nv.glob("cu*"), reverse=True):
            layouts.append((sub / "include", sub / "lib", sub / "include", sub / "lib"))
        layouts.append(
            (
                nv / "cublas" / "include",
                nv / "cublas" / "lib",
                nv / "cusolver" / "include",
                nv / "cusolver" / "lib",
            )
        )
    if cuda_home is not None:
        for lib in ("lib64", "lib", "targets/x86_64-linux/lib"):
            layouts.append(
                (cuda_home / "include", cuda_home / lib, cuda_home / "include", cuda_home / lib)
            )
    for binc, blib, sinc, slib in layouts:
        if not ((binc / "cublas_v2.h").is_file() and (sinc / "cusolverDn.h").is_file()):
            continue
        if not (blib.is_dir() and slib.is_dir()):
            continue
        cublas, cusolver = _soname(blib, "libcublas"), _soname(slib, "libcusolver")
        if cublas is None or cusolver is None:
            continue
        return CudaLibs(
            include_dirs=tuple(dict.fromkeys([str(binc), str(sinc)])),
            lib_dirs=tuple(dict.fromkeys([str(blib), str(slib)])),
            link_names=(":" + cublas, ":" + cusolver),
        )
    raise BuildError(
        "cuBLAS/cuSOLVER headers and libraries were not found. Install them with "
        "`pip install nvidia-cublas nvidia-cusolver` (or `pip install 'gpchol[cuda]'`) into "
        "this Python environment."
    )


def jax_include_dir() -> str:
    """The XLA FFI headers shipped with jaxlib."""
    try:
        import jax.ffi
    except ImportError as err:  # pragma: no cover - jax is a dependency
        raise BuildError(f"jax is needed for the XLA FFI headers: {err}") from err
    inc = Path(jax.ffi.include_dir())
    if not (inc / "xla" / "ffi" / "api" / "ffi.h").is_file():
        raise BuildError(f"jax.ffi.include_dir() = {inc} has no xla/ffi/api/ffi.h")
    return str(inc)


def _arch_flags(arch: str) -> list[str]:
    """``sm_90`` -> -gencode for SASS of sm_90 plus PTX; ``sm_80,sm_90`` for several."""
    flags = []
    archs = [a.strip() for a in arch.split(",") if a.strip()]
    if not archs:
        raise BuildError("--arch needs at least one architecture, e.g. sm_90")
    for a in archs:
        m = re.fullmatch(r"(?:sm_|compute_)?(\d+[a-z]?)", a)
        if m is None:
            raise BuildError(f"--arch: cannot read {a!r}; use e.g. sm_90 or sm_80,sm_90")
        cc = m.group(1)
        flags += ["-gencode", f"arch=compute_{cc},code=sm_{cc}"]
    last = re.fullmatch(r"(?:sm_|compute_)?(\d+[a-z]?)", archs[-1]).group(1)
    flags += ["-gencode", f"arch=compute_{last},code=compute_{last}"]  # PTX for newer GPUs
    return flags


def _run(cmd: list[str], verbose: bool) -> None:
    if verbose:
        print(" ".join(cmd), flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise BuildError(
            f"command failed with exit code {proc.returncode}:\n  {' '.join(cmd)}\n"
            f"{proc.stdout}{proc.stderr}"
        )
    if verbose and (proc.stdout or proc.stderr):
        print(proc.stdout + proc.stderr, flush=True)


def build(
    output: Path = DEFAULT_OUTPUT,
    *,
    arch: str = DEFAULT_ARCH,
    nvcc: str | None = None,
    jobs: int | None = None,
    debug: bool = False,
    werror: bool = False,
    verbose: bool = False,
) -> Path:
    """Compiles ``kernels_cuda`` into a shared library.

    Each ``.cu`` file is compiled in parallel, then linked against cuBLAS and cuSOLVER with
    a RUNPATH to their directory.

    Args:
        output: path of the ``.so`` to write (directories are created).
        arch: comma-separated GPU architectures (``sm_90`` for H100/H200).
        nvcc: path of nvcc (default: searched, see :func:`find_nvcc`).
        jobs: parallel compilations (default: number of CPUs, at most the file count).
        debug: build with ``-G -O0`` (device debug) instead of ``-O3``.
        werror: turn every warning of nvcc and of the host compiler into an error (CI).
        verbose: print the commands.

    Returns:
        The path of the built library.

    Raises:
        BuildError: a tool or library is missing, or compilation failed.
    """
    src = source_dir()
    sources = sorted((src / "src").glob("*.cu"))
    if not sources:
        raise BuildError(
            f"no CUDA sources under {src / 'src'}; build from a source checkout of gpchol"
        )
    nvcc_path = find_nvcc(nvcc)
    cuda_home = Path(nvcc_path).resolve().parent.parent
    libs = find_cuda_libs(cuda_home)
    includes = ["-I", str(src / "include"), "-isystem", jax_include_dir()]
    for inc in libs.include_dirs:
        includes += ["-isystem", inc]
    opt = ["-G", "-O0", "-g"] if debug else ["-O3"]
    if werror:
        opt += ["-Werror", "all-warnings", "-Xcompiler", "-Wall,-Wextra,-Werror"]
    common = [
        "-std=c++17",
        *opt,
        *_arch_flags(arch),
        "-Xcompiler",
        "-fPIC",
        "-diag-suppress",
        "940",
        *includes,
    ]
    output = Path(output).resolve()
    output.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="gpchol-build-") as tmp:
        objects = [str(Path(tmp) / (s.stem + ".o")) for s in sources]
        cmds = [
            [nvcc_path, *common, "-c", str(s), "-o", o]
            for s, o in zip(sources, objects, strict=True)
        ]
        workers = max(1, min(jobs or os.cpu_count() or 1, len(cmds)))
        with ThreadPoolExecutor(max_workers=workers) as pool:
            for fut in [pool.submit(_run, c, verbose) for c in cmds]:
                fut.result()
        link = [nvcc_path, "-shared", *_arch_flags(arch), *objects, "-o", str(output) + ".tmp"]
        for d in libs.lib_dirs:
            link += ["-L", d, "-Xlinker", f"-rpath,{d}"]
        for name in libs.link_names:
            link.append(f"-l{name}")
        _run(link, verbose)
    os.replace(str(output) + ".tmp", output)
    return output


def main(argv: list[str] | None = None) -> int:
    """Command line: ``python -m gpchol.build [--output PATH] [--arch sm_90] ...``."""
    parser = argparse.ArgumentParser(
        prog="python -m gpchol.build",
        description=(
            "Compile gpchol's CUDA kernels (kernels_cuda/) into the shared library that "
            "gpchol._cuda.ffi loads. Needs nvcc and the nvidia-cublas / nvidia-cusolver wheels."
        ),
    )
    parser.add_argument(
        "--output",
        type=Path,
        default=DEFAULT_OUTPUT,
        help=f"library to write (default: {DEFAULT_OUTPUT})",
    )
    parser.add_argument(
        "--arch",
        default=DEFAULT_ARCH,
        help="comma-separated GPU architectures, e.g. sm_90 (H100/H200) or sm_80,sm_90 "
        f"(default: {DEFAULT_ARCH})",
    )
    parser.add_argument("--nvcc", default=None, help="path of nvcc (default: searched)")
    parser.add_argument("--jobs", "-j", type=int, default=None, help="parallel compilations")
    parser.add_argument("--debug", action="store_true", help="device debug build (-G -O0)")
    parser.add_argument(
        "--werror", action="store_true", help="treat compiler warnings as errors (CI)"
    )
    parser.add_argument("--verbose", "-v", action="store_true", help="print the commands")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    try:
        out = build(
            args.output,
            arch=args.arch,
            nvcc=args.nvcc,
            jobs=args.jobs,
            debug=args.debug,
            werror=args.werror,
            verbose=args.verbose,
        )
    except BuildError as err:
        print(f"gpchol.build: error: {err}", file=sys.stderr)
        return 1
    print(f"gpchol.build: wrote {out} in {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
