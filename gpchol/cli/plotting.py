"""The plot of a fit (``gpchol-fit.png``): data, posterior mean and a ±2σ band.

Matplotlib is imported (with its non-interactive ``Agg`` backend) only when a plot is
drawn; importing this module costs nothing.

Example:
    >>> import os, tempfile, numpy as np, jax.numpy as jnp
    >>> from gpchol.cli.model import Model
    >>> from gpchol.cli.plotting import plot_fit
    >>> from gpchol.cli.spec import ModelSpec
    >>> X = np.linspace(0.0, 3.0, 8)[:, None]
    >>> m = Model.standardized(ModelSpec.parse("rbf+white", 1), X, np.sin(X[:, 0]), ["t"], "y")
    >>> p = {k: jnp.asarray(v, jnp.float32) for k, v in m.spec.init_params().items()}
    >>> post = m.gp(p, np.float32).condition(jnp.asarray(m.ys(m.y), jnp.float32))
    >>> path = os.path.join(tempfile.mkdtemp(), "fit.png")
    >>> plot_fit(m, post, np.float32, path, extrapolate=0.3)
    >>> open(path, "rb").read(4)
    b'\\x89PNG'
"""

from __future__ import annotations

import io
import sys

import jax.numpy as jnp
import numpy as np

from gpchol import Posterior
from gpchol.cli.files import write_file
from gpchol.cli.model import Model

__all__ = ["plot_fit"]


def plot_fit(
    model: Model,
    post: Posterior,
    dtype: type[np.floating],
    path: str,
    extrapolate: float,
    unit: str = "",
) -> None:
    """Draws the data, the posterior mean and ±2σ (of a new observation) to ``path``.

    Only for one input column (else a note on stderr and no file). The PNG is drawn in
    memory and written atomically with the user's umask (:func:`gpchol.cli.files.write_file`).

    Args:
        model: the model (raw data, standardization, names for the axes).
        post: the posterior given the standardized training data.
        dtype: the dtype the GP runs in.
        path: the PNG file to write.
        extrapolate: how far beyond the last input the curve goes (input units).
        unit: the input's unit, for the title (e.g. ``" years"``).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    X = model.X
    if X.shape[1] != 1:
        print("gpchol: no plot for inputs with more than one column", file=sys.stderr)
        return
    lo, hi = float(X.min()), float(X.max())
    grid = np.linspace(lo, hi + extrapolate, 800)[:, None]
    gs = jnp.asarray(model.xs(grid), dtype)
    mean = np.asarray(post.mean(gs)) * model.y_scale + model.y_shift
    std = np.sqrt(np.asarray(post.variance(gs, include_noise=True))) * model.y_scale
    fig, ax = plt.subplots(figsize=(10, 5))
    ax.plot(X[:, 0], model.y, ".", ms=2.5, color="k", label="data")
    ax.plot(grid[:, 0], mean, color="C0", lw=1.2, label="posterior mean")
    ax.fill_between(grid[:, 0], mean - 2 * std, mean + 2 * std, color="C0", alpha=0.3, label="±2σ")
    ax.axvline(hi, color="gray", lw=0.8, ls="--")
    ax.set_xlabel(model.x_names[0])
    ax.set_ylabel(model.y_name)
    ax.legend(loc="upper left")
    ax.set_title(
        f"gpchol GP fit ({model.spec.spec}), extrapolated {extrapolate:.3g}{unit} beyond the data"
    )
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    write_file(path, buf.getvalue())
