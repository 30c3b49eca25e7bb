"""Fitting: the optimisation loop over a GP's hyperparameters, checkpoints and resume.

Modules: :mod:`~gpchol._fit.driver` (:func:`fit`, a short driver over the steps of a fit),
:mod:`~gpchol._fit.state` (the state between steps), :mod:`~gpchol._fit.objective` (loss,
optimiser, jitted step, default transforms), :mod:`~gpchol._fit.lbfgs` (the default
optimiser: L-BFGS whose compiled step holds the loss once),
:mod:`~gpchol._fit.checkpoint` (the state on disk, committed atomically),
:mod:`~gpchol._fit.fingerprint` (what a checkpoint must match to be resumed),
:mod:`~gpchol._fit.signals` (SIGINT/SIGTERM between two steps) and
:mod:`~gpchol._fit.progress` (the progress line); :mod:`~gpchol._fit.batched`
(:func:`fit_batched`: many GPs in one compiled, vmapped loop).
"""

from gpchol._fit.batched import BatchedFitResult, fit_batched
from gpchol._fit.checkpoint import CheckpointError
from gpchol._fit.driver import FitResult, fit
from gpchol._fit.signals import FitInterrupted, FitTerminated

__all__ = [
    "BatchedFitResult",
    "CheckpointError",
    "FitInterrupted",
    "FitResult",
    "FitTerminated",
    "fit",
    "fit_batched",
]
