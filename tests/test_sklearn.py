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
    assert ours.hyperparameter_names() == ["amplitude", "kernel.lengthscale"]


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
        (lambda: GaussianProcessRegressor(sk.RBF()), "ok", TypeError, ["gpchol kernel"]),
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
    ],
    ids=[
        "nan",
        "inf",
        "sklearn-kernel",
        "alpha-shape",
        "alpha-negative",
        "optimizer",
        "restarts",
        "singular",
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
        est.predict(X)
    est.fit(X, y)
    with pytest.raises(RuntimeError, match="At most one"):
        est.predict(X, return_std=True, return_cov=True)
    with pytest.raises(ValueError, match="features"):
        est.predict(X[:, :1])


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
}
"""The checks run by default, on ``optimizer=None`` (each a second or two);
``GPCHOL_TEST_FULL=1`` runs all of them on the default estimator (L-BFGS in every fit).

No check is expected to fail. scikit-learn skips two by itself here: the array-API check
(needs ``SCIPY_ARRAY_API=1``) and the pandas check (pandas is not installed); the estimator
declares ``multi_output=False`` (one target), so the multi-output checks do not apply.
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
