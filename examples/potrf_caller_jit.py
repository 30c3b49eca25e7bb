"""Sharded Cholesky inside the caller's own ``jax.jit`` (``potrf_jit_ctx``), multi-process.

The caller jits one step that factors, solves and takes the log-determinant, donating the
matrix; ``jax.value_and_grad`` of a Gaussian log-density runs the Murray adjoint on the
same sharded tiles. Run ``--help`` for how to start it; ``--launch 2`` starts two local
processes.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _launch


def example(jax, args, mesh):
    """Jit a log-likelihood step that donates the matrix, then its gradient.

    Called by ``_launch.run`` (which describes the arguments) once JAX is set up.
    """
    import math

    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from gpchol import distributed as gd

    n, T = args.n, args.tile
    sharding = NamedSharding(mesh, P("r", "c"))
    y = jnp.sin(jnp.arange(n) / 10.0)

    def block(index):
        i = np.arange(n)[index[0]][:, None]
        j = np.arange(n)[index[1]][None, :]
        return np.exp(-((i - j) ** 2) / 50.0) + 0.1 * (i == j)

    def loglik(a):
        L, status = gd.potrf_jit_ctx(a, T)
        alpha = gd.potrs_jit_ctx(L, y, T)
        return -0.5 * (y @ alpha + gd.logdet_jit_ctx(L) + n * math.log(2 * math.pi)), status

    with jax.set_mesh(mesh):
        step = jax.jit(loglik, donate_argnums=0)
        a = jax.make_array_from_callback((n, n), sharding, block)
        value, status = step(a)
        grad = jax.jit(jax.grad(lambda a: loglik(a)[0]))(
            jax.make_array_from_callback((n, n), sharding, block)
        )
        gnorm = jax.jit(lambda g: jnp.sqrt(jnp.sum(g * g)))(grad)
    if jax.process_index() == 0:
        print(f"processes={jax.process_count()} devices={jax.device_count()} mesh={mesh.shape}")
        print(f"status={int(status)} loglik={float(value):.6f} |dlogp/dA|_F={float(gnorm):.6f}")


if __name__ == "__main__":
    sys.exit(_launch.run(example, __doc__, __file__))
