"""gpchol's benchmark suite: exact-GP fitting steps against the peers, memory, scale.

One run measures, in float64 on the CPU, on the same data and hyperparameters for every
library (see :mod:`benchmarks._common` and :mod:`benchmarks.peers`):

* **speed**: one value-and-gradient step of the exact GP log marginal likelihood with
  respect to (amplitude, lengthscale, noise), ExpSquared + noise, d = 3; median of
  ``--repeats`` (>= 5) after a warm-up, each library in its own fresh process, one after
  the other (``--interleave``: all in one process, round by round, so that load from
  other processes hits them alike; but there the libraries slow each other down,
  scikit-learn most); ratios are within one run;
* **agreement**: every library's value and gradient against gpchol's (relative, 1e-8),
  and gpchol's against a SciPy reference by the textbook formulas at small n;
* **memory**: peak resident memory of that step, each library and n in a fresh process
  (``VmHWM``, reset just before the step: the step's peak over the process's resident
  size before it; also the whole process's peak, and XLA's ``memory_analysis`` for the
  JAX libraries);
* **scale** (``--scale``, full mode only): the largest n each library completes, searching
  upward (4000, 8000, 11314, 16000, ...) in fresh processes, stopping at the first failure,
  out-of-memory (a psutil watchdog kills a child before the machine runs out) or timeout,
  within a total time budget;
* the other benchmark scripts of ``benchmarks/`` (``bench_linalg.py``, ``bench_gp.py``,
  ``bench_numpyro.py``, ``bench_distributed.py``) when present, each in a subprocess.

Writes ``benchmarks/results/cpu-<date>.md`` and ``.json`` (machine, versions, command,
date; ``cpu-<date>-1thread.*`` with ``--single-thread``) and prints a snippet for the README.

Usage::

    python -m benchmarks --quick            # CI-sized: n = 500, 1000 (< 3 min on 2 cores)
    python -m benchmarks                    # n = 1000, 2000, 4000, 8000
    python -m benchmarks --scale            # ... and the largest-n search
    python -m benchmarks --agreement-only --sizes 300   # values only (the CI test)
    python -m benchmarks --single-thread    # one thread per library: on a loaded machine
    python -m benchmarks --render benchmarks/results/cpu-<date>.json   # redo the markdown
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

from . import _common as C
from . import peers

HERE = os.path.dirname(os.path.abspath(__file__))
SUITES = ("bench_linalg.py", "bench_gp.py", "bench_numpyro.py", "bench_distributed.py")
SCALE_SIZES = (4000, 8000, 11314, 16000, 22627, 32000, 45255, 64000)
# quick-mode arguments of the scripts that have no --quick of their own
QUICK_ARGS = {"bench_distributed.py": ["--n", "1024"]}
REF_MAX_N = 2000  # the SciPy reference (several n x n buffers) only up to here


def log(*a):
    print(*a, flush=True)


# ----------------------------------------------------------------------------- child


def child_main(args) -> None:
    """One library, one n, one step in this (fresh) process; print one JSON line."""
    peers.enable_x64()
    adapter = peers.ADAPTERS[args.lib]
    X, y = C.problem(args.n)
    step = adapter.build(X, y)
    rss_setup = C.current_rss()  # imports, data and the library's own setup
    t0 = time.perf_counter()
    value, grad = step(C.THETA)  # compile + run (the JAX libraries compile lazily)
    first_s = time.perf_counter() - t0
    rec = {
        "lib": args.lib,
        "n": args.n,
        "value": value,
        "grad": list(map(float, grad)),
        "first_call_s": first_s,
        "peak_rss": C.peak_rss(),
    }
    if not args.once:
        # the step as a fitting loop sees it: compiled, run again. Its peak is measured
        # from the resident size after setup (not from just before this call: the
        # allocator may keep the first call's freed pages resident, or not)
        C.reset_peak_rss()
        rss0 = C.current_rss()
        t0 = time.perf_counter()
        step(C.THETA)
        peak = C.peak_rss()
        rec.update(
            rss_setup=rss_setup,
            rss_before=rss0,
            step_peak=peak - rss_setup,
            step_s=time.perf_counter() - t0,
            peak_rss=max(peak, rec["peak_rss"]),
        )
    if args.time:
        # timing: `args.time` more steps, compiled and warm, in this process alone
        samples = [C.timed(step, C.THETA)[:2] for _ in range(args.time)]
        rec["times"] = [t for t, _ in samples]
        rec["cpu"] = [c for _, c in samples]
    if args.xla_memory and adapter.is_jax:
        try:
            ma = step.lower(C.THETA).compile().memory_analysis()
            rec["xla_temp"] = int(ma.temp_size_in_bytes)
            rec["xla_args"] = int(ma.argument_size_in_bytes)
            rec["xla_out"] = int(ma.output_size_in_bytes)
        except Exception as e:  # memory_analysis is best effort
            rec["xla_error"] = str(e)[:200]
    print(json.dumps(rec), flush=True)


# ----------------------------------------------------------------------------- agreement


def check_agreement(n: int, results: dict, with_reference: bool) -> list[dict]:
    """Rows ``{lib, n, value, rel_value, rel_grad, ok}`` against gpchol (and SciPy)."""
    rows = []
    ref = results.get("gpchol")
    if with_reference:
        X, y = C.problem(n)
        rv, rg = C.reference_numpy(X, y)
        if ref is not None:
            ev, eg = C.rel_err(*ref, rv, rg)
            rows.append(
                {
                    "lib": "gpchol vs SciPy reference",
                    "n": n,
                    "value": ref[0],
                    "rel_value": ev,
                    "rel_grad": eg,
                    "ok": max(ev, eg) <= C.RTOL,
                }
            )
    if ref is None:
        return rows
    for lib, (v, g) in results.items():
        if lib == "gpchol":
            continue
        ev, eg = C.rel_err(v, g, *ref)
        rows.append(
            {
                "lib": lib,
                "n": n,
                "value": v,
                "rel_value": ev,
                "rel_grad": eg,
                "ok": bool(np.isfinite(v)) and max(ev, eg) <= C.RTOL,
            }
        )
    return rows


def agreement_only(sizes, libs) -> list[dict]:
    rows = []
    for n in sizes:
        X, y = C.problem(n)
        results = {}
        for lib in libs:
            try:
                results[lib] = peers.ADAPTERS[lib].build(X, y)(C.THETA)
            except Exception as e:
                log(f"SKIP {lib} at n={n}: incompatible here ({type(e).__name__}: {e})"[:300])
        rows += check_agreement(n, results, with_reference=n <= REF_MAX_N)
    return rows


# ----------------------------------------------------------------------------- speed


def measure_speed_isolated(n: int, libs, repeats: int, first: int = 0):
    """Each library timed in its own fresh process, one after the other.

    A child builds the step, runs it twice (compile + warm, the second also measures
    memory), then times ``repeats`` more steps. This is the default: in one process the
    libraries disturb each other (measured on the 2-core VM, n = 4000: scikit-learn's step
    2.7-2.9 s alone, 3.3 s interleaved with gpchol, 3.9-4.9 s interleaved with the JAX
    peers; the JAX steps barely move), which would flatter gpchol against scikit-learn.
    ``first``: index into ``libs`` of the library that runs first. Returns ``(times, cpu,
    values)`` like :func:`measure_speed`, each in the order of ``libs``.
    """
    times, cpu, values = {}, {}, {}
    rot = first % max(len(libs), 1)
    for lib in libs[rot:] + libs[:rot]:  # who goes first rotates from one n to the next
        rec = C.run_child(["--lib", lib, "--n", str(n), "--time", str(repeats)], 3600)
        if rec.get("status") != "ok" or not rec.get("times"):
            log(f"  SKIP {lib} at n={n}: {rec.get('status')}")
            continue
        times[lib], cpu[lib] = rec["times"], rec["cpu"]
        values[lib] = (rec["value"], np.asarray(rec["grad"]))
    order = [lib for lib in libs if lib in times]  # report in the requested order
    return (
        {lib: times[lib] for lib in order},
        {lib: cpu[lib] for lib in order},
        {lib: values[lib] for lib in order},
    )


def measure_speed(n: int, libs, repeats: int):
    """Interleaved timing of every library at one n, in this process (``--interleave``).

    Returns ``(times, cpu, values)``.
    """
    X, y = C.problem(n)
    steps, values = {}, {}
    times, cpu = {lib: [] for lib in libs}, {lib: [] for lib in libs}
    for lib in libs:
        try:
            steps[lib] = peers.ADAPTERS[lib].build(X, y)
            values[lib] = steps[lib](C.THETA)  # warm-up (compiles), and the agreement value
        except Exception as e:
            log(f"  SKIP {lib} at n={n}: {type(e).__name__}: {str(e)[:200]}")
            steps.pop(lib, None)
    order = list(steps)
    for r in range(repeats):
        rot = order[r % len(order) :] + order[: r % len(order)]  # rotate who goes first
        for lib in rot:
            dt, dc, _ = C.timed(steps[lib], C.THETA)
            times[lib].append(dt)
            cpu[lib].append(dc)
    keep = [lib for lib, ts in times.items() if ts]
    return {lib: times[lib] for lib in keep}, {lib: cpu[lib] for lib in keep}, values


# ----------------------------------------------------------------------------- memory / scale


def measure_memory(sizes, libs, timeout) -> list[dict]:
    rows = []
    for n in sizes:
        for lib in libs:
            rec = C.run_child(["--lib", lib, "--n", str(n), "--xla-memory"], timeout, _mem_cap())
            rec.update(lib=lib, n=n)
            rows.append(rec)
            log(f"  memory {lib:12s} n={n:6d}: " + _mem_str(rec))
    return rows


def _mem_cap() -> int | None:
    try:
        import psutil

        return int(psutil.virtual_memory().available - 2**30)
    except ImportError:
        return None


def _mem_str(rec) -> str:
    if rec.get("status") != "ok":
        return rec["status"]
    s = f"peak RSS {rec['peak_rss'] / 2**20:8.0f} MiB, step +{rec['step_peak'] / 2**20:7.0f} MiB"
    if "xla_temp" in rec:
        s += f", XLA temp {rec['xla_temp'] / 2**20:7.0f} MiB"
    return s


def scale_search(libs, sizes, per_timeout, budget) -> dict:
    """Largest n each library completes (first failure stops it), within ``budget`` s."""
    out = {}
    t_start = time.perf_counter()
    for lib in libs:
        largest, tried = None, []
        for n in sizes:
            left = budget - (time.perf_counter() - t_start)
            if left < 30:
                tried.append({"n": n, "status": "search budget spent"})
                break
            cap = _mem_cap()
            rec = C.run_child(["--lib", lib, "--n", str(n), "--once"], min(per_timeout, left), cap)
            rec["n"] = n
            rec["mem_cap"] = cap
            tried.append(rec)
            log(
                f"  scale {lib:12s} n={n:6d}: {rec['status']} ({rec['wall_s']:.0f} s)"
                + (f", peak RSS {rec['peak_rss'] / 2**30:.1f} GiB" if "peak_rss" in rec else "")
            )
            if rec["status"] != "ok":
                break
            largest = n
        out[lib] = {"largest_n": largest, "tried": tried}
    return out


# ----------------------------------------------------------------------------- other scripts


def run_suites(quick: bool, timeout: float) -> list[dict]:
    rows = []
    for script in SUITES:
        path = os.path.join(HERE, script)
        if not os.path.exists(path):
            log(f"SKIP {script}: not present (yet)")
            rows.append({"script": script, "status": "missing"})
            continue
        with open(path) as f:
            has_quick = '"--quick"' in f.read()
        extra = QUICK_ARGS.get(script, ["--quick"] if has_quick else []) if quick else []
        cmd = [sys.executable, path, *extra]
        log(f"running {' '.join(cmd[1:])} ...")
        t0 = time.perf_counter()
        try:
            p = subprocess.run(
                cmd, capture_output=True, text=True, timeout=timeout, cwd=os.path.dirname(HERE)
            )
            status = "ok" if p.returncode == 0 else f"failed (rc {p.returncode})"
            text = (p.stdout + ("\n" + p.stderr if p.returncode else "")).strip()
        except subprocess.TimeoutExpired as e:
            status = f"timeout (> {timeout:.0f} s)"
            text = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        lines = [ln for ln in text.splitlines() if "Warning" not in ln]
        rows.append(
            {
                "script": script,
                "status": status,
                "seconds": time.perf_counter() - t0,
                "output": "\n".join(lines[-40:]),
            }
        )
        log(f"  {script}: {status} ({rows[-1]['seconds']:.0f} s)")
    return rows


# ----------------------------------------------------------------------------- report


def _fmt_s(t):
    return f"{t * 1e3:.0f} ms" if t < 1 else f"{t:.2f} s"


# gpchol's two entries: the GP API (what a user fitting a GP calls) and mvn_logpdf on a
# covariance the user builds (the kernel differentiated by JAX's autodiff)
GPCHOL_ENTRIES = (("gpchol-gp", "GaussianProcess"), ("gpchol", "mvn_logpdf"))


def _ref(table) -> str:
    """The entry the ratios are taken against: the GP API when it ran."""
    return "gpchol-gp" if "gpchol-gp" in table else "gpchol"


def targets(speed: dict, cpu: dict, memory: list, scale: dict | None) -> list[dict]:
    """The issue's targets at n = 4000 (only those that this run measured), for each of
    gpchol's entries."""
    out = []
    for what, table in (("wall", speed), ("CPU time", cpu)):
        t = table.get(4000)
        for key, api in GPCHOL_ENTRIES:
            if not t or key not in t:
                continue
            g = C.median(t[key])
            for lib, goal in (("tinygp", 2.5), ("gpjax", 2.5), ("sklearn", 4.0)):
                if lib in t:
                    r = C.median(t[lib]) / g
                    out.append(
                        {
                            "target": f"speed ({what}, gpchol {api}) vs {lib} >= {goal}x",
                            "measured": r,
                            "met": r >= goal,
                        }
                    )
    mem = {(r["lib"], r["n"]): r for r in memory if r.get("status") == "ok"}
    for key, api in GPCHOL_ENTRIES:
        if (key, 4000) not in mem or ("jax-default", 4000) not in mem:
            continue
        g, j = mem[key, 4000], mem["jax-default", 4000]
        r = g["step_peak"] / j["step_peak"]
        out.append(
            {
                "target": f"step peak memory (gpchol {api}) vs JAX default <= 0.6x",
                "measured": r,
                "met": r <= 0.6,
            }
        )
        if "xla_temp" in g and "xla_temp" in j:
            r2 = (g["xla_temp"] + g["xla_args"]) / (j["xla_temp"] + j["xla_args"])
            out.append(
                {
                    "target": f"(XLA temp+args, gpchol {api}) vs JAX default <= 0.6x "
                    "(cross-check; host LAPACK buffers not included)",
                    "measured": r2,
                    "met": r2 <= 0.6,
                }
            )
    peer_max = max(
        ((v.get("largest_n") or 0) for k, v in (scale or {}).items() if not k.startswith("gpchol")),
        default=0,
    )
    for key, api in GPCHOL_ENTRIES:
        if peer_max and (scale or {}).get(key, {}).get("largest_n"):
            r = scale[key]["largest_n"] / peer_max
            out.append(
                {
                    "target": f"largest n (gpchol {api}) vs peers' largest >= 1.3x",
                    "measured": r,
                    "met": r >= 1.3,
                }
            )
    return out


def render_markdown(res: dict) -> str:
    m, v = res["machine"], res["versions"]
    libs = res["libs"]
    L = [f"# gpchol benchmarks, CPU, {m['date']}", ""]
    L.append(
        f"- machine: {m['processor']}, {m['cpus']} CPUs, {m['memory_gib']} GiB, {m['platform']}"
    )
    L.append("- versions: " + ", ".join(f"{k} {x}" for k, x in v.items() if x))
    L.append(
        f"- command: `{m['command']}`; float64; median of {res['repeats']} after a "
        "warm-up, "
        + (
            "libraries interleaved in one process"
            if res.get("interleave", True)  # results written before the option: interleaved
            else "each library in its own fresh process"
        )
        + "; the machine's 2 cores may be shared, so read the ratios (same run), not "
        "the absolute times"
    )
    L.append(
        "- problem: ExpSquared + noise, d = 3, value and gradient of the exact log "
        "marginal likelihood wrt (amplitude, lengthscale, noise); same X, y, theta "
        f"= {[float(t) for t in C.THETA]} for all; no jitter anywhere"
    )
    if m.get("loadavg"):
        L.append(f"- load average at the start (other jobs on the machine): {m['loadavg']}")
    for s in res.get("skipped", []):
        L.append(f"- skipped: {s}")
    threads = (
        "one thread per library (--single-thread)"
        if res.get("single_thread")
        else "default threading"
    )
    for title, table in (("wall time", res["speed"]), ("CPU time of the process", res["cpu"])):
        L += [
            "",
            f"## Value-and-gradient step, {title} ({threads}; in brackets: x gpchol-gp's)",
            "",
        ]
        L.append("| n | " + " | ".join(libs) + " |")
        L.append("|---:|" + "---:|" * len(libs))
        for n, t in table.items():
            g = C.median(t.get(_ref(t), []))
            cells = []
            for lib in libs:
                if lib in t:
                    med = C.median(t[lib])
                    cells.append(f"{_fmt_s(med)} ({med / g:.2f}x)")
                else:
                    cells.append("–")
            L.append(f"| {n} | " + " | ".join(cells) + " |")
    if res["agreement"]:
        L += ["", f"## Agreement with gpchol (relative; tolerance {C.RTOL:g})", ""]
        L.append("| n | library | log ML | rel. value | max rel. gradient | ok |")
        L.append("|---:|---|---:|---:|---:|---|")
        for r in res["agreement"]:
            L.append(
                f"| {r['n']} | {r['lib']} | {r['value']:.10g} | {r['rel_value']:.1e} | "
                f"{r['rel_grad']:.1e} | {'yes' if r['ok'] else '**NO**'} |"
            )
    if res["memory"]:
        L += [
            "",
            "## Peak memory of one step (fresh process per library and n)",
            "",
            "Step peak = peak RSS during a second (compiled) step minus the RSS after "
            "imports, data and the library's setup (what the compiled program and the "
            "allocator keep is included); peak RSS = the whole process's peak, compilation "
            "included. XLA = temp + argument "
            "buffers from `memory_analysis()`. n x n float64 = "
            + ", ".join(
                f"{n}: {n * n * 8 / 2**20:.0f} MiB" for n in sorted({r["n"] for r in res["memory"]})
            )
            + ".",
            "",
        ]
        free = (m["memory_gib"] - 3.0) * 2**30
        L.append(
            f"Predicted largest n = sqrt({free / 2**30:.1f} GiB / (XLA temp+args per n²)), "
            "i.e. total memory less 3 GiB (a prediction; `--scale` measures it)."
        )
        L.append("")
        L.append(
            "| n | library | peak RSS | step peak | step peak / n²·8 | XLA temp+args | "
            "XLA / n²·8 | predicted largest n |"
        )
        L.append("|---:|---|---:|---:|---:|---:|---:|---:|")
        for r in res["memory"]:
            if r.get("status") != "ok":
                L.append(f"| {r['n']} | {r['lib']} | {r['status']} | | | | | |")
                continue
            nn = r["n"] ** 2 * 8
            xla, coef, pred = "–", "–", "–"
            if "xla_temp" in r:
                x = r["xla_temp"] + r["xla_args"]
                xla, coef = f"{x / 2**20:.0f} MiB", f"{x / nn:.2f}"
                pred = f"{int((free / (x / r['n'] ** 2)) ** 0.5):,}"
            L.append(
                f"| {r['n']} | {r['lib']} | {r['peak_rss'] / 2**20:.0f} MiB | "
                f"{r['step_peak'] / 2**20:.0f} MiB | {r['step_peak'] / nn:.2f} | {xla} | "
                f"{coef} | {pred} |"
            )
    if res.get("scale"):
        L += ["", "## Largest n completed (fresh process each; first failure stops)", ""]
        L.append("| library | largest n | first failure |")
        L.append("|---|---:|---|")
        for lib, s in res["scale"].items():
            fail = next(
                (f"n={t['n']}: {t['status']}" for t in s["tried"] if t["status"] != "ok"),
                "none within the sizes tried",
            )
            L.append(f"| {lib} | {s['largest_n'] or '–'} | {fail} |")
    if res["targets"]:
        L += ["", "## Targets (issue 8, n = 4000)", ""]
        L.append("| target | measured | met |")
        L.append("|---|---:|---|")
        for t in res["targets"]:
            L.append(f"| {t['target']} | {t['measured']:.2f} | {'yes' if t['met'] else '**no**'} |")
    for s in res.get("suites", []):
        L += ["", f"## {s['script']}: {s['status']}", ""]
        if s.get("output"):
            L += ["```", s["output"], "```"]
    return "\n".join(L) + "\n"


def readme_snippet(res: dict) -> str:
    # gpchol-gp (the reference of the ratios) first, then gpchol's mvn_logpdf, then the peers
    libs = sorted(res["libs"], key=lambda x: {"gpchol-gp": 0, "gpchol": 1}.get(x, 2))
    names = {"gpchol-gp": "gpchol GaussianProcess", "gpchol": "gpchol mvn_logpdf"}
    m = res["machine"]
    single = res.get("single_thread")
    table = res.get("cpu") if single else res["speed"]
    what = "CPU time per step, one thread per library" if single else "time per step"
    L = [
        f"Value-and-gradient of the exact GP log marginal likelihood (ExpSquared + noise, "
        f"d = 3, float64), {m['cpus']}-core CPU ({m['processor']}), {m['date'][:10]}; "
        f"{what} and, in brackets, relative to gpchol's GaussianProcess (gpchol-gp) "
        "(`python -m benchmarks`, full table in `benchmarks/results/`):",
        "",
    ]
    L.append("| n | " + " | ".join(names.get(x, x) for x in libs) + " |")
    L.append("|---:|" + "---:|" * len(libs))
    for n, t in table.items():
        g = C.median(t.get(_ref(t), []))
        L.append(
            f"| {n} | "
            + " | ".join(
                f"{_fmt_s(C.median(t[x]))} ({C.median(t[x]) / g:.1f}x)" if x in t else "–"
                for x in libs
            )
            + " |"
        )
    return "\n".join(L)


# ----------------------------------------------------------------------------- main


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="CI-sized: n = 500, 1000; memory at n = 1000 (gpchol, JAX default); "
        "other scripts --quick",
    )
    p.add_argument("--sizes", type=int, nargs="+", help="n values (default 1000 2000 4000 8000)")
    p.add_argument("--repeats", type=int, default=5, help="timed runs per library and n (>= 5)")
    p.add_argument(
        "--libs", nargs="+", choices=list(peers.ADAPTERS), default=list(peers.DEFAULT_LIBS)
    )
    p.add_argument(
        "--memory-sizes",
        type=int,
        nargs="+",
        help="n values of the fresh-process memory runs (default: the sizes)",
    )
    p.add_argument("--no-memory", action="store_true")
    p.add_argument("--no-speed", action="store_true", help="skip the timing (memory etc. only)")
    p.add_argument(
        "--memory-libs",
        nargs="+",
        choices=list(peers.ADAPTERS),
        help="libraries of the memory runs (default: all that run)",
    )
    p.add_argument(
        "--single-thread",
        action="store_true",
        help="every library on one thread (for a machine loaded by other jobs)",
    )
    p.add_argument(
        "--interleave",
        action="store_true",
        help="time all libraries in this one process, round by round (default: a fresh "
        "process per library; in one process they slow each other down)",
    )
    p.add_argument(
        "--no-suites", action="store_true", help="do not run the other benchmarks/*.py scripts"
    )
    p.add_argument("--scale", action="store_true", help="search the largest n (full mode only)")
    p.add_argument("--scale-sizes", type=int, nargs="+", default=list(SCALE_SIZES))
    p.add_argument(
        "--scale-timeout",
        type=float,
        default=1200.0,
        help="seconds allowed for one step in the scale search",
    )
    p.add_argument(
        "--scale-budget", type=float, default=3 * 3600.0, help="total seconds for the scale search"
    )
    p.add_argument(
        "--agreement-only",
        action="store_true",
        help="values only: agreement of every library with gpchol; exit 1 if any disagrees",
    )
    p.add_argument("--out-dir", default=os.path.join(HERE, "results"))
    p.add_argument("--no-write", action="store_true", help="print only, write no files")
    p.add_argument(
        "--render",
        metavar="JSON",
        help="re-render the markdown (and README snippet) from a results JSON",
    )
    # internal: one measurement in a fresh process
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--lib", help=argparse.SUPPRESS)
    p.add_argument("--n", type=int, help=argparse.SUPPRESS)
    p.add_argument("--xla-memory", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--once", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--time", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)

    if args.child:
        child_main(args)
        return 0
    if args.render:
        with open(args.render) as f:
            res = json.load(f)
        for key in ("speed", "cpu"):
            res[key] = {int(n): t for n, t in res.get(key, {}).items()}
        md = render_markdown(res)
        with open(os.path.splitext(args.render)[0] + ".md", "w") as f:
            f.write(md)
        log(md)
        log("---- README snippet ----\n" + readme_snippet(res))
        return 0

    if args.single_thread:
        C.single_thread_env()  # before JAX is imported; children inherit the environment
    peers.enable_x64()
    skipped = []
    libs = peers.available(args.libs, report=lambda s: (log(s), skipped.append(s[5:])))
    if not any(x.startswith("gpchol") for x in libs):
        log("gpchol itself is not importable: nothing to compare against.")
        return 2

    if args.agreement_only:
        rows = agreement_only(args.sizes or [300], libs)
        bad = [r for r in rows if not r["ok"]]
        for r in rows:
            log(
                f"n={r['n']:5d} {r['lib']:28s} value {r['value']:.12g}  rel.value "
                f"{r['rel_value']:.1e}  rel.grad {r['rel_grad']:.1e}  "
                + ("ok" if r["ok"] else "DISAGREES")
            )
        return 1 if bad else 0

    if args.quick:
        sizes = args.sizes or [500, 1000]
        mem_sizes = args.memory_sizes or [1000]
        if args.scale:
            log("--scale is ignored with --quick (the search takes hours)")
            args.scale = False
    else:
        sizes = args.sizes or [1000, 2000, 4000, 8000]
        mem_sizes = args.memory_sizes or sizes
    repeats = max(args.repeats, 5)

    res = {
        "machine": C.machine_info(),
        "versions": C.versions(),
        "libs": libs,
        "repeats": repeats,
        "sizes": sizes,
        "skipped": skipped,
        "speed": {},
        "cpu": {},
        "single_thread": args.single_thread,
        "interleave": args.interleave,
        "speed_raw": {},
        "agreement": [],
        "memory": [],
        "scale": None,
        "suites": [],
    }
    log(
        f"gpchol benchmark suite: {res['machine']['processor']}, {res['machine']['cpus']} CPUs;"
        f" libraries: {', '.join(libs)}; n = {sizes}; median of {repeats}, "
        + ("interleaved in one process" if args.interleave else "a fresh process per library")
    )
    t_all = time.perf_counter()
    for n in [] if args.no_speed else sizes:
        if args.interleave:
            times, cpu, values = measure_speed(n, libs, repeats)
        else:
            times, cpu, values = measure_speed_isolated(n, libs, repeats, sizes.index(n))
        res["speed"][n], res["cpu"][n] = times, cpu
        for what, tt in (("wall", times), ("CPU ", cpu)):
            g = C.median(tt.get(_ref(tt), [float("nan")]))
            log(
                f"n={n:6d} {what}: "
                + " | ".join(
                    f"{lib} {_fmt_s(C.median(ts))} ({C.median(ts) / g:.2f}x)"
                    for lib, ts in tt.items()
                )
            )
        rows = check_agreement(n, values, with_reference=n <= REF_MAX_N)
        for r in rows:
            if not r["ok"]:
                log(
                    f"  DISAGREES: {r['lib']} at n={n}: rel. value {r['rel_value']:.1e}, "
                    f"rel. gradient {r['rel_grad']:.1e}"
                )
        res["agreement"] += rows
    if not args.no_memory:
        log("memory (fresh process per library and n):")
        default_mem = ("gpchol", "gpchol-gp", "jax-default") if args.quick else libs
        mem_libs = [x for x in (args.memory_libs or default_mem) if x in libs]
        res["memory"] = measure_memory(mem_sizes, mem_libs, timeout=900 if not args.quick else 120)
    if args.scale:
        log(f"scale search (budget {args.scale_budget:.0f} s):")
        scale_libs = list(libs)
        res["scale"] = scale_search(
            scale_libs, args.scale_sizes, args.scale_timeout, args.scale_budget
        )
    if not args.no_suites:
        res["suites"] = run_suites(args.quick, timeout=150 if args.quick else 3600)
    res["targets"] = targets(res["speed"], res["cpu"], res["memory"], res["scale"])
    res["total_s"] = time.perf_counter() - t_all

    md = render_markdown(res)
    if not args.no_write:
        os.makedirs(args.out_dir, exist_ok=True)
        stem = os.path.join(
            args.out_dir,
            f"cpu-{time.strftime('%Y-%m-%d')}"
            + ("-quick" if args.quick else "")
            + ("-1thread" if args.single_thread else ""),
        )
        with open(stem + ".md", "w") as f:
            f.write(md)
        with open(stem + ".json", "w") as f:
            json.dump(res, f, indent=1, default=float)
        log(f"wrote {stem}.md and {stem}.json")
    log("\n" + md)
    log("---- README snippet ----\n" + readme_snippet(res))
    bad = [r for r in res["agreement"] if not r["ok"]]
    if bad:
        log(f"{len(bad)} agreement check(s) FAILED")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
