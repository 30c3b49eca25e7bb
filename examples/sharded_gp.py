"""An exact GP on a diamonds subset whose covariance is never held by one device.

The log marginal likelihood of a GP (ExpSquared kernel with one lengthscale per feature,
an amplitude, Gaussian noise) on ``--n`` diamonds (standardized carat, depth, table ->
standardized log10 price) is computed by
``gpchol.distributed.gaussian_log_likelihood``: each device of a ``Pr x Pc`` mesh builds
only its own covariance tiles from the small replicated inputs, the tiles are factored
where they live (tiled right-looking Cholesky on a 2D block-cyclic layout) and the
gradient comes back through Murray's blocked adjoint on the same tiles. A few Adam steps
fit the hyperparameters; the script prints the likelihood, the single-device value for
comparison (skip it with ``--no-check``), and memory per device.

On a CPU the devices are simulated (``--devices``, default 8, via ``XLA_FLAGS``, set before
JAX is imported); they share the machine's cores, so wall times say nothing about real
multi-device speed. Examples::

    python examples/sharded_gp.py                       # n = 512 on a 2x4 mesh
    python examples/sharded_gp.py --n 2048 --mesh 4x2 --steps 20
    python examples/sharded_gp.py --devices 4 --mesh 2x2 --float32

For several processes (one or more devices each) see ``examples/potrf_direct.py``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog=__doc__.split("Examples::", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--n", type=int, default=512, help="number of diamonds (default 512)")
    p.add_argument("--mesh", default="2x4", help="device mesh 'PrxPc' (default 2x4)")
    p.add_argument(
        "--devices",
        type=int,
        default=8,
        help="simulated CPU devices when running on the CPU (default 8; must be Pr*Pc)",
    )
    p.add_argument("--tile", type=int, default=32, help="tile size T_A (default 32)")
    p.add_argument("--steps", type=int, default=5, help="Adam steps (default 5; 0: none)")
    p.add_argument("--lr", type=float, default=0.05, help="Adam learning rate (default 0.05)")
    p.add_argument("--noise", type=float, default=0.05, help="initial noise variance")
    p.add_argument("--float32", action="store_true", help="float32 instead of float64")
    p.add_argument("--no-check", action="store_true", help="skip the single-device check")
    p.add_argument("--seed", type=int, default=0, help="subset seed (default 0)")
    args = p.parse_args(argv)
    try:
        pr, pc = (int(v) for v in args.mesh.lower().split("x"))
    except ValueError:
        p.error(f"--mesh must look like 2x4; got {args.mesh!r}")
    if pr < 1 or pc < 1:
        p.error("--mesh sizes must be >= 1")
    if args.n < 2:
        p.error("--n must be >= 2")
    if args.steps < 0:
        p.error("--steps must be >= 0")
    args.grid = (pr, pc)
    return args


def simulate_devices(count):
    """Ask XLA's CPU backend for ``count`` devices; must run before JAX is imported."""
    if "jax" in sys.modules:
        return
    flag = f"--xla_force_host_platform_device_count={count}"
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags:
        os.environ["XLA_FLAGS"] = (flags + " " + flag).strip()


def load_subset(n, seed, dtype):
    import numpy as np

    import gpchol

    d = gpchol.datasets.load("diamonds")
    names = list(d.feature_names)
    cols = [names.index(c) for c in ("carat", "depth", "table")]
    n = min(n, d.X.shape[0])
    idx = np.random.default_rng(seed).choice(d.X.shape[0], n, replace=False)
    X = np.asarray(d.X[idx][:, cols], dtype=np.float64)
    X = (X - X.mean(0)) / X.std(0)
    y = np.log10(np.asarray(d.y[idx], dtype=np.float64))
    y = (y - y.mean()) / y.std()
    return X.astype(dtype), y.astype(dtype)


def main(argv=None):
    args = parse_args(argv)
    pr, pc = args.grid
    simulate_devices(args.devices)

    import jax

    if not args.float32:
        jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp
    import numpy as np
    import optax

    import gpchol
    from gpchol import kernels

    try:
        from gpchol import distributed as gd

        sharded_loglik = gd.gaussian_log_likelihood
    except (ImportError, AttributeError) as err:
        print(f"gpchol.distributed is not available ({err}); nothing to shard.", file=sys.stderr)
        return 2

    if jax.device_count() < pr * pc:
        print(
            f"a {pr}x{pc} mesh needs {pr * pc} devices but JAX sees {jax.device_count()}; "
            f"pass --devices {pr * pc} (on the CPU) or a smaller --mesh.",
            file=sys.stderr,
        )
        return 2
    mesh = jax.make_mesh((pr, pc), ("r", "c"), devices=jax.devices()[: pr * pc])
    dtype = np.float32 if args.float32 else np.float64
    X_np, y_np = load_subset(args.n, args.seed, dtype)
    n = X_np.shape[0]
    X, y = jnp.asarray(X_np), jnp.asarray(y_np)
    print(
        f"{n} diamonds, 3 features; mesh {pr}x{pc} of {jax.devices()[0].platform} devices; "
        f"tile {args.tile}; {np.dtype(dtype).name}"
    )

    def kernel_fn(params, X1, X2):
        return params["amp"] * kernels.ExpSquared(params["ls"])(X1, X2)

    def neg_lml(u):
        params = {k: jnp.exp(v) for k, v in u.items()}
        out = sharded_loglik(kernel_fn, params, X, y, params["noise"], mesh, args.tile)
        value = out[0] if isinstance(out, tuple) else out  # (value, status)
        return -value

    u = {
        "amp": jnp.zeros((), dtype),
        "ls": jnp.zeros(3, dtype),
        "noise": jnp.log(jnp.asarray(args.noise, dtype)),
    }
    value_and_grad = jax.jit(jax.value_and_grad(neg_lml))
    start = time.perf_counter()
    value, _ = value_and_grad(u)
    value = float(value)
    print(f"-log p(y) = {value:.6f}  ({time.perf_counter() - start:.1f} s, compile included)")
    if not np.isfinite(value):
        print("the likelihood is not finite: try a larger --noise or float64", file=sys.stderr)
        return 1

    if not args.no_check:
        params = {k: jnp.exp(v) for k, v in u.items()}
        gp = gpchol.GaussianProcess(
            params["amp"] * kernels.ExpSquared(params["ls"]), X, noise=params["noise"]
        )
        ref = -float(gp.log_marginal_likelihood(y))
        print(f"single device: {ref:.6f}  (relative difference {abs(value - ref) / abs(ref):.1e})")

    opt = optax.adam(args.lr)
    state = opt.init(u)

    @jax.jit
    def step(u, state):
        val, g = jax.value_and_grad(neg_lml)(u)
        upd, state = opt.update(g, state)
        return optax.apply_updates(u, upd), state, val

    for i in range(args.steps):
        u, state, val = step(u, state)
        print(f"step {i + 1:3d}: -log p(y) = {float(val):.6f}")
    fitted = {k: np.round(np.exp(np.asarray(v)), 4).tolist() for k, v in u.items()}
    print("hyperparameters:", fitted)

    whole = n * n * np.dtype(dtype).itemsize
    compiled = value_and_grad.lower(u).compile()
    mem = compiled.memory_analysis()
    print(f"memory: the whole {n}x{n} covariance would be {whole / 2**20:.2f} MiB")
    if mem is not None:
        print(
            "  per device (XLA's accounting of the compiled value-and-gradient): "
            f"temporaries {mem.temp_size_in_bytes / 2**20:.3f} MiB, "
            f"arguments {mem.argument_size_in_bytes / 2**20:.3f} MiB, "
            f"outputs {mem.output_size_in_bytes / 2**20:.3f} MiB"
        )
    # The factor itself, from a covariance built block by block on its own device.
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("r", "c"))
    params = {k: jnp.exp(v) for k, v in u.items()}

    def block(index):
        rows, cols = np.arange(n)[index[0]], np.arange(n)[index[1]]
        K = kernel_fn(params, X[rows], X[cols])
        K = K + jnp.where(rows[:, None] == cols[None, :], params["noise"], 0.0)
        return np.asarray(K, dtype=dtype)

    K_sharded = jax.make_array_from_callback((n, n), sharding, block)
    L = gd.potrf(K_sharded, args.tile, mesh)
    shard = L.addressable_shards[0].data
    print(
        f"  a factor shard: {shard.shape} = {shard.nbytes / 2**20:.3f} MiB per device "
        f"({shard.nbytes / whole:.1%} of the whole)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
