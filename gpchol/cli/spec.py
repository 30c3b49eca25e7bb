r"""A small kernel mini-language and the named models of the command line.

A SPEC is a sum of terms, each a product of kernel names, e.g. ``"rbf+white"`` or
``"matern52*periodic+white"``. Every product term gets one learnable amplitude; a
``white`` term is the observation-noise variance of the GP (learned); without one the
noise is fixed at a tiny value. Names (case-insensitive):

=====================  ===========================================================
name(s)                kernel (parameters learned)
=====================  ===========================================================
rbf, se, expsquared    ExpSquared (ARD lengthscale)
matern12/32/52         Matern12/32/52 (ARD lengthscale)
rq, rationalquadratic  RationalQuadratic (lengthscale, alpha)
periodic, expsinesquared  Periodic (lengthscale, period)
linear                 Linear (offset)
poly, polynomial       Polynomial of degree 2 (variance, offset)
constant               Constant (its amplitude)
white                  observation noise (not a kernel factor)
=====================  ===========================================================

A :class:`ModelSpec` turns a SPEC (or the name ``"co2"``: the Rasmussen & Williams
Mauna Loa kernel) into initial parameters (a flat dict ``name -> value``), transforms,
and a builder ``params -> (kernel, noise)``; the flat dict is what ``gpchol-fit.json``
stores, so a fitted model is rebuilt from JSON alone (no pickle).

Example:
    >>> from gpchol.cli.spec import ModelSpec
    >>> spec = ModelSpec.parse("matern52*periodic+white", d=1)
    >>> p = spec.init_params()
    >>> len(p), p["noise"], p["t0.periodic.period"]
    (5, 0.1, 1.0)
    >>> kernel, noise = spec.build(p)
    >>> type(kernel).__name__
    'Scale'
"""

from __future__ import annotations

import dataclasses
import functools
import operator
from typing import Any, cast

import jax
import jax.numpy as jnp

from gpchol import kernels as K
from gpchol._base.transforms import LogPositive, Positive

__all__ = ["KERNEL_NAMES", "LogPositive", "ModelSpec", "SpecError"]

_ALIASES = {
    "rbf": "rbf",
    "se": "rbf",
    "expsquared": "rbf",
    "matern12": "matern12",
    "matern32": "matern32",
    "matern52": "matern52",
    "rq": "rq",
    "rationalquadratic": "rq",
    "periodic": "periodic",
    "expsinesquared": "periodic",
    "linear": "linear",
    "poly": "poly",
    "polynomial": "poly",
    "constant": "constant",
    "white": "white",
}
KERNEL_NAMES: tuple[str, ...] = tuple(sorted(_ALIASES))
"""Every name the SPEC language knows."""


class SpecError(ValueError):
    """A SPEC that cannot be parsed (the message lists the known names)."""


def _factor_params(kind: str, d: int) -> dict[str, tuple[Any, Any]]:
    """``param -> (initial value, transform)`` for one factor (standardized inputs)."""
    ls = 1.0 if d == 1 else [1.0] * d
    if kind in ("rbf", "matern12", "matern32", "matern52"):
        return {"lengthscale": (ls, Positive())}
    if kind == "rq":
        return {"lengthscale": (ls, Positive()), "alpha": (1.0, Positive())}
    if kind == "periodic":
        return {"lengthscale": (1.0, Positive()), "period": (1.0, Positive())}
    if kind == "linear":
        return {"offset": (0.0, None)}
    if kind == "poly":
        return {"variance": (1.0, Positive()), "offset": (1.0, Positive())}
    return {}  # constant


def _make_factor(kind: str, p: dict[str, Any]) -> K.Kernel:
    if kind == "rbf":
        return K.ExpSquared(lengthscale=p["lengthscale"])
    if kind == "matern12":
        return K.Matern12(lengthscale=p["lengthscale"])
    if kind == "matern32":
        return K.Matern32(lengthscale=p["lengthscale"])
    if kind == "matern52":
        return K.Matern52(lengthscale=p["lengthscale"])
    if kind == "rq":
        return K.RationalQuadratic(lengthscale=p["lengthscale"], alpha=p["alpha"])
    if kind == "periodic":
        return K.Periodic(lengthscale=p["lengthscale"], period=p["period"])
    if kind == "linear":
        return K.Linear(variance=1.0, offset=p["offset"])
    if kind == "poly":
        return K.Polynomial(degree=2, variance=p["variance"], offset=p["offset"])
    return K.Constant(1.0)


# R&W (2006, Sec. 5.4.3) values, used to start the CO2 fit; years and ppm.
_CO2_INIT = {
    "long.amplitude": 66.0**2,
    "long.lengthscale": 67.0,
    "seasonal.amplitude": 2.4**2,
    "seasonal.decay": 90.0,
    "seasonal.smoothness": 1.3,
    "medium.amplitude": 0.66**2,
    "medium.lengthscale": 1.2,
    "medium.alpha": 0.78,
    "short.amplitude": 0.18**2,
    "short.lengthscale": 0.134,
    "noise": 0.19**2,
}


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """A parsed model: the kernel SPEC, the input dimension and the noise handling.

    Attributes:
        spec: the SPEC string (or ``"co2"``).
        d: number of input columns.
        terms: tuple of product terms, each a tuple of canonical factor names.
        learn_noise: whether the SPEC has a ``white`` term.
        fixed_noise: the noise variance used when ``learn_noise`` is False.
    """

    spec: str
    d: int
    terms: tuple[tuple[str, ...], ...]
    learn_noise: bool
    fixed_noise: float = 1e-6

    @classmethod
    def parse(cls, spec: str, d: int, fixed_noise: float = 1e-6) -> ModelSpec:
        """Parses a SPEC such as ``"rbf+white"`` for ``d`` input columns.

        Args:
            spec: the SPEC string, or ``"co2"`` for the R&W Mauna Loa kernel (``d = 1``).
            d: number of input columns.
            fixed_noise: noise variance when the SPEC has no ``white`` term.

        Returns:
            A :class:`ModelSpec`.

        Raises:
            SpecError: on an empty or malformed SPEC or an unknown name (the message lists
                the known names).

        Example:
            >>> from gpchol.cli.spec import ModelSpec
            >>> ModelSpec.parse("rbf + white", d=2).terms
            (('rbf',),)
        """
        text = str(spec).strip().lower().replace(" ", "")
        if text == "co2":
            if d != 1:
                raise SpecError(f"the co2 kernel needs exactly 1 input column; got {d}.")
            return cls("co2", 1, (), True, fixed_noise)
        if not text:
            raise SpecError(
                "empty kernel SPEC; write e.g. 'rbf+white'. Known names: " + ", ".join(KERNEL_NAMES)
            )
        terms = []
        learn_noise = False
        for term in text.split("+"):
            names = term.split("*")
            if any(not nm for nm in names):
                raise SpecError(
                    f"malformed kernel SPEC {spec!r}: empty name around '+' or '*'. "
                    "Write e.g. 'matern52*periodic+white'."
                )
            unknown = [nm for nm in names if nm not in _ALIASES]
            if unknown:
                raise SpecError(
                    f"unknown kernel name {unknown[0]!r} in {spec!r}; known names: "
                    + ", ".join(KERNEL_NAMES)
                )
            kinds = tuple(_ALIASES[nm] for nm in names)
            if "white" in kinds:
                if len(kinds) > 1:
                    raise SpecError(
                        f"'white' (the observation noise) must be a term of its own in "
                        f"{spec!r}, e.g. 'rbf+white'."
                    )
                if learn_noise:
                    raise SpecError(f"'white' appears twice in {spec!r}.")
                learn_noise = True
                continue
            if len(set(kinds)) != len(kinds):
                raise SpecError(f"a kernel name repeats inside the product {term!r}.")
            terms.append(kinds)
        if not terms:
            raise SpecError(
                f"kernel SPEC {spec!r} has no kernel besides 'white'; add one, e.g. 'rbf+white'."
            )
        return cls(text, int(d), tuple(terms), learn_noise, float(fixed_noise))

    # ----------------------------------------------------------------------- params
    def _table(self) -> dict[str, tuple[Any, Any]]:
        if self.spec == "co2":
            return {k: (v, LogPositive()) for k, v in _CO2_INIT.items()}
        out: dict[str, tuple[Any, Any]] = {}
        for i, kinds in enumerate(self.terms):
            out[f"t{i}.amplitude"] = (1.0 / len(self.terms), Positive())
            for kind in kinds:
                for name, val in _factor_params(kind, self.d).items():
                    out[f"t{i}.{kind}.{name}"] = val
        if self.learn_noise:
            out["noise"] = (0.1, Positive())
        return out

    def init_params(self) -> dict[str, Any]:
        """Initial parameters, a flat dict ``name -> float or list`` (JSON-ready)."""
        return {k: v for k, (v, _) in self._table().items()}

    def transforms(self) -> dict[str, Any]:
        """The transforms of :meth:`init_params` (``Positive`` or ``None``)."""
        return {k: t for k, (_, t) in self._table().items()}

    def build(self, params: dict[str, Any]) -> tuple[K.Kernel, jax.Array]:
        """``params -> (kernel, noise variance)``.

        Args:
            params: a flat dict as from :meth:`init_params` (values may be traced).

        Returns:
            ``(kernel, noise)``.
        """
        p = {k: jnp.asarray(v) for k, v in params.items()}
        if self.spec == "co2":
            long = p["long.amplitude"] * K.ExpSquared(lengthscale=p["long.lengthscale"])
            seasonal = p["seasonal.amplitude"] * (
                K.ExpSquared(lengthscale=p["seasonal.decay"])
                * K.Periodic(lengthscale=p["seasonal.smoothness"], period=1.0)
            )
            medium = p["medium.amplitude"] * K.RationalQuadratic(
                lengthscale=p["medium.lengthscale"], alpha=p["medium.alpha"]
            )
            short = p["short.amplitude"] * K.ExpSquared(lengthscale=p["short.lengthscale"])
            return cast(K.Kernel, long + seasonal + medium + short), p["noise"]
        terms = []
        for i, kinds in enumerate(self.terms):
            factors = [
                _make_factor(kind, {n: p[f"t{i}.{kind}.{n}"] for n in _factor_params(kind, self.d)})
                for kind in kinds
            ]
            terms.append(p[f"t{i}.amplitude"] * functools.reduce(operator.mul, factors))
        kernel = cast(K.Kernel, functools.reduce(operator.add, terms))
        noise = p["noise"] if self.learn_noise else jnp.asarray(self.fixed_noise)
        return kernel, noise
