r"""More kernel families: :class:`Cosine`, :class:`SpectralMixture`, :class:`ChangePoints`.

They follow the conventions of :mod:`gpchol.kernels._library` (inputs ``(n, d)``, blocks
``(n1, n2)``, parameters cast to the inputs' dtype, gradients finite at zero distance) and
are written as subclasses of the public :class:`~gpchol.kernels.Kernel` base: fields are
hyperparameters, registered as pytree leaves for them.
"""

from __future__ import annotations

import collections.abc
import functools
import math
import numbers
import operator
from typing import Any

import jax
import jax.numpy as jnp

from gpchol._base.validate import check_scalar_or_vector
from gpchol.kernels._library import (
    Kernel,
    UnitVariance,
    as_param,
    check_kernel,
    dimsum,
    normalize_active_dims,
    parameter,
    per_dim,
    select_columns,
    static,
)

__all__ = ["ChangePoints", "Cosine", "SpectralMixture"]


def _cos_term(u: jax.Array, v: jax.Array, freq: jax.Array) -> jax.Array:
    # the difference first: exact for nearby large inputs
    return (u - v) * freq


class Cosine(UnitVariance):
    r"""Cosine kernel: a single frequency (a sinusoid with a random phase and amplitude).

    .. math:: k(x, x') = \cos\left(2\pi \sum_{k=1}^{d} \frac{x_k - x'_k}{p_k}\right)

    Positive semi-definite (rank 2: ``cos(a - b) = cos a cos b + sin a sin b``). In one
    dimension it is ``cos(2 pi |x - x'| / p)``, tinygp's and GPyTorch's cosine kernel; in
    several dimensions the signed differences are summed, as in GPflow's ``Cosine`` (a
    norm of the differences, as tinygp's ``Cosine`` uses, would not be positive
    semi-definite in general). Unit variance: scale it for an amplitude.

    Args:
        period: ``p``, a positive scalar or shape ``(d,)``. Default 1.
        active_dims: static tuple of the input columns the kernel reads (``None``: all).

    Shapes: ``(n1, d), (n2, d) -> (n1, n2)``; ``diag``: ``(n,)`` of ones.

    Example:
        >>> import jax.numpy as jnp
        >>> import numpy as np
        >>> from gpchol.kernels import Cosine
        >>> k = Cosine(period=4.0)
        >>> K = k(jnp.array([0.0]), jnp.array([0.0, 1.0, 2.0]))
        >>> print(np.asarray(K, float).round(4) + 0.0)
        [[ 1.  0. -1.]]
    """

    period: Any = 1.0
    active_dims: tuple[int, ...] | None = static(default=None)

    def _eval(self, x1: jax.Array, x2: jax.Array) -> jax.Array:
        a = select_columns(x1, self.active_dims)
        b = select_columns(x2, self.active_dims)
        freq = (2.0 * math.pi) / per_dim(self.period, a, "period")
        return jnp.cos(dimsum(_cos_term, a, b, freq))


class SpectralMixture(Kernel):
    r"""Spectral mixture kernel of Wilson & Adams (2013), with one scale per dimension.

    A stationary kernel whose spectral density is a mixture of ``Q`` Gaussians (and their
    mirror images), with weights ``w_q``, mean frequencies ``mu_q`` and frequency standard
    deviations ``sigma_q`` (each of shape ``(d,)``); with ``tau = x - x'``:

    .. math:: k(x, x') = \sum_{q=1}^{Q} w_q \prod_{k=1}^{d}
              \exp\left(-2\pi^2 \tau_k^2 \sigma_{qk}^2\right) \cos(2\pi \tau_k \mu_{qk})

    the parametrisation of GPyTorch's ``SpectralMixtureKernel`` (``mixture_weights``,
    ``mixture_means``, ``mixture_scales``). A component with mean 0 is an
    :class:`ExpSquared` with lengthscale ``1 / (2 pi sigma)``.

    Args:
        weights: ``w``, positive, shape ``(Q,)``: the variances of the components.
        means: ``mu``, frequencies (cycles per unit of input), shape ``(Q, d)``, or
            ``(Q,)`` for the same value in every dimension. Any real number (``cos`` is
            even, so ``-mu`` is the same component), learned without a transform.
        scales: ``sigma``, positive, shape ``(Q, d)`` or ``(Q,)`` likewise.
        active_dims: static tuple of the input columns the kernel reads (``None``: all).

    Shapes: ``(n1, d), (n2, d) -> (n1, n2)``; ``diag``: ``(n,)`` filled with ``sum(w)``.

    Raises:
        ValueError: when the shapes of ``weights``, ``means`` and ``scales`` disagree or
            do not match the number of (active) input columns.

    Example:
        >>> import jax.numpy as jnp
        >>> import numpy as np
        >>> from gpchol.kernels import SpectralMixture
        >>> k = SpectralMixture(weights=jnp.array([1.0, 0.5]), means=jnp.array([0.0, 0.5]),
        ...                     scales=jnp.array([0.1, 0.2]))
        >>> print(np.asarray(k(jnp.array([0.0]), jnp.array([0.0, 1.0])), float).round(4))
        [[1.5    0.5938]]
    """

    weights: Any
    means: Any = parameter(transform=None)  # any real: the kernel is even in each mu
    scales: Any
    active_dims: tuple[int, ...] | None = static(default=None)

    def __post_init__(self) -> None:  # as ActiveDimsKernel's (its fields have no defaults)
        object.__setattr__(self, "active_dims", normalize_active_dims(self.active_dims))

    def _params(self, x: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        w = as_param(self.weights, x.dtype)
        if w.ndim != 1:
            raise ValueError(
                f"SpectralMixture: weights must have shape (Q,), one per component; got "
                f"shape {w.shape}"
            )
        q, d = w.shape[0], x.shape[1]
        out = []
        for name in ("means", "scales"):
            p = as_param(getattr(self, name), x.dtype)
            if p.ndim == 1 and p.shape[0] == q:
                p = p[:, None]
            if p.ndim != 2 or p.shape[0] != q or p.shape[1] not in (1, d):
                raise ValueError(
                    f"SpectralMixture: {name} must have shape ({q}, {d}) (components x input "
                    f"dimensions, after active_dims) or ({q},); got shape {p.shape}"
                )
            out.append(jnp.broadcast_to(p, (q, d)))
        return w, out[0], out[1]

    def _eval(self, x1: jax.Array, x2: jax.Array) -> jax.Array:
        a = select_columns(x1, self.active_dims)
        b = select_columns(x2, self.active_dims)
        w, mu, sigma = self._params(a)
        tau = a[:, None, :] - b[None, :, :]  # (n1, n2, d), the difference first
        out = jnp.zeros(tau.shape[:2], tau.dtype)
        for q in range(w.shape[0]):
            decay = jnp.exp(-2.0 * math.pi**2 * jnp.sum(jnp.square(tau * sigma[q]), axis=-1))
            wave = jnp.prod(jnp.cos(2.0 * math.pi * tau * mu[q]), axis=-1)
            out = out + w[q] * decay * wave
        return out

    def _diag(self, x: jax.Array) -> jax.Array:
        w, _, _ = self._params(select_columns(x, self.active_dims))
        return jnp.broadcast_to(jnp.sum(w), x.shape[:1])


class ChangePoints(Kernel):
    r"""Kernels that take over from one another at change points (GPflow's ``ChangePoints``).

    With ``m`` change points at locations ``l_1 < ... < l_m`` along input column ``dim``,
    each with a width ``s_j``, the sigmoids ``g_j(x) = sigmoid((x_dim - l_j) / s_j)`` switch
    from the kernel ``k_j`` to ``k_{j+1}``:

    .. math:: k(x, x') = \sum_{i=0}^{m} a_i(x)\, a_i(x')\, k_i(x, x'),
              \qquad a_i(x) = g_i(x)\,\bigl(1 - g_{i+1}(x)\bigr)

    with ``g_0 = 1`` and ``g_{m+1} = 0`` (so the first kernel has no start and the last no
    end). For one change point: ``(1 - g(x))(1 - g(x')) k_0 + g(x) g(x') k_1``. A
    sum of positive semi-definite kernels each multiplied by ``a_i(x) a_i(x')``, hence
    positive semi-definite. The locations are sorted before use (as GPflow does); the
    width is GPflow's ``1 / steepness``.

    Args:
        kernels: a sequence of ``m + 1 >= 2`` kernels (stored as a tuple).
        locations: ``l``, real, a scalar (one change point) or shape ``(m,)``.
        widths: ``s``, positive, a scalar or shape ``(m,)``. Default 1.
        dim: static index of the input column along which the changes happen. Default 0.

    Shapes: ``(n1, d), (n2, d) -> (n1, n2)``; ``diag``: ``(n,)``.

    Raises:
        TypeError / ValueError: on fewer than two kernels, a bad ``dim``, or
            ``locations``/``widths`` whose length is not ``len(kernels) - 1``.

    Example:
        >>> import jax.numpy as jnp
        >>> import numpy as np
        >>> from gpchol.kernels import ChangePoints, Constant
        >>> k = ChangePoints((Constant(1.0), Constant(4.0)), locations=0.0, widths=0.1)
        >>> print(np.asarray(k.diag(jnp.array([-5.0, 0.0, 5.0])), float).round(4))
        [1.   1.25 4.  ]
    """

    kernels: Any
    locations: Any = parameter(default=0.0, transform=None)
    widths: Any = 1.0
    dim: int = static(default=0)

    def __post_init__(self) -> None:
        # only the structure is checked: on unflattening (and in a pytree of transforms)
        # the entries may be other objects
        kernels = self.kernels
        if isinstance(kernels, Kernel) or (callable(kernels) and not isinstance(kernels, Kernel)):
            raise TypeError(
                "ChangePoints: kernels must be a sequence of at least two kernels (one more "
                f"than the change points); got {kernels!r}"
            )
        if isinstance(kernels, collections.abc.Iterator):  # a generator: read it once
            kernels = tuple(kernels)
        if isinstance(kernels, (list, tuple)):
            for k in kernels:
                check_kernel("ChangePoints", k)
            if len(kernels) < 2:
                raise ValueError(
                    "ChangePoints: kernels must be a sequence of at least two kernels (one "
                    f"more than the change points); got {len(kernels)}"
                )
            object.__setattr__(self, "kernels", tuple(kernels))
        dim = self.dim
        if isinstance(dim, bool) or not isinstance(dim, numbers.Integral):
            raise TypeError(f"ChangePoints: dim must be an int column index; got {dim!r}")
        object.__setattr__(self, "dim", int(dim))

    def _gates(self, x: jax.Array) -> jax.Array:
        """``a_i(x)`` for each kernel, shape ``(m + 1, n)``."""
        d = x.shape[1]
        if not -d <= self.dim < d:
            raise ValueError(
                f"ChangePoints: dim={self.dim} names a column that the input, with {d} "
                "column(s), does not have"
            )
        m = len(self.kernels) - 1
        locs = as_param(self.locations, x.dtype)
        widths = as_param(self.widths, x.dtype)
        for name, p in (("locations", locs), ("widths", widths)):
            per = "per change point (len(kernels) - 1)"
            check_scalar_or_vector(p.shape, m, f"ChangePoints: {name}", per)
        locs = jnp.broadcast_to(locs, (m,))
        widths = jnp.broadcast_to(widths, (m,))
        order = jnp.argsort(locs)
        locs, widths = locs[order], widths[order]
        g = jax.nn.sigmoid((x[:, self.dim][None, :] - locs[:, None]) / widths[:, None])
        ones = jnp.ones((1, x.shape[0]), x.dtype)
        start = jnp.concatenate([ones, g])  # g_i, i = 0..m (g_0 = 1)
        stop = jnp.concatenate([1.0 - g, ones])  # 1 - g_{i+1} (g_{m+1} = 0)
        return start * stop

    def _eval(self, x1: jax.Array, x2: jax.Array) -> jax.Array:
        a1, a2 = self._gates(x1), self._gates(x2)
        pairs = zip(a1, a2, self.kernels, strict=True)
        return functools.reduce(
            operator.add, ((u[:, None] * v[None, :]) * k._eval(x1, x2) for u, v, k in pairs)
        )

    def _diag(self, x: jax.Array) -> jax.Array:
        pairs = zip(self._gates(x), self.kernels, strict=True)
        return functools.reduce(operator.add, (jnp.square(a) * k._diag(x) for a, k in pairs))
