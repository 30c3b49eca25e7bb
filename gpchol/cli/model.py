"""The command line's model: kernel SPEC, training data, standardization, and its file.

A :class:`Model` is written to and read from ``gpchol-fit.json`` with the fitted
parameters, so that ``gpchol predict`` rebuilds the GP from the file alone. The file is
one case of :func:`gpchol.save`: a dict (:meth:`Model.content`: the SPEC, parameters,
standardization, training data and how the fit went, under ``"format": "gpchol-fit"``)
saved as JSON plus an NPZ of its arrays, with the versions and SHA-256 hashes
:func:`gpchol.load` checks; ``gpchol.load("gpchol-fit.json")`` returns that dict.
Model files of the first format (the same dict as one JSON file, arrays as lists, written
by gpchol before ``gpchol.save``) are still read.

Example:
    >>> import numpy as np
    >>> from gpchol.cli.model import Model
    >>> from gpchol.cli.spec import ModelSpec, SpecError
    >>> X, y = np.array([[0.0], [1.0], [2.0]]), np.array([1.0, 3.0, 5.0])
    >>> m = Model.standardized(ModelSpec.parse("rbf+white", 1), X, y, ["t"], "y")
    >>> m.xs(X).ravel().round(3).tolist(), m.ys(y).round(3).tolist()
    ([-1.225, 0.0, 1.225], [-1.225, 0.0, 1.225])
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import math
from typing import Any, NoReturn

import jax.numpy as jnp
import numpy as np

import gpchol
from gpchol import FitResult, GaussianProcess
from gpchol._base.store import FileKind
from gpchol._base.store import versions as saved_versions
from gpchol._persist import FORMAT as SAVE_FORMAT
from gpchol._persist import SaveFileError, load, save
from gpchol.cli.errors import CLIError
from gpchol.cli.spec import ModelSpec, SpecError

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "GROUPS_FORMAT",
    "Model",
    "data_hash",
    "read_models",
    "standardization",
    "versions",
]

FORMAT = "gpchol-fit"
"""The ``format`` field of a model file's content."""
FORMAT_VERSION = 1
"""The ``format_version`` field of a model file's content."""
GROUPS_FORMAT = "gpchol-fit-groups"
"""The ``format`` field of a file of per-group models (``gpchol fit --group``)."""

_FILES = FileKind(
    FORMAT,
    FORMAT_VERSION,
    {
        "missing": "no such model file: {path} (write one with `gpchol fit`)",
        "directory": "model file {path} is a directory",
        "unreadable": "cannot read model file {path}: {error}",
        "not-json": "model file {path} is not valid JSON (line {line}, column {column}: {msg}); "
        "is it truncated? Refit with `gpchol fit`",
        "format": f"model file {{path}}: not a gpchol model file (its 'format' is not {FORMAT!r})",
        "version-missing": "model file {path}: 'format_version' is missing; refit with "
        "`gpchol fit`",
        "version-type": "model file {path}: 'format_version' must be an integer >= 1, not "
        "{version!r}",
        "version-newer": "model file {path}: written by {by} in format version {version}; this "
        "gpchol ({ours}) reads version {newest}: upgrade gpchol, or refit the model with this one",
    },
    lambda at, text: CLIError(text),
)
"""How a model file's problems of the protocol's part are worded (the file and its content)."""

_GROUP_FILES = FileKind(
    GROUPS_FORMAT,
    FORMAT_VERSION,
    {
        "format": f"model file {{path}}: not a file of per-group models (its 'format' is not "
        f"{GROUPS_FORMAT!r})",
        "version-missing": "model file {path}: 'format_version' is missing; refit with "
        "`gpchol fit --group`",
        "version-type": "model file {path}: 'format_version' must be an integer >= 1, not "
        "{version!r}",
        "version-newer": "model file {path}: written by {by} in format version {version}; this "
        "gpchol ({ours}) reads version {newest}: upgrade gpchol, or refit the models with this "
        "one",
    },
    lambda at, text: CLIError(text),
)
"""How a per-group model file's format and version problems are worded."""


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
    return saved_versions() | {"optax": importlib.metadata.version("optax")}


def _as_list(v: Any) -> Any:
    """A float or nested list of floats (JSON-ready) from an array or scalar."""
    return np.asarray(v, np.float64).tolist()


def _as_array(v: Any) -> np.ndarray:
    """A float64 NumPy array (saved in the NPZ, bit for bit) from an array or scalar."""
    return np.array(v, np.float64)


_CONSTANT = 1e-12
"""A column whose std is below this fraction of its largest magnitude counts as constant."""


def standardization(v: np.ndarray, name: str) -> tuple[float, float]:
    """``(shift, scale)`` of one column: its mean and std, computed without overflow.

    The values are first divided by their largest magnitude ``m`` (so every one lies in
    ``[-1, 1]`` and no sum or square can overflow), then ``shift = mean * m`` and
    ``scale = std * m``. A (numerically) constant column gets scale 1.

    Args:
        v: ``(n,)`` finite values.
        name: the column's name, for the message.

    Returns:
        ``(shift, scale)``, both finite, ``scale > 0``.

    Raises:
        CLIError: the column varies, but by less than the smallest normal float64.

    Example:
        >>> import numpy as np
        >>> from gpchol.cli.model import standardization
        >>> standardization(np.array([1e200, 2e200, 3e200]), "x")
        (2e+200, 8.16496580927726e+199)
    """
    v = np.asarray(v, np.float64)
    m = float(np.max(np.abs(v))) if v.size else 0.0
    if m == 0.0:
        return 0.0, 1.0
    u = v / m
    mu, s = float(u.mean()), float(u.std())
    shift = mu * m
    if s <= _CONSTANT:
        return shift, 1.0
    scale = s * m
    if not scale >= np.finfo(np.float64).tiny:
        raise CLIError(
            f"column {name!r} varies too little to be standardized (std {scale:.3g}); rescale it"
        )
    return shift, scale


def _standardize(v: np.ndarray, shift: Any, scale: Any) -> np.ndarray:
    """``(v - shift) / scale``, or ``v / scale - shift / scale`` where the first overflows."""
    with np.errstate(over="ignore", invalid="ignore"):
        z = (v - shift) / scale
        bad = ~np.isfinite(z)
        if np.any(bad):
            alt = v / scale - np.asarray(shift) / scale
            z = np.where(bad, alt, z)
    return z


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

        The mean and std are computed without overflow for any finite values (up to
        ``1.8e308``, see :func:`standardization`); a constant column keeps scale 1.

        Raises:
            CLIError: a column varies too little (std below ``2.2e-308``) to standardize.
        """
        X = np.asarray(X, np.float64)
        y = np.asarray(y, np.float64)
        x_shift, x_scale = np.zeros(X.shape[1]), np.ones(X.shape[1])
        for j in range(X.shape[1]):
            x_shift[j], x_scale[j] = standardization(X[:, j], x_names[j])
        y_shift, y_scale = standardization(y, y_name)
        return cls(
            spec,
            X,
            y,
            x_names=x_names,
            y_name=y_name,
            x_shift=x_shift,
            x_scale=x_scale,
            y_shift=y_shift,
            y_scale=y_scale,
        )

    def xs(self, X: np.ndarray) -> np.ndarray:
        """Standardized inputs, ``(m, d)`` (non-finite where one cannot be represented)."""
        return _standardize(np.asarray(X, np.float64), self.x_shift, self.x_scale)

    def ys(self, y: np.ndarray) -> np.ndarray:
        """Standardized targets, ``(m,)``."""
        return _standardize(np.asarray(y, np.float64), self.y_shift, self.y_scale)

    def gp(self, params: dict[str, Any], dtype: type[np.floating]) -> GaussianProcess:
        """The GP of the standardized training inputs for ``params`` (may be traced)."""
        kernel, noise = self.spec.build(params)
        return GaussianProcess(kernel, jnp.asarray(self.xs(self.X), dtype), noise=noise)

    def save(
        self,
        path: str,
        params: dict[str, Any],
        lml: float,
        result: FitResult,
        args_info: dict[str, Any],
    ) -> None:
        """Writes the model file: :meth:`content` through :func:`gpchol.save` (JSON + NPZ).

        Args:
            path: the JSON file (the NPZ of the arrays is written next to it).
            params: the fitted parameters (a flat dict, as :meth:`ModelSpec.init_params`).
            lml: the log marginal likelihood of the raw data.
            result: the fit's result (steps, convergence, message).
            args_info: what the fit was asked (optimizer, steps, dtype, source, seconds).
        """
        save(self.content(params, lml, result, args_info), path)

    def to_json(
        self,
        params: dict[str, Any],
        lml: float,
        result: FitResult,
        args_info: dict[str, Any],
    ) -> dict[str, Any]:
        """The content of a model file of the first format (one JSON file; arrays as lists).

        Args: as :meth:`save`.
        """
        return self.content(params, lml, result, args_info, plain=True) | {"versions": versions()}

    def content(
        self,
        params: dict[str, Any],
        lml: float,
        result: FitResult,
        args_info: dict[str, Any],
        *,
        plain: bool = False,
    ) -> dict[str, Any]:
        """The model file's content: a dict of strings, numbers and float64 arrays.

        Args: as :meth:`save`, and ``plain``: arrays as (nested) lists of floats
        (JSON-ready), not NumPy arrays.
        """
        conv = _as_list if plain else _as_array
        return {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "kernel": {
                "spec": self.spec.spec,
                "input_dim": self.spec.d,
                "learn_noise": self.spec.learn_noise,
                "fixed_noise": self.spec.fixed_noise,
            },
            "params": {k: conv(v) for k, v in params.items()},
            "log_marginal_likelihood": lml,
            "fit": args_info
            | {
                "n_steps": result.n_steps,
                "converged": result.converged,
                "success": result.success,
                "message": result.message,
            },
            "standardization": {
                "x_shift": conv(self.x_shift),
                "x_scale": conv(self.x_scale),
                "y_shift": self.y_shift,
                "y_scale": self.y_scale,
            },
            "data": {
                "x_columns": self.x_names,
                "y_column": self.y_name,
                "n": int(self.X.shape[0]),
                "sha256": data_hash(self.X, self.y),
                "X": conv(self.X),
                "y": conv(self.y),
            },
        }

    @classmethod
    def from_json(cls, path: str) -> tuple[Model, dict[str, np.ndarray]]:
        """Reads and validates a model file written by ``gpchol fit``.

        Every field is checked before anything is computed from it: the format and its
        version (a file from a newer gpchol is refused, not guessed at), the kernel SPEC
        and the parameters it needs (each present, no unknown one, of the right shape,
        finite, positive where the kernel needs it), the standardization (finite, scales
        positive), and the training data (shapes, finite values, the recorded hash).

        Returns:
            ``(model, params)`` with ``params`` a flat dict of float64 arrays.

        Raises:
            CLIError: one line naming the file and the first problem found.
        """
        m = _FILES.read(path)
        if isinstance(m, dict) and m.get("format") == GROUPS_FORMAT:
            raise CLIError(
                f"model file {path} holds one model per group (`gpchol fit --group`), not "
                "one model; `gpchol predict` reads it with the group column in --csv"
            )
        return _single(m, path)


def _single(m: Any, path: str) -> tuple[Model, dict[str, np.ndarray]]:
    """The model of the parsed single-model file ``m`` (either format), validated."""
    if isinstance(m, dict) and m.get("format") == SAVE_FORMAT:
        try:
            m = load(path)  # checks the versions, the hashes and the arrays file
        except SaveFileError as e:
            raise CLIError(f"model {e}; refit with `gpchol fit`") from None
    return _ModelFile(path).read(m)


def read_models(path: str) -> tuple[str | None, dict[str, tuple[Model, dict[str, np.ndarray]]]]:
    """Reads and validates the model file of ``gpchol fit``, with or without ``--group``.

    A file of per-group models is checked as a whole (format, version, the group column,
    every group's model as :meth:`Model.from_json` checks one file's, the same input
    columns in all) before any is used.

    Returns:
        ``(group column, {label: (model, params)})``; for a single-model file the group
        column is ``None`` and the one label is ``""``.

    Raises:
        CLIError: one line naming the file (and the group) and the first problem found.
    """
    m = _FILES.read(path)
    if not (isinstance(m, dict) and m.get("format") == GROUPS_FORMAT):
        return None, {"": _single(m, path)}
    _GROUP_FILES.check(m, path)
    where = _ModelFile(path)
    column = where.text(m, "group_column", "")
    groups = where.section(m, "groups")
    if not groups:
        where.fail("'groups' is empty; refit with `gpchol fit --group`")
    models = {}
    for label, content in groups.items():
        if not label:
            where.fail("a group's label is empty")
        models[label] = _ModelFile(f"{path} (group {label!r})").read(content)
    names = {tuple(model.x_names) for model, _ in models.values()}
    if len(names) > 1:
        where.fail("its groups' models have different input columns ('x_columns')")
    return column, models


class _ModelFile:
    """The checks of one model file's content (:meth:`Model.from_json`)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def fail(self, problem: str) -> NoReturn:
        raise CLIError(f"model file {self.path}: {problem}")

    def section(self, obj: dict[str, Any], key: str) -> dict[str, Any]:
        value = self.field(obj, key)
        if not isinstance(value, dict):
            self.fail(f"{key!r} must be a JSON object, not {type(value).__name__}")
        return value

    def field(self, obj: dict[str, Any], key: str, where: str = "") -> Any:
        if key not in obj:
            self.fail(f"{where}{key!r} is missing; refit with `gpchol fit`")
        return obj[key]

    def text(self, obj: dict[str, Any], key: str, where: str) -> str:
        value = self.field(obj, key, where)
        if not isinstance(value, str) or not value:
            self.fail(f"{where}{key!r} must be a non-empty string")
        return value

    def integer(self, obj: dict[str, Any], key: str, where: str, minimum: int) -> int:
        value = self.field(obj, key, where)
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            self.fail(f"{where}{key!r} must be an integer >= {minimum}, not {value!r}")
        return value

    def number(self, obj: dict[str, Any], key: str, where: str, positive: bool = False) -> float:
        value = self.field(obj, key, where)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            self.fail(f"{where}{key!r} must be a number, not {type(value).__name__}")
        if not math.isfinite(value) or (positive and not value > 0):
            self.fail(f"{where}{key!r} must be a finite{' positive' if positive else ''} number")
        return float(value)

    def array(
        self, obj: dict[str, Any], key: str, where: str, shape: tuple[int, ...]
    ) -> np.ndarray:
        value = self.field(obj, key, where)
        try:
            if isinstance(value, (str, bool, dict)) or value is None:
                raise TypeError
            a = np.asarray(value, np.float64)
        except (TypeError, ValueError, OverflowError):
            self.fail(f"{where}{key!r} must be a number or a (nested) list of numbers")
        if a.shape != shape:
            self.fail(f"{where}{key!r} has shape {a.shape}; {shape} expected")
        if not np.all(np.isfinite(a)):
            self.fail(f"{where}{key!r} has non-finite values (NaN or inf)")
        return a

    def read(self, m: Any) -> tuple[Model, dict[str, np.ndarray]]:
        _FILES.check(m, self.path)
        spec = self.spec(self.section(m, "kernel"))
        d = spec.d
        params = self.params(self.section(m, "params"), spec)
        st = self.section(m, "standardization")
        scaling: dict[str, Any] = {
            "x_shift": self.array(st, "x_shift", "standardization ", (d,)),
            "x_scale": self.array(st, "x_scale", "standardization ", (d,)),
        }
        if not np.all(scaling["x_scale"] > 0):
            self.fail("standardization 'x_scale' must be positive")
        scaling["y_shift"] = self.number(st, "y_shift", "standardization ")
        scaling["y_scale"] = self.number(st, "y_scale", "standardization ", positive=True)
        data = self.section(m, "data")
        x_names = self.field(data, "x_columns", "data ")
        if (
            not isinstance(x_names, list)
            or len(x_names) != d
            or not all(isinstance(c, str) and c for c in x_names)
        ):
            self.fail(
                f"data 'x_columns' must be a list of {d} column name(s) (the kernel's input_dim)"
            )
        if len(set(x_names)) != d:
            self.fail("data 'x_columns' names a column twice")
        y_name = self.text(data, "y_column", "data ")
        n = self.integer(data, "n", "data ", 1)
        X = self.array(data, "X", "data ", (n, d))
        y = self.array(data, "y", "data ", (n,))
        if data_hash(X, y) != data.get("sha256"):
            self.fail("the training data does not match its recorded sha256")
        return Model(spec, X, y, x_names=x_names, y_name=y_name, **scaling), params

    def spec(self, k: dict[str, Any]) -> ModelSpec:
        text = self.text(k, "spec", "kernel ")
        d = self.integer(k, "input_dim", "kernel ", 1)
        fixed_noise = self.number(k, "fixed_noise", "kernel ", positive=True)
        try:
            spec = ModelSpec.parse(text, d, fixed_noise)
        except SpecError as e:
            self.fail(f"kernel {text!r}: {e}")
        learn_noise = k.get("learn_noise", spec.learn_noise)
        if learn_noise is not spec.learn_noise:
            self.fail(
                f"kernel 'learn_noise' is {learn_noise!r} but the SPEC {text!r} "
                f"{'has' if spec.learn_noise else 'has no'} 'white' term"
            )
        return spec

    def params(self, p: dict[str, Any], spec: ModelSpec) -> dict[str, np.ndarray]:
        init, transforms = spec.init_params(), spec.transforms()
        names = ", ".join(init)
        for name in init:
            if name not in p:
                self.fail(f"parameter {name!r} is missing (the kernel {spec.spec!r} has: {names})")
        for name in p:
            if name not in init:
                self.fail(
                    f"unknown parameter {name!r} for the kernel {spec.spec!r} (it has: {names})"
                )
        out = {}
        for name, value in init.items():
            a = self.array(p, name, "parameter ", np.shape(value))
            if transforms[name] is not None and not np.all(a > 0):
                self.fail(f"parameter {name!r} must be positive")
            out[name] = a
        return out
