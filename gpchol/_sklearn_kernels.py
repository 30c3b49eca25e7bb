r"""scikit-learn kernel objects as gpchol kernels, for :mod:`gpchol.sklearn`.

A scikit-learn kernel (``sklearn.gaussian_process.kernels``) is read once into a
:class:`Translation`: a hashable :class:`Node` tree (the structure: which gpchol kernel
stands for each scikit-learn one, and where its hyperparameters sit) and a flat float64
vector of every hyperparameter's value, in the order of the kernel's own
``hyperparameters`` list (each contributes ``n_elements`` entries). The entries of the
hyperparameters that are not ``"fixed"`` are, in that order, the ones scikit-learn's
``theta`` holds (as logarithms), so ``theta == log(values[free])`` and
:func:`build` maps a value vector to the gpchol kernel with the same covariance.

The kernels translated (each by its exact type; a subclass may change the covariance and
is refused): ``RBF``, ``Matern`` with ``nu`` 0.5, 1.5, 2.5 or ``inf``,
``RationalQuadratic``, ``ExpSineSquared``, ``DotProduct``, ``WhiteKernel``,
``ConstantKernel``, ``Sum``, ``Product`` and ``Exponentiation``. ``WhiteKernel`` becomes
:class:`gpchol.kernels.White`, which adds its variance wherever two rows are equal (so
also between a test point and an equal training point), where scikit-learn's adds it on
the diagonal of ``k(X)`` only.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from sklearn.gaussian_process import kernels as sk

from gpchol import kernels

__all__ = ["Node", "Translation", "build", "is_sklearn_kernel", "translate"]


def is_sklearn_kernel(obj: Any) -> bool:
    """Whether ``obj`` is a scikit-learn kernel object."""
    return isinstance(obj, sk.Kernel)


class EuclideanPeriodic(kernels.Kernel):
    r"""scikit-learn's ``ExpSineSquared`` on several input columns.

    .. math:: k(x, x') = \exp\left(-2 \sin^2(\pi \|x - x'\| / p) / l^2\right)

    a function of the Euclidean distance (gpchol's :class:`~gpchol.kernels.Periodic` sums
    over the columns instead; both agree on one column). The gradient at ``x = x'`` is 0.

    Example:
        >>> import jax.numpy as jnp
        >>> import numpy as np
        >>> k = EuclideanPeriodic(lengthscale=1.0, period=2.0)
        >>> X = jnp.array([[0.0, 0.0], [0.6, 0.8]])  # one unit apart
        >>> print(np.asarray(k(X), float).round(4))
        [[1.     0.1353]
         [0.1353 1.    ]]
    """

    lengthscale: Any = 1.0
    period: Any = 1.0

    def evaluate(self, x1: jax.Array, x2: jax.Array) -> jax.Array:
        r2 = jnp.sum(jnp.square(x1 - x2))
        positive = r2 > 0
        r = jnp.where(positive, jnp.sqrt(jnp.where(positive, r2, 1.0)), 0.0)
        return jnp.exp(-2.0 * jnp.square(jnp.sin(math.pi * r / self.period) / self.lengthscale))


@dataclasses.dataclass(frozen=True)
class Node:
    """One translated scikit-learn kernel: hashable, so that programs can key on it.

    Attributes:
        kind: ``"constant"``, ``"white"``, ``"dot"``, ``"rbf"``, ``"matern12"``,
            ``"matern32"``, ``"matern52"``, ``"rq"``, ``"periodic"`` (one input column),
            ``"periodic_euclid"``, ``"sum"``, ``"product"`` or ``"power"``.
        slots: ``(name, start, stop, anisotropic)`` per hyperparameter: its entries
            ``values[start:stop]``.
        children: the operands of ``"sum"``, ``"product"`` and ``"power"``.
        exponent: the (fixed) exponent of ``"power"``.
    """

    kind: str
    slots: tuple[tuple[str, int, int, bool], ...] = ()
    children: tuple[Node, ...] = ()
    exponent: float | None = None

    def value(self, values: Any, name: str) -> Any:
        for slot, start, stop, aniso in self.slots:
            if slot == name:
                return values[start:stop] if aniso else values[start]
        raise KeyError(name)  # pragma: no cover - the translation names every slot


_MATERN = {0.5: "matern12", 1.5: "matern32", 2.5: "matern52", math.inf: "rbf"}
_LEAVES = {
    sk.ConstantKernel: "constant",
    sk.WhiteKernel: "white",
    sk.DotProduct: "dot",
    sk.RBF: "rbf",
    sk.RationalQuadratic: "rq",
    sk.ExpSineSquared: "periodic",
}
_SUPPORTED = (
    "RBF, Matern (nu 0.5, 1.5, 2.5 or inf), RationalQuadratic, ExpSineSquared, DotProduct, "
    "WhiteKernel, ConstantKernel and their sums (+), products (*) and powers (**)"
)


def build(node: Node, values: Any) -> Any:
    """The gpchol kernel of a translated structure at the given hyperparameter values.

    Args:
        node: the structure (:attr:`Translation.node`).
        values: ``(p,)`` every hyperparameter's value (natural scale, not log); NumPy or
            JAX (traceable: differentiate through it).

    Returns:
        A :class:`gpchol.kernels.Kernel` whose covariance equals the scikit-learn
        kernel's at those values.
    """
    kind = node.kind
    if kind in ("sum", "product"):
        a, b = (build(c, values) for c in node.children)
        return kernels.Sum(a, b) if kind == "sum" else kernels.Product(a, b)
    if kind == "power":
        return kernels.Power(build(node.children[0], values), node.exponent)
    if kind == "constant":
        return kernels.Constant(node.value(values, "constant_value"))
    if kind == "white":
        return kernels.White(node.value(values, "noise_level"))
    if kind == "dot":
        sigma_0 = node.value(values, "sigma_0")
        return kernels.Polynomial(degree=1, variance=1.0, offset=sigma_0 * sigma_0)
    if kind == "rq":
        return kernels.RationalQuadratic(
            node.value(values, "length_scale"), node.value(values, "alpha")
        )
    if kind in ("periodic", "periodic_euclid"):
        periodic: Any = kernels.Periodic if kind == "periodic" else EuclideanPeriodic
        return periodic(
            lengthscale=node.value(values, "length_scale"),
            period=node.value(values, "periodicity"),
        )
    cls = {
        "rbf": kernels.ExpSquared,
        "matern12": kernels.Matern12,
        "matern32": kernels.Matern32,
        "matern52": kernels.Matern52,
    }[kind]
    return cls(lengthscale=node.value(values, "length_scale"))


@dataclasses.dataclass(frozen=True)
class Translation:
    """A scikit-learn kernel read for gpchol.

    Attributes:
        kernel: the scikit-learn kernel.
        node: its structure (hashable).
        values: ``(p,)`` float64, every hyperparameter's value.
        free: ``(k,)`` int, the entries of ``values`` that ``theta`` holds, in its order.
        bounds: ``(k, 2)`` float64, the log-space bounds of ``theta`` (``kernel.bounds``).
        names: ``(k,)`` the hyperparameter name of each ``theta`` entry.
    """

    kernel: Any
    node: Node
    values: np.ndarray
    free: np.ndarray
    bounds: np.ndarray
    names: tuple[str, ...]

    @property
    def theta(self) -> np.ndarray:
        """``(k,)`` log of the free values (scikit-learn's ``kernel.theta``)."""
        return np.log(self.values[self.free])

    def values_at(self, theta: Any) -> Any:
        """``(p,)`` every value with the free ones at ``exp(theta)`` (NumPy or traced)."""
        if isinstance(theta, np.ndarray):
            out = self.values.copy()
            out[self.free] = np.exp(theta)
            return out
        return jnp.asarray(self.values).at[self.free].set(jnp.exp(theta))

    def gpchol_kernel(self, theta: Any = None) -> Any:
        """The gpchol kernel at ``theta`` (``None``: at the kernel's own values)."""
        return build(self.node, self.values if theta is None else self.values_at(theta))


def translate(kernel: Any, n_features: int) -> Translation:
    """Reads a scikit-learn kernel.

    Args:
        kernel: a scikit-learn kernel object.
        n_features: ``d``, the number of input columns it will see (``ExpSineSquared`` on
            one column is gpchol's ``Periodic``, on several the Euclidean form).

    Returns:
        The :class:`Translation`.

    Raises:
        TypeError: a kernel (or a part of it) that has no gpchol translation; the message
            names it and lists the ones translated.
        ValueError: a ``Matern`` ``nu`` other than 0.5, 1.5, 2.5 or ``inf``, bounds with
            lower > upper or not positive, or a hyperparameter value that is not positive
            and finite (the message names the hyperparameter).

    Example:
        >>> import numpy as np
        >>> from sklearn.gaussian_process.kernels import RBF, ConstantKernel, WhiteKernel
        >>> k = ConstantKernel(2.0) * RBF([1.0, 3.0]) + WhiteKernel(0.1, "fixed")
        >>> t = translate(k, n_features=2)
        >>> print(np.allclose(t.theta, k.theta), t.names)
        True ('k1__k1__constant_value', 'k1__k2__length_scale', 'k1__k2__length_scale')
        >>> X = np.array([[0.0, 1.0], [2.0, 0.5]])
        >>> print(np.allclose(np.asarray(t.gpchol_kernel()(X)), k(X), rtol=1e-6))
        True
    """
    values: list[float] = []
    free: list[int] = []
    bounds: list[np.ndarray] = []
    names: list[str] = []
    node = _read(kernel, "", n_features, values, free, bounds, names)
    return Translation(
        kernel=kernel,
        node=node,
        values=np.asarray(values, np.float64),
        free=np.asarray(free, np.int64),
        bounds=np.log(np.concatenate(bounds, axis=0)) if bounds else np.zeros((0, 2)),
        names=tuple(names),
    )


def _describe(kernel: Any, where: str) -> str:
    name = f"{type(kernel).__module__}.{type(kernel).__name__}"
    return f"{name} ({where.rstrip('_') or 'the kernel itself'})"


def _read(
    kernel: Any,
    prefix: str,
    d: int,
    values: list[float],
    free: list[int],
    bounds: list[np.ndarray],
    names: list[str],
) -> Node:
    """Appends the kernel's hyperparameters to the lists; returns its :class:`Node`."""
    kind = type(kernel)
    if kind in (sk.Sum, sk.Product):
        children = (
            _read(kernel.k1, prefix + "k1__", d, values, free, bounds, names),
            _read(kernel.k2, prefix + "k2__", d, values, free, bounds, names),
        )
        return Node("sum" if kind is sk.Sum else "product", children=children)
    if kind is sk.Exponentiation:
        child = _read(kernel.kernel, prefix + "kernel__", d, values, free, bounds, names)
        return Node("power", children=(child,), exponent=float(kernel.exponent))
    if kind is sk.Matern:
        nu = float(kernel.nu)
        if nu not in _MATERN:
            raise ValueError(
                f"kernel: Matern with nu={kernel.nu!r} ({_describe(kernel, prefix)}) has no "
                "gpchol translation; nu must be 0.5, 1.5, 2.5 or inf"
            )
        leaf = _MATERN[nu]
    elif kind in _LEAVES:
        leaf = _LEAVES[kind]
        if leaf == "periodic" and d != 1:
            leaf = "periodic_euclid"
    else:
        raise TypeError(
            f"kernel: the scikit-learn kernel {_describe(kernel, prefix)} has no gpchol "
            f"translation. Translated (by exact type): {_SUPPORTED}; or pass a gpchol "
            "kernel (gpchol.kernels)."
        )
    slots = []
    for hp in kernel.hyperparameters:
        full = prefix + hp.name
        value = np.ravel(np.asarray(getattr(kernel, hp.name), np.float64))
        if value.size != hp.n_elements:
            raise ValueError(
                f"kernel: hyperparameter {full} has {hp.n_elements} value(s) in this "
                f"{type(kernel).__name__} (scikit-learn's kernel is isotropic in it); got "
                f"{getattr(kernel, hp.name)!r}"
            )
        if not np.all(np.isfinite(value) & (value > 0)):
            raise ValueError(
                f"kernel: hyperparameter {full} must be positive and finite (its log is "
                f"theta); got {getattr(kernel, hp.name)!r}"
            )
        start = len(values)
        values.extend(value.tolist())
        slots.append((hp.name, start, len(values), bool(np.ndim(getattr(kernel, hp.name)) > 0)))
        if hp.fixed:
            continue
        b = np.atleast_2d(np.asarray(hp.bounds, np.float64))
        if b.shape == (1, 2) and hp.n_elements > 1:
            b = np.repeat(b, hp.n_elements, axis=0)
        if b.shape != (hp.n_elements, 2):
            raise ValueError(
                f"kernel: {full}_bounds must be a (lower, upper) pair, one per element, or "
                f'"fixed"; got {hp.bounds!r}'
            )
        bad = np.flatnonzero(~(b[:, 0] <= b[:, 1]) | (b[:, 0] < 0) | np.isnan(b).any(axis=1))
        if bad.size:
            raise ValueError(
                f"kernel: {full}_bounds must have 0 <= lower <= upper (they bound the value, "
                f"whose log is theta); got {b[bad[0]].tolist()}"
                + (f" for element {bad[0]}" if hp.n_elements > 1 else "")
            )
        free.extend(range(start, len(values)))
        bounds.append(b)
        names.extend([full] * hp.n_elements)
    return Node(leaf, slots=tuple(slots))
