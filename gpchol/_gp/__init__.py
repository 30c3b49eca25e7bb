"""The exact GP model: :class:`GaussianProcess` and its :class:`Posterior`."""

from gpchol._gp.model import GaussianProcess, Posterior

__all__ = ["GaussianProcess", "Posterior"]
