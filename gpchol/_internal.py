"""Internals that the test suite and the benchmarks use: the one documented place for them.

Not public API: names here may change without notice. Everything a user needs is in
:mod:`gpchol` (and its public submodules ``kernels``, ``means``, ``datasets``,
``distributed``, ``numpyro``). Tests and benchmarks import internals only from here, so
that the package's private modules can be rearranged without touching them.

* ``io``: atomic file IO (tests interrupt a write half-way);
* ``cuda_ffi``: the FFI binding of the CUDA kernels (registration, diagnostics);
* ``host_lapack``: the module of the in-place LAPACK calls on the CPU;
* ``cpu_ffi``: the compiled CPU handlers behind it (registration, direct calls);
* :func:`cho_inverse_tiled`: the tiled ``potri`` in JAX (reference for the LAPACK one);
* :func:`backend`, :func:`default_tile_size`: the factorization backends and tile rule;
* :func:`maybe_sharded_cholesky`: the routing of sharded inputs;
* ``distributed_api``, ``distributed_local``: modules of the sharded layer (tile defaults,
  the collectives record used by ``benchmarks/bench_distributed.py``);
* ``lbfgs_module``: :func:`gpchol.fit`'s L-BFGS (the two-loop product, the direction);
* ``platform_module``: the per-platform switch (CPU-only processes trace the CPU path);
* ``fit_programs_module``: :func:`gpchol.fit`'s compiled steps keyed by structure (size
  buckets, the cache's counters);
* ``fit_batched_module``, ``posterior_module``, ``persist_module``: the modules behind
  :func:`gpchol.fit_batched`, :class:`gpchol.Posterior` and :func:`gpchol.save` (status
  codes, block-size rule, jit caches, the file format's version);
* ``sparse_module``: SGPR's row sums and their derivative rule (tested against autodiff);
* ``fit_session_module``: what a fit loop holds while it runs (its checkpoint commit is
  interrupted there to test resuming);
* ``checkpoint_module``: the checkpoint files of :func:`gpchol.fit` (written and read
  back directly, to pin their format);
* ``posterior_core_module``: the posterior core's compiled programs (their lowered text,
  to count what one block holds);
* ``triangular``: the triangular solve and Cholesky primitives every one-device path
  calls (batches run one matrix after another on the CPU);
* :class:`Below`: the transform onto ``(-inf, high)`` that the scikit-learn estimator uses
  for a bound above only; :class:`LogPositive`, the log-scale one of the estimator and the
  command line.
"""

from gpchol import _persist as persist_module
from gpchol._base import io
from gpchol._base import platform as platform_module
from gpchol._base.transforms import Below, LogPositive
from gpchol._cpu import ffi as cpu_ffi
from gpchol._cuda import ffi as cuda_ffi
from gpchol._fit import batched as fit_batched_module
from gpchol._fit import checkpoint as checkpoint_module
from gpchol._fit import lbfgs as lbfgs_module
from gpchol._fit import programs as fit_programs_module
from gpchol._fit import session as fit_session_module
from gpchol._gp import posterior as posterior_module
from gpchol._gp import sparse as sparse_module
from gpchol._linalg import host_lapack, triangular
from gpchol._linalg import posterior_core as posterior_core_module
from gpchol._linalg.backends import backend
from gpchol._linalg.blocks import default_tile_size
from gpchol._linalg.tiled import cho_inverse_tiled
from gpchol._routing import maybe_sharded_cholesky
from gpchol.distributed import _api as distributed_api
from gpchol.distributed import _local as distributed_local

__all__ = [
    "Below",
    "LogPositive",
    "backend",
    "checkpoint_module",
    "cho_inverse_tiled",
    "cpu_ffi",
    "cuda_ffi",
    "default_tile_size",
    "distributed_api",
    "distributed_local",
    "fit_batched_module",
    "fit_programs_module",
    "fit_session_module",
    "host_lapack",
    "io",
    "lbfgs_module",
    "maybe_sharded_cholesky",
    "persist_module",
    "platform_module",
    "posterior_core_module",
    "posterior_module",
    "sparse_module",
    "triangular",
]
