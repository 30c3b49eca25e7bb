"""SIGINT and SIGTERM during a fit: acted on between two steps, after a checkpoint commit.

While :func:`gpchol.fit` runs in the main thread, :class:`SignalGuard` replaces the
handlers of ``SIGINT`` (Ctrl-C) and ``SIGTERM`` with one that only records the signal, so
it never interrupts a step (a Python exception raised inside a compiled computation's
callback would surface as an XLA error) nor a checkpoint commit. At the next step
boundary the driver commits the checkpoint and calls :meth:`SignalGuard.deliver`, which
raises :class:`FitInterrupted` (a ``KeyboardInterrupt``) for ``SIGINT`` and
:class:`FitTerminated` (a ``SystemExit`` with status 143) for ``SIGTERM``; where the
previous handler was a Python function of the caller's own, that function is called
instead. A second signal before the boundary raises at once (outside a commit), so a step
that takes long can still be cut short; the last committed checkpoint stays intact. The
previous handlers are restored when the fit ends, however it ends. Signals set to be
ignored (``SIG_IGN``) stay ignored; outside the main thread nothing is installed.

Example:
    >>> import signal
    >>> from gpchol._fit.signals import FitInterrupted, SignalGuard
    >>> old = signal.signal(signal.SIGINT, signal.default_int_handler)  # not ignored
    >>> with SignalGuard() as guard:
    ...     signal.raise_signal(signal.SIGINT)  # recorded, not raised
    ...     try:
    ...         guard.deliver("fit", "between two steps")
    ...     except FitInterrupted as e:
    ...         print(type(e).__mro__[1].__name__, "-", str(e).split(":")[0])
    KeyboardInterrupt - fit stopped by SIGINT between two steps
    >>> _ = signal.signal(signal.SIGINT, old)
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

__all__ = ["FitInterrupted", "FitTerminated", "SignalGuard"]


class FitInterrupted(KeyboardInterrupt):
    """A fit stopped by ``SIGINT`` (Ctrl-C), after committing its checkpoint.

    A subclass of :class:`KeyboardInterrupt`. The message says where the fit stopped and
    whether a checkpoint holds that state (``resume=True``, the default, continues it).

    Attributes:
        checkpoint: the checkpoint's manifest path, or ``None`` (no checkpoint).

    Example:
        >>> from gpchol._fit.signals import FitInterrupted
        >>> isinstance(FitInterrupted("stopped", checkpoint=None), KeyboardInterrupt)
        True
    """

    def __init__(self, message: str, *, checkpoint: str | None = None) -> None:
        super().__init__(message)
        self.checkpoint = checkpoint


class FitTerminated(SystemExit):
    """A fit stopped by ``SIGTERM``, after committing its checkpoint.

    A subclass of :class:`SystemExit` with ``code`` 143 (128 + ``SIGTERM``): left
    uncaught, the program runs its ``finally`` blocks and exits with the status a shell
    reports for a process ended by ``SIGTERM``, without a traceback.

    Attributes:
        message: where the fit stopped and whether a checkpoint holds that state.
        checkpoint: the checkpoint's manifest path, or ``None`` (no checkpoint).

    Example:
        >>> from gpchol._fit.signals import FitTerminated
        >>> e = FitTerminated("stopped", checkpoint=None)
        >>> e.code, str(e)
        (143, 'stopped')
    """

    def __init__(self, message: str, *, checkpoint: str | None = None) -> None:
        super().__init__(128 + int(signal.SIGTERM))
        self.message = message
        self.checkpoint = checkpoint

    def __str__(self) -> str:
        return self.message


_SIGNALS = (signal.SIGINT, signal.SIGTERM)


_SECOND = (
    "fit stopped by a second signal before the step ended; the checkpoint holds the last "
    "state it committed."
)


def _exception(signum: int, message: str, checkpoint: str | None) -> BaseException:
    if signum == signal.SIGTERM:
        return FitTerminated(message, checkpoint=checkpoint)
    return FitInterrupted(message, checkpoint=checkpoint)


class SignalGuard:
    """Records SIGINT/SIGTERM while a fit runs, for the driver to act on between steps.

    A context manager: entering installs the handlers (main thread only), leaving restores
    the previous ones.

    Attributes:
        pending: the signal received and not yet delivered, or ``None``.
        checkpoint: the manifest path named in the exceptions (set by the driver).
    """

    def __init__(self, checkpoint: str | None = None) -> None:
        self.pending: int | None = None
        self.checkpoint = checkpoint
        self._frame: FrameType | None = None
        self._previous: dict[int, Any] = {}
        self._committing = False
        self._forced: int | None = None

    def __enter__(self) -> SignalGuard:
        if threading.current_thread() is not threading.main_thread():
            return self
        for sig in _SIGNALS:
            try:
                previous = signal.getsignal(sig)
                if previous is None or previous == signal.SIG_IGN:
                    continue  # set outside Python (cannot be restored), or ignored
                signal.signal(sig, self._handle)
            except (ValueError, OSError):  # not the main interpreter, or unsupported
                continue
            self._previous[sig] = previous
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.pending is None:
            self.pending, self._frame = signum, frame
            return
        self._forced = signum
        if not self._committing:
            raise _exception(signum, _SECOND, self.checkpoint)

    @property
    def forced(self) -> int | None:
        """The signal that was raised at once (a second one), or ``None``."""
        return self._forced

    def forced_exception(self) -> BaseException | None:
        """The exception for a second signal that hit a step or a commit, else ``None``."""
        if self._forced is None:
            return None
        return _exception(self._forced, _SECOND, self.checkpoint)

    @contextlib.contextmanager
    def commit(self) -> Iterator[None]:
        """A checkpoint commit: a second signal waits until it is complete."""
        self._committing = True
        try:
            yield
        finally:
            self._committing = False
        exc = self.forced_exception()
        if exc is not None:
            raise exc

    def deliver(self, who: str, where: str) -> None:
        """Acts on the pending signal (none: returns).

        Raises :class:`FitInterrupted` for ``SIGINT`` and :class:`FitTerminated` for
        ``SIGTERM``, with the message ``"{who} stopped by {signal} {where}: "`` and what
        the checkpoint holds (or that none was asked for); where the previous handler was
        a Python function of the caller's (not Python's default SIGINT handler, nor that
        of a fit this one runs inside), calls it instead and returns if it does.
        """
        signum, frame = self.pending, self._frame
        if signum is None:
            return
        self.pending, self._frame = None, None
        name = "SIGINT" if signum == signal.SIGINT else "SIGTERM"
        if self.checkpoint is None:
            tail = "no checkpoint was asked for (checkpoint=PATH makes a fit resumable)."
        else:
            tail = (
                f"the checkpoint {self.checkpoint} holds this state; run the same fit again "
                "(resume=True) to continue."
            )
        message = f"{who} stopped by {name} {where}: {tail}"
        previous = self._previous.get(signum)
        outer_fit = isinstance(getattr(previous, "__self__", None), SignalGuard)
        if callable(previous) and previous is not signal.default_int_handler and not outer_fit:
            previous(signum, frame)
            return
        raise _exception(signum, message, self.checkpoint)  # (a fit inside a fit: both stop)
