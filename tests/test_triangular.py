"""The triangular solve and Cholesky primitives (gpchol._linalg.triangular): JAX's
semantics and derivatives, batches through gpchol's CPU handlers, and no deadlock where
jaxlib 0.10.2's batched kernels hang (several batched solves running at once)."""

import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg as sla
from helpers import random_spd
from jax.test_util import check_grads

from gpchol._internal import cpu_ffi, triangular

TOL = {np.float32: 2e-4, np.float64: 1e-11}
BATCHES = [(), (3,), (2, 3)]


def _handlers() -> bool:
    return cpu_ffi.cpu_unavailable_reason() is None


def _solve_ref(a, b, left, lower, trans):
    """SciPy float64, one matrix at a time (a right solve as the transposed left one)."""
    a = np.broadcast_to(a, b.shape[:-2] + a.shape[-2:]).astype(np.float64)
    b = b.astype(np.float64)
    out = np.empty_like(b)
    for i in np.ndindex(b.shape[:-2]):
        if left:
            out[i] = sla.solve_triangular(a[i], b[i], lower=lower, trans=int(trans))
        else:  # x op(a) = b  <=>  op(a)^T x^T = b^T
            out[i] = sla.solve_triangular(a[i], b[i].T, lower=lower, trans=int(not trans)).T
    return out


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("batch", BATCHES, ids=str)
@pytest.mark.parametrize("left", [True, False], ids=["left", "right"])
@pytest.mark.parametrize("lower", [True, False], ids=["lower", "upper"])
@pytest.mark.parametrize("trans", [False, True], ids=["N", "T"])
def test_solve_matches_scipy(rng, dtype, batch, left, lower, trans):
    k, p = 7, 3
    L = np.linalg.cholesky(random_spd(rng, k, batch))
    a = (L if lower else np.swapaxes(L, -1, -2)).astype(dtype)
    b = rng.standard_normal((*batch, k, p) if left else (*batch, p, k)).astype(dtype)

    def f(a, b):
        return triangular.triangular_solve(a, b, left_side=left, lower=lower, transpose_a=trans)

    ref = _solve_ref(a, b, left, lower, trans)
    for got in (f(a, b), jax.jit(f)(a, b)):
        assert got.shape == b.shape and got.dtype == dtype
        np.testing.assert_allclose(got, ref, rtol=TOL[dtype], atol=TOL[dtype])
    hlo = jax.jit(f).lower(a, b).as_text()
    if batch and _handlers():
        assert "gpchol_cpu_trsm" in hlo and "lapack_" not in hlo
    elif not batch:
        assert "gpchol_cpu_trsm" not in hlo  # one matrix: JAX's own lowering


@pytest.mark.parametrize("left", [True, False], ids=["left", "right"])
@pytest.mark.parametrize("trans", [False, True], ids=["N", "T"])
def test_solve_vmap_one_matrix_for_all_right_hand_sides(rng, left, trans):
    """``vmap`` over ``b`` only keeps ``a`` one matrix (the handler broadcasts it)."""
    a = np.linalg.cholesky(random_spd(rng, 5))
    b = rng.standard_normal((4, 5, 2) if left else (4, 2, 5))

    def f(b):
        return triangular.triangular_solve(a, b, left_side=left, lower=True, transpose_a=trans)

    got = jax.jit(jax.vmap(f))(b)
    np.testing.assert_allclose(got, _solve_ref(a, b, left, True, trans), rtol=1e-11, atol=1e-11)
    # and a batch dimension that is not the first
    got = jax.vmap(f, in_axes=1, out_axes=1)(np.moveaxis(b, 0, 1))
    np.testing.assert_allclose(
        np.moveaxis(got, 1, 0), _solve_ref(a, b, left, True, trans), rtol=1e-11, atol=1e-11
    )


@pytest.mark.slow_cases(
    "N-lower-left-()",
    "N-lower-left-(3,)",
    "N-lower-right-()",
    "N-lower-right-(3,)",
    "N-upper-left-()",
    "N-upper-left-(3,)",
    "N-upper-right-(3,)",
    "T-lower-left-()",
    "T-lower-left-(3,)",
    "T-upper-right-()",
)
@pytest.mark.parametrize("batch", [(), (3,)], ids=str)
@pytest.mark.parametrize("left", [True, False], ids=["left", "right"])
@pytest.mark.parametrize("lower", [True, False], ids=["lower", "upper"])
@pytest.mark.parametrize("trans", [False, True], ids=["N", "T"])
def test_solve_gradients(rng, batch, left, lower, trans):
    k = 5
    L = np.linalg.cholesky(random_spd(rng, k, batch))
    a = L if lower else np.swapaxes(L, -1, -2)
    b = rng.standard_normal((*batch, k, 2) if left else (*batch, 2, k))

    def f(a, b):
        return triangular.triangular_solve(a, b, left_side=left, lower=lower, transpose_a=trans)

    check_grads(f, (a, b), order=2, modes=("fwd", "rev"))
    check_grads(jax.jit(jax.vmap(f)), (a[None], b[None]), order=1, modes=("fwd", "rev"))
    # the same derivatives as JAX's own primitive
    g = jax.grad(lambda a, b: jnp.sum(jnp.sin(f(a, b))), argnums=(0, 1))(a, b)
    a_full = np.broadcast_to(a, b.shape[:-2] + a.shape[-2:])
    g_ref = jax.jit(
        jax.grad(
            lambda a, b: jnp.sum(
                jnp.sin(
                    jax.lax.linalg.triangular_solve(
                        a, b, left_side=left, lower=lower, transpose_a=trans
                    )
                )
            ),
            argnums=(0, 1),
        )
    )(a_full, b)
    for x, y in zip(g, g_ref, strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("batch", BATCHES, ids=str)
def test_cholesky_matches_numpy_and_fails_as_nan(rng, dtype, batch):
    n = 9
    a = random_spd(rng, n, batch)
    ref = np.linalg.cholesky(a)
    a = a.astype(dtype)
    for got in (triangular.cholesky(a), jax.jit(triangular.cholesky)(a)):
        assert got.dtype == dtype
        np.testing.assert_allclose(got, ref, rtol=TOL[dtype], atol=TOL[dtype])
    if batch:
        bad = a.copy()
        bad.reshape(-1, n, n)[1, 4, 4] = -1.0
        L = np.asarray(jax.jit(triangular.cholesky)(bad)).reshape(-1, n, n)
        assert np.isnan(L[1][np.tril_indices(n)]).all()
        np.testing.assert_allclose(L[0], ref.reshape(-1, n, n)[0], rtol=TOL[dtype], atol=TOL[dtype])
        if _handlers():
            assert "gpchol_cpu_chol_solve" in jax.jit(triangular.cholesky).lower(a).as_text()


@pytest.mark.slow
@pytest.mark.parametrize("batch", [(), (3,)], ids=str)
def test_cholesky_gradients(rng, batch):
    a = random_spd(rng, 6, batch)

    def f(x):  # symmetric inputs: the derivative of the lower triangle's factor
        return triangular.cholesky(0.5 * (x + jnp.swapaxes(x, -1, -2)))

    check_grads(f, (a,), order=2, modes=("fwd", "rev"))
    check_grads(jax.jit(jax.vmap(f)), (a[None],), order=1, modes=("fwd", "rev"))
    g = jax.grad(lambda x: jnp.sum(jnp.cos(triangular.cholesky(x))))(a)
    g_ref = jax.jit(
        jax.grad(lambda x: jnp.sum(jnp.cos(jax.lax.linalg.cholesky(x, symmetrize_input=False))))
    )(a)
    np.testing.assert_allclose(g, g_ref, rtol=1e-10, atol=1e-12)


@pytest.mark.slow_cases("()")
@pytest.mark.parametrize("batch", [(), (3,)], ids=str)
def test_primitives_evaluate_under_disable_jit(rng, batch):
    """Under jax.disable_jit the eager rule cannot call a compiled program (it would bind
    the primitive again, endlessly): both evaluate through JAX's own operations, as do
    the GP likelihood and its gradient that call them."""
    a = random_spd(rng, 7, batch)
    b = rng.standard_normal(batch + (7, 2))
    with jax.disable_jit():
        L = triangular.cholesky(a)
        x = triangular.triangular_solve(L, b, left_side=True, lower=True)
    np.testing.assert_allclose(L, np.linalg.cholesky(a), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(x, _solve_ref(np.asarray(L), b, True, True, False), rtol=1e-10)

    import gpchol
    from gpchol import kernels

    X, y = rng.standard_normal((12, 2)), rng.standard_normal(12)

    def lml(ls):
        gp = gpchol.GaussianProcess(kernels.ExpSquared(ls), X, noise=0.3)
        return gp.log_marginal_likelihood(y)

    with jax.enable_x64(True):
        want = jax.value_and_grad(lml)(1.3)
        with jax.disable_jit():
            got = jax.value_and_grad(lml)(1.3)
    np.testing.assert_allclose(got, want, rtol=1e-10)


_CONCURRENT = textwrap.dedent(
    """
    import jax, jax.numpy as jnp, numpy as np
    from gpchol._internal import triangular
    jax.config.update("jax_enable_x64", True)
    rng = np.random.default_rng(0)
    B, n, m = 75, 30, 100
    a = rng.standard_normal((B, n, n))
    L = np.linalg.cholesky(a @ np.swapaxes(a, -1, -2) + n * np.eye(n))
    b1, b2 = rng.standard_normal((2, B, n, m))

    @jax.jit
    def f(L, b1, b2):  # independent batched solves and factors: XLA runs them at once
        s = lambda a, b, t: triangular.triangular_solve(a, b, left_side=True, lower=True,
                                                        transpose_a=t)
        K = L @ jnp.swapaxes(L, -1, -2)
        return (s(L, b1, False).sum() + s(L + 0.0, b2, False).sum() + s(L, b1, True).sum()
                + triangular.cholesky(K).sum() + triangular.cholesky(K + 1.0 * jnp.eye(n)).sum())

    for i in range(30):
        f(L, b1 + i, b2).block_until_ready()
    print("done")
    """
)


@pytest.mark.slow
def test_concurrent_batched_calls_do_not_deadlock():
    """Three batched solves and two batched factors in one program, 30 times, in a fresh
    process on this machine's thread pool: jaxlib 0.10.2's own batched kernels hang here
    on 2 cores (every run of this program with ``lax.linalg``'s ops hung within its first
    call); gpchol's finish in a few seconds. A hang fails by the timeout."""
    if not _handlers():
        pytest.skip(cpu_ffi.cpu_unavailable_reason())
    out = subprocess.run(
        [sys.executable, "-c", _CONCURRENT], capture_output=True, text=True, timeout=240
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "done" in out.stdout
