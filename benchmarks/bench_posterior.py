"""Prediction: condition + mean + variance, gpchol against tinygp and scikit-learn.

The same problem for every library (:func:`benchmarks._common.problem`: ``X (n, 3)``,
``y (n,)``; test inputs ``Xs (m, 3)`` from another seed, ``m = n`` by default) and the same
hyperparameters (:data:`benchmarks._common.THETA`: ``K = a exp(-r^2 / 2 l^2) + s I``),
float64 on the CPU. One prediction is: condition on ``y`` (factor ``K``), then the
posterior mean and the marginal variance of the latent ``f`` at ``Xs``:

=============  ===========================================================================
library        one prediction
=============  ===========================================================================
gpchol         ``post = GaussianProcess(a * ExpSquared(l), X, noise=s).condition(y)``,
               then ``post.mean_and_variance(Xs)`` (or ``post.mean(Xs)``,
               ``post.variance(Xs)`` where that method does not exist): the public API,
               called as a user does
tinygp         ``jit`` of ``GaussianProcess(a * ExpSquared(scale=l), X, diag=s)``
               ``.condition(y, Xs)``, its ``loc`` and ``variance``
scikit-learn   ``GaussianProcessRegressor(ConstantKernel(a) * RBF(l), alpha=s,
               optimizer=None).fit(X, y)`` then ``predict(Xs, return_std=True)``
=============  ===========================================================================

Each library and size runs in a fresh process (``python -m benchmarks.bench_posterior
--child``): one call to warm up (compiles), then ``--repeats`` timed calls (median).
Memory, in units of ``n^2`` float64 (``8 n^2`` bytes): ``peak/n^2`` is the second call's
peak (``VmHWM`` reset just before it, after ``malloc_trim`` returned the first call's freed
heap) above the resident size just before it, i.e. above the inputs and whatever the
library keeps between calls; ``proc/n^2`` is that peak above the resident size before the
first call (imports and inputs only: it adds what the first call left resident, compiled
programs and allocator caches, a few hundred MB for the JAX libraries, so it is the larger
figure at small n; the suite's ``step_peak`` convention). Next to them, one
value-and-gradient step of the log marginal likelihood (``gpchol.GaussianProcess``, the
suite's ``gpchol-gp`` step, :mod:`benchmarks.run`) at the same ``n``, timed the same way,
and the ratios against the targets of issue 15: prediction time <= 0.5 x that step, >= 2x
faster than scikit-learn and tinygp at n = 4000, peak <= 1.3 n^2 float64 above the inputs.
The means and variances of every library are checked against gpchol's (relative to the
largest mean / variance, at the first 256 test points).

``--max-n`` (long: up to an hour per size) also searches the largest ``n`` (``m = n``)
whose condition + prediction completes, upward over 8000, 11314, 16000, 22627, 32000, in
fresh processes under a memory cap (available memory less 1 GiB, polled), and prints it
next to the largest ``n`` of the fit step from ``benchmarks/results/cpu-scale-*.json``.

Nothing is written to disk; the output is the printed tables.

Usage::

    python benchmarks/bench_posterior.py                   # n = 2000, 4000, 8000
    python benchmarks/bench_posterior.py --sizes 2000      # one size
    python benchmarks/bench_posterior.py --quick           # n = 500, 1000, 3 repeats
    python benchmarks/bench_posterior.py --max-n           # ... and the largest-n search
    python benchmarks/bench_posterior.py --single-thread   # one thread per library
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import time

if __package__ in (None, ""):  # run as a script: make ``benchmarks`` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import _common as C

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIBS = ("gpchol", "tinygp", "sklearn")
LABELS = {"gpchol": "gpchol", "tinygp": "tinygp", "sklearn": "scikit-learn"}
MAX_N_SIZES = (8000, 11314, 16000, 22627, 32000)
CHECK_POINTS = 256  # test points whose mean/variance the parent compares across libraries
TARGET_FIT_RATIO = 0.5
TARGET_SPEEDUP = 2.0
TARGET_SPEEDUP_N = 4000
TARGET_PEAK_N2 = 1.3


def log(*a: object) -> None:
    print(*a, flush=True)


# ----------------------------------------------------------------------------- child


def _build(lib: str, X, y, Xs):
    """``predict() -> (mean (m,), variance (m,))`` as NumPy arrays, for one library."""
    import numpy as np

    a, ell, s = (float(t) for t in C.THETA)
    if lib == "gpchol":
        import jax.numpy as jnp

        from gpchol import GaussianProcess, kernels

        Xj, yj, Xsj = jnp.asarray(X), jnp.asarray(y), jnp.asarray(Xs)

        def predict():
            gp = GaussianProcess(a * kernels.ExpSquared(lengthscale=ell), Xj, noise=s)
            post = gp.condition(yj)
            if hasattr(post, "mean_and_variance"):
                mu, var = post.mean_and_variance(Xsj)
            else:
                mu, var = post.mean(Xsj), post.variance(Xsj)
            return np.asarray(mu), np.asarray(var)

        return predict
    if lib == "tinygp":
        import jax
        import jax.numpy as jnp
        import tinygp

        @jax.jit
        def run(X, y, Xs):
            kernel = a * tinygp.kernels.ExpSquared(scale=ell)
            _, cond = tinygp.GaussianProcess(kernel, X, diag=s).condition(y, Xs)
            return cond.loc, cond.variance

        Xj, yj, Xsj = jnp.asarray(X), jnp.asarray(y), jnp.asarray(Xs)

        def predict():
            mu, var = run(Xj, yj, Xsj)
            return np.asarray(mu), np.asarray(var)

        return predict
    if lib == "sklearn":
        from sklearn.gaussian_process import GaussianProcessRegressor
        from sklearn.gaussian_process.kernels import RBF, ConstantKernel

        def predict():
            gpr = GaussianProcessRegressor(
                ConstantKernel(a) * RBF(ell),
                alpha=s,
                optimizer=None,
                normalize_y=False,
                copy_X_train=False,
            ).fit(X, y)
            mu, sd = gpr.predict(Xs, return_std=True)
            return mu, sd**2

        return predict
    raise ValueError(f"unknown library {lib!r}; expected one of {LIBS}.")


def _trim() -> None:
    """``malloc_trim(0)`` (glibc): return freed heap pages to the system, where possible."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def child_main(args: argparse.Namespace) -> None:
    """One library, one (n, m) in this fresh process; print one JSON line."""
    import numpy as np

    if args.lib in ("gpchol", "tinygp"):
        import jax

        jax.config.update("jax_enable_x64", True)
    X, y = C.problem(args.n)
    Xs = C.problem(args.m, seed=1)[0]
    predict = _build(args.lib, X, y, Xs)
    rss_setup = C.current_rss()
    t0 = time.perf_counter()
    mu, var = predict()  # compile (JAX) + run
    rec: dict = {
        "lib": args.lib,
        "n": args.n,
        "m": args.m,
        "first_call_s": time.perf_counter() - t0,
        "mean": mu[:CHECK_POINTS].tolist(),
        "var": var[:CHECK_POINTS].tolist(),
        "finite": bool(np.all(np.isfinite(mu)) and np.all(np.isfinite(var))),
        "rss_setup": rss_setup,
    }
    del mu, var
    if args.repeats:
        _trim()  # hand the first call's freed heap back, so it does not hide the second's
        C.reset_peak_rss()
        rss_before = C.current_rss()
        dt, dc, out = C.timed(predict)
        peak = C.peak_rss()
        rec["step_peak"] = peak - rss_before
        rec["proc_peak"] = peak - rss_setup
        del out
        samples = [(dt, dc)] + [C.timed(predict)[:2] for _ in range(args.repeats - 1)]
        rec["times"] = [t for t, _ in samples]
        rec["cpu"] = [c for _, c in samples]
    rec["peak_rss"] = C.peak_rss()
    print(json.dumps(rec), flush=True)


# ----------------------------------------------------------------------------- parent


def run_child(args: list[str], timeout: float, mem_limit: int | None = None) -> dict:
    """``python -m benchmarks.bench_posterior --child ...`` in a fresh process.

    As :func:`benchmarks._common.run_child` (which starts :mod:`benchmarks.run`'s child):
    the child's resident memory is polled and the child killed past ``mem_limit`` bytes.
    Returns its JSON record, or ``{"status": <why not>}``.
    """
    import psutil

    cmd = [sys.executable, "-m", "benchmarks.bench_posterior", "--child", *args]
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env
    )
    ps, status = psutil.Process(proc.pid), None
    while proc.poll() is None:
        if time.perf_counter() - t0 > timeout:
            status = f"timeout (> {timeout:.0f} s)"
            break
        try:
            rss = ps.memory_info().rss
        except psutil.Error:
            rss = 0
        if mem_limit and rss > mem_limit:
            status = f"out of memory (> {mem_limit / 2**30:.1f} GiB cap)"
            break
        time.sleep(0.05)
    if status is not None:
        proc.kill()
        proc.communicate()
        return {"status": status, "wall_s": time.perf_counter() - t0}
    out, err = proc.communicate()
    for line in reversed(out.splitlines()):
        if line.startswith("{"):
            rec = json.loads(line)
            rec["status"] = "ok"
            rec["wall_s"] = time.perf_counter() - t0
            return rec
    why = "killed (OOM?)" if proc.returncode in (-9, 137) else f"failed (rc {proc.returncode})"
    tail = (err or out).strip().splitlines()[-1:] or [""]
    return {"status": f"{why}: {tail[0][:200]}", "wall_s": time.perf_counter() - t0}


def _mem_cap() -> int:
    import psutil

    return int(psutil.virtual_memory().available - 2**30)


def _fit_step(n: int, repeats: int, timeout: float) -> dict:
    """One value-and-gradient step of ``gpchol.GaussianProcess`` (the suite's child)."""
    return C.run_child(["--lib", "gpchol-gp", "--n", str(n), "--time", str(repeats)], timeout)


def _agreement(rec: dict, ref: dict) -> float:
    """Largest difference of mean and variance against gpchol's, relative to their scale."""
    import numpy as np

    errs = []
    for key in ("mean", "var"):
        a, b = np.asarray(rec[key]), np.asarray(ref[key])
        errs.append(float(np.max(np.abs(a - b)) / max(float(np.max(np.abs(b))), 1e-300)))
    return max(errs)


def _n2(rec: dict, n: int, key: str = "step_peak") -> str:
    return f"{rec[key] / (8.0 * n * n):5.2f}" if key in rec else "    -"


def _fit_largest() -> tuple[int | None, str]:
    """The largest n of the fit step in ``benchmarks/results/cpu-scale-*.json``, and where."""
    best, where = None, "no cpu-scale-*.json in benchmarks/results"
    for path in sorted(glob.glob(os.path.join(ROOT, "benchmarks", "results", "cpu-scale-*.json"))):
        try:
            with open(path) as f:
                scale = json.load(f).get("scale") or {}
        except (OSError, ValueError):
            continue
        for lib in ("gpchol-gp", "gpchol"):
            got = (scale.get(lib) or {}).get("largest_n")
            if got and (best is None or got > best):
                best, where = int(got), os.path.relpath(path, ROOT)
    return best, where


def search_max_n(sizes, timeout: float) -> int | None:
    largest = None
    for n in sizes:
        cap = _mem_cap()
        # the first call only (compile included): timed repeats would each take as long
        rec = run_child(
            ["--lib", "gpchol", "--n", str(n), "--m", str(n), "--repeats", "0"], timeout, cap
        )
        if rec["status"] == "ok" and rec.get("finite"):
            largest = n
            log(
                f"  max-n gpchol n = m = {n:6d}: ok, {rec['first_call_s']:7.1f} s "
                f"(first call, compile included), peak RSS {rec['peak_rss'] / 2**30:5.1f} GiB"
            )
        else:
            why = rec["status"] if rec["status"] != "ok" else "non-finite predictions"
            log(f"  max-n gpchol n = m = {n:6d}: {why} (cap {cap / 2**30:.1f} GiB)")
            break
    return largest


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[2000, 4000, 8000])
    ap.add_argument("--m", type=int, default=None, help="test points (default: m = n)")
    ap.add_argument("--repeats", type=int, default=3, help="timed calls (median)")
    ap.add_argument("--libs", nargs="+", default=list(LIBS), choices=LIBS)
    ap.add_argument("--quick", action="store_true", help="n = 500, 1000, 3 repeats")
    ap.add_argument("--no-fit", action="store_true", help="skip the fit-step comparison")
    ap.add_argument("--max-n", action="store_true", help="also search the largest n (long)")
    ap.add_argument("--max-n-sizes", type=int, nargs="+", default=list(MAX_N_SIZES))
    ap.add_argument("--timeout", type=float, default=3600.0, help="seconds per child")
    ap.add_argument("--single-thread", action="store_true", help="one thread per library")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--lib", default="gpchol", help=argparse.SUPPRESS)
    ap.add_argument("--n", type=int, default=1000, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.single_thread:
        C.single_thread_env()  # inherited by the children (before any JAX import)
    if args.child:
        args.m = args.n if args.m is None else args.m
        child_main(args)
        return 0
    if args.quick:
        args.sizes, args.repeats = [500, 1000], 3
    if args.repeats < 1:
        ap.error("--repeats must be >= 1")
    if any(n < 1 for n in args.sizes) or (args.m is not None and args.m < 1):
        ap.error("--sizes and --m must be positive integers")

    info, vers = C.machine_info(), C.versions()
    log(
        "bench_posterior: condition + mean + variance of the latent f (ExpSquared + noise, "
        f"d = 3, float64, CPU); median of {args.repeats}; each library and n in a fresh "
        "process"
    )
    log(
        f"machine: {info['processor']}, {info['cpus']} CPUs, {info.get('memory_gib')} GiB; "
        f"load average {info['loadavg']} at start"
        + ("; one thread per library" if args.single_thread else "")
    )
    log(
        "versions: "
        + ", ".join(f"{k} {vers.get(k)}" for k in ("gpchol", "jax", "tinygp", "scikit-learn"))
    )
    peak_hdr = "peak/n^2"
    log(
        f"\n{'n':>6} {'m':>6} {'library':>12} {'time (s)':>9} {'cpu (s)':>8} "
        f"{peak_hdr:>8} {'proc/n^2':>8} {'vs gpchol':>9} {'(cpu)':>7} {'agree':>8}"
    )
    rows: dict = {}
    for n in args.sizes:
        m = args.m or n
        recs = {}
        for lib in args.libs:
            rec = run_child(
                ["--lib", lib, "--n", str(n), "--m", str(m), "--repeats", str(args.repeats)],
                args.timeout,
                _mem_cap(),
            )
            recs[lib] = rec
            if rec["status"] != "ok":
                log(f"{n:>6} {m:>6} {LABELS[lib]:>12}  {rec['status']}")
                continue
            rec["time"] = C.median(rec["times"])
            rec["cpu_time"] = C.median(rec["cpu"])
        ref = recs.get("gpchol") if recs.get("gpchol", {}).get("status") == "ok" else None
        for lib, rec in recs.items():
            if rec["status"] != "ok":
                continue
            speed = f"{rec['time'] / ref['time']:8.2f}x" if ref else "        -"
            speed += f" {rec['cpu_time'] / ref['cpu_time']:6.2f}x" if ref else "       -"
            agree = f"{_agreement(rec, ref):8.1e}" if ref else "       -"
            if not rec.get("finite"):
                agree = "  NaN!"
            log(
                f"{n:>6} {m:>6} {LABELS[lib]:>12} {rec['time']:>9.3f} {rec['cpu_time']:>8.3f} "
                f"{_n2(rec, n):>8} {_n2(rec, n, 'proc_peak'):>8} {speed} {agree}"
            )
        fit = None
        if not args.no_fit:
            fit = _fit_step(n, args.repeats, args.timeout)
            if fit.get("status") == "ok" and fit.get("times"):
                fit["time"] = C.median(fit["times"])
                peak = fit.get("step_peak")
                pk = f"{peak / (8.0 * n * n):5.2f}" if peak else "    -"
                log(
                    f"{n:>6} {'':>6} {'fit step':>12} {fit['time']:>9.3f} "
                    f"{C.median(fit['cpu']):>8.3f} {'':>8} {pk:>8}   (value_and_grad, gpchol-gp)"
                )
            else:
                log(f"{n:>6} {'':>6} {'fit step':>12}  {fit.get('status')}")
        rows[n] = (recs, fit)

    log("\ntargets (issue 15):")
    for n, (recs, fit) in rows.items():
        g = recs.get("gpchol", {})
        if g.get("status") != "ok":
            continue
        parts = []
        if fit and "time" in fit:
            r = g["time"] / fit["time"]
            rc = g["cpu_time"] / C.median(fit["cpu"])
            ok = "ok" if r <= TARGET_FIT_RATIO else "MISSED"
            parts.append(f"time / fit step {r:.2f} (cpu {rc:.2f}; <= {TARGET_FIT_RATIO}: {ok})")
        if "step_peak" in g:
            p = g["step_peak"] / (8.0 * n * n)
            ok = "ok" if p <= TARGET_PEAK_N2 else "MISSED"
            parts.append(f"peak {p:.2f} n^2 doubles (<= {TARGET_PEAK_N2}: {ok})")
        for lib in ("sklearn", "tinygp"):
            rec = recs.get(lib, {})
            if rec.get("status") == "ok":
                s = rec["time"] / g["time"]
                sc = rec["cpu_time"] / g["cpu_time"]
                tag = f" (cpu {sc:.2f}x)"
                if n == TARGET_SPEEDUP_N:
                    ok = "ok" if s >= TARGET_SPEEDUP else "MISSED"
                    tag = f" (cpu {sc:.2f}x; >= {TARGET_SPEEDUP}: {ok})"
                parts.append(f"{LABELS[lib]} / gpchol {s:.2f}x{tag}")
        log(f"  n = {n}: " + "; ".join(parts))

    if args.max_n:
        log("\nlargest n (m = n) whose condition + mean + variance completes (gpchol):")
        largest = search_max_n(args.max_n_sizes, args.timeout)
        fit_n, where = _fit_largest()
        log(
            f"  prediction: {largest if largest else 'none of ' + str(args.max_n_sizes)}; "
            f"fit step: {fit_n if fit_n else 'unknown'} ({where})"
        )
    log(f"\nload average at the end: {[round(x, 1) for x in os.getloadavg()]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
