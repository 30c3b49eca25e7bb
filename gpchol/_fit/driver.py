r"""Hyperparameter fitting: L-BFGS / optax loops with transforms and checkpoints.

:func:`fit` minimises a loss over a plain pytree of parameters. The parameters are given
(and returned) in their natural, *constrained* space; a pytree prefix of
:class:`gpchol.Transform` objects maps them to an unconstrained space where the optimiser
runs (``Positive`` through softplus, ``Bounded`` through a scaled sigmoid, ``None`` for
the identity). Each step is one jitted call: the loss and its gradient (for a Gaussian
process, through gpchol's Cholesky adjoint) and the optimiser update.

A step whose loss or gradient is not finite never replaces the last good parameters;
checkpoints are atomic and fingerprinted (:mod:`gpchol._fit.checkpoint`,
:mod:`gpchol._fit.fingerprint`), a resumed fit ends with exactly an uninterrupted fit's
result, and ``SIGINT``/``SIGTERM`` are acted on between steps after a commit
(:mod:`gpchol._fit.signals`): :func:`fit`'s docstring says each in full.

Example:
    >>> import jax.numpy as jnp
    >>> from gpchol import fit
    >>> from gpchol import Positive
    >>> res = fit(lambda p: (p["s"] - 2.0) ** 2, {"s": 1.0}, transforms={"s": Positive()},
    ...           optimizer="lbfgs", steps=50, progress=False)
    >>> round(float(res.params["s"]), 4), res.converged
    (2.0, True)
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
from gpchol._base.validate import check_fit_settings, check_number
from gpchol._fit.fingerprint import describe_structure, fit_fingerprint
from gpchol._fit.lbfgs import LBFGSState, host_ravel
from gpchol._fit.objective import (
    OWN_OPTIMIZERS,
    StepFn,
    default_transforms,
    floating_params,
    make_optimizer,
    make_step,
    optimizer_key,
    unconstrained_loss,
)
from gpchol._fit.programs import check_bucket, gp_program, loss_program
from gpchol._fit.session import FitSession, fit_session
from gpchol._fit.state import (
    FitState,
    StartRecord,
    better_start,
    canonical,
    default_key_data,
    keep_last_good,
    key_data,
    next_stall,
)

if TYPE_CHECKING:
    import optax

__all__ = ["FitResult", "fit"]


@dataclasses.dataclass
class FitResult:
    """What :func:`fit` returns.

    Attributes:
        params: the fitted parameters, constrained space, same pytree as the input.
        loss: the final loss (for a GP: the negative log marginal likelihood).
        log_marginal_likelihood: ``-loss`` when fitting a GP (``y`` given), else ``None``
            (for a :class:`gpchol.SparseGP`, the evidence lower bound it maximises).
        history: ``(n_steps,)`` float64 loss at each step (of the best restart).
        n_steps: number of optimiser steps taken (of the best restart).
        converged: whether the tolerance test stopped the fit.
        success: False when the fit stopped on a non-finite loss or gradient.
        message: a sentence on how the fit ended (and what to try when it failed).
        unconstrained_params: the optimiser's parameters (unconstrained space).
        restart_losses: final loss of each start (the first is the given initial point).
        optimizer: the optimiser's name.
        optimizer_state: the leaves (``jax.tree_util.tree_leaves`` order, a list of
            arrays: saved and loaded as such) of the optimiser's state at the end of the
            best start (L-BFGS: its last state holding curvature pairs), for a later
            fit's ``warm_start`` (a fresh state's when the fit resumed a checkpoint that
            an earlier gpchol wrote without it).
        optimizer_state_tree: that state's tree structure in words (its optimiser's state
            classes, e.g. L-BFGS's or Adam's), which a ``warm_start`` must match;
            ``None`` in a result saved by a gpchol before it (such a result warm-starts
            only gpchol's own ``"lbfgs"`` or ``"adam"`` fit).

    Example:
        >>> from gpchol import fit
        >>> res = fit(lambda p: (p - 3.0) ** 2, 0.0, optimizer="lbfgs", progress=False)
        >>> round(float(res.params), 3), res.n_steps > 0
        (3.0, True)
    """

    params: Any
    loss: float
    log_marginal_likelihood: float | None
    history: np.ndarray
    n_steps: int
    converged: bool
    success: bool
    message: str
    unconstrained_params: Any
    restart_losses: list[float]
    optimizer: str
    optimizer_state: Any = None
    optimizer_state_tree: str | None = None

    def __repr__(self) -> str:
        return (
            f"FitResult(loss={self.loss:.8g}, n_steps={self.n_steps}, "
            f"converged={self.converged}, success={self.success}, message={self.message!r})"
        )


_NONFINITE_HINT = (
    "The parameters of the last finite step were kept. Try: jitter on the model "
    "(GaussianProcess(..., jitter=(1e-8, 1e-6, 1e-4))), float64 "
    "(jax.config.update('jax_enable_x64', True)), bounds on the parameters (e.g. "
    "gpchol.Positive(lower=1e-4) on the noise, gpchol.Bounded(low, high) on lengthscales), "
    "or a smaller learning rate."
)


@dataclasses.dataclass(frozen=True)
class FitPlan:
    """The fixed settings of one fit (what does not change from step to step)."""

    optimizer: str
    init_opt_state: Callable[[Any], Any]
    step_fn: StepFn
    transforms: Any
    u0: Any
    restart_scale: float
    steps: int
    restarts: int
    tol: float
    patience: int
    callback: Callable[[int, Any, float], Any] | None
    checkpoint: str | None
    checkpoint_every: int
    fingerprint: dict[str, str] | None
    warm_opt_state: Any = None

    @property
    def n_starts(self) -> int:
        return self.restarts + 1


# ------------------------------------------------------------------------------ the driver


def fit(
    build_or_loss: Callable[[Any], Any],
    params: Any,
    y: Any = None,
    *,
    transforms: Any = None,
    optimizer: str | optax.GradientTransformation = "lbfgs",
    steps: int = 200,
    learning_rate: float | None = None,
    tol: float = 1e-9,
    patience: int = 3,
    restarts: int = 0,
    key: Any = None,
    restart_scale: float = 1.0,
    checkpoint: str | os.PathLike[str] | None = None,
    checkpoint_every: int = 10,
    resume: bool = True,
    progress: bool = True,
    callback: Callable[[int, Any, float], Any] | None = None,
    fingerprint: Any = None,
    bucket: bool | int = True,
    warm_start: FitResult | None = None,
) -> FitResult:
    r"""Fits parameters by minimising a loss (for a GP: the negative log marginal likelihood).

    Args:
        build_or_loss: with ``y`` given, ``params -> GaussianProcess`` (anything with
            ``.log_marginal_likelihood(y)``); the loss is ``-log p(y)`` (for a
            :class:`gpchol.SparseGP`, minus its evidence lower bound). With ``y=None``,
            ``params -> scalar loss`` to minimise. Must be traceable by ``jax.jit``.
        params: a pytree of initial parameter values (constrained space): dicts, lists,
            kernels, scalars, arrays.
        y: ``(n,)`` observations, or ``None`` when ``build_or_loss`` is a loss.
        transforms: a pytree prefix of ``params`` of :class:`gpchol.Transform` (``None``
            leaves: identity); default :func:`default_transforms`.
        optimizer: ``"lbfgs"`` (the default: L-BFGS with a strong-Wolfe line search,
            :mod:`gpchol._fit.lbfgs`, compiled with one copy of the loss), ``"adam"``
            (``optax.adam``) or any optax ``GradientTransformation``.
        steps: maximum number of optimiser steps (per start).
        learning_rate: Adam's step size (default 0.05); L-BFGS's fixed step instead of the
            line search (default ``None``: line search).
        tol: stop when the relative loss change ``|f_k - f_{k-1}| / max(1, |f_k|)`` stays
            below ``tol`` for ``patience`` consecutive steps.
        patience: see ``tol``.
        restarts: number of extra starts from random perturbations of the initial
            unconstrained parameters (``u0 + restart_scale * N(0, 1)``); the best final
            loss wins. Needs ``key`` (default ``jax.random.PRNGKey(0)``).
        key: a ``jax.random`` key for the restarts.
        restart_scale: standard deviation of the restart perturbations.
        checkpoint: base path of the checkpoint: the manifest ``<path>.json`` and the
            arrays file ``<path>.<hash>.npz`` it names; ``<path>.lock`` exists while the
            fit runs (one fit per path at a time: a second is refused). ``None``: no
            checkpoints.
        checkpoint_every: commit the checkpoint every this many steps (and at the end of
            each start, and on ``SIGINT``/``SIGTERM``).
        resume: continue from the checkpoint when it exists (else start over; the old
            checkpoint stays until the new fit's first commit). A checkpoint written by
            another fit (other parameters, transforms, optimiser or stopping settings,
            data or model) or a damaged one is refused, never silently resumed.
        progress: show a progress line with the current loss on stderr.
        callback: ``callback(step, params, loss)`` after each step (constrained
            parameters at which ``loss`` was evaluated); returning ``True`` stops the fit.
        fingerprint: anything (a pytree of arrays, strings, numbers) that identifies the
            data of a plain loss beyond the arrays it closes over (e.g. a file name and
            its modification time); its hash joins the checkpoint's fingerprint. GP fits
            (``y`` given) fingerprint ``y`` and the model built at ``params`` (inputs,
            noise, kernel and mean types) themselves.
        bucket: pad the training points of a :class:`~gpchol.GaussianProcess` to a size
            bucket (``True``: multiples of 32 up to 256, then at most 1/32 more rows, no
            padding above 4096 points; an int ``m``: a multiple of ``m``; ``False``: no
            padding). Padded rows are masked (an identity row and column, a zero
            residual): value, gradient and optimum are those of the unpadded data, and
            fits of sizes in one bucket share one compiled step.
        warm_start: the :class:`FitResult` of an earlier fit of the same parameters
            (tree, shapes, dtypes) with the same optimiser: the first start (not the
            restarts, nor a resumed checkpoint's) begins with its optimiser state
            (``FitResult.optimizer_state``; L-BFGS: the curvature pairs, the loss
            evaluated anew at ``params``). Refits after small changes of the data (one
            more point, as in Bayesian optimisation) then take fewer steps; pass
            ``warm_start.params`` as ``params`` to start at the earlier optimum.

    The compiled step is keyed by the model's structure (its jaxpr, tree structure,
    static fields, dtypes and bucketed shapes), not by the identity of ``build_or_loss``:
    a second fit of the same structure in the process, with a new ``build`` closure or
    new data of the same bucket, compiles nothing (:mod:`gpchol._fit.programs`; with
    :func:`gpchol.enable_compile_cache`, not even in a new process).

    Returns:
        A :class:`FitResult`.

    Raises:
        ValueError: on a bad argument, an initial value outside its transform's domain,
            a non-finite initial loss, or a ``warm_start`` of other parameters or another
            optimiser (the message names the difference).
        TypeError: ``warm_start`` that is not a :class:`FitResult`.
        CheckpointError: (:class:`~gpchol._fit.checkpoint.CheckpointError`, a
            ``ValueError``) with ``resume=True``, a checkpoint written by another fit
            (the message names each difference), of another format version, or damaged
            (not valid JSON, arrays file missing, truncated or not matching its hash);
            or the checkpoint is in use by another running fit. The message names the
            file.
        KeyboardInterrupt: on ``SIGINT`` (Ctrl-C) while the fit runs in the main thread:
            the step under way is finished, the state committed to the checkpoint, and
            :class:`~gpchol._fit.signals.FitInterrupted` (a ``KeyboardInterrupt``) raised;
            running the same fit again resumes from there. A second Ctrl-C before the
            step ends raises at once, leaving the last committed checkpoint.
        SystemExit: on ``SIGTERM``, likewise after the commit:
            :class:`~gpchol._fit.signals.FitTerminated` (a ``SystemExit`` with code 143;
            uncaught, the program exits with status 143 without a traceback).

    Signal handlers are installed only while the fit runs and only from the main thread;
    the previous ones are restored when it ends. A caller's own Python handler is called
    at the step boundary (after the commit) instead of raising; ignored signals stay
    ignored.

    Example:
        >>> import jax, jax.numpy as jnp, numpy as np
        >>> from gpchol import kernels, Positive
        >>> from gpchol import GaussianProcess
        >>> from gpchol import fit
        >>> X = jnp.linspace(0.0, 5.0, 30)
        >>> y = jnp.sin(X) + 0.1 * jnp.asarray(np.random.default_rng(0).normal(size=30))
        >>> def build(p):
        ...     return GaussianProcess(p["amp"] * kernels.ExpSquared(p["ls"]), X,
        ...                            noise=p["noise"])
        >>> p0 = {"amp": 1.0, "ls": 1.0, "noise": 0.1}
        >>> t = {"amp": Positive(), "ls": Positive(), "noise": Positive()}
        >>> res = fit(build, p0, y, transforms=t, steps=50, progress=False)
        >>> res.log_marginal_likelihood > float(build(p0).log_marginal_likelihood(y))
        True
    """
    check_fit_settings(
        steps=steps,
        restarts=restarts,
        patience=patience,
        checkpoint_every=checkpoint_every,
        tol=tol,
    )
    bucket = check_bucket(bucket)
    restart_scale = check_number(restart_scale, "restart_scale")
    opt_name, opt = make_optimizer(optimizer, learning_rate)
    params = floating_params(params)
    if transforms is None:
        transforms = default_transforms(params)
    loss_u = unconstrained_loss(build_or_loss, y, transforms)
    u0 = canonical(to_unconstrained(params, transforms))
    raw_key = default_key_data() if key is None else key_data(key)
    fp = None
    if checkpoint is not None:
        fp = fit_fingerprint(
            build_or_loss=build_or_loss,
            params=params,
            y=y,
            u0=u0,
            loss_u=loss_u,
            transforms=transforms,
            optimizer=opt_name,
            learning_rate=learning_rate,
            opt_state=opt.init(u0),
            steps=steps,
            tol=tol,
            patience=patience,
            restarts=restarts,
            restart_scale=restart_scale,
            key=raw_key,
            user=fingerprint,
        )
    warm = None if warm_start is None else _warm_state(warm_start, opt_name, u0, opt.init(u0))
    opt_key = optimizer_key(optimizer, learning_rate)
    if y is not None:
        program = gp_program(build_or_loss, y, transforms, u0, opt_key, opt, bucket)
    else:
        program = loss_program(build_or_loss, transforms, u0, opt_key, opt)
    plan = FitPlan(
        optimizer=opt_name,
        init_opt_state=opt.init,
        step_fn=make_step(opt, loss_u) if program is None else program,
        transforms=transforms,
        u0=u0,
        restart_scale=restart_scale,
        steps=int(steps),
        restarts=int(restarts),
        tol=tol,
        patience=patience,
        callback=callback,
        checkpoint=None if checkpoint is None else os.fspath(checkpoint),
        checkpoint_every=int(checkpoint_every),
        fingerprint=fp,
        warm_opt_state=warm,
    )
    label = f"gpchol fit [{opt_name}]"
    with fit_session(
        plan.checkpoint,
        fingerprint=fp,
        optimizer=opt_name,
        progress=progress,
        steps=plan.steps,
        label=label,
    ) as session:
        state = session.resumed(resume, plan.u0, plan.init_opt_state) or _first_state(plan, raw_key)
        while state.restart < plan.n_starts:
            if plan.n_starts > 1:
                session.bar.label = f"{label} start {state.restart + 1}/{plan.n_starts}"
            _run_start(plan, state, session)
        _deliver(plan, state, session, saved=True)  # a signal during the last commit
    return _result(plan, state, has_y=y is not None)


# ------------------------------------------------------------------- the driver's parts


def _start_point(plan: FitPlan, key: np.ndarray, r: int) -> Any:
    """Start ``r``'s unconstrained parameters: ``u0``, or ``u0 + restart_scale * N(0, 1)``."""
    if r == 0:
        return plan.u0
    k = jax.random.fold_in(jnp.asarray(key), r)
    leaves, treedef = jax.tree_util.tree_flatten(plan.u0)
    keys = jax.random.split(k, max(1, len(leaves)))
    moved = [
        x + plan.restart_scale * jax.random.normal(kk, jnp.shape(x), dtype=jnp.result_type(x))
        for x, kk in zip(leaves, keys, strict=False)
    ]
    return canonical(jax.tree_util.tree_unflatten(treedef, moved))


def _warm_state(warm_start: Any, opt_name: str, u0: Any, fresh: Any) -> Any:
    """The first start's optimiser state taken from ``warm_start``, checked against this
    fit's parameters ``u0`` and ``fresh`` optimiser state; L-BFGS's evaluation in it is of
    the earlier loss: dropped (the start evaluates anew)."""
    if not isinstance(warm_start, FitResult):
        raise TypeError(
            f"warm_start must be the FitResult of an earlier gpchol.fit; got "
            f"{type(warm_start).__name__}."
        )
    prior = warm_start.optimizer_state
    if prior is None:
        raise ValueError(
            "warm_start holds no optimiser state (a result of `gpchol fit --group`, or one "
            "saved by a gpchol before optimizer_state): fit once without warm_start and "
            "warm-start from that result."
        )
    # The state's structure names its optimiser's state classes: two optax optimisers
    # with the same leaves (SGD's momentum, RMSprop's squares) differ there, and "adam"
    # and optax.adam(...) agree. A result from before the structure was recorded is
    # trusted only between gpchol's own optimisers of one name.
    theirs, ours = warm_start.optimizer_state_tree, describe_structure(fresh)
    if theirs is None and (warm_start.optimizer != opt_name or opt_name not in OWN_OPTIMIZERS):
        raise ValueError(
            f"warm_start (optimizer={warm_start.optimizer!r}) was saved without its "
            "optimiser state's structure, so it cannot be checked against this fit's "
            f"optimizer ({opt_name!r}): fit once without warm_start and warm-start from "
            "that result."
        )
    if theirs is not None and theirs != ours:
        raise ValueError(
            "warm_start's optimiser state belongs to another optimiser (its state is "
            f"{theirs}, this fit's {ours}): pass the optimizer of that fit, or no "
            "warm_start."
        )
    what = _layout_difference(warm_start.unconstrained_params, u0)
    if what is not None:
        raise ValueError(
            f"warm_start's parameters differ from this fit's: {what}{_x64_hint(what)}. "
            "Warm-start only a fit "
            "of the same parameters (the same tree, shapes and dtypes); to start at its "
            "values alone, pass warm_start.params as params without warm_start."
        )
    leaves, tree = jax.tree_util.tree_flatten(fresh)
    what = _layout_difference(list(prior), leaves)
    if what is not None:
        raise ValueError(
            f"warm_start's optimiser state does not fit this fit's optimiser: {what} "
            "(another optimiser, or other settings of it); pass the optimizer of that fit, "
            "or no warm_start."
        )
    state = jax.tree_util.tree_unflatten(tree, list(prior))
    if isinstance(state, LBFGSState):
        state = state._replace(known=np.zeros((), bool))
    return canonical(state)


def _x64_hint(what: str) -> str:
    """A hint where float64 meets float32: JAX's 64-bit mode differs between the fits."""
    if "float64" in what and "float32" in what:
        return " (is jax_enable_x64 set in one process and not the other?)"
    return ""


def _has_pairs(st: LBFGSState) -> bool:
    # read on the host: a comparison of a JAX array (the compiled step's state) would
    # compile a program of its own
    return int(np.asarray(st.n_pairs)) > 0


def _layout_difference(theirs: Any, ours: Any) -> str | None:
    """The first difference of tree, shape or dtype between two pytrees of arrays, in
    words (``None``: the same layout)."""
    (a, tree_a), (b, tree_b) = (jax.tree_util.tree_flatten_with_path(t) for t in (theirs, ours))
    if tree_a != tree_b:  # type: ignore[operator]  # (JAX's stubs type it loosely)
        return f"another tree ({tree_a} there, {tree_b} here)"
    for (path, x), (_, y) in zip(a, b, strict=True):
        sx, sy = (np.shape(x), np.asarray(x).dtype), (np.shape(y), np.asarray(y).dtype)
        if sx != sy:
            where = jax.tree_util.keystr(path) or "the parameters"
            return f"{where} is {sx[1]} of shape {sx[0]} there, {sy[1]} of shape {sy[0]} here"
    return None


def _begin_start(plan: FitPlan, state: FitState, r: int) -> None:
    """Sets ``state`` to the beginning of start ``r``: a fresh optimiser state, or the
    ``warm_start``'s for the first start."""
    u = _start_point(plan, state.key, r)
    warm = plan.warm_opt_state if r == 0 else None
    state.begin_start(u, canonical(plan.init_opt_state(u)) if warm is None else warm)


def _first_state(plan: FitPlan, key: np.ndarray) -> FitState:
    """The beginning of the first start."""
    state = FitState(params=None, opt_state=None, key=key)
    _begin_start(plan, state, 0)
    return state


def _deliver(plan: FitPlan, state: FitState, session: FitSession, *, saved: bool) -> None:
    """On a pending SIGINT/SIGTERM: commits the state (unless ``saved``), then raises."""
    if session.guard.pending is None:
        return
    if not saved:
        session.commit(state)
    where = (
        f"after step {state.step} of start {state.restart + 1}"
        if state.restart < plan.n_starts
        else "after its last start"
    )
    session.guard.deliver("fit", where)


def _run_steps(plan: FitPlan, state: FitState, session: FitSession) -> None:
    """Steps the current start until it stops or reaches ``steps``.

    A step whose loss or gradient is not finite is not taken: the start stops with the
    parameters of the last finite step kept in ``state.last_good``. A pending signal is
    delivered between two steps, after the state is committed.
    """
    while not state.done and state.step < plan.steps:
        _deliver(plan, state, session, saved=False)
        try:
            u_new, s_new, value, grad_ok = plan.step_fn(state.params, state.opt_state)
            v = float(value)
        except Exception as e:  # a second signal raised inside a callback of the step
            forced = session.guard.forced_exception()
            if forced is not None:
                raise forced from e
            raise
        if not (math.isfinite(v) and bool(grad_ok)):
            _stop_nonfinite(state, v)
            return
        prev = state.history[-1] if state.history else None
        state.history.append(v)
        state.last_good = state.params
        state.params, state.opt_state = u_new, s_new
        if isinstance(s_new, LBFGSState) and _has_pairs(s_new):
            state.last_pairs = s_new
        state.step += 1
        session.bar.update(state.step, v)
        _check_stop(plan, state, prev, v)
        if state.step % plan.checkpoint_every == 0 or state.done:
            session.commit(state)


def _run_start(plan: FitPlan, state: FitState, session: FitSession) -> None:
    """Runs the current start to its end, records it and checkpoints the next one."""
    _run_steps(plan, state, session)
    if state.stopped is None:
        state.stop(
            "steps",
            f"reached steps={plan.steps} without meeting tol={plan.tol:g}; raise steps "
            "or tol for a converged fit.",
        )
    session.bar.update(state.step, state.history[-1] if state.history else math.nan, force=True)
    session.bar.close()
    _end_start(plan, state)
    session.commit(state)


def _initial_not_finite(v: float) -> ValueError:
    return ValueError(
        f"the loss or its gradient at the initial parameters is not finite "
        f"(loss {v}): the model cannot be evaluated there (a covariance that "
        "is not positive definite?). Try: jitter on the model "
        "(GaussianProcess(..., jitter=(1e-8, 1e-6, 1e-4))), float64, or "
        "other initial values."
    )


def _stop_nonfinite(state: FitState, v: float) -> None:
    if state.restart == 0 and state.step == 0:
        raise _initial_not_finite(v)
    what = "loss" if not math.isfinite(v) else "gradient"
    state.stop(
        "nonfinite",
        f"stopped at step {state.step + 1}: the {what} became non-finite (loss {v}). "
        + _NONFINITE_HINT,
    )


def _check_stop(plan: FitPlan, state: FitState, prev: float | None, v: float) -> None:
    """After a step with loss ``v`` (``prev`` before it): the callback, then the tolerance."""
    if plan.callback is not None:
        params = to_constrained(state.last_good, plan.transforms)
        if plan.callback(state.step, params, v) is True:
            state.stop("callback", f"stopped by the callback after {state.step} steps.")
    state.stall = int(next_stall(state.stall, math.nan if prev is None else prev, v, plan.tol))
    if not state.done and state.stall >= plan.patience:
        state.stop(
            "converged",
            f"converged after {state.step} steps (relative loss change below "
            f"tol={plan.tol:g} for {plan.patience} steps).",
        )


def _loss_at(plan: FitPlan, u: Any, opt_state: Any) -> float:
    """The loss at ``u``: L-BFGS's state holds it when its last evaluation was at ``u``
    (the step would read it from there too); else one step's loss at its start."""
    if isinstance(opt_state, LBFGSState) and bool(opt_state.known):
        x = host_ravel(u)[0].astype(np.asarray(opt_state.x).dtype)
        if np.array_equal(x, np.asarray(opt_state.x)):
            return float(opt_state.value)
    return float(plan.step_fn(u, opt_state)[2])


def _end_start(plan: FitPlan, state: FitState) -> None:
    """Records how the current start ended, keeps the best, moves to the next start.

    The start's result is its final parameters if their loss is finite, else the last
    parameters with a finite loss. After the last start the state holds the best start's
    parameters (with a fresh optimiser state), so a finished checkpoint resumes to them.
    """
    r = state.restart
    final_loss = _loss_at(plan, state.params, state.opt_state)
    if r == 0 and state.step == 0 and not math.isfinite(final_loss):  # steps=0
        raise _initial_not_finite(final_loss)
    success = state.stopped != "nonfinite"
    if success and not math.isfinite(final_loss):
        success = False
        state.message = "the last update produced a non-finite loss. " + _NONFINITE_HINT
    # history[-1] is the loss at last_good (no step taken: the start's own values)
    taken = state.last_good is not None
    _, final_u, final_loss = keep_last_good(
        not success,
        final_loss,
        state.params,
        state.history[-1] if taken else final_loss,
        state.last_good if taken else state.params,
    )
    state.restart_losses.append(final_loss)
    record = StartRecord(
        loss=final_loss,
        history=list(state.history),
        n_steps=state.step,
        converged=state.stopped == "converged",
        success=success,
        message=state.message,
        restart=r,
    )
    if better_start(final_loss, None if state.best is None else state.best.loss):
        state.best, state.best_params = record, final_u
        # L-BFGS's last state with pairs is its final one unless the search cleared them
        last = state.last_pairs
        state.best_opt_state = state.opt_state if last is None else last
    state.restart = r + 1
    if state.restart < plan.n_starts:
        _begin_start(plan, state, state.restart)
    else:
        state.params = state.best_params
        state.opt_state = state.best_opt_state
        if state.opt_state is None:  # the best start ended before a resume
            state.opt_state = canonical(plan.init_opt_state(state.best_params))


def _result(plan: FitPlan, state: FitState, *, has_y: bool) -> FitResult:
    best = state.best
    if best is None:  # every finished fit has ended at least one start
        raise RuntimeError("fit ended without a finished start (a damaged checkpoint?).")
    message = best.message
    if plan.n_starts > 1:
        message += (
            f" Best of {plan.n_starts} starts (start {best.restart + 1}); final losses: "
            + ", ".join(f"{x:.6g}" for x in state.restart_losses)
            + "."
        )
    loss = float(best.loss)
    # JAX arrays for the caller (the host-driven search steps NumPy parameters)
    device_params = jax.tree_util.tree_map(jax.device_put, state.best_params)
    return FitResult(
        params=to_constrained(device_params, plan.transforms),
        loss=loss,
        log_marginal_likelihood=-loss if has_y else None,
        history=np.asarray(best.history, np.float64),
        n_steps=int(best.n_steps),
        converged=bool(best.converged),
        success=bool(best.success),
        message=message,
        unconstrained_params=device_params,
        restart_losses=[float(x) for x in state.restart_losses],
        optimizer=plan.optimizer,
        optimizer_state=jax.tree_util.tree_leaves(state.opt_state),
        optimizer_state_tree=describe_structure(state.opt_state),
    )
