"""Refitting in fresh processes: gpchol against scikit-learn (and tinygp), imports and
compilation included, side by side in one run.

Every figure is a whole fresh Python process (``sys.executable``), started by this one:
the library's import, JAX's tracing and XLA's compilation (or the persistent cache's
read) are part of it, as they are for a user's script. Per library and scenario:

* **wall**: the child process from the parent's side, start to exit;
* **child**: inside the child, from before the first import (NumPy's included) to after
  the last fit (the interpreter's start and exit left out);
* **compiles**: XLA compilations in the child (``/jax/core/compile/backend_compile_duration``
  events, less the persistent cache's hits, which JAX reports inside the same event),
  and **compile s**: the time spent tracing, lowering and compiling or reading the cache
  (the union of JAX's compile events' spans, as ``gpchol fit`` reports it).

Scenarios (``--sections``):

a. one ``fit`` of the scikit-learn estimators on the diabetes data (``load_diabetes``,
   X standardised per column over all 442 rows), the first 400 rows (``--quick``: 200),
   amplitude * ARD ExpSquared + White, ``normalize_y=True``, both from amplitude 1,
   lengthscales 1 (all ten), white variance 0.1, ``alpha`` 1e-10: scikit-learn's
   ``ConstantKernel(1.0) * RBF(np.ones(10)) + WhiteKernel(0.1)`` (its L-BFGS-B, bounds
   1e-5..1e5) and gpchol's ``1.0 * ExpSquared(np.ones(10)) + White(0.1)`` (12
   hyperparameters as scikit-learn's; ``InputScale(ExpSquared(1.0), ...)`` would leave
   the inner lengthscale free, a 13th), :class:`gpchol.sklearn.GaussianProcessRegressor`
   with its default L-BFGS, unbounded on the log scale; gpchol on an empty persistent
   compilation cache (a new temporary directory each repeat) and warm (a second process
   on that directory). The LMLs reached must agree within 1e-4 (at n = 100 they do not:
   the two optimisers end in different local optima of this 12-parameter ARD model).
b. ``cross_val_score(est, X, y, cv=5)`` on all 442 rows (``--quick``: 120), same models.
c. ``GridSearchCV(est, {"alpha": [1e-10, 1e-5, 1e-2]}, cv=3)`` on all 442 rows
   (``--quick``: 120), same models (refit on all rows included).
d. Bayesian-optimisation-style refits: 40 sequential fits (``--quick``: 4) on n = 40, 41,
   ..., 79 points (``--quick``: 12..15) of the Branin function on [-5, 10] x [0, 15],
   inputs uniform on the unit square (seed 0, the first n of one draw), targets Branin
   plus N(0, 2^2) noise (seed 1), standardised at each n; amplitude * ARD ExpSquared (two
   lengthscales) + noise variance, all three on the log scale, from amplitude 1,
   lengthscales 0.5, noise 0.1, each fit warm-started from the previous one's
   hyperparameters: ``gpchol.fit`` with a new ``lambda`` build function each fit (its
   L-BFGS, at most 200 steps, relative loss change 1e-9 three times); scikit-learn's
   ``GaussianProcessRegressor`` with the previous ``kernel_`` as the next ``kernel``
   (``ConstantKernel * RBF + WhiteKernel``, its L-BFGS-B and bounds); tinygp with optax:
   ``jax.jit`` of one ``optax.lbfgs`` step (the loss's value and gradient and optax's
   zoom line search inside; X and y arguments), a Python loop with gpchol's stopping rule
   (at most 200 steps, relative loss change 1e-9 three times). gpchol and tinygp on an
   empty and on a warm JAX compilation cache; gpchol also with ``warm_start=`` the
   previous fit's result (its L-BFGS curvature pairs carried over, as gpchol's docs
   show for such loops; the optimum is the same, checked on the LMLs below).
e. the ``gpchol fit`` command on its default problem (the CO2 kernel, n = 521, ``--no-plot
   --quiet``; ``--quick``: ``--steps 10``), cold and warm ``--cache-dir``, run through
   :func:`gpchol.cli.main` in a child that counts the compilations, against scikit-learn's
   fit of the same model from the same start (R&W's values) in a fresh process, as
   :func:`benchmarks.bench_small.section_cli` times it
   (:func:`benchmarks.co2_vs_sklearn._sklearn` fits from two starts; the other start's fit
   time is subtracted from the process's time). Both LMLs are of the raw data (``gpchol
   fit`` maps its standardised fit's back); with ``--steps 10`` gpchol's is not converged.

In (a), (d) and (e) each library's LML is compared with scikit-learn's (relative
difference, "agree" within 1e-4); in (b) and (c) the mean R^2 scores are printed.

Timing: within each repeat the libraries run in turn (a change of load hits all alike);
the tables give the median over ``--repeats`` repeats and the ratio ``t / t_scikit-learn``
(below 1: faster than scikit-learn) as the median of the per-repeat ratios, on the wall
time. Results go to ``benchmarks/results/cpu-refit-<date>.json`` and ``.png`` (with
``--quick``: a temporary directory, or ``--out``).

``--libs gpchol`` leaves tinygp out; ``--single-thread`` runs every child on one thread
(XLA without its Eigen pool, OpenBLAS on one thread): on a machine other jobs load,
multi-threaded barriers make the default's times meaningless (measured here under load:
one value-and-gradient at n = 128, 98 ms multi-threaded against 1.2 ms on one thread).

Usage::

    python -m benchmarks.bench_refit [--quick] [--sections a,b,c,d,e] [--repeats R]
                                     [--out PATH] [--libs gpchol,tinygp] [--single-thread]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks._compiles import CompileCounter

ROOT = Path(__file__).resolve().parents[1]
SECTIONS = ("a", "b", "c", "d", "e")
SK = "scikit-learn"
LML_RTOL = 1e-4

#: (a)-(c): the diabetes models' start; (d): the refit loop's.
DIABETES_START = {"amplitude": 1.0, "lengthscale": 1.0, "white": 0.1, "alpha": 1e-10}
BO_START = {"amplitude": 1.0, "lengthscale": 0.5, "noise": 0.1}
BO_NOISE_STD = 2.0
GRID_ALPHAS = (1e-10, 1e-5, 1e-2)
#: the refit loop's stopping rule for gpchol.fit (its defaults) and tinygp's loop
MAX_STEPS, TOL, PATIENCE = 200, 1e-9, 3


def sizes(quick: bool) -> dict:
    """The problem sizes of each scenario."""
    if quick:
        return {"a_n": 200, "bc_n": 120, "d_n0": 12, "d_fits": 4, "cli_steps": 10}
    return {"a_n": 400, "bc_n": 442, "d_n0": 40, "d_fits": 40, "cli_steps": None}


# ------------------------------------------------------------------------------ the child
def _enable_cache(path: str) -> None:
    import gpchol

    if hasattr(gpchol, "enable_compile_cache"):
        gpchol.enable_compile_cache(path)
        return
    import jax

    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def _diabetes_estimator(lib: str, d: int):
    import numpy as np

    s = DIABETES_START
    if lib == SK:
        from sklearn.gaussian_process import GaussianProcessRegressor
        from sklearn.gaussian_process.kernels import RBF, ConstantKernel, WhiteKernel

        kernel = ConstantKernel(s["amplitude"]) * RBF(s["lengthscale"] * np.ones(d))
        return GaussianProcessRegressor(
            kernel + WhiteKernel(s["white"]), alpha=s["alpha"], normalize_y=True
        )
    from gpchol import kernels
    from gpchol.sklearn import GaussianProcessRegressor

    # ARD by ExpSquared's own (d,) lengthscale: InputScale(ExpSquared(1.0), ...) would
    # leave the inner lengthscale free too, a 13th parameter scikit-learn's model lacks
    ard = kernels.ExpSquared(s["lengthscale"] * np.ones(d))
    kernel = s["amplitude"] * ard + kernels.White(s["white"])
    return GaussianProcessRegressor(kernel, alpha=s["alpha"], normalize_y=True)


def _child_diabetes(spec: dict) -> dict:
    import numpy as np

    with np.load(spec["data"]) as f:
        X, y = f["X"][: spec["n"]], f["y"][: spec["n"]]
    est = _diabetes_estimator(spec["lib"], X.shape[1])
    if spec["section"] == "a":
        est.fit(X, y)
        return {"lml": float(est.log_marginal_likelihood_value_)}
    if spec["section"] == "b":
        from sklearn.model_selection import cross_validate

        # cross_val_score's folds, with each fold's estimator kept: its LML says whether
        # both libraries reached the same optimum on every fold
        cv = cross_validate(est, X, y, cv=5, return_estimator=True)
        scores = cv["test_score"]
        return {
            "score": float(np.mean(scores)),
            "scores": [float(v) for v in scores],
            "fold_lmls": [float(e.log_marginal_likelihood_value_) for e in cv["estimator"]],
        }
    from sklearn.model_selection import GridSearchCV

    search = GridSearchCV(est, {"alpha": list(GRID_ALPHAS)}, cv=3).fit(X, y)
    return {"score": float(search.best_score_), "best_alpha": search.best_params_["alpha"]}


def branin_problem(n_max: int):
    """``(X (n_max, 2) on the unit square, f (n_max,) noisy Branin)``, fixed seeds."""
    import numpy as np

    X = np.random.default_rng(0).uniform(0.0, 1.0, (n_max, 2))
    x1, x2 = -5.0 + 15.0 * X[:, 0], 15.0 * X[:, 1]
    b, c, t = 5.1 / (4 * np.pi**2), 5.0 / np.pi, 1.0 / (8 * np.pi)
    f = (x2 - b * x1**2 + c * x1 - 6.0) ** 2 + 10.0 * (1 - t) * np.cos(x1) + 10.0
    return X, f + BO_NOISE_STD * np.random.default_rng(1).standard_normal(n_max)


def _bo_data(spec: dict):
    import numpy as np

    n0, fits = spec["n0"], spec["fits"]
    X, f = branin_problem(n0 + fits - 1)
    for n in range(n0, n0 + fits):
        y = f[:n]
        yield X[:n], (y - np.mean(y)) / np.std(y)


def bo_fits_sklearn(spec: dict, optimizer="fmin_l_bfgs_b"):
    """The loop's scikit-learn fits, each started from the previous fit's ``kernel_``:
    yields each fitted ``GaussianProcessRegressor`` (``optimizer``: the estimator's)."""
    import numpy as np
    from sklearn.gaussian_process import GaussianProcessRegressor
    from sklearn.gaussian_process.kernels import RBF, ConstantKernel, WhiteKernel

    s = BO_START
    kernel = ConstantKernel(s["amplitude"]) * RBF(s["lengthscale"] * np.ones(2))
    kernel = kernel + WhiteKernel(s["noise"])
    for X, y in _bo_data(spec):
        gp = GaussianProcessRegressor(kernel, optimizer=optimizer).fit(X, y)
        kernel = gp.kernel_  # the next fit starts here
        yield gp


def _child_bo_sklearn(spec: dict) -> dict:
    import numpy as np

    *_, gp = bo_fits_sklearn(spec)  # the last fit
    return {
        "lml": float(gp.log_marginal_likelihood_value_),
        "theta": np.exp(gp.kernel_.theta).tolist(),
    }


def _bo_start():
    """The loop's first hyperparameters, in NumPy for both JAX libraries: as a user writes
    them (gpchol's docs use floats), without eager ``jnp`` operations, each of which
    compiles a program of its own (30-45 ms here) that is no library's cost."""
    import numpy as np

    s = BO_START
    return {
        "log_amp": np.log(s["amplitude"]),
        "log_ls": np.log(np.full(2, s["lengthscale"])),
        "log_noise": np.log(s["noise"]),
    }


def bo_fits_gpchol(spec: dict, warm_start: bool = False, tol=TOL, patience=PATIENCE):
    """The loop's ``gpchol.fit`` calls, each started from the previous fit's parameters
    (with ``warm_start``: and its result's optimiser state): yields each ``FitResult``."""
    import jax.numpy as jnp

    import gpchol
    from gpchol import kernels

    p, res = _bo_start(), None
    for X, y in _bo_data(spec):
        res = gpchol.fit(
            lambda q, X=X: gpchol.GaussianProcess(
                jnp.exp(q["log_amp"]) * kernels.ExpSquared(jnp.exp(q["log_ls"])),
                X,
                noise=jnp.exp(q["log_noise"]),
            ),
            p,
            y,
            steps=MAX_STEPS,
            tol=tol,
            patience=patience,
            progress=False,
            warm_start=res if warm_start else None,
        )
        p = res.params  # the next fit starts here (NumPy leaves)
        yield res


def _child_bo_gpchol(spec: dict) -> dict:
    import jax

    jax.config.update("jax_enable_x64", True)
    import numpy as np

    if spec.get("cache"):
        _enable_cache(spec["cache"])
    *_, res = bo_fits_gpchol(spec, warm_start=bool(spec.get("ws")))  # the last fit
    p = res.params
    theta = [float(np.exp(p["log_amp"])), *map(float, np.exp(p["log_ls"]))]
    return {
        "lml": float(res.log_marginal_likelihood),
        "theta": [*theta, float(np.exp(p["log_noise"]))],
    }


def _child_bo_tinygp(spec: dict) -> dict:
    import functools

    import jax

    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp
    import optax
    import optax.tree_utils as otu
    import tinygp

    if spec.get("cache"):
        jax.config.update("jax_compilation_cache_dir", spec["cache"])
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)

    def loss(p, X, y):
        ard = tinygp.transforms.Linear(jnp.exp(-p["log_ls"]), tinygp.kernels.ExpSquared())
        gp = tinygp.GaussianProcess(jnp.exp(p["log_amp"]) * ard, X, diag=jnp.exp(p["log_noise"]))
        return -gp.log_probability(y)

    opt = optax.lbfgs()

    @jax.jit
    def step(p, state, X, y):
        f = functools.partial(loss, X=X, y=y)
        value, grad = optax.value_and_grad_from_state(f)(p, state=state)
        updates, state = opt.update(grad, state, p, value=value, grad=grad, value_fn=f)
        return optax.apply_updates(p, updates), state, value

    p = _bo_start()
    for X, y in _bo_data(spec):
        X, y = jnp.asarray(X), jnp.asarray(y)
        # strongly typed, as the jitted step returns it: optax's init gives three weakly
        # typed scalars, and the step's second call would compile it again (2 per fit)
        state = jax.tree.map(lambda x: jnp.asarray(x, jnp.result_type(x)), opt.init(p))
        prev, calm = math.inf, 0
        for _ in range(MAX_STEPS):
            p, state, value = step(p, state, X, y)
            value = float(value)
            calm = calm + 1 if abs(value - prev) <= TOL * max(1.0, abs(value)) else 0
            prev = value
            if calm >= PATIENCE or not math.isfinite(value):
                break
    lml = -float(otu.tree_get(state, "value"))  # the line search's value at the final p
    theta = [float(jnp.exp(p["log_amp"])), *map(float, jnp.exp(p["log_ls"]))]
    return {"lml": lml, "theta": [*theta, float(jnp.exp(p["log_noise"]))]}


def _child_cli(spec: dict) -> dict:
    import contextlib
    import io
    import re

    from gpchol.cli import main as gpchol_main

    argv = ["fit", "--no-plot", "--quiet", "--cache-dir", spec["cache"], "--out", spec["out"]]
    if spec.get("steps"):
        argv += ["--steps", str(spec["steps"])]
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = gpchol_main(argv)
    text = buf.getvalue()
    if rc not in (0, 1):  # 1: the fit stopped at --steps before converging
        raise RuntimeError(f"gpchol fit exited with {rc}: {text[-1000:]}")
    m = re.search(r"log marginal likelihood: (-?[0-9.]+)", text)
    return {"lml": float(m.group(1)) if m else None, "rc": rc}


def _child_cli_sklearn(spec: dict) -> dict:
    from benchmarks.co2_vs_sklearn import _sklearn

    out = _sklearn(0, spec["data"])
    rw, other = out["R&W init"], out["sklearn example init"]
    # the process's time less the fit from the other start (bench_small's section_cli)
    return {"lml": float(rw[0]), "fit_s": rw[1], "subtract_s": other[1]}


def child(spec: dict) -> dict:
    """Runs one scenario for one library in this (fresh) process; the record to print."""
    t0 = time.perf_counter()
    counter = None if spec["lib"] == SK else CompileCounter()
    section, lib = spec["section"], spec["lib"]
    if section in "abc":
        if lib != SK and spec.get("cache"):
            _enable_cache(spec["cache"])
        out = _child_diabetes(spec)
    elif section == "d":
        fn = {SK: _child_bo_sklearn, "gpchol": _child_bo_gpchol, "tinygp": _child_bo_tinygp}
        out = fn[lib](spec)
    elif lib == SK:
        out = _child_cli_sklearn(spec)
    else:
        out = _child_cli(spec)
    inner = time.perf_counter() - t0 - out.get("subtract_s", 0.0)
    rec = {"inner_s": inner, **out}
    if counter is not None:
        rec.update(counter.summary())
        rec["jax_modules"] = True
    else:
        rec["jax_modules"] = "jax" in sys.modules
    return rec


# ----------------------------------------------------------------------------- the parent
#: the children's environment on one thread (``--single-thread``): XLA's CPU client
#: without its Eigen pool, OpenBLAS/OpenMP (NumPy, SciPy, scikit-learn) on one thread
SINGLE_THREAD_ENV = {
    "XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1",
    "OPENBLAS_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}


def _env(single_thread: bool = False) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("XLA_FLAGS", None)  # one CPU device, XLA's defaults
    if single_thread:
        env.update(SINGLE_THREAD_ENV)
    env.pop("GPCHOL_CACHE_DIR", None)  # each run names its cache (or none)
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    return env


def run_child(spec: dict, timeout: float, single_thread: bool = False) -> dict:
    """One fresh process: its record plus ``wall_s`` (start to exit, from here)."""
    cmd = [sys.executable, "-m", "benchmarks.bench_refit", "--child", json.dumps(spec)]
    t0 = time.perf_counter()
    try:
        p = subprocess.run(
            cmd,
            env=_env(single_thread),
            cwd=str(ROOT),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return {"status": f"timeout (> {timeout:.0f} s)", "wall_s": math.nan}
    wall = time.perf_counter() - t0
    for line in reversed(p.stdout.splitlines()):
        if line.startswith("{"):
            rec = json.loads(line)
            rec["status"] = "ok" if p.returncode == 0 else f"rc {p.returncode}"
            rec["wall_s"] = wall - rec.get("subtract_s", 0.0)
            return rec
    tail = (p.stderr or p.stdout).strip().splitlines()[-3:]
    return {"status": f"failed (rc {p.returncode}): {' | '.join(tail)[:600]}", "wall_s": math.nan}


def _median(xs: list[float]) -> float:
    import statistics

    xs = [x for x in xs if x is not None and math.isfinite(x)]
    return statistics.median(xs) if xs else math.nan


def _variants(section: str) -> list[tuple[str, dict]]:
    """``(row label, child spec fields)`` in the order run within one repeat."""
    if section in "abc":
        return [
            (SK, {"lib": SK}),
            ("gpchol, cold cache", {"lib": "gpchol", "cache": "new"}),
            ("gpchol, warm cache", {"lib": "gpchol", "cache": "same"}),
        ]
    if section == "d":
        return [
            (SK, {"lib": SK}),
            ("gpchol, cold cache", {"lib": "gpchol", "cache": "new"}),
            ("gpchol, warm cache", {"lib": "gpchol", "cache": "same"}),
            ("gpchol warm_start, cold cache", {"lib": "gpchol", "cache": "new", "ws": True}),
            ("gpchol warm_start, warm cache", {"lib": "gpchol", "cache": "same", "ws": True}),
            ("tinygp+optax, cold cache", {"lib": "tinygp", "cache": "new"}),
            ("tinygp+optax, warm cache", {"lib": "tinygp", "cache": "same"}),
        ]
    return [
        (SK, {"lib": SK}),
        ("gpchol fit, cold cache", {"lib": "gpchol", "cache": "new"}),
        ("gpchol fit, warm cache", {"lib": "gpchol", "cache": "same"}),
    ]


TITLES = {
    "a": "(a) one fit in a fresh process: diabetes n = {a_n}, amplitude * ARD ExpSquared "
    "+ White, normalize_y",
    "b": "(b) cross_val_score(est, X, y, cv=5), diabetes n = {bc_n}",
    "c": "(c) GridSearchCV(est, alpha in {alphas}, cv=3), diabetes n = {bc_n}",
    "d": "(d) {d_fits} warm-started refits on n = {d_n0}..{d_last} (Branin, ARD ExpSquared "
    "+ noise)",
    "e": "(e) gpchol fit (CO2, n = 521, --no-plot{steps}) vs scikit-learn's fit of the model",
}


def run_section(
    section: str,
    sz: dict,
    repeats: int,
    tmp: str,
    timeout: float,
    libs: tuple[str, ...],
    single_thread: bool = False,
) -> dict:
    base = {"section": section}
    if section in "abc":
        base.update(data=os.path.join(tmp, "diabetes.npz"))
        base["n"] = sz["a_n"] if section == "a" else sz["bc_n"]
    elif section == "d":
        base.update(n0=sz["d_n0"], fits=sz["d_fits"])
    else:
        base.update(data=os.path.join(tmp, "co2.npz"), steps=sz["cli_steps"])
        base["out"] = os.path.join(tmp, "gpchol-fit.json")
    variants = [(k, f) for k, f in _variants(section) if f["lib"] == SK or f["lib"] in libs]
    runs: dict[str, list[dict]] = {label: [] for label, _ in variants}
    for r in range(repeats):
        caches: dict[str, str] = {}
        for label, fields in variants:
            spec = {**base, **fields}
            if fields.get("cache"):
                lib = fields["lib"]
                if fields["cache"] == "new":
                    caches[lib] = tempfile.mkdtemp(prefix=f"cache-{section}-{lib}-{r}-", dir=tmp)
                spec["cache"] = caches[lib]
            rec = run_child(spec, timeout, single_thread)
            runs[label].append(rec)
            if rec["status"] != "ok":
                print(f"  {label}: {rec['status']}", flush=True)
    rows = []
    sk_walls = [x["wall_s"] for x in runs[SK]]
    for label, _ in variants:
        recs = runs[label]
        walls = [x["wall_s"] for x in recs]
        ratios = [a / b for a, b in zip(walls, sk_walls, strict=True) if b and math.isfinite(b)]
        inner = [x.get("inner_s", math.nan) for x in recs]
        sk_inner = [x.get("inner_s", math.nan) for x in runs[SK]]
        row = {
            "library": label,
            "wall_s": _median(walls),
            "inner_s": _median(inner),
            "ratio": _median(ratios),
            "ratio_inner": _median([a / b for a, b in zip(inner, sk_inner, strict=True)]),
            "runs": recs,
        }
        for key in ("xla_compiles", "cache_hits", "compile_s", "lml", "score"):
            vals = [x[key] for x in recs if x.get(key) is not None]
            if vals:
                row[key] = _median(vals)
        rows.append(row)
    return {"rows": rows}


def _fmt(v, spec: str) -> str:
    """``v`` formatted by ``spec`` (``"8.2f"``), or ``-`` right-aligned to its width."""
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-".rjust(int(spec.split(".")[0] or 0))
    return format(v, spec)


def print_section(title: str, result: dict, section: str) -> None:
    print(f"\n== {title} ==")
    last = "score" if section in "bc" else "LML"
    print(
        f"  {'library':30s} {'wall s':>8s} {'child s':>8s} {'vs sklearn':>10s} "
        f"{'compiles':>8s} {'compile s':>9s} {last:>12s}"
    )
    for row in result["rows"]:
        value = row.get("score" if section in "bc" else "lml")
        print(
            f"  {row['library']:30s} {_fmt(row['wall_s'], '8.2f')} "
            f"{_fmt(row['inner_s'], '8.2f')} {_fmt(row['ratio'], '9.2f')}x "
            f"{_fmt(row.get('xla_compiles'), '8.0f')} {_fmt(row.get('compile_s'), '9.2f')} "
            f"{_fmt(value, '12.5f')}"
        )
    if section in "ade":
        lmls = {row["library"]: row.get("lml") for row in result["rows"]}
        ref = lmls.get(SK)
        for label, v in lmls.items():
            if label == SK or v is None or ref is None:
                continue
            rel = abs(v - ref) / max(1.0, abs(ref))
            ok = f"agree within {LML_RTOL:g}" if rel <= LML_RTOL else "DIFFER"
            print(f"  LML {label}: {v:.6f} vs scikit-learn {ref:.6f}: rel. diff {rel:.1e} ({ok})")
            result.setdefault("lml_check", {})[label] = {"rel_diff": rel, "agree": rel <= LML_RTOL}
    if section == "b":
        # every fold: the same optimum (the LML of each fold's fit), or the scores compare
        # different models
        folds = {
            row["library"]: next((x["fold_lmls"] for x in row["runs"] if x.get("fold_lmls")), None)
            for row in result["rows"]
        }
        ref = folds.get(SK)
        for label, v in folds.items():
            if label == SK or v is None or ref is None:
                continue
            rels = [abs(a - b) / max(1.0, abs(b)) for a, b in zip(v, ref, strict=True)]
            bad = [i for i, rel in enumerate(rels) if rel > LML_RTOL]
            ok = f"all agree within {LML_RTOL:g}" if not bad else f"DIFFER in fold(s) {bad}"
            print(f"  fold LMLs {label} vs scikit-learn: max rel. diff {max(rels):.1e} ({ok})")
            result.setdefault("lml_check", {})[label] = {
                "rel_diff": max(rels),
                "fold_rel_diffs": rels,
                "agree": not bad,
            }
    if section == "c":
        alphas = {
            row["library"]: [x.get("best_alpha") for x in row["runs"]] for row in result["rows"]
        }
        print("  best alpha per run: " + "; ".join(f"{k}: {v}" for k, v in alphas.items()))
    if section == "e" and result.get("steps"):
        print(f"  (--steps {result['steps']}: gpchol's fit stops before it converges)")
    if section == "d":
        for row in result["rows"]:
            thetas = [x.get("theta") for x in row["runs"] if x.get("theta")]
            if thetas:
                th = ", ".join(f"{t:.4g}" for t in thetas[0])
                print(f"  {row['library']:30s} last fit (amplitude, lengthscales, noise): {th}")


def write_chart(results: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    secs = [s for s in SECTIONS if s in results["sections"]]
    fig, ax = plt.subplots(figsize=(2.2 + 2.0 * len(secs), 4.2))
    colors = {"gpchol": "tab:blue", "gpchol warm_start": "tab:purple", "tinygp": "tab:green"}
    xticks, xlabels = [], []
    x = 0.0
    for s in secs:
        rows = [r for r in results["sections"][s]["rows"] if r["library"] != SK]
        start = x
        for row in rows:
            lib = row["library"].rpartition(",")[0].removesuffix(" fit")
            lib = "tinygp" if lib.startswith("tinygp") else lib
            warm = row["library"].endswith("warm cache")
            v = row["ratio"] if math.isfinite(row["ratio"]) else 0.0
            ax.bar(
                x,
                v,
                0.8,
                color=colors[lib],
                alpha=1.0 if warm else 0.55,
                hatch=None if warm else "//",
                edgecolor="black",
                linewidth=0.5,
            )
            ax.text(x, v, f"{v:.2f}", ha="center", va="bottom", fontsize=7)
            x += 1.0
        xticks.append((start + x - 1.0) / 2)
        xlabels.append(f"({s})")
        x += 0.8
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(xticks, xlabels)
    if ax.get_ylim()[1] > 8.0:
        # tinygp's (d) is tens of times scikit-learn's: on a linear axis every other bar
        # would be a sliver, so the axis goes logarithmic and the bars keep their labels
        ax.set_yscale("log")
    ax.set_ylabel("process wall time / scikit-learn's (below 1: faster)")
    from matplotlib.patches import Patch

    ax.legend(
        handles=[
            Patch(facecolor="tab:blue", alpha=0.55, hatch="//", label="gpchol, cold cache"),
            Patch(facecolor="tab:blue", label="gpchol, warm cache"),
            Patch(facecolor="tab:purple", label="gpchol warm_start (d)"),
            Patch(facecolor="tab:green", alpha=0.55, hatch="//", label="tinygp, cold cache"),
            Patch(facecolor="tab:green", label="tinygp, warm cache"),
        ],
        fontsize=7,
        loc="upper right",
    )
    ax.set_title("Fresh-process fits vs scikit-learn" + (" (quick)" if results["quick"] else ""))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def diabetes():
    """``(X (442, 10), y (442,))``: scikit-learn's diabetes data, X standardised per column
    over all rows (the problem of (a)-(c))."""
    from sklearn.datasets import load_diabetes

    X, y = load_diabetes(return_X_y=True)
    return (X - X.mean(axis=0)) / X.std(axis=0), y


def _write_data(tmp: str, sections: list[str]) -> None:
    import numpy as np

    if any(s in "abc" for s in sections):
        np.savez(os.path.join(tmp, "diabetes.npz"), **dict(zip("Xy", diabetes(), strict=True)))
    if "e" in sections:
        # as arrays, so that scikit-learn's process imports neither gpchol nor JAX
        from gpchol import datasets

        co2 = datasets.load("co2", monthly=True)
        np.savez(os.path.join(tmp, "co2.npz"), X=np.asarray(co2.X), y=np.asarray(co2.y))


def _json_default(o):
    import numpy as np

    if isinstance(o, np.generic):
        return o.item()
    raise TypeError(type(o).__name__)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny sizes, 1 repeat (a check)")
    ap.add_argument("--sections", default=",".join(SECTIONS), help="of a,b,c,d,e")
    ap.add_argument("--repeats", type=int, default=None, help="fresh-process runs (3)")
    ap.add_argument("--out", default=None, help="results JSON path (the PNG next to it)")
    ap.add_argument(
        "--libs",
        default="gpchol,tinygp",
        help="libraries besides scikit-learn (always run: the reference): gpchol,tinygp",
    )
    ap.add_argument(
        "--single-thread",
        action="store_true",
        help="children on one thread (XLA, OpenBLAS): for a machine other jobs load",
    )
    ap.add_argument("--timeout", type=float, default=None, help="per child, seconds")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child is not None:
        print(json.dumps(child(json.loads(args.child)), default=_json_default), flush=True)
        return 0
    sections = [s for s in args.sections.split(",") if s]
    bad = [s for s in sections if s not in SECTIONS]
    if bad:
        ap.error(f"unknown sections {bad}; choose from {','.join(SECTIONS)}")
    libs = tuple(x for x in args.libs.split(",") if x)
    if set(libs) - {"gpchol", "tinygp", SK}:
        ap.error(f"unknown libraries in --libs {args.libs!r}; choose from gpchol,tinygp")
    repeats = args.repeats or (1 if args.quick else 3)
    timeout = args.timeout or (300.0 if args.quick else 1800.0)
    sz = sizes(args.quick)
    from benchmarks._common import machine_info, versions

    date = time.strftime("%Y-%m-%d")
    if args.out:
        out = Path(args.out)
    elif args.quick:
        out = Path(tempfile.mkdtemp(prefix="bench-refit-")) / f"cpu-refit-{date}.json"
    else:
        out = ROOT / "benchmarks" / "results" / f"cpu-refit-{date}.json"
    info = machine_info()
    print(
        f"bench_refit: {info['processor']}, {info['cpus']} CPUs, load {info['loadavg']}; "
        f"{repeats} repeat(s), fresh processes{' (quick)' if args.quick else ''}"
        f"{', one thread each' if args.single_thread else ''}",
        flush=True,
    )
    results = {
        "benchmark": "bench_refit",
        "quick": args.quick,
        "repeats": repeats,
        "machine": info,
        "versions": versions(),
        "sizes": sz,
        "settings": {
            "diabetes_start": DIABETES_START,
            "grid_alphas": list(GRID_ALPHAS),
            "bo_start": BO_START,
            "bo_noise_std": BO_NOISE_STD,
            "bo_kernel": "amplitude * ARD ExpSquared (2 lengthscales) + noise, log scale",
            "stopping": {"max_steps": MAX_STEPS, "tol": TOL, "patience": PATIENCE},
            "tinygp_optimizer": "optax.lbfgs (zoom line search), jitted step, Python loop",
            "single_thread": args.single_thread,
            "ratio": "median over repeats of (process wall time / scikit-learn's)",
        },
        "sections": {},
    }
    fields = {
        **sz,
        "alphas": list(GRID_ALPHAS),
        "d_last": sz["d_n0"] + sz["d_fits"] - 1,
        "steps": f", --steps {sz['cli_steps']}" if sz["cli_steps"] else "",
    }
    with tempfile.TemporaryDirectory(prefix="bench-refit-") as tmp:
        _write_data(tmp, sections)
        for s in SECTIONS:
            if s not in sections:
                continue
            title = TITLES[s].format(**fields)
            t0 = time.perf_counter()
            res = run_section(s, sz, repeats, tmp, timeout, libs, args.single_thread)
            res["title"] = title
            if s == "e":
                res["steps"] = sz["cli_steps"]
            res["section_s"] = time.perf_counter() - t0
            print_section(title, res, s)
            print(f"  (section {res['section_s']:.0f} s)", flush=True)
            results["sections"][s] = res
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1, default=_json_default) + "\n")
    png = out.with_suffix(".png")
    write_chart(results, str(png))
    print(f"\nwrote {out} and {png}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
