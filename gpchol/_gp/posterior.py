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
    >>> from gpchol import GaussianProcess, kernels
    >>> X = jnp.linspace(0.0, 1.0, 6)
    >>> trend, wiggle = kernels.Linear(variance=1.0), 0.1 * kernels.ExpSquared(0.2)
    >>> post = GaussianProcess(trend + wiggle, X, noise=1e-2).condition(2.0 * X)
    >>> Xs = jnp.linspace(0.0, 2.0, 5)
    >>> mean, var = post.mean_and_variance(Xs, kernel=trend, block_size=2)
    >>> mean.shape, var.shape
    ((5,), (5,))
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, cast

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from gpchol._base.pytrees import AttrPytree, register_fields
from gpchol._base.validate import is_concrete
from gpchol._gp.diagnostics import GPDiagnostics, diagnose_factor
from gpchol._linalg import posterior_core as core
from gpchol._linalg.blocks import trsm
from gpchol.kernels import Kernel, Sum

__all__ = ["DenseSolver", "KernelPrior", "Posterior", "additive_terms", "default_block_size"]

default_block_size = core.default_block_size


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


def model_part(model: Any, part: Any) -> Any:
    """``part`` checked to be a part of the kernel ``model`` (see :meth:`Posterior.mean`'s
    ``kernel=``): ``None`` when it is the whole model (or ``None``), else the matching
    sub-kernel.

    Raises:
        ValueError: ``part`` is neither ``model`` nor a node of its sum tree.
    """
    if part is None:
        return None
    for node in _sub_sums(model):
        if _same_kernel(node, part):
            return None if node is model else node
    terms = ", ".join(type(t).__name__ for t in additive_terms(model))
    raise ValueError(
        f"kernel= must be the model's kernel or a part of its sum (one of its additive "
        f"terms, or a sum of neighbouring terms); got a {type(part).__name__} that is none "
        f"of them. The model's terms are [{terms}]; pass one of them, e.g. "
        "kernel=post.gp.kernel.kernel1 (gpchol._gp.posterior.additive_terms lists them)."
    )


def _kernel_diag(kernel: Any, x: jax.Array) -> jax.Array:
    """``k(x_i, x_i)`` for each row (``kernel.diag`` when the kernel has one)."""
    if isinstance(kernel, Kernel):
        return kernel.diag(x)
    return jax.vmap(lambda xi: kernel(xi[None, :], xi[None, :])[0, 0])(x)


class KernelPrior:
    """The prior half of a posterior-core solver for a model with a kernel: ``gp.X``,
    ``gp.kernel`` (or one additive ``part`` of it) and ``gp.mean`` at test inputs. The
    solvers add their fields (``gp`` first) and ``project``."""

    gp: Any
    outputs: ClassVar[tuple[int, ...]] = ()
    block_multiple: ClassVar[int] = 1

    @property
    def inputs(self) -> jax.Array:
        return self.gp.X

    def _kernel(self, part: Any) -> Any:
        return self.gp.kernel if part is None else part

    def prior_mean(self, xb: jax.Array) -> jax.Array:
        return self.gp.mean(xb)

    def prior_variance(self, xb: jax.Array, part: Any) -> jax.Array:
        return _kernel_diag(self._kernel(part), xb)

    def prior_covariance(self, xs: jax.Array, part: Any) -> jax.Array:
        return self._kernel(part)(xs, xs)


@register_fields
@dataclasses.dataclass(frozen=True)
class DenseSolver(KernelPrior):
    """The one-device exact GP for the posterior core: the dense factor ``L`` (n, n) of
    ``K`` and ``alpha`` (n,); ``V = L^-1 k(X, xb)`` by a triangular solve. Training rows
    outside the GP's mask get a zero cross-covariance (the factor's identity block there:
    they change no mean, variance or covariance)."""

    gp: Any
    L: jax.Array
    alpha: jax.Array

    def default_block(self, m: int) -> int:
        return core.default_block_size(self.L.shape[-1], m)

    def project(self, xb: jax.Array, part: Any, whiten: bool) -> tuple[jax.Array, jax.Array | None]:
        Ks = self._kernel(part)(self.gp.X.astype(xb.dtype), xb).astype(xb.dtype)  # (n, b)
        if self.gp.mask is not None:
            Ks = jnp.where(self.gp.mask[:, None], Ks, jnp.zeros((), Ks.dtype))
        mu = Ks.T @ self.alpha.astype(xb.dtype)
        return mu, (trsm(self.L, Ks, left=True) if whiten else None)


# ------------------------------------------------------------------------ the class


class Posterior(AttrPytree, core.Predictions):
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
        >>> from gpchol import GaussianProcess, kernels
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
        self.block_size = core.check_block_size(block_size)

    _CHILDREN = ("gp", "L", "alpha", "log_marginal_likelihood", "status", "jitter_used")
    _AUX = ("block_size",)

    def __repr__(self) -> str:
        n, dtype = self.L.shape[-1], self.L.dtype
        return f"Posterior(n={n}, dtype={dtype}, block_size={self.block_size})"

    def diagnostics(self) -> GPDiagnostics:
        """Status and conditioning of the training covariance's factor ``L`` (``O(n)``).

        The same report as :meth:`GaussianProcess.diagnostics`, read off the factor this
        posterior holds.

        Example:
            >>> import jax.numpy as jnp
            >>> from gpchol import GaussianProcess, kernels
            >>> X = jnp.arange(3.0)
            >>> d = GaussianProcess(kernels.ExpSquared(), X, noise=0.1).condition(X).diagnostics()
            >>> int(d.status), bool(d.singular), 0.0 < float(d.rcond) <= 1.0
            (0, False, True)
        """
        return diagnose_factor(self.L, self.status, self.jitter_used, self.gp.mask)

    def _core_args(self, Xs: ArrayLike | None, kernel: Any, block_size: object) -> dict[str, Any]:
        if Xs is None and self.gp.mask is not None:
            raise ValueError(
                "this posterior's training inputs include padded rows (mask); pass the test "
                "inputs Xs explicitly (e.g. the real training points)."
            )
        return dict(
            dtype=self.L.dtype,
            part=model_part(self.gp.kernel, kernel),
            model_noise=self.gp.noise,
            block_size=block_size,
            own_block=self.block_size,
        )

    @property
    def _solver(self) -> DenseSolver:
        return DenseSolver(self.gp, self.L, self.alpha)


jax.tree_util.register_pytree_node_class(Posterior)
