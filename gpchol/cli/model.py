"""The command line's model: kernel SPEC, training data, standardization, and its file.

A :class:`Model` is written to and read from ``gpchol-fit.json`` (JSON, no pickle) with
the fitted parameters, so that ``gpchol predict`` rebuilds the GP from the file alone.

Example:
    >>> import numpy as np
    >>> from gpchol.cli.model import Model
    >>> from gpchol.cli.spec import ModelSpec
    >>> X, y = np.array([[0.0], [1.0], [2.0]]), np.array([1.0, 3.0, 5.0])
    >>> m = Model.standardized(ModelSpec.parse("rbf+white", 1), X, y, ["t"], "y")
    >>> m.xs(X).ravel().round(3).tolist(), m.ys(y).round(3).tolist()
    ([-1.225, 0.0, 1.225], [-1.225, 0.0, 1.225])
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

import gpchol
from gpchol import FitResult, GaussianProcess
from gpchol.cli.errors import CLIError
from gpchol.cli.spec import ModelSpec

__all__ = ["FORMAT", "FORMAT_VERSION", "Model", "data_hash", "versions"]

FORMAT = "gpchol-fit"
"""The ``format`` field of a model file."""
FORMAT_VERSION = 1
"""The ``format_version`` field of a model file."""


def data_hash(X: np.ndarray, y: np.ndarray) -> str:
    """Hex SHA-256 of the training data (``X`` then ``y``, float64, C order).

    Example:
        >>> import numpy as np
        >>> from gpchol.cli.model import data_hash
        >>> len(data_hash(np.zeros((2, 1)), np.zeros(2)))
        64
    """
    h = hashlib.sha256()
    h.update(np.ascontiguousarray(X, np.float64).tobytes())
    h.update(np.ascontiguousarray(y, np.float64).tobytes())
    return h.hexdigest()


def versions() -> dict[str, str]:
    """The versions a model file records (gpchol, JAX, optax, NumPy, Python)."""
    return {
        "gpchol": gpchol.__version__,
        "jax": jax.__version__,
        "optax": optax.__version__,
        "numpy": np.__version__,
        "python": platform.python_version(),
    }


def _plain(v: Any) -> Any:
    """A float or nested list of floats (JSON-ready) from an array or scalar."""
    return np.asarray(v, np.float64).tolist()


class Model:
    """A fitted or to-be-fitted model: spec, training data, standardization.

    The GP sees standardized data: inputs ``(X - x_shift) / x_scale`` and targets
    ``(y - y_shift) / y_scale``.

    Args:
        spec: the parsed kernel SPEC.
        X: ``(n, d)`` raw training inputs.
        y: ``(n,)`` raw training targets.
        x_names: the ``d`` input column names.
        y_name: the target column name.
        x_shift: ``(d,)`` subtracted from the inputs.
        x_scale: ``(d,)`` dividing the shifted inputs.
        y_shift: subtracted from the targets.
        y_scale: dividing the shifted targets.
    """

    def __init__(
        self,
        spec: ModelSpec,
        X: np.ndarray,
        y: np.ndarray,
        *,
        x_names: list[str],
        y_name: str,
        x_shift: np.ndarray,
        x_scale: np.ndarray,
        y_shift: float,
        y_scale: float,
    ) -> None:
        self.spec = spec
        self.X, self.y = X, y  # raw training data (NumPy float64)
        self.x_names, self.y_name = list(x_names), y_name
        self.x_shift, self.x_scale = x_shift, x_scale
        self.y_shift, self.y_scale = float(y_shift), float(y_scale)

    @classmethod
    def co2(cls) -> Model:
        """The Rasmussen & Williams model of the embedded monthly Mauna Loa CO2 data.

        Years and ppm as they are, the data's mean subtracted (as R&W do).
        """
        data = gpchol.datasets.load("co2", monthly=True)
        X, y = np.asarray(data.X, np.float64), np.asarray(data.y, np.float64)
        return cls(
            ModelSpec.parse("co2", 1),
            X,
            y,
            x_names=["t"],
            y_name="co2",
            x_shift=np.zeros(1),
            x_scale=np.ones(1),
            y_shift=float(y.mean()),
            y_scale=1.0,
        )

    @classmethod
    def standardized(
        cls, spec: ModelSpec, X: np.ndarray, y: np.ndarray, x_names: list[str], y_name: str
    ) -> Model:
        """A model of the user's data, every column standardized by its mean and std.

        A constant column keeps scale 1.
        """
        x_scale = X.std(axis=0)
        x_scale[x_scale == 0] = 1.0
        return cls(
            spec,
            X,
            y,
            x_names=x_names,
            y_name=y_name,
            x_shift=X.mean(axis=0),
            x_scale=x_scale,
            y_shift=float(y.mean()),
            y_scale=float(y.std()) or 1.0,
        )

    def xs(self, X: np.ndarray) -> np.ndarray:
        """Standardized inputs, ``(m, d)``."""
        return (np.asarray(X, np.float64) - self.x_shift) / self.x_scale

    def ys(self, y: np.ndarray) -> np.ndarray:
        """Standardized targets, ``(m,)``."""
        return (y - self.y_shift) / self.y_scale

    def gp(self, params: dict[str, Any], dtype: type[np.floating]) -> GaussianProcess:
        """The GP of the standardized training inputs for ``params`` (may be traced)."""
        kernel, noise = self.spec.build(params)
        return GaussianProcess(kernel, jnp.asarray(self.xs(self.X), dtype), noise=noise)

    def to_json(
        self,
        params: dict[str, Any],
        lml: float,
        result: FitResult,
        args_info: dict[str, Any],
    ) -> dict[str, Any]:
        """The model file's content (a JSON-ready dict).

        Args:
            params: the fitted parameters (a flat dict, as :meth:`ModelSpec.init_params`).
            lml: the log marginal likelihood of the raw data.
            result: the fit's result (steps, convergence, message).
            args_info: what the fit was asked (optimizer, steps, dtype, source, seconds).
        """
        return {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "kernel": {
                "spec": self.spec.spec,
                "input_dim": self.spec.d,
                "learn_noise": self.spec.learn_noise,
                "fixed_noise": self.spec.fixed_noise,
            },
            "params": {k: _plain(v) for k, v in params.items()},
            "log_marginal_likelihood": lml,
            "fit": args_info
            | {
                "n_steps": result.n_steps,
                "converged": result.converged,
                "success": result.success,
                "message": result.message,
            },
            "standardization": {
                "x_shift": _plain(self.x_shift),
                "x_scale": _plain(self.x_scale),
                "y_shift": self.y_shift,
                "y_scale": self.y_scale,
            },
            "data": {
                "x_columns": self.x_names,
                "y_column": self.y_name,
                "n": int(self.X.shape[0]),
                "sha256": data_hash(self.X, self.y),
                "X": _plain(self.X),
                "y": _plain(self.y),
            },
            "versions": versions(),
        }

    @classmethod
    def from_json(cls, path: str) -> tuple[Model, dict[str, np.ndarray]]:
        """Reads a model file written by ``gpchol fit``.

        Returns:
            ``(model, params)`` with ``params`` a flat dict of float64 arrays.

        Raises:
            CLIError: the file is missing, is not a model file, or its training data does
                not match its recorded hash.
        """
        if not os.path.exists(path):
            raise CLIError(f"no such model file: {path} (write one with `gpchol fit`)")
        try:
            with open(path, encoding="utf-8") as f:
                m = json.load(f)
            if m.get("format") != FORMAT:
                raise KeyError("format")
            k, st, data = m["kernel"], m["standardization"], m["data"]
            spec = ModelSpec.parse(k["spec"], int(k["input_dim"]), float(k["fixed_noise"]))
            X = np.asarray(data["X"], np.float64).reshape(-1, int(k["input_dim"]))
            y = np.asarray(data["y"], np.float64)
            model = cls(
                spec,
                X,
                y,
                x_names=data["x_columns"],
                y_name=data["y_column"],
                x_shift=np.asarray(st["x_shift"], np.float64),
                x_scale=np.asarray(st["x_scale"], np.float64),
                y_shift=st["y_shift"],
                y_scale=st["y_scale"],
            )
            params = {name: np.asarray(v, np.float64) for name, v in m["params"].items()}
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise CLIError(f"{path} is not a gpchol-fit.json model file ({e})") from None
        if data_hash(X, y) != data.get("sha256"):
            raise CLIError(f"{path}: the training data does not match its recorded sha256")
        return model, params
