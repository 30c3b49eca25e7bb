"""Sharded potrf/potrs/logdet (gpchol.distributed) against single-device references.

8 simulated CPU devices (conftest). Each case compiles a program unrolled over the tiles,
so the table is chosen to cover every mesh shape, dividing and non-dividing tile sizes and
both dtypes while keeping the whole file within a few minutes on 2 cores.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import random_spd
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import gpchol
from gpchol import distributed as gd
from gpchol import kernels, means
from gpchol._internal import maybe_sharded_cholesky

TOL = {np.float32: 2e-4, np.float64: 1e-10}

# (mesh shape, n, T_A, dtype): every mesh shape; T_A dividing and not; both dtypes.
FACTOR_CASES = [
    ((1, 1), 64, 16, np.float64),
    ((2, 2), 200, 32, np.float64),  # 32 does not divide 100: padded
    ((2, 4), 512, 64, np.float32),
    ((4, 2), 200, 30, np.float64),  # not dividing
    ((1, 8), 1000, 125, np.float64),
    ((8, 1), 64, 8, np.float32),
]


def _mesh(shape):
    return jax.make_mesh(shape, ("r", "c"))


def _put(a, mesh, spec=("r", "c")):
    return jax.device_put(a, NamedSharding(mesh, P(*spec)))


@pytest.mark.slow_cases(
    "shape1-200-32-float64",
    "shape2-512-64-float32",
    "shape3-200-30-float64",
    "shape4-1000-125-float64",
    "shape5-64-8-float32",
)
@pytest.mark.parametrize("shape,n,T,dtype", FACTOR_CASES)
def test_factor_solve_logdet(rng, shape, n, T, dtype):
    mesh = _mesh(shape)
    A = random_spd(rng, n, dtype=dtype)
    a = _put(A, mesh)
    L, status = gd.potrf(a, T, donate=False, return_status=True)
    assert int(status) == 0
    assert L.sharding == a.sharding and L.dtype == dtype
    ref = np.linalg.cholesky(A.astype(np.float64))
    tol = TOL[dtype]
    np.testing.assert_allclose(np.asarray(L, np.float64), ref, atol=tol * 10, rtol=0)
    b = rng.standard_normal((n, 3)).astype(dtype)
    x = gd.potrs(L, b, T)
    np.testing.assert_allclose(x, np.linalg.solve(A.astype(np.float64), b), atol=tol * 50)
    if shape == (1, 1):  # one vector right-hand side (another compile) is enough
        assert gd.potrs(L, b[:, 0], T).shape == (n,)
    ld = float(gd.logdet(L))
    np.testing.assert_allclose(ld, np.linalg.slogdet(A.astype(np.float64))[1], rtol=tol * 10)


@pytest.mark.slow_cases("shape1-200-40", "shape2-64-8")
@pytest.mark.parametrize("shape,n,T", [((2, 2), 64, 16), ((2, 4), 200, 40), ((8, 1), 64, 8)])
def test_gradients_match_single_device(rng, shape, n, T):
    mesh = _mesh(shape)
    A = random_spd(rng, n)
    W = jnp.asarray(rng.standard_normal((n, n)))
    b = jnp.asarray(rng.standard_normal(n))

    def f(a):
        L = gd.potrf(a, T, donate=False)
        return jnp.sum(W * L) + gd.logdet(L) + jnp.sum(gd.potrs(L, b, T) ** 2)

    def f_ref(a):
        L = jnp.linalg.cholesky(a)
        x = jax.scipy.linalg.cho_solve((L, True), b)
        return jnp.sum(W * L) + 2 * jnp.sum(jnp.log(jnp.diag(L))) + jnp.sum(x**2)

    with jax.set_mesh(mesh):
        g = jax.jit(jax.grad(f))(_put(A, mesh))
    assert g.sharding.spec == P("r", "c")
    g_ref = jax.jit(jax.grad(f_ref))(jnp.asarray(A))
    np.testing.assert_allclose(g, g_ref, atol=1e-9)

    # and the same as through gpchol's own single-device Cholesky
    def f_gp(a):
        L = gpchol.cholesky(a)
        return jnp.sum(W * L) + gpchol.logdet(L) + jnp.sum(gpchol.cho_solve(L, b) ** 2)

    np.testing.assert_allclose(g, jax.grad(f_gp)(jnp.asarray(A)), atol=1e-9)


@pytest.mark.slow
def test_jvp_matches_single_device(rng):
    mesh = _mesh((4, 2))
    n, T = 64, 8
    A = random_spd(rng, n)
    V = rng.standard_normal((n, n))
    V = V + V.T
    with jax.set_mesh(mesh):
        _, t = jax.jit(lambda a, v: jax.jvp(lambda x: gd.potrf(x, T, donate=False), (a,), (v,)))(
            _put(A, mesh), _put(V, mesh)
        )
    _, t_ref = jax.jvp(jax.jit(jnp.linalg.cholesky), (jnp.asarray(A),), (jnp.asarray(V),))
    np.testing.assert_allclose(t, t_ref, atol=1e-10)

    # forward mode through the solve as well (potrs has its own derivative rule)
    b = jnp.asarray(rng.standard_normal(n))

    def solve(a):
        return gd.potrs(gd.potrf(a, T, donate=False), b, T)

    with jax.set_mesh(mesh):
        _, t = jax.jit(lambda a, v: jax.jvp(solve, (a,), (v,)))(_put(A, mesh), _put(V, mesh))
    ref_solve = jax.jit(lambda a: jnp.linalg.solve(a, b))
    _, t_ref = jax.jvp(ref_solve, (jnp.asarray(A),), (jnp.asarray(V),))
    np.testing.assert_allclose(t, t_ref, atol=1e-10)


@pytest.mark.slow
def test_jit_and_shardmap_entry_points(rng):
    mesh = _mesh((2, 2))
    n, T = 64, 16
    A = random_spd(rng, n)
    b = rng.standard_normal((n, 2))
    ref = np.linalg.cholesky(A)

    @jax.jit
    def in_jit(a, b):
        L, s = gd.potrf_jit_ctx(a, T)
        return L, s, gd.potrs_jit_ctx(L, b, T), gd.logdet_jit_ctx(L)

    L, s, x, ld = in_jit(_put(A, mesh), b)
    assert int(s) == 0 and L.sharding.spec == P("r", "c")
    np.testing.assert_allclose(L, ref, atol=1e-10)
    np.testing.assert_allclose(x, np.linalg.solve(A, b), atol=1e-9)

    def local(a_blk, b):
        L_blk, s = gd.potrf_shardmap_ctx(a_blk, T, "r", "c")
        x = gd.potrs_shardmap_ctx(L_blk, b, T, "r", "c")
        return L_blk, s, x, gd.logdet_shardmap_ctx(L_blk, "r", "c")

    sm = jax.jit(
        jax.shard_map(
            local,
            mesh=mesh,
            in_specs=(P("r", "c"), P()),
            out_specs=(P("r", "c"), P(), P(), P()),
            check_vma=False,
        )
    )
    L2, s2, x2, ld2 = sm(_put(A, mesh), b)
    assert int(s2) == 0
    np.testing.assert_allclose(L2, ref, atol=1e-10)
    np.testing.assert_allclose(x2, x, atol=1e-10)
    np.testing.assert_allclose(ld2, ld, rtol=1e-12)


@pytest.mark.parametrize("spec", [("r", None), (None, "c")])
def test_one_axis_shardings(rng, spec):
    mesh = _mesh((2, 2))
    A = random_spd(rng, 64)
    a = _put(A, mesh, spec)
    L = gd.potrf(a, 16, donate=False)
    assert L.sharding.spec == P(*spec)
    np.testing.assert_allclose(L, np.linalg.cholesky(A), atol=1e-10)


@pytest.mark.slow
def test_donation_frees_input(rng):
    mesh = _mesh((2, 2))
    a = _put(random_spd(rng, 64), mesh)
    L = gd.potrf(a, 16)
    assert a.is_deleted()
    assert not L.is_deleted()
    b = _put(random_spd(rng, 64), mesh)
    gd.potrf(b, 16, donate=False)
    assert not b.is_deleted()


@pytest.mark.slow
def test_not_positive_definite_status_and_nan(rng):
    mesh = _mesh((2, 2))
    n = 64
    A = random_spd(rng, n)
    A[37, 37] = -5.0
    L, status = gd.potrf(_put(A, mesh), 16, donate=False, return_status=True)
    _, ref_status = gpchol.cholesky_with_status(jnp.asarray(A), backend="tiled", tile_size=16)
    assert int(status) == int(ref_status) == 38
    assert np.all(np.isnan(np.asarray(L)))
    # padded case: pivot numbering is the original one
    L, status = gd.potrf(_put(A, mesh), 24, donate=False, return_status=True)
    assert int(status) == 38


@pytest.mark.slow
def test_hlo_has_no_full_matrix_collective():
    mesh = _mesh((2, 4))
    n, T = 512, 32
    a = jax.ShapeDtypeStruct((n, n), jnp.float64, sharding=NamedSharding(mesh, P("r", "c")))
    txt = jax.jit(lambda x: gd.potrf_jit_ctx(x, T)).lower(a).compile().as_text()
    sizes = _collective_result_elements(txt)
    assert sizes, "expected collectives in the HLO"
    assert max(sizes) < n * n // 4, max(sizes)  # far from n*n; local block is n*n/8


def _collective_result_elements(txt):
    out = []
    pat = re.compile(r"=\s*(\(?[^=]*?)\s+(all-gather|all-reduce|all-to-all|collective-permute)")
    for line in txt.splitlines():
        m = pat.search(line)
        if not m:
            continue
        for dims in re.findall(r"[fsu]\d+\[([\d,]*)\]", m.group(1)):
            out.append(int(np.prod([int(d) for d in dims.split(",") if d] or [1])))
    return out


@pytest.mark.slow
def test_gaussian_log_likelihood_value_and_grad(rng):
    mesh = _mesh((2, 4))
    n = 48
    X = jnp.asarray(rng.uniform(size=(n, 2)))
    y = jnp.asarray(rng.standard_normal(n))
    k = 1.5 * kernels.ExpSquared(lengthscale=0.4)

    def ref(k, noise, X):
        return gpchol.mvn_logpdf(y, 0.0, k(X, X) + noise * jnp.eye(n))

    f = jax.jit(
        jax.value_and_grad(
            lambda k, s, X: gd.gaussian_log_likelihood(k, k, X, y, s, mesh, 6)[0],
            argnums=(0, 1, 2),
        )
    )
    # X placed by rows on the (Explicit) mesh: replicated inside, its gradient comes back
    # in its own layout
    Xr = _put(X, mesh, ("r", None))
    v, g = f(k, 0.1, Xr)
    assert g[2].sharding.spec == P("r", None)
    vr, gr = jax.jit(jax.value_and_grad(ref, argnums=(0, 1, 2)))(k, 0.1, X)
    np.testing.assert_allclose(v, vr, rtol=1e-10)
    for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(gr), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-8, atol=1e-12 * np.max(np.abs(b)))

    # the function form (params, X1, X2) -> block gives the same value
    def fn(params, X1, X2):
        return kernels.ExpSquared(lengthscale=params["ls"])(X1, X2) * params["amp"]

    v2, _ = jax.jit(lambda p: gd.gaussian_log_likelihood(fn, p, X, y, 0.1, mesh, 6))(
        {"ls": 0.4, "amp": 1.5}
    )
    np.testing.assert_allclose(v2, vr, rtol=1e-10)


@pytest.mark.slow
def test_gaussian_log_likelihood_any_n_and_all_gradients(rng):
    """n = 203 on 2x4 (divisible by neither axis): value and gradients wrt every input,
    with per-point noise and a prior mean (whose gradient reaches X too)."""
    mesh = _mesh((2, 4))
    n = 203
    X = jnp.asarray(rng.uniform(size=(n, 2)))
    y = jnp.asarray(rng.standard_normal(n))
    k = 1.5 * kernels.Matern32(lengthscale=0.4) + kernels.White(0.01)
    noise = jnp.asarray(rng.uniform(0.05, 0.2, n))
    mean = means.Linear(weights=jnp.array([0.5, -1.0]), bias=0.3)

    def ref(k, X, y, noise, mean):
        return gpchol.mvn_logpdf(y, mean(X), k(X, X) + jnp.diag(noise))

    def f(k, X, y, noise, mean):
        return gd.gaussian_log_likelihood(k, k, X, y, noise, mesh, mean=mean)[0]

    args = (k, X, y, noise, mean)
    v, g = jax.jit(jax.value_and_grad(f, argnums=(0, 1, 2, 3, 4)))(*args)
    vr, gr = jax.jit(jax.value_and_grad(ref, argnums=(0, 1, 2, 3, 4)))(*args)
    np.testing.assert_allclose(v, vr, rtol=1e-10)
    for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(gr), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-8, atol=1e-12 * np.max(np.abs(b)))


def test_gaussian_log_likelihood_bad_noise_and_mean(rng):
    mesh = _mesh((2, 4))
    X, y = rng.uniform(size=(10, 2)), rng.standard_normal(10)
    k = kernels.ExpSquared()
    with pytest.raises(ValueError, match=r"noise .*scalar or have shape \(10,\).*got shape \(9,\)"):
        gd.gaussian_log_likelihood(k, k, X, y, np.ones(9), mesh)
    with pytest.raises(ValueError, match=r"mean must be .*\(10,\).*got values of shape \(3,\)"):
        gd.gaussian_log_likelihood(k, k, X, y, 0.1, mesh, mean=lambda X: X[:3, 0])


@pytest.mark.slow
def test_gaussian_log_likelihood_gradient_memory_is_per_device():
    """The compiled value-and-gradient keeps O(n^2 / P) per device, no n x n buffer.

    n = 1024 on 2x4 (P = 8), T_A = 64: one local block is n^2 / 8 entries. The step needs
    the factor and the gradient buffer (two blocks) plus panels and partial products; the
    bound allowed is three blocks plus 2 n T_A entries (half of one n x n matrix here).
    """
    mesh = _mesh((2, 4))
    n, T, P_ = 1024, 64, 8
    X = jax.ShapeDtypeStruct((n, 3), jnp.float64)
    y = jax.ShapeDtypeStruct((n,), jnp.float64)
    k = 1.5 * kernels.ExpSquared(lengthscale=0.4)

    def f(k, noise, X, y):
        return gd.gaussian_log_likelihood(k, k, X, y, noise, mesh, T)[0]

    compiled = jax.jit(jax.value_and_grad(f, argnums=(0, 1))).lower(k, 0.1, X, y).compile()
    mem = compiled.memory_analysis()
    block = n * n // P_ * 8
    used = mem.temp_size_in_bytes + mem.output_size_in_bytes
    assert used <= 3 * block + 2 * n * T * 8, used / block
    largest = max(_buffer_elements(compiled.as_text()))
    assert largest <= n * n // P_, largest  # nothing bigger than one local block


def _buffer_elements(txt):
    """Element counts of every array shape in an HLO text (f64/f32 arrays)."""
    return [
        int(np.prod([int(d) for d in dims.split(",") if d] or [1]))
        for dims in re.findall(r"f(?:64|32)\[([\d,]*)\]", txt)
    ]


def test_dispatch_hook(rng):
    mesh = _mesh((2, 2))
    A = random_spd(rng, 64)
    assert maybe_sharded_cholesky(jnp.asarray(A)) is None
    L, status = maybe_sharded_cholesky(_put(A, mesh), 16)
    assert int(status) == 0
    np.testing.assert_allclose(L, np.linalg.cholesky(A), atol=1e-10)


def test_cholesky_under_jit_on_auto_axes_stays_sharded(rng):
    """Under jit on Auto axes a traced array's sharding is unknown (P(None, None)), only its
    mesh: gpchol.cholesky factored it whole on every device. It now lays a matrix on such
    a mesh out over the mesh's first two axes; one whose n no layout could have held stays
    on one device, as before."""
    auto = jax.sharding.AxisType.Auto
    mesh = jax.make_mesh((2, 4), ("r", "c"), axis_types=(auto, auto))
    n = 64
    A = random_spd(rng, n)
    compiled = jax.jit(gpchol.cholesky).lower(_put(A, mesh)).compile()
    assert max(_buffer_elements(compiled.as_text())) < n * n  # never gathered whole
    for a in (_put(A, mesh), _put(A, mesh, ())):  # sharded, replicated: the spec is unknown
        L = jax.jit(gpchol.cholesky)(a)
        assert L.sharding.spec == P("r", "c")
        np.testing.assert_allclose(L, np.linalg.cholesky(A), atol=1e-10)
    B = random_spd(rng, 10)  # 10 is not a multiple of 4: not a layout over this mesh
    L = jax.jit(gpchol.cholesky)(_put(B, mesh, ()))
    np.testing.assert_allclose(L, np.linalg.cholesky(B), atol=1e-12)


def test_bad_input(rng):
    mesh = _mesh((2, 2))
    A = random_spd(rng, 64)
    a = _put(A, mesh)
    with pytest.raises(ValueError, match="T_A"):
        gd.potrf(a, 0, donate=False)
    with pytest.raises(ValueError, match="larger than a shard"):
        gd.potrf(a, 64, donate=False)
    with pytest.raises(ValueError, match="square"):
        gd.potrf(jnp.ones((8, 4)), 2, mesh)
    with pytest.raises(ValueError, match="2-D"):
        gd.potrf(jnp.ones(8), 2, mesh)
    with pytest.raises(ValueError, match="not in the mesh"):
        gd.potrf_jit_ctx(jnp.asarray(A), 8, mesh=mesh, spec=P("x", "c"))
    with pytest.raises(ValueError, match="several mesh axes"):
        gd.potrf(jax.device_put(A, NamedSharding(mesh, P(("r", "c"), None))), 8)
    with pytest.raises(ValueError, match="multiple of lcm"):
        gd.potrf(jnp.asarray(A[:63, :63]), 8, _mesh((2, 4)))
    with pytest.raises(ValueError, match="mesh"):
        gd.potrf(jnp.asarray(A), 8)


# ------------------------------------------------------------------ issue 14, item 6


@pytest.mark.slow
@pytest.mark.parametrize("axis_type", ["explicit", "auto"])
def test_unsharded_traced_input_is_placed(rng, axis_type):
    """An unsharded array inside the caller's ``jit`` or ``grad`` is placed on the mesh as
    documented (it raised a shard_map in_specs error), on Explicit and Auto meshes."""
    types = {"explicit": jax.sharding.AxisType.Explicit, "auto": jax.sharding.AxisType.Auto}
    mesh = jax.make_mesh((2, 2), ("r", "c"), axis_types=(types[axis_type],) * 2)
    n, T = 16, 4
    A = jnp.asarray(random_spd(rng, n))  # single-device, unsharded
    b = jnp.asarray(rng.standard_normal(n))
    ref = np.linalg.cholesky(np.asarray(A))
    L = jax.jit(lambda a: gd.potrf(a, T, mesh, donate=False))(A)
    assert L.sharding.spec == P("r", "c")
    np.testing.assert_allclose(L, ref, atol=1e-12)
    L2, s = jax.jit(lambda a: gd.potrf_jit_ctx(a, T, mesh=mesh))(A)
    assert int(s) == 0 and L2.sharding.spec == P("r", "c")
    # the solve and the log-determinant take an unsharded factor inside jit too
    Lu = jnp.asarray(ref)
    x = jax.jit(lambda L: gd.potrs(L, b, T, mesh))(Lu)
    np.testing.assert_allclose(x, np.linalg.solve(np.asarray(A), b), atol=1e-12)
    ld = jax.jit(lambda L: gd.logdet_jit_ctx(L, mesh=mesh))(Lu)
    np.testing.assert_allclose(ld, np.linalg.slogdet(np.asarray(A))[1], rtol=1e-12)

    def f(a):
        return jnp.sum(b[:, None] * gd.potrf(a, T, mesh, donate=False))

    g_ref = jax.jit(jax.grad(lambda a: jnp.sum(b[:, None] * jnp.linalg.cholesky(a))))(A)
    np.testing.assert_allclose(jax.jit(jax.grad(f))(A), g_ref, atol=1e-12)
    # eager grad: on an Explicit mesh JAX seeds the cotangent on the output's mesh and
    # needs the mesh context (its own requirement, stated in its error message)
    with jax.set_mesh(mesh):
        np.testing.assert_allclose(jax.grad(f)(A), g_ref, atol=1e-12)


@pytest.mark.slow
def test_eager_calls_run_jitted_and_cached(rng):
    """Eager (un-jitted) calls run one cached jitted program: the kernel function is traced
    on the first call only (it ran op by op: 70-95 s at n = 30 on 2x4, issue 14)."""
    mesh = _mesh((2, 4))
    n = 30
    X = jnp.asarray(rng.uniform(size=(n, 2)))
    y = jnp.asarray(rng.standard_normal(n))
    calls = []

    def fn(params, X1, X2):
        calls.append(1)
        return params["amp"] * kernels.ExpSquared(lengthscale=params["ls"])(X1, X2)

    p = {"amp": 1.5, "ls": 0.4}
    v, s = gd.gaussian_log_likelihood(fn, p, X, y, 0.1, mesh)
    first = len(calls)
    assert first >= 1 and int(s) == 0
    v2, _ = gd.gaussian_log_likelihood(fn, {"amp": 1.5, "ls": 0.4}, X, y, 0.1, mesh)
    assert len(calls) == first  # no retrace, no op-by-op evaluation
    k = 1.5 * kernels.ExpSquared(lengthscale=0.4)
    ref = gpchol.mvn_logpdf(y, 0.0, k(X, X) + 0.1 * jnp.eye(n))
    np.testing.assert_allclose([v, v2], [ref, ref], rtol=1e-10)
    # eager grad (under the mesh context: see test_unsharded_traced_input_is_placed)
    with jax.set_mesh(mesh):
        g = jax.grad(lambda p: gd.gaussian_log_likelihood(fn, p, X, y, 0.1, mesh)[0])(p)
    g_ref = jax.jit(jax.grad(lambda p: gpchol.mvn_logpdf(y, 0.0, fn(p, X, X) + 0.1 * jnp.eye(n))))(
        p
    )
    for a, b_ in zip(jax.tree.leaves(g), jax.tree.leaves(g_ref), strict=True):
        np.testing.assert_allclose(a, b_, rtol=1e-8)


# ------------------------------------------------------------------ review of stop 56


def test_second_order_derivatives_are_a_clear_error(rng):
    """The first-order rules' custom_linear_solve had a matvec that did not depend on L, so
    JAX left out L's dependence on A: forward-over-forward gave a wrong number (2.50 for
    1.25) and jax.hessian an internal TypeError. Now every second-order path raises."""
    mesh = _mesh((2, 2))
    A = random_spd(rng, 8)
    W = rng.standard_normal((8, 8))
    V = rng.standard_normal((8, 8))
    V = V + V.T
    b = rng.standard_normal(8)

    def f(a):
        return jnp.sum(W * gd.potrf(a, 2, mesh, donate=False))

    def h(L):
        return jnp.sum(gd.potrs(L, b, 2, mesh))

    with jax.set_mesh(mesh):
        g = jax.jit(jax.grad(f))(jnp.asarray(A))  # first order still right
        want = jax.grad(lambda a: jnp.sum(W * jnp.linalg.cholesky(a)))(jnp.asarray(A))
        np.testing.assert_allclose(g, want, rtol=1e-9, atol=1e-12)
        Lf = jnp.asarray(np.linalg.cholesky(A))
        for second in (
            lambda: jax.jvp(lambda x: jax.jvp(f, (x,), (x,))[1], (A,), (V,)),
            lambda: jax.jit(jax.hessian(f))(A),
            lambda: jax.grad(lambda a: jnp.sum(jax.grad(f)(a)))(A),
            lambda: jax.hessian(h)(Lf),
        ):
            with pytest.raises(NotImplementedError, match="second-order derivatives"):
                second()


def test_routed_sharded_cholesky_symmetrizes_like_one_device(rng):
    """gpchol.cholesky promises L L^T = (A + A^T) / 2; a sharded input read only its lower
    triangle (0.095 off for a perturbed upper triangle)."""
    mesh = _mesh((2, 2))
    A = random_spd(rng, 8)
    N = A + np.triu(0.1 * rng.standard_normal((8, 8)), 1)
    ref = np.linalg.cholesky((N + N.T) / 2)
    np.testing.assert_allclose(gpchol.cholesky(jnp.asarray(N)), ref, atol=1e-12)
    np.testing.assert_allclose(gpchol.cholesky(_put(N, mesh)), ref, atol=1e-12)
    with jax.set_mesh(mesh):  # an eager grad on an Explicit mesh needs it (as potrf's)
        g = jax.grad(lambda a: jnp.sum(jnp.sin(gpchol.cholesky(a))))(_put(N, mesh))
    want = jax.grad(lambda a: jnp.sum(jnp.sin(jnp.linalg.cholesky(a))))(jnp.asarray(N))
    np.testing.assert_allclose(g, want, rtol=1e-9, atol=1e-12)


def test_replicated_input_is_distributed(rng):
    """An input replicated over the mesh (P(), the default under jax.set_mesh) was factored
    whole on every device; it is laid out with the mesh's default spec like an unsharded
    one."""
    mesh = _mesh((2, 4))
    A = random_spd(rng, 16)
    L = gd.potrf(jax.device_put(A, NamedSharding(mesh, P())), 2, mesh, donate=False)
    assert L.sharding.spec == P("r", "c")
    assert L.addressable_shards[0].data.shape == (8, 4)
    L2 = gd.potrf(jax.device_put(A, NamedSharding(mesh, P())), 2, donate=False)  # its mesh
    assert L2.sharding.spec == P("r", "c")
    np.testing.assert_allclose(L, np.linalg.cholesky(A), atol=1e-12)


def test_more_bad_input_of_the_sharded_functions(rng):
    mesh = _mesh((2, 4))
    k = kernels.ExpSquared()
    X, y = rng.uniform(size=(10, 2)), rng.standard_normal(10)
    with pytest.raises(ValueError, match=r"T_A = 5000 is larger than n / lcm\(Pr, Pc\)"):
        gd.gaussian_log_likelihood(k, k, X, y, 0.1, mesh, 5000)
    bad = X.copy()
    bad[3, 1] = np.nan
    with pytest.raises(ValueError, match=r"X has NaN or inf in row\(s\) \[3\]"):
        gd.gaussian_log_likelihood(k, k, bad, y, 0.1, mesh)
    with pytest.raises(ValueError, match=r"y has NaN or inf in row\(s\) \[4\]"):
        gd.gaussian_log_likelihood(k, k, X, np.where(np.arange(10) == 4, np.inf, y), 0.1, mesh)
    with pytest.raises(ValueError, match="n = 30 must be a positive multiple of lcm"):
        gd.logdet(jnp.eye(30), mesh)
    with pytest.raises(ValueError, match="n = 30 must be a positive multiple of lcm"):
        jax.jit(lambda L: gd.logdet_jit_ctx(L, mesh=mesh))(jnp.eye(30))


def test_potrs_promotes_like_cho_solve(rng):
    """float32 L with a float64 b solves in float64 (as gpchol.cho_solve); it returned
    float32."""
    mesh = _mesh((2, 2))
    A = random_spd(rng, 8)
    L = gd.potrf(jnp.asarray(A, jnp.float32), 2, mesh, donate=False)
    b = rng.standard_normal(8)
    x = gd.potrs(L, b, 2, mesh)
    assert x.dtype == gpchol.cho_solve(jnp.asarray(np.linalg.cholesky(A), jnp.float32), b).dtype
    assert x.dtype == np.float64
    np.testing.assert_allclose(x, np.linalg.solve(A, b), rtol=1e-5)
    assert gd.potrs(L, b.astype(np.float32), 2, mesh).dtype == np.float32


def test_one_device_functions_take_inputs_sharded_over_explicit_axes(rng):
    """jax.make_mesh's default (Explicit) axes: what is not routed to the sharded
    factorization (a jitter schedule, another backend, rcond, the solves) raised
    ShardingTypeError (P('r','c') + P('c','r'), a diagonal's gather); it is computed on
    the replicated input, as on Auto axes."""
    mesh = _mesh((2, 2))
    A = random_spd(rng, 8)
    b = rng.standard_normal(8)
    a = _put(A, mesh)
    ref = np.linalg.cholesky(A)
    L, status, rc = gpchol.cholesky_with_status(a, rcond=True)
    assert int(status) == 0
    np.testing.assert_allclose(L, ref, atol=1e-12)
    d = np.diag(ref)
    np.testing.assert_allclose(rc, (d.min() / d.max()) ** 2, rtol=1e-12)
    np.testing.assert_allclose(
        gpchol.cholesky(a, jitter=1e-6), np.linalg.cholesky(A + 1e-6 * np.eye(8)), atol=1e-12
    )
    np.testing.assert_allclose(gpchol.cholesky(a, backend="xla"), ref, atol=1e-12)
    Ls = _put(ref, mesh)
    np.testing.assert_allclose(gpchol.logdet(Ls), np.linalg.slogdet(A)[1], rtol=1e-12)
    np.testing.assert_allclose(gpchol.cho_solve(Ls, b), np.linalg.solve(A, b), rtol=1e-10)
    np.testing.assert_allclose(gpchol.solve_triangular(Ls, b), np.linalg.solve(ref, b), rtol=1e-10)
