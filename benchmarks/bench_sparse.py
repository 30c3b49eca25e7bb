"""Sparse GP regression (SGPR, Titsias' collapsed bound): gpchol against GPJax, side by side.

One value-and-gradient step of the collapsed bound wrt (amplitude, lengthscale, noise) of an
ExpSquared kernel, ``jit`` compiled, float64, on the suite's problem (:mod:`benchmarks._common`:
``X`` uniform on ``[0, 10]^3``), with the first ``M`` rows of ``X`` as inducing inputs and a
jitter of 1e-6 on ``Kuu`` in both libraries (GPJax's prior jitter):

* gpchol: ``gpchol.SparseGP(...).elbo(y)`` (rows summed in blocks: no ``(n, M)`` matrix);
* GPJax: ``gpjax.objectives.collapsed_elbo`` of a ``CollapsedVariationalGaussian``.

Each (library, n, M) runs in a fresh child process (``--child``), which reports the compile
(first call) time, the median of ``--repeats`` timed calls, the value and gradient, and its
peak resident memory (``VmHWM``) with its resident memory before the data existed, so that
"peak above X and y" is ``peak - base - bytes(X, y)``. The parent watches each child's
resident memory and stops it above ``--mem-limit-gib`` (recorded as "over the memory
limit"); ``--max-n`` then searches, for each library and ``M``, the largest ``n`` (doubling
from the largest size run) whose step completes under the limit. Values agree to
``RTOL_VALUE`` between the libraries where both ran (same bound, same jitter).

GPJax runs under ``--gpjax-python`` (or the environment variable ``GPCHOL_GPJAX_PYTHON``):
an interpreter with GPJax installed, e.g. a separate virtual environment; by default this
interpreter when it can import GPJax, else GPJax is reported as not run. SVGP's optax steps
per second at batch 1024 (:func:`benchmarks.bench_svgp.svgp_steps_per_second`, n = 100,000,
M = 256 and 512) are added to the results.

Timings taken on a loaded machine are not results: the JSON records ``loadavg``.

Usage::

    python -m benchmarks.bench_sparse [--quick] [--sizes 100000,1000000] [--M 256,512,1024]
        [--libs gpchol,gpjax] [--repeats 3] [--max-n] [--mem-limit-gib 16] [--json FILE]
        [--time-budget-s SECONDS]

With ``--json`` the results file is rewritten after every row (a temporary file renamed over
it), so a run stopped by a time limit keeps what it measured; ``--time-budget-s`` stops
starting new measurements once the budget is spent (the file then says ``"stopped"``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

THETA = (1.3, 1.5, 0.1)  # amplitude, lengthscale, noise variance (benchmarks._common.THETA)
JITTER = 1e-6
RTOL_VALUE = 1e-8
SIZES = (100_000, 1_000_000)
MS = (256, 512, 1024)
QUICK_SIZES = (20_000,)
QUICK_MS = (64, 128)
MAX_N_CAP = 64_000_000


# ------------------------------------------------------------------------ the child


def _rss_kib(field: str, pid: str = "self") -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def _gpchol_step():
    import gpchol
    from gpchol import kernels

    def f(theta, X, y, Z):
        k = theta[0] * kernels.ExpSquared(theta[1])
        return gpchol.SparseGP(k, X, inducing=Z, noise=theta[2], jitter=JITTER).elbo(y)

    return f


def _gpjax_step():
    import gpjax as gpx
    import jax.numpy as jnp

    def f(theta, X, y, Z):
        kernel = gpx.kernels.RBF(lengthscale=theta[1], variance=theta[0])
        prior = gpx.gps.Prior(mean_function=gpx.mean_functions.Zero(), kernel=kernel, jitter=JITTER)
        model = prior * gpx.likelihoods.Gaussian(obs_stddev=jnp.sqrt(theta[2]))
        q = gpx.variational_families.CollapsedVariationalGaussian(model, Z)
        return gpx.objectives.collapsed_elbo(q, gpx.Dataset(X=X, y=y[:, None]))

    return f


def child(lib: str, n: int, M: int, repeats: int) -> dict:
    """One (library, n, M) measurement in this process; returns its record."""
    import jax

    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp
    import numpy as np

    step = {"gpchol": _gpchol_step, "gpjax": _gpjax_step}[lib]()
    vg = jax.jit(jax.value_and_grad(step))
    jnp.zeros(1).block_until_ready()  # the runtime up before the base is read
    base = _rss_kib("VmRSS") * 1024
    rng = np.random.default_rng(0)
    X = rng.uniform(0.0, 10.0, (n, 3))
    y = np.sin(X @ np.array([0.7, -0.4, 0.3])) + 0.3 * rng.standard_normal(n)
    data_bytes = X.nbytes + y.nbytes
    Xd, yd = jnp.asarray(X), jnp.asarray(y)
    del X, y
    Z = Xd[:M]
    theta = jnp.asarray(THETA)
    t0 = time.perf_counter()
    v, g = jax.block_until_ready(vg(theta, Xd, yd, Z))
    first = time.perf_counter() - t0
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(vg(theta, Xd, yd, Z))
        times.append(time.perf_counter() - t0)
    peak = _rss_kib("VmHWM") * 1024
    return {
        "lib": lib,
        "n": n,
        "M": M,
        "ok": True,
        "first_call_s": first,
        "step_s": statistics.median(times) if times else None,
        "times_s": times,
        "value": float(v),
        "grad": [float(x) for x in np.asarray(g)],
        "peak_rss_bytes": peak,
        "base_rss_bytes": base,
        "data_bytes": data_bytes,
        "peak_above_data_gib": (peak - base - data_bytes) / 2**30,
    }


# ------------------------------------------------------------------------ the parent


def _python_for(lib: str, gpjax_python: str | None) -> str | None:
    """The interpreter that runs ``lib``'s children (``None``: it cannot run)."""
    if lib == "gpchol":
        return sys.executable
    candidates = [gpjax_python] if gpjax_python else [sys.executable]
    for py in candidates:
        probe = subprocess.run(
            [py, "-c", "import gpjax"], capture_output=True, text=True, timeout=120
        )
        if probe.returncode == 0:
            return py
    return None


def run_child(py: str, lib: str, n: int, M: int, repeats: int, limit_bytes: int) -> dict:
    """Runs one measurement in a fresh process, stopped above ``limit_bytes`` resident."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [py, "-m", "benchmarks.bench_sparse", "--child", lib, str(n), str(M), str(repeats)]
    p = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    over = False
    while p.poll() is None:
        try:
            if _rss_kib("VmRSS", str(p.pid)) * 1024 > limit_bytes:
                over = True
                p.kill()
                break
        except (OSError, ValueError):
            pass
        time.sleep(0.1)
    out, err = p.communicate()
    if over:
        return {"lib": lib, "n": n, "M": M, "ok": False, "why": "over the memory limit"}
    for line in out.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    tail = (err or out).strip().splitlines()[-3:]
    return {"lib": lib, "n": n, "M": M, "ok": False, "why": " | ".join(tail)[-400:]}


def _fmt(r: dict) -> str:
    if not r.get("ok"):
        return f"{r['lib']:>7s} n={r['n']:>9,d} M={r['M']:>5d}  not completed: {r['why']}"
    return (
        f"{r['lib']:>7s} n={r['n']:>9,d} M={r['M']:>5d}  step {r['step_s']:8.3f} s  "
        f"first call {r['first_call_s']:7.2f} s  peak {r['peak_rss_bytes'] / 2**30:6.2f} GiB "
        f"({r['peak_above_data_gib']:5.2f} above base + X, y)  value {r['value']:.10g}"
    )


def _agreement(rows: list[dict]) -> list[str]:
    lines = []
    done = {(r["lib"], r["n"], r["M"]): r for r in rows if r.get("ok")}
    for (lib, n, M), r in sorted(done.items()):
        other = done.get(("gpjax", n, M))
        if lib != "gpchol" or other is None:
            continue
        rel = abs(r["value"] - other["value"]) / abs(other["value"])
        ratio = other["step_s"] / r["step_s"]
        verdict = "agree" if rel <= RTOL_VALUE else "DISAGREE"
        lines.append(
            f"n={n:,d} M={M}: values {verdict} (relative difference {rel:.1e}); "
            f"GPJax / gpchol step time {ratio:.2f}x"
        )
    return lines


def _max_n(py: str, lib: str, M: int, start: int, repeats: int, limit: int) -> dict:
    """The largest n (doubling from ``start``) whose step completes under the limit."""
    best, n = None, start
    while n <= MAX_N_CAP:
        r = run_child(py, lib, n, M, repeats, limit)
        print("  max-n: " + _fmt(r), flush=True)
        if not r.get("ok"):
            break
        best, n = n, 2 * n
    return {"lib": lib, "M": M, "largest_n": best, "stopped_at": n, "cap": MAX_N_CAP}


def _svgp_rows(quick: bool) -> list[dict] | None:
    """SVGP optax steps per second at batch 1024 (:mod:`benchmarks.bench_svgp`), when there."""
    try:
        from benchmarks.bench_svgp import svgp_steps_per_second
    except ImportError:
        return None
    if quick:
        return [svgp_steps_per_second(20_000, 64, 1024, steps=10, repeats=1)]
    return [svgp_steps_per_second(100_000, M, 1024) for M in (256, 512)]


def _write_json(path: str, result: dict) -> None:
    """Writes ``result`` to ``path`` atomically (a temporary file renamed over it)."""
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(result, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--child", nargs=4, metavar=("LIB", "N", "M", "REPEATS"))
    ap.add_argument("--quick", action="store_true", help="n = 20000, M = 64, 128 (< 1 min)")
    ap.add_argument("--sizes", default=None, help="comma-separated n (default 100000,1000000)")
    ap.add_argument("--M", default=None, help="comma-separated M (default 256,512,1024)")
    ap.add_argument("--libs", default="gpchol,gpjax")
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--max-n", action="store_true", help="search the largest n for each")
    ap.add_argument("--mem-limit-gib", type=float, default=16.0)
    ap.add_argument("--gpjax-python", default=os.environ.get("GPCHOL_GPJAX_PYTHON"))
    ap.add_argument("--json", default=None, help="write the results to this file (after each row)")
    ap.add_argument(
        "--time-budget-s",
        type=float,
        default=None,
        help="start no new measurement after this many seconds (the results so far are kept)",
    )
    a = ap.parse_args(argv)
    if a.child:
        lib, n, M, rep = a.child
        print("RESULT " + json.dumps(child(lib, int(n), int(M), int(rep))), flush=True)
        return 0

    from benchmarks._common import machine_info, versions

    sizes = [int(s) for s in a.sizes.split(",")] if a.sizes else None
    sizes = sizes or list(QUICK_SIZES if a.quick else SIZES)
    ms = [int(m) for m in a.M.split(",")] if a.M else list(QUICK_MS if a.quick else MS)
    repeats = a.repeats if a.repeats is not None else (2 if a.quick else 3)
    limit = int(a.mem_limit_gib * 2**30)
    pythons = {}
    for lib in a.libs.split(","):
        py = _python_for(lib, a.gpjax_python)
        if py is None:
            print(
                f"SKIP {lib}: not importable (install it, or name an interpreter that has "
                "it with --gpjax-python / GPCHOL_GPJAX_PYTHON); GPJax was not run"
            )
        else:
            pythons[lib] = py
    print("== SGPR value-and-gradient step, float64, d = 3 ==", flush=True)
    t_start = time.monotonic()
    rows: list[dict] = []
    largest: list[dict] = []
    state: dict = {"stopped": None, "svgp": None}

    def out_of_time() -> bool:
        if a.time_budget_s is None or time.monotonic() - t_start < a.time_budget_s:
            return False
        if state["stopped"] is None:
            state["stopped"] = f"time budget of {a.time_budget_s:g} s spent"
            print(f"STOP: {state['stopped']}; the remaining measurements were not run", flush=True)
        return True

    def save() -> list[str]:
        agreement = _agreement(rows)
        if a.json:
            _write_json(
                a.json,
                {
                    "machine": machine_info(),
                    "versions": versions(),
                    "settings": {
                        "theta": THETA,
                        "jitter": JITTER,
                        "repeats": repeats,
                        "d": 3,
                        "time_budget_s": a.time_budget_s,
                    },
                    "rows": rows,
                    "agreement": agreement,
                    "largest_n": largest,
                    "not_run": sorted(set(a.libs.split(",")) - set(pythons)),
                    "svgp": state["svgp"],
                    "stopped": state["stopped"],
                    "elapsed_s": time.monotonic() - t_start,
                },
            )
        return agreement

    for n in sizes:
        for M in ms:
            for lib, py in pythons.items():
                if out_of_time():
                    break
                r = run_child(py, lib, n, M, repeats, limit)
                rows.append(r)
                print(_fmt(r), flush=True)
                save()
    agreement = save()
    for line in agreement:
        print(line)
    if a.max_n:
        for lib, py in pythons.items():
            for M in ms:
                if out_of_time():
                    break
                largest.append(_max_n(py, lib, M, 2 * max(sizes), 1, limit))
                print(f"largest n for {lib}, M = {M}: {largest[-1]['largest_n']}")
                save()
    if not out_of_time():
        state["svgp"] = _svgp_rows(a.quick)
    for r in state["svgp"] or []:
        print(
            f"SVGP n={r['n']:,d} M={r['M']} batch={r['batch']}: {r['steps_per_second']:.1f} steps/s"
        )
    agreement = save()
    return 1 if any("DISAGREE" in line for line in agreement) else 0


if __name__ == "__main__":
    sys.exit(main())
