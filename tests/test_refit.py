"""Compile once, fit many: gpchol.fit's programs keyed by structure, and size buckets.

A second fit of the same structure (a new build closure, new data of the same bucket)
compiles nothing; padded rows change no value, gradient or optimum; arrays captured by a
build function that change between fits give the new result (never a stale program).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import backend_compiles

from gpchol import GaussianProcess, Positive, SparseGP, fit, kernels
from gpchol._internal import fit_batched_module
from gpchol._internal import fit_programs_module as programs

T = {"amp": Positive(), "ls": Positive(), "noise": Positive()}
P0 = {"amp": 1.0, "ls": 1.0, "noise": 0.1}


def _data(rng, n, d=2):
    X = rng.uniform(-3.0, 3.0, (n, d))
    y = np.sin(X[:, 0]) * np.cos(X[:, -1]) + 0.1 * rng.standard_normal(n)
    return X, y


def _build(X):
    # a new closure object for every call, as a user's `lambda p: ...` is
    return lambda p: GaussianProcess(p["amp"] * kernels.ExpSquared(p["ls"]), X, noise=p["noise"])


def _fit(X, y, **kw):
    return fit(_build(X), P0, y, transforms=T, progress=False, steps=60, **kw)


# ------------------------------------------------------------------------------ buckets


@pytest.mark.parametrize(
    "n, bucket, size",
    [
        (0, True, 0),
        (1, True, 32),
        (32, True, 32),
        (33, True, 64),
        (256, True, 256),
        (257, True, 264),
        (353, True, 360),
        (512, True, 512),
        (513, True, 528),
        (1024, True, 1024),
        (1025, True, 1056),
        (4096, True, 4096),
        (4097, True, 4097),
        (100, False, 100),
        (100, 7, 105),
        (7, 1, 7),
    ],
)
def test_bucket_size(n, bucket, size) -> None:
    assert programs.bucket_size(n, bucket) == size


def test_bucket_adds_at_most_a_thirty_second_above_256() -> None:
    for n in range(257, programs.BUCKET_MAX_N + 1):
        size = programs.bucket_size(n)
        assert n <= size <= n + n / 32, n


@pytest.mark.parametrize("bad", [0, -3, 1.5, "yes", None, np.float64(2.0)])
def test_bad_bucket_is_a_clear_error(rng, bad) -> None:
    X, y = _data(rng, 10)
    with pytest.raises(ValueError, match="bucket must be True"):
        _fit(X, y, bucket=bad)


@pytest.mark.slow_cases("1", "200", "257", "33", "511")
@pytest.mark.parametrize("n", [1, 31, 32, 33, 64, 200, 256, 257, 511, 512, 513])
def test_padded_rows_change_no_value_or_gradient(rng, n) -> None:
    """The padded likelihood (bucket rows masked) against the unpadded lean core, at bucket
    edges, value and gradient to 1e-10 relative, at random parameters."""
    X, y = _data(rng, n, d=3)
    size = programs.bucket_size(n)
    Xp = np.concatenate([X, np.repeat(X[:1], size - n, axis=0)])
    yp = np.concatenate([y, rng.standard_normal(size - n)])  # anything on padded rows
    mask = np.arange(size) < n
    p = {
        "amp": jnp.asarray(rng.uniform(0.5, 2.0)),
        "ls": jnp.asarray(rng.uniform(0.5, 2.0)),
        "noise": jnp.asarray(rng.uniform(0.05, 0.3)),
    }

    def exact(q):
        return _build(X)(q).log_marginal_likelihood(y)

    def padded(q):
        return fit_batched_module.padded_log_marginal_likelihood(_build(Xp)(q), yp, mask)

    v0, g0 = jax.value_and_grad(exact)(p)
    v1, g1 = jax.value_and_grad(padded)(p)
    np.testing.assert_allclose(float(v1), float(v0), rtol=1e-10)
    for k in p:
        np.testing.assert_allclose(float(g1[k]), float(g0[k]), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("n", [33, 64, 100])
def test_padded_fit_reaches_the_unpadded_optimum(rng, n) -> None:
    X, y = _data(rng, n)
    a = _fit(X, y, bucket=True)
    b = _fit(X, y, bucket=False)
    assert a.success and b.success and a.converged and b.converged
    np.testing.assert_allclose(a.loss, b.loss, rtol=1e-10)
    for k in P0:
        np.testing.assert_allclose(float(a.params[k]), float(b.params[k]), rtol=1e-6)


def _first_losses(build, y, p0, transforms):
    """The first loss of a fit with and without buckets: the value at ``p0``."""
    kw = {"transforms": transforms, "steps": 1, "progress": False}
    return [float(fit(build, p0, y, bucket=b, **kw).history[0]) for b in (True, False)]


def test_one_noise_value_of_shape_1_is_not_padded_as_per_point(rng) -> None:
    """A noise of shape (1,) is one value for every point (it broadcasts): the bucket's
    padding leaves it alone (it was padded as a per-point noise, giving the real points
    after the first a noise of 1)."""
    X, y = _data(rng, 20)
    T1 = {"ls": Positive()}
    for noise in (0.01, np.array([0.01])):

        def build(p, noise=noise):
            return GaussianProcess(kernels.ExpSquared(p["ls"]), X, noise=noise)

        want = -float(build({"ls": 1.3}).log_marginal_likelihood(y))
        np.testing.assert_allclose(_first_losses(build, y, {"ls": 1.3}, T1), want, rtol=1e-10)


def test_a_mask_of_the_users_own_is_kept_within_the_bucket(rng) -> None:
    """A GP built with a mask (the user's own padded rows) fits the same with buckets:
    the bucket's mask is combined with it (it replaced it, fitting the user's padded rows
    as data)."""
    X, y = _data(rng, 24)
    X[20:], y[20:] = 0.0, 50.0  # the user's padding: anything
    mask = np.arange(24) < 20

    def build(p):
        return GaussianProcess(
            p["amp"] * kernels.ExpSquared(p["ls"]), X, noise=p["noise"], mask=mask
        )

    want = -float(_build(X[:20])(P0).log_marginal_likelihood(y[:20]))
    np.testing.assert_allclose(_first_losses(build, y, P0, T), want, rtol=1e-10)
    a = fit(build, P0, y, transforms=T, progress=False, bucket=True)
    b = _fit(X[:20], y[:20], bucket=False)
    np.testing.assert_allclose(a.loss, b.loss, rtol=1e-9)


def test_diagnostics_of_a_padded_posterior_are_the_real_points(rng) -> None:
    """A posterior of padded rows (every estimator's) reports the conditioning of the
    real points' covariance, as the GP's own diagnostics do."""
    X, y = _data(rng, 20)
    size = programs.bucket_size(20)
    Xp = np.concatenate([X, np.repeat(X[:1], size - 20, axis=0)])
    yp = np.concatenate([y, np.zeros(size - 20)])
    p = {"amp": 1e-4, "ls": 1.0, "noise": 1e-6}
    padded = _build(Xp)(p).with_mask(np.arange(size) < 20)
    want = float(_build(X)(p).condition(y).diagnostics().rcond)
    assert want < 0.1  # far from the padded rows' unit pivots
    np.testing.assert_allclose(float(padded.condition(yp).diagnostics().rcond), want, rtol=1e-10)
    np.testing.assert_allclose(float(padded.diagnostics().rcond), want, rtol=1e-10)


def test_a_gp_of_padding_only_is_not_singular(rng) -> None:
    """All rows padding (a Bayesian-optimisation loop's first bucket): an empty covariance,
    rcond 1 as for n = 0 (it was 0, "singular", with a warning at every eager call)."""
    import warnings

    X, _ = _data(rng, 8)
    gp = _build(X)({"amp": 1.0, "ls": 1.0, "noise": 0.1}).with_mask(np.zeros(8, bool))
    empty = _build(X[:0])({"amp": 1.0, "ls": 1.0, "noise": 0.1})
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no SingularCovarianceWarning
        for d in (gp.diagnostics(), gp.condition(np.zeros(8)).diagnostics()):
            assert float(d.rcond) == float(empty.diagnostics().rcond) == 1.0
            assert not bool(d.singular) and int(d.status) == 0
        assert float(gp.log_marginal_likelihood(np.zeros(8))) == 0.0


# ------------------------------------------------------------------ compile once, fit many


@pytest.mark.parametrize("optimizer", ["lbfgs", "adam"])
def test_refit_of_the_same_structure_compiles_nothing(rng, optimizer) -> None:
    X, y = _data(rng, 40)
    _fit(X, y, optimizer=optimizer)  # compiles
    X2, y2 = _data(rng, 40)
    names = backend_compiles(lambda: _fit(X2, y2, optimizer=optimizer))  # new closure, data
    assert names == [], names
    # a new n in the same bucket: the same program
    X3, y3 = _data(rng, 45)
    names = backend_compiles(lambda: _fit(X3, y3, optimizer=optimizer))
    assert names == [], names


def test_growing_n_compiles_once_per_bucket(rng) -> None:
    """A Bayesian-optimisation loop: n grows by one point per fit, warm-started."""
    X, y = _data(rng, 79)
    p = dict(P0)
    _fit(X[:40], y[:40])  # the first fit of the bucket 64 compiles
    compiled = []
    for n in range(41, 80):
        names = backend_compiles(
            lambda n=n: fit(_build(X[:n]), p, y[:n], transforms=T, progress=False, steps=30)
        )
        compiled += [(n, name) for name in names]
    # n = 65 opens the bucket of 96: its value and gradient is compiled there, and nothing
    # else anywhere (L-BFGS's search runs in NumPy between evaluations)
    assert compiled == [(65, "jit(flat_loss)")], compiled


def test_first_fit_of_a_structure_compiles_its_loss_alone(rng) -> None:
    # a structure no other test fits: its first fit compiles the value and gradient, once;
    # the search, its state, the parameters' flattening and transforms, and the restarts'
    # default key compile nothing
    X, y = _data(rng, 50, d=3)
    p0 = {"amp": 1.0, "ls": jnp.ones(3), "alpha": 2.0, "noise": 0.1}
    tf = {"amp": Positive(), "ls": Positive(), "alpha": Positive(), "noise": Positive()}

    def build(p):
        k = p["amp"] * kernels.RationalQuadratic(p["ls"], alpha=p["alpha"])
        return GaussianProcess(k, X, noise=p["noise"])

    names = backend_compiles(lambda: fit(build, p0, y, transforms=tf, progress=False, steps=40))
    assert names == ["jit(flat_loss)"], names


def test_changed_captured_arrays_give_the_new_result(rng) -> None:
    """The same closure object, its captured arrays changed in place between two fits."""
    X, y = _data(rng, 30)
    Xbox = np.array(X)
    build = lambda p: GaussianProcess(  # noqa: E731
        p["amp"] * kernels.ExpSquared(p["ls"]), Xbox, noise=p["noise"]
    )
    first = fit(build, P0, y, transforms=T, progress=False, steps=60)
    X2, y2 = _data(rng, 30)
    Xbox[...] = X2  # same object, new values
    second = fit(build, P0, y2, transforms=T, progress=False, steps=60)
    fresh = fit(_build(X2), P0, y2, transforms=T, progress=False, steps=60, bucket=False)
    assert abs(second.loss - first.loss) > 1e-3
    np.testing.assert_allclose(second.loss, fresh.loss, rtol=1e-10)


def test_changed_python_scalar_gives_a_new_program(rng) -> None:
    X, y = _data(rng, 30)
    results = []
    for scale in (0.5, 2.0):
        build = lambda p, s=scale: GaussianProcess(  # noqa: E731
            p["amp"] * kernels.ExpSquared(s), X, noise=p["noise"]
        )
        p0 = {"amp": 1.0, "noise": 0.1}
        t = {"amp": Positive(), "noise": Positive()}
        res = fit(build, p0, y, transforms=t, progress=False, steps=60)
        ref = fit(build, p0, y, transforms=t, progress=False, steps=60, bucket=False)
        np.testing.assert_allclose(res.loss, ref.loss, rtol=1e-10)
        results.append(res.loss)
    assert abs(results[0] - results[1]) > 1e-3


def test_fixed_parameters_and_noise_are_data(rng) -> None:
    """Kernel parameters and a per-point noise that do not depend on the parameters are
    arguments of the program: new values, same program, the new result."""
    X, y = _data(rng, 30)

    def build_for(ls, noise):
        return lambda p: GaussianProcess(
            p["amp"] * kernels.ExpSquared(jnp.asarray(ls)), X, noise=noise
        )

    p0, t = {"amp": 1.0}, {"amp": Positive()}
    fit(build_for(1.0, np.full(30, 0.1)), p0, y, transforms=t, progress=False, steps=40)
    noise2 = rng.uniform(0.05, 0.2, 30)
    got = []
    names = backend_compiles(
        lambda: got.append(
            fit(build_for(0.7, noise2), p0, y, transforms=t, progress=False, steps=40)
        )
    )
    assert names == [], names
    ref = fit(build_for(0.7, noise2), p0, y, transforms=t, progress=False, steps=40, bucket=False)
    np.testing.assert_allclose(got[0].loss, ref.loss, rtol=1e-10)


def _fit_tripled_amplitude(X, y):
    """The unpadded reference fit of ``3 amp * ExpSquared(ls)``, five steps."""
    return fit(
        lambda p: GaussianProcess(3.0 * p["amp"] * kernels.ExpSquared(p["ls"]), X, noise=0.1),
        {"amp": 1.0, "ls": 1.0},
        y,
        transforms={"amp": Positive(), "ls": Positive()},
        progress=False,
        steps=5,
        bucket=False,
    )


def test_custom_rule_reading_an_array_is_not_cached_stale(rng) -> None:
    """A custom derivative rule that reads an array of its own (invisible in the jaxpr):
    the fit is not keyed by structure, and a changed array gives the new result."""
    X, y = _data(rng, 25)
    w = np.array([1.0])

    @jax.custom_jvp
    def scaled(a):
        return a * w[0]

    @scaled.defjvp
    def scaled_jvp(primals, tangents):
        return scaled(primals[0]), tangents[0] * w[0]

    def build(p):
        return GaussianProcess(scaled(p["amp"]) * kernels.ExpSquared(p["ls"]), X, noise=0.1)

    p0, t = {"amp": 1.0, "ls": 1.0}, {"amp": Positive(), "ls": Positive()}
    first = fit(build, p0, y, transforms=t, progress=False, steps=5)
    w[0] = 3.0
    second = fit(build, p0, y, transforms=t, progress=False, steps=5)
    ref = _fit_tripled_amplitude(X, y)
    assert abs(first.history[0] - second.history[0]) > 1e-6
    np.testing.assert_allclose(second.history, ref.history, rtol=1e-10)


def test_inner_jit_closing_over_arrays_is_not_cached_stale(rng) -> None:
    X, y = _data(rng, 25)
    box = {"w": jnp.asarray(1.0)}

    def build(p):
        scale = jax.jit(lambda a: a * box["w"])  # a new jit each call, closing over w
        return GaussianProcess(scale(p["amp"]) * kernels.ExpSquared(p["ls"]), X, noise=0.1)

    p0, t = {"amp": 1.0, "ls": 1.0}, {"amp": Positive(), "ls": Positive()}
    fit(build, p0, y, transforms=t, progress=False, steps=5)
    box["w"] = jnp.asarray(3.0)
    second = fit(build, p0, y, transforms=t, progress=False, steps=5)
    ref = _fit_tripled_amplitude(X, y)
    np.testing.assert_allclose(second.history, ref.history, rtol=1e-10)


def test_plain_loss_refit_compiles_nothing(rng) -> None:
    target = jnp.asarray(rng.standard_normal(5))

    def run(t):
        return fit(lambda p: jnp.sum((p - t) ** 2), jnp.zeros(5), progress=False, steps=20)

    run(target)
    t2 = jnp.asarray(rng.standard_normal(5))
    got = []
    assert backend_compiles(lambda: got.append(run(t2))) == []
    np.testing.assert_allclose(np.asarray(got[0].params), np.asarray(t2), rtol=1e-6)


def test_nan_in_X_is_the_same_error_as_before(rng) -> None:
    X, y = _data(rng, 20)
    X[3, 1] = np.nan
    with pytest.raises(ValueError) as padded:
        _fit(X, y)
    with pytest.raises(ValueError) as exact:
        _fit(X, y, bucket=False)
    assert str(padded.value) == str(exact.value)


def test_y_of_the_wrong_length_is_the_models_error(rng) -> None:
    X, y = _data(rng, 20)
    with pytest.raises(ValueError, match=r"y must have shape \(20,\)"):
        _fit(X, y[:-1])


# ---------------------------------------------------------------- predictions in buckets


def test_predictions_at_a_varying_number_of_points_compile_once(rng) -> None:
    """Test points padded to a bucket: m = 40..63 share one prediction program, and every
    mean and variance equals a float64 NumPy reference (padded rows dropped)."""
    X, y = _data(rng, 30)
    ls, amp, noise = 0.9, 1.3, 0.05
    post = GaussianProcess(amp * kernels.ExpSquared(ls), X, noise=noise).condition(y)

    def k(a, b):
        d2 = ((a[:, None, :] - b[None, :, :]) ** 2).sum(-1)
        return amp * np.exp(-0.5 * d2 / ls**2)

    K = k(X, X) + noise * np.eye(30)
    Xs_all = rng.uniform(-3.0, 3.0, (63, 2))
    post.mean_and_variance(Xs_all[:40])  # the bucket's program
    for m in (41, 50, 63):
        Xs = Xs_all[:m]
        out: list = []
        names = backend_compiles(lambda Xs=Xs, out=out: out.append(post.mean_and_variance(Xs)))
        assert not [n for n in names if "predict" in n], names
        mu, var = out[0]
        Ks = k(X, Xs)
        np.testing.assert_allclose(np.asarray(mu), Ks.T @ np.linalg.solve(K, y), rtol=1e-10)
        ref = amp - np.sum(Ks * np.linalg.solve(K, Ks), axis=0)
        np.testing.assert_allclose(np.asarray(var), ref, rtol=1e-8, atol=1e-12)
        assert mu.shape == var.shape == (m,)


# ------------------------------------------------------------------- eager calls


def _eager_models(rng, n):
    X, y = _data(rng, n)
    Z = X[:: max(1, n // 6)]
    return [
        (lambda p: GaussianProcess(p[0] * kernels.ExpSquared(p[1]), X, noise=p[2]), y),
        (lambda p: SparseGP(p[0] * kernels.ExpSquared(p[1]), X, inducing=Z, noise=p[2]), y),
    ]


@pytest.mark.slow_cases("sgpr")
@pytest.mark.parametrize("model", [0, 1], ids=["exact", "sgpr"])
def test_eager_likelihood_and_gradient_compile_once_per_structure(rng, model) -> None:
    """Called eagerly (no jit of the caller's), the likelihood and its gradient run as
    compiled programs of their own: a second call with new parameter values and new data
    of the same shapes compiles nothing, and gives the same numbers as the caller's jit."""
    first = [jnp.asarray(v) for v in (1.2, 0.8, 0.1)]
    build, y = _eager_models(rng, 24)[model]

    def loss(p, build=build, y=y):
        m = build(p)
        return m.log_marginal_likelihood(y) if model == 0 else m.elbo(y)

    loss(first)  # the structure's value program (and the data's placement)
    names = backend_compiles(lambda: jax.grad(loss)(first))
    if model == 1:
        # The first eager gradient compiles the model's own programs (its forward and its
        # transposed tangent), not one small program per operation of the backward pass.
        assert set(names) == {"jit(_bound_of)"}, names
    build, y = _eager_models(rng, 24)[model]  # new data, same shapes
    p = [jnp.asarray(v) for v in (0.7, 1.3, 0.05)]
    out: list = []
    names = backend_compiles(lambda: out.append((loss(p, build, y), jax.grad(loss)(p, build, y))))
    assert names == [], names
    value, grad = out[0]
    jv, jg = jax.jit(lambda q: (loss(q, build, y), jax.grad(loss)(q, build, y)))(p)
    np.testing.assert_allclose(float(value), float(jv), rtol=1e-12)
    np.testing.assert_allclose(np.stack(grad), np.stack(jg), rtol=1e-10)


def _linalg_calls(rng, n=24):
    import gpchol

    A = rng.standard_normal((n, n))
    S = jnp.asarray(A @ A.T + n * np.eye(n))
    L = jnp.linalg.cholesky(S)
    b = jnp.asarray(rng.standard_normal(n))
    mean = jnp.zeros(n)  # made here: an eager jnp.zeros in the call would compile a program
    return {
        "cholesky": (gpchol.cholesky, S),
        "cholesky-jitter": (lambda s: gpchol.cholesky(s, jitter=(0.0, 1e-6)), S),
        "cho_solve": (lambda f: gpchol.cho_solve(f, b), L),
        "solve_triangular": (lambda f: gpchol.solve_triangular(f, b, transpose=True), L),
        "logdet": (gpchol.logdet, L),
        "cho_inverse": (gpchol.cho_inverse, L),
        "mvn_logpdf": (lambda s: gpchol.mvn_logpdf(b, mean, s), S),
    }


@pytest.mark.parametrize(
    "name",
    ["cholesky", "cholesky-jitter", "cho_solve", "solve_triangular", "logdet", "cho_inverse",
     "mvn_logpdf"],
)  # fmt: skip
def test_eager_linear_algebra_runs_one_program(rng, name) -> None:
    """An eager call of a public linear-algebra function compiles one program, its first
    eager reverse-mode derivative one more (the transposed tangent), not one program per
    operation; the results are the jitted function's."""
    fn, x = _linalg_calls(rng)[name]
    out: list = []
    first = backend_compiles(lambda: out.append(fn(x)))
    assert len(first) == 1 and first[0].endswith("_program)"), first
    seed = np.ones(out[0].shape)
    grads: list = []
    names = backend_compiles(lambda: grads.append(jax.vjp(fn, x)[1](seed)[0]))
    assert len(names) <= 2 and set(names) == set(first), names
    x2 = x * 1.01  # new values, same shape: nothing compiled
    assert backend_compiles(lambda: jax.vjp(fn, x2)[1](seed)) == []
    ref_out, ref_vjp = jax.jit(lambda x: jax.vjp(fn, x))(x)
    np.testing.assert_allclose(out[0], ref_out, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(grads[0], ref_vjp(seed)[0], rtol=1e-10, atol=1e-12)


# ------------------------------------------------------------- padded training points


def _padded(X, y, size, rng):
    n = X.shape[0]
    Xp = np.concatenate([X, np.repeat(X[:1], size - n, axis=0)])
    yp = np.concatenate([y, rng.standard_normal(size - n)])  # anything on padded rows
    return Xp, yp, np.arange(size) < n


@pytest.mark.slow_cases("33-64-None", "40-64-1e-06")
@pytest.mark.parametrize("n, size, jitter", [(30, 32, None), (33, 64, None), (40, 64, 1e-6)])
def test_masked_posterior_equals_the_unpadded_one(rng, n, size, jitter) -> None:
    X, y = _data(rng, n)
    Xp, yp, mask = _padded(X, y, size, rng)
    k = 1.3 * kernels.Matern52(0.8)
    exact = GaussianProcess(k, X, noise=0.05, jitter=jitter)
    padded = GaussianProcess(k, Xp, noise=0.05, jitter=jitter, mask=mask)
    np.testing.assert_allclose(
        float(padded.log_marginal_likelihood(yp)),
        float(exact.log_marginal_likelihood(y)),
        rtol=1e-12,
    )
    a, b = exact.condition(y), padded.condition(yp)
    np.testing.assert_allclose(
        float(b.log_marginal_likelihood), float(a.log_marginal_likelihood), rtol=1e-12
    )
    Xs = rng.uniform(-3.0, 3.0, (17, 2))
    for f in ("mean", "variance", "covariance"):
        np.testing.assert_allclose(
            np.asarray(getattr(b, f)(Xs)),
            np.asarray(getattr(a, f)(Xs)),
            rtol=1e-9,
            atol=1e-12,
            err_msg=f,
        )
    da, db = exact.diagnostics(), padded.diagnostics()
    np.testing.assert_allclose(float(db.rcond), float(da.rcond), rtol=1e-10)
    assert bool(db.singular) == bool(da.singular)


@pytest.mark.slow
def test_masked_gradient_equals_the_unpadded_one(rng) -> None:
    X, y = _data(rng, 45)
    Xp, yp, mask = _padded(X, y, 64, rng)

    def lml(p, X, y, mask=None):
        k = p["amp"] * kernels.ExpSquared(p["ls"])
        return GaussianProcess(k, X, noise=p["noise"], mask=mask).log_marginal_likelihood(y)

    p = {"amp": jnp.asarray(1.2), "ls": jnp.asarray(0.9), "noise": jnp.asarray(0.07)}
    g0 = jax.grad(lml)(p, X, y)
    g1 = jax.jit(jax.grad(lml))(p, Xp, yp, mask)
    for key in p:
        np.testing.assert_allclose(float(g1[key]), float(g0[key]), rtol=1e-10)


def test_bad_mask_is_a_clear_error(rng) -> None:
    X, y = _data(rng, 10)
    k = kernels.ExpSquared()
    with pytest.raises(ValueError, match=r"mask must be None or a boolean array of shape \(10,\)"):
        GaussianProcess(k, X, noise=0.1, mask=np.ones(9, bool))
    with pytest.raises(ValueError, match="mask must be None or a boolean"):
        GaussianProcess(k, X, noise=0.1, mask=np.ones(10))
    with pytest.raises(ValueError, match="one jitter value, not a schedule"):
        GaussianProcess(k, X, noise=0.1, jitter=(1e-8, 1e-6), mask=np.ones(10, bool))
    post = GaussianProcess(k, X, noise=0.1, mask=np.arange(10) < 8).condition(y)
    with pytest.raises(ValueError, match="pass the test inputs Xs explicitly"):
        post.mean()


def test_masked_posterior_saves_and_loads(rng, tmp_path) -> None:
    import gpchol

    X, y = _data(rng, 20)
    Xp, yp, mask = _padded(X, y, 32, rng)
    post = GaussianProcess(kernels.ExpSquared(0.7), Xp, noise=0.1, mask=mask).condition(yp)
    gpchol.save(post, tmp_path / "post")
    back = gpchol.load(tmp_path / "post")
    np.testing.assert_array_equal(np.asarray(back.gp.mask), mask)
    Xs = rng.uniform(-3.0, 3.0, (5, 2))
    np.testing.assert_array_equal(np.asarray(back.variance(Xs)), np.asarray(post.variance(Xs)))


def test_estimator_folds_of_one_bucket_share_their_programs(rng) -> None:
    """gpchol.sklearn: fits of n = 40 and 45 points compile the step, the conditioning and
    the prediction once; the padded posterior's attributes are the unpadded ones."""
    pytest.importorskip("sklearn")
    from gpchol.sklearn import GaussianProcessRegressor

    X, y = _data(rng, 45)
    est = GaussianProcessRegressor(1.0 * kernels.ExpSquared(1.0), alpha=0.05, max_steps=30)
    est.fit(X[:40], y[:40]).predict(X[:7])
    out = []
    names = backend_compiles(lambda: out.append(est.fit(X, y).predict(X[:9])))
    assert names == [], names
    assert est.L_.shape == (45, 45) and est.alpha_.shape == (45,)
    ref = GaussianProcess(est.kernel_, X, noise=0.05).condition(y)
    with jax.enable_x64(True):
        np.testing.assert_allclose(est.L_, np.asarray(ref.L), rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(out[0], np.asarray(ref.mean(X[:9])), rtol=1e-10)


def test_cpu_only_process_traces_no_gpu_branch(rng) -> None:
    """On a machine whose only JAX platform is the CPU, the GP likelihood's program holds
    the CPU path alone (no platform switch: the GPU branch is not traced or compiled)."""
    from gpchol._internal import platform_module

    if not platform_module.cpu_only():
        pytest.skip("this process has a platform besides the CPU")
    X, y = _data(rng, 300)

    def loss(p):
        return -_build(X)(p).log_marginal_likelihood(y)

    text = str(jax.make_jaxpr(jax.value_and_grad(loss))(dict(P0)))
    assert "platform_index" not in text


_FRESH_ESTIMATOR = r"""
import json, sys
import jax
import numpy as np
from gpchol.sklearn import GaussianProcessRegressor
from sklearn.gaussian_process.kernels import RBF, ConstantKernel, WhiteKernel

names, stage = [], {"now": None}
def listen(event, secs, **kw):
    if event == "/jax/core/compile/backend_compile_duration":
        names.append((stage["now"], str(kw.get("fun_name"))))
jax.monitoring.register_event_duration_secs_listener(listen)
rng = np.random.default_rng(int(sys.argv[1]))
X = rng.standard_normal((70, 3))
y = np.sin(X[:, 0]) + 0.1 * rng.standard_normal(70)
kernel = ConstantKernel(1.0) * RBF(np.ones(3)) + WhiteKernel(0.1)
stage["now"] = "fit"
est = GaussianProcessRegressor(kernel, normalize_y=True, max_steps=40).fit(X[:60], y[:60])
stage["now"] = "predict"
est.predict(X[60:], return_std=True)
stage["now"] = "refit"
GaussianProcessRegressor(kernel, normalize_y=True, max_steps=40).fit(X[:58], y[:58])
print(json.dumps(names))
"""


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0])
def test_fresh_estimator_compiles_its_programs_alone(seed, tmp_path) -> None:
    """In a fresh process, an estimator's first fit compiles two programs (the value and
    gradient, the conditioning), ``predict(return_std=True)`` one (mean and variance), a
    refit of another n in the same bucket none: no eager operation on a new shape (the
    start's transforms, the data's transfer, the residual, the restarts' key, the
    diagnostics) compiles a program of its own."""
    import json
    import subprocess
    import sys

    pytest.importorskip("sklearn")
    script = tmp_path / "fresh.py"
    script.write_text(_FRESH_ESTIMATOR)
    out = subprocess.run(
        [sys.executable, str(script), str(seed)], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    names = [tuple(x) for x in json.loads(out.stdout.strip().splitlines()[-1])]
    assert names == [
        ("fit", "jit(flat_loss)"),
        ("fit", "jit(_condition_jit)"),
        ("predict", "jit(predict_program)"),
    ], names
