"""Writes the notebooks of this folder (without outputs) from the cell lists below.

Run from anywhere: ``python notebooks/build_notebooks.py``. Edit the cells here, not in the
``.ipynb`` files, so that the notebooks stay reviewable as plain Python and are always
stored without outputs. ``python notebooks/build_notebooks.py --check`` exits non-zero
when a stored notebook differs from what this script would write (for CI).

Every notebook reads ``GPCHOL_NOTEBOOK_SMALL`` (``1``: small sizes, used by the test
suite) in its first code cell; the gpchol package itself never reads the environment.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = pathlib.Path(__file__).resolve().parent

SMALL_CELL = """\
import os

# GPCHOL_NOTEBOOK_SMALL=1 selects small sizes (the test suite runs the notebooks so).
SMALL = os.environ.get("GPCHOL_NOTEBOOK_SMALL", "0") not in ("", "0")
print("small sizes" if SMALL else "default sizes")"""


def md(text: str):
    return new_markdown_cell(text.strip("\n"))


def code(text: str):
    return new_code_cell(text.strip("\n"))


# --------------------------------------------------------------------------------------
# 01: quickstart on CO2
# --------------------------------------------------------------------------------------

NB01 = [
    md(r"""
# 01 · Quickstart: an exact GP on the Mauna Loa CO2 record

This notebook fits the classic Rasmussen & Williams (2006, §5.4.3) kernel to the monthly
Mauna Loa CO2 record that ships with gpchol, plots the posterior with a 10-year
extrapolation, and prints the fitted hyperparameters. Every likelihood evaluation
factors the covariance with gpchol's own Cholesky, and every gradient goes through
gpchol's blocked Murray adjoint.

Set `GPCHOL_NOTEBOOK_SMALL=1` to run on a subset with few optimiser steps.
"""),
    code(SMALL_CELL),
    code("""
import time

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np

import gpchol
from gpchol import kernels

jax.config.update("jax_enable_x64", True)  # GP fits want float64; gpchol never sets it
print("gpchol", gpchol.__version__, "| jax", jax.__version__, "|", jax.devices()[0].platform)
"""),
    md("""
## The data

`gpchol.datasets.load("co2", monthly=True)` gives the monthly means (521 months,
1958-2001): `t` in decimal years and `co2` in ppmv. We centre `y` on its mean (the GP has a
zero mean) and, in small mode, keep every eighth month.
"""),
    code("""
data = gpchol.datasets.load("co2", monthly=True)
t = np.asarray(data.columns["t"])
co2 = np.asarray(data.columns["co2"])
if SMALL:
    t, co2 = t[::8], co2[::8]
y_mean = co2.mean()
X = jnp.asarray(t)
y = jnp.asarray(co2 - y_mean)
print(f"n = {t.size} months, {t[0]:.2f} .. {t[-1]:.2f}")

fig, ax = plt.subplots(figsize=(8, 3))
ax.plot(t, co2, ".", ms=2)
ax.set(xlabel="year", ylabel="CO$_2$ [ppmv]", title="Mauna Loa, monthly means")
plt.show()
"""),
    md(r"""
## The Rasmussen & Williams kernel

$$
k = \underbrace{\theta_1^2\,\mathrm{SE}(\ell_1)}_{\text{long-term trend}}
 + \underbrace{\theta_2^2\,\mathrm{SE}(\ell_2)\,\mathrm{Per}(p, \ell_3)}_{\text{seasonal}}
 + \underbrace{\theta_4^2\,\mathrm{RQ}(\ell_4, \alpha)}_{\text{medium-term}}
 + \underbrace{\theta_5^2\,\mathrm{SE}(\ell_5)}_{\text{short-term}}
$$

plus white observation noise. Kernels are small pytrees: `a * k` scales by a learnable
amplitude, `+` and `*` combine. The parameters live in one dict; `build` maps the dict to a
`gpchol.GaussianProcess`, and `gpchol.fit` optimises it in an unconstrained space
(every parameter here goes through `gpchol.Positive`, a softplus).
"""),
    code("""
def make_kernel(p):
    return (
        p["a_long"] * kernels.ExpSquared(p["l_long"])
        + p["a_seas"] * kernels.ExpSquared(p["l_decay"]) * kernels.Periodic(p["l_per"], p["period"])
        + p["a_med"] * kernels.RationalQuadratic(p["l_med"], p["alpha"])
        + p["a_short"] * kernels.ExpSquared(p["l_short"])
    )


def build(p):
    return gpchol.GaussianProcess(make_kernel(p), X, noise=p["noise"])


# A starting point on the scales of R&W's fitted values (amplitudes are variances here).
p0 = {
    "a_long": 50.0**2, "l_long": 50.0,
    "a_seas": 2.0**2, "l_decay": 100.0, "l_per": 1.0, "period": 1.0,
    "a_med": 0.5**2, "l_med": 1.0, "alpha": 1.0,
    "a_short": 0.1**2, "l_short": 0.1,
    "noise": 0.1**2,
}
p0 = {k: jnp.asarray(v, jnp.float64) for k, v in p0.items()}
transforms = {k: gpchol.Positive() for k in p0}
lml = jax.jit(lambda p: build(p).log_marginal_likelihood(y))
print("initial log marginal likelihood:", float(lml(p0)))
"""),
    md("""
## Fit

L-BFGS (`optax.lbfgs` with its line search) on the negative log marginal likelihood.
`gpchol.fit` jits one step (loss, gradient through the Cholesky adjoint, update), stops on
tolerance, and never keeps a non-finite step.
"""),
    code("""
steps = 10 if SMALL else 60
start = time.perf_counter()
result = gpchol.fit(build, p0, y, transforms=transforms, optimizer="lbfgs", steps=steps,
                    progress=False)
print(result)
print(f"fit time {time.perf_counter() - start:.1f} s, {result.n_steps} steps")
print(f"log marginal likelihood: {result.log_marginal_likelihood:.3f}")
p = result.params

fig, ax = plt.subplots(figsize=(6, 2.5))
ax.plot(result.history)
ax.set(xlabel="step", ylabel="-log p(y)", title="optimisation history")
plt.show()
"""),
    md("## Fitted hyperparameters (in readable units)"),
    code("""
def sd(name):
    return float(jnp.sqrt(p[name]))


rows = [
    ("long-term amplitude [ppm]", sd("a_long")),
    ("long-term lengthscale [yr]", float(p["l_long"])),
    ("seasonal amplitude [ppm]", sd("a_seas")),
    ("seasonal decay [yr]", float(p["l_decay"])),
    ("periodic lengthscale", float(p["l_per"])),
    ("period [yr]", float(p["period"])),
    ("medium-term amplitude [ppm]", sd("a_med")),
    ("medium-term lengthscale [yr]", float(p["l_med"])),
    ("RQ shape alpha", float(p["alpha"])),
    ("short-term amplitude [ppm]", sd("a_short")),
    ("short-term lengthscale [yr]", float(p["l_short"])),
    ("noise std [ppm]", sd("noise")),
]
for name, value in rows:
    print(f"{name:30s} {value:10.4g}")
"""),
    md("""
## Posterior and a 10-year extrapolation

`gp.condition(y)` factors once and returns a posterior whose `mean` and `variance` can be
evaluated anywhere. The band is the mean ± 2 standard deviations of the latent function.
"""),
    code("""
@jax.jit
def predict(p, ts):
    post = build(p).condition(y)
    return post.mean(ts), post.variance(ts)


ts = jnp.linspace(t[0], t[-1] + 10.0, 400 if SMALL else 1000)
mu, var = predict(p, ts)
mu = np.asarray(mu) + y_mean
sd_f = np.sqrt(np.asarray(var))
ts = np.asarray(ts)

fig, ax = plt.subplots(figsize=(9, 4))
ax.plot(t, co2, ".", ms=2, color="k", label="monthly means")
ax.plot(ts, mu, color="C0", lw=1, label="posterior mean")
ax.fill_between(ts, mu - 2 * sd_f, mu + 2 * sd_f, color="C0", alpha=0.3, label="±2σ")
ax.axvline(t[-1], color="gray", ls=":", lw=1)
ax.set(xlabel="year", ylabel="CO$_2$ [ppmv]", title="GP fit with 10-year extrapolation")
ax.legend(loc="upper left")
plt.show()

inset = ts > t[-1] - 3
fig, ax = plt.subplots(figsize=(9, 3))
ax.plot(t[t > t[-1] - 3], co2[t > t[-1] - 3], ".", color="k")
ax.plot(ts[inset], mu[inset], color="C0")
ax.fill_between(ts[inset], (mu - 2 * sd_f)[inset], (mu + 2 * sd_f)[inset], alpha=0.3)
ax.set(xlabel="year", ylabel="CO$_2$ [ppmv]", title="the extrapolation, close up")
plt.show()
"""),
    md("""
## Comparison with scikit-learn (if installed)

The same kernel family in scikit-learn's `GaussianProcessRegressor`, started from the same
point and optimised by its own L-BFGS-B (no restarts), on the same centred data. Both log
marginal likelihoods are of the same model family on the same `y`, so they can be compared
directly (higher is better). scikit-learn gets a comparable budget of iterations (10 in
small mode, 100 by default); raise both for converged fits.
"""),
    code("""
try:
    from sklearn.gaussian_process import GaussianProcessRegressor
    from sklearn.gaussian_process.kernels import RBF, ExpSineSquared, RationalQuadratic, WhiteKernel
    from sklearn.gaussian_process.kernels import ConstantKernel as C
except ImportError:
    print("scikit-learn is not installed: skipping the comparison")
else:
    def v(name):
        return float(p0[name])

    k_sk = (
        C(v("a_long")) * RBF(v("l_long"))
        + C(v("a_seas")) * RBF(v("l_decay")) * ExpSineSquared(v("l_per"), v("period"))
        + C(v("a_med")) * RationalQuadratic(v("l_med"), v("alpha"))
        + C(v("a_short")) * RBF(v("l_short"))
        + WhiteKernel(v("noise"))
    )
    # gpchol's Periodic, exp(-2 sin^2(pi r / p) / l^2), is scikit-learn's ExpSineSquared;
    # ConstantKernel's value is a variance, like the amplitudes here.

    def optimizer(obj_func, initial_theta, bounds):
        from scipy.optimize import minimize

        res = minimize(obj_func, initial_theta, method="L-BFGS-B", jac=True, bounds=bounds,
                       options={"maxiter": 10 if SMALL else 100})
        return res.x, res.fun

    start = time.perf_counter()
    sk = GaussianProcessRegressor(k_sk, optimizer=optimizer, normalize_y=False)
    sk.fit(t[:, None], np.asarray(y))
    sk_time = time.perf_counter() - start
    sk_lml = sk.log_marginal_likelihood_value_
    print(f"scikit-learn: LML {sk_lml:.3f} ({sk_time:.1f} s)")
    print(f"gpchol      : LML {result.log_marginal_likelihood:.3f}")
    print("scikit-learn's fitted kernel:", sk.kernel_)

    # Cross-check of the model: gpchol's LML at scikit-learn's optimum equals scikit-learn's.
    sk_params = sk.kernel_.get_params()
    where = {
        "a_long": "k1__k1__k1__k1__k1__constant_value",
        "l_long": "k1__k1__k1__k1__k2__length_scale",
        "a_seas": "k1__k1__k1__k2__k1__k1__constant_value",
        "l_decay": "k1__k1__k1__k2__k1__k2__length_scale",
        "l_per": "k1__k1__k1__k2__k2__length_scale",
        "period": "k1__k1__k1__k2__k2__periodicity",
        "a_med": "k1__k1__k2__k1__constant_value",
        "l_med": "k1__k1__k2__k2__length_scale",
        "alpha": "k1__k1__k2__k2__alpha",
        "a_short": "k1__k2__k1__constant_value",
        "l_short": "k1__k2__k2__length_scale",
        "noise": "k2__noise_level",
    }
    p_sk = {k: jnp.asarray(sk_params[name], jnp.float64) for k, name in where.items()}
    lml_at_sk = float(lml(p_sk))
    print(f"gpchol's LML at scikit-learn's optimum: {lml_at_sk:.3f} (scikit-learn: {sk_lml:.3f})")
"""),
]


# --------------------------------------------------------------------------------------
# 02: the differentiable Cholesky
# --------------------------------------------------------------------------------------

NB02 = [
    md(r"""
# 02 · The differentiable Cholesky: Murray's adjoint

Every step of a Gaussian-process fit needs a Cholesky factor $K = LL^\top$ **and** its
gradient. gpchol computes the factor with its own tiled algorithm and differentiates it
with rules written by hand, keeping only $L$ between the forward and the reverse pass.
This notebook states the rules, checks them against finite differences and against JAX's
own rule, and measures what they buy: the cost of the gradient relative to the forward
pass, for gpchol and for `jnp.linalg.cholesky` + JAX autodiff.
"""),
    code(SMALL_CELL),
    code("""
import math
import time

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
from jax.test_util import check_grads

import gpchol

jax.config.update("jax_enable_x64", True)
rng = np.random.default_rng(0)


def random_spd(n):
    m = rng.standard_normal((n, n))
    return jnp.asarray(m @ m.T / n + np.eye(n))
"""),
    md(r"""
## The rules

Write $\Phi(X)$ for the lower triangle of $X$ with its diagonal halved, and
$\Sigma = LL^\top$.

**Forward mode** (a tangent $\dot\Sigma$ to a tangent $\dot L$):

$$\dot L = L\,\Phi\!\left(L^{-1}\dot\Sigma L^{-\top}\right).$$

**Reverse mode** (Murray 2016, [arXiv:1602.07527](https://arxiv.org/abs/1602.07527)), from
the cotangent $\bar L$ to the cotangent $\bar\Sigma$:

$$P = \Phi(L^\top \bar L), \qquad
\bar\Sigma_{\mathrm{low}} = \Phi\!\left(L^{-\top}(P + P^\top)L^{-1}\right), \qquad
G = \tfrac12\left(\bar\Sigma_{\mathrm{low}} + \bar\Sigma_{\mathrm{low}}^\top\right).$$

$G$ is the symmetric gradient, the one `jax.grad` returns through `jnp.linalg.cholesky`
(which symmetrizes its input).

**Blocked reverse** (what gpchol runs; level-3 BLAS). Walk the block columns $j{:}k$ of
width $N_B$ from the last to the first, with $R = L_{j:k,\,:j}$, $D = L_{j:k,\,j:k}$,
$B = L_{k:,\,:j}$, $C = L_{k:,\,j:k}$ and the same names barred for the gradient being
accumulated in place:

1. $\bar C \leftarrow \bar C D^{-1}$ (TRSM)
2. $\bar B \leftarrow \bar B - \bar C R$ (GEMM)
3. $\bar D \leftarrow \mathrm{tril}(\bar D) - \mathrm{tril}(\bar C^\top C)$
4. $\bar D \leftarrow$ the symbolic rule above on the $N_B\times N_B$ block
5. $\bar R \leftarrow \bar R - \bar C^\top B - (\bar D + \bar D^\top) R$

That costs about $2n^3/3$ flops, twice the forward factorization ($n^3/3$). JAX's default
reverse pass transposes the forward-mode rule with two full triangular solves, about
$4n^3$ flops, and the whole log-likelihood gradient ends up near $8\times$ its forward time.

For a Gaussian log-likelihood there is a shortcut too: with $\alpha = K^{-1}(y-\mu)$,
$\partial \log p/\partial K = \tfrac12(\alpha\alpha^\top - K^{-1})$.
"""),
    md(r"""
## The symbolic rule in five lines of NumPy

A direct transcription of the formulas, compared with the reverse pass of
`gpchol.cholesky` for a random cotangent $\bar L$:
"""),
    code("""
from scipy.linalg import solve_triangular


def phi(x):
    return np.tril(x) - 0.5 * np.diag(np.diag(x))


def murray_symbolic(L, Lbar):
    P = phi(L.T @ np.tril(Lbar))
    S = solve_triangular(L, P + P.T, lower=True, trans="T")  # L^-T (P + P^T)
    S = solve_triangular(L, S.T, lower=True, trans="T").T   # ... L^-1
    low = phi(S)
    return 0.5 * (low + low.T)


n = 12 if SMALL else 40
A = random_spd(n)
Lbar = jnp.asarray(np.tril(rng.standard_normal((n, n))))
L, vjp = jax.vjp(gpchol.cholesky, A)
(G_gpchol,) = vjp(Lbar)
G_numpy = murray_symbolic(np.asarray(L), np.asarray(Lbar))
_, vjp_jax = jax.vjp(jnp.linalg.cholesky, A)
(G_jax,) = vjp_jax(Lbar)
print("max |gpchol - NumPy formula|:", float(jnp.max(jnp.abs(G_gpchol - G_numpy))))
print("max |gpchol - JAX's rule|   :", float(jnp.max(jnp.abs(G_gpchol - G_jax))))
"""),
    md(r"""
## Finite differences

`jax.test_util.check_grads` compares forward and reverse mode with central finite
differences in random directions (float64). The function is a scalar of the factor, on a
matrix large enough to use several tiles (`tile_size=8`), so the *blocked* adjoint is
the one checked. Then one directional derivative by hand, for a symmetric direction $E$:
$\big(f(A + hE) - f(A - hE)\big)/2h \approx \langle \nabla f(A), E\rangle$.
"""),
    code("""
n = 24 if SMALL else 64
A = random_spd(n)
W = jnp.asarray(rng.standard_normal((n, n)))


@jax.jit
def f(A):
    L = gpchol.cholesky(A, tile_size=8)
    return jnp.sum(W * L) + jnp.sum(jnp.log(jnp.diag(L)))


check_grads(f, (A,), order=1, modes=("fwd", "rev"), atol=1e-6, rtol=1e-6)
print("check_grads: forward and reverse mode agree with finite differences")

E = rng.standard_normal((n, n))
E = jnp.asarray((E + E.T) / 2)
grad = jax.jit(jax.grad(f))(A)
for h in (1e-2, 1e-3, 1e-4, 1e-5):
    fd = (f(A + h * E) - f(A - h * E)) / (2 * h)
    exact = jnp.vdot(grad, E)
    print(f"h = {h:.0e}: finite difference {float(fd): .12f}  <grad, E> {float(exact): .12f}"
          f"  difference {float(abs(fd - exact)):.1e}")
"""),
    md(r"""
## What it buys: gradient time over forward time, measured live

For each $n$ we time, jitted and after a warm-up run, the Gaussian log-likelihood
$\log\mathcal N(y\mid 0, K)$ (forward) and its value and gradient with respect to $K$
(reverse), once through `gpchol.mvn_logpdf` and once through `jnp.linalg.cholesky` +
`jax.scipy.linalg.solve_triangular` with JAX's default derivative rules. The best of a
few runs is kept (the fastest: the least disturbed). The CPU here is shared, so expect
noise; the ratio within one implementation is the robust figure.
"""),
    code("""
def loglik_jax(y, K):
    L = jnp.linalg.cholesky(K)
    z = jax.scipy.linalg.solve_triangular(L, y, lower=True)
    return -0.5 * z @ z - jnp.sum(jnp.log(jnp.diag(L))) - 0.5 * y.size * math.log(2 * math.pi)


def loglik_gpchol(y, K):
    return gpchol.mvn_logpdf(y, 0.0, K)


def best_time(fn, *args, repeats):
    jax.block_until_ready(fn(*args))  # compile + warm up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t0)
    return min(times)  # the least disturbed run: robust on a shared machine


sizes = [64, 128, 256] if SMALL else [200, 400, 700, 1000]
repeats = 5 if SMALL else 7
rows = []
for n in sizes:
    K = random_spd(n)
    y = jnp.asarray(rng.standard_normal(n))
    row, grads = {"n": n}, {}
    for name, fn in (("gpchol", loglik_gpchol), ("jax", loglik_jax)):
        fwd = jax.jit(fn)
        vg = jax.jit(jax.value_and_grad(fn, argnums=1))
        row[name + "_fwd"] = best_time(fwd, y, K, repeats=repeats)
        row[name + "_grad"] = best_time(vg, y, K, repeats=repeats)
        grads[name] = vg(y, K)[1]
    # the two gradients are the same number
    row["max_diff"] = float(jnp.max(jnp.abs(grads["gpchol"] - grads["jax"])))
    rows.append(row)
    ms = {k: v * 1e3 for k, v in row.items() if k.endswith(("_fwd", "_grad"))}
    print(f"n={n:5d}  gpchol fwd {ms['gpchol_fwd']:7.2f} ms  grad {ms['gpchol_grad']:7.2f} ms"
          f"  | jax fwd {ms['jax_fwd']:7.2f} ms  grad {ms['jax_grad']:7.2f} ms"
          f"  | max |g_gpchol - g_jax| {row['max_diff']:.1e}")
"""),
    code("""
ns = np.array([r["n"] for r in rows])
ratio_g = np.array([r["gpchol_grad"] / r["gpchol_fwd"] for r in rows])
ratio_j = np.array([r["jax_grad"] / r["jax_fwd"] for r in rows])
speedup = np.array([r["jax_grad"] / r["gpchol_grad"] for r in rows])

fig, axes = plt.subplots(1, 2, figsize=(11, 4))
ax = axes[0]
ax.plot(ns, ratio_g, "o-", label="gpchol (Murray blocked adjoint)")
ax.plot(ns, ratio_j, "s-", label="jnp.linalg.cholesky + JAX autodiff")
ax.set(xlabel="n", ylabel="value-and-gradient time / forward time",
       title="cost of the gradient, relative to the forward pass")
ax.set_ylim(bottom=0)
ax.legend()
ax = axes[1]
ax.loglog(ns, [r["gpchol_grad"] for r in rows], "o-", label="gpchol value-and-gradient")
ax.loglog(ns, [r["jax_grad"] for r in rows], "s-", label="JAX default value-and-gradient")
ax.loglog(ns, [r["jax_fwd"] for r in rows], "^--", label="forward (jnp.linalg.cholesky)")
ax.set(xlabel="n", ylabel="seconds", title="absolute times (best of runs)")
ax.legend()
plt.tight_layout()
plt.show()
for n, a, b, s in zip(ns, ratio_g, ratio_j, speedup, strict=True):
    print(f"n={n:5d}: grad/fwd gpchol {a:4.1f}x, JAX {b:4.1f}x;"
          f" JAX's value-and-gradient time / gpchol's: {s:4.1f}")
"""),
    md(r"""
At small $n$ the fixed per-call overheads dominate and the ratios are close; as $n$ grows
the $n^3$ terms take over and the ratios approach the flop counts above (about 3× for
gpchol, 8× or more for JAX's default rule).
"""),
]


# --------------------------------------------------------------------------------------
# 03: NumPyro
# --------------------------------------------------------------------------------------

NB03 = [
    md(r"""
# 03 · Bayesian hyperparameters with NumPyro and NUTS

Instead of fitting point estimates, put priors on the kernel hyperparameters and sample
their posterior with NUTS. Each leapfrog step evaluates a Gaussian log-density and its
gradient, so the gradient's cost is the sampler's cost; `gpchol.numpyro` provides
distributions whose factor is gpchol's and whose gradient is gpchol's Murray adjoint.

Data: a subset of the diamonds data set, log price against carat.
"""),
    code(SMALL_CELL),
    code("""
import time

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.infer import MCMC, NUTS

import gpchol
import gpchol.numpyro as gnp
from gpchol import kernels

jax.config.update("jax_enable_x64", True)
"""),
    md("""
## Data

A random subset of the diamonds (53,940 rows): `x` = carat, `y` = log10 price,
standardised.
"""),
    code("""
d = gpchol.datasets.load("diamonds")
names = list(d.feature_names)
carat = np.asarray(d.X[:, names.index("carat")])
logprice = np.log10(np.asarray(d.y))
n = 30 if SMALL else 100
idx = np.random.default_rng(1).choice(carat.size, n, replace=False)
x_raw, y_raw = carat[idx], logprice[idx]
x_mu, x_sd, y_mu, y_sd = x_raw.mean(), x_raw.std(), y_raw.mean(), y_raw.std()
X = jnp.asarray((x_raw - x_mu) / x_sd)
y = jnp.asarray((y_raw - y_mu) / y_sd)

fig, ax = plt.subplots(figsize=(6, 3.5))
ax.plot(x_raw, y_raw, ".", ms=4)
ax.set(xlabel="carat", ylabel="log10 price [USD]", title=f"{n} diamonds")
plt.show()
"""),
    md(r"""
## The model

$$
\sigma_f \sim \mathrm{LogNormal}(0, 1),\quad
\ell \sim \mathrm{LogNormal}(0, 1),\quad
\sigma_n \sim \mathrm{LogNormal}(-2, 1),\quad
y \mid \cdot \sim \mathcal N\!\left(0,\ \sigma_f^2 k_\ell(X, X) + \sigma_n^2 I\right)
$$

with $k_\ell$ a Matérn-5/2 kernel. `gnp.GaussianProcessMarginal(kernel, X, noise=...)` is
the marginal of the GP at `X`; it is a real NumPyro distribution, so it goes straight into
`numpyro.sample(..., obs=y)`. If a factorization fails inside the sampler, its
`log_prob` is `-inf` (the step is rejected), never NaN.
"""),
    code("""
def model(X, y=None):
    amp = numpyro.sample("amp", dist.LogNormal(0.0, 1.0))
    ls = numpyro.sample("lengthscale", dist.LogNormal(0.0, 1.0))
    noise = numpyro.sample("noise_sd", dist.LogNormal(-2.0, 1.0))
    k = amp**2 * kernels.Matern52(ls)
    numpyro.sample("y", gnp.GaussianProcessMarginal(k, X, noise=noise**2), obs=y)
"""),
    md("## NUTS"),
    code("""
warmup, samples = (75, 75) if SMALL else (200, 200)
mcmc = MCMC(NUTS(model), num_warmup=warmup, num_samples=samples, num_chains=1,
            progress_bar=False)
start = time.perf_counter()
mcmc.run(jax.random.PRNGKey(0), X, y)
print(f"NUTS: {warmup} warm-up + {samples} samples in {time.perf_counter() - start:.1f} s")
mcmc.print_summary()
post = mcmc.get_samples()
"""),
    md("## Trace and posterior plots"),
    code("""
names = ["amp", "lengthscale", "noise_sd"]
fig, axes = plt.subplots(len(names), 2, figsize=(10, 2.2 * len(names)))
for i, name in enumerate(names):
    s = np.asarray(post[name])
    axes[i, 0].plot(s, lw=0.6)
    axes[i, 0].set(ylabel=name, xlabel="draw" if i == len(names) - 1 else None)
    axes[i, 1].hist(s, bins=30, density=True, alpha=0.7)
    axes[i, 1].axvline(np.median(s), color="k", lw=1)
    axes[i, 1].set(xlabel=name)
axes[0, 0].set_title("trace")
axes[0, 1].set_title("posterior")
plt.tight_layout()
plt.show()
"""),
    md(r"""
## Posterior predictive

For a thinned set of posterior draws, condition the GP on the data
(`gpchol.GaussianProcess(...).condition(y)`) and draw one latent function plus noise at a
grid of inputs; the quantiles over draws give the posterior predictive band, which
integrates over the hyperparameter uncertainty.
"""),
    code("""
xs = jnp.linspace(X.min() - 0.3, X.max() + 0.3, 100)
key = jax.random.PRNGKey(1)
n_draws = 20 if SMALL else 100
take = np.linspace(0, samples - 1, n_draws).astype(int)


@jax.jit
def predictive_draw(key, amp, ls, noise_sd):
    gp = gpchol.GaussianProcess(amp**2 * kernels.Matern52(ls), X, noise=noise_sd**2)
    cond = gp.condition(y)
    mean = cond.mean(xs)
    sd = jnp.sqrt(cond.variance(xs) + noise_sd**2)
    return mean + sd * jax.random.normal(key, mean.shape), mean


keys = jax.random.split(key, n_draws)
draws, means = [], []
for k, i in zip(keys, take, strict=True):
    d_, m_ = predictive_draw(k, post["amp"][i], post["lengthscale"][i], post["noise_sd"][i])
    draws.append(np.asarray(d_))
    means.append(np.asarray(m_))
draws, means = np.array(draws), np.array(means)

to_x = np.asarray(xs) * x_sd + x_mu
lo, hi = np.quantile(draws, [0.05, 0.95], axis=0) * y_sd + y_mu
fig, ax = plt.subplots(figsize=(7, 4))
ax.fill_between(to_x, lo, hi, alpha=0.3, label="90% posterior predictive")
for m_ in means[:10]:
    ax.plot(to_x, m_ * y_sd + y_mu, color="C0", lw=0.5, alpha=0.6)
ax.plot(x_raw, y_raw, "k.", ms=4, label="data")
ax.set(xlabel="carat", ylabel="log10 price [USD]", title="posterior predictive")
ax.legend()
plt.show()
"""),
]


# --------------------------------------------------------------------------------------
# 04: sharded
# --------------------------------------------------------------------------------------

NB04 = [
    md(r"""
# 04 · A sharded Cholesky and an exact GP whose covariance never sits on one device

JAX can pretend that the CPU is several devices. That is how this notebook shows, on a
laptop, what gpchol does on a multi-GPU machine or a cluster: factor a matrix that is
split over a 2×4 mesh of devices, each holding one block, without ever gathering it.

**The first cell must run before JAX is imported.** `XLA_FLAGS` is read once, when JAX's
CPU backend starts; `--xla_force_host_platform_device_count=8` makes it expose 8 CPU
devices. (Restart the kernel if you imported JAX already.) The 8 devices share this
machine's cores, so wall times here say nothing about real multi-device speed; memory
per device does.
"""),
    code("""
import os

flag = "--xla_force_host_platform_device_count=8"
if flag not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + flag).strip()

# GPCHOL_NOTEBOOK_SMALL=1 selects small sizes (the test suite runs the notebooks so).
SMALL = os.environ.get("GPCHOL_NOTEBOOK_SMALL", "0") not in ("", "0")
print("small sizes" if SMALL else "default sizes")
"""),
    code("""
import time

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import gpchol
from gpchol import distributed as gd
from gpchol import kernels

jax.config.update("jax_enable_x64", True)
print(len(jax.devices()), "devices:", jax.devices())
assert len(jax.devices()) == 8, "restart the kernel: JAX was imported before XLA_FLAGS was set"

mesh = jax.make_mesh((2, 4), ("r", "c"))
print(mesh)
"""),
    md(r"""
## A sharded matrix

`NamedSharding(mesh, P("r", "c"))`: rows split over the 2 devices of axis `r`, columns over
the 4 of axis `c`, so each device holds one $n/2 \times n/4$ block, $1/8$ of the matrix.
"""),
    code("""
n = 128 if SMALL else 1024
T_A = 16 if SMALL else 64
rng = np.random.default_rng(0)
m = rng.standard_normal((n, n))
A_host = m @ m.T / n + np.eye(n)
sharding = NamedSharding(mesh, P("r", "c"))
A = jax.device_put(A_host, sharding)
jax.debug.visualize_array_sharding(A)
for shard in A.addressable_shards[:3]:
    kib = shard.data.nbytes / 2**10
    print(shard.device, "holds", shard.index, shard.data.shape, f"{kib:.0f} KiB")
print(f"the whole matrix: {A.nbytes / 2**10:.0f} KiB; one block: {A.nbytes / 8 / 2**10:.0f} KiB")
"""),
    md("""
## Entry point 1: `potrf`, jitted for you

`gd.potrf(a, T_A, mesh)` returns the lower factor with `a`'s sharding. It donates `a`
(its buffer becomes the work buffer) unless `donate=False`. `T_A` is the tile size of the
2D block-cyclic layout used inside.
"""),
    code("""
L, status = gd.potrf(A, T_A, mesh, donate=False, return_status=True)
print("status", int(status), "| sharding of L:", L.sharding.spec)
L_ref = np.linalg.cholesky(A_host)
print("max |L - numpy|:", float(np.max(np.abs(np.asarray(L) - L_ref))))

A_donated = jax.device_put(A_host, sharding)
L2 = gd.potrf(A_donated, T_A, mesh)  # donate=True (default): A_donated's buffer is reused
print("input deleted after donation:", A_donated.is_deleted())
"""),
    md("""
## Entry point 2: `potrf_jit_ctx`, inside your own `jax.jit`

For when the factorization is one step of a larger jitted function; here the
log-determinant and a solve follow it in the same program.
"""),
    code("""
@jax.jit
def logdet_and_solve(a, b):
    L, status = gd.potrf_jit_ctx(a, T_A)
    x = gd.potrs_jit_ctx(L, b, T_A)
    return gd.logdet_jit_ctx(L), x, status


b = jnp.asarray(rng.standard_normal(n))
ld, x, status = logdet_and_solve(A, b)
print("status", int(status))
print("logdet:", float(ld), " numpy:", np.linalg.slogdet(A_host)[1])
print("max |A x - b|:", float(np.max(np.abs(A_host @ np.asarray(x) - np.asarray(b)))))
"""),
    md("""
## Entry point 3: `potrf_shardmap_ctx`, inside your own `jax.shard_map`

Inside `shard_map` each device sees only its local block; the collectives run over the
mesh axes you name.
"""),
    code("""
def per_device(a_block):
    L_block, status = gd.potrf_shardmap_ctx(a_block, T_A, "r", "c")
    return L_block, status


f = jax.jit(jax.shard_map(per_device, mesh=mesh, in_specs=P("r", "c"),
                          out_specs=(P("r", "c"), P())))
L3, status = f(A)
print("status", int(status), "| local block shape on each device:",
      L3.addressable_shards[0].data.shape)
print("max |L3 - L|:", float(jnp.max(jnp.abs(L3 - L))))
"""),
    md(r"""
## Gradients

The sharded factor is differentiable: reverse mode runs Murray's blocked adjoint on the
same sharded tiles. The gradient of the log-determinant with respect to $A$ is $A^{-1}$:
"""),
    code("""
def logdet_of(a):
    return gd.logdet(gd.potrf(a, T_A, mesh, donate=False), mesh)


G = jax.jit(jax.grad(logdet_of))(A)
print("gradient sharding:", G.sharding.spec)
print("max |grad - inv(A)|:", float(np.max(np.abs(np.asarray(G) - np.linalg.inv(A_host)))))
"""),
    md(r"""
## An exact GP on diamonds whose covariance never sits on one device

`gd.gaussian_log_likelihood(kernel_fn, params, X, y, noise, mesh, T_A)` builds the
covariance tile by tile on the device that owns each tile (from the small, replicated
`X`), factors it on the mesh, and returns the log marginal likelihood and the Cholesky
status; its gradient with respect to the kernel parameters comes back the same way. No
device ever holds the $n\times n$ matrix.
"""),
    code("""
d = gpchol.datasets.load("diamonds")
names = list(d.feature_names)
cols = [names.index(c) for c in ("carat", "depth", "table")]
n_gp = n  # the same size as above, so the compiled factorization is reused
idx = np.random.default_rng(2).choice(d.X.shape[0], n_gp, replace=False)
Xd = np.asarray(d.X[idx][:, cols])
Xd = (Xd - Xd.mean(0)) / Xd.std(0)
yd = np.log10(np.asarray(d.y[idx]))
yd = (yd - yd.mean()) / yd.std()
Xd, yd = jnp.asarray(Xd), jnp.asarray(yd)


def kernel_fn(params, X1, X2):
    return params["amp"] * kernels.ExpSquared(params["ls"])(X1, X2)


params = {"amp": jnp.asarray(1.0), "ls": jnp.asarray([1.0, 1.0, 1.0])}
noise = 0.05


def loss(params):
    value, _status = gd.gaussian_log_likelihood(kernel_fn, params, Xd, yd, noise, mesh, T_A)
    return -value


value_and_grad = jax.jit(jax.value_and_grad(loss))
start = time.perf_counter()
value, grads = value_and_grad(params)
elapsed = time.perf_counter() - start
print(f"n = {n_gp}: -log p(y) = {float(value):.3f} ({elapsed:.1f} s, compilation included)")
print("gradient:", jax.tree_util.tree_map(lambda g: np.round(np.asarray(g), 4), grads))


# Reference on one device (fine at this size; it is what the sharded path avoids).
@jax.jit
def single_device(params):
    k = params["amp"] * kernels.ExpSquared(params["ls"])
    return -gpchol.GaussianProcess(k, Xd, noise=noise).log_marginal_likelihood(yd)


print("single-device -log p(y):", float(single_device(params)))
"""),
    md(r"""
A few steps of gradient descent on the sharded likelihood: Adam on the logarithms of
the parameters, reusing the compiled value-and-gradient above (by the chain rule,
$\partial/\partial\log\theta = \theta\,\partial/\partial\theta$).
"""),
    code("""
import optax

opt = optax.adam(0.1)
u = jax.tree_util.tree_map(jnp.log, params)
state = opt.init(u)
history = []
for _ in range(2 if SMALL else 3):
    theta = jax.tree_util.tree_map(jnp.exp, u)
    val, g = value_and_grad(theta)
    g_u = jax.tree_util.tree_map(lambda gi, ti: gi * ti, g, theta)
    upd, state = opt.update(g_u, state)
    u = optax.apply_updates(u, upd)
    history.append(float(val))
fitted = jax.tree_util.tree_map(jnp.exp, u)
print("fitted:", jax.tree_util.tree_map(lambda v: np.round(np.asarray(v), 3), fitted))
fig, ax = plt.subplots(figsize=(5, 3))
ax.plot(history, "o-")
ax.set(xlabel="step", ylabel="-log p(y)", title="sharded exact GP, Adam")
plt.show()
"""),
    md(r"""
## Memory per device

Two views. First, the bytes of each device's shard of the factor, for a covariance
assembled block by block with `jax.make_array_from_callback` (each block computed for,
and placed on, its own device). Second, XLA's own accounting of two compiled programs,
per device: the factorization alone, and the likelihood with its gradient (arguments,
outputs and temporaries, i.e. the work space XLA allocates). Both are set against the
$8n^2$ bytes of the whole float64 covariance and the $8n^2/8$ bytes of one block.
"""),
    code("""
mib = 2**20
whole = n_gp * n_gp * 8
one_block = whole / len(mesh.devices.flat)


def block(index):  # one device's block of K, built from X alone
    rows, cols = np.arange(n_gp)[index[0]], np.arange(n_gp)[index[1]]
    K = kernel_fn(fitted, Xd[rows], Xd[cols])
    return np.asarray(K + noise * (rows[:, None] == cols[None, :]))


K_sharded = jax.make_array_from_callback((n_gp, n_gp), NamedSharding(mesh, P("r", "c")), block)
factor_only = jax.jit(lambda a: gd.potrf_jit_ctx(a, T_A)).lower(K_sharded).compile()
L_gp = gd.potrf(K_sharded, T_A, mesh)
per_dev = {str(s.device): s.data.nbytes for s in L_gp.addressable_shards}
print(f"whole covariance: {whole / mib:.3f} MiB, one block: {one_block / mib:.3f} MiB")
for dev, nbytes in per_dev.items():
    print(f"  {dev}: factor shard {nbytes / mib:.3f} MiB ({nbytes / whole:.1%} of the whole)")

temps = {}
for name, prog in (("factorization", factor_only),
                   ("likelihood + gradient", value_and_grad.lower(params).compile())):
    mem = prog.memory_analysis()
    if mem is None:
        print(f"{name}: memory_analysis() is not available on this backend")
        continue
    temps[name] = mem.temp_size_in_bytes
    print(f"compiled {name}, per device: arguments {mem.argument_size_in_bytes / mib:.3f} MiB,"
          f" outputs {mem.output_size_in_bytes / mib:.3f} MiB,"
          f" temporaries {mem.temp_size_in_bytes / mib:.3f} MiB"
          f" = {mem.temp_size_in_bytes / one_block:.1f} blocks"
          f" = {mem.temp_size_in_bytes / whole:.0%} of the whole matrix")

fig, ax = plt.subplots(figsize=(8, 3))
labels = [f"dev {i}" for i in range(len(per_dev))]
ax.bar(labels, [v / mib for v in per_dev.values()], label="factor shard")
ax.axhline(whole / mib, color="r", ls="--", label="whole n×n matrix")
for (name, temp), style in zip(temps.items(), (":", "-."), strict=False):
    ax.axhline(temp / mib, color="k", ls=style, label=f"temporaries: {name}")
ax.set(ylabel="MiB", title=f"per-device memory, n = {n_gp}, 2×4 mesh")
ax.legend(fontsize=8)
plt.show()
"""),
    md(r"""
The factor shards are exactly $1/8$ of the matrix, and the factorization's work space is
a few blocks. The temporaries of the likelihood-and-gradient program are the per-device
work space of a whole fitting step (kernel tiles, their derivatives, the adjoint); compare
them with the whole matrix, and across sizes (try a larger `n`) to see how they scale.
"""),
]

NOTEBOOKS = {
    "01_quickstart.ipynb": NB01,
    "02_differentiable_cholesky.ipynb": NB02,
    "03_numpyro_hyperparameters.ipynb": NB03,
    "04_sharded_gp.ipynb": NB04,
}


def make(cells) -> nbformat.NotebookNode:
    nb = new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {
        "display_name": "Python 3",
        "language": "python",
        "name": "python3",
    }
    nb.metadata["language_info"] = {"name": "python"}
    for i, cell in enumerate(nb.cells):
        cell["id"] = f"cell-{i:02d}"
    return nb


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check", action="store_true", help="only check that the stored notebooks are up to date"
    )
    args = parser.parse_args(argv)
    stale = []
    for name, cells in NOTEBOOKS.items():
        path = HERE / name
        text = nbformat.writes(make(cells)) + "\n"
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        else:
            path.write_text(text)
            print("wrote", path)
    if stale:
        print("out of date (run python notebooks/build_notebooks.py):", ", ".join(stale))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
