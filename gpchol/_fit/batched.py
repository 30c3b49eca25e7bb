r"""Many GPs fitted at once: one compiled optimisation loop, vmapped over the problems.

:func:`fit_batched` fits ``B`` independent problems (one GP per dataset, the same model
with its own data and hyperparameters) in one call. The whole optimisation runs inside
one compiled program: a ``lax.while_loop`` over the steps of :func:`gpchol.fit`
(:func:`~gpchol._fit.objective.make_step`: the same loss, optimiser and update),
``jax.vmap``-ed over the problems. Each problem has its own stopping test (the relative
loss change of :func:`gpchol.fit`); once it has stopped, its parameters no longer change
while the others go on (the vmapped loop runs until the last one stops).

A step whose loss or gradient is not finite is not taken: that problem keeps its last
finite parameters and is marked ``failed`` while the others finish. Datasets of unequal
sizes are padded to the largest, with padded rows that change nothing
(:func:`padded_log_marginal_likelihood`). With ``checkpoint=path`` the loop runs in
compiled chunks of ``checkpoint_every`` steps, committed between chunks by
:func:`gpchol.fit`'s machinery (:mod:`gpchol._fit.session`); a resumed fit ends with
exactly an uninterrupted one's result, and ``SIGINT``/``SIGTERM`` are acted on between
chunks, after the commit.

Restarts are not offered here: a restart is one more problem of the batch.

Example:
    >>> import jax.numpy as jnp, numpy as np
    >>> from gpchol import GaussianProcess, Positive, kernels
    >>> from gpchol._fit.batched import fit_batched
    >>> rng = np.random.default_rng(0)
    >>> X = jnp.asarray(np.sort(rng.uniform(0, 5, (3, 20)), axis=1))
    >>> y = jnp.sin(X) + 0.1 * jnp.asarray(rng.normal(size=(3, 20)))
    >>> def build(p, x):
    ...     return GaussianProcess(p["amp"] * kernels.ExpSquared(p["ls"]), x, noise=p["noise"])
    >>> p0 = {"amp": 1.0, "ls": 1.0, "noise": 0.1}
    >>> t = {"amp": Positive(), "ls": Positive(), "noise": Positive()}
    >>> res = fit_batched(build, p0, X, y, transforms=t, steps=100, progress=False)
    >>> res.params["ls"].shape, bool(res.failed.any()), bool(res.n_steps.min() > 0)
    ((3,), False, True)
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np

from gpchol._base.transforms import to_constrained, to_unconstrained
from gpchol._base.validate import check_fit_settings, check_int
from gpchol._fit.fingerprint import fit_fingerprint
from gpchol._fit.objective import (
    Optimizer,
    default_transforms,
    floating_params,
    make_optimizer,
    make_step,
    unconstrained_loss,
)
from gpchol._fit.session import fit_session
from gpchol._fit.state import FitState, canonical, keep_last_good, next_stall

if TYPE_CHECKING:
    import optax

__all__ = [
    "CONVERGED",
    "FAILED",
    "RUNNING",
    "STEPS",
    "BatchedFitResult",
    "fit_batched",
    "padded_log_marginal_likelihood",
]

RUNNING, CONVERGED, STEPS, FAILED = 0, 1, 2, 3
"""A problem's status codes (:attr:`BatchedFitResult.status`): still running, stopped by
the tolerance test, stopped at ``steps``, stopped on a non-finite loss or gradient."""


@dataclasses.dataclass
class BatchedFitResult:
    """What :func:`fit_batched` returns: one entry per problem, as arrays.

    Attributes:
        params: the fitted parameters (constrained space): the input pytree with a leading
            ``(B,)`` axis on every leaf. A failed problem has the parameters of its last
            finite step (its initial parameters when the first loss was not finite).
        loss: ``(B,)`` the final loss (negative log marginal likelihood) of each problem;
            the loss at those parameters (NaN for a problem failed at its start).
        log_marginal_likelihood: ``(B,)`` ``-loss``.
        n_steps: ``(B,)`` optimiser steps taken by each problem.
        converged: ``(B,)`` whether the tolerance test stopped the problem.
        failed: ``(B,)`` whether it stopped on a non-finite loss or gradient.
        status: ``(B,)`` :data:`CONVERGED`, :data:`STEPS` (reached ``steps``) or
            :data:`FAILED`.
        unconstrained_params: ``params`` in the optimiser's space.
        optimizer: the optimiser's name.
        message: one sentence on the batch (counts; the failed problems' indices).

    Example:
        >>> import numpy as np
        >>> from gpchol._fit.batched import BatchedFitResult
        >>> r = BatchedFitResult({}, np.zeros(2), np.zeros(2), np.ones(2, int),
        ...     np.array([True, False]), np.array([False, True]), np.array([1, 3]), {},
        ...     "adam", "")
        >>> len(r), r.success.tolist()
        (2, [True, False])
    """

    params: Any
    loss: np.ndarray
    log_marginal_likelihood: np.ndarray
    n_steps: np.ndarray
    converged: np.ndarray
    failed: np.ndarray
    status: np.ndarray
    unconstrained_params: Any
    optimizer: str
    message: str

    def __len__(self) -> int:
        return int(self.loss.shape[0])

    @property
    def success(self) -> np.ndarray:
        """``(B,)`` ``~failed``."""
        return ~self.failed

    def __repr__(self) -> str:
        return f"BatchedFitResult(B={len(self)}, message={self.message!r})"


# ----------------------------------------------------------------------- the likelihood


def padded_log_marginal_likelihood(gp: Any, y: Any, mask: Any) -> jax.Array:
    r"""``log p(y[mask])`` of a GP over padded data: padded rows change nothing.

    The covariance ``K = k(X, X) + diag(noise)`` and the residual ``r = y - m(X)`` are
    masked: a padded row (``mask`` False) and its column are those of the identity and
    its residual is 0, so ``K`` is block diagonal (the real points' covariance, and the
    identity) and the padded rows add exactly ``-n_pad log(2 pi) / 2`` (a zero residual,
    a zero log-determinant), which is added back. The value and its gradient are those
    of the GP restricted to its real rows, whatever the padded rows hold (their inputs
    must only give a finite kernel). Computed by the GP's own likelihood with the padded
    rows marked (:meth:`gpchol.GaussianProcess.with_mask`).

    Args:
        gp: a :class:`gpchol.GaussianProcess` over ``(n, d)`` inputs, padded rows included
            (without a jitter schedule).
        y: ``(n,)`` observations (anything finite on padded rows).
        mask: ``(n,)`` booleans, True on the real rows.

    Returns:
        A scalar; NaN when the real rows' covariance is not positive definite.

    Raises:
        ValueError: a GP with a jitter schedule (pad-free data or no jitter are needed).

    Example:
        >>> import jax.numpy as jnp
        >>> from gpchol import GaussianProcess, kernels
        >>> from gpchol._fit.batched import padded_log_marginal_likelihood
        >>> X, y = jnp.array([0.0, 1.0, 2.0]), jnp.array([0.5, -0.2, 0.1])
        >>> full = GaussianProcess(kernels.ExpSquared(), X[:2], noise=0.1)
        >>> padded = GaussianProcess(kernels.ExpSquared(), X, noise=0.1)
        >>> mask = jnp.array([True, True, False])
        >>> a = padded_log_marginal_likelihood(padded, y, mask)
        >>> bool(jnp.allclose(a, full.log_marginal_likelihood(y[:2])))
        True
    """
    if getattr(gp, "jitter", None) is not None:
        raise ValueError(
            "padded data (unequal dataset sizes, or a mask) cannot use a GaussianProcess "
            "with a jitter schedule (the jitter would also go to the padded rows); build "
            "the GP without jitter=..., e.g. with a lower bound on the noise instead "
            "(gpchol.Positive(lower=1e-6))."
        )
    return gp.with_mask(jnp.asarray(mask, bool)).log_marginal_likelihood(y)


# --------------------------------------------------------------------------- the inputs


@dataclasses.dataclass(frozen=True)
class _Batch:
    """The problems' data: ``X (B, n[, d])``, ``y (B, n)``, ``mask (B, n)``."""

    X: jax.Array
    y: jax.Array
    mask: jax.Array
    padded: bool

    @property
    def size(self) -> int:
        return int(self.y.shape[0])


def _as_list(v: Any) -> list[np.ndarray] | None:
    if isinstance(v, (list, tuple)):
        return [np.asarray(a) for a in v]
    return None


def _ragged(X: list[np.ndarray], y: list[np.ndarray]) -> tuple[np.ndarray, ...]:
    """Stacks ragged datasets, padded at the end: ``(X, y, mask)``."""
    if len(X) != len(y):
        raise ValueError(
            f"X and y must hold the same number of datasets; got {len(X)} and {len(y)}."
        )
    if not X:
        raise ValueError("X and y hold no dataset; pass at least one.")
    nd0 = X[0].ndim
    d0 = 1 if nd0 == 1 else X[0].shape[-1]
    for i, (x, t) in enumerate(zip(X, y, strict=True)):
        if x.ndim not in (1, 2):
            raise ValueError(f"X[{i}] must have shape (n, d) or (n,); got shape {x.shape}.")
        d = 1 if x.ndim == 1 else x.shape[1]
        if x.ndim != nd0 or d != d0:
            raise ValueError(
                f"the datasets disagree in dimension: X[{i}] has shape {x.shape} but X[0] "
                f"has shape {X[0].shape}; every dataset of a batch needs the same input "
                "dimension d (columns of X)."
            )
        if t.ndim != 1 or t.shape[0] != x.shape[0]:
            raise ValueError(
                f"y[{i}] must have shape ({x.shape[0]},), one value per row of X[{i}]; got "
                f"shape {t.shape}."
            )
        if x.shape[0] == 0:
            raise ValueError(f"X[{i}] has no rows; every dataset needs at least one point.")
    n = max(x.shape[0] for x in X)
    B = len(X)
    Xp = np.empty((B, n) + X[0].shape[1:], np.result_type(*X))
    yp = np.zeros((B, n), np.result_type(*y))
    mask = np.zeros((B, n), bool)
    for i, (x, t) in enumerate(zip(X, y, strict=True)):
        k = x.shape[0]
        Xp[i, :k], Xp[i, k:] = x, x[:1]  # padded inputs: a real one (a finite kernel)
        yp[i, :k] = t
        mask[i, :k] = True
    return Xp, yp, mask


def _batch(X: Any, y: Any, mask: Any) -> _Batch:
    """Checks and stacks the datasets."""
    Xl, yl = _as_list(X), _as_list(y)
    if (Xl is None) != (yl is None):
        raise ValueError(
            "X and y must both be sequences of per-dataset arrays, or both stacked arrays "
            "(X (B, n, d) or (B, n), y (B, n))."
        )
    if Xl is not None and yl is not None:
        if mask is not None:
            raise ValueError("mask is for stacked arrays; datasets given as lists need none.")
        Xn, yn, mn = _ragged(Xl, yl)
        padded = not bool(mn.all())
    else:
        Xn, yn = np.asarray(X), np.asarray(y)
        if Xn.ndim not in (2, 3):
            raise ValueError(
                f"X must have shape (B, n, d) or (B, n) (B datasets of n points); got shape "
                f"{Xn.shape}. Datasets of unequal sizes: pass lists of arrays."
            )
        if yn.shape != Xn.shape[:2]:
            raise ValueError(
                f"y must have shape {Xn.shape[:2]}, one value per row of each dataset of X; "
                f"got shape {yn.shape}."
            )
        if mask is None:
            mn, padded = np.ones(yn.shape, bool), False
        else:
            mn = np.asarray(mask)
            if mn.shape != yn.shape or mn.dtype != bool:
                raise ValueError(
                    f"mask must be a boolean array of shape {yn.shape} (True on real rows); "
                    f"got {mn.dtype} of shape {mn.shape}."
                )
            empty = np.flatnonzero(~mn.any(axis=1))
            if empty.size:
                raise ValueError(
                    f"mask leaves dataset {int(empty[0])} without any point; every dataset "
                    "needs at least one True entry."
                )
            padded = True
            # padded rows hold a real input of their dataset and y = 0 (finite everywhere)
            first = np.argmax(mn, axis=1)
            fill = Xn[np.arange(Xn.shape[0]), first]
            Xn = np.where(mn.reshape(mn.shape + (1,) * (Xn.ndim - 2)), Xn, fill[:, None])
            yn = np.where(mn, yn, 0)
    if yn.shape[0] == 0:
        raise ValueError("X and y hold no dataset (B = 0); pass at least one.")
    for name, a in (("X", Xn), ("y", yn)):
        if not np.issubdtype(a.dtype, np.number) or np.issubdtype(a.dtype, np.complexfloating):
            raise ValueError(f"{name} must hold real numbers; got dtype {a.dtype}.")
    return _Batch(jnp.asarray(Xn), jnp.asarray(yn), jnp.asarray(mn), padded)


def _initial_u(params: Any, transforms: Any, B: int, params_batched: bool) -> Any:
    """``(B, ...)`` unconstrained initial parameters, one row per problem.

    The transforms run op by op, as in :func:`gpchol.fit` (the same bits: each problem
    starts where a fit of it alone starts); the broadcast to ``B`` rows is left to the
    compiled :func:`_initial_carry`.
    """
    u = canonical(to_unconstrained(params, transforms))
    if params_batched:
        for x in jax.tree_util.tree_leaves(u):
            if jnp.ndim(x) == 0 or jnp.shape(x)[0] != B:
                raise ValueError(
                    f"params_batched=True needs every parameter leaf with a leading axis of "
                    f"size B={B} (one value per dataset); got a leaf of shape {jnp.shape(x)}."
                )
    return u


# ------------------------------------------------------------------------------ the loop


def _select(ok: jax.Array, a: Any, b: Any) -> Any:
    return jax.tree_util.tree_map(lambda x, z: jnp.where(ok, x, z), a, b)


def _make_runner(
    step_of: Callable[[Callable[[Any], jax.Array]], Any],
    loss_for: Callable[[jax.Array, jax.Array, jax.Array], Callable[[Any], jax.Array]],
    transforms: Any,
    *,
    steps: int,
    tol: float,
    patience: int,
    vectorize: int,
) -> Callable[..., Any]:
    """``(carry, data, limit) -> (carry, final)``: every problem's steps while ``k < limit``.

    ``final`` holds, for each problem that has stopped, its result: the loss at its last
    parameters, or (a failed step, or a non-finite loss there) its last finite parameters
    and their loss, with those parameters in both spaces. Computed in the same compiled
    program as the steps (a separately compiled loss would cost a compilation).
    """

    def one(c: dict[str, Any], X: jax.Array, y: jax.Array, m: jax.Array, limit: jax.Array) -> Any:
        # one traced loss for the step, its line search and the result (jit: traced once)
        loss = jax.jit(loss_for(X, y, m))
        step = step_of(loss)

        def cond(c: dict[str, Any]) -> jax.Array:
            return (c["code"] == RUNNING) & (c["k"] < limit)

        def body(c: dict[str, Any]) -> dict[str, Any]:
            u2, s2, v, grad_ok = step(c["u"], c["s"])
            v = v.astype(c["prev"].dtype)
            ok = jnp.isfinite(v) & grad_ok
            # prev is NaN before a problem's first step: no change, the count stays 0
            stall = next_stall(c["stall"], c["prev"], v, tol).astype(jnp.int32)
            k = c["k"] + 1
            code = jnp.where(stall >= patience, CONVERGED, jnp.where(k >= steps, STEPS, RUNNING))
            return {
                "u": _select(ok, u2, c["u"]),
                "s": _select(ok, s2, c["s"]),
                "k": jnp.where(ok, k, c["k"]),
                "prev": jnp.where(ok, v, c["prev"]),
                "stall": jnp.where(ok, stall, c["stall"]),
                "code": jnp.where(ok, code, FAILED).astype(jnp.int32),
                "good": _select(ok, c["u"], c["good"]),
            }

        c = jax.lax.while_loop(cond, body, c)
        stopped = c["code"] != RUNNING
        nan = jnp.full((), jnp.nan, c["prev"].dtype)
        last = jax.lax.cond(stopped, lambda u: loss(u).astype(nan.dtype), lambda u: nan, c["u"])
        # a failed step, or a last update to a non-finite loss: the last finite step
        bad, u, loss_u = keep_last_good(c["code"] == FAILED, last, c["u"], c["prev"], c["good"])
        final = {
            "loss": loss_u,
            "bad": bad,
            "u": u,
            "params": to_constrained(u, transforms),
        }
        return c, final

    def run(c: dict[str, Any], X: jax.Array, y: jax.Array, m: jax.Array, limit: jax.Array) -> Any:
        # groups of `vectorize` problems one after another; each group's loops vmapped
        return jax.lax.map(
            lambda a: one(a[0], a[1], a[2], a[3], limit),
            (c, X, y, m),
            batch_size=None if vectorize == 1 else vectorize,
        )

    return jax.jit(run)


def _initial_carry(
    u: Any,
    B: int,
    params_batched: bool,
    opt: Optimizer,
    steps: int,
    data_dtypes: tuple[Any, ...],
) -> dict[str, Any]:
    """The batch's first carry from :func:`_initial_u`'s ``u``, by one small compiled program.

    (Op by op, each broadcast and optimiser state would compile a program of its own.)
    The losses are kept in the floating type of the parameters and data (each step's
    loss is cast to it).
    """
    dtypes = [jnp.dtype(x.dtype) for x in jax.tree_util.tree_leaves(u)]
    dtype = jnp.result_type(*dtypes, *data_dtypes)
    if not jnp.issubdtype(dtype, jnp.floating):
        dtype = jnp.result_type(float)

    def make(u: Any) -> dict[str, Any]:
        if not params_batched:
            u = jax.tree_util.tree_map(lambda x: jnp.broadcast_to(x, (B,) + x.shape), u)
        return {
            "u": u,
            "s": jax.vmap(opt.init)(u),
            "k": jnp.zeros(B, jnp.int32),
            "prev": jnp.full(B, jnp.nan, dtype),
            "stall": jnp.zeros(B, jnp.int32),
            "code": jnp.full(B, RUNNING if steps > 0 else STEPS, jnp.int32),
            "good": u,
        }

    return canonical(jax.jit(make)(u))


def fit_batched(
    build: Callable[[Any, jax.Array], Any],
    params: Any,
    X: Any,
    y: Any,
    *,
    mask: Any = None,
    params_batched: bool = False,
    transforms: Any = None,
    optimizer: str | optax.GradientTransformation = "lbfgs",
    steps: int = 200,
    learning_rate: float | None = None,
    tol: float = 1e-9,
    patience: int = 3,
    checkpoint: str | os.PathLike[str] | None = None,
    checkpoint_every: int = 25,
    resume: bool = True,
    progress: bool = True,
    vectorize: int = 1,
) -> BatchedFitResult:
    r"""Fits ``B`` GPs at once, one per dataset, in one compiled and vmapped loop.

    Each problem ``b`` minimises ``-log p(y_b | X_b, params_b)`` as :func:`gpchol.fit`
    would (same loss, transforms, optimiser steps and stopping test, one problem's
    optimum is the one :func:`gpchol.fit` finds on it alone); all ``B`` run together in
    one ``lax.while_loop`` under ``jax.vmap`` until each has stopped.

    Args:
        build: ``(params, X_b) -> GaussianProcess`` for one dataset (traceable by
            ``jax.jit``; anything with ``.log_marginal_likelihood(y)`` when no dataset is
            padded).
        params: initial parameters (constrained space): one pytree shared by every
            problem, or with ``params_batched=True`` a pytree whose leaves have a leading
            ``(B,)`` axis.
        X: ``(B, n, d)`` or ``(B, n)`` inputs, or a sequence of ``B`` arrays ``(n_b, d)``
            (or ``(n_b,)``) of unequal sizes (padded to the largest, with a mask).
        y: ``(B, n)`` observations, or a sequence of ``B`` arrays ``(n_b,)``.
        mask: with stacked arrays, ``(B, n)`` booleans, True on the real rows (padded
            rows: False; their values are ignored). ``None``: every row is real.
        params_batched: whether ``params`` holds one value per problem (leading axis).
        transforms: a pytree prefix of ``params`` (one problem's) of
            :class:`gpchol.Transform`; default as in :func:`gpchol.fit`.
        optimizer: ``"lbfgs"`` (:func:`gpchol.fit`'s L-BFGS with its strong-Wolfe line
            search), ``"adam"`` or an optax ``GradientTransformation``.
        steps: the most optimiser steps per problem.
        learning_rate: as in :func:`gpchol.fit`.
        tol: a problem stops when its relative loss change
            ``|f_k - f_{k-1}| / max(1, |f_k|)`` stays below ``tol`` for ``patience``
            consecutive steps.
        patience: see ``tol``.
        checkpoint: base path of the batch's checkpoint (as in :func:`gpchol.fit`), or
            ``None``.
        checkpoint_every: with a checkpoint (or a progress line), the steps per compiled
            chunk; the state is committed after each.
        resume: continue from the checkpoint when it exists (a checkpoint of another
            batch fit is refused with a :class:`gpchol.CheckpointError`).
        progress: print the number of running problems after each chunk (stderr).
        vectorize: how many problems are stepped together, vmapped (their kernel
            matrices, factorizations and updates as batched operations); the groups run
            one after another inside the same compiled loop, each until its problems
            have stopped. ``1`` (the default) runs each problem's loop on its own, with
            unbatched LAPACK calls, the faster form on a CPU with few cores
            (``benchmarks/results/design-measurements.md``); raise it on a GPU.

    Returns:
        A :class:`BatchedFitResult` (arrays with a leading ``(B,)`` axis).

    Raises:
        ValueError: datasets that disagree in dimension (or ``X``/``y``/``mask`` shapes
            that do not match), a bad setting, an initial value outside its transform's
            domain. A problem whose loss cannot be evaluated does not raise: it is marked
            failed.
        CheckpointError: as in :func:`gpchol.fit`.
        KeyboardInterrupt: :class:`gpchol.FitInterrupted` on ``SIGINT``, after the chunk
            under way and the commit.
        SystemExit: :class:`gpchol.FitTerminated` on ``SIGTERM``, likewise.

    Example:
        >>> import jax.numpy as jnp
        >>> from gpchol import GaussianProcess, Positive, kernels
        >>> from gpchol._fit.batched import fit_batched
        >>> X = [jnp.linspace(0, 3, 12), jnp.linspace(0, 3, 7)]  # unequal sizes: padded
        >>> y = [jnp.sin(2 * x) for x in X]
        >>> res = fit_batched(lambda p, x: GaussianProcess(kernels.ExpSquared(p["ls"]), x,
        ...                   noise=p["noise"]), {"ls": 1.0, "noise": 0.1}, X, y,
        ...                   transforms={"ls": Positive(), "noise": Positive(1e-6)},
        ...                   progress=False)
        >>> res.n_steps.shape, res.failed.tolist()
        ((2,), [False, False])
    """
    check_fit_settings(steps=steps, tol=tol, patience=patience, checkpoint_every=checkpoint_every)
    vectorize = check_int(vectorize, "vectorize", strict=False)
    data = _batch(X, y, mask)
    B = data.size
    opt_name, opt = make_optimizer(optimizer, learning_rate)
    params = floating_params(params)
    if transforms is None:
        transforms = default_transforms(
            jax.tree_util.tree_map(lambda x: jnp.asarray(x)[0], params)
            if params_batched
            else params
        )
    carry0 = _initial_carry(
        _initial_u(params, transforms, B, params_batched),
        B,
        params_batched,
        opt,
        int(steps),
        (jnp.dtype(data.X.dtype), jnp.dtype(data.y.dtype)),
    )
    u0 = carry0["u"]

    def loss_for(Xb: jax.Array, yb: jax.Array, mb: jax.Array) -> Callable[[Any], jax.Array]:
        if data.padded:
            return unconstrained_loss(
                lambda p: -padded_log_marginal_likelihood(build(p, Xb), yb, mb), None, transforms
            )
        return unconstrained_loss(lambda p: build(p, Xb), yb, transforms)

    run = _make_runner(
        lambda loss: make_step(opt, loss, traceable=True),
        loss_for,
        transforms,
        steps=int(steps),
        tol=float(tol),
        patience=int(patience),
        vectorize=min(int(vectorize), B),
    )
    rest0 = {k: v for k, v in carry0.items() if k != "u"}
    args = (data.X, data.y, data.mask)

    ck = None if checkpoint is None else os.fspath(checkpoint)
    fp = None
    if ck is not None:
        # the fingerprint reads this batch loss's jaxpr (it is never compiled)
        batch_loss = jax.jit(jax.vmap(lambda u, a, b, c: loss_for(a, b, c)(u)))
        fp = fit_fingerprint(
            build_or_loss=lambda p: build(p, data.X[0]),
            params=params,
            y=None,
            u0=u0,
            loss_u=lambda u: jnp.sum(batch_loss(u, *args)),
            transforms=transforms,
            optimizer=opt_name,
            learning_rate=learning_rate,
            opt_state=rest0,
            steps=steps,
            tol=tol,
            patience=patience,
            restarts=0,
            restart_scale=1.0,
            key=np.zeros(2, np.uint32),
            user={"fit_batched": np.asarray(B), "X": data.X, "y": data.y, "mask": data.mask},
        )
    chunk = int(checkpoint_every) if (ck is not None or progress) else max(1, int(steps))
    final: dict[str, Any] | None = None
    with fit_session(
        ck,
        fingerprint=fp,
        optimizer=opt_name,
        progress=progress,
        steps=int(steps),
        label=f"gpchol fit_batched [{opt_name}] B={B}",
    ) as session:
        st = session.resumed(resume, u0, lambda u: rest0) or FitState(
            params=u0, opt_state=rest0, key=np.zeros(2, np.uint32)
        )
        while not st.done:
            limit = min(int(steps), st.step + chunk)
            carry, final = run(dict(st.opt_state, u=st.params), *args, jnp.asarray(limit))
            codes = np.asarray(carry["code"])
            st.params = carry["u"]
            st.opt_state = {k: v for k, v in carry.items() if k != "u"}
            st.step = limit
            st.done = bool(np.all(codes != RUNNING)) or limit >= int(steps)
            running = int(np.sum(codes == RUNNING))
            prev = np.asarray(carry["prev"])
            shown = float(np.nanmedian(prev)) if np.isfinite(prev).any() else math.nan
            session.bar.update(st.step, shown, f" (median), {running}/{B} running", force=True)
            session.commit(st)
            session.guard.deliver("fit_batched", f"after step {st.step}")
    if final is None:  # resumed from a finished checkpoint: the results once more
        _, final = run(dict(st.opt_state, u=st.params), *args, jnp.asarray(st.step))
    return _result(dict(st.opt_state, u=st.params), final, opt_name)


def _result(carry: dict[str, Any], final: dict[str, Any], opt_name: str) -> BatchedFitResult:
    """The per-problem results from the last carry and the run's ``final`` entries."""
    code = np.asarray(carry["code"])
    code = np.where(code == RUNNING, STEPS, code)  # stopped at steps
    bad = np.asarray(final["bad"])
    loss = np.asarray(final["loss"])
    code = np.where(bad, FAILED, code)
    failed = code == FAILED
    n_steps = np.asarray(carry["k"])
    B = code.shape[0]
    parts = [f"{int(np.sum(code == CONVERGED))} of {B} problems converged"]
    if np.any(code == STEPS):
        parts.append(f"{int(np.sum(code == STEPS))} reached the step limit")
    if np.any(failed):
        idx = np.flatnonzero(failed)
        shown = ", ".join(map(str, idx[:10].tolist())) + (" ..." if idx.size > 10 else "")
        parts.append(
            f"{idx.size} failed on a non-finite loss or gradient (problems {shown}; they "
            "keep their last finite parameters)"
        )
    return BatchedFitResult(
        params=final["params"],
        loss=loss,
        log_marginal_likelihood=-loss,
        n_steps=n_steps,
        converged=code == CONVERGED,
        failed=failed,
        status=code,
        unconstrained_params=final["u"],
        optimizer=opt_name,
        message="; ".join(parts) + ".",
    )
