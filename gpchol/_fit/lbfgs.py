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
  through the bracket's ends (values and slopes), or the zero of the slopes' secant where
  the two values differ by less than the loss's rounding (``1e-6 |f(0)|``, below), clamped
  to the inner 80 % of the bracket; bisection when an end is not finite (a
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
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

__all__ = [
    "LBFGS",
    "LBFGSState",
    "host_ravel",
    "inverse_hessian_product",
    "search_direction",
]

_C1 = 1e-4  # sufficient decrease
_C2 = 0.9  # curvature (strong Wolfe)

_GROW = 2.0  # bracketing: the next trial is this many times the last
_MAX_T = 1e10  # no trial step beyond this

# the line search's stages
_EVAL0, _BRACKET, _ZOOM, _DONE = 0, 1, 2, 3


# approximate Wolfe (Hager & Zhang 2005) accepts f(t) <= f(0) + eps_f, eps_f = r |f(0)| for
# the loss's rounding: Hager-Zhang's r = 1e-6, at most sqrt(eps) of the dtype (1.5e-8 in
# float64). A GP loss sums ~n rounded terms, far above one ulp; but 1e-6 let a real rise
# through where |f(0)| is large (1e6 + a cubic climbed to its local maximum)
def _approx_tolerance(dtype: Any) -> float:
    return min(1e-6, float(np.sqrt(np.finfo(dtype).eps)))


#: an array of the search: JAX's (compiled, traced) or NumPy's (the host-driven search)
Arr = jax.Array | np.ndarray


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

    n_pairs: Arr
    s: Arr
    y: Arr
    rho: Arr
    x: Arr
    value: Arr
    grad: Arr
    known: Arr


class _JaxOps:
    """The array operations of the compiled search (traceable, vmappable)."""

    xp = jnp

    @staticmethod
    def cond(pred: Any, yes: Callable[[Any], Any], no: Callable[[Any], Any], c: Any) -> Any:
        return jax.lax.cond(pred, yes, no, c)

    @staticmethod
    def scan(f: Callable[..., Any], init: Any, xs: Any, reverse: bool = False) -> Any:
        return jax.lax.scan(f, init, xs, reverse=reverse)

    @staticmethod
    def set_row(a: Any, i: Any, v: Any) -> Any:
        return a.at[i].set(v)

    @staticmethod
    def where(pred: Any, yes: Any, no: Any) -> Any:
        return jnp.where(pred, yes, no)

    @staticmethod
    def all_finite(a: Any) -> Any:
        return jnp.all(jnp.isfinite(a))


class _NumpyOps:
    """The same operations on host NumPy arrays: the search driven from Python runs its
    bookkeeping (a few hundred operations on ``P``-vectors) without a compiled program."""

    xp = np

    @staticmethod
    def cond(pred: Any, yes: Callable[[Any], Any], no: Callable[[Any], Any], c: Any) -> Any:
        return yes(c) if bool(pred) else no(c)

    @staticmethod
    def scan(f: Callable[..., Any], init: Any, xs: Any, reverse: bool = False) -> Any:
        # ``xs``: an array or a tuple of arrays, ``f``'s outputs ``None`` or one array (the
        # search's uses; no pytree machinery, a step runs this a few hundred times)
        items = list(zip(*xs, strict=True)) if isinstance(xs, tuple) else list(xs)
        if not items:
            return init, np.zeros(0)
        carry, ys = init, [None] * len(items)
        for i in reversed(range(len(items))) if reverse else range(len(items)):
            carry, ys[i] = f(carry, items[i])
        return carry, (None if not ys or ys[0] is None else np.stack(ys))

    @staticmethod
    def set_row(a: Any, i: Any, v: Any) -> Any:
        out = a.copy()
        out[i] = v
        return out

    @staticmethod
    def where(pred: Any, yes: Any, no: Any) -> Any:
        # the host search's predicates are scalars and its two branches of one shape:
        # the chosen operand as it is (np.where would take ~2 us to copy it)
        return yes if pred else no

    @staticmethod
    def all_finite(a: Any) -> Any:
        return np.isfinite(a).all()


def _ops(a: Any) -> type[_JaxOps] | type[_NumpyOps]:
    """JAX's operations for JAX arrays and tracers, else NumPy's (host arrays and scalars)."""
    return _JaxOps if isinstance(a, jax.Array) else _NumpyOps


def _dot(a: Arr, b: Arr) -> Arr:
    return _ops(a).xp.vdot(a, b).real


def inverse_hessian_product(g: Arr, st: LBFGSState) -> Arr:
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
    ops = _ops(g)
    xp, where = ops.xp, ops.where
    if ops is _JaxOps:  # a NumPy state (the host search's) indexed by the loop's tracer
        st = LBFGSState(*(jnp.asarray(a) for a in st))
    m = st.rho.shape[0]
    n_valid = xp.minimum(st.n_pairs, m)
    newest = (st.n_pairs - 1) % m
    # the compiled loops run over all M slots, those not stored masked (their terms are
    # exact zeros); the host's over the stored pairs only
    order = xp.arange(m) if ops is _JaxOps else np.arange(int(n_valid))

    def newest_first(q: Arr, i: Arr) -> tuple[Arr, Arr]:
        j = (newest - i) % m
        a = where(i < n_valid, st.rho[j] * _dot(st.s[j], q), 0.0)
        return q - a * st.y[j], a

    q, alphas = ops.scan(newest_first, g, order)
    sy = _dot(st.s[newest], st.y[newest])
    yy = _dot(st.y[newest], st.y[newest])
    gamma = where(st.n_pairs > 0, sy / where(yy > 0, yy, 1.0), _first_scale(g))

    def oldest_first(r: Arr, ia: tuple[Arr, Arr]) -> tuple[Arr, None]:
        i, a = ia
        j = (newest - i) % m
        b = st.rho[j] * _dot(st.y[j], r)
        return r + where(i < n_valid, a - b, 0.0) * st.s[j], None

    r, _ = ops.scan(oldest_first, gamma * q, (order, alphas), reverse=True)
    return r


def _first_scale(g: Arr) -> Arr:
    """``min(1, 1 / |g|)``: the scaled steepest-descent step moves at most a unit distance."""
    xp, where = _ops(g).xp, _ops(g).where
    norm = xp.sqrt(_dot(g, g))
    return xp.minimum(1.0, 1.0 / where(norm > 0, norm, 1.0))


def search_direction(g: Arr, st: LBFGSState) -> tuple[Arr, Arr, Arr]:
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
    xp, where = _ops(g).xp, _ops(g).where
    d = -inverse_hessian_product(g, st)
    slope = _dot(g, d)
    descent = (slope < 0) & xp.isfinite(slope)
    steepest = -_first_scale(g) * g
    d = where(descent, d, steepest)
    return d, where(descent, slope, _dot(g, steepest)), ~descent


def _zoom_step(end_a: tuple[Arr, ...], end_b: tuple[Arr, ...], noise: Arr) -> Arr:
    """The next zoom trial in the bracket ``[a, b]`` (either order), its ends given as
    ``(t, f(t), f'(t))``.

    The minimiser of the cubic matching values and slopes at both ends (Nocedal & Wright,
    eq. 3.59). Where the two values differ by no more than ``noise`` (the loss's rounding
    near a minimum), they say nothing of the curvature and the trial is the zero of the
    slopes' secant instead (Hager & Zhang, 2005, sec. 2). The trial is clamped to the
    inner 80 % of the bracket, so that the bracket shrinks by 10 % at least; bisection
    where neither is defined (an end not finite, no real cubic minimiser, slopes that do
    not grow across the bracket).
    """
    (a, fa, da), (b, fb, db) = end_a, end_b
    xp, where = _ops(a).xp, _ops(a).where
    d1 = da + db - 3.0 * (fa - fb) / (a - b)
    d2sq = d1 * d1 - da * db
    d2 = xp.sign(b - a) * xp.sqrt(xp.maximum(d2sq, 0.0))
    cubic = b - (b - a) * (db + d2 - d1) / (db - da + 2.0 * d2)
    secant = b - db * (b - a) / (db - da)
    flat = xp.abs(fa - fb) <= noise
    t = where(flat, secant, cubic)
    width = xp.abs(b - a)
    lower = xp.minimum(a, b) + 0.1 * width
    upper = xp.maximum(a, b) - 0.1 * width
    # the secant's zero is a minimum where the slope grows from a to b
    good = where(flat, (db - da) * (b - a) > 0, d2sq >= 0) & xp.isfinite(t)
    good = good & xp.isfinite(fa) & xp.isfinite(fb) & xp.isfinite(da) & xp.isfinite(db)
    return where(good, xp.minimum(xp.maximum(t, lower), upper), 0.5 * (a + b))


def _dtype_of(a: Any) -> Any:
    """An array's dtype, a Python scalar's JAX dtype (no conversion: ``jnp.asarray``
    compiles a program per NumPy shape)."""
    return a.dtype if hasattr(a, "dtype") else jnp.result_type(a)


def _flat_dtype(leaves: list[Any]) -> Any:
    """The dtype of the leaves flattened together (``ravel_pytree``'s): their promoted
    dtype, a float when they are not floating."""
    dt = jnp.result_type(*map(_dtype_of, leaves)) if leaves else None
    if dt is None or not jnp.issubdtype(dt, jnp.floating):
        dt = jnp.result_type(float)
    return dt


def host_ravel(tree: Any) -> tuple[np.ndarray, Callable[[np.ndarray], Any]]:
    """``ravel_pytree`` on the host: ``(x (P,) NumPy, unravel)``, nothing compiled.

    ``jax.flatten_util.ravel_pytree`` flattens and unflattens with eager JAX operations,
    each compiled once per shape; here NumPy flattens and ``unravel`` splits, each leaf a
    NumPy array in its own dtype (a compiled function takes them as they are).

    Args:
        tree: a pytree of arrays.

    Returns:
        ``(x, unravel)``: the leaves' values in one ``(P,)`` array (their promoted
        floating dtype) and ``x -> tree`` of the same structure, shapes and dtypes
        (NumPy leaves).

    Example:
        >>> import jax.numpy as jnp
        >>> from gpchol._fit.lbfgs import host_ravel
        >>> x, unravel = host_ravel({"a": jnp.zeros(2), "b": jnp.ones(())})
        >>> x.tolist(), unravel(x + 1.0)["a"].tolist()
        ([0.0, 0.0, 1.0], [1.0, 1.0])
    """
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    dt = _flat_dtype(leaves)
    arrays = [np.asarray(a) for a in leaves]
    shapes = [a.shape for a in arrays]
    dtypes = [_dtype_of(a) for a in leaves]
    cuts = np.cumsum([a.size for a in arrays])[:-1]
    x = np.concatenate([a.ravel().astype(dt) for a in arrays]) if arrays else np.zeros(0, dt)

    def unravel(x: np.ndarray) -> Any:
        parts = np.split(np.asarray(x), cuts) if arrays else []
        new = zip(parts, shapes, dtypes, strict=True)
        return jax.tree_util.tree_unflatten(treedef, [p.reshape(s).astype(d) for p, s, d in new])

    return x, unravel


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
        # the flat parameters' size and dtype (ravel_pytree's), without flattening them;
        # NumPy's zeros (jnp.zeros compiles a program each; a compiled step takes them as
        # they are, and the host-driven search keeps its state in NumPy)
        leaves = jax.tree_util.tree_leaves(params)
        p = sum(int(np.size(a)) for a in leaves)
        dt = _flat_dtype(leaves)

        def zeros(*shape: int, dtype: Any = dt) -> np.ndarray:
            return np.zeros(shape, dtype)

        return LBFGSState(
            n_pairs=zeros(dtype=np.int32),
            s=zeros(self.memory, p),
            y=zeros(self.memory, p),
            rho=zeros(self.memory),
            x=zeros(p),
            value=zeros(),
            grad=zeros(p),
            known=zeros(dtype=bool),
        )

    def make_step(
        self, loss: Callable[[Any], jax.Array]
    ) -> Callable[[Any, LBFGSState], tuple[Any, LBFGSState, Arr, Arr]]:
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

        def step(u: Any, st: LBFGSState) -> tuple[Any, LBFGSState, Arr, Arr]:
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

        def step(u: Any, st: LBFGSState) -> tuple[Any, LBFGSState, Arr, Arr]:
            x, unravel_ = ravel_pytree(u)
            unravel: Callable[[Any], Any] = unravel_
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
        value_and_grad: Callable[[Any, Any], tuple[Any, Any]],
        unravel: Callable[[Any], Any] | None = None,
    ) -> Callable[[Any, LBFGSState, Any], tuple[Any, LBFGSState, Arr, Arr]]:
        """The line-search step driven from Python around a compiled value and gradient.

        The same algorithm as :meth:`make_step`'s (the same functions), cut at the
        evaluations: between two evaluations of the compiled loss the line search's
        bookkeeping runs on the host in NumPy, a few hundred operations on ``P``-vectors,
        so nothing but the loss is compiled: a new model structure compiles its value and
        gradient only. The state comes back as NumPy arrays. The price is one host
        synchronisation per evaluation, small next to a loss that is worth compiling.

        Args:
            value_and_grad: ``(x (P,), data) -> (loss (), gradient (P,))``, compiled by
                the caller, over the flattened parameters ``x``.
            unravel: ``x (P,) -> params``; ``None``: :func:`host_ravel`'s (NumPy
                leaves).

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

        def flat(u: Any) -> tuple[np.ndarray, Callable[[np.ndarray], Any]]:
            leaves = jax.tree_util.tree_leaves(u)
            mine = last.get("leaves")
            if mine is not None and len(mine) == len(leaves):
                if all(a is b for a, b in zip(mine, leaves, strict=True)):
                    return last["x"], last["unravel"]
            return host_ravel(u)

        def step(u: Any, st: LBFGSState, data: Any) -> tuple[Any, LBFGSState, Any, Any]:
            x, own = flat(u)
            back: Callable[[Any], Any] = own if unravel is None else unravel
            st = LBFGSState(*(np.asarray(a) for a in st))
            x = x.astype(st.x.dtype)
            # the search's bookkeeping in NumPy, between evaluations of the compiled loss;
            # the rules are the functions below, as the compiled step runs them (IEEE
            # results where a trial is not finite: NumPy's warnings are silenced)
            with np.errstate(all="ignore"):
                c = _start(x, st)
                while _running(c, max_evals):
                    c, xt = _trial(c, st, x)
                    # in the parameters' dtype: NumPy promotes float32 x + float64 t d
                    xt = np.asarray(xt, x.dtype)
                    f, g = value_and_grad(xt, data)
                    c = _update(c, xt, np.asarray(f), np.asarray(g), max_evals)
                x_new, new, f0, grad_ok = _finish(c, st, x)
            # the state's arrays in their own dtypes (the host's selections return either
            # operand as it is, a Python scalar included)
            st = LBFGSState(*(np.asarray(a, b.dtype) for a, b in zip(new, st, strict=True)))
            x_new = np.asarray(x_new, x.dtype)
            u_new = back(x_new)
            last.update(leaves=jax.tree_util.tree_leaves(u_new), x=x_new, unravel=own)
            return u_new, st, f0, grad_ok

        return step


def _start(x: Arr, st: LBFGSState) -> dict[str, Any]:
    """The line search's carry at ``x``: without a cached evaluation of ``x`` in the state,
    the first pass evaluates ``x`` itself (``t = 0``, ``d = 0``)."""
    xp, where = _ops(x).xp, _ops(x).where
    dt = x.dtype
    zero = xp.zeros((), dt)
    cached = st.known & xp.all(st.x == x)
    inf = xp.full((), xp.inf, dt)
    return {
        "stage": xp.asarray(where(cached, _BRACKET, _EVAL0), xp.int32),
        "it": xp.zeros((), xp.int32),
        "t": xp.asarray(where(cached, 1.0, 0.0), dt),
        "f0": st.value,
        "g0": st.grad,
        "need_direction": cached,
        "d": xp.zeros_like(x),
        "slope0": -xp.ones((), dt),
        "cleared": xp.zeros((), bool),
        "lo": (zero, st.value, zero),
        "hi": (zero, inf, zero),
        "safe": (zero, inf, x, st.grad),
        "out": (zero, st.value, x, st.grad),
        "ok": xp.zeros((), bool),
    }


def _running(c: dict[str, Any], max_evals: int) -> Arr:
    return (c["stage"] != _DONE) & (c["it"] < max_evals + 1)


def _trial(c: dict[str, Any], st: LBFGSState, x: Arr) -> tuple[dict[str, Any], Arr]:
    """The carry with its direction (computed once ``g0`` is known, in one place of the
    program, and only at a step's first trial: under vmap a cond runs both branches) and
    the next point to evaluate."""
    cond = _ops(x).cond
    c = cond(c["need_direction"], lambda c: _with_direction(c, st), lambda c: c, c)
    return c, x + c["t"] * c["d"]


def _update(c: dict[str, Any], xt: Arr, f: Arr, g: Arr, max_evals: int) -> dict[str, Any]:
    """The carry after the evaluation ``(f, g)`` at ``xt``."""
    ops = _ops(xt)
    dt = xt.dtype
    f, g = f.astype(dt), g.astype(dt)
    finite = ops.xp.isfinite(f) & ops.all_finite(g)
    return ops.cond(
        c["stage"] == _EVAL0,
        lambda c: _after_first(c, f, g, finite),
        lambda c: _after_trial(c, xt, f, g, finite, max_evals),
        c,
    )


def _finish(c: dict[str, Any], st: LBFGSState, x: Arr) -> tuple[Arr, LBFGSState, Arr, Arr]:
    """``(new x, new state, loss at x, gradient finite)`` once the search has stopped: the
    accepted trial; else the lowest trial with sufficient decrease; else no move."""
    xp, where = _ops(x).xp, _ops(x).where
    use_safe = ~c["ok"] & (c["safe"][0] > 0)
    moved = c["ok"] | use_safe
    _, f_fin, x_fin, g_fin = _zip_map(lambda a, b: where(c["ok"], a, b), c["out"], c["safe"])
    x_new = where(moved, x_fin, x)
    f_new = where(moved, f_fin, c["f0"])
    g_new = where(moved, g_fin, c["g0"])
    grad_ok = _ops(x).all_finite(c["g0"])
    st = st._replace(n_pairs=xp.asarray(where(c["cleared"] | ~moved, 0, st.n_pairs), xp.int32))
    st = _push(st, x_new - x, g_new - c["g0"], moved)
    known = xp.isfinite(c["f0"]) & grad_ok
    st = st._replace(x=x_new, value=f_new, grad=g_new, known=known)
    return x_new, st, c["f0"], grad_ok


def _zip_map(f: Callable[..., Any], *tuples: tuple[Any, ...]) -> tuple[Any, ...]:
    """``f`` over the entries of equal-length flat tuples (the search's brackets)."""
    return tuple(f(*xs) for xs in zip(*tuples, strict=True))


def _push(st: LBFGSState, s: Arr, y: Arr, use: Arr) -> LBFGSState:
    """Stores the pair ``(s, y)`` when ``use`` and ``s . y > 0`` (kept positive definite)."""
    ops = _ops(s)
    xp, put, where = ops.xp, ops.set_row, ops.where
    sy = _dot(s, y)
    keep = use & (sy > 0) & xp.isfinite(sy) & ops.all_finite(y)
    m = st.rho.shape[0]
    i = st.n_pairs % m
    return st._replace(
        n_pairs=xp.asarray(where(keep, st.n_pairs + 1, st.n_pairs), xp.int32),
        s=where(keep, put(st.s, i, s), st.s),
        y=where(keep, put(st.y, i, y), st.y),
        rho=where(keep, put(st.rho, i, 1.0 / where(keep, sy, 1.0)), st.rho),
    )


def _with_direction(c: dict[str, Any], st: LBFGSState) -> dict[str, Any]:
    """The carry with the direction at ``g0`` and the bracket's lower end ``t = 0``."""
    d, slope0, cleared = search_direction(c["g0"], st)
    zero = _ops(d).xp.zeros_like(c["t"])
    return {
        **c,
        "d": d,
        "slope0": slope0,
        "cleared": cleared,
        "lo": (zero, c["f0"], slope0),
        "need_direction": _ops(d).xp.zeros((), bool),
    }


def _after_first(c: dict[str, Any], f: Arr, g: Arr, finite: Arr) -> dict[str, Any]:
    """The carry after evaluating the current point: its direction next, then the trial ``1``."""
    xp, where = _ops(g).xp, _ops(g).where
    return {
        **c,
        "stage": xp.asarray(where(finite, _BRACKET, _DONE), xp.int32),
        "t": xp.ones_like(c["t"]),
        "f0": f,
        "g0": g,
        "need_direction": finite,
        "safe": (c["safe"][0], c["safe"][1], c["safe"][2], g),
        "out": (c["out"][0], f, c["out"][2], g),
    }


def _after_trial(
    c: dict[str, Any],
    xt: Arr,
    f: Arr,
    g: Arr,
    finite: Arr,
    max_evals: int,
) -> dict[str, Any]:
    """The carry after evaluating the trial ``t``: accept, bracket, zoom or give up."""
    xp, where = _ops(xt).xp, _ops(xt).where
    t, f0, slope0 = c["t"], c["f0"], c["slope0"]
    slope = where(finite, _dot(g, c["d"]), xp.inf)
    fv = where(finite, f, xp.inf)
    armijo = fv <= f0 + _C1 * t * slope0
    noise = _approx_tolerance(_dtype_of(f0)) * xp.abs(f0)
    approx = (fv <= f0 + noise) & (slope <= (2.0 * _C1 - 1.0) * slope0)
    decrease = finite & (armijo | approx)
    curvature = xp.abs(slope) <= -_C2 * slope0
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
    to_hi = where(zooming, z_hi, b_hi)
    swap = where(zooming, z_swap, b_swap)
    expand = ~zooming & ~b_hi & ~b_swap

    def pick(*xs: Any) -> Any:
        return _zip_map(lambda a, b, e: where(to_hi, a, where(swap, b, e)), *xs)

    new_lo = _zip_map(lambda a, b: where(to_hi, a, b), lo, here)
    new_hi = pick(here, lo, hi)
    next_t = where(
        expand,
        xp.minimum(_GROW * t, _MAX_T),
        _zoom_step(new_lo, new_hi, noise),
    )
    it = c["it"] + 1
    width = xp.abs(new_hi[0] - new_lo[0])
    stuck = (it >= max_evals) | (~expand & (width <= 1e-12 * xp.maximum(new_hi[0], new_lo[0])))
    stuck = stuck | (expand & (t >= _MAX_T))
    better = decrease & (fv < c["safe"][1])
    return {
        **c,
        "stage": xp.asarray(where(accept | stuck, _DONE, where(expand, _BRACKET, _ZOOM)), xp.int32),
        "it": it,
        "t": next_t,
        "lo": new_lo,
        "hi": new_hi,
        "safe": _zip_map(lambda a, b: where(better, a, b), (t, fv, xt, g), c["safe"]),
        "out": _zip_map(lambda a, b: where(accept, a, b), (t, fv, xt, g), c["out"]),
        "ok": accept,
    }
