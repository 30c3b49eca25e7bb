"""Communication, memory and time of the sharded Cholesky on a simulated 2x4 CPU mesh.

On 8 simulated CPU devices, at ``n`` (default 4096):

* ``gpchol.distributed.potrf`` (forward): bytes each device sends per factorization,
  counted from the collectives the algorithm issues (recorded at trace time; the program
  is unrolled, so each runs exactly once) with the usual ring costs (all-reduce
  ``2 (G-1)/G S``, all-to-all ``(G-1)/G S``), split into the factorization proper and the
  block <-> cyclic layout change, against the 2D block-cyclic model
  ``n^2 (1/Pr + 1/Pc) / 2 * itemsize``; as a cross-check, the sum of the collective
  result sizes in the compiled HLO; the peak per-device buffer from the compiled
  ``memory_analysis`` against ``n^2 / 8 * itemsize`` (one device's share, a "block");
* ``gpchol.distributed.gaussian_log_likelihood`` (value and gradient with respect to the
  kernel and the noise; ``1.5 * ExpSquared``, ``d = 3``): the per-device temporaries of
  the compiled step in blocks, and the largest buffer in its HLO (at most one block: no
  device holds an ``n x n`` array);
* compile time, and wall time as the median of ``--repeat`` runs after a warm-up.

Wall time on simulated devices (8 "devices" sharing this machine's cores) is printed but
is not a performance target. OpenBLAS (SciPy's, which JAX's CPU ``potrf``/``trsm`` call)
is limited to one thread here unless ``OPENBLAS_NUM_THREADS`` is set: with 8 simulated
devices calling it at once, its own worker threads oversubscribe the cores and a run takes
10 to 50 times longer, erratically (measured at n = 2048 on 2 cores: the GP
value-and-gradient step 1.1 s with one OpenBLAS thread, 11 to 67 s without).

Usage: ``python benchmarks/bench_distributed.py [--n 4096] [--tile T] [--repeat 3]``.
"""

import argparse
import os
import re
import time

_flag = "--xla_force_host_platform_device_count=8"
if _flag not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _flag).strip()
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # see the module docstring


def _hlo_collective_bytes(txt):
    total = 0
    pat = re.compile(r"=\s*(\(?[^=]*?)\s+(all-gather|all-reduce|all-to-all|collective-permute)\(")
    sizes = {"f64": 8, "f32": 4, "s32": 4, "u32": 4, "pred": 1}
    largest = 0
    for line in txt.splitlines():
        m = pat.search(line)
        if not m:
            continue
        for ty, dims in re.findall(r"(f64|f32|s32|u32|pred)\[([\d,]*)\]", m.group(1)):
            k = 1
            for d in dims.split(","):
                if d:
                    k *= int(d)
            total += k * sizes[ty]
            largest = max(largest, k)
    return total, largest


def _largest_buffer(txt):
    """Largest element count of any float array shape in an HLO text."""
    out = 0
    for dims in re.findall(r"f(?:64|32)\[([\d,]*)\]", txt):
        k = 1
        for d in dims.split(","):
            if d:
                k *= int(d)
        out = max(out, k)
    return out


def _median_time(fn, repeat):
    import numpy as np

    fn()  # warm-up (first-run costs are not part of a step)
    ts = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts)), ts


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=4096, help="matrix size (default 4096)")
    p.add_argument("--tile", type=int, default=None, help="tile size T_A (default: gpchol's)")
    p.add_argument("--dtype", default="float64", choices=["float32", "float64"])
    p.add_argument("--repeat", type=int, default=3, help="timed runs (median; default 3)")
    p.add_argument("--no-run", action="store_true", help="compile only, do not time")
    p.add_argument("--no-gp", action="store_true", help="skip the GP value-and-gradient part")
    args = p.parse_args()

    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    jax.config.update("jax_enable_x64", True)
    from gpchol import distributed as gd
    from gpchol import kernels
    from gpchol._internal import distributed_api as _api
    from gpchol._internal import distributed_local as _local

    Pr, Pc = 2, 4
    mesh = jax.make_mesh((Pr, Pc), ("r", "c"))
    n = args.n
    T = args.tile if args.tile is not None else _api.default_tile(n, Pr, Pc)
    dtype = np.dtype(args.dtype)
    item = dtype.itemsize
    spec = NamedSharding(mesh, P("r", "c"))
    a = jax.ShapeDtypeStruct((n, n), dtype, sharding=spec)
    share = n * n / (Pr * Pc) * item
    mib = 2.0**20
    blas = os.environ.get("OPENBLAS_NUM_THREADS")

    _local.COLLECTIVE_LOG = log = []
    t0 = time.perf_counter()
    lowered = jax.jit(lambda x: gd.potrf_jit_ctx(x, T), donate_argnums=0).lower(a)
    _local.COLLECTIVE_LOG = None
    compiled = lowered.compile()
    t_compile = time.perf_counter() - t0

    size = {"r": Pr, "c": Pc}
    sent = {"factorization": 0.0, "layout": 0.0}
    for kind, shape, dt, axes in log:
        G = 1
        for ax in axes:
            G *= size[ax]
        S = float(np.prod(shape)) * dt.itemsize
        if kind == "psum":
            sent["factorization"] += 2 * (G - 1) / G * S
        else:
            sent["layout"] += (G - 1) / G * S
    model = n * n * (1 / Pr + 1 / Pc) / 2 * item
    hlo_bytes, largest = _hlo_collective_bytes(compiled.as_text())
    mem = compiled.memory_analysis()
    peak = mem.argument_size_in_bytes + mem.output_size_in_bytes + mem.temp_size_in_bytes
    peak -= mem.alias_size_in_bytes

    print(
        f"gpchol.distributed, {Pr}x{Pc} simulated CPU mesh, n={n}, T_A={T}, {dtype}, "
        f"OPENBLAS_NUM_THREADS={blas}"
    )
    print("potrf (forward):")
    print(f"  collectives issued: {len(log)}; compile time {t_compile:.1f} s")
    print("  bytes sent per device per factorization (ring model on the counted collectives):")
    print(f"    factorization broadcasts : {sent['factorization'] / mib:9.1f} MiB")
    print(f"    block<->cyclic layout    : {sent['layout'] / mib:9.1f} MiB")
    print(f"    2D block-cyclic model n^2(1/Pr+1/Pc)/2*itemsize: {model / mib:9.1f} MiB")
    print(f"    ratio (factorization / model): {sent['factorization'] / model:.2f}")
    print(f"  HLO cross-check: sum of collective result sizes {hlo_bytes / mib:.1f} MiB; largest")
    print(f"    collective result {largest} elements = {largest / (n * n):.4f} n^2 (< 1: no")
    print("    collective carries the whole matrix)")
    print("  peak per-device buffer (compiled memory_analysis, args+out+temp-alias):")
    print(
        f"    {peak / mib:.1f} MiB vs one block n^2/8*itemsize = {share / mib:.1f} MiB "
        f"(ratio {peak / share:.2f}; temp {mem.temp_size_in_bytes / share:.2f} blocks)"
    )

    def block(idx):
        i = np.arange(n)[idx[0]][:, None]
        j = np.arange(n)[idx[1]][None, :]
        return (np.exp(-np.abs(i - j) / 50.0) + (i == j)).astype(dtype)

    if not args.no_run:
        x = jax.make_array_from_callback((n, n), spec, block)
        # timed without donation, so that the same input serves every run
        timed = jax.jit(lambda x: gd.potrf_jit_ctx(x, T)[0]).lower(x).compile()
        med, ts = _median_time(lambda: timed(x).block_until_ready(), args.repeat)
        print(
            f"  wall time median {med:.3f} s over {args.repeat} runs "
            f"({', '.join(f'{t:.2f}' for t in ts)}) -- NOT a performance target"
        )

    if args.no_gp:
        return
    rng = np.random.default_rng(0)
    X = jnp.asarray(rng.uniform(size=(n, 3)), dtype)
    y = jnp.asarray(rng.standard_normal(n), dtype)
    k = 1.5 * kernels.ExpSquared(lengthscale=0.4)

    def f(k, noise):
        return gd.gaussian_log_likelihood(k, k, X, y, noise, mesh, T)[0]

    step = jax.jit(jax.value_and_grad(f, argnums=(0, 1)))
    t0 = time.perf_counter()
    cstep = step.lower(k, jnp.asarray(0.1, dtype)).compile()
    t_compile = time.perf_counter() - t0
    mem = cstep.memory_analysis()
    big = _largest_buffer(cstep.as_text())
    print("gaussian_log_likelihood, value and gradient wrt (kernel, noise):")
    print(f"  compile time {t_compile:.1f} s")
    print(
        f"  per-device temporaries {mem.temp_size_in_bytes / mib:.1f} MiB = "
        f"{mem.temp_size_in_bytes / share:.2f} blocks; largest buffer in the HLO {big} "
        f"elements = {big / (n * n / (Pr * Pc)):.2f} blocks ({big / (n * n):.4f} n^2)"
    )
    if not args.no_run:

        def gp_run():
            _, g = cstep(k, jnp.asarray(0.1, dtype))
            jax.block_until_ready(g)

        med, ts = _median_time(gp_run, args.repeat)
        print(
            f"  wall time median {med:.3f} s over {args.repeat} runs "
            f"({', '.join(f'{t:.2f}' for t in ts)}) -- NOT a performance target"
        )


if __name__ == "__main__":
    main()
