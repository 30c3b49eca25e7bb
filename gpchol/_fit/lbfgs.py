r"""L-BFGS whose compiled step holds the loss once: a strong-Wolfe line search in one loop.

A step of L-BFGS with a line search evaluates the loss and its gradient a varying number
of times. optax's ``lbfgs`` (zoom line search) writes those evaluations at three places of
its step: the value and gradient at the current point (reused from the last line search
when it can), the line search's first trial, and its loop. Each place is traced, lowered
and compiled on its own, so the compiled step holds three copies of the loss and its
gradient; for a GP likelihood that is most of the fit's compile time. Here the step is one
``lax.while_loop`` with one evaluation in its body, a small state machine that first (when
the last step has not left them in the state) evaluates the current point, then runs the
line search; the compiled step holds the loss once.

The algorithm (Nocedal & Wright, *Numerical Optimization*, 2nd ed., 2006):

* Direction: ``d = -H g`` by the two-loop recursion (their Algorithm 7.4) over the last
  ``memory`` pairs ``s_k = x_{k+1} - x_k``, ``y_k = g_{k+1} - g_k`` (a pair is kept only
  when ``s_k . y_k > 0``), with the initial matrix ``gamma I``,
  ``gamma = s.y / y.y`` of the newest pair (their eq. 7.20); without pairs,
  ``gamma = min(1, 1 / |g|)``, so the first trial moves at most a unit distance. A
  direction that is not a descent direction (rounding) is replaced by that scaled
  steepest descent and the memory cleared.
* Step length: the strong Wolfe conditions with ``c1 = 1e-4``, ``c2 = 0.9``: bracketing
  from the trial ``t = 1``, doubling while the loss decreases and the slope stays
  negative, then zoom (their Algorithms 3.5 and 3.6) with the minimiser of the cubic
  through the bracket's ends (values and slopes), safeguarded to the inner 80 % of the
  bracket and replaced by bisection when it falls outside or an end is not finite (a
  trial where the loss or gradient is not finite counts as no decrease, so steps into a
  region where the covariance is not positive definite are backtracked). Sufficient
  decrease is also granted by the approximate Wolfe condition of Hager & Zhang (2005,
  SIAM J. Optim. 16(1), eq. 4.1): ``f(t) <= f(0) + 1e-6 |f(0)|`` and
  ``f'(t) <= (2 c1 - 1) f'(0)``, which, near a minimum, accepts steps whose decrease is
  below the loss's rounding.
* At most 20 evaluations per step. When they run out, the step goes to the trial with the
  lowest loss that met sufficient decrease; when there is none it does not move and clears
  the memory (the next step starts over from scaled steepest descent).

The accepted point's value and gradient stay in the state: the next step starts from them
without evaluating again (when it is given that same point).

Example:
    >>> import jax, jax.numpy as jnp
    >>> from gpchol._fit.lbfgs import LBFGS
    >>> opt = LBFGS()
    >>> loss = lambda u: jnp.sum((u["a"] - 3.0) ** 2) + 10.0 * (u["b"] + 1.0) ** 2
    >>> step = jax.jit(opt.make_step(loss))
    >>> u, s = {"a": jnp.zeros(2), "b": jnp.asarray(0.0)}, opt.init({"a": jnp.zeros(2),
    ...                                                                "b": jnp.asarray(0.0)})
    >>> for _ in range(10):
    ...     u, s, value, finite = step(u, s)
    >>> [round(float(x), 6) for x in (*u["a"], u["b"])]
    [3.0, 3.0, -1.0]
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

__all__ = ["LBFGS", "LBFGSState", "inverse_hessian_product", "search_direction"]

_C1 = 1e-4  # sufficient decrease
_C2 = 0.9  # curvature (strong Wolfe)
_APPROX = 1e-6  # Hager-Zhang's relative tolerance on f(0) for approximate Wolfe
_GROW = 2.0  # bracketing: the next trial is this many times the last
_MAX_T = 1e10  # no trial step beyond this

# the line search's stages
_EVAL0, _BRACKET, _ZOOM, _DONE = 0, 1, 2, 3


class LBFGSState(NamedTuple):
    """L-BFGS's state between steps (flattened parameters: ``P`` numbers; memory ``M``).

    Attributes:
        n_pairs: ``()`` int32, pairs stored since the memory was last cleared.
        s: ``(M, P)`` parameter differences (ring buffer; the newest at
            ``(n_pairs - 1) % M``).
        y: ``(M, P)`` gradient differences.
        rho: ``(M,)`` ``1 / (s . y)``.
        x: ``(P,)`` the last point whose loss and gradient were evaluated.
        value: ``()`` the loss there.
        grad: ``(P,)`` its gradient there.
        known: ``()`` bool, whether ``x``, ``value`` and ``grad`` hold an evaluation.
    """

    n_pairs: jax.Array
    s: jax.Array
    y: jax.Array
    rho: jax.Array
    x: jax.Array
    value: jax.Array
    grad: jax.Array
    known: jax.Array


def _dot(a: jax.Array, b: jax.Array) -> jax.Array:
    return jnp.vdot(a, b).real


def inverse_hessian_product(g: jax.Array, st: LBFGSState) -> jax.Array:
    """``H g`` by the two-loop recursion (Nocedal & Wright, Algorithm 7.4).

    ``H`` is the L-BFGS inverse-Hessian approximation: ``gamma I`` updated by BFGS with
    the stored pairs, oldest first, ``H <- (I - rho s y^T) H (I - rho y s^T) + rho s s^T``.

    Args:
        g: ``(P,)`` a gradient.
        st: the state holding the pairs (``min(n_pairs, M)`` of them).

    Returns:
        ``(P,)`` ``H g``.

    Example:
        >>> import jax.numpy as jnp
        >>> from gpchol._fit.lbfgs import LBFGS, inverse_hessian_product
        >>> st = LBFGS().init(jnp.zeros(2))
        >>> inverse_hessian_product(jnp.asarray([3.0, 4.0]), st).tolist()  # no pairs: g / |g|
        [0.6000000238418579, 0.800000011920929]
    """
    m = st.rho.shape[0]
    n_valid = jnp.minimum(st.n_pairs, m)
    newest = (st.n_pairs - 1) % m
    order = jnp.arange(m)

    def newest_first(q: jax.Array, i: jax.Array) -> tuple[jax.Array, jax.Array]:
        j = (newest - i) % m
        a = jnp.where(i < n_valid, st.rho[j] * _dot(st.s[j], q), 0.0)
        return q - a * st.y[j], a

    q, alphas = jax.lax.scan(newest_first, g, order)
    sy = _dot(st.s[newest], st.y[newest])
    yy = _dot(st.y[newest], st.y[newest])
    gamma = jnp.where(st.n_pairs > 0, sy / jnp.where(yy > 0, yy, 1.0), _first_scale(g))

    def oldest_first(r: jax.Array, ia: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, None]:
        i, a = ia
        j = (newest - i) % m
        b = st.rho[j] * _dot(st.y[j], r)
        return r + jnp.where(i < n_valid, a - b, 0.0) * st.s[j], None

    r, _ = jax.lax.scan(oldest_first, gamma * q, (order, alphas), reverse=True)
    return r


def _first_scale(g: jax.Array) -> jax.Array:
    """``min(1, 1 / |g|)``: the scaled steepest-descent step moves at most a unit distance."""
    norm = jnp.sqrt(_dot(g, g))
    return jnp.minimum(1.0, 1.0 / jnp.where(norm > 0, norm, 1.0))


def search_direction(g: jax.Array, st: LBFGSState) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The L-BFGS direction ``-H g``, or scaled steepest descent when that is not descent.

    Args:
        g: ``(P,)`` the gradient at the current point.
        st: the state holding the pairs.

    Returns:
        ``(d, g . d, cleared)``: ``(P,)`` the direction, its slope ``()`` and whether it
        was replaced by ``-min(1, 1 / |g|) g`` (then the memory is to be cleared).

    Example:
        >>> import jax.numpy as jnp
        >>> from gpchol._fit.lbfgs import LBFGS, search_direction
        >>> st = LBFGS().init(jnp.zeros(2))
        >>> d, slope, cleared = search_direction(jnp.asarray([0.0, 0.5]), st)
        >>> d.tolist(), float(slope), bool(cleared)
        ([-0.0, -0.5], -0.25, False)
    """
    d = -inverse_hessian_product(g, st)
    slope = _dot(g, d)
    descent = (slope < 0) & jnp.isfinite(slope)
    steepest = -_first_scale(g) * g
    d = jnp.where(descent, d, steepest)
    return d, jnp.where(descent, slope, _dot(g, steepest)), ~descent


def _cubic_step(
    a: jax.Array, fa: jax.Array, da: jax.Array, b: jax.Array, fb: jax.Array, db: jax.Array
) -> jax.Array:
    """The next zoom trial in the bracket ``[a, b]`` (either order).

    The minimiser of the cubic matching values and slopes at both ends (Nocedal & Wright,
    eq. 3.59), kept in the inner 80 % of the bracket; bisection otherwise.
    """
    d1 = da + db - 3.0 * (fa - fb) / (a - b)
    d2sq = d1 * d1 - da * db
    d2 = jnp.sign(b - a) * jnp.sqrt(jnp.maximum(d2sq, 0.0))
    t = b - (b - a) * (db + d2 - d1) / (db - da + 2.0 * d2)
    width = jnp.abs(b - a)
    lower = jnp.minimum(a, b) + 0.1 * width
    upper = jnp.maximum(a, b) - 0.1 * width
    good = (d2sq >= 0) & jnp.isfinite(t) & (t >= lower) & (t <= upper)
    good = good & jnp.isfinite(fa) & jnp.isfinite(fb) & jnp.isfinite(da) & jnp.isfinite(db)
    return jnp.where(good, t, 0.5 * (a + b))


class LBFGS:
    """L-BFGS with a strong-Wolfe line search, compiled with one copy of the loss.

    Args:
        memory: the number of pairs kept (``M``).
        learning_rate: ``None`` (the line search) or a fixed step: ``x + learning_rate * d``
            with the loss evaluated once per step.
        max_evaluations: the line search's limit of loss evaluations per step.

    Example:
        >>> import jax.numpy as jnp
        >>> from gpchol._fit.lbfgs import LBFGS
        >>> LBFGS().init(jnp.zeros(3)).s.shape
        (10, 3)
    """

    def __init__(
        self, memory: int = 10, learning_rate: float | None = None, max_evaluations: int = 20
    ) -> None:
        if int(memory) < 1:
            raise ValueError(f"memory must be an int >= 1; got {memory!r}.")
        if int(max_evaluations) < 1:
            raise ValueError(f"max_evaluations must be an int >= 1; got {max_evaluations!r}.")
        self.memory = int(memory)
        self.learning_rate = learning_rate
        self.max_evaluations = int(max_evaluations)

    def init(self, params: Any) -> LBFGSState:
        """The state before the first step at ``params`` (a pytree of floating arrays)."""
        x, _ = ravel_pytree(params)
        x = jnp.asarray(x)
        if not jnp.issubdtype(x.dtype, jnp.floating):
            x = x.astype(jnp.result_type(float))
        zeros = jnp.zeros((self.memory, x.shape[0]), x.dtype)
        return LBFGSState(
            n_pairs=jnp.zeros((), jnp.int32),
            s=zeros,
            y=zeros,
            rho=jnp.zeros((self.memory,), x.dtype),
            x=jnp.zeros_like(x),
            value=jnp.zeros((), x.dtype),
            grad=jnp.zeros_like(x),
            known=jnp.zeros((), bool),
        )

    def make_step(
        self, loss: Callable[[Any], jax.Array]
    ) -> Callable[[Any, LBFGSState], tuple[Any, LBFGSState, jax.Array, jax.Array]]:
        """``(params, state) -> (new params, new state, loss at params, gradient finite)``.

        Not jitted (the caller jits it, alone or inside its own loop).
        """
        if self.learning_rate is None:
            return self._line_search_step(loss)
        return self._fixed_step(loss)

    # ------------------------------------------------------------------ fixed step

    def _fixed_step(self, loss: Callable[[Any], jax.Array]) -> Callable[..., Any]:
        value_and_grad = jax.value_and_grad(loss)
        assert self.learning_rate is not None
        lr = float(self.learning_rate)

        def step(u: Any, st: LBFGSState) -> tuple[Any, LBFGSState, jax.Array, jax.Array]:
            x, unravel = ravel_pytree(u)
            x = x.astype(st.x.dtype)
            f, gt = value_and_grad(u)
            g = ravel_pytree(gt)[0].astype(x.dtype)
            grad_ok = jnp.all(jnp.isfinite(g))
            st = _push(st, x - st.x, g - st.grad, st.known)
            d, _, cleared = search_direction(g, st)
            st = st._replace(
                n_pairs=jnp.where(cleared, 0, st.n_pairs),
                x=x,
                value=f.astype(x.dtype),
                grad=g,
                known=jnp.isfinite(f) & grad_ok,
            )
            return unravel(x + lr * d), st, f, grad_ok

        return step

    # ------------------------------------------------------------------ line search

    def _line_search_step(self, loss: Callable[[Any], jax.Array]) -> Callable[..., Any]:
        value_and_grad = jax.value_and_grad(loss)
        max_evals = self.max_evaluations

        def step(u: Any, st: LBFGSState) -> tuple[Any, LBFGSState, jax.Array, jax.Array]:
            x, unravel = ravel_pytree(u)
            x = x.astype(st.x.dtype)

            def body(c: dict[str, Any]) -> dict[str, Any]:
                c, xt = _trial(c, st, x)
                f, gt = value_and_grad(unravel(xt))
                return _update(c, xt, f, ravel_pytree(gt)[0], max_evals)

            c = jax.lax.while_loop(lambda c: _running(c, max_evals), body, _start(x, st))
            x_new, st, f0, grad_ok = _finish(c, st, x)
            return unravel(x_new), st, f0, grad_ok

        return step

    # ------------------------------------------------------------ host-driven search

    def host_step(
        self,
        value_and_grad: Callable[[jax.Array, Any], tuple[jax.Array, jax.Array]],
        unravel: Callable[[jax.Array], Any] | None = None,
    ) -> Callable[[Any, LBFGSState, Any], tuple[Any, LBFGSState, jax.Array, jax.Array]]:
        """The line-search step driven from Python around a compiled value and gradient.

        The same algorithm as :meth:`make_step`'s, cut at the evaluations: the line
        search's bookkeeping is three small compiled programs that depend only on the
        number of parameters ``P`` (and the dtype, memory and evaluation limit), shared by
        every loss in the process, and the loss is compiled alone. A new model structure
        then compiles its value and gradient only, not the line search around it again.
        The price is one host synchronisation per evaluation (reading whether the search
        is done), small next to a loss that is worth compiling.

        Args:
            value_and_grad: ``(x (P,), data) -> (loss (), gradient (P,))``, compiled by
                the caller, over the flattened parameters ``x``.
            unravel: ``x (P,) -> params``, compiled by the caller (one call instead of
                a few eager operations per step); ``None``: the parameters' own, eager.

        Returns:
            ``(params, state, data) -> (new params, new state, loss at params, gradient
            finite)``, as :meth:`make_step`'s step with ``data`` passed to the loss.
            Not to be traced (it loops in Python).

        Example:
            >>> import jax, jax.numpy as jnp
            >>> from gpchol._fit.lbfgs import LBFGS
            >>> opt = LBFGS()
            >>> vg = jax.jit(jax.value_and_grad(lambda x, c: jnp.sum((x - c) ** 2)))
            >>> step = opt.host_step(vg)
            >>> u, s = jnp.zeros(2), opt.init(jnp.zeros(2))
            >>> for _ in range(5):
            ...     u, s, value, finite = step(u, s, jnp.asarray([1.0, -2.0]))
            >>> [round(float(v), 6) for v in u]
            [1.0, -2.0]
        """
        max_evals = self.max_evaluations
        # the flat parameters of the last step's result: the next step, given them back,
        # does not flatten them again (eager concatenations)
        last: dict[str, Any] = {}

        def flat(u: Any) -> tuple[jax.Array, Callable[[jax.Array], Any]]:
            leaves = jax.tree_util.tree_leaves(u)
            mine = last.get("leaves")
            if mine is not None and len(mine) == len(leaves):
                if all(a is b for a, b in zip(mine, leaves, strict=True)):
                    return last["x"], last["unravel"]
            return ravel_pytree(u)

        def step(u: Any, st: LBFGSState, data: Any) -> tuple[Any, LBFGSState, jax.Array, jax.Array]:
            x, own = flat(u)
            back = own if unravel is None else unravel
            # the first call starts the search (the carry passed in only gives its
            # structure); each next one takes an evaluation. The result is the step's
            # outcome as of the last evaluation, read once the search stops.
            c, xt, running, out = _host_search(
                _blank(x, st), st, x, x, st.value, st.grad, True, max_evals
            )
            while bool(running):
                f, g = value_and_grad(xt, data)
                c, xt, running, out = _host_search(c, st, x, xt, f, g, False, max_evals)
            x_new, st, f0, grad_ok = out
            u_new = back(x_new)
            last.update(leaves=jax.tree_util.tree_leaves(u_new), x=x_new, unravel=own)
            return u_new, st, f0, grad_ok

        return step


def _start(x: jax.Array, st: LBFGSState) -> dict[str, Any]:
    """The line search's carry at ``x``: without a cached evaluation of ``x`` in the state,
    the first pass evaluates ``x`` itself (``t = 0``, ``d = 0``)."""
    dt = x.dtype
    zero = jnp.zeros((), dt)
    cached = st.known & jnp.all(st.x == x)
    inf = jnp.full((), jnp.inf, dt)
    return {
        "stage": jnp.where(cached, _BRACKET, _EVAL0).astype(jnp.int32),
        "it": jnp.zeros((), jnp.int32),
        "t": jnp.where(cached, 1.0, 0.0).astype(dt),
        "f0": st.value,
        "g0": st.grad,
        "need_direction": cached,
        "d": jnp.zeros_like(x),
        "slope0": -jnp.ones((), dt),
        "cleared": jnp.zeros((), bool),
        "lo": (zero, st.value, zero),
        "hi": (zero, inf, zero),
        "safe": (zero, inf, x, st.grad),
        "out": (zero, st.value, x, st.grad),
        "ok": jnp.zeros((), bool),
    }


def _running(c: dict[str, Any], max_evals: int) -> jax.Array:
    return (c["stage"] != _DONE) & (c["it"] < max_evals + 1)


def _trial(c: dict[str, Any], st: LBFGSState, x: jax.Array) -> tuple[dict[str, Any], jax.Array]:
    """The carry with its direction (computed once ``g0`` is known, in one place of the
    program, and only at a step's first trial: under vmap a cond runs both branches) and
    the next point to evaluate."""
    c = jax.lax.cond(c["need_direction"], lambda c: _with_direction(c, st), lambda c: c, c)
    return c, x + c["t"] * c["d"]


def _update(
    c: dict[str, Any], xt: jax.Array, f: jax.Array, g: jax.Array, max_evals: int
) -> dict[str, Any]:
    """The carry after the evaluation ``(f, g)`` at ``xt``."""
    dt = xt.dtype
    f, g = f.astype(dt), g.astype(dt)
    finite = jnp.isfinite(f) & jnp.all(jnp.isfinite(g))
    return jax.lax.cond(
        c["stage"] == _EVAL0,
        lambda c: _after_first(c, f, g, finite),
        lambda c: _after_trial(c, xt, f, g, finite, max_evals),
        c,
    )


def _finish(
    c: dict[str, Any], st: LBFGSState, x: jax.Array
) -> tuple[jax.Array, LBFGSState, jax.Array, jax.Array]:
    """``(new x, new state, loss at x, gradient finite)`` once the search has stopped: the
    accepted trial; else the lowest trial with sufficient decrease; else no move."""
    use_safe = ~c["ok"] & (c["safe"][0] > 0)
    moved = c["ok"] | use_safe
    _, f_fin, x_fin, g_fin = jax.tree_util.tree_map(
        lambda a, b: jnp.where(c["ok"], a, b), c["out"], c["safe"]
    )
    x_new = jnp.where(moved, x_fin, x)
    f_new = jnp.where(moved, f_fin, c["f0"])
    g_new = jnp.where(moved, g_fin, c["g0"])
    grad_ok = jnp.all(jnp.isfinite(c["g0"]))
    st = st._replace(n_pairs=jnp.where(c["cleared"] | ~moved, 0, st.n_pairs))
    st = _push(st, x_new - x, g_new - c["g0"], moved)
    known = jnp.isfinite(c["f0"]) & grad_ok
    st = st._replace(x=x_new, value=f_new, grad=g_new, known=known)
    return x_new, st, c["f0"], grad_ok


# The host-driven search's programs: jitted once per process for each (P, dtype, memory,
# evaluation limit), whatever the loss.


def _blank(x: jax.Array, st: LBFGSState) -> dict[str, Any]:
    """A carry of the search's structure for ``x`` and ``st`` (its values unused), made
    once per (``P``, dtype, memory) in a process and reused."""
    key = (x.shape, jnp.dtype(st.x.dtype), st.rho.shape)
    c = _BLANKS.get(key)
    if c is None:
        c = _BLANKS[key] = _start_jit(x, st)
    return c


_BLANKS: dict[Any, dict[str, Any]] = {}


@jax.jit
def _start_jit(x: jax.Array, st: LBFGSState) -> dict[str, Any]:
    return _start(x.astype(st.x.dtype), st)


@partial(jax.jit, static_argnums=(7,))
def _host_search(
    c: dict[str, Any],
    st: LBFGSState,
    x: jax.Array,
    xt: jax.Array,
    f: jax.Array,
    g: jax.Array,
    fresh: Any,
    max_evals: int,
) -> tuple[dict[str, Any], jax.Array, jax.Array, Any]:
    """One turn of the host-driven search: start it (``fresh``) or take the evaluation
    ``(f, g)`` at ``xt``; then the outcome so far, and the next trial."""
    x = x.astype(st.x.dtype)
    c = jax.lax.cond(fresh, lambda c: _start(x, st), lambda c: _update(c, xt, f, g, max_evals), c)
    running = _running(c, max_evals)
    out = _finish(c, st, x)
    c, xt = _trial(c, st, x)
    return c, xt, running, out


def _push(st: LBFGSState, s: jax.Array, y: jax.Array, use: jax.Array) -> LBFGSState:
    """Stores the pair ``(s, y)`` when ``use`` and ``s . y > 0`` (kept positive definite)."""
    sy = _dot(s, y)
    keep = use & (sy > 0) & jnp.isfinite(sy) & jnp.all(jnp.isfinite(y))
    m = st.rho.shape[0]
    i = st.n_pairs % m
    return st._replace(
        n_pairs=jnp.where(keep, st.n_pairs + 1, st.n_pairs),
        s=jnp.where(keep, st.s.at[i].set(s), st.s),
        y=jnp.where(keep, st.y.at[i].set(y), st.y),
        rho=jnp.where(keep, st.rho.at[i].set(1.0 / jnp.where(keep, sy, 1.0)), st.rho),
    )


def _with_direction(c: dict[str, Any], st: LBFGSState) -> dict[str, Any]:
    """The carry with the direction at ``g0`` and the bracket's lower end ``t = 0``."""
    d, slope0, cleared = search_direction(c["g0"], st)
    zero = jnp.zeros_like(c["t"])
    return {
        **c,
        "d": d,
        "slope0": slope0,
        "cleared": cleared,
        "lo": (zero, c["f0"], slope0),
        "need_direction": jnp.zeros((), bool),
    }


def _after_first(
    c: dict[str, Any], f: jax.Array, g: jax.Array, finite: jax.Array
) -> dict[str, Any]:
    """The carry after evaluating the current point: its direction next, then the trial ``1``."""
    return {
        **c,
        "stage": jnp.where(finite, _BRACKET, _DONE).astype(jnp.int32),
        "t": jnp.ones_like(c["t"]),
        "f0": f,
        "g0": g,
        "need_direction": finite,
        "safe": (c["safe"][0], c["safe"][1], c["safe"][2], g),
        "out": (c["out"][0], f, c["out"][2], g),
    }


def _after_trial(
    c: dict[str, Any],
    xt: jax.Array,
    f: jax.Array,
    g: jax.Array,
    finite: jax.Array,
    max_evals: int,
) -> dict[str, Any]:
    """The carry after evaluating the trial ``t``: accept, bracket, zoom or give up."""
    t, f0, slope0 = c["t"], c["f0"], c["slope0"]
    slope = jnp.where(finite, _dot(g, c["d"]), jnp.inf)
    fv = jnp.where(finite, f, jnp.inf)
    armijo = fv <= f0 + _C1 * t * slope0
    approx = (fv <= f0 + _APPROX * jnp.abs(f0)) & (slope <= (2.0 * _C1 - 1.0) * slope0)
    decrease = finite & (armijo | approx)
    curvature = jnp.abs(slope) <= -_C2 * slope0
    accept = decrease & curvature
    here = (t, fv, slope)
    lo, hi = c["lo"], c["hi"]

    # bracketing (Nocedal & Wright, Algorithm 3.5)
    b_hi = ~decrease | ((lo[0] > 0) & (fv >= lo[1]))
    b_swap = ~b_hi & (slope >= 0)
    # zoom (Algorithm 3.6)
    z_hi = ~decrease | (fv >= lo[1])
    z_swap = ~z_hi & (slope * (hi[0] - lo[0]) >= 0)
    zooming = c["stage"] == _ZOOM
    to_hi = jnp.where(zooming, z_hi, b_hi)
    swap = jnp.where(zooming, z_swap, b_swap)
    expand = ~zooming & ~b_hi & ~b_swap

    def pick(*xs: Any) -> Any:
        return jax.tree_util.tree_map(
            lambda a, b, e: jnp.where(to_hi, a, jnp.where(swap, b, e)), *xs
        )

    new_lo = jax.tree_util.tree_map(lambda a, b: jnp.where(to_hi, a, b), lo, here)
    new_hi = pick(here, lo, hi)
    next_t = jnp.where(
        expand,
        jnp.minimum(_GROW * t, _MAX_T),
        _cubic_step(*new_lo, *new_hi),
    )
    it = c["it"] + 1
    width = jnp.abs(new_hi[0] - new_lo[0])
    stuck = (it >= max_evals) | (~expand & (width <= 1e-12 * jnp.maximum(new_hi[0], new_lo[0])))
    stuck = stuck | (expand & (t >= _MAX_T))
    better = decrease & (fv < c["safe"][1])
    return {
        **c,
        "stage": jnp.where(accept | stuck, _DONE, jnp.where(expand, _BRACKET, _ZOOM)).astype(
            jnp.int32
        ),
        "it": it,
        "t": next_t,
        "lo": new_lo,
        "hi": new_hi,
        "safe": jax.tree_util.tree_map(
            lambda a, b: jnp.where(better, a, b), (t, fv, xt, g), c["safe"]
        ),
        "out": jax.tree_util.tree_map(
            lambda a, b: jnp.where(accept, a, b), (t, fv, xt, g), c["out"]
        ),
        "ok": accept,
    }
