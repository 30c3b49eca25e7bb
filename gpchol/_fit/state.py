"""The state of a fit between two steps: what a checkpoint stores and a resume restores.

:class:`FitState` holds the current start's parameters (unconstrained) and optimiser
state, its step counter and loss history, the last parameters with a finite loss, how the
start is stopping, the best start so far (:class:`StartRecord` and its parameters), the
final loss of every finished start and the random key of the restarts. The driver
(:mod:`gpchol._fit.driver`) mutates it step by step; :mod:`gpchol._fit.checkpoint` writes
and reads it.

Example:
    >>> import jax.numpy as jnp, numpy as np
    >>> from gpchol._fit.state import FitState
    >>> st = FitState(params=jnp.zeros(2), opt_state=(), key=np.zeros(2, np.uint32))
    >>> st.step, st.history, st.done
    (0, [], False)
    >>> st.stop("steps", "reached steps=0")
    >>> st.done, st.stopped
    (True, 'steps')
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "FitState",
    "StartRecord",
    "Stopped",
    "better_start",
    "canonical",
    "keep_last_good",
    "key_data",
    "next_stall",
]

Stopped = Literal["converged", "nonfinite", "callback", "steps"]
"""Why a start stopped."""


def next_stall(stall: Any, prev: Any, value: Any, tol: float) -> Any:
    """The stopping rule of :func:`gpchol.fit` and :func:`gpchol.fit_batched`: how many
    steps in a row have changed the loss by at most ``tol`` relative to ``max(1, |f_k|)``.

    A fit stops as converged once this reaches its ``patience``. Written once for the
    Python loop (floats) and the compiled one (JAX arrays, one per problem).

    Args:
        stall: the count before this step.
        prev: the loss before this step, ``f_{k-1}`` (NaN before the first step: no change
            to measure, the count restarts at 0).
        value: the loss after it, ``f_k``.
        tol: the relative tolerance.

    Returns:
        The new count, ``stall + 1`` or ``0`` (NumPy for floats, JAX for JAX arrays).

    Example:
        >>> from gpchol._fit.state import next_stall
        >>> int(next_stall(2, 10.0, 10.0 - 1e-12, 1e-9)), int(next_stall(2, 10.0, 9.0, 1e-9))
        (3, 0)
    """
    xp = jnp if isinstance(value, jax.Array) or isinstance(prev, jax.Array) else np
    small = xp.abs(prev - value) <= tol * xp.maximum(1.0, xp.abs(value))
    return xp.where(small, stall + 1, 0)


def keep_last_good(failed: Any, loss: Any, u: Any, good_loss: Any, good_u: Any) -> Any:
    """A start's result: its final parameters ``u`` and their ``loss``, unless a step failed
    (``failed``: a non-finite loss or gradient stopped it) or that loss is not finite; then
    the last parameters with a finite loss (``good_u``, ``good_loss``). The rule of
    :func:`gpchol.fit` (Python values) and of :func:`gpchol.fit_batched` (traced, per
    problem).

    Returns:
        ``(bad, u, loss)``: whether the last good parameters were taken, and the result.

    Example:
        >>> from gpchol._fit.state import keep_last_good
        >>> keep_last_good(False, float("nan"), "final", 3.0, "good")
        (True, 'good', 3.0)
    """
    if isinstance(failed, jax.Array) or isinstance(loss, jax.Array):
        bad = failed | ~jnp.isfinite(loss)
        pick = jax.tree_util.tree_map(lambda a, b: jnp.where(bad, a, b), good_u, u)
        return bad, pick, jnp.where(bad, good_loss, loss)
    bad = bool(failed) or not math.isfinite(loss)
    return (True, good_u, good_loss) if bad else (False, u, loss)


def better_start(loss: float, best: float | None) -> bool:
    """Whether a start that ended at ``loss`` replaces the best so far (``best``, ``None``
    before the first): the rule of :func:`gpchol.fit`'s restarts and of the scikit-learn
    estimator's. A finite loss beats a non-finite one and any higher loss; the first start
    is kept until one does.

    Example:
        >>> from gpchol._fit.state import better_start
        >>> better_start(3.0, None), better_start(3.0, float("nan")), better_start(3.0, 2.0)
        (True, True, False)
    """
    if best is None:
        return True
    return math.isfinite(loss) and (not math.isfinite(best) or loss < best)


@dataclasses.dataclass
class StartRecord:
    """How one start (the initial point or a restart) ended.

    Attributes:
        loss: its final loss (the last finite one when it ended on a non-finite step).
        history: ``(n_steps,)`` the loss at each step, as Python floats.
        n_steps: steps taken.
        converged: whether the tolerance test stopped it.
        success: False when it ended on a non-finite loss or gradient.
        message: a sentence on how it ended.
        restart: its index (0: the given initial point).

    Example:
        >>> from gpchol._fit.state import StartRecord
        >>> rec = StartRecord(1.5, [2.0, 1.5], 2, True, True, "converged", 0)
        >>> rec.meta()["n_steps"], "history" in rec.meta()
        (2, False)
    """

    loss: float
    history: list[float]
    n_steps: int
    converged: bool
    success: bool
    message: str
    restart: int

    def meta(self) -> dict[str, Any]:
        """Every field but the history (which a checkpoint stores as an array), JSON-ready."""
        return {
            "loss": self.loss,
            "n_steps": self.n_steps,
            "converged": self.converged,
            "success": self.success,
            "message": self.message,
            "restart": self.restart,
        }

    @classmethod
    def from_meta(cls, meta: dict[str, Any], history: list[float]) -> StartRecord:
        """The inverse of :meth:`meta`, given the history back."""
        return cls(
            loss=meta["loss"],
            history=history,
            n_steps=meta["n_steps"],
            converged=meta["converged"],
            success=meta["success"],
            message=meta["message"],
            restart=meta["restart"],
        )


@dataclasses.dataclass
class FitState:
    """Everything a fit holds between steps (all a checkpoint needs to resume exactly).

    Attributes:
        params: the current start's parameters (unconstrained space).
        opt_state: the optimiser state for ``params``.
        key: raw ``uint32`` data of the random key of the restarts.
        restart: index of the current start (``restarts + 1`` once all are done).
        step: steps taken in the current start.
        history: loss at each step of the current start.
        stall: consecutive steps whose relative loss change was below the tolerance.
        done: whether the current start has stopped.
        stopped: why it stopped (``None`` while it runs).
        message: a sentence on how it stopped.
        last_good: the parameters of the last step with a finite loss (``None`` before
            the first step of a start).
        best: how the best finished start ended (``None`` before the first ends).
        best_params: that start's final parameters (unconstrained space).
        best_opt_state: the optimiser state that start ended with (for
            :func:`gpchol.fit`'s ``warm_start``); L-BFGS's last one holding curvature
            pairs.
        last_pairs: the current start's last L-BFGS state holding curvature pairs (its
            search clears them after a step without decrease, as near a minimum reached
            to rounding).
        restart_losses: the final loss of every finished start, in order.
    """

    params: Any
    opt_state: Any
    key: np.ndarray
    restart: int = 0
    step: int = 0
    history: list[float] = dataclasses.field(default_factory=list)
    stall: int = 0
    done: bool = False
    stopped: Stopped | None = None
    message: str = ""
    last_good: Any = None
    best: StartRecord | None = None
    best_params: Any = None
    best_opt_state: Any = None
    last_pairs: Any = None
    restart_losses: list[float] = dataclasses.field(default_factory=list)

    def begin_start(self, params: Any, opt_state: Any) -> None:
        """Sets the current start's parameters and optimiser state; clears its counters."""
        self.params, self.opt_state, self.last_good = params, opt_state, None
        self.last_pairs = None
        self.step, self.history, self.stall = 0, [], 0
        self.done, self.stopped, self.message = False, None, ""

    def stop(self, why: Stopped, message: str) -> None:
        """Marks the current start as stopped, with the reason and a sentence."""
        self.stopped, self.message, self.done = why, message, True


def canonical(tree: Any) -> Any:
    """Every leaf as a concrete, strongly typed array (so saved == live bitwise).

    NumPy arrays are kept (they are concrete and strongly typed already: the host-driven
    L-BFGS keeps its state and parameters in NumPy); NumPy and Python scalars become 0-d
    NumPy arrays (a Python scalar in the dtype JAX gives it: ``jnp.asarray`` of a scalar
    compiles a program of its own); other leaves become committed JAX arrays of their own
    dtype.

    Args:
        tree: a pytree of arrays or scalars.

    Returns:
        The same pytree with each leaf a NumPy array or a committed JAX array.

    Example:
        >>> import jax.numpy as jnp
        >>> from gpchol._fit.state import canonical
        >>> out = canonical({"a": 1.0, "b": jnp.ones(2, jnp.float32)})
        >>> out["a"].dtype == jnp.result_type(float), out["b"].weak_type
        (True, False)
    """

    def one(x: Any) -> Any:
        if isinstance(x, np.ndarray):
            return x
        if isinstance(x, np.generic):
            return np.asarray(x)
        if isinstance(x, bool | int | float | complex):
            return np.asarray(x, dtype=jax.dtypes.canonicalize_dtype(type(x)))
        x = jnp.asarray(x)
        return jnp.asarray(np.asarray(x), dtype=x.dtype)

    return jax.tree_util.tree_map(one, tree)


def key_data(key: Any) -> np.ndarray:
    """The raw ``uint32`` data of a ``jax.random`` key (typed or legacy ``uint32``).

    Args:
        key: a key from ``jax.random.key`` or ``jax.random.PRNGKey``.

    Returns:
        A NumPy array of the key's data, e.g. shape ``(2,)`` for the default generator.

    Example:
        >>> import jax
        >>> from gpchol._fit.state import key_data
        >>> key_data(jax.random.key(0)).tolist() == key_data(jax.random.PRNGKey(0)).tolist()
        True
    """
    dtype = getattr(key, "dtype", None)
    if dtype is not None and jnp.issubdtype(dtype, jax.dtypes.prng_key):
        return np.asarray(jax.random.key_data(key))
    return np.asarray(key)


def default_key_data() -> np.ndarray:
    """The raw data of ``jax.random.PRNGKey(0)``, the key of a fit's restarts when none is
    given: ``[0, 0]`` for the default generator (threefry), taken without running JAX (an
    eager key would compile two small programs on every first fit); any other generator
    through JAX.

    Example:
        >>> import jax
        >>> from gpchol._fit.state import default_key_data, key_data
        >>> default_key_data().tolist() == key_data(jax.random.PRNGKey(0)).tolist()
        True
    """
    if getattr(jax.config, "jax_default_prng_impl", None) == "threefry2x32":
        return np.zeros(2, np.uint32)
    return key_data(jax.random.PRNGKey(0))
