r"""The posterior of an exact GP, predicted in blocks of test points under ``jit``.

Given the factor ``K = L L^T`` of the training covariance and ``alpha = K^-1 (y - m(X))``
(what :meth:`gpchol.GaussianProcess.condition` computes), the posterior of the latent
function at test inputs ``Xs`` is (Rasmussen & Williams 2006, Alg. 2.1)::

    mean = m(Xs) + k(Xs, X) alpha,     var = k(x, x) - ||L^-1 k(X, x)||^2,
    cov  = k(Xs, Xs) - V^T V,          V = L^-1 k(X, Xs).

The test points go through in blocks of ``b`` rows (a ``lax.map`` over blocks, the last
padded with copies of the last test point): each step builds one ``(n, b)``
cross-covariance and its triangular solve, so ``m = 10^6`` test points need the factor
plus one block, never an ``n x m`` matrix. Each prediction is one jitted program, traced
once per shape and option (cached), also when called eagerly.

*One additive component.* With ``k = k_1 + ... + k_p`` (a :class:`gpchol.kernels.Sum`),
``f = f_1 + ... + f_p`` with independent ``f_j ~ GP(0, k_j)`` and
``Cov(f_j(x), y) = k_j(x, X)``, so the posterior of ``f_j`` given ``y`` is (R&W 2006,
Sec. 5.4.3, the Mauna Loa decomposition)::

    mean_j = k_j(Xs, X) alpha,     var_j = k_j(x, x) - ||L^-1 k_j(X, x)||^2,

which ``kernel=k_j`` selects on every method (the prior mean function belongs to the
whole model, and is added only for the whole kernel).

*Observation noise at the test points.* The predictive distribution of a new observation
``y* = f(x*) + eps*`` adds ``Var(eps*)``: the model's scalar noise (``include_noise``),
or one variance per test point (``noise=``, for heteroscedastic models).

Example:
    >>> import jax.numpy as jnp
    >>> from gpchol import kernels
    >>> from gpchol import GaussianProcess
    >>> X = jnp.linspace(0.0, 1.0, 6)
    >>> trend, wiggle = kernels.Linear(variance=1.0), 0.1 * kernels.ExpSquared(0.2)
    >>> post = GaussianProcess(trend + wiggle, X, noise=1e-2).condition(2.0 * X)
    >>> Xs = jnp.linspace(0.0, 2.0, 5)
    >>> mean, var = post.mean_and_variance(Xs, kernel=trend, block_size=2)
    >>> mean.shape, var.shape
    ((5,), (5,))
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from functools import partial
from typing import Any, cast

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.typing import ArrayLike

from gpchol._base.buckets import bucket_size
from gpchol._base.validate import as_inputs, check_jitter, is_concrete
from gpchol._gp.diagnostics import GPDiagnostics, diagnose_factor
from gpchol._linalg.blocks import trsm
from gpchol._routing import cholesky_with_status
from gpchol.kernels import Kernel, Sum

__all__ = ["Posterior", "additive_terms", "default_block_size"]

#: The default block holds at most this many elements of the ``(n, b)`` cross-covariance
#: (8 MiB in float64), or ``n^2 / 16`` when that is larger: a few block-sized
#: temporaries stay a small fraction of the factor's ``n^2``.
_BLOCK_ELEMENTS = 1 << 20


def default_block_size(n: int, m: int) -> int:
    """Test points per block when none is given: ``max(2^20, n^2 / 16) / n``, at most ``m``.

    Args:
        n: number of training points.
        m: number of test points.

    Returns:
        The block size ``b >= 1``; one block when ``m <= b``.

    Example:
        >>> default_block_size(8000, 10**6), default_block_size(500, 800)
        (500, 800)
    """
    b = max(_BLOCK_ELEMENTS, n * n // 16) // max(n, 1)
    return max(1, min(b, m))


def additive_terms(kernel: Any) -> list[Any]:
    """The terms of a sum of kernels, left to right (``[kernel]`` if it is not a sum).

    Nested sums are flattened: ``(k1 + k2) + k3`` gives ``[k1, k2, k3]``.

    Args:
        kernel: a kernel (or any callable covariance).

    Returns:
        The list of terms (the objects themselves).

    Example:
        >>> from gpchol import kernels
        >>> k = kernels.ExpSquared() + kernels.Periodic() + kernels.White(0.1)
        >>> [type(t).__name__ for t in additive_terms(k)]
        ['ExpSquared', 'Periodic', 'White']
    """
    if isinstance(kernel, Sum):
        return additive_terms(kernel.kernel1) + additive_terms(kernel.kernel2)
    return [kernel]


def _sub_sums(kernel: Any) -> list[Any]:
    """Every node of the sum tree of ``kernel``: itself, its sub-sums and its terms."""
    out = [kernel]
    if isinstance(kernel, Sum):
        out += _sub_sums(kernel.kernel1) + _sub_sums(kernel.kernel2)
    return out


def _same_kernel(a: Any, b: Any) -> bool:
    """``a`` and ``b`` are the same kernel: the same object, or the same structure with
    the same (identical or concretely equal) parameters."""
    if a is b:
        return True
    if not isinstance(a, Kernel) or not isinstance(b, Kernel):
        return False
    la, ta = jax.tree.flatten(a)
    lb, tb = jax.tree.flatten(b)
    if cast(Any, ta) != tb:  # PyTreeDef has no typed __eq__
        return False
    for x, y in zip(la, lb, strict=True):
        if x is y:
            continue
        if not is_concrete(x, y):
            return False
        xa, ya = np.asarray(x), np.asarray(y)
        if xa.shape != ya.shape or not np.array_equal(xa, ya):
            return False
    return True


def _component(model: Any, part: Any) -> tuple[Any, bool]:
    """``(part, whole)``: ``part`` checked to be a part of ``model``; ``None`` when whole
    (the jitted programs then read the kernel off the posterior)."""
    if part is None:
        return None, True
    nodes = _sub_sums(model)
    for node in nodes:
        if _same_kernel(node, part):
            return (None, True) if node is model else (node, False)
    terms = ", ".join(type(t).__name__ for t in additive_terms(model))
    raise ValueError(
        f"kernel= must be the model's kernel or a part of its sum (one of its additive "
        f"terms, or a sum of neighbouring terms); got a {type(part).__name__} that is none "
        f"of them. The model's terms are [{terms}]; pass one of them, e.g. "
        "kernel=post.gp.kernel.kernel1 (gpchol._gp.posterior.additive_terms lists them)."
    )


def model_part(model: Any, part: Any) -> Any:
    """``part`` checked to be a part of the kernel ``model`` (see :meth:`Posterior.mean`'s
    ``kernel=``): ``None`` when it is the whole model, else the matching sub-kernel.

    Raises:
        ValueError: ``part`` is neither ``model`` nor a node of its sum tree.
    """
    node, whole = _component(model, part)
    return None if whole else node


def _check_block_size(block_size: object) -> int | None:
    if block_size is None:
        return None
    if isinstance(block_size, (bool, np.bool_)):
        raise TypeError(f"block_size must be a positive int or None; got {block_size!r}.")
    try:
        b = operator.index(block_size)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(
            f"block_size (test points per block) must be a positive int or None; got "
            f"{block_size!r} of type {type(block_size).__name__}."
        ) from None
    if b < 1:
        raise ValueError(f"block_size (test points per block) must be >= 1; got {b}.")
    return int(b)


def _kernel_diag(kernel: Any, x: jax.Array) -> jax.Array:
    """``k(x_i, x_i)`` for each row (``kernel.diag`` when the kernel has one)."""
    if isinstance(kernel, Kernel):
        return kernel.diag(x)
    return jax.vmap(lambda xi: kernel(xi[None, :], xi[None, :])[0, 0])(x)


def _cross(gp: Any, kern: Any, X: jax.Array, xb: jax.Array) -> jax.Array:
    """``k(X, xb)`` ``(n, b)``, zero on the training inputs' padded rows (the factor's
    identity block there: they then change no mean, variance or covariance)."""
    Ks = kern(X, xb).astype(xb.dtype)
    if gp.mask is None:
        return Ks
    return jnp.where(gp.mask[:, None], Ks, jnp.zeros((), Ks.dtype))


def _pad_rows(x: jax.Array, size: int) -> jax.Array:
    """``x`` with copies of its last row appended up to ``size`` rows (by NumPy when ``x``
    is concrete: nothing to compile per size)."""
    pad = size - x.shape[0]
    if is_concrete(x):
        xn = np.asarray(x)
        return jnp.asarray(np.concatenate([xn, np.repeat(xn[-1:], pad, axis=0)]))
    return jnp.concatenate([x, jnp.broadcast_to(x[-1:], (pad,) + x.shape[1:])])


def _first_rows(x: jax.Array, m: int) -> jax.Array:
    """``x[:m]`` (by NumPy when ``x`` is concrete: nothing to compile per ``m``)."""
    return jnp.asarray(np.asarray(x)[:m]) if is_concrete(x) else x[:m]


def _blockwise(f: Any, Xs: jax.Array, b: int) -> Any:
    """``f`` over blocks of ``b`` rows of ``Xs`` (a ``lax.map``), results joined along
    the first axis; the last block is padded with copies of the last row."""
    m = Xs.shape[0]
    if m <= b:
        return f(Xs)
    nblk = -(-m // b)
    pad = nblk * b - m
    Xp = jnp.concatenate([Xs, jnp.broadcast_to(Xs[-1:], (pad, Xs.shape[1]))]) if pad else Xs
    out = lax.map(f, Xp.reshape(nblk, b, Xs.shape[1]))

    def join(o: jax.Array) -> jax.Array:  # (nblk, ..., b) -> (..., m)
        return jnp.moveaxis(o, 0, -2).reshape(o.shape[1:-1] + (-1,))[..., :m]

    return jax.tree.map(join, out)


# ------------------------------------------------------------------ jitted programs


@partial(jax.jit, static_argnames=("whole", "want_var", "b"))
def _predict(
    post: Posterior,
    Xs: jax.Array,
    kern: Any,
    noise: jax.Array,
    *,
    whole: bool,
    want_var: bool,
    b: int,
) -> tuple[jax.Array, jax.Array]:
    """``(mean, variance + noise)`` at ``Xs`` (``(m,)`` each), block by block."""
    gp = post.gp
    X = gp.X.astype(Xs.dtype)
    alpha = post.alpha.astype(Xs.dtype)

    kern = gp.kernel if whole else kern

    def block(xb: jax.Array) -> tuple[jax.Array, jax.Array]:
        Ks = _cross(gp, kern, X, xb)  # (n, b)
        mu = Ks.T @ alpha
        if whole:
            mu = mu + gp.mean(xb).astype(xb.dtype)
        if not want_var:
            return mu, jnp.zeros_like(mu)
        V = trsm(post.L, Ks, left=True)
        var = _kernel_diag(kern, xb).astype(xb.dtype) - jnp.sum(V * V, axis=0)
        return mu, jnp.maximum(var, 0.0)

    mu, var = _blockwise(block, Xs, b)
    return mu, var + noise


@partial(jax.jit, static_argnames=("whole", "b"))
def _covariance(
    post: Posterior, Xs: jax.Array, kern: Any, noise: jax.Array, *, whole: bool, b: int
) -> tuple[jax.Array, jax.Array]:
    """``(mean (m,), cov (m, m))``; ``V = L^-1 k(X, Xs)`` is built block by block."""
    gp = post.gp
    X = gp.X.astype(Xs.dtype)
    alpha = post.alpha.astype(Xs.dtype)

    kern = gp.kernel if whole else kern

    def block(xb: jax.Array) -> tuple[jax.Array, jax.Array]:
        Ks = _cross(gp, kern, X, xb)
        mu = Ks.T @ alpha
        if whole:
            mu = mu + gp.mean(xb).astype(xb.dtype)
        return mu, trsm(post.L, Ks, left=True)

    mu, V = _blockwise(block, Xs, b)  # (m,), (n, m)
    C = kern(Xs, Xs).astype(Xs.dtype) - V.T @ V
    C = 0.5 * (C + C.T)
    return mu, C + jnp.diag(jnp.broadcast_to(noise, mu.shape))


@partial(jax.jit, static_argnames=("whole", "b", "num", "jitter"))
def _sample(
    post: Posterior,
    key: jax.Array,
    Xs: jax.Array,
    kern: Any,
    noise: jax.Array,
    *,
    whole: bool,
    b: int,
    num: int,
    jitter: tuple[float, ...],
) -> jax.Array:
    mu, C = _covariance(post, Xs, kern, noise, whole=whole, b=b)
    return gaussian_samples(key, mu, C, num, jitter)


def gaussian_samples(
    key: jax.Array, mu: jax.Array, C: jax.Array, num: int, jitter: tuple[float, ...]
) -> jax.Array:
    """``num`` joint samples of ``N(mu, C)``: ``mu + L z`` with ``L L^T = C`` (+ jitter).

    ``C / max(diag C)`` is factored, so that the jitter schedule is relative to the largest
    variance (a posterior covariance is often singular to rounding).

    Args:
        key: a ``jax.random`` key.
        mu: ``(m,)`` mean.
        C: ``(m, m)`` covariance.
        num: number of samples (static).
        jitter: relative diagonal jitters, tried in order.

    Returns:
        ``(num, m)`` samples.
    """
    scale = jnp.maximum(jnp.max(jnp.diagonal(C)), jnp.finfo(C.dtype).tiny)
    Ls, _, _ = cholesky_with_status(C / scale, jitter=jitter)
    z = jax.random.normal(key, (num, C.shape[0]), dtype=C.dtype)
    return mu[None, :] + jnp.sqrt(scale) * (z @ Ls.T)


# ------------------------------------------------------------------------ the class


class Posterior:
    r"""The posterior of a :class:`GaussianProcess` given ``y`` (from ``gp.condition(y)``).

    Every prediction runs as one jitted program (compiled once per shape and option) over
    blocks of ``block_size`` test points, so its memory is the factor ``L`` plus one
    ``(n, block_size)`` block however many test points there are. The default block size
    is :func:`default_block_size` (``max(2^20, n^2/16) / n`` points); set it per call or,
    for every call, with ``gp.condition(y, block_size=...)``.

    Methods take ``kernel=`` (one additive part of the model's kernel: the posterior of
    that component, see the module docstring), and ``noise=`` / ``include_noise`` (the
    predictive distribution of new observations ``y*`` instead of ``f``).

    Attributes:
        gp: the prior :class:`GaussianProcess`.
        L: ``(n, n)`` lower Cholesky factor of ``k(X, X) + diag(noise)`` (+ jitter; all
            NaN when the factorization failed).
        alpha: ``(n,)``, ``K^-1 (y - m(X))``.
        log_marginal_likelihood: scalar ``log p(y)`` (NaN on a failed factorization).
        status: int32 factorization status (0 = success, else the failing pivot).
        jitter_used: the jitter that was added to the diagonal.
        block_size: the default block size of this posterior's methods (``None``: chosen
            from ``n``).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from gpchol import kernels
        >>> from gpchol import GaussianProcess
        >>> X = jnp.linspace(0.0, 1.0, 6)
        >>> post = GaussianProcess(kernels.ExpSquared(0.3), X, noise=1e-3).condition(X ** 2)
        >>> Xs = jnp.array([0.25, 0.75])
        >>> post.mean(Xs).shape, post.covariance(Xs).shape
        ((2,), (2, 2))
        >>> post.sample(jax.random.PRNGKey(0), Xs, 3).shape
        (3, 2)
    """

    def __init__(
        self,
        gp: Any,
        L: jax.Array,
        alpha: jax.Array,
        log_marginal_likelihood: jax.Array,
        status: jax.Array,
        jitter_used: jax.Array,
        block_size: int | None = None,
    ) -> None:
        self.gp = gp
        self.L = L
        self.alpha = alpha
        self.log_marginal_likelihood = log_marginal_likelihood
        self.status = status
        self.jitter_used = jitter_used
        self.block_size = _check_block_size(block_size)

    def tree_flatten(self) -> tuple[tuple[Any, ...], tuple[int | None]]:
        children = (
            self.gp,
            self.L,
            self.alpha,
            self.log_marginal_likelihood,
            self.status,
            self.jitter_used,
        )
        return children, (self.block_size,)

    @classmethod
    def tree_unflatten(cls, aux: tuple[int | None], children: tuple[Any, ...]) -> Posterior:
        obj = object.__new__(cls)
        (
            obj.gp,
            obj.L,
            obj.alpha,
            obj.log_marginal_likelihood,
            obj.status,
            obj.jitter_used,
        ) = children
        (obj.block_size,) = aux
        return obj

    def __repr__(self) -> str:
        n, dtype = self.L.shape[-1], self.L.dtype
        return f"Posterior(n={n}, dtype={dtype}, block_size={self.block_size})"

    def diagnostics(self) -> GPDiagnostics:
        """Status and conditioning of the training covariance's factor ``L`` (``O(n)``).

        The same report as :meth:`GaussianProcess.diagnostics`, read off the factor this
        posterior holds.

        Example:
            >>> import jax.numpy as jnp
            >>> from gpchol import kernels
            >>> from gpchol import GaussianProcess
            >>> X = jnp.arange(3.0)
            >>> d = GaussianProcess(kernels.ExpSquared(), X, noise=0.1).condition(X).diagnostics()
            >>> int(d.status), bool(d.singular), 0.0 < float(d.rcond) <= 1.0
            (0, False, True)
        """
        return diagnose_factor(self.L, self.status, self.jitter_used)

    # ------------------------------------------------------------------ argument checks
    def _Xs(self, Xs: ArrayLike | None) -> jax.Array:
        if Xs is None and self.gp.mask is not None:
            raise ValueError(
                "this posterior's training inputs include padded rows (mask); pass the test "
                "inputs Xs explicitly (e.g. the real training points)."
            )
        Xs = self.gp.X if Xs is None else as_inputs(Xs, "Xs")
        d = self.gp.X.shape[1]
        if Xs.shape[1] != d:
            raise ValueError(
                f"Xs (the test inputs) has {Xs.shape[1]} column(s) but the training inputs X "
                f"have {d}; pass Xs of shape (m, {d})."
            )
        if is_concrete(Xs):
            bad = ~np.all(np.isfinite(np.asarray(Xs)), axis=1)
            if np.any(bad):
                rows = np.flatnonzero(bad)
                raise ValueError(
                    f"Xs (the test inputs) has NaN or inf in row(s) {rows[:5].tolist()}"
                    + (f" and {rows.size - 5} more" if rows.size > 5 else "")
                    + "; drop or impute those rows first."
                )
        return Xs.astype(self.L.dtype)

    def _block(self, block_size: object, m: int) -> int:
        b = _check_block_size(block_size)
        if b is None:
            b = self.block_size
        if b is None:
            return default_block_size(self.L.shape[-1], m)
        return max(1, min(b, m))

    def _noise(
        self, noise: ArrayLike | None, include_noise: bool, m: int, training: bool
    ) -> jax.Array:
        """The observation-noise variance to add at the test points: ``()`` or ``(m,)``."""
        dtype = self.L.dtype
        if noise is None:
            if not include_noise:
                return jnp.zeros((), dtype)
            nz = jnp.asarray(self.gp.noise)
            if nz.ndim == 1 and nz.shape[0] != 1 and not training:
                raise ValueError(
                    "include_noise=True with per-point (heteroscedastic) training noise needs "
                    "the test points' own noise: pass noise=<(m,) variances> (or Xs=None for "
                    "the training inputs)."
                )
            return nz.astype(dtype).reshape(nz.shape if nz.shape != (1,) else ())
        nz = jnp.asarray(noise)
        if not jnp.issubdtype(nz.dtype, jnp.floating) and not jnp.issubdtype(nz.dtype, jnp.integer):
            raise TypeError(f"noise must be a real scalar or (m,) array; got dtype {nz.dtype}.")
        if nz.ndim > 1 or (nz.ndim == 1 and nz.shape[0] != m):
            raise ValueError(
                f"noise (the test points' observation-noise variance) must be a scalar or "
                f"have shape ({m},), one variance per test point; got shape {tuple(nz.shape)}."
            )
        if is_concrete(nz):
            v = np.asarray(nz)
            if not np.all(np.isfinite(v)) or np.any(v < 0):
                raise ValueError(
                    "noise (the test points' observation-noise variance) must be finite and >= 0."
                )
        return nz.astype(dtype)

    # -------------------------------------------------------------------- predictions
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
            kernel: ``None`` (the whole model), or one additive part of the model's kernel:
                the posterior of that component (no prior mean added).
            include_noise: add the model's observation-noise variance (a scalar noise,
                or ``Xs=None`` with per-point noise): the predictive variance of ``y``.
            noise: the test points' own noise variance, a scalar or ``(m,)`` (implies
                ``include_noise``).
            block_size: test points per block (``None``: the posterior's default).

        Returns:
            ``(mean, variance)``, each ``(m,)``; variances clipped at 0.

        Example:
            >>> import jax.numpy as jnp
            >>> from gpchol import kernels
            >>> from gpchol import GaussianProcess
            >>> post = GaussianProcess(kernels.ExpSquared(), jnp.arange(3.0), noise=0.1
            ...                        ).condition(jnp.ones(3))
            >>> m, v = post.mean_and_variance(jnp.arange(5.0), noise=jnp.full(5, 0.2))
            >>> m.shape, bool(jnp.all(v >= 0.2))
            ((5,), True)
        """
        return self._predict(Xs, kernel, include_noise, noise, block_size, want_var=True)

    def _predict(
        self,
        Xs: ArrayLike | None,
        kernel: Any,
        include_noise: bool,
        noise: ArrayLike | None,
        block_size: object,
        *,
        want_var: bool,
    ) -> tuple[jax.Array, jax.Array]:
        training = Xs is None
        x = self._Xs(Xs)
        m = x.shape[0]
        kern, whole = _component(self.gp.kernel, kernel)
        nz = self._noise(noise, include_noise, m, training)
        b = self._block(block_size, m)
        if m == 0:
            empty = jnp.zeros((0,), x.dtype)
            return empty, empty
        # Test points padded to a size bucket (one block) or to whole blocks, so that
        # predictions at a varying number of points share one program; each point's
        # result depends on its own row only, and the padded rows are dropped.
        size = -(-m // b) * b
        if b == m and self._block(block_size, bucket_size(m)) == bucket_size(m):
            size = b = bucket_size(m)
        if size > m:
            x = _pad_rows(x, size)
            if nz.ndim == 1:
                nz = _pad_rows(nz, size)
        mu, var = _predict(self, x, kern, nz, whole=whole, want_var=want_var, b=b)
        return (_first_rows(mu, m), _first_rows(var, m)) if size > m else (mu, var)

    def mean(
        self,
        Xs: ArrayLike | None = None,
        *,
        kernel: Any = None,
        block_size: int | None = None,
    ) -> jax.Array:
        """Posterior mean of the latent function, ``m(Xs) + k(Xs, X) alpha``.

        Args:
            Xs: ``(m, d)`` test inputs (``None``: the training inputs).
            kernel: ``None`` (the whole model) or one additive part of the model's kernel:
                then ``k_part(Xs, X) alpha``, the posterior mean of that component.
            block_size: test points per block (``None``: the posterior's default).

        Returns:
            ``(m,)`` posterior means.

        Example:
            >>> import jax.numpy as jnp
            >>> from gpchol import kernels
            >>> from gpchol import GaussianProcess
            >>> post = GaussianProcess(kernels.ExpSquared(), jnp.arange(3.0), noise=0.1
            ...                        ).condition(jnp.ones(3))
            >>> post.mean(jnp.linspace(0.0, 2.0, 7), block_size=3).shape
            (7,)
        """
        return self._predict(Xs, kernel, False, None, block_size, want_var=False)[0]

    def variance(
        self,
        Xs: ArrayLike | None = None,
        *,
        kernel: Any = None,
        include_noise: bool = False,
        noise: ArrayLike | None = None,
        block_size: int | None = None,
    ) -> jax.Array:
        """Posterior marginal variance at each test input, ``k(x, x) - ||L^-1 k(X, x)||^2``.

        Args:
            Xs: ``(m, d)`` test inputs (``None``: the training inputs).
            kernel: ``None`` (the whole model) or one additive part of the model's kernel
                (the variance of that component given ``y``).
            include_noise: add the model's observation-noise variance (needs a scalar
                noise, or ``Xs=None`` with per-point noise): the predictive variance of
                a new observation ``y``.
            noise: the test points' own observation-noise variance, a scalar or ``(m,)``
                (heteroscedastic models); implies ``include_noise``.
            block_size: test points per block (``None``: the posterior's default).

        Returns:
            ``(m,)`` variances (the latent part clipped at 0).

        Example:
            >>> import jax.numpy as jnp
            >>> from gpchol import kernels
            >>> from gpchol import GaussianProcess
            >>> post = GaussianProcess(kernels.ExpSquared(), jnp.arange(3.0), noise=0.1
            ...                        ).condition(jnp.ones(3))
            >>> v = post.variance(jnp.array([1.0, 9.0]), noise=jnp.array([0.0, 0.5]))
            >>> [round(float(x), 2) for x in v]  # far from the data: prior 1 + noise 0.5
            [0.08, 1.5]
        """
        return self._predict(Xs, kernel, include_noise, noise, block_size, want_var=True)[1]

    def covariance(
        self,
        Xs: ArrayLike | None = None,
        *,
        kernel: Any = None,
        include_noise: bool = False,
        noise: ArrayLike | None = None,
        block_size: int | None = None,
    ) -> jax.Array:
        """Posterior covariance, ``k(Xs, Xs) - V^T V`` (``V = L^-1 k(X, Xs)``).

        For a moderate number of test points: the result is ``(m, m)`` and ``V`` is
        ``(n, m)`` (built block by block).

        Args:
            Xs: ``(m, d)`` test inputs (``None``: the training inputs).
            kernel: ``None`` (the whole model) or one additive part of the model's kernel.
            include_noise: add the model's noise variance on the diagonal (covariance of
                new observations ``y*``).
            noise: the test points' own noise variance, scalar or ``(m,)``, added on the
                diagonal; implies ``include_noise``.
            block_size: test points per block (``None``: the posterior's default).

        Returns:
            ``(m, m)`` symmetric covariance.

        Example:
            >>> import jax.numpy as jnp
            >>> from gpchol import kernels
            >>> from gpchol import GaussianProcess
            >>> post = GaussianProcess(kernels.ExpSquared(), jnp.arange(3.0), noise=0.1
            ...                        ).condition(jnp.ones(3))
            >>> post.covariance(jnp.arange(4.0), include_noise=True).shape
            (4, 4)
        """
        training = Xs is None
        x = self._Xs(Xs)
        m = x.shape[0]
        kern, whole = _component(self.gp.kernel, kernel)
        nz = self._noise(noise, include_noise, m, training)
        b = self._block(block_size, m)
        if m == 0:
            return jnp.zeros((0, 0), x.dtype)
        return _covariance(self, x, kern, nz, whole=whole, b=b)[1]

    def sample(
        self,
        key: jax.Array,
        Xs: ArrayLike | None = None,
        num: int = 1,
        *,
        kernel: Any = None,
        include_noise: bool = False,
        noise: ArrayLike | None = None,
        jitter: float | Sequence[float] | None = (1e-10, 1e-8, 1e-6),
        block_size: int | None = None,
    ) -> jax.Array:
        """Joint samples from the posterior: of ``f``, or of new observations ``y*``.

        Args:
            key: a ``jax.random`` key.
            Xs: ``(m, d)`` test inputs (``None``: the training inputs); ``m = 0`` gives
                an empty ``(num, 0)`` result.
            num: number of samples, a non-negative Python int (anything with
                ``__index__``, not a bool); static.
            kernel: ``None`` (the whole model) or one additive part of the model's kernel.
            include_noise: sample ``y* = f + eps`` with the model's noise variance.
            noise: the test points' own noise variance (scalar or ``(m,)``) for ``y*``;
                implies ``include_noise``.
            jitter: schedule of diagonal jitter, relative to the largest posterior
                variance, tried in order when factoring the posterior covariance.
            block_size: test points per block (``None``: the posterior's default).

        Returns:
            ``(num, m)`` samples.

        Raises:
            TypeError: ``num`` is not an integer (e.g. ``2.7``, ``True`` or a traced
                value).
            ValueError: ``num`` is negative.

        Example:
            >>> import jax, jax.numpy as jnp
            >>> from gpchol import kernels
            >>> from gpchol import GaussianProcess
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
        num = sample_count(num)
        training = Xs is None
        x = self._Xs(Xs)
        m = x.shape[0]
        kern, whole = _component(self.gp.kernel, kernel)
        nz = self._noise(noise, include_noise, m, training)
        b = self._block(block_size, m)
        if m == 0:
            return jnp.zeros((num, 0), x.dtype)
        rel = check_jitter(jitter) or (0.0,)
        return _sample(self, key, x, kern, nz, whole=whole, b=b, num=num, jitter=rel)


jax.tree_util.register_pytree_node_class(Posterior)


def sample_count(num: object) -> int:
    """``num`` of a posterior's ``sample`` as a non-negative ``int``, or a clear error."""
    if isinstance(num, (bool, np.bool_)):
        raise TypeError(
            f"num (the number of samples) must be a non-negative int, not a bool; got {num!r}."
        )
    try:
        k = operator.index(num)  # type: ignore[arg-type]
    except TypeError:
        hint = (
            "; it is static, so pass a Python int (not a traced value inside jit)"
            if not is_concrete(num)
            else f"; pass an int, e.g. num={round(num)}"  # type: ignore[call-overload]
            if isinstance(num, (float, np.floating)) and np.isfinite(num)
            else ""
        )
        raise TypeError(
            f"num (the number of samples) must be a non-negative int; got {num!r} of type "
            f"{type(num).__name__}{hint}."
        ) from None
    if k < 0:
        raise ValueError(f"num (the number of samples) must be >= 0; got {k}.")
    return int(k)
