"""The exact GP model: :class:`GaussianProcess`, its :class:`Posterior`, and the
conditioning diagnostic of its covariance (:class:`GPDiagnostics`,
:class:`SingularCovarianceWarning`)."""

from gpchol._gp.diagnostics import GPDiagnostics, SingularCovarianceWarning
from gpchol._gp.model import GaussianProcess
from gpchol._gp.multioutput import Coregionalization, MultiOutputGP, MultiOutputPosterior
from gpchol._gp.posterior import Posterior

__all__ = [
    "Coregionalization",
    "GPDiagnostics",
    "GaussianProcess",
    "MultiOutputGP",
    "MultiOutputPosterior",
    "Posterior",
    "SingularCovarianceWarning",
]
