"""What a size bucket costs: one value-and-gradient step padded to its bucket against the
same step at the unpadded size, at the worst edges (``n`` one above a bucket boundary).

``gpchol.fit`` pads the training points up to their size bucket (``bucket_size`` in
``gpchol/_base/buckets.py``; the padded rows masked out) so that fits of nearby sizes
share one compiled program. The padded step does the work of the bucket's size; this
prints the time ratio ``padded / unpadded`` of ``jit(value_and_grad)`` of the negative
log marginal likelihood (amplitude * ARD ExpSquared + White and a noise variance, ``d``
inputs, float64, the parameters on the log scale), and the ratio of the covariance's
entries ``(b / n)^2`` (the step's memory above the inputs). Both programs are compiled
before timing; the ratio is the median of the per-repeat ratios, the two run in turn in
each repeat.

Usage::

    python -m benchmarks.bench_buckets [--sizes 33,65,...] [--d 10] [--repeats 7]
                                       [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np

#: One above a bucket boundary of the default rule (the worst edges) and a few in between.
SIZES = (33, 65, 129, 193, 257, 265, 353, 400, 513, 1025, 2049, 4033)


def _loss(d: int):
    import jax.numpy as jnp

    from gpchol import GaussianProcess, kernels

    def loss(theta, X, y, mask):
        p = jnp.exp(theta)
        k = p[0] * kernels.ExpSquared(p[1 : d + 1]) + kernels.White(p[d + 1])
        gp = GaussianProcess(k, X, noise=p[d + 2], mask=mask)
        return -gp.log_marginal_likelihood(y)

    return loss


def _time(f, args, seconds: float) -> float:
    import jax

    jax.block_until_ready(f(*args))
    count, t0 = 0, time.perf_counter()
    while True:
        jax.block_until_ready(f(*args))
        count += 1
        elapsed = time.perf_counter() - t0
        if elapsed >= seconds:
            return elapsed / count


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)))
    ap.add_argument("--d", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--chunk", type=float, default=0.2, help="seconds per timed loop")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)

    import jax

    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp

    from gpchol._internal import fit_programs_module

    d = args.d
    loss = _loss(d)
    vg = jax.jit(jax.value_and_grad(loss))
    theta = jnp.concatenate(
        [jnp.zeros(1), jnp.full(d, np.log(2.0)), jnp.log(jnp.array([0.1, 0.1]))]
    )
    rng = np.random.default_rng(0)
    record: dict = {"d": d, "repeats": args.repeats, "sizes": {}}
    print(
        f"{'n':>6} {'bucket':>7} {'unpadded ms':>12} {'padded ms':>10} {'time ratio':>11} "
        f"{'(b/n)^2':>8}"
    )
    for n in (int(s) for s in args.sizes.split(",")):
        b = fit_programs_module.bucket_size(n)
        X = rng.standard_normal((b, d))
        y = np.sin(X[:, 0]) + 0.1 * rng.standard_normal(b)
        mask = np.arange(b) < n
        plain = (theta, jnp.asarray(X[:n]), jnp.asarray(y[:n]), None)
        padded = (theta, jnp.asarray(X), jnp.asarray(y), jnp.asarray(mask))
        v0, v1 = float(vg(*plain)[0]), float(vg(*padded)[0])
        if abs(v0 - v1) > 1e-9 * abs(v0):
            raise AssertionError(f"n = {n}: padded value {v1} != unpadded {v0}")
        t_plain, t_pad = [], []
        for _ in range(args.repeats):
            t_plain.append(_time(vg, plain, args.chunk))
            t_pad.append(_time(vg, padded, args.chunk))
        ratio = statistics.median(p / q for p, q in zip(t_pad, t_plain, strict=True))
        row = {
            "bucket": b,
            "unpadded_s": statistics.median(t_plain),
            "padded_s": statistics.median(t_pad),
            "time_ratio": ratio,
            "entries_ratio": (b / n) ** 2,
        }
        record["sizes"][str(n)] = row
        print(
            f"{n:>6} {b:>7} {1e3 * row['unpadded_s']:>12.3f} {1e3 * row['padded_s']:>10.3f} "
            f"{ratio:>11.3f} {row['entries_ratio']:>8.3f}",
            flush=True,
        )
    if args.json:
        from benchmarks._common import machine_info, versions

        record.update(machine=machine_info(), versions=versions())
        Path(args.json).write_text(json.dumps(record, indent=1) + "\n")
        print(f"wrote {args.json}")
    return record


if __name__ == "__main__":
    main()
