"""Fit the Rasmussen & Williams kernel to the embedded Mauna Loa CO2 data with gpchol.

The same model as ``gpchol fit`` (no arguments), written out with the Python API:
``GaussianProcess`` + ``fit`` (L-BFGS, hyperparameters optimised on the log scale).

Usage::

    python examples/fit_co2.py [--steps 200] [--every 12]

``--every k`` keeps every k-th month (a smaller, faster problem; default 1 = all 521).
"""

from __future__ import annotations

import argparse


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=200, help="max L-BFGS steps (default 200)")
    ap.add_argument("--every", type=int, default=1, help="keep every k-th month (default 1)")
    args = ap.parse_args(argv)

    import jax
    import jax.numpy as jnp
    import numpy as np

    jax.config.update("jax_enable_x64", True)
    from gpchol import GaussianProcess, datasets, fit
    from gpchol.cli.spec import ModelSpec

    data = datasets.load("co2", monthly=True)
    X, y = data.X[:: args.every], data.y[:: args.every]
    spec = ModelSpec.parse("co2", 1)  # R&W kernel, initial values, log-scale transforms

    def build(p: dict[str, jax.Array]) -> GaussianProcess:
        kernel, noise = spec.build(p)
        return GaussianProcess(kernel, X, noise=noise, mean=float(y.mean()))

    p0 = {k: jnp.asarray(v, jnp.float64) for k, v in spec.init_params().items()}
    res = fit(build, p0, y, transforms=spec.transforms(), steps=args.steps)
    print(res.message)
    print(f"n = {X.shape[0]}, log marginal likelihood {res.log_marginal_likelihood:.4f}")
    for k, v in res.params.items():
        print(f"  {k:22s} {float(v):.5g}")
    post = build(res.params).condition(y)
    Xs = np.array([[2005.0], [2010.0]])
    mean, sd = post.mean(Xs), jnp.sqrt(post.variance(Xs))
    for x, m, s in zip(Xs[:, 0], mean, sd, strict=True):
        print(f"  CO2 at {x:.0f}: {float(m):.1f} +- {2 * float(s):.1f} ppm (2 sigma)")


if __name__ == "__main__":
    main()
