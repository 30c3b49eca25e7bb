r"""Compiled fitting programs keyed by structure, not by the identity of a Python object.

A fit's step is one compiled program. Jitting a closure over the user's function and data
(``jax.jit(lambda u: loss(build(u), y))``) compiles it again for every new closure, so a
second fit of the same model, a cross-validation fold or a Bayesian-optimisation iteration
pays the whole compile again. Here the user's function is traced to a jaxpr once per call
(cheap: it only builds the model, or evaluates a plain loss), and the compiled step is
looked up by what it depends on:

* the jaxpr of the part of the model that depends on the parameters (printed, so scalar
  constants written in the user's code are part of it), and the shapes and dtypes of the
  arrays it closes over;
* the model's tree structure (kernel and mean types and their static fields, the GP's
  jitter, backend and tile size);
* the shapes and dtypes of the data (the model's leaves that do not depend on the
  parameters, ``y``, a mask), after padding to a *bucket*;
* the optimiser and its settings, JAX's float64 mode and the default backend.

Arrays are arguments of the program, never constants baked into it, so arrays captured by
a user's function that change between fits give the new result. Where the jaxpr holds
something this cannot see into (an inner ``jax.jit`` or custom derivative rule that closes
over arrays, a callback), :func:`gp_program` and :func:`loss_program` return ``None`` and
the caller compiles the closure as before: slower, never stale. A Python function held
as a static field (a :class:`gpchol.means.Function`'s ``fn``, a function kernel) is keyed
by its identity, as ``jax.jit`` keys static arguments: one that reads global state which
changes between fits is read once, when its program is traced.

**Buckets.** For a :class:`gpchol.GaussianProcess` whose training inputs (and per-point
noise and mask, if any) do not depend on the parameters, the ``n`` training points are padded up to
:func:`bucket_size` rows. A padded row enters the covariance as an identity row and column
with a zero residual (:func:`gpchol._fit.batched.padded_log_marginal_likelihood`): the
value, gradient and optimum are those of the unpadded data, and fits whose ``n`` differ
but fall in one bucket share one compiled step.

Example:
    >>> from gpchol._fit.programs import bucket_size
    >>> [bucket_size(n) for n in (1, 32, 33, 400, 513, 1100, 5000)]
    [32, 32, 64, 400, 528, 1120, 5000]
"""

from __future__ import annotations

import collections
import os
import sys
from collections.abc import Callable, Hashable
from typing import Any

import jax
import jax.extend.core as jex
import jax.numpy as jnp
import numpy as np
from jax.sharding import AbstractMesh, Mesh

from gpchol._base.buckets import BUCKET_MAX_N, bucket_size, pad_rows
from gpchol._base.transforms import to_constrained
from gpchol._base.validate import input_mesh
from gpchol._fit.batched import padded_log_marginal_likelihood
from gpchol._fit.objective import Optimizer, StepFn, data_step_fn
from gpchol._gp.model import GaussianProcess

__all__ = [
    "BUCKET_MAX_N",
    "bucket_size",
    "check_bucket",
    "clear_cache",
    "gp_program",
    "loss_program",
]

#: Most compiled steps kept (least recently used dropped first).
_CACHE_SIZE = 64

_CACHE: collections.OrderedDict[Hashable, Callable[..., Any]] = collections.OrderedDict()


def check_bucket(bucket: Any) -> bool | int:
    """Validates ``fit``'s ``bucket`` argument: ``True``, ``False`` or a positive int."""
    if isinstance(bucket, bool):
        return bucket
    if isinstance(bucket, (int, np.integer)) and bucket >= 1:
        return int(bucket)
    raise ValueError(
        "bucket must be True (pad the training points to a size bucket), False (no "
        f"padding) or a positive int (pad to a multiple of it); got {bucket!r}."
    )


def clear_cache() -> None:
    """Drops every compiled step (the next fit of each structure compiles again)."""
    _CACHE.clear()


# --------------------------------------------------------------------- jaxpr inspection


#: Source trees whose custom derivative rules are trusted not to read arrays the jaxpr does
#: not show (JAX's own rules, such as softplus's, and gpchol's).
_TRUSTED = tuple(
    os.path.dirname(os.path.abspath(str(m.__file__))) + os.sep
    for m in (jax, sys.modules["gpchol"])
    if getattr(m, "__file__", None)
)


def _source(v: Any) -> str | None:
    """The ``"name at file:line"`` of a function held by an equation, if JAX recorded it."""
    info = getattr(v, "debug_info", None)
    src = getattr(info, "func_src_info", None)
    if src is None:
        code = getattr(v, "__code__", None)
        src = None if code is None else f"{v.__qualname__} at {code.co_filename}"
    return src


def _scan(jaxpr: Any, functions: list[str]) -> bool:
    """Whether ``jaxpr`` holds what its printed form does not show: a nested closed jaxpr
    with constants, or a Python function (a custom derivative rule, a callback) from
    outside JAX and gpchol, which may read arrays of its own. The trusted functions'
    sources are appended to ``functions`` (they join the key)."""
    for eqn in jaxpr.eqns:
        for value in eqn.params.values():
            for v in value if isinstance(value, (tuple, list)) else (value,):
                if isinstance(v, jex.ClosedJaxpr):
                    if v.consts or _scan(v.jaxpr, functions):
                        return True
                elif isinstance(v, jex.Jaxpr):
                    if _scan(v, functions):
                        return True
                elif isinstance(v, (Mesh, AbstractMesh, type, jex.Primitive)):
                    continue
                elif callable(v) or hasattr(v, "call_wrapped"):
                    src = _source(v)
                    where = "" if src is None else src.rpartition(" at ")[2]
                    if src is None or not where.startswith(_TRUSTED):
                        return True
                    functions.append(src)
    return False


def _depends_on_inputs(jaxpr: Any) -> list[bool]:
    """For each output of ``jaxpr``: does it depend on an input (not only on constants)?"""
    live = set(jaxpr.invars)
    for eqn in jaxpr.eqns:
        if any(isinstance(v, jex.Var) and v in live for v in eqn.invars):
            live.update(eqn.outvars)
    return [isinstance(v, jex.Var) and v in live for v in jaxpr.outvars]


def _prune(jaxpr: Any, keep: list[bool]) -> tuple[Any, list[int]]:
    """The jaxpr of the kept outputs only, its constants turned into leading inputs.

    Returns:
        ``(jaxpr, const_indices)``: a constant-free jaxpr taking the used constants (by
        their index in ``jaxpr.constvars``) and then the original inputs.
    """
    outvars = [v for v, k in zip(jaxpr.outvars, keep, strict=True) if k]
    needed = {v for v in outvars if isinstance(v, jex.Var)}
    eqns = []
    for eqn in reversed(jaxpr.eqns):
        if any(v in needed for v in eqn.outvars) or eqn.effects:
            eqns.append(eqn)
            needed.update(v for v in eqn.invars if isinstance(v, jex.Var))
    eqns.reverse()
    used = [i for i, v in enumerate(jaxpr.constvars) if v in needed]
    pruned = jex.Jaxpr(
        constvars=[],
        invars=[jaxpr.constvars[i] for i in used] + list(jaxpr.invars),
        outvars=outvars,
        eqns=eqns,
        effects=jaxpr.effects,
        debug_info=jex.DebugInfo("gpchol fit", "the model's parameter part", None, None),
    )
    return pruned, used


def _trace(fn: Callable[[Any], Any], u0: Any) -> tuple[Any, Any, tuple[str, ...]] | None:
    """``(closed jaxpr of u -> leaves of fn(u), output treedef, functions it holds)``;
    ``None`` when the jaxpr cannot be keyed by its printed form (see :func:`_scan`)."""
    box: dict[str, Any] = {}

    def flat(u: Any) -> list[Any]:
        leaves, box["tree"] = jax.tree_util.tree_flatten(fn(u))
        return leaves

    closed = jax.make_jaxpr(flat)(u0)
    functions: list[str] = []
    if _scan(closed.jaxpr, functions):
        return None
    return closed, box["tree"], tuple(functions)


def _fixed_values(closed: Any, u0: Any, fixed_at: list[int]) -> list[Any]:
    """The values of the outputs that do not depend on the inputs: a constant or a literal
    passed through is read as it is (no device work, nothing compiled); only outputs
    computed from constants are evaluated, once."""
    jaxpr = closed.jaxpr
    consts = dict(zip(jaxpr.constvars, closed.consts, strict=True))
    values: dict[int, Any] = {}
    for i in fixed_at:
        v = jaxpr.outvars[i]
        if isinstance(v, jex.Literal):
            values[i] = np.asarray(v.val, dtype=v.aval.dtype)  # type: ignore[attr-defined]
        elif v in consts:
            values[i] = consts[v]
    if len(values) < len(fixed_at):
        outs = jex.jaxpr_as_fun(closed)(*jax.tree_util.tree_leaves(u0))
        values.update({i: outs[i] for i in fixed_at if i not in values})
    return [values[i] for i in fixed_at]


def _aval_key(x: Any) -> tuple[Any, ...]:
    return (tuple(np.shape(x)), str(getattr(x, "dtype", None) or np.asarray(x).dtype))


def _key(
    kind: str,
    jaxpr: Any,
    functions: tuple[str, ...],
    u0: Any,
    data: Any,
    opt_key: Hashable,
    *structure: Hashable,
) -> Hashable:
    """A program's key: the printed jaxpr of the parameters' part and the functions it
    holds, the parameters' tree, the shapes and dtypes of the data (never their values),
    the optimiser, the model's structure, JAX's float64 mode and default backend."""
    return (
        kind,
        str(jaxpr),
        functions,
        jax.tree_util.tree_structure(u0),
        jax.tree_util.tree_map(_aval_key, data),
        opt_key,
        structure,
        bool(jax.config.read("jax_enable_x64")),
        jax.default_backend(),
    )


def _run(jaxpr: Any, consts: Any, u: Any) -> list[Any]:
    """The pruned jaxpr's outputs at ``u``, its constants given as arguments."""
    return jex.jaxpr_as_fun(jex.ClosedJaxpr(jaxpr, []))(*consts, *jax.tree_util.tree_leaves(u))


def _lookup(key: Hashable, make: Callable[[], Callable[..., Any]]) -> Callable[..., Any]:
    fn = _CACHE.get(key)
    if fn is not None:
        _CACHE.move_to_end(key)
        return fn
    fn = make()
    _CACHE[key] = fn
    while len(_CACHE) > _CACHE_SIZE:
        _CACHE.popitem(last=False)
    return fn


def _bind(fn: Callable[..., Any], data: Any) -> StepFn:
    # on the device once per fit, not at each of the step's evaluations
    data = jax.device_put(data)

    def step(u: Any, s: Any) -> Any:
        return fn(u, s, data)

    return step


# ------------------------------------------------------------------------- the programs


def loss_program(
    loss: Callable[[Any], Any], transforms: Any, u0: Any, opt_key: Hashable, opt: Optimizer
) -> StepFn | None:
    """The step of a plain loss ``params -> scalar``, compiled once per structure.

    Args:
        loss: ``params -> scalar`` (constrained parameters).
        transforms: the fit's transforms.
        u0: the unconstrained initial parameters (canonical leaves).
        opt_key: what identifies the optimiser and its settings
            (:func:`~gpchol._fit.objective.optimizer_key`).
        opt: the optimiser.

    Returns:
        The bound step (:data:`~gpchol._fit.objective.StepFn`), or ``None`` when the
        loss cannot be keyed by its jaxpr.
    """
    traced = _trace(lambda u: loss(to_constrained(u, transforms)), u0)
    if traced is None:
        return None
    closed, out_tree, functions = traced
    if out_tree.num_leaves != 1:
        return None
    jaxpr, used = _prune(closed.jaxpr, [True])
    consts = tuple(closed.consts[i] for i in used)
    key = _key("loss", jaxpr, functions, u0, consts, opt_key)

    def make() -> Callable[..., Any]:
        def value(u: Any, data: Any) -> jax.Array:
            # jnp.asarray: a loss that does not depend on u is a literal of the jaxpr
            return jnp.asarray(_run(jaxpr, data, u)[0]).reshape(())

        return data_step_fn(opt, value)

    return _bind(_lookup(key, make), consts)


def gp_program(
    build: Callable[[Any], Any],
    y: Any,
    transforms: Any,
    u0: Any,
    opt_key: Hashable,
    opt: Optimizer,
    bucket: bool | int,
) -> StepFn | None:
    """The step of ``-build(params).log_marginal_likelihood(y)``, compiled once per structure.

    ``build`` is traced (not run): the parts of the model that do not depend on the
    parameters (the training inputs, fixed kernel parameters, a fixed noise) are data,
    read from the trace and passed to the program as arguments, padded to the bucket's
    size where they have one row per training point.

    Args:
        build: ``params -> GaussianProcess``.
        y: ``(n,)`` observations.
        transforms: as in ``loss_program`` (likewise ``u0``, ``opt_key``, ``opt``).
        bucket: see :func:`bucket_size`.

    Returns:
        The bound step (:data:`~gpchol._fit.objective.StepFn`), or ``None`` when the
        model is not a one-device :class:`gpchol.GaussianProcess` or cannot be keyed by
        its jaxpr.
    """
    y = np.asarray(y)
    traced = _trace(lambda u: build(to_constrained(u, transforms)), u0)
    if traced is None:
        return None
    closed, tree, functions = traced
    node_data = tree.node_data()
    if node_data is None or node_data[0] is not GaussianProcess:
        return None
    jitter = node_data[1][0]
    moving = _depends_on_inputs(closed.jaxpr)
    avals = [v.aval for v in closed.jaxpr.outvars]
    fixed_at = [i for i, m in enumerate(moving) if not m]
    fixed = _fixed_values(closed, u0, fixed_at)
    # the GP's children are (kernel, X, noise, mean, mask): X and noise follow the
    # kernel's leaves, the mask (when set) is the last leaf
    x_at = tree.children()[0].num_leaves
    noise_at = x_at + 1
    n = avals[x_at].shape[0]
    x_value = fixed[fixed_at.index(x_at)] if x_at in fixed_at else avals[x_at]
    if y.ndim != 1 or y.shape[0] != n or input_mesh(x_value) is not None:
        return None  # the uncached path: the model's own error, or the sharded likelihood
    jaxpr, used = _prune(closed.jaxpr, moving)
    consts = tuple(closed.consts[i] for i in used)

    # the rows to pad: X, a per-point noise ((n,); a (1,) noise is one value for all
    # points) and the user's own mask, when they are data
    mask_at = tree.num_leaves - 1 if tree.children()[4].num_leaves else None
    row_data = [x_at] + ([noise_at] if avals[noise_at].shape == (n,) else [])
    row_data += [] if mask_at is None else [mask_at]
    can_pad = (
        bucket is not False
        and n > 0
        and jitter is None
        and all(i in fixed_at for i in row_data)
        and not any(np.shape(c)[:1] == (n,) for c in consts)
        # any other leaf of n rows (a mean's per-point parameter, fixed or not) would not
        # be padded with X: no padding then (a leaf that has n entries by chance, e.g. n
        # lengthscales, only costs the bucket)
        and not any(a.shape[:1] == (n,) for i, a in enumerate(avals) if i not in row_data)
    )
    size = bucket_size(n, bucket) if can_pad else n
    if can_pad:
        for j, i in enumerate(fixed_at):
            if i in row_data:
                f = np.asarray(fixed[j])
                fill = f[0] if i == x_at else (False if i == mask_at else 1.0)
                fixed[j] = pad_rows(f, size, fill)
    y_pad = pad_rows(y, size, 0.0)
    data: tuple[Any, ...] = (consts, tuple(fixed), y_pad)
    if can_pad:
        data += (np.arange(size) < n,)
    key = _key("gp", jaxpr, functions, u0, data, opt_key, tree, tuple(moving), can_pad)

    def make() -> Callable[..., Any]:
        def value(u: Any, data: Any) -> jax.Array:
            consts, fixed, y = data[:3]
            moved = iter(_run(jaxpr, consts, u))
            still = iter(fixed)
            leaves = [next(moved) if m else next(still) for m in moving]
            gp = jax.tree_util.tree_unflatten(tree, leaves)
            if len(data) == 4:  # the bucket's rows, and the user's mask within them
                mask = data[3] if gp.mask is None else data[3] & gp.mask
                return -padded_log_marginal_likelihood(gp, y, mask)
            return -gp.log_marginal_likelihood(y)

        return data_step_fn(opt, value)

    return _bind(_lookup(key, make), data)
