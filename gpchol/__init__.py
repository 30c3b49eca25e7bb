"""gpchol: a differentiable tiled Cholesky factorization and exact Gaussian processes for JAX.

The public API is flat: everything a user needs is named here; ``gpchol.kernels``,
``gpchol.means``, ``gpchol.likelihoods`` and ``gpchol.datasets`` are public submodules.
"""

import types as _types

from gpchol import datasets, kernels, likelihoods, means
from gpchol._base.compile_cache import enable_compile_cache
from gpchol._base.errors import NotPositiveDefiniteError
from gpchol._base.minibatch import minibatches
from gpchol._base.transforms import (
    Bounded,
    Identity,
    Positive,
    Transform,
    to_constrained,
    to_unconstrained,
)
from gpchol._fit import (
    BatchedFitResult,
    CheckpointError,
    FitInterrupted,
    FitResult,
    FitTerminated,
    fit,
    fit_batched,
)
from gpchol._gp import (
    Coregionalization,
    GaussianProcess,
    GPDiagnostics,
    MultiOutputGP,
    MultiOutputPosterior,
    Posterior,
    SingularCovarianceWarning,
)
from gpchol._gp.inducing import inducing_points
from gpchol._gp.posterior import additive_terms
from gpchol._gp.sparse import SparseGP, SparsePosterior
from gpchol._gp.svgp import SVGP, SVGPPosterior
from gpchol._linalg.solve import cho_inverse, cho_solve, logdet, mvn_logpdf, solve_triangular
from gpchol._persist import SaveFileError, load, save
from gpchol._routing import cholesky, cholesky_with_status
from gpchol.means import as_mean

__version__ = "0.1.0"

# Submodules imported on first attribute access: ``gpchol.numpyro`` imports NumPyro,
# ``gpchol.sklearn`` scikit-learn and ``gpchol.distributed`` sets up mesh machinery; none is
# paid for by ``import gpchol``.
_LAZY_SUBMODULES = ("distributed", "numpyro", "sklearn")


def __getattr__(name: str) -> _types.ModuleType:
    if name in _LAZY_SUBMODULES:
        import importlib

        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "SVGP",
    "BatchedFitResult",
    "Bounded",
    "CheckpointError",
    "Coregionalization",
    "FitInterrupted",
    "FitResult",
    "FitTerminated",
    "GPDiagnostics",
    "GaussianProcess",
    "Identity",
    "MultiOutputGP",
    "MultiOutputPosterior",
    "NotPositiveDefiniteError",
    "Positive",
    "Posterior",
    "SVGPPosterior",
    "SaveFileError",
    "SingularCovarianceWarning",
    "SparseGP",
    "SparsePosterior",
    "Transform",
    "__version__",
    "additive_terms",
    "as_mean",
    "cho_inverse",
    "cho_solve",
    "cholesky",
    "cholesky_with_status",
    "datasets",
    "enable_compile_cache",
    "fit",
    "fit_batched",
    "inducing_points",
    "kernels",
    "likelihoods",
    "load",
    "logdet",
    "means",
    "minibatches",
    "mvn_logpdf",
    "save",
    "solve_triangular",
    "to_constrained",
    "to_unconstrained",
]
