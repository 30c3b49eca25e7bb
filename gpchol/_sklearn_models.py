r"""The hyperparameter spaces and optimisers behind :mod:`gpchol.sklearn`.

A :class:`Space` is what the estimator optimises: a flat float64 vector ``x`` (``(k,)``),
its start, its box bounds (``(k, 2)``, infinite where unbounded) and a traceable map from
``x`` to a gpchol kernel. Two kinds:

* :class:`SklearnSpace`, for a scikit-learn kernel: ``x`` is scikit-learn's ``theta``
  (log-values of the hyperparameters that are not ``"fixed"``), with the log of the
  kernel's ``*_bounds``;
* :class:`GpcholSpace`, for a gpchol kernel: ``x`` is the free leaves in unconstrained
  space (the positive ones on the log scale), unbounded.

Three ways to optimise a space (:func:`optimize`):

* ``"lbfgs"`` / ``"adam"``: :func:`gpchol.fit`, one compiled step, keyed by structure
  (the bounds become transforms: :class:`gpchol.Bounded` for two finite ends, a shifted
  softplus for one);
* ``"fmin_l_bfgs_b"``: SciPy's L-BFGS-B with the box bounds, on a compiled value and
  gradient;
* a callable ``optimizer(obj_func, initial_x, bounds) -> (x, f)`` with scikit-learn's
  contract: ``obj_func(x, eval_gradient=True)`` returns the negative log marginal
  likelihood and its gradient (only the value with ``eval_gradient=False``).

Extra starts (``restarts``): for a scikit-learn kernel, uniform draws inside the bounds
(which must then be finite); for a gpchol kernel, the start plus ``N(0, 1)`` in
unconstrained space.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from gpchol import (
    Bounded,
    GaussianProcess,
    Positive,
    Transform,
    fit,
    to_constrained,
    to_unconstrained,
)
from gpchol._base.transforms import Below, LogPositive
from gpchol._fit.state import better_start
from gpchol._sklearn_kernels import Node, Translation, build

__all__ = [
    "GpcholSpace",
    "Objective",
    "SklearnSpace",
    "Space",
    "log_marginal_likelihood",
    "optimize",
]


# ------------------------------------------------------------------------ likelihood


def log_marginal_likelihood(kernel: Any, X: Any, Y: Any, noise: Any) -> Any:
    """The log marginal likelihood of the ``t`` columns of ``Y`` (``(n, t)``), summed: one
    GP, its hyperparameters shared by every target (scikit-learn's multi-target model).
    NumPy or JAX arrays (NumPy ones: no eager JAX operation that depends on ``n``)."""
    gp = GaussianProcess(kernel, X, noise=noise)
    if Y.shape[1] == 1:
        return gp.log_marginal_likelihood(Y[:, 0])
    return jnp.sum(jax.vmap(gp.log_marginal_likelihood, in_axes=1)(Y))


@partial(jax.jit, static_argnames=("node", "gradient"))
def _theta_objective(
    theta: jax.Array,
    values: jax.Array,
    free: jax.Array,
    X: jax.Array,
    Y: jax.Array,
    noise: jax.Array,
    *,
    node: Node,
    gradient: bool,
) -> Any:
    """``-lml`` at a scikit-learn ``theta`` (and its gradient); compiled once per kernel
    structure and shapes, whatever the estimator or the values."""

    def loss(th: jax.Array) -> jax.Array:
        kernel = build(node, values.at[free].set(jnp.exp(th)))
        return -log_marginal_likelihood(kernel, X, Y, noise)

    return jax.value_and_grad(loss)(theta) if gradient else (loss(theta), None)


class Objective:
    """``-lml`` of a flat vector with scikit-learn's ``obj_func(theta, eval_gradient)``
    contract: ``(value, gradient)`` as a float and a ``(k,)`` float64 array, or the value
    alone with ``eval_gradient=False``. Runs in float64 (inside :func:`jax.enable_x64`).

    Where the covariance cannot be factored (a non-finite value) the value is ``+inf``
    with a zero gradient, as scikit-learn's (never NaN: an optimizer's comparisons, and
    ``argmin`` over a grid, then step away from it)."""

    def __init__(self, fn: Callable[[jax.Array, bool], Any], size: int) -> None:
        self._fn = fn
        self.size = size
        self.calls = 0

    def __call__(self, x: Any, eval_gradient: bool = True) -> Any:
        th = np.asarray(x, np.float64)
        if th.shape != (self.size,):
            raise ValueError(
                f"theta must have shape ({self.size},), one log-value per free "
                f"hyperparameter; got shape {th.shape}"
            )
        self.calls += 1
        with jax.enable_x64(True):
            value, grad = self._fn(jnp.asarray(th), bool(eval_gradient))
            value = float(value)
            if not math.isfinite(value):
                value, grad = math.inf, np.zeros(self.size)
            if not eval_gradient:
                return value
            return value, np.asarray(grad, np.float64)


# ---------------------------------------------------------------------------- spaces


class Space:
    """A flat hyperparameter vector: start ``x0`` ``(k,)``, ``bounds`` ``(k, 2)``."""

    x0: np.ndarray
    bounds: np.ndarray

    def kernel(self, x: Any) -> Any:  # pragma: no cover - abstract
        """The gpchol kernel at ``x`` (traceable)."""
        raise NotImplementedError

    def start_kernel(self) -> Any:  # pragma: no cover - abstract
        """The gpchol kernel at the given values (exactly, not through ``x0``)."""
        raise NotImplementedError

    def objective(self, X: Any, Y: Any, noise: Any) -> Objective:
        """``-lml(kernel(x))`` on the data (``(n, d)``, ``(n, t)``, ``()`` or ``(n,)``;
        NumPy or JAX), compiled (call under ``jax.enable_x64``)."""
        raise NotImplementedError  # pragma: no cover - abstract

    def starts(self, restarts: int, rng: np.random.RandomState) -> list[np.ndarray]:
        """``x0`` and ``restarts`` more starts."""
        raise NotImplementedError  # pragma: no cover - abstract


@dataclasses.dataclass
class SklearnSpace(Space):
    """scikit-learn's ``theta`` of a translated kernel (:class:`Translation`)."""

    translation: Translation

    def __post_init__(self) -> None:
        self.x0 = self.translation.theta
        self.bounds = self.translation.bounds

    def kernel(self, x: Any) -> Any:
        return self.translation.gpchol_kernel(x)

    def start_kernel(self) -> Any:
        return self.translation.gpchol_kernel()

    def objective(self, X: Any, Y: Any, noise: Any) -> Objective:
        t = self.translation
        fn = partial(
            _theta_objective,
            values=jnp.asarray(t.values),
            free=jnp.asarray(t.free),
            X=X,
            Y=Y,
            noise=noise,
            node=t.node,
        )
        return Objective(lambda x, g: fn(x, gradient=g), self.x0.size)

    def starts(self, restarts: int, rng: np.random.RandomState) -> list[np.ndarray]:
        if restarts and not np.all(np.isfinite(self.bounds)):
            finite = np.isfinite(self.bounds).all(axis=1)
            names = sorted(
                {n for n, ok in zip(self.translation.names, finite, strict=True) if not ok}
            )
            raise ValueError(
                f"n_restarts_optimizer={restarts} draws its starts uniformly between the "
                f"bounds, and so requires that all bounds are finite; {names} have an "
                "infinite (or zero) bound"
            )
        return [self.x0] + [
            rng.uniform(self.bounds[:, 0], self.bounds[:, 1]) for _ in range(restarts)
        ]

    def transforms(self) -> tuple[np.ndarray, list[Transform | None]]:
        """The entries :func:`gpchol.fit` moves (those with lower < upper) and a transform
        per entry onto its interval (``None``: unbounded)."""
        lo, hi = self.bounds[:, 0], self.bounds[:, 1]
        moved = np.flatnonzero(lo < hi)
        out: list[Transform | None] = []
        for i in moved:
            a, b = float(lo[i]), float(hi[i])
            if np.isfinite(a) and np.isfinite(b):
                out.append(Bounded(a, b))
            elif np.isfinite(a):
                out.append(Positive(lower=a))
            elif np.isfinite(b):
                out.append(Below(b))
            else:
                out.append(None)
        return moved, out

    def inside(self, x: np.ndarray) -> np.ndarray:
        """``x`` moved strictly inside its (open) bounds, for a transform's inverse: by
        ``1e-6`` of the interval's width, or ``1e-6 * max(1, |end|)`` for a half-line."""
        lo, hi = self.bounds[:, 0], self.bounds[:, 1]
        width = np.where(
            np.isfinite(hi - lo),
            hi - lo,
            np.maximum(1.0, np.abs(np.where(np.isfinite(lo), lo, hi))),
        )
        step = 1e-6 * width
        x = np.where(np.isfinite(lo), np.maximum(x, lo + step), x)
        x = np.where(np.isfinite(hi), np.minimum(x, hi - step), x)
        return np.where(lo < hi, x, lo)


def _is_transform(x: Any) -> bool:
    return x is None or isinstance(x, Transform)


def _log_scale(t: Any) -> Any:
    """A positive parameter (``Positive()``) is optimised on the log scale, as scikit-learn
    does: amplitudes in the thousands next to lengthscales of 0.1 are far better
    conditioned for L-BFGS in ``log`` than through softplus (linear for large values)."""
    return LogPositive() if t == Positive() else t


class GpcholSpace(Space):
    """A gpchol kernel's leaves by path (``jax.tree_util.keystr``), free or fixed, with
    transforms; ``x`` is the free ones in unconstrained space, raveled."""

    def __init__(self, kernel: Any, fixed: Sequence[str]) -> None:
        flat, self.treedef = jax.tree_util.tree_flatten_with_path(kernel)
        self.paths = [jax.tree_util.keystr(p) for p, _ in flat]
        self.leaves = [leaf for _, leaf in flat]
        wanted = {f if f.startswith((".", "[")) else "." + f for f in fixed}
        unknown = sorted(wanted - set(self.paths))
        if unknown:
            raise ValueError(
                f"fixed names {unknown}, which the kernel does not have; its hyperparameters "
                f"are {self.paths}"
            )
        self.free = [i for i, p in enumerate(self.paths) if p not in wanted]
        tflat, _ = jax.tree_util.tree_flatten_with_path(
            kernel.default_transforms(), is_leaf=_is_transform
        )
        by_path = [(jax.tree_util.keystr(p), t) for p, t in tflat]

        def transform(path: str) -> Any:
            # the transform at the longest path that is a prefix of the leaf's path
            best = None
            for tp, t in by_path:
                if path.startswith(tp) and (best is None or len(tp) > len(best[0])):
                    best = (tp, t)
            return None if best is None else best[1]

        self.transforms = {self.paths[i]: _log_scale(transform(self.paths[i])) for i in self.free}
        u = to_unconstrained(self.initial(), self.transforms)
        self._sizes = [int(np.size(u[self.paths[i]])) for i in self.free]
        self._shapes = [np.shape(u[self.paths[i]]) for i in self.free]
        self.x0 = (
            np.concatenate([np.ravel(np.asarray(u[self.paths[i]], np.float64)) for i in self.free])
            if self.free
            else np.zeros(0)
        )
        self.bounds = np.tile([-np.inf, np.inf], (self.x0.size, 1))

    def initial(self) -> dict[str, jax.Array]:
        """The free leaves by path (constrained), float64 JAX arrays."""
        return {self.paths[i]: jnp.asarray(self.leaves[i], jnp.float64) for i in self.free}

    def with_params(self, params: dict[str, Any]) -> Any:
        """The kernel with the free leaves replaced (constrained values by path)."""
        leaves = list(self.leaves)
        for i in self.free:
            leaves[i] = params[self.paths[i]]
        return jax.tree_util.tree_unflatten(self.treedef, leaves)

    def params(self, x: Any) -> dict[str, Any]:
        """The constrained free leaves by path at a flat unconstrained ``x``."""
        xp = jnp if isinstance(x, jax.Array) else np
        parts, start = {}, 0
        for i, size, shape in zip(self.free, self._sizes, self._shapes, strict=True):
            parts[self.paths[i]] = xp.reshape(x[start : start + size], shape)
            start += size
        return to_constrained(parts, self.transforms)

    def kernel(self, x: Any) -> Any:
        return self.with_params(self.params(x))

    def start_kernel(self) -> Any:
        return self.with_params(self.initial())

    def objective(self, X: Any, Y: Any, noise: Any) -> Objective:
        def loss(x: jax.Array) -> jax.Array:
            return -log_marginal_likelihood(self.kernel(x), X, Y, noise)

        vg, v = jax.jit(jax.value_and_grad(loss)), jax.jit(loss)
        return Objective(lambda x, g: vg(x) if g else (v(x), None), self.x0.size)

    def starts(self, restarts: int, rng: np.random.RandomState) -> list[np.ndarray]:
        return [self.x0] + [self.x0 + rng.standard_normal(self.x0.shape) for _ in range(restarts)]


# ------------------------------------------------------------------------ optimisers


@dataclasses.dataclass
class Optimum:
    """The best start: ``x`` ``(k,)``, its ``-lml`` ``fun``, every start's final ``-lml``
    (``restart_losses``) and the optimiser's own result of that start (``result``)."""

    x: np.ndarray
    fun: float
    restart_losses: list[float]
    result: Any
    kernel: Any


def optimize(
    space: Space,
    X: np.ndarray,
    Y: np.ndarray,
    noise: np.ndarray,
    *,
    method: Any,
    restarts: int,
    rng: np.random.RandomState,
    max_steps: int,
) -> Optimum:
    """Minimises ``-lml`` over ``space`` from each start; the lowest final value wins.

    Args:
        space: the :class:`Space`.
        X: ``(n, d)`` float64 inputs (NumPy).
        Y: ``(n, t)`` float64 targets (NumPy; their likelihoods summed).
        noise: ``()`` or ``(n,)`` noise variance (NumPy).
        method: ``"lbfgs"``, ``"adam"``, ``"fmin_l_bfgs_b"`` or a callable (see the
            module docstring).
        restarts: extra starts.
        rng: draws the extra starts (:meth:`Space.starts`).
        max_steps: most steps per start (``"lbfgs"``, ``"adam"``, ``"fmin_l_bfgs_b"``).

    Returns:
        The :class:`Optimum`.
    """
    starts = space.starts(restarts, rng)
    if method in ("lbfgs", "adam"):
        runs = []
        for r, x in enumerate(starts):
            try:
                runs.append(_fit_start(space, X, Y, noise, x, method, max_steps, first=r == 0))
            except ValueError:
                if r == 0:
                    raise
                runs.append((x, np.inf, None))  # a drawn start with a non-finite likelihood
    else:
        objective = space.objective(X, Y, noise)
        if method == "fmin_l_bfgs_b":
            runs = [_scipy_start(objective, x, space.bounds, max_steps) for x in starts]
        else:
            runs = [_custom_start(objective, x, space.bounds, method) for x in starts]
    losses = [float(fun) for _, fun, _ in runs]
    best = 0
    for i, f in enumerate(losses[1:], 1):
        if better_start(f, losses[best]):
            best = i
    x, fun, result = runs[best]
    x = np.asarray(x, np.float64)
    if isinstance(space, GpcholSpace) and result is not None and method in ("lbfgs", "adam"):
        kernel = space.with_params(result.params)  # not through the round trip of x
    else:
        kernel = space.kernel(x)
    return Optimum(x=x, fun=float(fun), restart_losses=losses, result=result, kernel=kernel)


def _scipy_start(
    objective: Objective, x0: np.ndarray, bounds: np.ndarray, max_steps: int
) -> tuple[np.ndarray, float, Any]:
    from scipy.optimize import minimize

    def f(x: np.ndarray) -> tuple[float, np.ndarray]:
        v, g = objective(x, True)
        if not np.all(np.isfinite(g)):  # a finite value with a NaN gradient
            return np.inf, np.zeros_like(g)  # the line search steps back
        return v, g

    if x0.size == 0:
        return x0, objective(x0, False), None
    res = minimize(
        f, x0, jac=True, method="L-BFGS-B", bounds=bounds, options={"maxiter": max_steps}
    )
    return res.x, float(res.fun), res


def _custom_start(
    objective: Objective, x0: np.ndarray, bounds: np.ndarray, method: Callable[..., Any]
) -> tuple[np.ndarray, float, Any]:
    out = method(objective, np.array(x0), bounds=np.array(bounds))  # scikit-learn's call
    try:
        x, fun = out
    except (TypeError, ValueError):
        raise TypeError(
            "optimizer: a callable optimizer must return (theta_opt, func_min); got "
            f"{type(out).__name__}"
        ) from None
    x = np.atleast_1d(np.asarray(x, np.float64))
    if x.shape != x0.shape:
        raise ValueError(
            f"optimizer: the callable returned theta of shape {x.shape}; expected {x0.shape}"
        )
    return x, float(fun), None


def _fit_start(
    space: Space,
    X: np.ndarray,
    Y: np.ndarray,
    noise: np.ndarray,
    x0: np.ndarray,
    method: str,
    max_steps: int,
    *,
    first: bool,
) -> tuple[np.ndarray, float, Any]:
    """One start of :func:`gpchol.fit` (its GP program, size-bucketed, for one target; a
    plain loss for several)."""
    # jax.device_put, not jnp.asarray: eager jnp.asarray of a NumPy array compiles a small
    # program per shape, paid on every fit of a new n
    Xj, nj = jax.device_put(X), jax.device_put(noise)
    if isinstance(space, SklearnSpace):
        moved, transforms = space.transforms()
        x0 = space.inside(x0)
        if moved.size == 0:
            return (
                x0,
                -float(log_marginal_likelihood(space.kernel(jnp.asarray(x0)), X, Y, noise)),
                None,
            )
        rest = jax.device_put(x0)
        index = jax.device_put(moved)

        def theta_kernel(p: Any) -> Any:
            return space.kernel(rest.at[index].set(jnp.stack(p)))

        kernel_of: Callable[[Any], Any] = theta_kernel

        params: Any = [jax.device_put(x0[i]) for i in moved]
        tf: Any = transforms
    else:
        assert isinstance(space, GpcholSpace)
        kernel_of = space.with_params
        start = space.initial() if first else space.params(x0)  # the given values exactly
        params = {k: jnp.asarray(v, jnp.float64) for k, v in start.items()}
        tf = space.transforms
    if Y.shape[1] == 1:
        result = fit(
            lambda p: GaussianProcess(kernel_of(p), Xj, noise=nj),
            params,
            jax.device_put(np.ascontiguousarray(Y[:, 0])),
            transforms=tf,
            optimizer=method,
            steps=max_steps,
            progress=False,
        )
    else:
        Yj = jax.device_put(Y)
        result = fit(
            lambda p: -log_marginal_likelihood(kernel_of(p), Xj, Yj, nj),
            params,
            transforms=tf,
            optimizer=method,
            steps=max_steps,
            progress=False,
        )
    if isinstance(space, SklearnSpace):
        x = np.array(x0)
        x[moved] = [float(v) for v in result.params]
    else:
        u = to_unconstrained(result.params, space.transforms)
        x = np.concatenate([np.ravel(np.asarray(u[space.paths[i]])) for i in space.free])
    return x, float(result.loss), result
