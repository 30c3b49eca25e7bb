"""What every fit loop holds while it runs: the checkpoint's lock, the signal guard, the
progress line, and the one way a state is committed.

:func:`gpchol.fit` (a Python loop over steps) and :func:`gpchol.fit_batched` (compiled
chunks of steps) both run inside a :class:`FitSession`: the checkpoint (when asked for) is
locked for the whole fit, SIGINT/SIGTERM are recorded and acted on between steps or chunks
after a commit (:mod:`gpchol._fit.signals`), and :meth:`FitSession.commit` writes the
checkpoint under the guard, so a second signal waits for the commit to complete.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import Any

from gpchol._fit.checkpoint import (
    CheckpointLock,
    checkpoint_exists,
    load_checkpoint,
    manifest_path,
    save_checkpoint,
)
from gpchol._fit.progress import ProgressLine
from gpchol._fit.signals import SignalGuard
from gpchol._fit.state import FitState

__all__ = ["FitSession", "fit_session"]


class FitSession:
    """One running fit's checkpoint, guard and progress line (see :func:`fit_session`).

    Attributes:
        checkpoint: the checkpoint's base path, or ``None``.
        guard: the :class:`gpchol._fit.signals.SignalGuard` (installed while the session
            is open).
        bar: the :class:`gpchol._fit.progress.ProgressLine`.
    """

    def __init__(
        self,
        checkpoint: str | None,
        fingerprint: dict[str, Any] | None,
        optimizer: str,
        bar: ProgressLine,
    ) -> None:
        self.checkpoint = checkpoint
        self._fingerprint = fingerprint
        self._optimizer = optimizer
        self.bar = bar
        self.guard = SignalGuard(None if checkpoint is None else manifest_path(checkpoint))

    def resumed(
        self, resume: bool, params_like: Any, init_opt_state: Callable[[Any], Any]
    ) -> FitState | None:
        """The checkpoint's state when ``resume`` and it exists (refused when written by
        another fit: :func:`gpchol._fit.checkpoint.load_checkpoint`), else ``None``."""
        if self.checkpoint is None or not resume or not checkpoint_exists(self.checkpoint):
            return None
        assert self._fingerprint is not None
        return load_checkpoint(
            self.checkpoint,
            fingerprint=self._fingerprint,
            params_like=params_like,
            init_opt_state=init_opt_state,
        )

    def commit(self, state: FitState) -> None:
        """Writes ``state`` to the checkpoint (none asked for: nothing); a second signal
        during the write waits until it is complete, then stops the fit."""
        if self.checkpoint is None:
            return
        assert self._fingerprint is not None
        with self.guard.commit():
            save_checkpoint(
                self.checkpoint, state, fingerprint=self._fingerprint, optimizer=self._optimizer
            )


@contextlib.contextmanager
def fit_session(
    checkpoint: str | os.PathLike[str] | None,
    *,
    fingerprint: dict[str, Any] | None,
    optimizer: str,
    progress: bool,
    steps: int,
    label: str,
) -> Iterator[FitSession]:
    """Opens a fit's session: locks the checkpoint, installs the signal guard, starts the
    progress line; closes all three however the fit ends.

    Args:
        checkpoint: the checkpoint's base path, or ``None`` (no lock, no commits).
        fingerprint: the fit's fingerprint, stored with each commit (required with a
            checkpoint).
        optimizer: the optimiser's name, stored with each commit.
        progress: print the progress line (stderr).
        steps: the most steps, for the progress line.
        label: the progress line's label.

    Yields:
        The :class:`FitSession`.

    Example:
        >>> from gpchol._fit.session import fit_session
        >>> with fit_session(None, fingerprint=None, optimizer="adam", progress=False,
        ...                  steps=10, label="fit") as session:
        ...     session.guard.pending is None
        True
    """
    path = None if checkpoint is None else os.fspath(checkpoint)
    with contextlib.ExitStack() as stack:
        if path is not None:
            stack.enter_context(CheckpointLock(path))
        bar = ProgressLine(progress, int(steps), label)
        stack.callback(bar.close)
        session = FitSession(path, fingerprint, optimizer, bar)
        stack.enter_context(session.guard)
        yield session
