r"""The progress line of a fit on stderr: ``\r`` updates on a terminal, else a line a tenth.

Example:
    >>> from gpchol._fit.progress import ProgressLine
    >>> bar = ProgressLine(enabled=False, steps=10, label="gpchol fit [lbfgs]")
    >>> bar.update(1, 0.5)  # disabled: prints nothing
    >>> bar.close()
"""

from __future__ import annotations

import sys
import time

__all__ = ["ProgressLine"]


class ProgressLine:
    r"""A one-line progress display on stderr (``\r`` updates on a terminal).

    On a terminal the line is redrawn at most every 0.1 s; elsewhere (a log file, a pipe)
    one line is printed every ``steps // 10`` steps and on forced updates.

    Args:
        enabled: False prints nothing.
        steps: the number of steps shown as the total.
        label: the text before ``step k/steps`` (may be changed between updates).
    """

    def __init__(self, enabled: bool, steps: int, label: str) -> None:
        self.enabled = enabled
        self.steps = steps
        self.label = label
        self.tty = enabled and hasattr(sys.stderr, "isatty") and sys.stderr.isatty()
        self.last = 0.0
        self.every = max(1, steps // 10)
        self.width = 0
        self.printed = -1

    def update(self, step: int, loss: float, extra: str = "", force: bool = False) -> None:
        """Shows ``step`` and ``loss`` (throttled unless ``force``)."""
        if not self.enabled:
            return
        now = time.perf_counter()
        line = f"{self.label} step {step}/{self.steps}  loss {loss:.10g}{extra}"
        if self.tty:
            if force or now - self.last > 0.1:
                pad = " " * max(0, self.width - len(line))
                sys.stderr.write("\r" + line + pad)
                sys.stderr.flush()
                self.width = len(line)
                self.last = now
        elif (force or step % self.every == 0) and step != self.printed:
            self.printed = step
            sys.stderr.write(line + "\n")
            sys.stderr.flush()

    def close(self) -> None:
        """Ends a terminal's line (so later output starts on a fresh line); idempotent."""
        if self.enabled and self.tty and self.width:
            sys.stderr.write("\n")
            sys.stderr.flush()
            self.width = 0
