r"""Hyperparameter fitting: optax Adam / L-BFGS loops with transforms and checkpoints.

:func:`fit` minimises a loss over a plain pytree of parameters. The parameters are given
(and returned) in their natural, *constrained* space; a pytree prefix of
:class:`gpchol.Transform` objects maps them to an unconstrained space where the optimiser
runs (``Positive`` through softplus, ``Bounded`` through a scaled sigmoid, ``None`` for
the identity). Each step is one jitted call: the loss and its gradient (for a Gaussian
process, through gpchol's Cholesky adjoint) and the optimiser update.

Guarantees:

* A step whose loss or gradient is not finite never replaces the last good parameters:
  the fit stops, returns the parameters of the last finite step and says what happened
  and what to try in :attr:`FitResult.message`.
* With ``checkpoint=path`` the complete state (step, unconstrained parameters, optimiser
  state, history, restart index, RNG key) is written every ``checkpoint_every`` steps to
  ``path.json`` (metadata) and ``path.npz`` (arrays; read back with
  ``allow_pickle=False``), each atomically (temporary file + ``os.replace``). With
  ``resume=True`` a fit that finds its checkpoint continues from it and ends with exactly
  the result an uninterrupted fit gives (same jitted computations on the same numbers).

Example:
    >>> import jax.numpy as jnp
    >>> from gpchol._fit.driver import fit
    >>> from gpchol._base.transforms import Positive
    >>> res = fit(lambda p: (p["s"] - 2.0) ** 2, {"s": 1.0}, transforms={"s": Positive()},
    ...           optimizer="lbfgs", steps=50, progress=False)
    >>> round(float(res.params["s"]), 4), res.converged
    (2.0, True)
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from gpchol._base.io import file_sha256, load_json, load_npz, save_json_atomic, save_npz_atomic
from gpchol._base.transforms import to_constrained, to_unconstrained
from gpchol.kernels._library import Kernel
from gpchol.means import Mean

__all__ = ["FitResult", "fit"]

_CHECKPOINT_VERSION = 1


@dataclasses.dataclass
class FitResult:
    """What :func:`fit` returns.

    Attributes:
        params: the fitted parameters, constrained space, same pytree as the input.
        loss: the final loss (for a GP: the negative log marginal likelihood).
        log_marginal_likelihood: ``-loss`` when fitting a GP (``y`` given), else ``None``.
        history: ``(n_steps,)`` float64 loss at each step (of the best restart).
        n_steps: number of optimiser steps taken (of the best restart).
        converged: whether the tolerance test stopped the fit.
        success: False when the fit stopped on a non-finite loss or gradient.
        message: a sentence on how the fit ended (and what to try when it failed).
        unconstrained_params: the optimiser's parameters (unconstrained space).
        restart_losses: final loss of each start (the first is the given initial point).
        optimizer: the optimiser's name.

    Example:
        >>> from gpchol._fit.driver import fit
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

    def __repr__(self) -> str:
        return (
            f"FitResult(loss={self.loss:.8g}, n_steps={self.n_steps}, "
            f"converged={self.converged}, success={self.success}, message={self.message!r})"
        )


# ----------------------------------------------------------------------------- helpers


def default_transforms(params: Any) -> Any:
    """Transforms for a parameter pytree: a kernel's or mean's own, identity elsewhere.

    Args:
        params: a pytree of parameters.

    Returns:
        A pytree prefix of ``params`` of transforms (``None`` = identity). Kernels get
        :meth:`gpchol.kernels.Kernel.default_transforms` (positive lengthscales,
        variances, ...). Plain leaves (e.g. a ``"noise"`` entry of a dict) get the identity:
        pass ``transforms`` explicitly to constrain them.

    Example:
        >>> from gpchol import kernels
        >>> from gpchol._fit.driver import default_transforms
        >>> t = default_transforms({"k": kernels.ExpSquared(), "noise": 0.1})
        >>> print(t["k"].lengthscale, t["noise"])
        Positive(lower=0.0) None
    """

    def one(x):
        if isinstance(x, (Kernel, Mean)):
            return x.default_transforms()
        return None

    return jax.tree_util.tree_map(
        one, params, is_leaf=lambda x: isinstance(x, (Kernel, Mean)) or x is None
    )


def _canon(tree: Any) -> Any:
    """Every leaf as a concrete, strongly typed JAX array (so saved == live bitwise)."""

    def one(x):
        x = jnp.asarray(x)
        return jnp.asarray(np.asarray(x), dtype=x.dtype)

    return jax.tree_util.tree_map(one, tree)


def _leaves_to_np(tree: Any) -> list[np.ndarray]:
    return [np.asarray(x) for x in jax.tree_util.tree_leaves(tree)]


def _from_leaves(template: Any, leaves: list[np.ndarray], what: str) -> Any:
    t_leaves, treedef = jax.tree_util.tree_flatten(template)
    if len(t_leaves) != len(leaves):
        raise ValueError(
            f"checkpoint does not match this fit: its {what} has {len(leaves)} arrays, this "
            f"fit's has {len(t_leaves)}. Delete the checkpoint or pass resume=False."
        )
    out = []
    for t, a in zip(t_leaves, leaves, strict=True):
        t = jnp.asarray(t)
        if tuple(t.shape) != tuple(a.shape):
            raise ValueError(
                f"checkpoint does not match this fit: a {what} array has shape {a.shape}, "
                f"expected {tuple(t.shape)}. Delete the checkpoint or pass resume=False."
            )
        out.append(jnp.asarray(a, dtype=t.dtype))
    return jax.tree_util.tree_unflatten(treedef, out)


def _make_optimizer(optimizer: Any, learning_rate: float | None):
    if isinstance(optimizer, str):
        name = optimizer.lower()
        if name == "adam":
            return "adam", optax.adam(0.05 if learning_rate is None else learning_rate)
        if name in ("lbfgs", "l-bfgs"):
            return "lbfgs", optax.lbfgs(learning_rate=learning_rate)
        raise ValueError(
            f"optimizer must be 'adam', 'lbfgs' or an optax GradientTransformation; got "
            f"{optimizer!r}."
        )
    if isinstance(optimizer, optax.GradientTransformation):
        return type(optimizer).__name__, optimizer
    raise TypeError(
        "optimizer must be 'adam', 'lbfgs' or an optax GradientTransformation; got "
        f"{type(optimizer).__name__}."
    )


def _checkpoint_paths(path: str | os.PathLike) -> tuple[str, str]:
    base = os.fspath(path)
    for ext in (".json", ".npz"):
        if base.endswith(ext):
            base = base[: -len(ext)]
    return base + ".json", base + ".npz"


class _Progress:
    """A one-line progress display on stderr (``\\r`` updates on a terminal)."""

    def __init__(self, enabled: bool, steps: int, label: str):
        self.enabled = enabled
        self.steps = steps
        self.label = label
        self.tty = enabled and hasattr(sys.stderr, "isatty") and sys.stderr.isatty()
        self.last = 0.0
        self.every = max(1, steps // 10)
        self.width = 0
        self.printed = -1

    def update(self, step: int, loss: float, extra: str = "", force: bool = False):
        if not self.enabled:
            return
        now = time.perf_counter()
        line = f"{self.label} step {step}/{self.steps}  loss {loss:.10g}{extra}"
        if self.tty:
            if force or now - self.last > 0.1:
                pad = " " * max(0, self.width - len(line))
                sys.stderr.write("\r" + line + pad)
                sys.stderr.flush()
                self.width = len(line)
                self.last = now
        elif (force or step % self.every == 0) and step != self.printed:
            self.printed = step
            sys.stderr.write(line + "\n")
            sys.stderr.flush()

    def close(self):
        if self.enabled and self.tty and self.width:
            sys.stderr.write("\n")
            sys.stderr.flush()
            self.width = 0


_NONFINITE_HINT = (
    "The parameters of the last finite step were kept. Try: jitter on the model "
    "(GaussianProcess(..., jitter=(1e-8, 1e-6, 1e-4))), float64 "
    "(jax.config.update('jax_enable_x64', True)), bounds on the parameters (e.g. "
    "gpchol.Positive(lower=1e-4) on the noise, gpchol.Bounded(low, high) on lengthscales), "
    "or a smaller learning rate."
)


# --------------------------------------------------------------------------------- fit


def fit(
    build_or_loss: Callable[[Any], Any],
    params: Any,
    y: Any = None,
    *,
    transforms: Any = None,
    optimizer: Any = "lbfgs",
    steps: int = 200,
    learning_rate: float | None = None,
    tol: float = 1e-9,
    patience: int = 3,
    restarts: int = 0,
    key: Any = None,
    restart_scale: float = 1.0,
    checkpoint: str | os.PathLike | None = None,
    checkpoint_every: int = 10,
    resume: bool = True,
    progress: bool = True,
    callback: Callable[[int, Any, float], Any] | None = None,
) -> FitResult:
    r"""Fits parameters by minimising a loss (for a GP: the negative log marginal likelihood).

    Args:
        build_or_loss: with ``y`` given, ``params -> GaussianProcess`` (anything with
            ``.log_marginal_likelihood(y)``); the loss is ``-log p(y)``. With ``y=None``,
            ``params -> scalar loss`` to minimise. Must be traceable by ``jax.jit``.
        params: a pytree of initial parameter values (constrained space): dicts, lists,
            kernels, scalars, arrays.
        y: ``(n,)`` observations, or ``None`` when ``build_or_loss`` is a loss.
        transforms: a pytree prefix of ``params`` of :class:`gpchol.Transform` (``None``
            leaves: identity); default :func:`default_transforms`.
        optimizer: ``"lbfgs"`` (``optax.lbfgs`` with its zoom line search, the default),
            ``"adam"`` (``optax.adam``) or any optax ``GradientTransformation``.
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
        checkpoint: base path of the checkpoint files (``<path>.json`` + ``<path>.npz``);
            ``None``: no checkpoints.
        checkpoint_every: write the checkpoint every this many steps (and at the end).
        resume: continue from the checkpoint when it exists (else start over).
        progress: show a progress line with the current loss on stderr.
        callback: ``callback(step, params, loss)`` after each step (constrained
            parameters at which ``loss`` was evaluated); returning ``True`` stops the fit.

    Returns:
        A :class:`FitResult`.

    Raises:
        ValueError: on a bad argument, an initial value outside its transform's domain,
            a non-finite initial loss, or a checkpoint that does not match the fit.

    Example:
        >>> import jax, jax.numpy as jnp, numpy as np
        >>> from gpchol import kernels, Positive
        >>> from gpchol._gp.model import GaussianProcess
        >>> from gpchol._fit.driver import fit
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
    if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 0:
        raise ValueError(f"steps must be an int >= 0; got {steps!r}.")
    if isinstance(restarts, bool) or not isinstance(restarts, (int, np.integer)) or restarts < 0:
        raise ValueError(f"restarts must be an int >= 0; got {restarts!r}.")
    if not isinstance(checkpoint_every, (int, np.integer)) or checkpoint_every < 1:
        raise ValueError(f"checkpoint_every must be an int >= 1; got {checkpoint_every!r}.")
    if not (isinstance(tol, (int, float)) and tol >= 0):
        raise ValueError(f"tol must be a number >= 0; got {tol!r}.")
    opt_name, opt = _make_optimizer(optimizer, learning_rate)
    if transforms is None:
        transforms = default_transforms(params)

    if y is not None:
        y_arr = jnp.asarray(y)

        def loss_c(p):
            return -build_or_loss(p).log_marginal_likelihood(y_arr)

    else:
        loss_c = build_or_loss

    def loss_u(u):
        return jnp.asarray(loss_c(to_constrained(u, transforms))).reshape(())

    def all_finite(tree):
        leaves = jax.tree_util.tree_leaves(tree)
        if not leaves:
            return jnp.asarray(True)
        return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in leaves]))

    if opt_name == "lbfgs":
        vg = optax.value_and_grad_from_state(loss_u)

        def _step(u, s):
            v, g = vg(u, state=s)
            updates, s2 = opt.update(g, s, u, value=v, grad=g, value_fn=loss_u)
            return optax.apply_updates(u, updates), s2, v, all_finite(g)

    else:
        vg = jax.value_and_grad(loss_u)

        def _step(u, s):
            v, g = vg(u)
            updates, s2 = opt.update(g, s, u)
            return optax.apply_updates(u, updates), s2, v, all_finite(g)

    step_fn = jax.jit(_step)

    u0 = _canon(to_unconstrained(params, transforms))
    if key is None:
        key = jax.random.PRNGKey(0)
    key_np = np.asarray(jax.random.key_data(key) if _is_typed_key(key) else key)

    def start_point(r: int):
        if r == 0:
            return u0
        k = jax.random.fold_in(jnp.asarray(key_np), r)
        leaves, treedef = jax.tree_util.tree_flatten(u0)
        keys = jax.random.split(k, max(1, len(leaves)))
        moved = [
            x + restart_scale * jax.random.normal(kk, jnp.shape(x), dtype=jnp.result_type(x))
            for x, kk in zip(leaves, keys, strict=False)
        ]
        return _canon(jax.tree_util.tree_unflatten(treedef, moved))

    json_path, npz_path = _checkpoint_paths(checkpoint) if checkpoint is not None else (None,) * 2
    n_starts = restarts + 1

    # the run state (restored from a checkpoint when resuming)
    st = dict(
        restart=0,
        step=0,
        history=[],
        stall=0,
        done=False,
        stopped=None,  # None | "converged" | "nonfinite" | "callback" | "steps"
        message="",
        best=None,  # dict(loss, history, n_steps, converged, success, message, restart)
        restart_losses=[],
    )
    u = s = last_good = best_u = None
    resumed = False
    if json_path is not None and resume and os.path.exists(json_path):
        meta = load_json(json_path)
        if meta.get("version") != _CHECKPOINT_VERSION or meta.get("optimizer") != opt_name:
            raise ValueError(
                f"checkpoint {json_path} was written by a different fit (optimizer "
                f"{meta.get('optimizer')!r}, version {meta.get('version')}); delete it or pass "
                "resume=False."
            )
        if not os.path.exists(npz_path) or file_sha256(npz_path) != meta.get("npz_sha256"):
            raise ValueError(
                f"checkpoint arrays {npz_path} are missing or do not match {json_path} "
                "(an interrupted write of an old version?); delete both or pass resume=False."
            )
        arrays = load_npz(npz_path)
        st.update({k: meta[k] for k in st if k in meta})
        st["history"] = [float(x) for x in arrays["history"]]
        key_np = arrays["rng_key"]
        n_u = meta["n_param_leaves"]
        n_s = meta["n_state_leaves"]
        u = _from_leaves(u0, [arrays[f"u_{i}"] for i in range(n_u)], "parameters")
        s = _from_leaves(opt.init(u), [arrays[f"s_{i}"] for i in range(n_s)], "optimizer state")
        if meta.get("has_last_good"):
            last_good = _from_leaves(u0, [arrays[f"g_{i}"] for i in range(n_u)], "parameters")
        if st["best"] is not None:
            best_u = _from_leaves(u0, [arrays[f"b_{i}"] for i in range(n_u)], "parameters")
            st["best"]["history"] = [float(x) for x in arrays["best_history"]]
        resumed = True

    def save_checkpoint():
        if json_path is None:
            return
        arrays = {"history": np.asarray(st["history"], np.float64), "rng_key": key_np}
        for i, a in enumerate(_leaves_to_np(u)):
            arrays[f"u_{i}"] = a
        s_leaves = _leaves_to_np(s)
        for i, a in enumerate(s_leaves):
            arrays[f"s_{i}"] = a
        if last_good is not None:
            for i, a in enumerate(_leaves_to_np(last_good)):
                arrays[f"g_{i}"] = a
        best_meta = None
        if st["best"] is not None:
            for i, a in enumerate(_leaves_to_np(best_u)):
                arrays[f"b_{i}"] = a
            arrays["best_history"] = np.asarray(st["best"]["history"], np.float64)
            best_meta = {k: v for k, v in st["best"].items() if k != "history"}
        digest = save_npz_atomic(npz_path, arrays)
        meta = {k: v for k, v in st.items() if k not in ("history", "best")}
        meta.update(
            version=_CHECKPOINT_VERSION,
            optimizer=opt_name,
            npz_sha256=digest,
            n_param_leaves=len(jax.tree_util.tree_leaves(u)),
            n_state_leaves=len(s_leaves),
            has_last_good=last_good is not None,
            best=best_meta,
            steps=int(steps),
            restarts=int(restarts),
        )
        save_json_atomic(json_path, meta)

    label = f"gpchol fit [{opt_name}]"
    bar = _Progress(progress, steps, label)
    try:
        while st["restart"] < n_starts:
            r = st["restart"]
            if not resumed or u is None:
                u = start_point(r)
                s = _canon(opt.init(u))
                last_good = None
                st.update(step=0, history=[], stall=0, done=False, stopped=None, message="")
            resumed = False
            bar.label = label + (f" start {r + 1}/{n_starts}" if n_starts > 1 else "")
            while not st["done"] and st["step"] < steps:
                u_new, s_new, v, g_ok = step_fn(u, s)
                v = float(v)
                if not (math.isfinite(v) and bool(g_ok)):
                    if r == 0 and st["step"] == 0:
                        raise ValueError(
                            f"the loss or its gradient at the initial parameters is not finite "
                            f"(loss {v}): the model cannot be evaluated there (a covariance that "
                            "is not positive definite?). Try: jitter on the model "
                            "(GaussianProcess(..., jitter=(1e-8, 1e-6, 1e-4))), float64, or "
                            "other initial values."
                        )
                    what = "loss" if not math.isfinite(v) else "gradient"
                    st["stopped"] = "nonfinite"
                    st["message"] = (
                        f"stopped at step {st['step'] + 1}: the {what} became non-finite "
                        f"(loss {v}). " + _NONFINITE_HINT
                    )
                    st["done"] = True
                    break
                prev = st["history"][-1] if st["history"] else None
                st["history"].append(v)
                last_good = u
                u, s = u_new, s_new
                st["step"] += 1
                bar.update(st["step"], v)
                if callback is not None:
                    if callback(st["step"], to_constrained(last_good, transforms), v) is True:
                        st["stopped"] = "callback"
                        st["message"] = f"stopped by the callback after {st['step']} steps."
                        st["done"] = True
                if prev is not None and abs(prev - v) <= tol * max(1.0, abs(v)):
                    st["stall"] += 1
                else:
                    st["stall"] = 0
                if not st["done"] and st["stall"] >= patience:
                    st["stopped"] = "converged"
                    st["message"] = (
                        f"converged after {st['step']} steps (relative loss change below "
                        f"tol={tol:g} for {patience} steps)."
                    )
                    st["done"] = True
                if st["step"] % checkpoint_every == 0 or st["done"]:
                    save_checkpoint()
            if st["stopped"] is None:
                st["stopped"] = "steps"
                st["message"] = (
                    f"reached steps={steps} without meeting tol={tol:g}; raise steps or tol "
                    "for a converged fit."
                )
            st["done"] = True
            bar.update(st["step"], st["history"][-1] if st["history"] else float("nan"), force=True)
            bar.close()

            # the result of this start: the final parameters if their loss is finite,
            # else the last parameters with a finite loss
            final_u, final_loss = u, float(step_fn(u, s)[2])
            success = st["stopped"] != "nonfinite"
            if not math.isfinite(final_loss):
                if last_good is not None:
                    final_u, final_loss = last_good, st["history"][-1]
                if success:
                    success = False
                    st["message"] = "the last update produced a non-finite loss. " + _NONFINITE_HINT
            elif st["stopped"] == "nonfinite" and last_good is not None:
                final_u, final_loss = last_good, st["history"][-1]
            st["restart_losses"].append(final_loss)
            cand = dict(
                loss=final_loss,
                history=list(st["history"]),
                n_steps=st["step"],
                converged=st["stopped"] == "converged",
                success=success,
                message=st["message"],
                restart=r,
            )
            prev_best = None if st["best"] is None else st["best"]["loss"]
            better = prev_best is None or (
                math.isfinite(final_loss)
                and (not math.isfinite(prev_best) or final_loss < prev_best)
            )
            if better:
                st["best"], best_u = cand, final_u
            st["restart"] = r + 1
            u = None
            if st["restart"] < n_starts:
                # state for the next start, so a checkpoint here resumes there
                u = start_point(st["restart"])
                s = _canon(opt.init(u))
                last_good = None
                st.update(step=0, history=[], stall=0, done=False, stopped=None, message="")
                resumed = True  # the next start's state is already set
            else:
                u, s = best_u, _canon(opt.init(best_u))
            save_checkpoint()
    except KeyboardInterrupt:
        bar.close()
        raise
    finally:
        bar.close()

    best = st["best"]
    message = best["message"]
    if n_starts > 1:
        message += (
            f" Best of {n_starts} starts (start {best['restart'] + 1}); final losses: "
            + ", ".join(f"{x:.6g}" for x in st["restart_losses"])
            + "."
        )
    loss = float(best["loss"])
    return FitResult(
        params=to_constrained(best_u, transforms),
        loss=loss,
        log_marginal_likelihood=-loss if y is not None else None,
        history=np.asarray(best["history"], np.float64),
        n_steps=int(best["n_steps"]),
        converged=bool(best["converged"]),
        success=bool(best["success"]),
        message=message,
        unconstrained_params=best_u,
        restart_losses=[float(x) for x in st["restart_losses"]],
        optimizer=opt_name,
    )


def _is_typed_key(key: Any) -> bool:
    try:
        return jnp.issubdtype(key.dtype, jax.dtypes.prng_key)
    except AttributeError:
        return False
