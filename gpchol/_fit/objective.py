"""What a fit minimises and how it steps: loss, optimiser, jitted step, default transforms.

The loss is evaluated in the unconstrained space where the optimiser runs (the transforms
map it to the parameters' natural space); one step is one jitted call returning the new
parameters and optimiser state, the loss before the step and whether the gradient is
finite.

Example:
    >>> import jax.numpy as jnp
    >>> from gpchol._fit.objective import make_optimizer, make_step, unconstrained_loss
    >>> name, opt = make_optimizer("adam", 0.1)
    >>> loss = unconstrained_loss(lambda p: (p - 1.0) ** 2, None, None)
    >>> step = make_step(opt, loss)
    >>> u = jnp.asarray(0.0)
    >>> u1, s1, value, finite = step(u, opt.init(u))
    >>> float(value), bool(finite), float(u1) > 0.0
    (1.0, True, True)
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any, TypeAlias

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from gpchol._base.transforms import to_constrained
from gpchol._base.validate import check_number
from gpchol._fit.lbfgs import LBFGS
from gpchol.kernels import Kernel
from gpchol.means import Mean

if TYPE_CHECKING:  # optax is imported where it is used, never by `import gpchol`
    import optax

__all__ = [
    "OWN_OPTIMIZERS",
    "Optimizer",
    "StepFn",
    "data_step_fn",
    "default_transforms",
    "make_optimizer",
    "make_step",
    "model_objective",
    "optimizer_key",
    "unconstrained_loss",
]

StepFn = Callable[[Any, Any], tuple[Any, Any, Any, Any]]
"""``(params, opt_state) -> (new params, new opt_state, loss at params, gradient finite)``
(JAX arrays, or NumPy's from the host-driven L-BFGS)."""

Optimizer: TypeAlias = "optax.GradientTransformation | LBFGS"
"""An optax transformation, or :class:`~gpchol._fit.lbfgs.LBFGS` (its own step)."""


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
        >>> from gpchol._fit.objective import default_transforms
        >>> t = default_transforms({"k": kernels.ExpSquared(), "noise": 0.1})
        >>> print(t["k"].lengthscale, t["noise"])
        Positive(lower=0.0) None
    """

    def own(x: Any) -> Any:
        return x.default_transforms() if isinstance(x, (Kernel, Mean)) else None

    return jax.tree_util.tree_map(
        own, params, is_leaf=lambda x: isinstance(x, (Kernel, Mean)) or x is None
    )


#: The names :func:`make_optimizer` gives gpchol's own optimisers (an optax
#: transformation is named by its type).
OWN_OPTIMIZERS = ("lbfgs", "adam")


def floating_params(params: Any) -> Any:
    """``params`` with integer leaves as NumPy arrays of the default float dtype.

    An integer parameter cannot be optimised (its gradient is not defined, and a fit
    would truncate the optimum back to an int): ``fit(loss, 1)`` means ``fit(loss, 1.0)``.

    Raises:
        TypeError: a bool leaf (a flag, not a parameter), naming its path.

    Example:
        >>> from gpchol._fit.objective import floating_params
        >>> floating_params({"a": 1, "b": 2.5})["a"].dtype.kind
        'f'
    """

    def one(path: Any, x: Any) -> Any:
        dt = jnp.result_type(x)
        if dt == jnp.bool_:
            raise TypeError(
                f"parameter {jax.tree_util.keystr(path) or 'params'} is a bool; parameters "
                "are numbers to optimise (pass a flag to build, not in params)"
            )
        if jnp.issubdtype(dt, jnp.integer):
            return np.asarray(x, jnp.result_type(float))
        return x

    return jax.tree_util.tree_map_with_path(one, params)


def make_optimizer(
    optimizer: str | optax.GradientTransformation, learning_rate: float | None
) -> tuple[str, Optimizer]:
    """The optimiser's name and the optimiser.

    Args:
        optimizer: ``"adam"`` (``optax.adam``), ``"lbfgs"`` (or ``"l-bfgs"``:
            :class:`~gpchol._fit.lbfgs.LBFGS`, whose compiled step holds the loss once), or
            an optax ``GradientTransformation`` (named by its type).
        learning_rate: Adam's step (default 0.05); L-BFGS's fixed step instead of its line
            search (``None``: line search).

    Returns:
        ``(name, transformation)``.

    Raises:
        ValueError: an unknown optimiser name, or a ``learning_rate`` that is not a finite
            number > 0.
        TypeError: neither a name nor a ``GradientTransformation``.

    Example:
        >>> from gpchol._fit.objective import make_optimizer
        >>> make_optimizer("L-BFGS", None)[0]
        'lbfgs'
    """
    if learning_rate is not None:
        learning_rate = check_number(learning_rate, "learning_rate", positive=True)
    if isinstance(optimizer, str):
        name = optimizer.lower()
        if name in ("lbfgs", "l-bfgs"):  # ours: a fit with it never imports optax
            return "lbfgs", LBFGS(learning_rate=learning_rate)
        if name == "adam":
            import optax

            return "adam", optax.adam(0.05 if learning_rate is None else learning_rate)
        raise ValueError(
            f"optimizer must be 'adam', 'lbfgs' or an optax GradientTransformation; got "
            f"{optimizer!r}."
        )
    import optax

    if isinstance(optimizer, optax.GradientTransformation):
        return type(optimizer).__name__, optimizer
    raise TypeError(
        "optimizer must be 'adam', 'lbfgs' or an optax GradientTransformation; got "
        f"{type(optimizer).__name__}."
    )


def optimizer_key(
    optimizer: str | optax.GradientTransformation, learning_rate: float | None
) -> Hashable:
    """What identifies the optimiser :func:`make_optimizer` makes, for a program's key.

    A name and a learning rate always make the same optimiser. An optax transformation's
    functions close over its settings, so only the same object is known to give the same
    program (the key holds it, so its ``id`` cannot be reused by another).

    Example:
        >>> from gpchol._fit.objective import optimizer_key
        >>> optimizer_key("L-BFGS", None) == optimizer_key("lbfgs", None)
        True
    """
    if isinstance(optimizer, str):
        name = make_optimizer(optimizer, learning_rate)[0]
        return (name, learning_rate)
    return ("optax", optimizer)


def unconstrained_loss(
    build_or_loss: Callable[[Any], Any], y: Any, transforms: Any
) -> Callable[[Any], jax.Array]:
    """The scalar loss as a function of the unconstrained parameters.

    Args:
        build_or_loss: with ``y``, ``params -> model`` (the loss is the negative of
            :func:`model_objective`); with ``y=None``, ``params -> loss``.
        y: ``(n,)`` observations or ``None``.
        transforms: a pytree prefix of the parameters of transforms (``None``: identity).

    Returns:
        ``u -> loss`` with shape ``()``.
    """
    loss_c: Callable[[Any], Any] = build_or_loss
    if y is not None:

        def loss_c(p: Any) -> Any:  # y converted when traced: nothing to compile here
            return -model_objective(build_or_loss(p), jnp.asarray(y))

    def loss_u(u: Any) -> jax.Array:
        return jnp.asarray(loss_c(to_constrained(u, transforms))).reshape(())

    return loss_u


def model_objective(model: Any, y: jax.Array) -> jax.Array:
    """What a fit maximises for ``model``: its own ``fit_objective(y)`` when it has one
    (a sparse GP's evidence lower bound, :meth:`gpchol.SparseGP.elbo`), else its
    ``log_marginal_likelihood(y)``."""
    objective = getattr(model, "fit_objective", None)
    if objective is not None:
        return objective(y)
    return model.log_marginal_likelihood(y)


def _all_finite(tree: Any) -> jax.Array:
    leaves = jax.tree_util.tree_leaves(tree)
    if not leaves:
        return jnp.asarray(True)
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in leaves]))


def make_step(
    opt: Optimizer, loss: Callable[[Any], jax.Array], *, jit: bool = True, traceable: bool = False
) -> StepFn:
    """One optimiser step: the loss and its gradient, then the update.

    Args:
        opt: the optimiser (:class:`~gpchol._fit.lbfgs.LBFGS` steps itself, its line
            search included).
        loss: ``u -> scalar loss``.
        jit: jit the loss and the step (``False``: the caller traces the step inside its
            own program, with a loss it has jitted itself).
        traceable: with ``jit``, one compiled step that may be called inside the caller's
            own trace (``False``: L-BFGS's line search is driven from Python around the
            compiled loss, see :func:`data_step_fn`).

    Returns:
        A :data:`StepFn`.
    """
    if not jit:
        return _step(opt, loss)
    if _host_driven(opt) and not traceable:
        data_step = data_step_fn(opt, lambda u, data: loss(u))
        return lambda u, s: data_step(u, s, None)
    return jax.jit(_step(opt, jax.jit(loss)))


def _host_driven(opt: Optimizer) -> bool:
    return isinstance(opt, LBFGS) and opt.learning_rate is None


def data_step_fn(
    opt: Optimizer, loss: Callable[[Any, Any], jax.Array]
) -> Callable[[Any, Any, Any], tuple[Any, Any, jax.Array, jax.Array]]:
    """``(u, s, data) -> step``, the optimiser step over ``u -> loss(u, data)``, compiled.

    L-BFGS's line search is driven from Python around the compiled value and gradient
    (:meth:`~gpchol._fit.lbfgs.LBFGS.host_step`): its own programs depend on the number of
    parameters only and are shared by every loss. Other optimisers' steps are one
    compiled program, the loss included.
    """
    if not _host_driven(opt):
        loss_j = jax.jit(loss)

        def step(u: Any, s: Any, data: Any) -> Any:
            return _step(opt, lambda v: loss_j(v, data))(u, s)

        return jax.jit(step)
    assert isinstance(opt, LBFGS)
    programs: dict[Any, Callable[..., Any]] = {}

    def host(u: Any, s: Any, data: Any) -> Any:
        # one value-and-gradient program per parameter tree (shapes and dtypes)
        key = (
            jax.tree_util.tree_structure(u),
            tuple((jnp.shape(x), jnp.result_type(x)) for x in jax.tree_util.tree_leaves(u)),
        )
        run = programs.get(key)
        if run is None:

            def flat_loss(x: jax.Array, data: Any, like: Any = u) -> jax.Array:
                # the parameters' unravel, made inside the trace: made eagerly it would
                # compile the flattening of ``like`` (its values are unused)
                return loss(ravel_pytree(like)[1](x), data)

            run = programs[key] = opt.host_step(jax.jit(jax.value_and_grad(flat_loss)))
        return run(u, s, data)

    return host


def _step(opt: Optimizer, loss: Callable[[Any], jax.Array]) -> StepFn:
    if isinstance(opt, LBFGS):
        return opt.make_step(loss)
    import optax

    value_and_grad = jax.value_and_grad(loss)

    def step(u: Any, s: Any) -> tuple[Any, Any, jax.Array, jax.Array]:
        v, g = value_and_grad(u)
        updates, s2 = opt.update(g, s, u)
        return optax.apply_updates(u, updates), s2, v, _all_finite(g)

    return step
