"""Sharded Cholesky with the direct interface (``gpchol.distributed.potrf``), multi-process.

Each process builds only its own blocks of an SPD matrix, ``potrf`` factors it (donating
the input), ``potrs`` solves and ``logdet`` gives the log-determinant; a gradient of the
log-determinant checks the reverse pass (d logdet / dA = A^-1, so <A^-1, A> = n).
Run ``--help`` for how to start it on one or several machines; ``--launch 2`` starts
two local processes.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _launch


def example(jax, args, mesh):
    """Factor, solve and take the log-determinant, then its gradient.

    Called by ``_launch.run`` (which describes the arguments) once JAX is set up.
    """
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from gpchol import distributed as gd

    n, T = args.n, args.tile
    sharding = NamedSharding(mesh, P("r", "c"))

    def block(index):  # the (rows, cols) block of A = exp(-|i-j|/8) + I, built locally
        i = np.arange(n)[index[0]][:, None]
        j = np.arange(n)[index[1]][None, :]
        return np.exp(-np.abs(i - j) / 8.0) + (i == j)

    a = jax.make_array_from_callback((n, n), sharding, block)
    L, status = gd.potrf(a, T, donate=True, return_status=True)
    x = gd.potrs(L, jnp.ones(n), T)
    ld = gd.logdet(L)
    with jax.set_mesh(mesh):
        a2 = jax.make_array_from_callback((n, n), sharding, block)
        g = jax.jit(jax.grad(lambda a: gd.logdet(gd.potrf(a, T, donate=False))))(a2)
        check = jax.jit(lambda g, a: jnp.sum(g * a))(g, a2)  # <A^-1, A> = n
    if jax.process_index() == 0:
        print(f"processes={jax.process_count()} devices={jax.device_count()} mesh={mesh.shape}")
        print(f"input donated: {a.is_deleted()}  status={int(status)}  logdet={float(ld):.6f}")
        x0 = np.asarray(x.addressable_data(0))[:3]
        print(f"x[:3]={x0}  <dlogdet/dA, A>={float(check):.6f} (n={n})")


if __name__ == "__main__":
    sys.exit(_launch.run(example, __doc__, __file__))
