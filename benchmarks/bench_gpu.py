"""GPU benchmarks of gpchol's CUDA kernels, and the report of ``benchmarks/gpu_check.sh``.

Three subcommands:

``smoke``
    The first check after the build: calls each of the library's eight FFI targets once on
    tiny inputs (including the paths that take scratch memory from XLA) and prints one
    verdict line per target, ``OK`` or ``FAIL`` with the error. A CUDA fault is sticky in
    a process, so after a failure the remaining targets run in a fresh process (while the
    time budget lasts). Builds and benchmarks nothing; about 10-20 s on a GPU.

``run``
    Times, on the default GPU, for float64 and float32:

    * forward, n = 4096 / 16384 / 32768: ``gpchol._cuda.ffi.potrf`` (cuSOLVER per matrix, and
      gpchol's tiled algorithm) against ``jnp.linalg.cholesky`` (and
      ``lax.linalg.cholesky`` without its symmetrization);
    * reverse pass: ``gpchol._cuda.ffi.potrf_adjoint`` over our forward;
    * value-and-gradient (wrt K) of a Gaussian log-likelihood, gpchol's kernels against
      JAX's default rules (and through ``gpchol.cholesky(backend="cuda")``);
    * batched n = 32 / 64, batch 10,000: forward + gradient against XLA's batched path.

    Order: n = 4096, then the batched items, then n = 16384, then 32768 (a cut run keeps
    the cheap, most informative figures). ``--sweep`` adds a sweep of block sizes at
    n = 16384 (not on a first run).

    Each figure is the median of several runs after a warm-up (compile) run; inputs are
    regenerated (donated buffers) before each timed run. Results are appended to
    ``OUT/bench_raw.json`` after every measurement, so a timeout keeps what was measured.
    Failures are recorded with their error text, and the next item runs.

``report``
    Merges the stage log of ``gpu_check.sh`` (``OUT/stages.tsv``), the smoke verdicts
    (``OUT/smoke.log``), the pytest JUnit XML of each test group (``OUT/pytest_<group>.xml``,
    else its ``-v`` log ``OUT/tests_<group>.log``), the benchmark figures and the
    environment (device, versions) into ``OUT/gpu_results.json`` and a short table
    ``OUT/gpu_results.md``, and checks the issue's performance targets.

``OUT`` is ``$OUT`` if set, else ``./gpu_out``. ``--fake-ffi`` (and ``--smoke`` for ``run``)
runs the script on a CPU, gpchol's kernels replaced by JAX ops (to test the script).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import socket
import statistics
import sys
import time
import traceback
import xml.etree.ElementTree as ET
from datetime import UTC, datetime
from functools import partial
from pathlib import Path

SIZES = (4096, 16384, 32768)
TEST_GROUPS = ("small", "large", "api")  # the gpu test processes of gpu_check.sh
BATCHED = ((32, 10_000), (64, 10_000))
DTYPES = ("float64", "float32")
# Targets of the issue: (label, ratio key, comparison, target)
TARGETS = (
    ("forward >= 0.9x cuSOLVER (jnp.linalg.cholesky), n >= 16384", "forward_speedup", ">=", 0.9),
    ("reverse pass <= 2.5x our forward", "reverse_over_forward", "<=", 2.5),
    ("log-likelihood value+grad >= 3x faster than JAX default", "loglik_speedup", ">=", 3.0),
    ("batched forward+grad >= 2x faster than XLA", "batched_speedup", ">=", 2.0),
)


def out_dir() -> Path:
    return Path(os.environ.get("OUT") or "gpu_out")


# ----------------------------------------------------------------------------------------
# Recording
# ----------------------------------------------------------------------------------------


class Recorder:
    """Appends results and failures to a JSON file after each measurement."""

    def __init__(self, path: Path, meta: dict):
        self.path = path
        self.data = {"meta": meta, "results": [], "errors": [], "skipped": []}
        self.flush()

    def flush(self):
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1, default=str))
        tmp.replace(self.path)

    def result(self, **fields):
        self.data["results"].append(fields)
        self.flush()
        shown = {k: v for k, v in fields.items() if k not in ("runs",)}
        print("  ", json.dumps(shown, default=str), flush=True)

    def error(self, name: str, err: BaseException):
        text = "".join(traceback.format_exception_only(type(err), err)).strip()
        self.data["errors"].append({"name": name, "error": text[-2000:]})
        self.flush()
        print(f"   FAILED {name}: {text[-500:]}", flush=True)

    def skip(self, name: str, why: str):
        self.data["skipped"].append({"name": name, "why": why})
        self.flush()
        print(f"   skipped {name}: {why}", flush=True)


# ----------------------------------------------------------------------------------------
# The functions under test
# ----------------------------------------------------------------------------------------


def make_ops(fake_ffi: bool):
    """(potrf, potrf_adjoint) of gpchol._cuda.ffi, or JAX stand-ins for --fake-ffi."""
    import jax
    import jax.numpy as jnp

    if not fake_ffi:
        from gpchol._internal import cuda_ffi

        return cuda_ffi.potrf, cuda_ffi.potrf_adjoint

    def potrf(a, *, tile_size=None):
        del tile_size
        return jnp.linalg.cholesky(a), jnp.zeros(a.shape[:-2], jnp.int32)

    def potrf_adjoint(L, Lbar, *, tile_size=None):
        del tile_size
        a = L @ jnp.swapaxes(L, -1, -2)
        _, vjp = jax.vjp(jnp.linalg.cholesky, a)
        return vjp(Lbar)[0]

    return potrf, potrf_adjoint


def make_chol(potrf, potrf_adjoint, tile_size=None):
    """A differentiable Cholesky on gpchol's kernels: forward potrf, reverse the adjoint."""
    import jax

    @jax.custom_vjp
    def chol(a):
        return potrf(a, tile_size=tile_size)[0]

    def fwd(a):
        L = chol(a)
        return L, L

    def bwd(L, Lbar):
        return (potrf_adjoint(L, Lbar),)

    chol.defvjp(fwd, bwd)
    return chol


def loglik(chol, k, y):
    """Gaussian log-likelihood log N(y | 0, K) through the factor chol(K)."""
    import jax
    import jax.numpy as jnp

    L = chol(k)
    z = jax.scipy.linalg.solve_triangular(L, y, lower=True)
    n = y.shape[-1]
    return -0.5 * z @ z - jnp.sum(jnp.log(jnp.diagonal(L))) - 0.5 * n * math.log(2 * math.pi)


def kernel_matrix(n: int, dtype, seed: int):
    """Exponentiated-quadratic GP covariance of n random points in 3-D, plus unit noise."""
    import jax
    import jax.numpy as jnp

    @partial(jax.jit, static_argnums=(0, 1))
    def build(n, dtype, key):
        x = jax.random.uniform(key, (n, 3), dtype=dtype)
        sq = jnp.sum(x * x, axis=1)
        d2 = jnp.maximum(sq[:, None] + sq[None, :] - 2 * (x @ x.T), 0)
        return jnp.exp(-d2 / (2 * 0.3**2)) + jnp.eye(n, dtype=dtype)

    return build(n, jnp.dtype(dtype), jax.random.key(seed))


def batched_spd(batch: int, n: int, dtype, seed: int):
    import jax
    import jax.numpy as jnp

    @partial(jax.jit, static_argnums=(0, 1, 2))
    def build(batch, n, dtype, key):
        m = jax.random.normal(key, (batch, n, n), dtype=dtype)
        return m @ jnp.swapaxes(m, -1, -2) / n + jnp.eye(n, dtype=dtype)

    return build(batch, n, jnp.dtype(dtype), jax.random.key(seed))


# ----------------------------------------------------------------------------------------
# Timing
# ----------------------------------------------------------------------------------------


def block(x):
    import jax

    return jax.block_until_ready(x)


def time_call(fn, make_args, *, min_runs=3, max_runs=10, min_total_s=1.0):
    """Median seconds of fn(*make_args()) after one warm-up; args made outside the timing.

    Returns:
        (median seconds, first-call seconds including compilation, list of run times).
    """
    args = make_args()
    block(args)
    t0 = time.perf_counter()
    block(fn(*args))
    first = time.perf_counter() - t0
    runs = []
    total = 0.0
    while len(runs) < max_runs and (len(runs) < min_runs or total < min_total_s):
        args = make_args()
        block(args)
        t0 = time.perf_counter()
        out = fn(*args)
        block(out)
        dt = time.perf_counter() - t0
        del out
        runs.append(dt)
        total += dt
    return statistics.median(runs), first, runs


# ----------------------------------------------------------------------------------------
# The benchmarks
# ----------------------------------------------------------------------------------------


class Bench:
    def __init__(
        self, rec: Recorder, fake_ffi: bool, deadline: float, reps: int, sweep: bool = False
    ):
        import jax
        import jax.numpy as jnp

        self.jax, self.jnp = jax, jnp
        self.rec = rec
        self.deadline = deadline
        self.reps = reps
        self.potrf, self.potrf_adjoint = make_ops(fake_ffi)
        self.fake_ffi = fake_ffi
        self.sweep_n = 16384 if sweep else -1  # where block sizes are swept (--sweep)

    def time_left(self) -> float:
        return self.deadline - time.perf_counter()

    def measure(self, name, fn, make_args, **fields):
        """Times one item; records the result or the failure; returns seconds or None."""
        if self.time_left() <= 0:
            self.rec.skip(name, "time budget of the benchmark stage used up")
            return None
        try:
            sec, first, runs = time_call(fn, make_args, min_runs=self.reps)
        except Exception as err:
            self.rec.error(name, err)
            return None
        self.rec.result(name=name, seconds=sec, first_call_seconds=first, runs=runs, **fields)
        return sec

    def ratio(self, name, num, den, **fields):
        if num is None or den is None or den <= 0:
            self.rec.skip(name, "a figure it needs is missing")
            return
        self.rec.result(name=name, ratio=num / den, **fields)

    # -- one matrix size ------------------------------------------------------------------

    def large(self, n: int, dtype: str):
        jax, jnp = self.jax, self.jnp
        tag = {"n": n, "dtype": dtype}
        flops_fwd = n**3 / 3
        try:
            k = kernel_matrix(n, dtype, seed=n)
            y = jax.random.normal(jax.random.key(1), (n,), dtype=jnp.dtype(dtype))
            block((k, y))
        except Exception as err:
            self.rec.error(f"inputs n={n} {dtype}", err)
            return
        copy = jax.jit(lambda x: x + 0)

        def fresh_k():
            return (copy(k),)

        ours = jax.jit(lambda a: self.potrf(a), donate_argnums=0)
        t_ours = self.measure("forward_gpchol_cusolver", ours, fresh_k, **tag)
        t_tiled = self.measure(
            "forward_gpchol_tiled",
            jax.jit(lambda a: self.potrf(a, tile_size=1024), donate_argnums=0),
            fresh_k,
            tile_size=1024,
            **tag,
        )
        t_xla = self.measure(
            "forward_jnp_linalg_cholesky", jax.jit(jnp.linalg.cholesky), fresh_k, **tag
        )
        t_xla_raw = self.measure(
            "forward_lax_cholesky_nosym",
            jax.jit(partial(jax.lax.linalg.cholesky, symmetrize_input=False)),
            fresh_k,
            **tag,
        )
        for label, t in (("gpchol_cusolver", t_ours), ("gpchol_tiled", t_tiled),
                         ("jnp", t_xla), ("lax_nosym", t_xla_raw)):  # fmt: skip
            if t:
                self.rec.result(name=f"gflops_forward_{label}", gflops=flops_fwd / t / 1e9, **tag)
        best_ours = min(t for t in (t_ours, t_tiled) if t) if (t_ours or t_tiled) else None
        self.ratio("forward_speedup", t_xla, best_ours, vs="jnp.linalg.cholesky", **tag)
        self.ratio("forward_speedup_cusolver_path", t_xla, t_ours, **tag)
        self.ratio("forward_speedup_tiled_path", t_xla, t_tiled, **tag)

        # Reverse pass alone (Lbar donated, fresh each run).
        try:
            L = block(jax.jit(lambda a: self.potrf(a)[0])(copy(k)))
            lbar = block(jax.random.normal(jax.random.key(2), (n, n), dtype=jnp.dtype(dtype)))
        except Exception as err:
            self.rec.error(f"reverse inputs n={n} {dtype}", err)
            L = None
        if L is not None:
            adj = jax.jit(lambda L, b: self.potrf_adjoint(L, b), donate_argnums=1)
            t_rev = self.measure("reverse_gpchol", adj, lambda: (L, copy(lbar)), **tag)
            if t_rev:
                self.rec.result(
                    name="gflops_reverse_gpchol", gflops=2 * flops_fwd / t_rev / 1e9, **tag
                )
            self.ratio("reverse_over_forward", t_rev, t_ours, **tag)

        # A small sweep of block sizes at n = 16384, to tune the defaults.
        if n == self.sweep_n and L is not None:
            for tile in (512, 2048):
                self.measure(
                    "forward_gpchol_tiled_sweep",
                    jax.jit(lambda a, t=tile: self.potrf(a, tile_size=t), donate_argnums=0),
                    fresh_k,
                    tile_size=tile,
                    **tag,
                )
            for tile in (128, 256, 512, 1024):
                self.measure(
                    "reverse_gpchol_sweep",
                    jax.jit(
                        lambda L, b, t=tile: self.potrf_adjoint(L, b, tile_size=t),
                        donate_argnums=1,
                    ),
                    lambda: (L, copy(lbar)),
                    tile_size=tile,
                    **tag,
                )

        L = lbar = None  # free 2 n^2 before the log-likelihood (JAX's default needs ~6 n^2)

        # Gaussian log-likelihood, value and gradient wrt K.
        chol_ours = make_chol(self.potrf, self.potrf_adjoint)
        vg_ours = jax.jit(jax.value_and_grad(partial(loglik, chol_ours)))
        vg_default = jax.jit(jax.value_and_grad(partial(loglik, jnp.linalg.cholesky)))
        t_ll_ours = self.measure("loglik_vg_gpchol", vg_ours, lambda: (k, y), **tag)
        t_ll_def = self.measure("loglik_vg_jax_default", vg_default, lambda: (k, y), **tag)
        self.ratio("loglik_speedup", t_ll_def, t_ll_ours, **tag)
        self.ratio("loglik_vg_over_forward_gpchol", t_ll_ours, t_ours, **tag)
        self.ratio("loglik_vg_over_forward_jax_default", t_ll_def, t_xla, **tag)
        if not self.fake_ffi:
            try:
                import gpchol

                chol_public = partial(gpchol.cholesky, backend="cuda")
                vg_public = jax.jit(jax.value_and_grad(partial(loglik, chol_public)))
                t_pub = self.measure("loglik_vg_gpchol_public", vg_public, lambda: (k, y), **tag)
                self.ratio("loglik_speedup_public_api", t_ll_def, t_pub, **tag)
            except Exception as err:
                self.rec.error(f"loglik_vg_gpchol_public n={n} {dtype}", err)

    # -- batched small matrices -----------------------------------------------------------

    def batched(self, n: int, batch: int, dtype: str):
        jax, jnp = self.jax, self.jnp
        tag = {"n": n, "batch": batch, "dtype": dtype}
        try:
            a = block(batched_spd(batch, n, dtype, seed=n))
            w = block(jax.random.normal(jax.random.key(3), (batch, n, n), dtype=jnp.dtype(dtype)))
        except Exception as err:
            self.rec.error(f"batched inputs n={n} {dtype}", err)
            return
        chol_ours = make_chol(self.potrf, self.potrf_adjoint)

        def loss(chol, x):
            return jnp.sum(chol(x) * w)

        f_ours = jax.jit(lambda x: self.potrf(x)[0])
        f_xla = jax.jit(jnp.linalg.cholesky)
        vg_ours = jax.jit(jax.value_and_grad(partial(loss, chol_ours)))
        vg_xla = jax.jit(jax.value_and_grad(partial(loss, jnp.linalg.cholesky)))
        t_f_ours = self.measure("batched_forward_gpchol", f_ours, lambda: (a,), **tag)
        t_f_xla = self.measure("batched_forward_xla", f_xla, lambda: (a,), **tag)
        t_ours = self.measure("batched_vg_gpchol", vg_ours, lambda: (a,), **tag)
        t_xla = self.measure("batched_vg_xla", vg_xla, lambda: (a,), **tag)
        self.ratio("batched_forward_speedup", t_f_xla, t_f_ours, **tag)
        self.ratio("batched_speedup", t_xla, t_ours, **tag)


def cmd_run(args) -> int:
    import jax

    out = out_dir()
    out.mkdir(parents=True, exist_ok=True)
    meta = {
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
        "argv": sys.argv,
        "smoke": args.smoke,
        "fake_ffi": args.fake_ffi,
    }
    rec = Recorder(out / "bench_raw.json", meta)
    start = time.perf_counter()
    try:
        if args.x64:
            jax.config.update("jax_enable_x64", True)
        meta["backend"] = jax.default_backend()
        meta["devices"] = [str(d) for d in jax.devices()]
        if not args.fake_ffi:
            from gpchol._internal import cuda_ffi

            reason = cuda_ffi.cuda_unavailable_reason()
            meta["cuda_unavailable_reason"] = reason
            meta["build_info"] = cuda_ffi.build_info()
        rec.flush()
    except Exception as err:
        rec.error("setup", err)
        return 1

    bench = Bench(rec, args.fake_ffi, start + args.budget_s, reps=args.reps, sweep=args.sweep)
    sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else list(SIZES)
    batched = () if args.no_batched else BATCHED
    if args.smoke:
        sizes, batched = [64, 96], ((8, 16), (16, 16))
        bench.sweep_n = 96 if args.sweep else -1
    # Cheapest first (the batched items before n = 16384), so that a time-out loses the
    # largest sizes only.
    first = [s for s in sizes if s < 16384]
    rest = [s for s in sizes if s >= 16384]
    plan = [("large", s, dt) for s in first for dt in DTYPES]
    plan += [("batched", (n, b), dt) for n, b in batched for dt in DTYPES]
    plan += [("large", s, dt) for s in sorted(rest) for dt in DTYPES]
    for kind, size, dtype in plan:
        print(f"== {kind} {size} {dtype} ({bench.time_left():.0f} s left)", flush=True)
        try:
            if kind == "large":
                bench.large(size, dtype)
            else:
                bench.batched(size[0], size[1], dtype)
        except Exception as err:  # anything not caught per measurement
            rec.error(f"{kind} {size} {dtype}", err)
    rec.data["meta"]["seconds"] = time.perf_counter() - start
    rec.flush()
    return 0


# ----------------------------------------------------------------------------------------
# Smoke: each FFI target once
# ----------------------------------------------------------------------------------------

# target -> calls (n, batch, tile_size); the large targets include the paths that take
# scratch memory from XLA (cuSOLVER's workspace, the tiled forward, the adjoint's block).
SMOKE_CASES = {
    "gpchol_potrf_small_f32": [(8, 3, None), (128, 2, None)],
    "gpchol_potrf_small_f64": [(8, 3, None), (64, 2, None)],
    "gpchol_potrf_f32": [(160, 2, None), (160, 2, 64)],
    "gpchol_potrf_f64": [(100, 2, None), (100, 2, 32)],
    "gpchol_potrf_adjoint_f32": [(160, 2, None), (160, 2, 64)],
    "gpchol_potrf_adjoint_f64": [(100, 2, None), (100, 2, 32)],
    "gpchol_potrf_adjoint_small_f32": [(8, 3, None), (128, 2, None)],
    "gpchol_potrf_adjoint_small_f64": [(8, 3, None), (64, 2, None)],
}


def _murray_reference(L, Lbar):
    """Float64 symmetric gradient through the Cholesky factor (Murray's symbolic rule)."""
    import numpy as np
    from scipy.linalg import solve_triangular

    def phi(x):
        y = np.tril(x)
        y[np.diag_indices(x.shape[-1])] *= 0.5
        return y

    out = np.empty(L.shape)
    for b in range(L.shape[0]):
        Lb = L[b].astype(np.float64)
        P = phi(Lb.T @ np.tril(Lbar[b].astype(np.float64)))
        Z = solve_triangular(Lb, P + P.T, lower=True, trans="T")
        Y = solve_triangular(Lb, Z.T, lower=True, trans="T").T
        S = phi(Y)
        out[b] = 0.5 * (S + S.T)
    return out


def smoke_one(target: str, fake_ffi: bool) -> tuple[bool, str]:
    """Runs the calls of one target; returns (ok, detail)."""
    import jax.numpy as jnp
    import numpy as np

    dtype = np.float32 if target.endswith("f32") else np.float64
    tol = 2e-3 if dtype == np.float32 else 1e-9
    method = "small" if "_small_" in target else "large"
    if fake_ffi:
        potrf, adjoint = make_ops(True)
        fwd = lambda a, tile: potrf(a, tile_size=tile)  # noqa: E731
        adj = lambda L, b, tile: adjoint(L, b, tile_size=tile)  # noqa: E731
    else:
        from gpchol._internal import cuda_ffi

        fwd = lambda a, tile: cuda_ffi.potrf_impl(a, tile_size=tile, method=method)  # noqa: E731
        adj = lambda L, b, tile: cuda_ffi.potrf_adjoint_impl(  # noqa: E731
            L, b, tile_size=tile, method=method
        )
    rng = np.random.default_rng(0)
    worst, parts = 0.0, []
    for n, batch, tile in SMOKE_CASES[target]:
        m = rng.standard_normal((batch, n, n))
        a = m @ np.swapaxes(m, -1, -2) / n + np.eye(n)
        ref = np.linalg.cholesky(a)
        if "adjoint" in target:
            L = ref.astype(dtype)
            lbar = rng.standard_normal((batch, n, n)).astype(dtype)
            g = np.asarray(adj(jnp.asarray(L), jnp.asarray(lbar), tile))
            expected = _murray_reference(L, lbar)
            err = float(np.linalg.norm(g - expected) / np.linalg.norm(expected))
            if not np.isfinite(g).all():
                return False, f"n={n} tile={tile}: non-finite gradient"
        else:
            L, status = fwd(jnp.asarray(a.astype(dtype)), tile)
            L, status = np.asarray(L), np.asarray(status)
            if (status != 0).any():
                return False, f"n={n} tile={tile}: status {status.tolist()} (expected 0)"
            err = float(np.linalg.norm(L - ref) / np.linalg.norm(ref))
        worst = max(worst, err)
        parts.append(f"n={n} b={batch} tile={tile or '-'}")
        if not err < tol:
            return False, f"n={n} tile={tile}: relative error {err:.2e} > {tol:g}"
    return True, f"{', '.join(parts)}; max rel.err {worst:.1e}"


def cmd_smoke(args) -> int:
    import subprocess

    import jax

    start = time.perf_counter()
    deadline = start + args.budget_s
    jax.config.update("jax_enable_x64", True)
    targets = args.only.split(",") if args.only else list(SMOKE_CASES)
    unknown = [t for t in targets if t not in SMOKE_CASES]
    if unknown:
        print(f"unknown targets: {unknown}", file=sys.stderr)
        return 2
    print(f"device: {jax.devices()[0].device_kind} (backend {jax.default_backend()})", flush=True)
    if not args.fake_ffi:
        from gpchol._internal import cuda_ffi

        reason = cuda_ffi.cuda_unavailable_reason()
        if reason is not None:
            for t in targets:
                print(f"FAIL  {t:32s} unavailable: {reason}", flush=True)
            return 1
        info = cuda_ffi.build_info()
        print("library: " + ", ".join(f"{k}={v}" for k, v in info.items()), flush=True)
    failures = 0
    for i, target in enumerate(targets):
        t0 = time.perf_counter()
        try:
            ok, detail = smoke_one(target, args.fake_ffi)
        except Exception as err:
            ok, detail = False, " ".join(f"{type(err).__name__}: {err}".split())[:600]
        verdict = "OK" if ok else "FAIL"
        print(f"{verdict:5s} {target:32s} {detail} ({time.perf_counter() - t0:.2f} s)", flush=True)
        if ok:
            continue
        failures += 1
        rest = targets[i + 1 :]
        if not rest:
            break
        # A CUDA fault is sticky in a process: the rest run in a fresh one.
        left = deadline - time.perf_counter()
        if left < 8:
            for t in rest:
                print(f"SKIP  {t:32s} no time left for a fresh process after a failure")
            return 1
        print(f"      (the remaining {len(rest)} targets run in a fresh process)", flush=True)
        cmd = [sys.executable, __file__, "smoke", "--only", ",".join(rest)]
        cmd += ["--budget-s", f"{left - 1:.0f}"] + (["--fake-ffi"] if args.fake_ffi else [])
        proc = subprocess.run(cmd, timeout=left + 5)
        return 1 if failures or proc.returncode else 0
    print(f"smoke: {len(targets) - failures} of {len(targets)} targets OK in "
          f"{time.perf_counter() - start:.1f} s", flush=True)  # fmt: skip
    return 1 if failures else 0


# ----------------------------------------------------------------------------------------
# Report
# ----------------------------------------------------------------------------------------


def _read_stages(path: Path) -> dict:
    stages = {}
    if not path.is_file():
        return stages
    for line in path.read_text().splitlines():
        parts = line.split("\t")
        if len(parts) >= 3:
            name, rc, secs = parts[:3]
            stages[name] = {"rc": int(rc), "seconds": float(secs), "ok": rc == "0"}
            if rc in ("124", "137"):
                stages[name]["timed_out"] = True
    return stages


def _log_tail(path: Path, chars: int = 3000) -> str | None:
    if not path.is_file():
        return None
    return path.read_text(errors="replace")[-chars:]


def _read_junit(path: Path) -> dict | None:
    if not path.is_file():
        return None
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError as err:
        return {"error": f"unreadable JUnit XML: {err}"}
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    summary = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    failed, skipped_reasons = [], {}
    for s in suites:
        for key in summary:
            summary[key] += int(s.get(key, 0))
        for case in s.iter("testcase"):
            name = f"{case.get('classname')}::{case.get('name')}"
            for tag in ("failure", "error"):
                el = case.find(tag)
                if el is not None:
                    failed.append({"test": name, tag: (el.get("message") or "")[:500]})
            sk = case.find("skipped")
            if sk is not None:
                msg = (sk.get("message") or "")[:200]
                skipped_reasons[msg] = skipped_reasons.get(msg, 0) + 1
    summary["passed"] = (
        summary["tests"] - summary["failures"] - summary["errors"] - summary["skipped"]
    )
    summary["failed_tests"] = failed
    summary["skip_reasons"] = skipped_reasons
    return summary


def _parse_pytest_log(path: Path) -> dict | None:
    """Per-test outcomes from ``pytest -v`` output (when no JUnit XML was written)."""
    if not path.is_file():
        return None
    pattern = re.compile(r"^(\S+::\S+)\s+(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b")
    outcomes: dict[str, str] = {}
    for line in path.read_text(errors="replace").splitlines():
        m = pattern.match(line.strip())
        if m:
            outcomes[m.group(1)] = m.group(2)
    counts = {k: sum(1 for v in outcomes.values() if v == k) for k in set(outcomes.values())}
    return {
        "source": "pytest -v log (no JUnit XML: the test stage did not finish)",
        "tests": len(outcomes),
        "passed": counts.get("PASSED", 0),
        "failures": counts.get("FAILED", 0),
        "errors": counts.get("ERROR", 0),
        "skipped": counts.get("SKIPPED", 0),
        "failed_tests": [{"test": t} for t, v in outcomes.items() if v in ("FAILED", "ERROR")],
    }


def _read_tests(out: Path) -> dict:
    """Totals over the test groups, and each group's summary (JUnit XML, else its log)."""
    groups = {}
    for group in TEST_GROUPS:
        summary = _read_junit(out / f"pytest_{group}.xml") or _parse_pytest_log(
            out / f"tests_{group}.log"
        )
        if summary is not None:
            groups[group] = summary
    total = {"tests": 0, "passed": 0, "failures": 0, "errors": 0, "skipped": 0}
    failed, reasons = [], {}
    for summary in groups.values():
        for key in total:
            total[key] += int(summary.get(key, 0))
        failed += summary.get("failed_tests", [])
        for why, count in summary.get("skip_reasons", {}).items():
            reasons[why] = reasons.get(why, 0) + count
    return {**total, "failed_tests": failed, "skip_reasons": reasons, "groups": groups}


def _read_smoke(path: Path) -> list[dict] | None:
    """The verdict lines of ``bench_gpu.py smoke``."""
    if not path.is_file():
        return None
    out = []
    for line in path.read_text(errors="replace").splitlines():
        m = re.match(r"^(OK|FAIL|SKIP)\s+(gpchol_\S+)\s+(.*)$", line)
        if m:
            out.append({"verdict": m.group(1), "target": m.group(2), "detail": m.group(3)})
    return out


def _environment() -> dict:
    env = {
        "host": socket.gethostname(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
    }
    try:
        import jax
        import jaxlib

        env["jax"] = jax.__version__
        env["jaxlib"] = jaxlib.__version__
        devs = jax.devices()
        env["devices"] = [str(d) for d in devs]
        env["device_kind"] = devs[0].device_kind if devs else None
        try:
            import jax.extend.backend

            env["backend_platform_version"] = jax.extend.backend.get_backend().platform_version
        except Exception as err:
            env["backend_platform_version"] = f"unavailable: {err}"
        try:
            stats = devs[0].memory_stats() or {}
            env["device_memory_bytes"] = stats.get("bytes_limit")
        except Exception:
            pass
    except Exception as err:
        env["jax_error"] = str(err)
    try:
        from gpchol._internal import cuda_ffi

        env["gpchol_cuda"] = cuda_ffi.build_info()
    except Exception as err:
        env["gpchol_cuda"] = {"error": str(err)}
    return env


def _criteria(results: list[dict]) -> list[dict]:
    out = []
    for label, key, op, target in TARGETS:
        rows = [r for r in results if r.get("name") == key and "ratio" in r]
        if key == "forward_speedup":
            rows = [r for r in rows if r.get("n", 0) >= 16384]
        for r in rows:
            value = r["ratio"]
            met = value >= target if op == ">=" else value <= target
            where = {k: r[k] for k in ("n", "batch", "dtype") if k in r}
            out.append({"criterion": label, **where, "value": round(value, 3), "met": met})
        if not rows:
            out.append({"criterion": label, "value": None, "met": None, "note": "not measured"})
    return out


def _fmt(x, digits=3):
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.{digits}g}"
    return str(x)


def _markdown(report: dict) -> str:
    lines = ["# gpchol GPU check", ""]
    env = report.get("environment", {})
    lines.append(
        f"- device: {env.get('device_kind')}; jax {env.get('jax')}, jaxlib {env.get('jaxlib')}"
    )
    cuda = env.get("gpchol_cuda", {})
    if isinstance(cuda, dict) and "cuda_runtime_compiled" in cuda:
        lines.append(
            f"- CUDA runtime (built) {cuda['cuda_runtime_compiled']}, driver "
            f"{cuda['cuda_driver']}, cuBLAS {cuda['cublas_loaded']}, cuSOLVER "
            f"{cuda['cusolver_loaded']}"
        )
    else:
        lines.append(f"- gpchol CUDA library: {cuda}")
    lines.append(f"- command: `{report.get('command')}`")
    lines.append("")
    lines.append("| stage | rc | seconds |")
    lines.append("|---|---|---|")
    for name, st in report.get("stages", {}).items():
        lines.append(f"| {name} | {st.get('rc')} | {_fmt(st.get('seconds'))} |")
    smoke = report.get("smoke")
    if smoke:
        lines += ["", "Smoke (each FFI target once):"]
        lines += [f"- {v['verdict']} {v['target']}: {v['detail'][:200]}" for v in smoke]
    tests = report.get("tests")
    if isinstance(tests, dict) and "tests" in tests:
        lines.append("")
        lines.append(
            f"Tests marked gpu: {tests['passed']} passed, {tests['failures']} failed, "
            f"{tests['errors']} errors, {tests['skipped']} skipped."
        )
        for group, g in tests.get("groups", {}).items():
            source = " (from the -v log: the stage was cut)" if "source" in g else ""
            lines.append(
                f"- {group}: {g.get('passed', 0)} passed, {g.get('failures', 0)} failed, "
                f"{g.get('errors', 0)} errors, {g.get('skipped', 0)} skipped{source}"
            )
        for f in tests.get("failed_tests", [])[:20]:
            lines.append(f"- FAILED {f['test']}")
        for why, count in list(tests.get("skip_reasons", {}).items())[:3]:
            lines.append(f"- skipped ({count}): {why}")
    results = report.get("results", [])
    timed = [r for r in results if "seconds" in r]
    if timed:
        lines += ["", "| benchmark | dtype | n | batch | seconds |", "|---|---|---|---|---|"]
        for r in timed:
            lines.append(
                f"| {r['name']} | {r.get('dtype')} | {r.get('n')} | {r.get('batch', '')} | "
                f"{_fmt(r['seconds'], 4)} |"
            )
    ratios = [r for r in results if "ratio" in r]
    if ratios:
        lines += ["", "| ratio | dtype | n | batch | value |", "|---|---|---|---|---|"]
        for r in ratios:
            lines.append(
                f"| {r['name']} | {r.get('dtype')} | {r.get('n')} | {r.get('batch', '')} | "
                f"{_fmt(r['ratio'])} |"
            )
    lines += ["", "| target | dtype | n | value | met |", "|---|---|---|---|---|"]
    for c in report.get("criteria", []):
        lines.append(
            f"| {c['criterion']} | {c.get('dtype', '')} | {c.get('n', '')} | "
            f"{_fmt(c['value'])} | {c['met']} |"
        )
    errors = report.get("errors", [])
    if errors:
        lines += ["", "Errors:"]
        for e in errors[:30]:
            lines.append(f"- {e['name']}: {e['error'][:300]}")
    return "\n".join(lines) + "\n"


def cmd_report(args) -> int:
    out = out_dir()
    out.mkdir(parents=True, exist_ok=True)
    report = {
        "schema": 1,
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": args.command,
        "stages": _read_stages(out / "stages.tsv"),
        "environment": _environment(),
        "smoke": _read_smoke(out / "smoke.log"),
        "tests": _read_tests(out),
        "results": [],
        "errors": [],
        "skipped": [],
    }
    env_txt = out / "environment.txt"
    if env_txt.is_file():
        report["environment"]["shell"] = env_txt.read_text(errors="replace")[-2000:]
    for name in report["stages"]:
        tail = _log_tail(out / f"{name}.log")
        if tail is not None:
            report["stages"][name]["log_tail"] = tail
    for name, st in report["stages"].items():
        if not st["ok"]:
            why = "timed out" if st.get("timed_out") else f"exit code {st['rc']}"
            report["errors"].append({"name": f"stage {name}", "error": why})
    raw_path = out / "bench_raw.json"
    if raw_path.is_file():
        try:
            raw = json.loads(raw_path.read_text())
            report["bench_meta"] = raw.get("meta")
            report["results"] = raw.get("results", [])
            report["errors"] += raw.get("errors", [])
            report["skipped"] = raw.get("skipped", [])
        except json.JSONDecodeError as err:
            report["errors"].append({"name": "bench_raw.json", "error": str(err)})
    else:
        report["errors"].append({"name": "bench", "error": "no bench_raw.json was written"})
    report["criteria"] = _criteria(report["results"])
    (out / "gpu_results.json").write_text(json.dumps(report, indent=1, default=str))
    (out / "gpu_results.md").write_text(_markdown(report))
    print(_markdown(report))
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    smoke = sub.add_parser("smoke", help="call each FFI target once; one verdict per target")
    smoke.add_argument("--only", default=None, help="comma-separated targets (default: all)")
    smoke.add_argument("--budget-s", type=float, default=20.0, help="time for retries")
    smoke.add_argument("--fake-ffi", action="store_true", help="JAX ops instead of the kernels")
    run = sub.add_parser("run", help="run the benchmarks (writes OUT/bench_raw.json)")
    run.add_argument("--sizes", default=None, help="comma-separated n (default 4096,16384,32768)")
    run.add_argument("--budget-s", type=float, default=200.0, help="stop starting new items after")
    run.add_argument("--reps", type=int, default=3, help="timed runs per item (at least)")
    run.add_argument("--no-x64", dest="x64", action="store_false", help="float32 only")
    run.add_argument("--no-batched", action="store_true", help="skip the batched small items")
    run.add_argument("--smoke", action="store_true", help="tiny sizes (script test)")
    run.add_argument("--fake-ffi", action="store_true", help="JAX ops instead of the kernels")
    run.add_argument("--sweep", action="store_true", help="sweep block sizes at n = 16384")
    rep = sub.add_parser("report", help="write OUT/gpu_results.json and OUT/gpu_results.md")
    rep.add_argument("--command", default="benchmarks/gpu_check.sh", help="command recorded")
    args = parser.parse_args(argv)
    if args.cmd == "smoke":
        return cmd_smoke(args)
    if args.cmd == "run":
        if not args.x64:
            global DTYPES
            DTYPES = ("float32",)
        return cmd_run(args)
    return cmd_report(args)


if __name__ == "__main__":
    sys.exit(main())
