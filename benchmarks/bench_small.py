"""Small GPs, fast from the first second: gpchol against plain JAX and tinygp, side by side.

Sections (one run, same inputs for every library, :mod:`benchmarks._common`):

1. **one step**: ``jit(value_and_grad(log p))`` wrt (amplitude, lengthscale, noise) of an
   ExpSquared GP at n = 20, 50, 100, 200, 500: gpchol's ``GaussianProcess`` and
   ``mvn_logpdf``, plain JAX (``jnp.linalg.cholesky`` + autodiff) and tinygp;
2. **vmapped batches**: ``jit(vmap(value_and_grad(log p)))`` over B independent GPs (own
   inputs, targets and hyperparameters) at (B, n) = (1024, 20), (256, 32), (64, 128);
3. **batched fit**: :mod:`benchmarks.bench_batched` when it is there (B = 1000 GPs of
   n = 50 to convergence);
4. **ARD at n of a few hundred** (``ard``): ``jit(value_and_grad)`` of the negative log
   marginal likelihood wrt (log amplitude, d log lengthscales, log white noise) of an
   ARD ExpSquared + White GP on scikit-learn's diabetes data (n = 353, one 5-fold CV
   fold, and 442; d = 10, standardized): gpchol's ``GaussianProcess``, plain JAX
   (distances by ``Z Z^T``, ``jnp.linalg.cholesky`` + autodiff) and tinygp; ``--json``
   writes the times;
5. **the command line end to end**: ``gpchol fit`` (CO2 default) in fresh processes, cold
   and warm compilation cache, with and without the plot, against scikit-learn's fit of the
   same model in a fresh process (:mod:`benchmarks.co2_vs_sklearn`).

Timing: the libraries run in turn within each repeat (so a change of load hits all of
them alike); each repeat times a loop of calls lasting about ``--chunk`` seconds; the
tables give the median over ``--repeats`` repeats and the ratios ``t_peer / t_gpchol``
(above 1: gpchol faster) as the median of the per-repeat ratios.

Usage::

    python -m benchmarks.bench_small [--quick] [--sections step,vmap,ard,fit,cli] [--json F]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]

SIZES = (20, 50, 100, 200, 500)
BATCHES = ((1024, 20), (256, 32), (64, 128))
STEP_LIBS = ("gpchol-gp", "gpchol", "jax-default", "tinygp")
REF = "gpchol-gp"
SETTLE_S = 0.3
WARM_S = 0.15


def _interleaved(fns: dict[str, Callable[[], object]], repeats: int, chunk: float):
    """Per library: the per-call time of each repeat (libraries in turn in each repeat)."""
    loops = {}
    for k, f in fns.items():
        f()
        t0 = time.perf_counter()
        f()
        loops[k] = max(1, int(chunk / max(time.perf_counter() - t0, 1e-7)))
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for k, f in fns.items():
            # Let the previous library's BLAS threads go idle first: OpenBLAS's pool spins
            # for ~0.1 s after a multi-threaded call (trsm, trtri, ... from n ~ 32 on),
            # which on 2 cores slowed whatever was timed next by up to 2x. Then one
            # untimed WARM_S of this library (the machine awake again; its own threads,
            # if it wakes any, are part of its time).
            time.sleep(SETTLE_S)
            t_warm = time.perf_counter() + WARM_S
            while time.perf_counter() < t_warm:
                f()
            t0 = time.perf_counter()
            for _ in range(loops[k]):
                f()
            times[k].append((time.perf_counter() - t0) / loops[k])
    return times


def _row(label: str, times: dict[str, list[float]], libs) -> str:
    med = {k: statistics.median(v) for k, v in times.items()}
    cells = [f"{label:>12s}"]
    cells += [f"{med[k] * 1e6:10.0f}" for k in libs]
    for peer in ("jax-default", "tinygp"):
        if peer in times:
            r = statistics.median(a / b for a, b in zip(times[peer], times[REF], strict=True))
            cells.append(f"{r:8.2f}x")
    return " ".join(cells)


def _header(first: str, libs) -> str:
    cells = [f"{first:>12s}"] + [f"{k[:10]:>10s}" for k in libs]
    cells += [f"{'vs ' + p[:5]:>9s}" for p in ("jax-default", "tinygp")]
    return " ".join(cells) + "   (us per call; ratio = t_peer / t_gpchol-gp)"


def _libs(report) -> list[str]:
    from benchmarks.peers import available

    return [k for k in available(STEP_LIBS, report=report) if k in STEP_LIBS]


def section_step(sizes, repeats: int, chunk: float) -> None:
    import jax
    import jax.numpy as jnp

    from benchmarks._common import THETA, problem
    from benchmarks.peers import ADAPTERS

    libs = _libs(print)
    print("\n== one value-and-gradient step, jit, float64 ==")
    print(_header("n", libs))
    th = jnp.asarray(THETA)
    for n in sizes:
        X, y = (jnp.asarray(a) for a in problem(n))
        fns = {}
        for k in libs:
            f = jax.jit(jax.value_and_grad(ADAPTERS[k].logp))
            fns[k] = lambda f=f, X=X, y=y: jax.block_until_ready(f(th, X, y))
        print(_row(str(n), _interleaved(fns, repeats, chunk), libs), flush=True)


def section_vmap(batches, repeats: int, chunk: float) -> None:
    import jax
    import jax.numpy as jnp

    from benchmarks._common import THETA, problem
    from benchmarks.peers import ADAPTERS

    libs = _libs(lambda *a: None)
    print("\n== vmapped batches: B independent GPs, jit(vmap(value_and_grad)), float64 ==")
    print(_header("(B, n)", libs))
    for B, n in batches:
        data = [problem(n, seed=s) for s in range(B)]
        X = jnp.asarray(np.stack([d[0] for d in data]))
        y = jnp.asarray(np.stack([d[1] for d in data]))
        rng = np.random.default_rng(1)
        th = jnp.asarray(THETA * np.exp(0.2 * rng.standard_normal((B, 3))))
        fns = {}
        for k in libs:
            f = jax.jit(jax.vmap(jax.value_and_grad(ADAPTERS[k].logp)))
            fns[k] = lambda f=f, th=th, X=X, y=y: jax.block_until_ready(f(th, X, y))
        print(_row(f"({B}, {n})", _interleaved(fns, repeats, chunk), libs), flush=True)


ARD_SIZES = (353, 442)
ARD_LIBS = ("gpchol-gp", "jax-default", "tinygp")
#: the fixed diagonal scikit-learn's estimator adds (its ``alpha``), in every library
ARD_ALPHA = 1e-10


def ard_problem(n: int) -> tuple[np.ndarray, np.ndarray]:
    """``(X (n, 10), y (n,))``: scikit-learn's diabetes data, standardized (its first
    ``n`` rows); a seeded Gaussian stand-in of the same shape without scikit-learn."""
    try:
        from sklearn.datasets import load_diabetes

        X, y = load_diabetes(return_X_y=True)
    except ImportError:
        rng = np.random.default_rng(0)
        X = rng.standard_normal((442, 10))
        y = np.sin(X @ rng.standard_normal(10)) + 0.1 * rng.standard_normal(442)
    X = (X - X.mean(0)) / X.std(0)
    y = (y - y.mean()) / y.std()
    return X[:n], y[:n]


def ard_losses() -> dict[str, Callable]:
    """Per library ``loss(theta, X, y)``, ``theta = (log a, log l (d,), log s)``: the
    negative log marginal likelihood with ``K = a k_l(X, X) + (s + ARD_ALPHA) I`` (no two
    rows of the data are equal, so White adds ``s`` on the diagonal alone)."""
    import jax.numpy as jnp

    def parts(theta):
        return jnp.exp(theta[0]), jnp.exp(theta[1:-1]), jnp.exp(theta[-1])

    def gpchol_loss(theta, X, y):
        import gpchol
        from gpchol import kernels

        a, ls, s = parts(theta)
        kernel = a * kernels.ExpSquared(ls) + kernels.White(s)
        gp = gpchol.GaussianProcess(kernel, X, noise=ARD_ALPHA)
        return -gp.log_marginal_likelihood(y)

    def plain_loss(theta, X, y):
        import jax

        a, ls, s = parts(theta)
        Z = X / ls
        sq = jnp.sum(Z * Z, axis=1)
        r2 = jnp.maximum(sq[:, None] + sq[None, :] - 2.0 * Z @ Z.T, 0.0)
        K = a * jnp.exp(-0.5 * r2) + (s + ARD_ALPHA) * jnp.eye(X.shape[0])
        L = jnp.linalg.cholesky(K)
        alpha = jax.scipy.linalg.cho_solve((L, True), y)
        n = X.shape[0]
        return 0.5 * y @ alpha + jnp.sum(jnp.log(jnp.diag(L))) + 0.5 * n * np.log(2 * np.pi)

    def tinygp_loss(theta, X, y):
        import tinygp

        a, ls, s = parts(theta)
        kernel = tinygp.transforms.Linear(1.0 / ls, a * tinygp.kernels.ExpSquared())
        return -tinygp.GaussianProcess(kernel, X, diag=s + ARD_ALPHA).log_probability(y)

    out = {"gpchol-gp": gpchol_loss, "jax-default": plain_loss}
    try:
        import tinygp  # noqa: F401

        out["tinygp"] = tinygp_loss
    except ImportError:
        print("tinygp is not installed: its column is left out")
    return out


def section_ard(sizes, repeats: int, chunk: float, json_path: str | None) -> dict:
    import jax
    import jax.numpy as jnp

    losses = ard_losses()
    libs = [k for k in ARD_LIBS if k in losses]
    print("\n== ARD ExpSquared + White, diabetes (d = 10): one value-and-gradient step ==")
    print(_header("n", libs))
    record: dict = {"sizes": {}, "libs": libs, "repeats": repeats}
    for n in sizes:
        X, y = (jnp.asarray(a) for a in ard_problem(n))
        d = X.shape[1]
        theta = jnp.concatenate([jnp.zeros(1), jnp.full(d, np.log(2.0)), jnp.full(1, -2.0)])
        fns, values = {}, {}
        for k in libs:
            f = jax.jit(jax.value_and_grad(losses[k]))
            values[k] = float(f(theta, X, y)[0])
            fns[k] = lambda f=f, X=X, y=y, th=theta: jax.block_until_ready(f(th, X, y))
        spread = max(values.values()) - min(values.values())
        if spread > 1e-8 * abs(values["gpchol-gp"]):
            raise AssertionError(f"the libraries' losses differ at n = {n}: {values}")
        times = _interleaved(fns, repeats, chunk)
        print(_row(str(n), times, libs), flush=True)
        record["sizes"][str(n)] = {
            "median_s": {k: statistics.median(v) for k, v in times.items()},
            "min_s": {k: min(v) for k, v in times.items()},
            "ratio_peer_over_gpchol": {
                k: statistics.median(a / b for a, b in zip(times[k], times[REF], strict=True))
                for k in libs
                if k != REF
            },
            "loss": values,
        }
    if json_path:
        from benchmarks._common import machine_info, versions

        record.update(machine=machine_info(), versions=versions(), argv=sys.argv)
        Path(json_path).write_text(json.dumps(record, indent=1) + "\n")
        print(f"wrote {json_path}")
    return record


def section_fit(quick: bool) -> None:
    print("\n== batched fit ==")
    try:
        from benchmarks import bench_batched  # helper H5's benchmark (issue 16 item 5)
    except ImportError:
        print("benchmarks/bench_batched.py is not there; skipped")
        return
    bench_batched.main(["--quick"] if quick else [])


def _timed(cmd: list[str], env: dict[str, str], cwd: str) -> tuple[float, str]:
    t0 = time.perf_counter()
    p = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=1800)
    wall = time.perf_counter() - t0
    if p.returncode not in (0, 1):
        raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}): {p.stderr[-2000:]}")
    return wall, p.stdout


def section_cli(quick: bool) -> None:
    """``gpchol fit`` end to end in fresh processes, cold and warm cache, vs scikit-learn."""
    print("\n== gpchol fit (CO2 default, n = 521) end to end, fresh processes ==")
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("XLA_FLAGS", None)
    env.pop("GPCHOL_CACHE_DIR", None)
    steps = ["--steps", "10"] if quick else []
    with tempfile.TemporaryDirectory() as tmp:
        fit = [sys.executable, "-m", "gpchol.cli", "fit", "--quiet", *steps]
        rows = []
        for plot in (False, True):
            cache = os.path.join(tmp, f"cache-{plot}")
            extra = [] if plot else ["--no-plot"]
            for label in ("cold", "warm"):
                cmd = [*fit, *extra, "--cache-dir", cache, "--out", os.path.join(tmp, "m.json")]
                wall, out = _timed(cmd, env, tmp)
                line = next((x for x in out.splitlines() if "compile" in x), "")
                rows.append((f"{label} cache, {'plot' if plot else 'no plot'}", wall, line))
        # the data as arrays, so that scikit-learn's process imports neither gpchol nor JAX
        from gpchol import datasets

        co2 = datasets.load("co2", monthly=True)
        npz = os.path.join(tmp, "co2.npz")
        np.savez(npz, X=np.asarray(co2.X), y=np.asarray(co2.y))
        code = (
            "import sys, time; t0 = time.perf_counter()\n"
            "from benchmarks.co2_vs_sklearn import _sklearn\n"
            f"out = _sklearn(0, {npz!r})\n"
            "assert 'jax' not in sys.modules, 'the scikit-learn process imported JAX'\n"
            "r, other = out['R&W init'], out['sklearn example init']\n"
            "print(f'{r[1]:.3f} {other[1]:.3f} {r[0]:.4f}')\n"
        )
        wall_sk, out = _timed([sys.executable, "-c", code], env, str(ROOT))
        fit_sk, other_sk, lml_sk = (float(x) for x in out.split())
    # the same model from the same start (R&W's initial values) in a fresh process: the
    # process's wall time less the second fit co2_vs_sklearn runs (its example's start)
    sk = wall_sk - other_sk
    for label, wall, line in rows:
        summary = line.split("(", 1)[-1].rstrip(")") if line else ""
        print(f"  {label:22s} {wall:7.1f} s  ({wall / sk:4.2f}x scikit-learn)  {summary}")
    print(
        f"  scikit-learn, R&W start, fresh process: {sk:7.1f} s (its fit {fit_sk:.1f} s), "
        f"LML {lml_sk:.3f}"
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer sizes and repeats")
    ap.add_argument("--sections", default="step,vmap,ard,fit,cli")
    ap.add_argument("--json", default=None, help="write the ard section's times here")
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--chunk", type=float, default=0.02, help="seconds per timed loop")
    args = ap.parse_args(argv)
    import jax

    jax.config.update("jax_enable_x64", True)
    sections = set(args.sections.split(","))
    repeats = args.repeats or (5 if args.quick else 15)
    print(f"jax {jax.__version__} on {jax.default_backend()}, {os.cpu_count()} CPUs")
    if "step" in sections:
        section_step((20, 100) if args.quick else SIZES, repeats, args.chunk)
    if "vmap" in sections:
        section_vmap(((256, 32),) if args.quick else BATCHES, repeats, args.chunk)
    if "ard" in sections:
        section_ard(ARD_SIZES[:1] if args.quick else ARD_SIZES, repeats, args.chunk, args.json)
    if "fit" in sections:
        section_fit(args.quick)
    if "cli" in sections:
        section_cli(args.quick)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
