"""Shared pieces of the benchmark suite: the problem, the timing and memory helpers.

Every library is handed the *same* problem: inputs ``X`` of shape ``(n, 3)`` uniform on
``[0, 10]^3`` and targets ``y`` of shape ``(n,)`` from a fixed seed, and the same
hyperparameters in one parametrisation, the "natural" one::

    theta = (amplitude a, lengthscale l, noise variance s)
    K     = a * exp(-|x - x'|^2 / (2 l^2)) + s * I

Each adapter (:mod:`benchmarks.peers`) maps ``theta`` to its library's own parameters and
maps the gradient back (chain rule), so values and gradients are directly comparable.
"""

from __future__ import annotations

import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time

import numpy as np

#: Hyperparameters at which every library is evaluated: (amplitude, lengthscale, noise).
THETA = np.array([1.3, 1.5, 0.1])
PARAM_NAMES = ("amplitude", "lengthscale", "noise")
DIM = 3

#: Agreement tolerance (relative to gpchol's value and to each gradient component).
RTOL = 1e-8


def problem(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``(X (n, 3), y (n,))`` float64, the same for every library and process."""
    rng = np.random.default_rng(seed)
    X = rng.uniform(0.0, 10.0, (n, DIM))
    y = np.sin(X @ np.array([0.7, -0.4, 0.3])) + 0.3 * rng.standard_normal(n)
    return X, y


def reference_numpy(X: np.ndarray, y: np.ndarray, theta=THETA) -> tuple[float, np.ndarray]:
    """Value and gradient by the textbook formulas with SciPy (an independent check).

    ``d log p / d t = 1/2 tr((alpha alpha^T - K^-1) dK/dt)`` (Rasmussen & Williams, 5.9).
    Costs several n x n buffers; meant for small n (tests, diagnosis).
    """
    import scipy.linalg as sl

    a, ell, s = (float(t) for t in theta)
    d2 = np.zeros((X.shape[0], X.shape[0]))
    for k in range(X.shape[1]):  # same summation order as gpchol's kernels
        d2 += (X[:, None, k] - X[None, :, k]) ** 2
    E = np.exp(-0.5 * d2 / ell**2)
    K = a * E + s * np.eye(X.shape[0])
    c = sl.cho_factor(K, lower=True)
    alpha = sl.cho_solve(c, y)
    n = y.shape[0]
    value = -0.5 * y @ alpha - np.sum(np.log(np.diag(c[0]))) - 0.5 * n * np.log(2 * np.pi)
    W = np.outer(alpha, alpha) - sl.cho_solve(c, np.eye(n))
    grads = [E, a * E * d2 / ell**3, np.eye(n)]
    return float(value), np.array([0.5 * np.sum(W * G) for G in grads])


def rel_err(value, grad, ref_value, ref_grad) -> tuple[float, float]:
    """Relative error of the value and the largest relative error of a gradient component."""
    ev = abs(value - ref_value) / max(abs(ref_value), 1e-300)
    ref_grad = np.asarray(ref_grad, float)
    eg = np.max(np.abs(np.asarray(grad, float) - ref_grad) / np.maximum(np.abs(ref_grad), 1e-300))
    return float(ev), float(eg)


def current_rss() -> int:
    """Resident set size of this process in bytes (from /proc, psutil as fallback)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        import psutil

        return psutil.Process().memory_info().rss


def _status_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def reset_peak_rss() -> bool:
    """Reset this process's peak-RSS mark (``VmHWM``) to its current RSS (Linux >= 4.0)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_rss() -> int:
    """Peak resident set size of this process in bytes.

    ``VmHWM`` from ``/proc/self/status`` (per address space: a fresh ``exec`` starts anew,
    and :func:`reset_peak_rss` resets it). Not ``ru_maxrss``: on Linux that one survives
    ``fork`` + ``exec``, so a child reports at least its parent's resident size at the fork.
    """
    kib = _status_kib("VmHWM")
    if kib is not None:
        return kib * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def timed(fn, *args):
    """``(wall seconds, CPU seconds of this process, result)`` of one call.

    The adapters return host values, so the call is synchronous. The CPU time (all threads
    of this process, ``time.process_time``) is the robust figure on a machine that other
    processes load: waiting for a core does not count; busy-waiting threads do.
    """
    c0, t0 = time.process_time(), time.perf_counter()
    out = fn(*args)
    return time.perf_counter() - t0, time.process_time() - c0, out


def single_thread_env() -> None:
    """Make every library compute on one thread (call before JAX is imported).

    XLA's CPU client: no Eigen/intra-op thread pool; OpenBLAS/OpenMP (NumPy, SciPy,
    scikit-learn, JAX's LAPACK calls) capped at one thread through threadpoolctl. Used by
    ``--single-thread`` on a machine shared with other jobs, where multi-threaded barriers
    make wall times meaningless.
    """
    flags = os.environ.get("XLA_FLAGS", "")
    for f in ("--xla_cpu_multi_thread_eigen=false", "intra_op_parallelism_threads=1"):
        if f.split("=")[0] not in flags:
            flags += " " + f
    os.environ["XLA_FLAGS"] = flags.strip()
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = "1"
    try:
        from threadpoolctl import threadpool_limits

        threadpool_limits(1)
    except ImportError:
        pass


def median(xs):
    return statistics.median(xs) if xs else float("nan")


def command_line() -> str:
    """The command that started this process, as a user would type it again: ``python -m
    MODULE ARGS`` for a module run with ``-m``, else ``python SCRIPT ARGS``."""
    python = os.path.basename(sys.executable)
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is not None and spec.name:
        module = spec.name.removesuffix(".__main__")
        return " ".join([python, "-m", module, *sys.argv[1:]])
    return " ".join([python, *sys.argv])


def machine_info() -> dict:
    info = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": _cpu_model(),
        "cpus": os.cpu_count(),
        "loadavg": [round(x, 1) for x in os.getloadavg()],
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "command": command_line(),
    }
    try:
        import psutil

        info["memory_gib"] = round(psutil.virtual_memory().total / 2**30, 1)
    except ImportError:
        pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        info["memory_gib"] = round(pages / 2**30, 1)
    for var in ("OPENBLAS_CORETYPE", "XLA_FLAGS", "OMP_NUM_THREADS"):
        if os.environ.get(var):
            info[var] = os.environ[var]
    return info


def write_record(path: str, record: dict) -> None:
    """Writes a benchmark's ``record`` as JSON to ``path``, with :func:`machine_info`."""
    import json
    from pathlib import Path

    record.update(machine=machine_info())
    Path(path).write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {path}")


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def versions() -> dict:
    """Versions of the libraries the suite can use (``None`` where not installed)."""
    from importlib import metadata

    out = {}
    for dist in (
        "gpchol",
        "jax",
        "jaxlib",
        "numpy",
        "scipy",
        "tinygp",
        "gpjax",
        "scikit-learn",
        "torch",
        "gpytorch",
        "numpyro",
        "psutil",
    ):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    return out


def run_child(args: list[str], timeout: float, mem_limit: int | None = None) -> dict:
    """Run ``python -m benchmarks.run --child ...`` in a fresh process; parse its JSON line.

    The child's resident memory is polled (psutil) and the child is killed when it passes
    ``mem_limit`` bytes, so the scale search never drives the shared machine into the
    kernel's OOM killer. Returns the child's record, or ``{"status": <why not>}``.
    """
    cmd = [sys.executable, "-m", "benchmarks.run", "--child", *args]
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=root, env=env
    )
    status, peak_seen = None, 0
    try:
        import psutil

        ps = psutil.Process(proc.pid)
    except Exception:  # psutil missing: rely on the child's own ru_maxrss and the timeout
        ps = None
    while proc.poll() is None:
        elapsed = time.perf_counter() - t0
        if elapsed > timeout:
            status = f"timeout (> {timeout:.0f} s)"
            break
        if ps is not None:
            try:
                rss = ps.memory_info().rss
            except Exception:
                rss = 0
            peak_seen = max(peak_seen, rss)
            if mem_limit and rss > mem_limit:
                status = f"out of memory (> {mem_limit / 2**30:.1f} GiB cap)"
                break
        time.sleep(0.05)
    if status is not None:
        proc.kill()
        proc.communicate()
        return {"status": status, "wall_s": time.perf_counter() - t0, "rss_seen": peak_seen}
    out, err = proc.communicate()
    for line in reversed(out.splitlines()):
        if line.startswith("{"):
            rec = json.loads(line)
            rec.setdefault("status", "ok")
            rec["wall_s"] = time.perf_counter() - t0
            return rec
    why = "killed (OOM?)" if proc.returncode in (-9, 137) else f"failed (rc {proc.returncode})"
    tail = (err or out).strip().splitlines()[-1:] or [""]
    return {"status": f"{why}: {tail[0][:200]}", "wall_s": time.perf_counter() - t0}
