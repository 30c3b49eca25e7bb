"""gpchol.cholesky / cholesky_with_status: values, derivatives, transformations, failures."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import random_spd
from jax.test_util import check_grads

import gpchol

BACKENDS = ["xla", "tiled"]
EPS = {np.float32: np.finfo(np.float32).eps, np.float64: np.finfo(np.float64).eps}
# Elementwise tolerance against a float64 reference, relative to max |L|.
VALUE_TOL = {np.float32: 2e-5, np.float64: 1e-12}
# n = 1000 is slow (eager dispatch of a large factor); n = 300 crosses the same tile
# boundaries, with and without a remainder, in the everyday tier
LARGE = pytest.mark.slow


def residual_ratio(a, L):
    """LAPACK's test ratio ||A - L L^T|| / (n ||A|| eps) (computed in float64)."""
    a = np.asarray(a, np.float64)
    L64 = np.asarray(L, np.float64)
    n = a.shape[-1]
    eps = EPS[np.dtype(L.dtype).type]
    res = np.linalg.norm(a - L64 @ L64.T, 1)
    return res / (n * np.linalg.norm(a, 1) * eps)


# ---------------------------------------------------------------------------- values


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(
    "n, tile",
    [(0, None), (1, None), (2, 1), (7, 3), (7, 7), (64, 16), (64, 20), (300, 64), (300, 100)]
    + [pytest.param(1000, 300, marks=LARGE)],
)
def test_values_against_numpy(rng, backend, dtype, n, tile):
    a = random_spd(rng, n, dtype=dtype)
    L = gpchol.cholesky(a, backend=backend, tile_size=tile)
    assert L.dtype == dtype and L.shape == (n, n)
    ref = np.linalg.cholesky(a.astype(np.float64)) if n else np.zeros((0, 0))
    if n:
        err = np.max(np.abs(np.asarray(L, np.float64) - ref)) / np.max(np.abs(ref))
        assert err < VALUE_TOL[dtype] * max(1, n / 64)
        assert residual_ratio(a, L) < 30
        assert np.all(np.triu(np.asarray(L), 1) == 0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_reads_symmetrized_input(rng, backend):
    a = random_spd(rng, 9)
    skew = rng.standard_normal((9, 9))
    skew = skew - skew.T
    L = gpchol.cholesky(a + 1e-3 * skew, backend=backend, tile_size=4)
    np.testing.assert_allclose(L, np.linalg.cholesky(a), rtol=1e-12, atol=1e-12)


@pytest.mark.slow_cases("tiled")
@pytest.mark.parametrize("backend", BACKENDS)
def test_batch_shapes_and_vmap(rng, backend):
    a = random_spd(rng, 10, batch=(2, 3))
    L = gpchol.cholesky(a, backend=backend, tile_size=4)
    assert L.shape == (2, 3, 10, 10)
    np.testing.assert_allclose(L, np.linalg.cholesky(a), rtol=1e-12, atol=1e-12)
    Lv = jax.vmap(jax.vmap(lambda x: gpchol.cholesky(x, backend=backend, tile_size=4)))(a)
    np.testing.assert_allclose(Lv, L, rtol=1e-13, atol=1e-14)
    Lj = jax.jit(lambda x: gpchol.cholesky(x, backend=backend, tile_size=4))(a)
    np.testing.assert_allclose(Lj, L, rtol=1e-13, atol=1e-14)


# ---------------------------------------------------------------------------- gradients


def _loss_fn(chol, w):
    return lambda a: jnp.sum(jnp.sin(chol(a)) * w) + jnp.sum(jnp.log(jnp.diagonal(chol(a))))


@pytest.mark.slow_cases("300-64-tiled", "300-64-xla", "33-8-tiled", "33-8-xla", "64-16-xla")
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "n, tile",
    [(1, None), (5, 2), (33, 8), (64, 16), (300, 64), pytest.param(1000, 200, marks=LARGE)],
)
def test_gradient_equals_jax(rng, backend, n, tile):
    a = random_spd(rng, n)
    w = rng.standard_normal((n, n))
    ours = jax.grad(_loss_fn(lambda x: gpchol.cholesky(x, backend=backend, tile_size=tile), w))
    theirs = jax.jit(jax.grad(_loss_fn(jnp.linalg.cholesky, w)))
    g1, g2 = ours(a), theirs(a)
    rel = np.max(np.abs(g1 - g2)) / np.max(np.abs(g2))
    assert rel < 1e-10
    np.testing.assert_allclose(g1, np.swapaxes(g1, -1, -2), rtol=0, atol=1e-12 * np.abs(g1).max())


@pytest.mark.parametrize("backend", BACKENDS)
def test_forward_mode_equals_jax(rng, backend):
    n = 20
    a = random_spd(rng, n)
    t = rng.standard_normal((n, n))
    ours = jax.jvp(lambda x: gpchol.cholesky(x, backend=backend, tile_size=6), (a,), (t,))[1]
    theirs = jax.jvp(jax.jit(jnp.linalg.cholesky), (a,), (t,))[1]
    np.testing.assert_allclose(ours, theirs, rtol=1e-11, atol=1e-11)


@pytest.mark.slow_cases("4-2-xla", "9-4-tiled", "9-4-xla")
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("n, tile", [(4, 2), (9, 4)])
def test_check_grads_orders_1_and_2(rng, backend, n, tile):
    a = random_spd(rng, n)
    f = lambda x: gpchol.cholesky(x, backend=backend, tile_size=tile)  # noqa: E731
    check_grads(f, (a,), order=2, modes=("fwd", "rev"), eps=1e-4)


@pytest.mark.slow_cases("xla")
@pytest.mark.parametrize("backend", BACKENDS)
def test_hessian_equals_jax(rng, backend):
    n = 6
    a = random_spd(rng, n)
    w = rng.standard_normal((n, n))
    h1 = jax.hessian(_loss_fn(lambda x: gpchol.cholesky(x, backend=backend, tile_size=4), w))(a)
    h2 = jax.jit(jax.hessian(_loss_fn(jnp.linalg.cholesky, w)))(a)
    np.testing.assert_allclose(h1, h2, rtol=1e-9, atol=1e-10)


@pytest.mark.slow_cases("xla")
@pytest.mark.parametrize("backend", BACKENDS)
def test_grad_of_vmap_and_jit(rng, backend):
    a = random_spd(rng, 12, batch=(4,))
    w = rng.standard_normal((12, 12))

    def loss(chol):
        return lambda x: jnp.sum(jax.vmap(lambda m: jnp.sum(chol(m) * w))(x))

    ours = jax.jit(jax.grad(loss(lambda m: gpchol.cholesky(m, backend=backend, tile_size=5))))
    theirs = jax.jit(jax.grad(loss(jnp.linalg.cholesky)))
    np.testing.assert_allclose(ours(a), theirs(a), rtol=1e-10, atol=1e-12)
    # vmap of grad
    g = jax.vmap(jax.grad(lambda m: jnp.sum(gpchol.cholesky(m, backend=backend) * w)))(a)
    g2 = jax.jit(jax.vmap(jax.grad(lambda m: jnp.sum(jnp.linalg.cholesky(m) * w))))(a)
    np.testing.assert_allclose(g, g2, rtol=1e-10, atol=1e-12)


@pytest.mark.slow
def test_float32_gradient(rng):
    a = random_spd(rng, 40, dtype=np.float32)
    w = rng.standard_normal((40, 40)).astype(np.float32)
    g1 = jax.grad(_loss_fn(lambda x: gpchol.cholesky(x, tile_size=16, backend="tiled"), w))(a)
    g2 = jax.jit(jax.grad(_loss_fn(jnp.linalg.cholesky, w)))(a.astype(np.float64))
    assert g1.dtype == np.float32
    assert np.max(np.abs(g1 - g2)) / np.max(np.abs(g2)) < 1e-4


def test_residual_is_only_the_factor(rng):
    """The reverse pass keeps L (n x n) and nothing else of size n x n."""
    n = 40
    a = random_spd(rng, n)
    _, vjp = jax.vjp(lambda x: gpchol.cholesky(x, backend="tiled", tile_size=8), a)
    big = [x for x in jax.tree_util.tree_leaves(vjp) if getattr(x, "size", 0) >= n * n]
    assert len(big) == 1


# ---------------------------------------------------------------------------- failures


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("pivot, tile", [(1, 4), (4, 4), (5, 4), (7, 3), (10, 4), (10, 10)])
def test_status_is_first_failing_pivot(rng, backend, pivot, tile):
    n = 10
    a = random_spd(rng, n)
    # Make the leading minor of order `pivot` singular-and-then-negative: replace row and
    # column pivot-1 so that its Schur complement is -1.
    L = np.linalg.cholesky(a)
    L[pivot - 1, pivot - 1] = 0.0
    b = L @ L.T
    b[pivot - 1, pivot - 1] -= 1.0
    Lf, status = gpchol.cholesky_with_status(b, backend=backend, tile_size=tile)
    assert int(status) == pivot
    assert np.all(np.isnan(Lf))


@pytest.mark.parametrize("backend", BACKENDS)
def test_status_batched_under_jit(backend):
    a = np.stack([np.eye(6), np.diag([1.0, 1, 1, -1, 1, 1]), np.diag([1.0, 1, 1, 1, 1, np.nan])])
    f = jax.jit(lambda x: gpchol.cholesky_with_status(x, backend=backend, tile_size=4))
    L, status = f(a)
    assert status.tolist() == [0, 4, 6]
    assert np.all(np.isfinite(L[0])) and np.all(np.isnan(L[1])) and np.all(np.isnan(L[2]))


def test_check_raises_with_pivot():
    a = np.diag([2.0, 1.0, -3.0, 1.0])
    with pytest.raises(gpchol.NotPositiveDefiniteError, match="pivot 3") as e:
        gpchol.cholesky(a, check=True)
    assert e.value.pivot == 3 and e.value.min_diagonal == -3.0
    assert "jitter" in str(e.value)
    assert isinstance(e.value, ValueError)


def test_check_inside_jit_says_use_status():
    with pytest.raises(ValueError, match="cholesky_with_status"):
        jax.jit(lambda x: gpchol.cholesky(x, check=True))(np.eye(3))


def test_check_passes_on_pd(rng):
    a = random_spd(rng, 5)
    np.testing.assert_allclose(gpchol.cholesky(a, check=True), np.linalg.cholesky(a))


@pytest.mark.parametrize("backend", BACKENDS)
def test_jitter_schedule(backend):
    a = np.array([[1.0, 1.0], [1.0, 1.0]])  # singular
    L, status, used = gpchol.cholesky_with_status(a, jitter=(0.0, 1e-10, 1e-3), backend=backend)
    assert int(status) == 0 and float(used) in (1e-10, 1e-3)
    np.testing.assert_allclose(L @ L.T, a + float(used) * np.eye(2), rtol=1e-12)
    _, status2, used2 = jax.jit(
        lambda x: gpchol.cholesky_with_status(x, jitter=(-0.0, 1e-6), backend=backend)
    )(np.diag([1.0, -1e-7]))
    assert int(status2) == 0 and float(used2) == 1e-6
    _, s3, u3 = gpchol.cholesky_with_status(np.diag([1.0, -1.0]), jitter=(1e-6, 1e-3))
    assert int(s3) == 2 and float(u3) == 1e-3
    with pytest.raises(gpchol.NotPositiveDefiniteError, match="after trying jitter"):
        gpchol.cholesky(np.diag([1.0, -1.0]), jitter=1e-3, check=True)


def test_jitter_batched_each_element_its_own():
    a = np.stack([np.eye(3), np.diag([1.0, 1.0, -1e-5])])
    _, status, used = gpchol.cholesky_with_status(a, jitter=(0.0, 1e-3))
    assert status.tolist() == [0, 0] and used.tolist() == [0.0, 1e-3]


def test_gradient_through_jitter(rng):
    a = random_spd(rng, 5)
    g1 = jax.grad(lambda x: jnp.sum(gpchol.cholesky(x, jitter=(0.0, 1.0))))(a)
    g2 = jax.jit(jax.grad(lambda x: jnp.sum(jnp.linalg.cholesky(x))))(a)
    np.testing.assert_allclose(g1, g2, rtol=1e-10)


@pytest.mark.parametrize("backend", ["xla", "tiled"])
def test_reverse_gradient_where_a_jitter_attempt_failed(backend):
    """The zero cotangent sent back to a discarded (failed) attempt ran Murray's adjoint on
    its NaN factor: 0 * NaN made the whole gradient NaN (forward mode was right)."""
    a = np.array([[1.0, 1.0], [1.0, 1.0 - 1e-3]])  # not PD; a + 1e-2 I is

    def f(x):
        return jnp.sum(gpchol.cholesky(x, jitter=(0.0, 1e-2), backend=backend))

    def ref(x):
        return jnp.sum(jnp.linalg.cholesky(x + 1e-2 * jnp.eye(2)))

    np.testing.assert_allclose(jax.grad(f)(a), jax.grad(ref)(a), rtol=1e-12)
    t = np.eye(2)
    np.testing.assert_allclose(jax.jvp(f, (a,), (t,))[1], jax.jvp(ref, (a,), (t,))[1], rtol=1e-12)
    batch = np.stack([a, 2.0 * np.eye(2)])  # one element needs the jitter, one does not
    g = jax.grad(lambda x: jnp.sum(gpchol.cholesky(x, jitter=(0.0, 1e-2), backend=backend)))(batch)
    np.testing.assert_allclose(g[0], jax.grad(ref)(a), rtol=1e-12)
    want = jax.grad(lambda x: jnp.sum(jnp.linalg.cholesky(x)))(2.0 * np.eye(2))
    np.testing.assert_allclose(g[1], want, rtol=1e-12)
    # every attempt failed: the factor is NaN, its reverse derivative zero (not NaN)
    hopeless = np.array([[1.0, 2.0], [2.0, 1.0]])
    assert np.all(np.isnan(gpchol.cholesky(hopeless, jitter=(0.0, 1e-2), backend=backend)))
    assert np.all(jax.grad(f)(hopeless) == 0.0)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("backend", ["auto", "xla", "tiled"])
def test_entries_near_the_largest_number(backend, dtype):
    """(A + A^T) / 2 overflowed for entries above half the dtype's largest number: a
    finite SPD matrix factored to inf with status 0."""
    big = np.finfo(dtype).max
    a = (np.array([[0.9, 0.3], [0.3, 0.8]]) * big).astype(dtype)
    L, status = gpchol.cholesky_with_status(a, backend=backend)
    assert int(status) == 0
    np.testing.assert_allclose(L, np.linalg.cholesky(a.astype(np.float64)), rtol=1e-6)


def test_a_factor_that_failed_where_the_status_search_did_not_is_refactored():
    """XLA's potrf (OpenBLAS, threaded) can fail on a matrix within rounding of singular
    that the status search's one-thread potrf factors: the factor is then the search's,
    never NaN with status 0 (found by a review on random rank-deficient matrices)."""
    from gpchol._internal import host_lapack

    a = jnp.asarray(np.array([[4.0, 2.0], [2.0, 3.0]]))
    nan = jnp.full((2, 2), jnp.nan)
    out = host_lapack.refactor_where(jnp.asarray(True), lambda: a, nan, jnp.linalg.cholesky)
    np.testing.assert_allclose(out, np.linalg.cholesky(np.asarray(a)), rtol=1e-15)
    kept = host_lapack.refactor_where(jnp.asarray(False), lambda: a, nan, jnp.linalg.cholesky)
    assert np.all(np.isnan(kept))


# ---------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("jitter", ["1e-3", True, (0.0, "1e-3"), (False, 1e-3)])
def test_jitter_that_is_not_a_number_is_refused(jitter):
    # float("1e-3") and float(True) are numbers to Python: a string or a bool was taken
    with pytest.raises(TypeError, match="jitter values must be real numbers"):
        gpchol.cholesky(np.eye(2), jitter=jitter)


@pytest.mark.parametrize(
    "arg, kwargs, exc, match",
    [
        (np.ones(3), {}, ValueError, "at least 2 dimensions"),
        (np.ones((2, 3)), {}, ValueError, "square"),
        (np.eye(3, dtype=np.int32), {}, TypeError, "integer"),
        (np.eye(3, dtype=np.complex128), {}, TypeError, "complex"),
        (np.eye(3, dtype=np.float16), {}, TypeError, "float32 and float64"),
        (np.eye(3), {"tile_size": 0}, ValueError, "tile_size must be >= 1"),
        (np.eye(3), {"tile_size": 2.5}, TypeError, "tile_size"),
        (np.eye(3), {"tile_size": True}, TypeError, "tile_size"),
        (np.eye(3), {"backend": "lapack"}, ValueError, "backend must be one of"),
        (np.eye(3), {"backend": "cuda"}, ValueError, "GPU"),
        (np.eye(3), {"jitter": -1.0}, ValueError, "jitter"),
        (np.eye(3), {"jitter": ()}, ValueError, "jitter"),
        (np.eye(3), {"jitter": "a"}, TypeError, "jitter"),
    ],
)
def test_bad_input(arg, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        gpchol.cholesky(arg, **kwargs)


def test_tile_larger_than_matrix_is_fine(rng):
    a = random_spd(rng, 5)
    np.testing.assert_allclose(
        gpchol.cholesky(a, tile_size=100, backend="tiled"), np.linalg.cholesky(a), rtol=1e-12
    )
