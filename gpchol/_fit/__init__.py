"""Fitting: the optax loop over a GP's hyperparameters, checkpoints and resume."""

from gpchol._fit.driver import FitResult, fit

__all__ = ["FitResult", "fit"]
