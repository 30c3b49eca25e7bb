"""The plot of a fit (``gpchol-fit.png``): data, posterior mean and a ±2σ band; for the
CO2 model, the posterior of its long-term trend, seasonal cycle and medium-term
irregularities in panels below (R&W 2006, Sec. 5.4.3).

The conditioning on the data and all the curves are one jitted program over the plot's
grid (``GaussianProcess.condition``, then the blocked posterior's ``mean_and_variance``
with ``kernel=`` one additive term): one trace and one compilation per run (tracing and
compiling a program, not running it, is the cost), one pass over the test points per
curve.

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
    >>> path = os.path.join(tempfile.mkdtemp(), "fit.png")
    >>> plot_fit(m, p, np.float32, path, extrapolate=0.3)
    True
    >>> open(path, "rb").read(4)
    b'\\x89PNG'
"""

from __future__ import annotations

import io
import sys
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from gpchol import GaussianProcess
from gpchol._gp.posterior import additive_terms
from gpchol.cli.files import write_file
from gpchol.cli.model import Model

__all__ = ["plot_fit"]

#: The CO2 kernel's terms shown in panels (in the order ModelSpec.build sums them); the
#: fourth, short-term term is noise-like and left out.
_CO2_PANELS = ("long-term trend", "seasonal cycle", "medium-term irregularities")


@partial(jax.jit, static_argnames=("parts",))
def _curves(
    gp: GaussianProcess, y: jax.Array, grid: jax.Array, parts: int
) -> list[tuple[jax.Array, jax.Array]]:
    """``(mean, variance)`` on ``grid`` given ``y``: of a new observation, then of the first
    ``parts`` additive terms of the kernel (one program with the conditioning: traced once
    per grid shape). A covariance that is not positive definite gives NaN curves."""
    post = gp.condition(y)
    out = [post.mean_and_variance(grid, include_noise=True)]
    for term in additive_terms(gp.kernel)[:parts]:
        out.append(post.mean_and_variance(grid, kernel=term))
    return out


def plot_fit(
    model: Model,
    params: dict[str, Any],
    dtype: type[np.floating],
    path: str,
    extrapolate: float,
    unit: str = "",
) -> bool:
    """Draws the data, the posterior mean and ±2σ (of a new observation) to ``path``.

    Only for one input column (else a note on stderr, no file, and ``False``). The PNG is drawn in
    memory and written atomically with the user's umask (:func:`gpchol.cli.files.write_file`).

    Args:
        model: the model (raw data, standardization, names for the axes).
        params: the fitted parameters (as :meth:`Model.gp` takes them); the posterior
            is given the standardized training data.
        dtype: the dtype the GP runs in.
        path: the PNG file to write.
        extrapolate: how far beyond the last input the curve goes (input units).
        unit: the input's unit, for the title (e.g. ``" years"``).

    Returns:
        Whether the plot was drawn and written.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    X = model.X
    if X.shape[1] != 1:
        print("gpchol: no plot for inputs with more than one column", file=sys.stderr)
        return False
    lo, hi = float(X.min()), float(X.max())
    grid = np.linspace(lo, hi + extrapolate, 800)[:, None]
    gs = jnp.asarray(model.xs(grid), dtype)
    names = _CO2_PANELS if model.spec.spec == "co2" else ()
    gp = model.gp(params, dtype)
    ys = jnp.asarray(model.ys(model.y), dtype)
    curves = [tuple(np.asarray(a, np.float64) for a in c) for c in _curves(gp, ys, gs, len(names))]
    mean = curves[0][0] * model.y_scale + model.y_shift
    std = np.sqrt(curves[0][1]) * model.y_scale
    height = 5 + 2.2 * len(names)
    fig, axes = plt.subplots(
        1 + len(names),
        1,
        figsize=(10, height),
        sharex=True,
        gridspec_kw={"height_ratios": [2.3] + [1.0] * len(names)},
        squeeze=False,
    )
    # fixed margins in inches (tight_layout measures every label, a slow step)
    fig.subplots_adjust(
        left=0.09, right=0.98, top=1 - 0.45 / height, bottom=0.55 / height, hspace=0.3
    )
    ax = axes[0, 0]
    ax.plot(X[:, 0], model.y, ".", ms=2.5, color="k", label="data")
    ax.plot(grid[:, 0], mean, color="C0", lw=1.2, label="posterior mean")
    ax.fill_between(grid[:, 0], mean - 2 * std, mean + 2 * std, color="C0", alpha=0.3, label="±2σ")
    ax.axvline(hi, color="gray", lw=0.8, ls="--")
    ax.set_ylabel(model.y_name)
    ax.legend(loc="upper left")
    ax.set_title(
        f"gpchol GP fit ({model.spec.spec}), extrapolated {extrapolate:.3g}{unit} beyond the data"
    )
    for i, name in enumerate(names):
        # the posterior of one additive component given all the data; the trend carries
        # the data's level (the standardization shift), the others vary around zero
        cm = curves[i + 1][0] * model.y_scale + (model.y_shift if i == 0 else 0.0)
        cs = np.sqrt(curves[i + 1][1]) * model.y_scale
        a = axes[i + 1, 0]
        a.plot(grid[:, 0], cm, color=f"C{i + 1}", lw=1.0)
        a.fill_between(grid[:, 0], cm - 2 * cs, cm + 2 * cs, color=f"C{i + 1}", alpha=0.3)
        a.axvline(hi, color="gray", lw=0.8, ls="--")
        a.set_ylabel(model.y_name)
        a.set_title(f"{name} (posterior mean ±2σ)", fontsize=9, loc="left")
    axes[-1, 0].set_xlabel(model.x_names[0])
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    write_file(path, buf.getvalue())
    return True
