"""gpchol.sklearn.GaussianProcessRegressor against scikit-learn's own estimator.

Values are compared with scikit-learn's ``GaussianProcessRegressor`` on the same kernel
(``optimizer=None``: the same numbers, float64, to 1e-9), the fitted likelihood with
scikit-learn's optimum, and the estimator runs scikit-learn's ``check_estimator`` (a
quick subset by default; every check with ``GPCHOL_TEST_FULL=1``).
"""

from __future__ import annotations

import functools
import os
import warnings
from typing import Any

import jax
import numpy as np
import pytest

sklearn = pytest.importorskip("sklearn")

from sklearn.gaussian_process import GaussianProcessRegressor as SkGPR  # noqa: E402
from sklearn.gaussian_process import kernels as sk  # noqa: E402
from sklearn.model_selection import GridSearchCV, cross_val_score  # noqa: E402
from sklearn.pipeline import make_pipeline  # noqa: E402
from sklearn.preprocessing import StandardScaler  # noqa: E402
from sklearn.utils.estimator_checks import parametrize_with_checks  # noqa: E402

from gpchol import kernels  # noqa: E402
from gpchol.sklearn import GaussianProcessRegressor  # noqa: E402

FULL = os.environ.get("GPCHOL_TEST_FULL", "") not in ("", "0")


def data(rng: np.random.Generator, n: int = 25, d: int = 2) -> tuple[np.ndarray, np.ndarray]:
    X = rng.uniform(-2.0, 2.0, (n, d))
    y = np.sin(2.0 * X[:, 0]) + 0.5 * X[:, -1] ** 2 + 0.05 * rng.standard_normal(n) + 3.0
    return X, y


# (gpchol kernel, the same kernel in scikit-learn)
KERNELS = {
    "rbf-ard+white": (
        lambda: 1.7 * kernels.ExpSquared(lengthscale=np.array([0.8, 1.3])) + kernels.White(0.01),
        lambda: sk.ConstantKernel(1.7) * sk.RBF([0.8, 1.3]) + sk.WhiteKernel(0.01),
    ),
    "matern52*periodic+rq": (
        lambda: (
            0.9 * kernels.Matern52(lengthscale=1.1) * kernels.Periodic(0.7, 2.5)
            + 0.3 * kernels.RationalQuadratic(lengthscale=0.6, alpha=1.5)
        ),
        lambda: (
            sk.ConstantKernel(0.9) * sk.Matern(1.1, nu=2.5) * sk.ExpSineSquared(0.7, 2.5)
            + sk.ConstantKernel(0.3) * sk.RationalQuadratic(0.6, 1.5)
        ),
    ),
}


@pytest.mark.slow_cases("rbf-ard+white-False")
@pytest.mark.parametrize("normalize_y", [False, True])
@pytest.mark.parametrize("name", list(KERNELS))
def test_same_numbers_as_scikit_learn(
    name: str, normalize_y: bool, rng: np.random.Generator
) -> None:
    X, y = data(rng, d=1 if "periodic" in name else 2)
    Xs = rng.uniform(-2.5, 2.5, (7, X.shape[1]))
    alpha = rng.uniform(1e-3, 1e-2, X.shape[0])
    make_g, make_s = KERNELS[name]
    ours = GaussianProcessRegressor(
        make_g(), alpha=alpha, optimizer=None, normalize_y=normalize_y
    ).fit(X.astype(np.float32), y)  # float32 in: computed in float64 all the same
    X32 = X.astype(np.float32).astype(np.float64)
    ref = SkGPR(make_s(), alpha=alpha, optimizer=None, normalize_y=normalize_y).fit(X32, y)
    tol = {"rtol": 1e-9, "atol": 1e-9}
    np.testing.assert_allclose(
        ours.log_marginal_likelihood_value_, ref.log_marginal_likelihood_value_, **tol
    )
    m, s = ours.predict(Xs, return_std=True)
    m_ref, s_ref = ref.predict(Xs, return_std=True)
    np.testing.assert_allclose(m, m_ref, **tol)
    np.testing.assert_allclose(s, s_ref, **tol)
    _, c = ours.predict(Xs, return_cov=True)
    np.testing.assert_allclose(c, ref.predict(Xs, return_cov=True)[1], **tol)
    assert ours.predict(Xs).dtype == np.float64 and ours.n_features_in_ == X.shape[1]


def test_gradient_matches_scikit_learns(rng: np.random.Generator) -> None:
    X, y = data(rng)
    make_g, make_s = KERNELS["rbf-ard+white"]
    ours = GaussianProcessRegressor(make_g(), optimizer=None).fit(X, y)
    ref = SkGPR(make_s(), optimizer=None).fit(X, y)
    k = make_g()
    value, grad = ours.log_marginal_likelihood(k, eval_gradient=True)
    v_ref, g_ref = ref.log_marginal_likelihood(ref.kernel_.theta, eval_gradient=True)
    np.testing.assert_allclose(value, v_ref, rtol=1e-10)
    # scikit-learn differentiates in log space: d/dlog(t) = t d/dt, in its theta order
    ours_log = [
        1.7 * grad.kernel1.amplitude,
        *(np.array([0.8, 1.3]) * grad.kernel1.kernel.lengthscale),
        0.01 * grad.kernel2.variance,
    ]
    np.testing.assert_allclose(ours_log, g_ref, rtol=1e-7, atol=1e-9)


@pytest.mark.parametrize("optimizer", ["lbfgs", "fmin_l_bfgs_b"])
def test_fit_reaches_scikit_learns_optimum(optimizer: str, rng: np.random.Generator) -> None:
    X, y = data(rng, n=30)
    ours = GaussianProcessRegressor(
        1.0 * kernels.ExpSquared(lengthscale=np.ones(2)) + kernels.White(0.1),
        normalize_y=True,
        optimizer=optimizer,
    ).fit(X, y)
    ref = SkGPR(
        sk.ConstantKernel(1.0) * sk.RBF(np.ones(2)) + sk.WhiteKernel(0.1), normalize_y=True
    ).fit(X, y)
    assert ours.fit_result_ is not None and ours.fit_result_.success
    assert ours.log_marginal_likelihood_value_ >= ref.log_marginal_likelihood_value_ - 1e-3
    assert ours.score(X, y) > 0.9
    # the fitted kernel's likelihood is what the estimator reports
    np.testing.assert_allclose(
        ours.log_marginal_likelihood(ours.kernel_), ours.log_marginal_likelihood_value_
    )


def test_hyperparameter_names_without_x64_warn_nothing() -> None:
    # the names were read outside the estimator's float64 context: with x64 off (as a user
    # runs it) JAX warned that float64 is truncated to float32
    est = GaussianProcessRegressor(2.0 * kernels.Periodic() + kernels.White())
    with jax.enable_x64(False), warnings.catch_warnings():
        warnings.simplefilter("error")
        names = est.hyperparameter_names()
    assert names == ["kernel1.amplitude", "kernel1.kernel.lengthscale", "kernel1.kernel.period",
                     "kernel2.variance"]  # fmt: skip


def test_fixed_hyperparameters_stay_and_restarts_are_seeded(rng: np.random.Generator) -> None:
    X, y = data(rng, n=20, d=1)
    k = 1.0 * kernels.ExpSquared(0.5) * kernels.Periodic(1.0, 2.0) + kernels.White(0.1)
    est = GaussianProcessRegressor(k, fixed=("kernel1.kernel2.period",), max_steps=30)
    assert "kernel1.kernel2.period" in est.hyperparameter_names()
    a = est.set_params(n_restarts_optimizer=1, random_state=3).fit(X, y)
    assert float(a.kernel_.kernel1.kernel2.period) == 2.0
    assert float(a.kernel_.kernel1.kernel1.kernel.lengthscale) != 0.5
    with pytest.raises(ValueError, match="its hyperparameters are"):
        GaussianProcessRegressor(k, fixed=("nope",)).fit(X, y)


def test_default_kernel_is_scikit_learns(rng: np.random.Generator) -> None:
    X, y = data(rng, n=15)
    ours = GaussianProcessRegressor(alpha=1e-2, optimizer=None).fit(X, y)
    ref = SkGPR(alpha=1e-2, optimizer=None).fit(X, y)  # ConstantKernel(1.0) * RBF(1.0)
    assert ours.fit_result_ is None
    np.testing.assert_allclose(ours.predict(X), ref.predict(X), rtol=1e-9)
    assert ours.hyperparameter_names() == ["k1__constant_value", "k2__length_scale"]
    assert repr(ours.kernel_) == repr(ref.kernel_) and np.all(ours.kernel_.theta == 0.0)


def test_sample_y(rng: np.random.Generator) -> None:
    X, y = data(rng, n=12, d=1)
    est = GaussianProcessRegressor(kernels.Matern32(0.7), alpha=1e-4, optimizer=None).fit(X, y)
    Xs = np.linspace(-2.0, 2.0, 5)[:, None]
    s = est.sample_y(Xs, n_samples=4000, random_state=1)
    assert s.shape == (5, 4000)
    np.testing.assert_array_equal(s, est.sample_y(Xs, 4000, random_state=1))
    assert not np.array_equal(s, est.sample_y(Xs, 4000, random_state=2))
    mean, cov = est.predict(Xs, return_cov=True)
    se = np.sqrt(np.diag(cov) / 4000)
    assert np.all(np.abs(s.mean(axis=1) - mean) < 5 * se + 1e-12)


def test_in_pipelines_and_searches(rng: np.random.Generator) -> None:
    X, y = data(rng, n=24)
    pipe = make_pipeline(
        StandardScaler(), GaussianProcessRegressor(kernels.ExpSquared(1.0), optimizer=None)
    )
    scores = cross_val_score(pipe, X, y, cv=3)
    assert scores.shape == (3,) and np.all(np.isfinite(scores))
    search = GridSearchCV(
        GaussianProcessRegressor(kernels.ExpSquared(1.0), optimizer=None),
        {"alpha": [1e-4, 1e-1], "normalize_y": [False, True]},
        cv=2,
    ).fit(X, y)
    assert search.best_params_["alpha"] in (1e-4, 1e-1)


@pytest.mark.parametrize(
    "make, fit_args, error, words",
    [
        (lambda: GaussianProcessRegressor(), "nan", ValueError, ["Input X contains NaN"]),
        (lambda: GaussianProcessRegressor(), "inf", ValueError, ["infinity"]),
        (
            lambda: GaussianProcessRegressor(sk.PairwiseKernel()),
            "ok",
            TypeError,
            ["kernel", "PairwiseKernel", "no gpchol translation"],
        ),
        (lambda: GaussianProcessRegressor(object()), "ok", TypeError, ["kernel must be"]),
        (lambda: GaussianProcessRegressor(alpha=np.ones(3)), "ok", ValueError, ["alpha", "(10,)"]),
        (lambda: GaussianProcessRegressor(alpha=-1.0), "ok", ValueError, ["alpha", ">= 0"]),
        (lambda: GaussianProcessRegressor(optimizer="bfgs"), "ok", ValueError, ["'lbfgs'"]),
        (
            lambda: GaussianProcessRegressor(n_restarts_optimizer=-1),
            "ok",
            ValueError,
            ["n_restarts_optimizer"],
        ),
        (
            lambda: GaussianProcessRegressor(kernels.ExpSquared(1.0), alpha=0.0, optimizer=None),
            "dup",
            np.linalg.LinAlgError,
            ["not positive definite", "raise alpha"],
        ),
        (
            lambda: GaussianProcessRegressor(sk.Matern(nu=1.0)),
            "ok",
            ValueError,
            ["Matern", "nu=1.0", "0.5, 1.5, 2.5 or inf"],
        ),
        (
            lambda: GaussianProcessRegressor(
                sk.ConstantKernel() * sk.RBF(length_scale_bounds=(10.0, 1.0))
            ),
            "ok",
            ValueError,
            ["k2__length_scale_bounds", "lower <= upper", "[10.0, 1.0]"],
        ),
        (
            lambda: GaussianProcessRegressor(sk.WhiteKernel(noise_level_bounds=(-1.0, 1.0))),
            "ok",
            ValueError,
            ["noise_level_bounds", "0 <= lower"],
        ),
        (
            lambda: GaussianProcessRegressor(
                sk.RBF() + sk.WhiteKernel(noise_level_bounds=(0.0, 1.0)), n_restarts_optimizer=2
            ),
            "ok",
            ValueError,
            ["n_restarts_optimizer=2", "bounds are finite", "k2__noise_level"],
        ),
        (lambda: GaussianProcessRegressor(), "nan-y", ValueError, ["y", "NaN"]),
        (
            lambda: GaussianProcessRegressor(sk.RBF(), fixed=("length_scale",)),
            "ok",
            ValueError,
            ["fixed", '*_bounds="fixed"'],
        ),
        (lambda: GaussianProcessRegressor(n_targets=3), "ok", ValueError, ["n_targets=3"]),
        (
            lambda: GaussianProcessRegressor(optimizer=lambda f, t, bounds: None),
            "ok",
            TypeError,
            ["optimizer", "(theta_opt, func_min)"],
        ),
        (
            lambda: GaussianProcessRegressor(sk.DotProduct(), alpha=0.0),
            "ok",
            np.linalg.LinAlgError,
            ["DotProduct(sigma_0=1)", "not positive definite", "raise alpha"],
        ),
    ],
    ids=[
        "nan",
        "inf",
        "unknown-sklearn-kernel",
        "not-a-kernel",
        "alpha-shape",
        "alpha-negative",
        "optimizer",
        "restarts",
        "singular",
        "matern-nu",
        "bounds-lower-gt-upper",
        "bounds-negative",
        "restarts-infinite-bounds",
        "y-nan",
        "fixed-with-sklearn-kernel",
        "n-targets",
        "custom-optimizer-return",
        "singular-dot-product",
    ],
)
def test_bad_input_is_a_clear_error(
    make: Any, fit_args: str, error: type, words: list[str], rng: np.random.Generator
) -> None:
    X, y = data(rng, n=10)
    if fit_args == "nan":
        X[3, 1] = np.nan
    elif fit_args == "inf":
        X[0, 0] = np.inf
    elif fit_args == "dup":
        X = np.repeat(X[:5], 2, axis=0)
    elif fit_args == "nan-y":
        y[4] = np.nan
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(error) as info:
            make().fit(X, y)
    for w in words:
        assert w in str(info.value), str(info.value)


def test_predict_arguments(rng: np.random.Generator) -> None:
    X, y = data(rng, n=10)
    est = GaussianProcessRegressor(optimizer=None, alpha=1e-3)
    with pytest.raises(sklearn.exceptions.NotFittedError):
        est.log_marginal_likelihood()
    est.fit(X, y)
    with pytest.raises(RuntimeError, match="At most one"):
        est.predict(X, return_std=True, return_cov=True)
    with pytest.raises(ValueError, match="features"):
        est.predict(X[:, :1])


# ---------------------------------------------------------- scikit-learn kernels (issue 31)

SK_KERNELS = {
    "rbf": lambda d: sk.RBF(0.7),
    "rbf-ard": lambda d: sk.RBF(np.linspace(0.5, 2.0, d)),
    "matern0.5": lambda d: sk.Matern(0.8, nu=0.5),
    "matern1.5-ard": lambda d: sk.Matern(np.linspace(0.6, 1.4, d), nu=1.5),
    "matern2.5": lambda d: sk.Matern(1.3, nu=2.5),
    "matern-inf": lambda d: sk.Matern(1.2, nu=np.inf),
    "rq": lambda d: sk.RationalQuadratic(0.9, 2.5),
    "expsinesquared": lambda d: sk.ExpSineSquared(1.1, 2.3),
    "dotproduct": lambda d: sk.DotProduct(0.7),
    "white": lambda d: sk.WhiteKernel(0.3),
    "constant": lambda d: sk.ConstantKernel(2.3),
    "c*rbf+white": lambda d: sk.ConstantKernel(2.0) * sk.RBF(1.2) + sk.WhiteKernel(0.1),
    "(rbf+dot)**2": lambda d: (sk.RBF(1.5) + sk.DotProduct(1.0)) ** 2,
    "rq**1.7": lambda d: sk.Exponentiation(sk.RationalQuadratic(0.8, 0.6), 1.7),
    "fixed-bounds": lambda d: (
        sk.ConstantKernel(1.5, "fixed") * sk.Matern(0.9, "fixed", nu=1.5)
        + sk.WhiteKernel(0.2, (1e-3, 1.0))
    ),
}


@pytest.mark.slow_cases("expsinesquared-3")
@pytest.mark.parametrize("d", [1, 3])
@pytest.mark.parametrize("name", list(SK_KERNELS))
def test_sklearn_kernels_translate_to_the_same_values(
    name: str, d: int, rng: np.random.Generator
) -> None:
    """Every scikit-learn kernel the estimator takes has the same covariance as its gpchol
    translation (float64, to 1e-12), and the same theta and bounds."""
    import jax

    k = SK_KERNELS[name](d)
    X, Y = rng.normal(size=(9, d)), rng.normal(size=(6, d))
    y = rng.normal(size=9)
    # alpha=1: ExpSineSquared on several columns (a function of the Euclidean distance) is
    # not positive semi-definite in general
    est = GaussianProcessRegressor(k, alpha=1.0, optimizer=None).fit(X, y)
    assert repr(est.kernel_) == repr(k) and np.array_equal(est.kernel_.theta, k.theta)
    g = est.posterior_.gp.kernel  # the gpchol kernel behind kernel_
    with jax.enable_x64(True):
        for ours, ref in [(g(X), k(X)), (g(X, Y), k(X, Y)), (g.diag(X), k.diag(X))]:
            assert np.asarray(ours).dtype == np.float64
            np.testing.assert_allclose(np.asarray(ours), ref, rtol=1e-12, atol=1e-12)
    # at another theta (log space; scikit-learn's hyperparameter order)
    theta = k.theta + rng.uniform(-0.3, 0.3, k.theta.shape)
    ref = SkGPR(k, alpha=1.0, optimizer=None).fit(X, y)
    v, grad = est.log_marginal_likelihood(theta, eval_gradient=True)
    v_ref, grad_ref = ref.log_marginal_likelihood(theta, eval_gradient=True)
    np.testing.assert_allclose(v, v_ref, rtol=1e-11)
    np.testing.assert_allclose(grad, grad_ref, rtol=1e-8, atol=1e-10)


def _outputs(out: Any) -> tuple[np.ndarray, ...]:
    return out if isinstance(out, tuple) else (out,)


@pytest.mark.slow_cases("False")
@pytest.mark.parametrize("normalize_y", [False, True])
def test_sklearn_kernel_same_numbers_as_scikit_learn(
    normalize_y: bool, rng: np.random.Generator
) -> None:
    X, y = data(rng, n=20)
    Y = np.c_[y, np.cos(X[:, 0]) * 4.0 - 1.0]
    Xs = rng.uniform(-2.5, 2.5, (6, 2))
    kernel = sk.ConstantKernel(1.7) * sk.Matern([0.8, 1.3], nu=2.5) + sk.WhiteKernel(0.01)
    for target in (y, Y):
        ours = GaussianProcessRegressor(kernel, optimizer=None, normalize_y=normalize_y)
        ref = SkGPR(kernel, optimizer=None, normalize_y=normalize_y)
        ours.fit(X, target)
        ref.fit(X, target)
        tol = {"rtol": 1e-9, "atol": 1e-9}
        np.testing.assert_allclose(
            ours.log_marginal_likelihood_value_, ref.log_marginal_likelihood_value_, **tol
        )
        for kw in ({}, {"return_std": True}, {"return_cov": True}):
            for a, b in zip(
                _outputs(ours.predict(Xs, **kw)), _outputs(ref.predict(Xs, **kw)), strict=True
            ):
                assert a.shape == b.shape
                np.testing.assert_allclose(a, b, **tol)
        np.testing.assert_allclose(ours.alpha_, ref.alpha_, **tol)
        assert ours.sample_y(Xs, 3).shape == ref.sample_y(Xs, 3).shape
        # theta in log space, value and gradient, as scikit-learn's
        theta = kernel.theta + 0.3
        v, g = ours.log_marginal_likelihood(theta, eval_gradient=True)
        v_ref, g_ref = ref.log_marginal_likelihood(theta, eval_gradient=True)
        np.testing.assert_allclose(v, v_ref, rtol=1e-10)
        np.testing.assert_allclose(g, g_ref, rtol=1e-7, atol=1e-9)
        assert ours.log_marginal_likelihood(theta) == pytest.approx(v, rel=1e-12)
        assert ours.kernel_.theta == pytest.approx(kernel.theta)  # clone_kernel=True
    ours.log_marginal_likelihood(theta, clone_kernel=False)
    np.testing.assert_allclose(ours.kernel_.theta, theta)


@pytest.mark.parametrize("optimizer", ["lbfgs", "fmin_l_bfgs_b", "custom"])
def test_sklearn_kernel_fit_reaches_scikit_learns_optimum(
    optimizer: str, rng: np.random.Generator
) -> None:
    from scipy.optimize import minimize

    def custom(obj_func: Any, initial_theta: np.ndarray, bounds: np.ndarray) -> Any:
        res = minimize(obj_func, initial_theta, jac=True, method="L-BFGS-B", bounds=bounds)
        return res.x, res.fun

    X, y = data(rng, n=30)
    kernel = sk.ConstantKernel(1.0, (1e-2, 1e2)) * sk.RBF([1.0, 1.0], (1e-2, 1e2)) + (
        sk.WhiteKernel(0.1, (1e-4, 1.0))
    )
    ours = GaussianProcessRegressor(
        kernel, normalize_y=True, optimizer=custom if optimizer == "custom" else optimizer
    ).fit(X, y)
    ref = SkGPR(kernel, normalize_y=True).fit(X, y)
    assert type(ours.kernel_) is type(ref.kernel_) and ours.kernel_ is not kernel
    assert ours.log_marginal_likelihood_value_ >= ref.log_marginal_likelihood_value_ - 1e-6
    np.testing.assert_allclose(ours.kernel_.theta, ref.kernel_.theta, atol=1e-3)
    assert np.all(ours.kernel_.bounds[:, 0] <= ours.kernel_.theta)
    assert np.all(ours.kernel_.theta <= ours.kernel_.bounds[:, 1])
    assert "**2 * RBF(length_scale=[" in repr(ours.kernel_)
    assert ours.kernel_.get_params()["k2__noise_level_bounds"] == (1e-4, 1.0)
    np.testing.assert_allclose(
        ours.log_marginal_likelihood(ours.kernel_.theta),
        ours.log_marginal_likelihood_value_,
        rtol=1e-10,
    )


def test_custom_optimizer_with_a_gpchol_kernel(rng: np.random.Generator) -> None:
    """The callable's theta for a gpchol kernel: its free leaves, unconstrained (log)."""
    from scipy.optimize import minimize

    seen = {}

    def custom(obj_func: Any, initial_theta: np.ndarray, bounds: np.ndarray) -> Any:
        seen["theta0"], seen["bounds"] = initial_theta, bounds
        res = minimize(obj_func, initial_theta, jac=True, method="L-BFGS-B")
        return res.x, res.fun

    X, y = data(rng, n=25)
    k = 1.0 * kernels.ExpSquared(lengthscale=np.ones(2)) + kernels.White(0.1)
    ours = GaussianProcessRegressor(k, normalize_y=True, optimizer=custom).fit(X, y)
    ref = GaussianProcessRegressor(k, normalize_y=True, optimizer="fmin_l_bfgs_b").fit(X, y)
    np.testing.assert_allclose(seen["theta0"], [0.0, 0.0, 0.0, np.log(0.1)], atol=1e-12)
    assert np.all(np.isinf(seen["bounds"]))
    np.testing.assert_allclose(
        ours.log_marginal_likelihood_value_, ref.log_marginal_likelihood_value_, rtol=1e-8
    )


def test_fixed_bounds_and_restarts_with_sklearn_kernels(rng: np.random.Generator) -> None:
    X, y = data(rng, n=20, d=1)
    kernel = sk.ConstantKernel(2.0, "fixed") * sk.ExpSineSquared(
        0.7, 2.5, periodicity_bounds="fixed"
    ) + sk.WhiteKernel(0.1, (1e-3, 1.0))
    lmls = []
    for restarts in range(3):
        est = GaussianProcessRegressor(
            kernel, n_restarts_optimizer=restarts, random_state=0, max_steps=100
        ).fit(X, y)
        params = est.kernel_.get_params()
        assert params["k1__k1__constant_value"] == 2.0 and params["k1__k2__periodicity"] == 2.5
        assert est.kernel_.theta.shape == (2,) and est.kernel_.theta[0] != np.log(0.7)
        lmls.append(est.log_marginal_likelihood_value_)
    assert lmls[2] >= lmls[1] - 1e-9 and lmls[1] >= lmls[0] - 1e-9


@pytest.mark.slow
def test_multi_target_shares_one_kernel(rng: np.random.Generator) -> None:
    X, y = data(rng, n=18)
    Y = np.c_[y, 2.0 * y, -y + 1.0]
    kernel = sk.ConstantKernel(1.0) * sk.RBF(1.0) + sk.WhiteKernel(0.1)
    one = GaussianProcessRegressor(kernel, optimizer=None).fit(X, y)
    many = GaussianProcessRegressor(kernel, optimizer=None).fit(X, Y)
    Xs = rng.uniform(-2.0, 2.0, (5, 2))
    m1, s1 = one.predict(Xs, return_std=True)
    m, s = many.predict(Xs, return_std=True)
    assert m.shape == s.shape == (5, 3) and many.predict(Xs, return_cov=True)[1].shape == (5, 5, 3)
    for j in range(3):
        single = GaussianProcessRegressor(kernel, optimizer=None).fit(X, Y[:, j])
        np.testing.assert_allclose(m[:, j], single.predict(Xs), rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(s[:, j], s1, rtol=1e-12)
    np.testing.assert_allclose(m[:, 1], 2.0 * m1, rtol=1e-10)
    samples = many.sample_y(Xs, 4)
    assert samples.shape == (5, 3, 4)
    np.testing.assert_allclose(samples[:, 0, :], one.sample_y(Xs, 4), rtol=1e-9, atol=1e-12)
    single = GaussianProcessRegressor(kernel, optimizer=None)
    lml = sum(single.fit(X, Y[:, j]).log_marginal_likelihood_value_ for j in range(3))
    np.testing.assert_allclose(many.log_marginal_likelihood_value_, lml, rtol=1e-10)
    fitted = GaussianProcessRegressor(kernel, optimizer="fmin_l_bfgs_b").fit(X, Y)
    ref = SkGPR(kernel).fit(X, Y)
    assert fitted.log_marginal_likelihood_value_ >= ref.log_marginal_likelihood_value_ - 1e-6


def test_prior_before_fit_is_scikit_learns(rng: np.random.Generator) -> None:
    X = rng.normal(size=(6, 2))
    kernel = sk.ConstantKernel(2.0) * sk.Matern(0.7, nu=0.5)
    for n_targets in (None, 3):
        ours = GaussianProcessRegressor(kernel, n_targets=n_targets)
        ref = SkGPR(kernel, n_targets=n_targets)
        for kw in ({"return_std": True}, {"return_cov": True}):
            for a, b in zip(ours.predict(X, **kw), ref.predict(X, **kw), strict=True):
                assert a.shape == b.shape
                np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
        assert ours.sample_y(X, 2).shape == ref.sample_y(X, 2).shape


def test_sklearn_theta_of_the_wrong_length(rng: np.random.Generator) -> None:
    X, y = data(rng, n=10)
    est = GaussianProcessRegressor(sk.RBF([1.0, 2.0]), optimizer=None).fit(X, y)
    with pytest.raises(ValueError, match=r"theta must have shape \(2,\).*got shape \(3,\)"):
        est.log_marginal_likelihood(np.zeros(3))
    with pytest.raises(ValueError, match="eval_gradient=True needs theta"):
        est.log_marginal_likelihood(eval_gradient=True)
    with pytest.raises(TypeError, match="scikit-learn kernel"):
        est.log_marginal_likelihood(kernels.ExpSquared(1.0))
    g = GaussianProcessRegressor(kernels.ExpSquared(1.0), optimizer=None).fit(X, y)
    with pytest.raises(TypeError, match="gpchol kernel"):
        g.log_marginal_likelihood(np.zeros(1))


def test_unfactorable_theta_is_minus_inf_as_scikit_learns(rng: np.random.Generator) -> None:
    """Where the covariance cannot be factored the log marginal likelihood is -inf with a
    zero gradient (scikit-learn's), in the public method and in the ``obj_func`` a callable
    optimizer gets, so an argmin over a grid steps away from it (it picked the NaN)."""
    X = rng.uniform(0, 3, (40, 1))
    y = 0.5 * X[:, 0] + 0.1 * rng.standard_normal(40)
    kernel = sk.DotProduct(1.0, "fixed") + sk.WhiteKernel(0.1, (1e-300, 10.0))
    tiny = np.array([np.log(1e-300)])
    for cls in (SkGPR, GaussianProcessRegressor):
        est = cls(kernel, alpha=0.0, optimizer=None).fit(X, y)
        value, grad = est.log_marginal_likelihood(tiny, eval_gradient=True)
        assert value == -np.inf and np.array_equal(grad, [0.0]), (cls, value, grad)
        assert est.log_marginal_likelihood(tiny) == -np.inf

    def grid(obj_func: Any, initial_theta: Any, bounds: Any) -> Any:
        thetas = [np.array([t]) for t in np.linspace(np.log(1e-300), 0.0, 7)]
        values = [obj_func(t, eval_gradient=False) for t in thetas]
        assert values[0] == np.inf
        best = int(np.argmin(values))
        return thetas[best], values[best]

    fits = [
        cls(kernel, alpha=0.0, optimizer=grid).fit(X, y)
        for cls in (SkGPR, GaussianProcessRegressor)
    ]
    assert fits[1].kernel_.k2.noise_level == pytest.approx(fits[0].kernel_.k2.noise_level)
    noisy = kernels.Linear(1.0) + kernels.White(0.1)
    g = GaussianProcessRegressor(noisy, alpha=0.0, optimizer=None).fit(X[:3], y[:3])
    rank_one = kernels.Linear(1.0) + kernels.White(0.0)  # three points
    value, grad = g.log_marginal_likelihood(rank_one, eval_gradient=True)
    assert value == -np.inf and grad.kernel2.variance == 0.0
    assert g.log_marginal_likelihood(rank_one) == -np.inf


def test_callable_optimizer_called_as_scikit_learn_calls_it(rng: np.random.Generator) -> None:
    """``optimizer(obj_func, initial_theta, bounds=bounds)``: an optimizer with ``bounds``
    keyword-only works; ``obj_func`` checks the length of ``theta``."""
    from scipy.optimize import minimize

    def optimizer(obj_func: Any, initial_theta: Any, *, bounds: Any) -> Any:
        r = minimize(obj_func, initial_theta, jac=True, method="L-BFGS-B", bounds=bounds)
        return r.x, r.fun

    X, y = data(rng, n=20)
    kernel = sk.ConstantKernel() * sk.RBF()
    ours = GaussianProcessRegressor(kernel, optimizer=optimizer).fit(X, y)
    ref = SkGPR(kernel, optimizer=optimizer).fit(X, y)
    np.testing.assert_allclose(ours.kernel_.theta, ref.kernel_.theta, rtol=1e-4, atol=1e-5)

    def too_long(obj_func: Any, initial_theta: Any, bounds: Any) -> Any:
        return initial_theta, obj_func(np.r_[initial_theta, 0.0], eval_gradient=False)

    with pytest.raises(ValueError, match=r"theta must have shape \(2,\).*got shape \(3,\)"):
        GaussianProcessRegressor(kernel, optimizer=too_long).fit(X, y)


def test_more_bad_arguments_are_clear_errors(rng: np.random.Generator) -> None:
    X, y = data(rng, n=10)
    with pytest.raises(ValueError, match=r"length_scale has 1 value.*isotropic"):
        GaussianProcessRegressor(sk.RationalQuadratic(length_scale=[1.0, 2.0])).fit(X, y)
    with pytest.raises(ValueError, match="n_targets"):
        GaussianProcessRegressor(n_targets=0).predict(X)
    kernel = 1.0 * kernels.ExpSquared(1.0) + kernels.White(0.1)
    with pytest.raises(TypeError, match=r"fixed must be a list.*\['kernel2.variance'\]"):
        GaussianProcessRegressor(kernel, fixed="kernel2.variance").fit(X, y)


# ------------------------------------------------------------------ check_estimator

QUICK = {
    "check_estimators_dtypes",
    "check_estimators_nan_inf",
    "check_estimators_pickle",
    "check_estimators_overwrite_params",
    "check_dont_overwrite_parameters",
    "check_fit_idempotent",
    "check_n_features_in_after_fitting",
    "check_supervised_y_2d",
    "check_regressors_train",
    "check_methods_subset_invariance",
    "check_get_params_invariance",
    "check_set_params",
    "check_estimator_cloneable",
    "check_fit2d_1sample",
    "check_regressor_multioutput",
}
"""The checks run by default, on ``optimizer=None`` (each a second or two);
``GPCHOL_TEST_FULL=1`` runs all of them on the default estimator (L-BFGS in every fit).

No check is expected to fail. scikit-learn skips two by itself here: the array-API check
(needs ``SCIPY_ARRAY_API=1``) and the pandas check (pandas is not installed); the estimator
declares ``multi_output=True`` (``y`` of shape ``(n, t)``: one kernel shared by the
targets) and ``requires_fit=False`` (predictions from the prior before ``fit``), as
scikit-learn's estimator does.
"""


def _name(check: Any) -> str:
    return check.func.__name__ if isinstance(check, functools.partial) else check.__name__


@parametrize_with_checks([GaussianProcessRegressor(optimizer=None), GaussianProcessRegressor()])
def test_scikit_learn_checks(estimator: Any, check: Any) -> None:
    if not FULL and (estimator.optimizer is not None or _name(check) not in QUICK):
        pytest.skip("outside the quick set: run with GPCHOL_TEST_FULL=1")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", category=UserWarning)
        check(estimator)
