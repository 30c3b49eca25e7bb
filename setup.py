"""Builds gpchol's compiled CPU handlers (``gpchol/_cpu/lapack_ffi.cc``) at install time.

Everything else about the package is in ``pyproject.toml``. The handlers are XLA FFI
custom calls, so they are compiled against the FFI headers that jaxlib ships
(``jax.ffi.include_dir()`` is jaxlib's ``include`` folder); jaxlib is therefore a build
requirement. The result is a plain shared library (loaded with :mod:`ctypes` by
:mod:`gpchol._cpu.ffi`, not imported as a module) that links against no BLAS: it is handed
SciPy's LAPACK at run time. The extension is optional: where no C++17 compiler is found the
install still succeeds, and gpchol then uses XLA operations instead (slower; it says why in
``gpchol._cpu.ffi.cpu_unavailable_reason()``).
"""

import importlib.util
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class BuildFFI(build_ext):
    """``build_ext`` that adds jaxlib's XLA FFI headers to the include path."""

    def build_extensions(self) -> None:
        spec = importlib.util.find_spec("jaxlib")
        if spec is None or not spec.submodule_search_locations:
            raise RuntimeError("building gpchol's CPU handlers needs jaxlib (its FFI headers)")
        include = Path(next(iter(spec.submodule_search_locations))) / "include"
        for ext in self.extensions:
            ext.include_dirs.append(str(include))
        super().build_extensions()


setup(
    ext_modules=[
        Extension(
            "gpchol._cpu._lapack_ffi",
            sources=["gpchol/_cpu/lapack_ffi.cc"],
            language="c++",
            extra_compile_args=["-std=c++17", "-O3", "-fvisibility=hidden"],
            optional=True,
        )
    ],
    cmdclass={"build_ext": BuildFFI},
)
