"""Shuffled minibatches over arrays that share their first dimension (no data framework
needed).

Example:
    >>> import jax, numpy as np
    >>> X, y = np.arange(10.0).reshape(5, 2), np.arange(5.0)
    >>> batches = minibatches((X, y), 2, jax.random.PRNGKey(0), epochs=1)
    >>> [(xb.shape, yb.shape) for xb, yb in batches]
    [((2, 2), (2,)), ((2, 2), (2,))]
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import jax
import numpy as np

from gpchol._base.validate import check_int as positive_int

__all__ = ["minibatches", "positive_int"]


def minibatches(
    arrays: Any,
    batch_size: int,
    key: Any,
    *,
    epochs: int | None = None,
    drop_last: bool = True,
) -> Iterator[Any]:
    """Shuffled minibatches: the same rows of every array, a new order each epoch.

    Each epoch's permutation of the ``n`` rows comes from ``jax.random.fold_in(key,
    epoch)``: the sequence is a function of ``key`` alone.

    Args:
        arrays: an array, or a pytree (tuple, list, dict) of arrays (NumPy or JAX) that all
            have ``n`` rows (first dimension).
        batch_size: rows per batch, a positive int.
        key: a ``jax.random`` key (or an int seed).
        epochs: number of passes over the data; ``None`` (default): without end.
        drop_last: ``True`` (default): every batch has ``batch_size`` rows (a jitted step
            compiles once); each epoch leaves out the last ``n mod batch_size`` rows of its
            permutation (a rescaled minibatch sum stays unbiased). ``False``: the last
            batch is the remainder (a second compilation); every row once per epoch.

    Returns:
        An iterator of pytrees shaped like ``arrays``, each leaf ``(batch_size, ...)``
        (NumPy arrays stay NumPy arrays, JAX arrays stay JAX arrays).

    Raises:
        TypeError: ``batch_size`` or ``epochs`` is not an int.
        ValueError: ``batch_size < 1``, ``epochs < 1``, arrays with different numbers of
            rows or none at all, or ``drop_last=True`` with ``batch_size`` larger than
            ``n`` (no batch would be yielded).
    """
    b = positive_int(batch_size, "batch_size", "rows per minibatch")
    n_epochs = None if epochs is None else positive_int(epochs, "epochs", "passes over the data")
    leaves, treedef = jax.tree_util.tree_flatten(arrays)
    if not leaves:
        raise ValueError("arrays must hold at least one array to draw minibatches from.")
    rows = [np.shape(a)[0] if np.ndim(a) else None for a in leaves]
    if None in rows or len(set(rows)) != 1:
        raise ValueError(
            "arrays must all have the same number of rows (first dimension); got shapes "
            f"{[tuple(np.shape(a)) for a in leaves]}."
        )
    n = int(rows[0])  # type: ignore[arg-type]
    if drop_last and b > n:
        raise ValueError(
            f"batch_size ({b}) is larger than the number of rows ({n}): with drop_last=True "
            "no batch would be yielded; use a batch_size <= n."
        )
    if n == 0:
        raise ValueError("arrays have no rows: there is nothing to draw minibatches from.")
    if isinstance(key, (int, np.integer)) and not isinstance(key, bool):
        key = jax.random.PRNGKey(int(key))
    leaves = [a if isinstance(a, jax.Array) else np.asarray(a) for a in leaves]

    def generate() -> Iterator[Any]:
        epoch = 0
        while n_epochs is None or epoch < n_epochs:
            perm = np.asarray(jax.random.permutation(jax.random.fold_in(key, epoch), n))
            stop = n - n % b if drop_last else n
            for start in range(0, stop, b):
                idx = perm[start : start + b]
                yield jax.tree_util.tree_unflatten(treedef, [a[idx] for a in leaves])
            epoch += 1

    return generate()
