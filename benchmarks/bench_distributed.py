"""Communication and memory of the sharded Cholesky on a simulated 2x4 CPU mesh.

For ``gpchol.distributed.potrf`` at ``n`` (default 4096) on 8 simulated CPU devices:

* bytes each device sends per factorization, counted from the collectives the algorithm
  issues (recorded at trace time; the program is unrolled, so each runs exactly once)
  with the usual ring costs (all-reduce ``2 (G-1)/G S``, all-to-all ``(G-1)/G S``), split
  into the factorization proper and the block <-> cyclic layout change, against the 2D
  block-cyclic model ``n^2 (1/Pr + 1/Pc) / 2 * itemsize``; and, as a cross-check, the sum
  of the collective result sizes in the compiled HLO;
* the peak per-device buffer from the compiled ``memory_analysis`` against
  ``n^2 / 8 * itemsize`` (one device's share of the matrix).

Wall time on simulated devices (8 "devices" sharing this machine's cores) is printed but
is not a performance target. Usage: ``python benchmarks/bench_distributed.py [--n 4096]``.
"""

import argparse
import os
import re
import time

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")


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


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=4096, help="matrix size (default 4096)")
    p.add_argument("--tile", type=int, default=256, help="tile size T_A (default 256)")
    p.add_argument("--dtype", default="float64", choices=["float32", "float64"])
    p.add_argument("--no-run", action="store_true", help="compile only, do not time")
    args = p.parse_args()

    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    jax.config.update("jax_enable_x64", True)
    from gpchol import distributed as gd
    from gpchol.distributed import _local

    Pr, Pc = 2, 4
    mesh = jax.make_mesh((Pr, Pc), ("r", "c"))
    n, T = args.n, args.tile
    dtype = np.dtype(args.dtype)
    item = dtype.itemsize
    spec = NamedSharding(mesh, P("r", "c"))
    a = jax.ShapeDtypeStruct((n, n), dtype, sharding=spec)

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
    share = n * n / (Pr * Pc) * item

    mib = 2.0**20
    print(f"gpchol.distributed.potrf, {Pr}x{Pc} simulated CPU mesh, n={n}, T_A={T}, {dtype}")
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
        f"    {peak / mib:.1f} MiB vs n^2/8*itemsize = {share / mib:.1f} MiB "
        f"(ratio {peak / share:.2f}; temp {mem.temp_size_in_bytes / mib:.1f} MiB)"
    )
    if not args.no_run:
        rng = np.random.default_rng(0)

        def block(idx):
            i = np.arange(n)[idx[0]][:, None]
            j = np.arange(n)[idx[1]][None, :]
            return (np.exp(-np.abs(i - j) / 50.0) + (i == j)).astype(dtype)

        del rng
        x = jax.make_array_from_callback((n, n), spec, block)
        L, status = compiled(x)
        L.block_until_ready()
        x = jax.make_array_from_callback((n, n), spec, block)
        t0 = time.perf_counter()
        L, status = compiled(x)
        L.block_until_ready()
        dt = time.perf_counter() - t0
        print(f"  status {int(status)}; wall time {dt:.2f} s -- NOT a performance target: the 8")
        print("    simulated devices share this machine's CPU cores.")
    else:
        print("  (not run) wall time on simulated devices is not a performance target.")
    del jnp


if __name__ == "__main__":
    main()
