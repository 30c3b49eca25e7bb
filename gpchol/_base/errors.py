"""Exceptions raised by gpchol."""

from __future__ import annotations

import numpy as np

__all__ = ["NotPositiveDefiniteError", "PicklableError"]


class PicklableError(Exception):
    """A base for errors whose ``__init__`` does not take their ``args``: pickled (and
    copied) as their message and attributes.

    ``BaseException`` pickles as ``cls(*args)``, which fails for an ``__init__`` with other
    parameters (a keyword-only ``pivot``, a ``(path, problem)`` pair formatted into the
    message): an error raised in a worker process (a process pool, joblib) then broke the
    pool instead of reaching the caller, and ``copy.copy`` raised ``TypeError``.
    """

    def __reduce__(self) -> tuple:
        return (_rebuild, (type(self), self.args, self.__dict__))


def _rebuild(cls: type[PicklableError], args: tuple, state: dict) -> PicklableError:
    """Unpickles a :class:`PicklableError`: its message and its attributes."""
    error = cls.__new__(cls)
    error.args = args
    error.__dict__.update(state)
    return error


class NotPositiveDefiniteError(PicklableError, np.linalg.LinAlgError):
    """A matrix that should be symmetric positive definite is not.

    Raised by :func:`gpchol.cholesky` with ``check=True`` (outside ``jit``). It is a
    subclass of :class:`numpy.linalg.LinAlgError` (and so of :class:`ValueError`).

    Attributes:
        pivot: 1-based index of the first failing pivot (LAPACK's ``info``), for the
            first failing batch element.
        batch_index: index (tuple) of that batch element; ``()`` for an unbatched input.
        min_diagonal: the smallest diagonal entry of the input matrix (of that element).
        jitter: the jitter values that were tried, if any.
    """

    def __init__(
        self,
        message: str,
        *,
        pivot: int,
        batch_index: tuple[int, ...] = (),
        min_diagonal: float | None = None,
        jitter: tuple[float, ...] = (),
    ) -> None:
        super().__init__(message)
        self.pivot = int(pivot)
        self.batch_index = tuple(batch_index)
        self.min_diagonal = min_diagonal
        self.jitter = tuple(jitter)
