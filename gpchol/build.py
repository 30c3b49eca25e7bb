"""Build gpchol's CUDA kernels: ``python -m gpchol.build``.

A thin driver of the one build description, ``kernels_cuda/CMakeLists.txt``: it finds

* ``cmake`` (on ``PATH`` or the ``cmake`` Python package) and, when present, ``ninja``;
* ``nvcc`` (CUDA 13; ``--nvcc``, ``$CUDACXX``, ``$PATH``, ``$CUDA_HOME/bin`` or
  ``/usr/local/cuda/bin``);
* the XLA FFI headers shipped with jaxlib (``jax.ffi.include_dir()``);
* cuBLAS and cuSOLVER (headers and libraries) from the ``nvidia-cublas`` /
  ``nvidia-cusolver`` wheels (``pip install 'gpchol[cuda]'``), else from the toolkit,

passes them to CMake as ``-D`` options, builds in ``build/cuda/`` of the source checkout,
and copies the library to ``gpchol/_lib/libgpchol_cuda.so``, where
:mod:`gpchol._cuda.ffi` finds it. The GPU architectures are CMake's
(``CMAKE_CUDA_ARCHITECTURES``, whose default in ``CMakeLists.txt`` is the project's one
list); ``--arch`` overrides them. ``--werror`` turns every warning into an error (CI);
``--nvcc-flags`` adds nvcc options (``-lineinfo``; a bad one makes the build fail on
purpose, to try a script's failure path). The versions of the tools and wheels are printed
first, for the build log; ptxas's register and spill report of every kernel follows in the
compiler output (``--verbose``).

The CUDA sources are not part of an installed package: the build needs a source checkout
(``git clone`` and ``pip install -e .``). Nothing is built on import of ``gpchol``.

Example:
    >>> from gpchol import build
    >>> build.cmake_architectures("sm_80,sm_90")
    '80;90'
    >>> build.source_dir().name
    'kernels_cuda'
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "BuildError",
    "CudaLibs",
    "build",
    "cmake_architectures",
    "configure_command",
    "find_cmake",
    "find_cuda_libs",
    "find_ninja",
    "find_nvcc",
    "jax_include_dir",
    "main",
    "site_dirs",
    "source_dir",
    "tool_versions",
]

PACKAGE_DIR = Path(__file__).resolve().parent
LIBRARY_NAME = "libgpchol_cuda.so"
DEFAULT_OUTPUT = PACKAGE_DIR / "_lib" / LIBRARY_NAME
WHEELS = ("nvidia-cublas", "nvidia-cusolver")


class BuildError(RuntimeError):
    """Something needed for the build is missing, or CMake/nvcc failed."""


@dataclass(frozen=True)
class CudaLibs:
    """Where cuBLAS/cuSOLVER headers and libraries were found.

    Attributes:
        include_dir: the directory holding ``cublas_v2.h`` and ``cusolverDn.h``.
        cublas: the versioned shared library to link, e.g. ``.../libcublas.so.13``.
        cusolver: likewise ``.../libcusolver.so.12``.
    """

    include_dir: str
    cublas: str
    cusolver: str


def source_dir() -> Path:
    """The ``kernels_cuda`` directory (next to the package in a source checkout)."""
    return PACKAGE_DIR.parent / "kernels_cuda"


def default_build_dir() -> Path:
    """``build/cuda`` of the source checkout (kept between builds: rebuilds are quick)."""
    return PACKAGE_DIR.parent / "build" / "cuda"


def _executable(path: str | os.PathLike[str] | None) -> str | None:
    if path and Path(path).is_file() and os.access(path, os.X_OK):
        return str(path)
    return None


def _first_executable(flag: str, explicit: str | None, candidates: list[str | None]) -> str | None:
    """``explicit`` (an error when it is not executable), else the first executable
    candidate, else ``None``."""
    if explicit is not None:
        found = _executable(explicit)
        if found is None:
            raise BuildError(f"{flag} {explicit}: no executable file there")
        return found
    return next((f for c in candidates if (f := _executable(c)) is not None), None)


def find_nvcc(explicit: str | None = None) -> str:
    """Path of nvcc: ``explicit`` (then only it), ``$CUDACXX``, ``PATH``, ``$CUDA_HOME/bin``,
    ``$CUDA_PATH/bin``, ``/usr/local/cuda/bin``.

    Raises:
        BuildError: nvcc was not found.
    """
    homes = (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda")
    found = _first_executable(
        "--nvcc",
        explicit,
        [os.environ.get("CUDACXX"), shutil.which("nvcc")]
        + [str(Path(home) / "bin" / "nvcc") for home in homes if home],
    )
    if found is not None:
        return found
    raise BuildError(
        "nvcc was not found. Install the CUDA toolkit (13.x) and put nvcc on PATH, "
        "or pass --nvcc /path/to/nvcc (or set CUDACXX)."
    )


def _package_tool(module: str, attribute: str, name: str) -> str | None:
    """``name`` inside the bin directory of a Python package (``cmake``, ``ninja``)."""
    try:
        mod = __import__(module)
        bin_dir = getattr(mod, attribute)
    except (ImportError, AttributeError):
        return None
    return _executable(Path(bin_dir) / name)


def find_cmake(explicit: str | None = None) -> str:
    """Path of cmake: ``explicit`` (then only it), ``$CMAKE``, ``PATH``, the ``cmake`` package.

    Raises:
        BuildError: cmake was not found.
    """
    found = _first_executable("--cmake", explicit, [os.environ.get("CMAKE"), shutil.which("cmake")])
    if found is None:
        found = _package_tool("cmake", "CMAKE_BIN_DIR", "cmake")
    if found is not None:
        return found
    raise BuildError("cmake (3.18 or newer) was not found: `pip install cmake`, or pass --cmake.")


def find_ninja() -> str | None:
    """Path of ninja (``PATH``, else the ``ninja`` Python package), or ``None``."""
    found = _executable(shutil.which("ninja"))
    return found if found is not None else _package_tool("ninja", "BIN_DIR", "ninja")


def site_dirs() -> list[Path]:
    """The existing directories of ``sys.path`` (where the nvidia-* wheels are looked for)."""
    seen: set[Path] = set()
    out: list[Path] = []
    for entry in sys.path:
        p = Path(entry or ".").resolve()
        if p.is_dir() and p not in seen:
            seen.add(p)
            out.append(p)
    return out


def _versioned(lib_dir: Path, stem: str) -> Path | None:
    """The newest ``stem.so.N`` in ``lib_dir`` (the wheels have no unversioned link)."""
    pattern = re.compile(re.escape(stem) + r"\.so\.(\d+)$")
    found = [
        (int(m.group(1)), f) for f in lib_dir.glob(stem + ".so.*") if (m := pattern.match(f.name))
    ]
    if found:
        return max(found)[1]
    plain = lib_dir / (stem + ".so")
    return plain if plain.exists() else None


def find_cuda_libs(cuda_home: Path | None = None) -> CudaLibs:
    """Locates cuBLAS and cuSOLVER: the nvidia-* wheels first, then the CUDA toolkit.

    Wheel layout: ``nvidia/cu13/{include,lib}`` (both libraries in one directory).

    Args:
        cuda_home: the toolkit root, tried after the wheels.

    Returns:
        The include directory and the two libraries.

    Raises:
        BuildError: neither the wheels nor the toolkit provide both libraries.
    """
    roots = [
        sub for site in site_dirs() for sub in sorted((site / "nvidia").glob("cu*"), reverse=True)
    ]
    layouts = [(root / "include", root / "lib") for root in roots]
    if cuda_home is not None:
        for sub in ("lib64", "lib", "targets/x86_64-linux/lib"):
            layouts.append((cuda_home / "include", cuda_home / sub))
    for inc, lib in layouts:
        if not ((inc / "cublas_v2.h").is_file() and (inc / "cusolverDn.h").is_file()):
            continue
        if not lib.is_dir():
            continue
        cublas, cusolver = _versioned(lib, "libcublas"), _versioned(lib, "libcusolver")
        if cublas is None or cusolver is None:
            continue
        return CudaLibs(include_dir=str(inc), cublas=str(cublas), cusolver=str(cusolver))
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


def cmake_architectures(arch: str) -> str:
    """``--arch`` as a ``CMAKE_CUDA_ARCHITECTURES`` list.

    Accepts CMake's own form (``90``, ``80;90``, ``90-real``) and nvcc's (``sm_90``,
    ``sm_80,sm_90``).

    Raises:
        BuildError: an entry that is neither.

    Example:
        >>> cmake_architectures("sm_90")
        '90'
        >>> cmake_architectures("80;90-real")
        '80;90-real'
    """
    out = []
    for entry in re.split(r"[;,\s]+", arch.strip()):
        if not entry:
            continue
        m = re.fullmatch(r"(?:sm_|compute_)?(\d+[a-z]?)(-real|-virtual)?", entry)
        if m is None:
            raise BuildError(f"--arch: cannot read {entry!r}; use e.g. 90, sm_90 or 80;90")
        out.append(m.group(1) + (m.group(2) or ""))
    if not out:
        raise BuildError("--arch needs at least one architecture, e.g. 90")
    return ";".join(out)


def configure_command(
    cmake: str,
    source: Path,
    build_dir: Path,
    *,
    nvcc: str,
    jax_include: str,
    libs: CudaLibs | None,
    ninja: str | None = None,
    arch: str | None = None,
    debug: bool = False,
    werror: bool = False,
    nvcc_flags: str = "",
) -> list[str]:
    """The ``cmake`` configure command line.

    Architectures: ``arch`` when given, else CMake's default from ``CMakeLists.txt``
    (any value cached by an earlier ``--arch`` is dropped). ``nvcc_flags`` (extra nvcc
    options separated by spaces) is always passed, so that an earlier build's flags are
    not kept in CMake's cache.

    Example:
        >>> cmd = configure_command(
        ...     "cmake", Path("kernels_cuda"), Path("build/cuda"), nvcc="nvcc",
        ...     jax_include="inc", libs=None, werror=True)
        >>> [c for c in cmd if "WERROR" in c or "ARCH" in c or "FLAGS" in c]
        ['-DGPCHOL_WERROR=ON', '-DGPCHOL_EXTRA_CUDA_FLAGS=', '-UCMAKE_CUDA_ARCHITECTURES']
    """
    cmd = [cmake, "-S", str(source), "-B", str(build_dir)]
    if ninja is not None:
        cmd += ["-G", "Ninja", f"-DCMAKE_MAKE_PROGRAM={ninja}"]
    cmd += [
        f"-DCMAKE_CUDA_COMPILER={nvcc}",
        f"-DCMAKE_BUILD_TYPE={'Debug' if debug else 'Release'}",
        f"-DGPCHOL_JAX_INCLUDE={jax_include}",
        f"-DGPCHOL_WERROR={'ON' if werror else 'OFF'}",
        f"-DGPCHOL_EXTRA_CUDA_FLAGS={' '.join(nvcc_flags.split())}",
    ]
    if libs is not None:
        cmd += [
            f"-DGPCHOL_CUDA_LIBS_INCLUDE={libs.include_dir}",
            f"-DGPCHOL_CUBLAS_LIBRARY={libs.cublas}",
            f"-DGPCHOL_CUSOLVER_LIBRARY={libs.cusolver}",
        ]
    if arch is not None:
        cmd.append(f"-DCMAKE_CUDA_ARCHITECTURES={cmake_architectures(arch)}")
    else:
        cmd.append("-UCMAKE_CUDA_ARCHITECTURES")
    return cmd


def _version_in(text: str, word: str) -> str:
    """The last version number (``13.0.88``) on the first line containing ``word``."""
    for line in text.splitlines():
        if word in line:
            found = re.findall(r"\d+(?:\.\d+)+", line)
            return found[-1] if found else line.strip()
    return text.strip().splitlines()[-1] if text.strip() else "unknown"


def tool_versions(nvcc: str | None, cmake: str | None, ninja: str | None) -> dict[str, str]:
    """Versions of the build's tools and wheels (for the build log).

    Args:
        nvcc: path of nvcc, or ``None`` to skip it (likewise ``cmake``, ``ninja``).

    Returns:
        ``{"nvcc": ..., "cmake": ..., "ninja": ..., "jax": ..., "nvidia-cublas": ...}``;
        ``"missing"`` for what is not installed.

    Example:
        >>> sorted(tool_versions(None, None, None))
        ['jax', 'jaxlib', 'nvidia-cublas', 'nvidia-cusolver']
    """
    out: dict[str, str] = {}
    for name, exe, args, word in (
        ("nvcc", nvcc, ["--version"], "release"),
        ("cmake", cmake, ["--version"], "version"),
        ("ninja", ninja, ["--version"], ""),
    ):
        if exe is None:
            continue
        try:
            proc = subprocess.run([exe, *args], capture_output=True, text=True, timeout=60)
            out[name] = _version_in(proc.stdout + proc.stderr, word)
        except (OSError, subprocess.SubprocessError) as err:
            out[name] = f"unavailable ({err})"
    for dist in ("jax", "jaxlib", *WHEELS):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = "missing"
    return out


def _forget_other_generator(build_dir: Path, generator: str | None) -> None:
    """Drops CMake's cache when ``build_dir`` was configured with another generator
    (CMake refuses to switch generators in place); ``None``: CMake's default on Linux."""
    cache = build_dir / "CMakeCache.txt"
    if not cache.is_file():
        return
    m = re.search(r"^CMAKE_GENERATOR:INTERNAL=(.*)$", cache.read_text(errors="replace"), re.M)
    if m is not None and m.group(1).strip() != (generator or "Unix Makefiles"):
        cache.unlink()
        shutil.rmtree(build_dir / "CMakeFiles", ignore_errors=True)


def _run(cmd: Sequence[str], verbose: bool) -> None:
    if verbose:
        print("+ " + " ".join(cmd), flush=True)
    proc = subprocess.run(list(cmd), capture_output=True, text=True)
    if verbose and (proc.stdout or proc.stderr):
        print((proc.stdout + proc.stderr).rstrip(), flush=True)
    if proc.returncode != 0:
        raise BuildError(
            f"command failed with exit code {proc.returncode}:\n  {' '.join(cmd)}\n"
            f"{proc.stdout[-6000:]}{proc.stderr[-6000:]}"
        )


def build(
    output: Path = DEFAULT_OUTPUT,
    *,
    build_dir: Path | None = None,
    arch: str | None = None,
    nvcc: str | None = None,
    cmake: str | None = None,
    jobs: int | None = None,
    debug: bool = False,
    werror: bool = False,
    nvcc_flags: str = "",
    verbose: bool = False,
) -> Path:
    """Configures and builds ``kernels_cuda`` with CMake; copies the library to ``output``.

    Args:
        output: path of the ``.so`` to write (directories are created).
        build_dir: CMake's build directory (default :func:`default_build_dir`).
        arch: GPU architectures (``90``, ``sm_90``, ``80;90``); default: CMake's.
        nvcc: path of nvcc (default: searched, see :func:`find_nvcc`).
        cmake: path of cmake (default: searched, see :func:`find_cmake`).
        jobs: parallel compilations (default: CMake's).
        debug: a Debug build (``CMAKE_BUILD_TYPE``) instead of Release.
        werror: every nvcc and host-compiler warning is an error (CI).
        nvcc_flags: extra nvcc options, separated by spaces (each one word, such as
            ``-lineinfo`` or ``-Xptxas=-warn-spills``).
        verbose: print the commands, CMake's output and the compiler lines (with ptxas's
            registers and spills of every kernel).

    Returns:
        The path of the copied library.

    Raises:
        BuildError: the sources (outside a checkout), a tool or a library is missing, or
            CMake/nvcc failed.
    """
    src = source_dir()
    if not (src / "CMakeLists.txt").is_file():
        raise BuildError(
            f"the CUDA sources are not here ({src}/CMakeLists.txt does not exist): "
            "`python -m gpchol.build` needs a source checkout of gpchol, since an installed "
            "package does not ship kernels_cuda/. Clone the repository, `pip install -e .` "
            "from it and run the build there."
        )
    cmake_path = find_cmake(cmake)
    ninja = find_ninja()
    nvcc_path = find_nvcc(nvcc)
    cuda_home = Path(nvcc_path).resolve().parent.parent
    libs = find_cuda_libs(cuda_home)
    jax_include = jax_include_dir()
    versions = tool_versions(nvcc_path, cmake_path, ninja)
    print(
        "gpchol.build: " + ", ".join(f"{k} {v}" for k, v in versions.items()),
        flush=True,
    )
    print(f"gpchol.build: cuBLAS {libs.cublas}, cuSOLVER {libs.cusolver}", flush=True)
    build_dir = Path(build_dir) if build_dir is not None else default_build_dir()
    build_dir.mkdir(parents=True, exist_ok=True)
    _forget_other_generator(build_dir, "Ninja" if ninja is not None else None)
    configure = configure_command(
        cmake_path,
        src,
        build_dir,
        nvcc=nvcc_path,
        jax_include=jax_include,
        libs=libs,
        ninja=ninja,
        arch=arch,
        debug=debug,
        werror=werror,
        nvcc_flags=nvcc_flags,
    )
    _run(configure, verbose)
    compile_cmd = [cmake_path, "--build", str(build_dir), "--parallel"]
    if jobs is not None:
        compile_cmd.append(str(jobs))
    if verbose:
        compile_cmd.append("--verbose")
    _run(compile_cmd, verbose)
    built = build_dir / LIBRARY_NAME
    if not built.is_file():
        raise BuildError(f"CMake finished but {built} does not exist")
    output = Path(output).resolve()
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_name(output.name + ".tmp")
    shutil.copy2(built, tmp)
    os.replace(tmp, output)
    return output


def main(argv: list[str] | None = None) -> int:
    """Command line: ``python -m gpchol.build [--arch 90] [--werror] [--nvcc-flags F] ...``."""
    parser = argparse.ArgumentParser(
        prog="python -m gpchol.build",
        description=(
            "Compile gpchol's CUDA kernels (kernels_cuda/, with CMake and nvcc) into the "
            "shared library that gpchol._cuda.ffi loads. Needs a source checkout, cmake, "
            "nvcc and the nvidia-cublas / nvidia-cusolver wheels."
        ),
    )
    parser.add_argument(
        "--output",
        type=Path,
        default=DEFAULT_OUTPUT,
        help=f"library to write (default: {DEFAULT_OUTPUT})",
    )
    parser.add_argument(
        "--build-dir", type=Path, default=None, help=f"default: {default_build_dir()}"
    )
    parser.add_argument(
        "--arch",
        default=None,
        help="GPU architectures, e.g. 90 (H100/H200) or 80;90 (sm_90 and sm_80,sm_90 are "
        "read too); default: CMAKE_CUDA_ARCHITECTURES of kernels_cuda/CMakeLists.txt",
    )
    parser.add_argument("--nvcc", default=None, help="path of nvcc (default: searched)")
    parser.add_argument("--cmake", default=None, help="path of cmake (default: searched)")
    parser.add_argument("--jobs", "-j", type=int, default=None, help="parallel compilations")
    parser.add_argument("--debug", action="store_true", help="CMAKE_BUILD_TYPE=Debug")
    parser.add_argument(
        "--werror", action="store_true", help="treat compiler warnings as errors (CI)"
    )
    parser.add_argument(
        "--nvcc-flags",
        default="",
        help="extra nvcc options separated by spaces, each one word; write "
        "--nvcc-flags=-lineinfo (with =, since the value starts with -)",
    )
    parser.add_argument(
        "--verbose",
        "-v",
        action="store_true",
        help="print the commands and their output (with ptxas's registers and spills)",
    )
    args = parser.parse_args(argv)
    start = time.perf_counter()
    try:
        out = build(
            args.output,
            build_dir=args.build_dir,
            arch=args.arch,
            nvcc=args.nvcc,
            cmake=args.cmake,
            jobs=args.jobs,
            debug=args.debug,
            werror=args.werror,
            nvcc_flags=args.nvcc_flags,
            verbose=args.verbose,
        )
    except BuildError as err:
        print(f"gpchol.build: error: {err}", file=sys.stderr)
        return 1
    print(f"gpchol.build: wrote {out} in {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
