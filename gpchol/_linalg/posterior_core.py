r"""The one posterior core: every GP posterior predicts through it, behind a small solver.

A model conditioned on data ``y`` keeps a factor of its training covariance ``K`` and
``alpha = K^-1 (y - m(X))``. At test inputs ``Xs`` the posterior of the latent function is
(Rasmussen & Williams 2006, Alg. 2.1)::

    mean = m(Xs) + k(Xs, X) alpha,     var = k(x, x) - ||V[:, x]||^2,
    cov  = k(Xs, Xs) - V^T V,          V = L^-1 k(X, Xs)  (any W with W^T W = k K^-1 k).

What every model does alike is written here, once: the checks of the test inputs, block
size and test-point noise; the padding of the test points and the ``lax.map`` over blocks
of ``b`` of them (one ``(n, b)`` cross-covariance at a time); the jitted programs of mean
and variance, covariance and joint samples; clipping, noise and symmetrisation.

*What a solver supplies* (:class:`PosteriorSolver`, a pytree whose arrays are its
children): its training inputs ``inputs`` (``(n, d)``), the trailing shape ``outputs`` of
one test point's prediction (``()``, or ``(p,)`` for ``p`` outputs), its default block
size, and four block functions: :meth:`~PosteriorSolver.project` (the cross-covariance
of one block with the training data, its product with ``alpha`` and, on request, its
whitened form ``V``: this is where the factor and its solve live, dense, Kronecker or
sharded), and the prior's mean, marginal variance and covariance at test inputs. ``part``
is ``None`` (the whole model: the prior mean is added) or a part of the model's covariance
(one additive component, checked by the model; no prior mean).

Shapes: for ``m`` test points a prediction is ``(m, *outputs)``; ``V`` of a block of ``b``
points is ``(r, b q)``, ``q = prod(outputs)``, its columns ordered (test point, output);
a covariance is ``(m, *outputs, m, *outputs)``.
"""

from __future__ import annotations

import math
import warnings
from functools import partial
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec
from jax.typing import ArrayLike

from gpchol._base.buckets import bucket_size, pad_rows
from gpchol._base.validate import (
    as_inputs,
    check_finite_rows,
    check_int,
    check_jitter,
    input_mesh,
    is_concrete,
)
from gpchol._linalg.cholesky import factor_with_status

__all__ = [
    "SAMPLE_JITTER",
    "PosteriorSolver",
    "Predictions",
    "check_block_size",
    "checked_inputs",
    "checked_noise",
    "covariance",
    "default_block_size",
    "gaussian_samples",
    "predict",
    "predict_program",
    "relative_factor",
    "relative_jitters",
    "sample",
    "sample_count",
    "warn_if_failed",
]

#: The default block holds at most this many elements of the ``(n, b)`` cross-covariance
#: (8 MiB in float64), or ``n^2 / 16`` when that is larger: a few block-sized
#: temporaries stay a small fraction of the factor's ``n^2``.
_BLOCK_ELEMENTS = 1 << 20


class PosteriorSolver(Protocol):
    """What a model supplies to the posterior core (see the module docstring).

    A pytree: its arrays are children, its static set-up auxiliary data, so that the
    core's jitted programs take it as an argument (compiled once per structure).

    Attributes:
        inputs: ``(n, d)`` training inputs (the test inputs when ``Xs`` is ``None``).
        outputs: trailing shape of one test point's prediction: ``()`` or ``(p,)``.
        block_multiple: block sizes are rounded up to a multiple of this (1: any).
    """

    @property
    def inputs(self) -> jax.Array: ...

    @property
    def outputs(self) -> tuple[int, ...]: ...

    @property
    def block_multiple(self) -> int: ...

    def default_block(self, m: int) -> int:
        """Test points per block when none is given, for ``m`` test points."""
        ...

    def project(self, xb: jax.Array, part: Any, whiten: bool) -> tuple[jax.Array, jax.Array | None]:
        """``(k_part(xb, X) alpha (b, *outputs), V (r, b q) or None)`` for one block
        ``xb`` ``(b, d)``: ``V^T V = k_part(xb, X) K^-1 k_part(X, xb)``; ``V`` only with
        ``whiten``."""
        ...

    def prior_mean(self, xb: jax.Array) -> jax.Array:
        """``(b, *outputs)`` prior mean of the whole model at ``xb``."""
        ...

    def prior_variance(self, xb: jax.Array, part: Any) -> jax.Array:
        """``(b, *outputs)`` prior marginal variance ``k_part(x, x)`` at ``xb``."""
        ...

    def prior_covariance(self, xs: jax.Array, part: Any) -> jax.Array:
        """``(m q, m q)`` prior covariance at ``xs``, ordered (test point, output)."""
        ...


# ------------------------------------------------------------------ the small rules


def default_block_size(n: int, m: int) -> int:
    """Test points per block when none is given: ``max(2^20, n^2 / 16) / n``, at most ``m``.

    Args:
        n: number of training points (rows of the factor).
        m: number of test points.

    Returns:
        The block size ``b >= 1``; one block when ``m <= b``.

    Example:
        >>> default_block_size(8000, 10**6), default_block_size(500, 800)
        (500, 800)
    """
    b = max(_BLOCK_ELEMENTS, n * n // 16) // max(n, 1)
    return max(1, min(b, m))


def check_block_size(block_size: object) -> int | None:
    """``block_size`` (test points per block) as a positive ``int``, or ``None``.

    Raises:
        TypeError: not an integer (a bool, a float, a string).
        ValueError: smaller than 1.
    """
    return (
        None if block_size is None else check_int(block_size, "block_size", "test points per block")
    )


def sample_count(num: object) -> int:
    """``num`` of a posterior's ``sample`` as a non-negative ``int``, or a clear error."""
    return check_int(num, "num", "the number of samples", minimum=0, kind="a non-negative int")


def checked_inputs(Xs: ArrayLike | None, X: jax.Array, dtype: Any) -> jax.Array:
    """The test inputs ``(m, d)`` in ``dtype``: ``X`` when ``Xs`` is ``None``, else ``Xs``
    checked to have ``X``'s columns and (when concrete) no NaN or inf row. ``X`` sharded
    over a mesh is replicated: test points are blocked and padded, which a row-sharded
    array cannot be on an Explicit mesh."""
    if Xs is None:
        mesh = input_mesh(X)
        if mesh is not None:
            X = jax.sharding.reshard(X, NamedSharding(mesh, PartitionSpec()))
        return X.astype(dtype)
    Xs = as_inputs(Xs, "Xs")
    d = X.shape[1]
    if Xs.shape[1] != d:
        raise ValueError(
            f"Xs has {Xs.shape[1]} column(s) but the training inputs X have {d}; pass test "
            f"inputs of shape (m, {d})."
        )
    check_finite_rows(Xs, "Xs", "drop or impute those test points first")
    return Xs.astype(dtype)


def checked_noise(
    noise: ArrayLike | None,
    include_noise: bool,
    m: int,
    training: bool,
    model_noise: Any,
    outputs: tuple[int, ...],
    dtype: Any,
) -> jax.Array:
    """The observation-noise variance added at the test points.

    Args:
        noise: the test points' own variance, a scalar or ``(m,)`` (``None``: the model's).
        include_noise: add the model's noise when ``noise`` is ``None``.
        m: number of test points.
        training: the test points are the training inputs (``Xs=None``).
        model_noise: the model's noise: a scalar, ``(n,)`` per training point, or
            ``outputs``-shaped (one per output).
        outputs: the trailing shape of one prediction.
        dtype: the predictions' dtype.

    Returns:
        An array that broadcasts against ``(m, *outputs)``: ``()``, ``(m,)`` or
        ``outputs``.
    """
    if noise is None:
        if not include_noise:
            return jax.device_put(np.zeros((), dtype))  # an eager jnp.zeros compiles
        nz = jnp.asarray(model_noise)
        if outputs or nz.size == 1:
            return nz.astype(dtype).reshape(outputs if outputs else ())
        if not training:
            raise ValueError(
                "include_noise=True with per-point (heteroscedastic) training noise needs "
                f"the test points' own noise: pass noise=<scalar or ({m},) array>, or "
                "Xs=None for the training inputs."
            )
        return nz.astype(dtype)
    nz = jnp.asarray(noise)
    if not jnp.issubdtype(nz.dtype, jnp.floating) and not jnp.issubdtype(nz.dtype, jnp.integer):
        raise TypeError(f"noise must be a real scalar or (m,) array; got dtype {nz.dtype}.")
    if nz.ndim > 1 or (nz.ndim == 1 and nz.shape[0] != m):
        raise ValueError(
            f"noise (at the test points) must be a scalar or have shape ({m},), one "
            f"observation-noise variance per test point; got shape {tuple(nz.shape)}."
        )
    if is_concrete(nz):
        v = np.asarray(nz)
        if not np.all(np.isfinite(v)) or np.any(v < 0):
            raise ValueError(
                "noise (the test points' observation-noise variance) must be finite and >= 0."
            )
    return nz.astype(dtype)


def _block(solver: PosteriorSolver, block_size: object, own: int | None, m: int) -> int:
    """The block size for ``m`` test points: the call's, the posterior's, the solver's."""
    b = check_block_size(block_size)
    b = own if b is None else b
    b = solver.default_block(m) if b is None else b
    b = max(1, min(b, m))
    k = solver.block_multiple
    return -(-b // k) * k


def _pad(x: jax.Array, size: int) -> jax.Array:
    """``x`` with copies of its last row up to ``size`` rows (on the host when concrete:
    nothing to compile per size)."""
    if is_concrete(x):
        xn = np.asarray(x)
        return jax.device_put(pad_rows(xn, size, xn[-1]))
    return jnp.concatenate([x, jnp.broadcast_to(x[-1:], (size - x.shape[0],) + x.shape[1:])])


def _first_rows(x: jax.Array, m: int) -> jax.Array:
    """``x[:m]`` (by NumPy when ``x`` is concrete: nothing to compile per ``m``)."""
    return jax.device_put(np.asarray(x)[:m]) if is_concrete(x) else x[:m]


def _project(
    solver: PosteriorSolver, xb: jax.Array, part: Any, whiten: bool
) -> tuple[jax.Array, jax.Array | None]:
    """The solver's projection of one block, with the prior mean for the whole model."""
    mu, V = solver.project(xb, part, whiten)
    if part is None:
        mu = mu + solver.prior_mean(xb).astype(mu.dtype)
    return mu, V


def _map_blocks(f: Any, Xs: jax.Array, b: int) -> Any:
    """``f`` over blocks of ``b`` rows of ``Xs`` (a ``lax.map``; the last block padded
    with copies of the last row): its outputs stacked, ``(blocks, ...)``."""
    m = Xs.shape[0]
    if m == b:
        return jax.tree.map(lambda o: o[None], f(Xs))
    nblk = -(-m // b)
    return lax.map(f, _pad(Xs, nblk * b).reshape(nblk, b, Xs.shape[1]))


def _rows(o: jax.Array, m: int) -> jax.Array:
    """``(blocks, b, ...)`` -> ``(m, ...)``: the blocks' rows joined, the padding dropped."""
    return o.reshape((-1,) + o.shape[2:])[:m]


# ------------------------------------------------------------------ jitted programs


@partial(jax.jit, static_argnames=("want_var", "b"))
def predict_program(
    solver: PosteriorSolver,
    Xs: jax.Array,
    part: Any,
    noise: jax.Array,
    *,
    want_var: bool,
    b: int,
) -> tuple[jax.Array, jax.Array]:
    """``(mean, variance + noise)`` at ``Xs`` (``(m, *outputs)`` each), block by block."""

    def block(xb: jax.Array) -> tuple[jax.Array, jax.Array]:
        mu, V = _project(solver, xb, part, want_var)
        if V is None:
            return mu, jnp.zeros_like(mu)
        var = solver.prior_variance(xb, part).astype(mu.dtype)
        return mu, jnp.maximum(var - jnp.sum(V * V, axis=0).reshape(mu.shape), 0.0)

    m = Xs.shape[0]
    mu, var = (_rows(o, m) for o in _map_blocks(block, Xs, b))
    return mu, var + noise


@partial(jax.jit, static_argnames=("b",))
def _covariance_program(
    solver: PosteriorSolver, Xs: jax.Array, part: Any, noise: jax.Array, *, b: int
) -> tuple[jax.Array, jax.Array]:
    """``(mean (m, *outputs), cov (m q, m q))``; ``V`` is built block by block."""
    m = Xs.shape[0]
    mu, V = _map_blocks(lambda xb: _project(solver, xb, part, True), Xs, b)
    mu = _rows(mu, m)
    # (r, m q); the size written out: with no training rows (a prior, r = 0) -1 is undefined
    cols = V.shape[0] * math.prod(V.shape[2:])
    V = jnp.moveaxis(V, 0, 1).reshape(V.shape[1], cols)[:, : mu.size]
    C = solver.prior_covariance(Xs, part).astype(mu.dtype) - V.T @ V
    C = 0.5 * (C + C.T)
    return mu, C + jnp.diag(jnp.broadcast_to(noise, mu.shape).reshape(-1))


@partial(jax.jit, static_argnames=("b", "num", "jitter", "eigen"))
def _sample_program(
    solver: PosteriorSolver,
    key: jax.Array,
    Xs: jax.Array,
    part: Any,
    noise: jax.Array,
    *,
    b: int,
    num: int,
    jitter: tuple[float, ...],
    eigen: bool,
) -> tuple[jax.Array, jax.Array]:
    mu, C = _covariance_program(solver, Xs, part, noise, b=b)
    z, status = gaussian_samples(key, mu.reshape(-1), C, num, jitter, eigen)
    return z.reshape((num,) + mu.shape), status


SAMPLE_JITTER = "auto"
"""The default jitter of joint samples: see :func:`relative_jitters`."""


def relative_jitters(jitter: object, dtype: Any) -> tuple[tuple[float, ...], bool]:
    """``(schedule, eigen)``: the relative jitters for a sample's covariance in ``dtype``,
    and whether the eigendecomposition is the last resort (:func:`relative_factor`).

    ``"auto"``: ``1e-10, 1e-8, 1e-6`` in float64 (``1e-6, 1e-5, 1e-4`` in float32: a
    smaller jitter is under the rounding of ``C / max(diag C)`` and changes nothing), then
    the eigendecomposition. Otherwise ``jitter`` as
    :func:`~gpchol._base.validate.check_jitter` reads it (``None``: no jitter), alone.
    """
    if isinstance(jitter, str) and jitter == "auto":
        eps = float(jnp.finfo(dtype).eps)
        ladder = (1e-10, 1e-8, 1e-6) if eps < 1e-12 else (1e-6, 1e-5, 1e-4)
        return tuple(j for j in ladder if j >= 4 * eps) or (min(1.0, 100 * eps),), True
    return check_jitter(jitter) or (0.0,), False


def relative_factor(
    C: jax.Array, jitter: tuple[float, ...], eigen: bool = False
) -> tuple[jax.Array, jax.Array]:
    """``(L, status)``: a lower-triangular ``L`` with ``L L^T = C`` (``(m, m)``, symmetric,
    positive semi-definite up to rounding), with jitters relative to its largest variance.

    A posterior covariance at nearby test points is singular to rounding (the prior is
    smooth and the data pin it down; in float32 its smallest eigenvalues reach ``-1e-3``
    of the largest variance), so ``C / s`` with ``s = max diag C`` is factored as
    ``C / s + j I`` for the first ``j`` of ``jitter`` that succeeds, and ``L = sqrt(s)
    L_s``. With ``eigen``, when every ``j`` fails: ``C / s = Q diag(w) Q^T`` with the
    negative ``w`` set to 0 (the closest positive semi-definite matrix in the Frobenius
    norm, Higham 1988), ``A = Q diag(sqrt(w))`` and ``A^T = Q_r R``, so ``A A^T = R^T R``
    and ``L_s = R^T`` with its columns' signs made positive (``L`` may have zeros on its
    diagonal). Only rounding is clipped so: a ``w`` below ``-10 sqrt(m eps)`` of the largest
    ``|w|`` (a bound well above the rounding measured: ``-1e-2`` at ``m = 3000`` in float32,
    where the bound is ``0.19``) means ``C`` is not positive semi-definite (a kernel that is
    not), and ``L`` is NaN. This branch has no useful derivative (NaN), and under ``vmap``
    (where the condition becomes a select) it is computed for every element. ``status``: 0, or
    LAPACK's ``info`` of the last jitter tried when ``L`` is NaN.
    """
    scale = jnp.maximum(jnp.max(jnp.diagonal(C)), jnp.finfo(C.dtype).tiny)
    Cs = C / scale
    Ls, status = factor_with_status(Cs, jitter=jitter)[:2]
    if eigen:

        def clipped(_: None) -> tuple[jax.Array, jax.Array]:
            w, Q = jnp.linalg.eigh(Cs)  # symmetrizes its input itself
            R = jnp.linalg.qr((Q * jnp.sqrt(jnp.maximum(w, 0.0))).T, mode="r")
            L = R.T * jnp.where(jnp.diagonal(R) < 0, -1.0, 1.0).astype(R.dtype)
            tol = (
                10 * math.sqrt(Cs.shape[-1] * float(jnp.finfo(Cs.dtype).eps)) * jnp.max(jnp.abs(w))
            )
            ok = (jnp.min(w) >= -tol) & jnp.all(jnp.isfinite(L))
            return jnp.where(ok, L, jnp.nan), jnp.where(ok, 0, status).astype(status.dtype)

        Ls, status = lax.cond(status != 0, clipped, lambda _: (Ls, status), None)
    return jnp.sqrt(scale) * Ls, status


def gaussian_samples(
    key: jax.Array,
    mu: jax.Array,
    C: jax.Array,
    num: int,
    jitter: tuple[float, ...],
    eigen: bool = False,
) -> tuple[jax.Array, jax.Array]:
    """``num`` joint samples of ``N(mu, C)``: ``mu + L z`` with ``L`` from
    :func:`relative_factor`.

    Args:
        key: a ``jax.random`` key.
        mu: ``(m,)`` mean.
        C: ``(m, m)`` covariance.
        num: number of samples (static).
        jitter: relative diagonal jitters, tried in order.
        eigen: the eigendecomposition when every jitter fails.

    Returns:
        ``(num, m)`` samples (NaN when the factor failed) and the factor's status.
    """
    L, status = relative_factor(C, jitter, eigen)
    z = jax.random.normal(key, (num, C.shape[0]), dtype=C.dtype)
    return mu[None, :] + z @ L.T, status


def warn_if_failed(
    status: jax.Array, jitter: tuple[float, ...], eigen: bool, what: str, stacklevel: int
) -> None:
    """A ``RuntimeWarning`` when a concrete ``status`` of :func:`relative_factor` (with
    ``jitter`` and ``eigen``) says the covariance could not be factored (the samples are
    NaN); nothing under a trace. ``stacklevel`` as :func:`warnings.warn`'s, counted from
    the caller."""
    if not (is_concrete(status) and int(np.max(np.asarray(status), initial=0)) != 0):
        return
    head = f"{what}: the covariance of the test points could not be factored"
    if eigen:
        text = (
            f"{head} with jitters up to {max(jitter):g} times its largest variance, nor by its "
            "eigendecomposition: it has NaN or inf, or eigenvalues too negative to be rounding "
            "(is the kernel positive definite?), so the samples are NaN."
        )
    else:
        tried = f"even with a jitter of {max(jitter):g} times its largest variance"
        text = (
            f"{head} {tried if max(jitter) > 0 else 'without jitter'}, so the samples are NaN; "
            'pass jitter="auto" or a larger jitter (e.g. 1e-3).'
        )
    warnings.warn(text, RuntimeWarning, stacklevel=stacklevel + 1)


# ------------------------------------------------------------------ the entry points


def _query(
    solver: PosteriorSolver,
    Xs: ArrayLike | None,
    *,
    dtype: Any,
    part: Any = None,
    noise: ArrayLike | None = None,
    include_noise: bool = False,
    model_noise: Any = None,
    block_size: object = None,
    own_block: int | None = None,
) -> tuple[jax.Array, jax.Array, int, Any]:
    """``(test inputs, test-point noise, block size, part)``, checked (see :func:`predict`)."""
    x = checked_inputs(Xs, solver.inputs, dtype)
    m = x.shape[0]
    nz = checked_noise(noise, include_noise, m, Xs is None, model_noise, solver.outputs, dtype)
    return x, nz, _block(solver, block_size, own_block, m), part


def predict(
    solver: PosteriorSolver, Xs: ArrayLike | None, *, want_var: bool = True, **query: Any
) -> tuple[jax.Array, jax.Array]:
    """Posterior ``(mean, variance)`` at ``Xs``, each ``(m, *outputs)``.

    Args:
        solver: the model's :class:`PosteriorSolver`.
        Xs: ``(m, d)`` test inputs (``None``: the training inputs).
        want_var: compute the variance (else it is zeros plus the noise).
        **query: ``dtype``; ``part`` (``None``: the whole model); ``noise``,
            ``include_noise`` and ``model_noise`` (see :func:`checked_noise`);
            ``block_size`` (the call's) and ``own_block`` (the posterior's; ``None``:
            the solver's default).

    Returns:
        ``(mean, variance)``; the latent variance is clipped at 0 before the noise.
    """
    x, nz, b, part = _query(solver, Xs, **query)
    m = x.shape[0]
    if m == 0:
        empty = jnp.zeros((0, *solver.outputs), x.dtype)
        return empty, empty
    # padded to a size bucket or whole blocks: varying m shares one program (rows independent)
    size = -(-m // b) * b
    if b >= m:
        bb = _block(solver, query.get("block_size"), query.get("own_block"), bucket_size(m))
        if bb >= bucket_size(m):
            size = b = bb
    if size > m:
        x = _pad(x, size)
        if nz.ndim == 1 + len(solver.outputs):  # one variance per test point
            nz = _pad(nz, size)
    mu, var = predict_program(solver, x, part, nz, want_var=want_var, b=b)
    return (_first_rows(mu, m), _first_rows(var, m)) if size > m else (mu, var)


def covariance(solver: PosteriorSolver, Xs: ArrayLike | None, **query: Any) -> jax.Array:
    """Posterior covariance at ``Xs``, ``(m, *outputs, m, *outputs)``, symmetric, with the
    noise on its diagonal (arguments as for :func:`predict`)."""
    x, nz, b, part = _query(solver, Xs, **query)
    shape = (x.shape[0], *solver.outputs)
    if x.shape[0] == 0:
        return jnp.zeros(shape + shape, x.dtype)
    return _covariance_program(solver, x, part, nz, b=b)[1].reshape(shape + shape)


def sample(
    solver: PosteriorSolver,
    key: jax.Array,
    Xs: ArrayLike | None,
    num: object,
    *,
    jitter: Any,
    **query: Any,
) -> jax.Array:
    """``(num, m, *outputs)`` joint posterior samples at ``Xs`` (``jitter`` as for
    :func:`gaussian_samples`, other arguments as for :func:`predict`)."""
    k = sample_count(num)
    x, nz, b, part = _query(solver, Xs, **query)
    rel, eigen = relative_jitters(jitter, x.dtype)
    if x.shape[0] == 0:
        return jnp.zeros((k, 0, *solver.outputs), x.dtype)
    z, status = _sample_program(solver, key, x, part, nz, b=b, num=k, jitter=rel, eigen=eigen)
    warn_if_failed(status, rel, eigen, "sample", stacklevel=3)  # the user's sample call
    return z


# ------------------------------------------------------------------ the methods


class Predictions:
    """The prediction methods of a Gaussian posterior, written once over the core.

    A posterior class inherits them and supplies ``_solver`` (its
    :class:`PosteriorSolver`) and ``_core_args(Xs, kernel, block_size)``: the ``**query``
    of :func:`predict` but the noise, after the model's own checks of ``Xs``.
    """

    @property
    def _solver(self) -> PosteriorSolver:
        raise NotImplementedError

    def _core_args(self, Xs: ArrayLike | None, kernel: Any, block_size: object) -> dict[str, Any]:
        raise NotImplementedError

    def mean_and_variance(
        self,
        Xs: ArrayLike | None = None,
        *,
        kernel: Any = None,
        include_noise: bool = False,
        noise: ArrayLike | None = None,
        block_size: int | None = None,
    ) -> tuple[jax.Array, jax.Array]:
        """Posterior mean and marginal variance in one pass (one cross-covariance per block).

        Args:
            Xs: ``(m, d)`` test inputs (``None``: the training inputs).
            kernel: ``None`` (the whole model), or one additive part of the model's
                covariance: the posterior of that component (no prior mean added).
            include_noise: add the model's observation-noise variance (a scalar noise,
                or ``Xs=None`` with per-point noise): the predictive variance of ``y``.
            noise: the test points' own noise variance, a scalar or ``(m,)`` (implies
                ``include_noise``).
            block_size: test points per block (``None``: the posterior's default).

        Returns:
            ``(mean, variance)``, each ``(m,)``; the latent variance clipped at 0 before
            the noise is added.

        Example:
            >>> import jax.numpy as jnp
            >>> from gpchol import GaussianProcess, kernels
            >>> post = GaussianProcess(kernels.ExpSquared(), jnp.arange(3.0), noise=0.1
            ...                        ).condition(jnp.ones(3))
            >>> m, v = post.mean_and_variance(jnp.arange(5.0), noise=jnp.full(5, 0.2))
            >>> m.shape, bool(jnp.all(v >= 0.2))
            ((5,), True)
        """
        args = self._core_args(Xs, kernel, block_size)
        return predict(self._solver, Xs, noise=noise, include_noise=include_noise, **args)

    def mean(
        self, Xs: ArrayLike | None = None, *, kernel: Any = None, block_size: int | None = None
    ) -> jax.Array:
        """Posterior mean of the latent function at ``Xs``, ``(m,)``.

        Arguments as for :meth:`mean_and_variance` (``kernel=k_part``:
        ``k_part(Xs, X) K^-1 (y - m(X))`` for an exact GP).

        Example:
            >>> import jax.numpy as jnp
            >>> from gpchol import GaussianProcess, kernels
            >>> post = GaussianProcess(kernels.ExpSquared(), jnp.arange(3.0), noise=0.1
            ...                        ).condition(jnp.ones(3))
            >>> post.mean(jnp.linspace(0.0, 2.0, 7), block_size=3).shape
            (7,)
        """
        args = self._core_args(Xs, kernel, block_size)
        return predict(self._solver, Xs, want_var=False, **args)[0]

    def variance(
        self,
        Xs: ArrayLike | None = None,
        *,
        kernel: Any = None,
        include_noise: bool = False,
        noise: ArrayLike | None = None,
        block_size: int | None = None,
    ) -> jax.Array:
        """Posterior marginal variance at each test input, ``k(x, x) - ||V[:, x]||^2``,
        ``(m,)`` (arguments as for :meth:`mean_and_variance`).

        Example:
            >>> import jax.numpy as jnp
            >>> from gpchol import GaussianProcess, kernels
            >>> post = GaussianProcess(kernels.ExpSquared(), jnp.arange(3.0), noise=0.1
            ...                        ).condition(jnp.ones(3))
            >>> v = post.variance(jnp.array([1.0, 9.0]), noise=jnp.array([0.0, 0.5]))
            >>> [round(float(x), 2) for x in v]  # far from the data: prior 1 + noise 0.5
            [0.08, 1.5]
        """
        return self.mean_and_variance(
            Xs, kernel=kernel, include_noise=include_noise, noise=noise, block_size=block_size
        )[1]

    def covariance(
        self,
        Xs: ArrayLike | None = None,
        *,
        kernel: Any = None,
        include_noise: bool = False,
        noise: ArrayLike | None = None,
        block_size: int | None = None,
    ) -> jax.Array:
        """Posterior covariance ``k(Xs, Xs) - V^T V``, the ``(m, m)`` symmetric matrix.

        Arguments as for :meth:`mean_and_variance`; the noise goes on the diagonal (the
        covariance of new observations ``y*``).

        Example:
            >>> import jax.numpy as jnp
            >>> from gpchol import GaussianProcess, kernels
            >>> post = GaussianProcess(kernels.ExpSquared(), jnp.arange(3.0), noise=0.1
            ...                        ).condition(jnp.ones(3))
            >>> post.covariance(jnp.arange(4.0), include_noise=True).shape
            (4, 4)
        """
        args = self._core_args(Xs, kernel, block_size)
        return covariance(self._solver, Xs, noise=noise, include_noise=include_noise, **args)

    def sample(
        self,
        key: jax.Array,
        Xs: ArrayLike | None = None,
        num: int = 1,
        *,
        kernel: Any = None,
        include_noise: bool = False,
        noise: ArrayLike | None = None,
        jitter: float | tuple[float, ...] | str | None = SAMPLE_JITTER,
        block_size: int | None = None,
    ) -> jax.Array:
        """Joint samples from the posterior: of ``f``, or of new observations ``y*``.

        Args:
            key: a ``jax.random`` key.
            Xs: ``(m, d)`` test inputs (``None``: the training inputs).
            num: number of samples, a non-negative int (``__index__``, not a bool); static.
            jitter: diagonal jitters relative to the largest posterior variance, tried in
                order when factoring the posterior covariance. ``"auto"`` (default):
                ``1e-10, 1e-8, 1e-6`` in float64, ``1e-6, 1e-5, 1e-4`` in float32, then the
                eigendecomposition with the negative eigenvalues (rounding) set to 0. When
                every attempt fails the samples are NaN (a ``RuntimeWarning`` says so
                outside ``jit``).
            kernel, include_noise, noise, block_size: as for :meth:`mean_and_variance`
                (with noise: samples of ``y* = f + eps``).

        Returns:
            ``(num, m)`` samples.

        Raises:
            TypeError: ``num`` is not an integer (``2.7``, ``True``, a traced value).
            ValueError: ``num`` is negative.

        Example:
            >>> import jax, jax.numpy as jnp
            >>> from gpchol import GaussianProcess, kernels
            >>> X = jnp.linspace(0.0, 1.0, 4)
            >>> post = GaussianProcess(kernels.ExpSquared(0.5), X, noise=1e-2).condition(X)
            >>> key = jax.random.PRNGKey(0)
            >>> post.sample(key, jnp.array([0.2, 0.4, 0.9]), 2).shape
            (2, 3)
            >>> post.sample(key, jnp.array([0.2, 0.4]), 2, include_noise=True).shape  # y*
            (2, 2)
            >>> post.sample(key, jnp.zeros((0, 1)), 2).shape  # no test points
            (2, 0)
        """
        args = self._core_args(Xs, kernel, block_size)
        return sample(
            self._solver, key, Xs, num, jitter=jitter, noise=noise, include_noise=include_noise,
            **args,
        )  # fmt: skip
