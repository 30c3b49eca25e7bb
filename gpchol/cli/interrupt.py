"""Ctrl-C that acts within seconds, even while a long compiled computation runs.

Python runs signal handlers only between two bytecodes of the main thread. While the main
thread waits in one compiled XLA computation (one step of a fit on 20,000 points runs for
minutes on a small machine), neither Python's ``KeyboardInterrupt`` nor the handler of
:func:`gpchol.fit` (which finishes the step, commits the checkpoint and then raises) can
act until the computation returns.

:class:`InterruptWatch` closes that gap. It asks Python (``signal.set_wakeup_fd``) to
write the number of every signal it receives to a socket, at the moment of arrival, and
a watcher thread reads it. On ``SIGINT`` or ``SIGTERM`` the main thread gets ``grace``
seconds to stop the usual way (between two steps: the fit commits its checkpoint and
raises, the command prints ``gpchol: interrupted`` and returns 130); past that, the
watcher prints the same line and ends the process at once (``os._exit``) with 130 (143
for ``SIGTERM``). Files are written atomically, so what is on disk is the last complete
version (the last committed checkpoint), never a partial one.

Example:
    >>> from gpchol.cli.interrupt import InterruptWatch
    >>> with InterruptWatch(grace=2.0) as watch:
    ...     pass
    >>> watch.received is None
    True
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
from collections.abc import Callable

__all__ = ["GRACE_SECONDS", "InterruptWatch", "exit_status"]

GRACE_SECONDS = 2.0
"""How long the main thread has to stop by itself after Ctrl-C before the process ends."""

_WATCHED = {int(signal.SIGINT): "interrupted", int(signal.SIGTERM): "terminated"}


def exit_status(signum: int) -> int:
    """The shell's status for a process ended by ``signum``: ``128 + signum``."""
    return 128 + int(signum)


class InterruptWatch:
    """Ends the process ``grace`` seconds after SIGINT/SIGTERM if it has not stopped.

    A context manager for the main thread (elsewhere, and where the wakeup socket cannot
    be set up, it does nothing). It changes no signal handler: the handlers in place
    (Python's, or :func:`gpchol.fit`'s) still decide what a signal does; the watch only
    enforces the deadline. On leaving, the previous wakeup descriptor is restored and the
    watcher thread ends.

    Args:
        grace: seconds the main thread has to stop by itself; ``None``: no deadline (the
            signal is only recorded, :meth:`signalled`).
        hard_exit: called with the exit status when the deadline passes (default
            ``os._exit``; tests pass a recorder).
        note: what the line printed at the deadline says about the files on disk (e.g.
            where the last checkpoint is); default: that they are as last written.

    Attributes:
        received: the first SIGINT/SIGTERM received while watching, or ``None``.
    """

    def __init__(
        self,
        grace: float | None = GRACE_SECONDS,
        hard_exit: Callable[[int], object] = os._exit,
        note: str = "",
    ) -> None:
        self.grace = None if grace is None else float(grace)
        self.note = note
        self.received: int | None = None
        self._hard_exit = hard_exit
        self._done = threading.Event()
        self._got = threading.Event()
        self._sockets: tuple[socket.socket, socket.socket] | None = None
        self._previous_fd = -1
        self._thread: threading.Thread | None = None

    def __enter__(self) -> InterruptWatch:
        if threading.current_thread() is not threading.main_thread():
            return self
        try:
            r, w = socket.socketpair()
            w.setblocking(False)
            self._previous_fd = signal.set_wakeup_fd(w.fileno(), warn_on_full_buffer=False)
        except (OSError, ValueError, AttributeError):
            return self
        self._sockets = (r, w)
        self._thread = threading.Thread(target=self._watch, name="gpchol-interrupt", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        if self._sockets is None:
            return
        r, w = self._sockets
        try:
            signal.set_wakeup_fd(self._previous_fd)
        except (OSError, ValueError):
            pass
        try:
            w.send(b"\0")  # wakes the watcher (0 is no signal)
        except OSError:
            pass
        if self._thread is not None:
            self._thread.join(timeout=5.0)
        r.close()
        w.close()
        self._sockets = None

    def _watch(self) -> None:
        assert self._sockets is not None
        r = self._sockets[0]
        while not self._done.is_set():
            try:
                data = r.recv(64)
            except OSError:
                return
            if not data:
                return
            for signum in data:
                if signum in _WATCHED and self.received is None:
                    self.received = signum
                    self._got.set()
                    # the main thread has `grace` seconds to stop and leave the watch
                    if self.grace is not None and not self._done.wait(self.grace):
                        self._expire(signum)
                        return

    def signalled(self, timeout: float = 0.1) -> int | None:
        """The SIGINT/SIGTERM received while watching, waiting up to ``timeout`` for it.

        The signal reaches the watcher thread a moment after Python's own handler runs,
        so a command that fails right after a signal (a library that turned the
        ``KeyboardInterrupt`` into another error) asks here whether one came.
        """
        if self._sockets is not None:
            self._got.wait(timeout)
        return self.received

    def _expire(self, signum: int) -> None:
        """Prints the line and ends the process: the main thread did not stop in time."""
        line = (
            f"\ngpchol: {_WATCHED[signum]} (the computation under way was stopped; "
            f"{self.note or 'files on disk are as last written'})\n"
        )
        try:
            os.write(sys.stderr.fileno(), line.encode())
        except (OSError, ValueError, AttributeError):
            pass
        self._hard_exit(exit_status(signum))
