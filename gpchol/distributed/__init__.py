"""Sharded, differentiable Cholesky across the devices of a JAX mesh (one or many processes).

Entry points, each in three shapes (direct and jitted for you; inside the caller's
``jax.jit``; inside the caller's ``jax.shard_map`` on local blocks):

* :func:`potrf` / :func:`potrf_jit_ctx` / :func:`potrf_shardmap_ctx`: the factor;
* :func:`potrs` / :func:`potrs_jit_ctx` / :func:`potrs_shardmap_ctx`: solves with it;
* :func:`logdet` / :func:`logdet_jit_ctx` / :func:`logdet_shardmap_ctx`;
* :func:`gaussian_log_likelihood`: a GP marginal likelihood whose covariance tiles are
  built on the devices that own them (scalar or per-point noise, a prior mean);
* :func:`condition`: the GP posterior, a :class:`ShardedPosterior` whose factor stays in
  its block-cyclic tiles; ``mean``/``variance`` at test points by the sharded solve.

The matrix is sharded over two mesh axes, ``NamedSharding(mesh, P(row_axis, col_axis))``
(or with one of them ``None``), and no device ever holds it whole; :func:`potrf` says how
it is factored and differentiated, and what sizes it takes. An input laid out otherwise
(e.g. unsharded) is placed so: by ``jax.device_put`` when concrete, by a sharding
constraint inside the caller's ``jit`` or ``grad``. An eager ``jax.grad`` over an
*Explicit* mesh (``jax.make_mesh``'s default) needs ``jax.set_mesh(mesh)`` around it (JAX
seeds the cotangent on the output's mesh); under ``jax.jit`` it is not needed.

Simulated CPU devices (``--xla_force_host_platform_device_count``): JAX's CPU ``potrf`` and
``trsm`` call SciPy's OpenBLAS, whose own worker threads, with several devices calling it
at once, oversubscribe the cores; set ``OPENBLAS_NUM_THREADS=1`` before starting Python
(``benchmarks/results/design-measurements.md``).
"""

from gpchol.distributed import _api
from gpchol.distributed._api import *  # noqa: F403 (the names in _api.__all__)
from gpchol.distributed._gp import gaussian_log_likelihood
from gpchol.distributed._posterior import ShardedPosterior, condition

__all__ = ["ShardedPosterior", "condition", "gaussian_log_likelihood"]
__all__ += _api.__all__
