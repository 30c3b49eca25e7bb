"""Stress: the vmapped likelihood called hundreds of times with XLA's CPU runtime on one
Eigen thread (issue 14, items 1 and 7).

With ``XLA_FLAGS=--xla_cpu_multi_thread_eigen=false`` a Python callback inside the
compiled likelihood (the old pivot-status search, the old host-LAPACK path) deadlocked
XLA's runtime within a few dozen calls. Each test runs the issue's reproducer, or a
variant of it, in a fresh interpreter with that flag and a timeout: a hang fails the test
at the timeout instead of hanging the suite. Each run makes more than 200 calls; the
sizes keep it well under a minute on an idle 2-core CPU (the reproducer took 233 s at
twice these batches on the project's 2-core machine shared by several test runs, load 8;
hence the generous timeout: a hang is for ever, a slow machine is not).
"""

import os
import subprocess
import sys
import textwrap
import time

import pytest

TIMEOUT_S = 480

# The issue's reproducer, with its three (batch, n) sizes and iteration counts as
# parameters; it prints one line per size and "done <calls>" at the end.
REPRODUCER = textwrap.dedent(
    """
    import sys, time
    import jax, jax.numpy as jnp, numpy as np, gpchol
    from gpchol import kernels as gk
    jax.config.update("jax_enable_x64", True)
    p = {"a": jnp.array(1.0), "l": jnp.array(1.0), "s": jnp.array(0.1)}
    f = lambda p, X, y: -gpchol.GaussianProcess(
        p["a"] * gk.ExpSquared(p["l"]), X, noise=p["s"]).log_marginal_likelihood(y)
    g = jax.jit(jax.vmap(jax.value_and_grad(f), in_axes=(None, 0, 0)))
    rng = np.random.default_rng(0)
    calls = 0
    for B, n, iters in SIZES:
        X = jnp.asarray(rng.uniform(0, 5, (B, n, 3)))
        y = jnp.asarray(rng.standard_normal((B, n)))
        t0 = time.perf_counter()
        for i in range(iters):
            v, gr = jax.block_until_ready(g(p, X, y))
            calls += 1
            if i % 10 == 0:
                print(f"B={B} n={n} call {i} at {time.perf_counter() - t0:.1f} s", flush=True)
        assert np.all(np.isfinite(np.asarray(v))), "non-finite likelihood"
        print(f"B={B} n={n}: {iters} calls in {time.perf_counter() - t0:.2f} s", flush=True)
    print(f"done {calls}", flush=True)
    """
)

# With failing matrices in the batch: per-element noise, negative (K - 2 I: fails at
# pivot 1) for every third element and zero with duplicated inputs for every fifth.
FAILING = textwrap.dedent(
    """
    import sys, time
    import jax, jax.numpy as jnp, numpy as np, gpchol
    import scipy.linalg.lapack as lapack
    from gpchol import kernels as gk
    jax.config.update("jax_enable_x64", True)
    p = {"a": jnp.array(1.0), "l": jnp.array(1.0)}
    def f(p, s, X, y):
        gp = gpchol.GaussianProcess(p["a"] * gk.ExpSquared(p["l"]), X, noise=s)
        v, status = gp.log_marginal_likelihood_with_status(y)
        return -v, status
    g = jax.jit(jax.vmap(jax.value_and_grad(f, has_aux=True), in_axes=(None, 0, 0, 0)))
    rng = np.random.default_rng(1)
    calls = 0
    for B, n, iters in SIZES:
        X = rng.uniform(0, 5, (B, n, 3))
        s = np.full(B, 0.1)
        s[::3] = -2.0
        s[::5] = 0.0
        X[::5, 1] = X[::5, 0]
        X[::5, n // 2] = X[::5, 0]
        y = rng.standard_normal((B, n))
        t0 = time.perf_counter()
        for i in range(iters):
            (v, status), gr = jax.block_until_ready(g(p, s, X, y))
            calls += 1
            if i % 10 == 0:
                print(f"B={B} n={n} call {i} at {time.perf_counter() - t0:.1f} s", flush=True)
        status = np.asarray(status)
        K = np.asarray(jax.vmap(lambda s, X: gpchol.GaussianProcess(
            p["a"] * gk.ExpSquared(p["l"]), X, noise=s).covariance_matrix())(s, X))
        info = [int(lapack.dpotrf(np.tril(k) + np.tril(k, -1).T, lower=1)[1]) for k in K]
        assert status.tolist() == info, (status.tolist(), info)
        assert np.isnan(np.asarray(v)).tolist() == [i != 0 for i in info]
        assert np.all(status[::3] != 0) and np.any(status == 0)
        print(f"B={B} n={n}: {iters} calls in {time.perf_counter() - t0:.2f} s", flush=True)
    print(f"done {calls}", flush=True)
    """
)


def run_single_eigen_thread(script, sizes, tmp_path):
    """Runs ``script`` with ``SIZES = sizes`` in a fresh interpreter on one Eigen thread;
    fails at TIMEOUT_S with the progress it had printed (its output goes to a file, so a
    hang still shows how far it got)."""
    env = dict(os.environ)
    env["XLA_FLAGS"] = "--xla_cpu_multi_thread_eigen=false"
    code = f"SIZES = {sizes!r}\n{script}"
    log = tmp_path / "stress.log"
    t0 = time.perf_counter()
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-c", code], env=env, stdout=out, stderr=subprocess.STDOUT
        )
        try:
            rc = proc.wait(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            tail = "\n".join(log.read_text().splitlines()[-15:])
            pytest.fail(
                f"no result after {TIMEOUT_S} s with --xla_cpu_multi_thread_eigen=false (a "
                f"hang?); its last lines:\n{tail}"
            )
    elapsed = time.perf_counter() - t0
    text = log.read_text()
    assert rc == 0, f"exit {rc}:\n{text[-4000:]}"
    calls = sum(it for _, _, it in sizes)
    assert f"done {calls}" in text, text[-4000:]
    print(text, f"total {elapsed:.1f} s")


@pytest.mark.slow
def test_issue_reproducer_does_not_hang(tmp_path):
    """The issue's loop (value_and_grad of the vmapped GP likelihood) at its three orders
    n = 32 (device path), 128 and 256 (host LAPACK), with smaller batches (32, 8, 4
    instead of 256, 64, 16) to keep it short: 210 calls."""
    run_single_eigen_thread(REPRODUCER, [(32, 32, 100), (8, 128, 100), (4, 256, 10)], tmp_path)


@pytest.mark.slow
def test_host_lapack_path_does_not_hang(tmp_path):
    """n >= 128 only (gpchol's compiled chol_solve / potri handlers on every call)."""
    run_single_eigen_thread(REPRODUCER, [(8, 128, 150), (2, 192, 60)], tmp_path)


@pytest.mark.slow
def test_failing_matrices_in_batch_do_not_hang(tmp_path):
    """Batches in which some covariances fail (the status search runs on every call) on
    both paths; the status is LAPACK's info per element and the value NaN exactly there."""
    run_single_eigen_thread(FAILING, [(15, 32, 120), (5, 128, 90)], tmp_path)
