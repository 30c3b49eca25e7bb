"""The exact GP model: :class:`GaussianProcess`, its :class:`Posterior`, and the
conditioning diagnostic of its covariance (:class:`GPDiagnostics`,
:class:`SingularCovarianceWarning`)."""

from gpchol._gp.diagnostics import GPDiagnostics, SingularCovarianceWarning
from gpchol._gp.model import GaussianProcess, Posterior

__all__ = ["GPDiagnostics", "GaussianProcess", "Posterior", "SingularCovarianceWarning"]
