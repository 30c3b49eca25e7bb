r"""Saving and loading models: one JSON file (structure) and one NPZ file (arrays), no pickle.

:func:`save` writes any of gpchol's modelling objects -- a kernel (compositions included),
a mean, a :class:`~gpchol.GaussianProcess`, a :class:`~gpchol.Posterior`, a
:class:`~gpchol.FitResult`, a transform -- or a plain container (dict, list, tuple) of
them and of arrays, numbers and strings; :func:`load` reads it back, equal bit for bit
(values, dtypes, shapes, JAX or NumPy arrays, Python numbers).

Files. ``save(obj, "model.json")`` writes

* ``model.<h>.npz``: every array, uncompressed, read back with ``allow_pickle=False``
  (``h``: the first 16 hex digits of the file's SHA-256, so a new save never overwrites
  the arrays file the current JSON names);
* ``model.json``: the format and its version, the versions of gpchol, JAX, NumPy and
  Python that wrote it, the object's structure (class names, fields; numbers and strings
  inline, arrays by reference), the arrays file's name and SHA-256, each array's dtype,
  shape and SHA-256, and the SHA-256 of the JSON content itself.

Both are written by the one file protocol (:mod:`gpchol._base.store`): atomically
(temporary file, ``fsync``, ``os.replace``); the JSON's replacement is the commit, after
which the previous arrays file is removed. A reader sees the old pair or the new pair,
never a mix.

Objects are written generically: a kernel or mean (a dataclass pytree) by its fields,
another pytree class (``GaussianProcess``, ``Posterior``) by its ``tree_flatten``
children and auxiliary data, a plain dataclass (``FitResult``) by its fields. A class is
named by its public name (``gpchol.kernels.ExpSquared``, ``gpchol.GaussianProcess``);
classes of other packages and of the user by ``module.qualname``. Loading never imports a
module named in a file: gpchol's classes are looked up among gpchol's own modules, a
user's class must be passed in ``classes=`` (:func:`load`). Functions (a
:class:`gpchol.means.Function`'s ``fn``) are code, not data, and are refused by
:func:`save`.

Reading checks, before anything is built: the format and version (a file from a newer
gpchol is refused), the JSON's own SHA-256 (a hand-edited JSON is refused), the arrays
file's name, size and SHA-256, and each array's dtype, shape and SHA-256; every problem is
a :class:`SaveFileError` naming the file and what is wrong. A dataclass's fields must be
the class's, except that a field added to the class since the file was written and given
a default there (``FitResult.optimizer_state``) takes that default.

Dtypes: a float64 JAX array loaded while JAX's 64-bit mode is off (``jax_enable_x64``)
would be truncated by JAX; it is returned as a NumPy float64 array instead (nothing is
lost; enable x64 to compute with it in float64). A weakly typed JAX scalar (from a Python
number) stays weakly typed when the dtype is JAX's current default.

Example:
    >>> import os, tempfile
    >>> import jax.numpy as jnp
    >>> from gpchol import GaussianProcess, kernels
    >>> from gpchol import load, save
    >>> k = 2.0 * kernels.ExpSquared(lengthscale=jnp.array([0.5, 1.5])) + kernels.White(0.1)
    >>> gp = GaussianProcess(k, jnp.ones((3, 2)), noise=1e-2)
    >>> path = os.path.join(tempfile.mkdtemp(), "gp.json")
    >>> save(gp, path)
    >>> back = load(path)
    >>> print(type(back.kernel).__name__, back.kernel.kernel1.kernel.lengthscale)
    Sum [0.5 1.5]
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
from collections.abc import Callable, Iterable
from typing import Any, NoReturn

import jax
import jax.numpy as jnp
import numpy as np

import gpchol._base.transforms as transforms_module
import gpchol._fit as fit_module
import gpchol._gp as gp_module
from gpchol import kernels, means
from gpchol._base.io import sha256_bytes
from gpchol._base.store import (
    FileKind,
    commit,
    named_arrays,
    remove_files,
    versions,
    write_arrays,
)

__all__ = ["FORMAT", "FORMAT_VERSION", "SaveFileError", "load", "save", "versions"]

FORMAT = "gpchol"
"""The ``format`` field of a file written by :func:`save`."""
FORMAT_VERSION = 1
"""The ``format_version`` :func:`save` writes and the newest :func:`load` reads."""

_MAX_DEPTH = 200
"""Deepest nesting of objects and containers written or read (a guard, not a real limit)."""


class SaveFileError(ValueError):
    """A file given to :func:`load` (or an object given to :func:`save`) is not usable.

    The message names the file (or the object's part) and what to change.

    Example:
        >>> from gpchol._persist import SaveFileError
        >>> issubclass(SaveFileError, ValueError)
        True
    """


_FILES = FileKind(
    FORMAT,
    FORMAT_VERSION,
    {
        "missing": "no such file: {path} (write one with gpchol.save)",
        "directory": "file {path}: is a directory, not a file written by gpchol.save",
        "unreadable": "file {path}: cannot be read ({error})",
        "not-json": "file {path}: is not valid JSON (line {line}, column {column}: {msg}); is it "
        "truncated? Save the object again",
        "format": f"file {{path}}: is not a file written by gpchol.save (its 'format' is not "
        f"{FORMAT!r})",
        "version-type": "file {path}: 'format_version' must be an integer >= 1, not {version!r}",
        "version-newer": "file {path}: was written by {by} in format version {version}; this "
        "gpchol ({ours}) reads format version {newest} and older: upgrade gpchol to load it",
        "arrays-name": "file {path}: 'arrays' names the file {name!r}, not an arrays file of "
        "this JSON file (a saved file is a pair, <name>.json and <name>.<hash>.npz in one "
        "folder: if the JSON file was renamed, rename it back to the name its arrays file "
        "starts with, or load it and save it again under the new name)",
        "arrays-missing": "file {path}: its arrays file {name} is missing (keep it next to the "
        "JSON file)",
        "arrays-unreadable": "file {path}: its arrays file {name} cannot be read ({error})",
        "arrays-hash": "file {path}: its arrays file {name} does not match the recorded sha256 "
        "(damaged or replaced); save the object again",
        "arrays-npz": "file {path}: its arrays file {name} is not a readable .npz ({error})",
    },
    lambda at, text: SaveFileError(text),
)
"""How :func:`load` words the problems of the protocol's part of a file."""


# ---------------------------------------------------------------------------- classes


def _public_classes() -> dict[str, type]:
    """gpchol's classes that files may name, by their public name.

    Kernels and means by the names ``gpchol.kernels`` and ``gpchol.means`` export; the
    model, posterior, fit result and transform classes by their top-level names.
    """
    out: dict[str, type] = {}
    for mod, prefix in ((kernels, "gpchol.kernels"), (means, "gpchol.means")):
        names = list(getattr(mod, "__all__", [])) or [n for n in vars(mod) if n[:1] != "_"]
        for name in names:
            obj = getattr(mod, name, None)
            if isinstance(obj, type):
                out[f"{prefix}.{name}"] = obj
    for mod in (gp_module, fit_module, transforms_module):
        for name in getattr(mod, "__all__", []):
            obj = getattr(mod, name, None)
            if isinstance(obj, type):
                out[f"gpchol.{name}"] = obj
    return out


def _class_name(cls: type, public: dict[type, str]) -> str:
    """The name a file records for ``cls``: its public gpchol name, else module.qualname."""
    if cls in public:
        return public[cls]
    return f"{cls.__module__}.{cls.__qualname__}"


def _public_names() -> dict[type, str]:
    """Class -> its public name; for an alias (``RBF = ExpSquared``) the class's own name."""
    names: dict[type, str] = {}
    for name, cls in _public_classes().items():
        if cls not in names or name.rsplit(".", 1)[1] == cls.__name__:
            names[cls] = name
    return names


def _gpchol_internal(name: str) -> type | None:
    """The class ``module.qualname`` defined in an already imported gpchol module: looked
    up in the module's and the classes' own namespaces (no attribute hook, so nothing is
    imported), and only a class whose own module and qualified name are those of ``name``
    (not another package's class that a gpchol module refers to)."""
    parts = name.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        module = ".".join(parts[:cut])
        mod = sys.modules.get(module)
        if mod is None:
            continue
        obj: Any = vars(mod).get(parts[cut])
        for attr in parts[cut + 1 :]:
            obj = vars(obj).get(attr) if isinstance(obj, type) else None
        qualname = ".".join(parts[cut:])
        if isinstance(obj, type) and obj.__module__ == module and obj.__qualname__ == qualname:
            return obj
        return None
    return None


class _Classes:
    """The classes one :func:`load` may build: gpchol's and the ones the caller passed."""

    def __init__(self, classes: Iterable[type], fail: Callable[[str], NoReturn]) -> None:
        self.public = _public_classes()
        self.user: dict[str, type] = {}
        self.by_qualname: dict[str, list[type]] = {}
        for cls in classes:
            if not isinstance(cls, type):
                raise TypeError(f"classes must hold classes; got {cls!r}")
            self.user[f"{cls.__module__}.{cls.__qualname__}"] = cls
            self.by_qualname.setdefault(cls.__qualname__, []).append(cls)
        self.fail = fail

    def get(self, name: str) -> type:
        if name in self.user:
            return self.user[name]
        if name in self.public:
            return self.public[name]
        if name.startswith("gpchol."):
            cls = _gpchol_internal(name)
            if cls is not None:
                return cls
            self.fail(
                f"it holds an object of class {name!r}, which this gpchol "
                f"({versions()['gpchol']}) does not have; load it with the gpchol that wrote it"
            )
        matches = [c for q, cs in self.by_qualname.items() if name.endswith("." + q) for c in cs]
        if len(matches) == 1:
            return matches[0]
        short = name.rsplit(".", 1)[-1]
        return self.fail(
            f"it holds an object of class {name!r}, which is not one of gpchol's; pass the "
            f"class to load, e.g. gpchol.load(path, classes=[{short}]) (a file never makes "
            "gpchol import a module)"
        )


# ---------------------------------------------------------------------------- writing

_TAGS = ("$tuple", "$dict", "$float", "$complex", "$array", "$object")


def _is_function(v: Any) -> bool:
    return callable(v) and not isinstance(v, type) and not hasattr(v, "__dataclass_fields__")


class _Writer:
    """Encodes an object as JSON-ready data, collecting its arrays."""

    def __init__(self) -> None:
        self.arrays: dict[str, np.ndarray] = {}
        self.entries: dict[str, dict[str, Any]] = {}
        self.public = _public_names()

    def fail(self, where: str, problem: str) -> Any:
        raise SaveFileError(f"cannot save {where or 'the object'}: {problem}")

    def array(self, v: Any, where: str) -> dict[str, Any]:
        if isinstance(v, jax.core.Tracer):
            self.fail(where, "it is a traced value (inside jit, grad or vmap); save outside them")
        if isinstance(v, jax.Array):
            kind = "jax"
            weak = bool(getattr(v, "weak_type", False))
        elif isinstance(v, np.generic):
            kind, weak = "numpy-scalar", False
        else:
            kind, weak = "numpy", False
        try:
            a = np.asarray(v)
        except Exception as e:  # e.g. a PRNG key array, a deleted buffer
            return self.fail(where, f"its value cannot be read as an array ({e})")
        if a.dtype.hasobject or a.dtype.kind in "OUSM":
            self.fail(where, f"an array of dtype {a.dtype} is not numeric data")
        a = np.asarray(a, order="C")
        dtype = a.dtype
        stored = a
        extension = type(dtype).__module__.startswith("ml_dtypes") or (
            dtype.type.__module__.startswith("ml_dtypes")
        )
        if dtype.kind == "V" and not extension:  # structured or raw bytes: not read back
            self.fail(
                where,
                f"an array of dtype {dtype} (structured or raw bytes) is not numeric data; "
                "save its fields as separate arrays",
            )
        if extension:
            # bfloat16, float8, ...: NPZ has no such dtype; store the bits
            stored = a.view(np.dtype(f"u{dtype.itemsize}"))
        key = f"a{len(self.arrays)}"
        self.arrays[key] = stored
        self.entries[key] = {
            "dtype": str(dtype.name),
            "shape": list(a.shape),
            "kind": kind,
            "weak_type": weak,
            "sha256": sha256_bytes(stored.tobytes()),
        }
        return {"$array": key}

    def float_(self, v: float) -> Any:
        return v if math.isfinite(v) else {"$float": repr(v)}

    def encode(self, v: Any, where: str, depth: int = 0) -> Any:
        if depth > _MAX_DEPTH:
            self.fail(where, f"it is nested more than {_MAX_DEPTH} levels deep")
        if v is None or isinstance(v, (bool, str)):
            return v
        if isinstance(v, int):
            return v
        if isinstance(v, (np.ndarray, np.generic, jax.Array)):  # np.float64 is a float too
            return self.array(v, where)
        if isinstance(v, float):
            return self.float_(v)
        if isinstance(v, complex):
            return {"$complex": [self.float_(v.real), self.float_(v.imag)]}
        if isinstance(v, list):
            return [self.encode(x, f"{where}[{i}]", depth + 1) for i, x in enumerate(v)]
        if isinstance(v, tuple) and type(v) is tuple:
            return {"$tuple": [self.encode(x, f"{where}[{i}]", depth + 1) for i, x in enumerate(v)]}
        if isinstance(v, dict) and type(v) is dict:
            out = {}
            for k, x in v.items():
                if not isinstance(k, str):
                    self.fail(where, f"dict key {k!r} is not a string (JSON keys are strings)")
                out[k] = self.encode(x, f"{where}[{k!r}]", depth + 1)
            if any(k.startswith("$") for k in out):
                return {"$dict": out}
            return out
        return self.object(v, where, depth)

    def object(self, v: Any, where: str, depth: int) -> dict[str, Any]:
        cls = type(v)
        name = _class_name(cls, self.public)
        if _is_function(v):
            self.fail(
                where,
                f"it is a function ({v!r}); functions are code, not data. Write the "
                "computation as a class (a gpchol.kernels.Kernel or gpchol.means.Mean "
                "subclass with its numbers as fields) and save that",
            )
        if dataclasses.is_dataclass(v):
            fields = {}
            for f in dataclasses.fields(v):
                value = getattr(v, f.name)
                at = f"{where}.{f.name}" if where else f.name
                if _is_function(value):
                    self.fail(
                        at,
                        f"field {f.name!r} of {name} is a function ({value!r}); functions "
                        "are code, not data. Write it as a class (a gpchol.kernels.Kernel or "
                        "gpchol.means.Mean subclass with its numbers as fields) and save that",
                    )
                fields[f.name] = self.encode(value, at, depth + 1)
            return {"$object": name, "fields": fields}
        if hasattr(v, "tree_flatten") and hasattr(cls, "tree_unflatten"):
            children, aux = v.tree_flatten()
            return {
                "$object": name,
                "children": [
                    self.encode(c, f"{where}<child {i}>", depth + 1) for i, c in enumerate(children)
                ],
                "aux": self.encode(aux, f"{where}<aux>", depth + 1),
            }
        return self.fail(
            where,
            f"an object of class {name} is neither a dataclass nor a pytree class with "
            "tree_flatten/tree_unflatten (nor an array, number, string, list, tuple or dict)",
        )


def _canonical(doc: dict[str, Any]) -> bytes:
    """The bytes the JSON's own SHA-256 covers: every field but ``sha256``, sorted keys."""
    body = {k: v for k, v in doc.items() if k != "sha256"}
    return json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def save(obj: Any, path: str | os.PathLike[str]) -> None:
    """Saves a kernel, mean, GP, posterior, fit result (or a container of them) to ``path``.

    Args:
        obj: a gpchol kernel (any composition), mean, :class:`~gpchol.GaussianProcess`,
            :class:`~gpchol.Posterior`, :class:`~gpchol.FitResult`, transform, a
            user-written kernel or mean class (a dataclass) or pytree class; or a dict
            (string keys), list or tuple of those and of arrays (NumPy or JAX, any
            numeric dtype), numbers, strings, ``None``.
        path: the JSON file to write (conventionally ``*.json``); the arrays go next to it
            in ``<path without .json>.<hash>.npz``. Directories are created as needed.

    Raises:
        SaveFileError: ``obj`` holds something that is not data: a function (e.g. a
            :class:`gpchol.means.Function` mean), a traced value (inside ``jit``), an
            object that is neither a dataclass nor a pytree class; or ``path`` names an
            ``.npz`` file. The message names the part of ``obj``.

    Example:
        >>> import os, tempfile
        >>> from gpchol import kernels
        >>> from gpchol import load, save
        >>> path = os.path.join(tempfile.mkdtemp(), "k.json")
        >>> save(kernels.Matern52(lengthscale=0.7, active_dims=(1,)), path)
        >>> load(path)
        Matern52(lengthscale=0.7, active_dims=(1,))
    """
    path = os.fspath(path)
    if path.endswith(".npz"):
        raise SaveFileError(
            f"path {path!r} ends in .npz; give the JSON file's path (e.g. 'model.json'): the "
            "arrays file is named after it"
        )
    writer = _Writer()
    encoded = writer.encode(obj, "")
    doc: dict[str, Any] = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "type": encoded.get("$object", type(obj).__name__)
        if isinstance(encoded, dict)
        else (type(obj).__name__),
        "versions": versions(),
        "object": encoded,
        "arrays": None,
    }
    previous = named_arrays(path, "arrays", "file")
    written = None
    created = False
    if writer.arrays:
        existing = _arrays_on_disk(path)
        f = write_arrays(path, writer.arrays)
        written, created = f.name, f.name not in existing
        doc["arrays"] = {
            "file": f.name,
            "bytes": f.size,
            "sha256": f.sha256,
            "entries": writer.entries,
        }
    doc["sha256"] = sha256_bytes(_canonical(doc))
    text = json.dumps(doc, indent=1, allow_nan=False) + "\n"
    try:
        commit(path, text, keep=written, remove=[previous])
    except BaseException:
        # the JSON was not replaced: the arrays file this save created is named by no file
        # (one that was there before, e.g. of an equal earlier save, stays)
        if created and named_arrays(path, "arrays", "file") != written:
            remove_files(path, [written], keep=None)
        raise


def _arrays_on_disk(path: str) -> set[str]:
    """The names in ``path``'s directory that an arrays file of ``path`` could have."""
    directory = os.path.dirname(os.path.abspath(path))
    stem = os.path.basename(path[: -len(".json")] if path.endswith(".json") else path)
    try:
        names = os.listdir(directory)
    except OSError:  # no directory yet (write_arrays creates it)
        return set()
    return {n for n in names if n.startswith(stem + ".") and n.endswith(".npz")}


# ---------------------------------------------------------------------------- reading


class _Reader:
    """Decodes one file's object (its JSON checked, its arrays loaded and checked)."""

    def __init__(self, path: str, classes: Iterable[type]) -> None:
        self.path = path
        self.classes = _Classes(classes, self.fail)
        self.arrays: dict[str, Any] = {}

    def fail(self, problem: str) -> NoReturn:
        raise SaveFileError(f"file {self.path}: {problem}")

    def check_header(self, doc: Any) -> None:
        if isinstance(doc, dict) and doc.get("format") == "gpchol-fit":
            self.fail(
                "is a model file of `gpchol fit` in its first format (a single JSON file); "
                "`gpchol predict` reads it (gpchol.cli.model.Model.from_json), and a new "
                "`gpchol fit` writes one gpchol.load reads"
            )
        _FILES.check(doc, self.path)
        recorded = doc.get("sha256")
        try:
            actual = sha256_bytes(_canonical(doc))
        except (TypeError, ValueError, RecursionError):
            actual = None
        if recorded != actual:
            self.fail(
                "its content does not match its recorded sha256: it was edited by hand or "
                "damaged. Save the object again (a file is read only as written)"
            )

    def read_arrays(self, spec: Any) -> None:
        if spec is None:
            return
        if not isinstance(spec, dict):
            self.fail("'arrays' must be a JSON object or null")
        name, raw = _FILES.read_arrays(self.path, spec.get("file"), spec.get("sha256"))
        entries = spec.get("entries")
        if not isinstance(entries, dict):
            self.fail("'arrays' has no 'entries' object")
        if set(raw) != set(entries):
            self.fail(
                f"its arrays file {os.path.basename(name)} holds other arrays than the JSON lists"
            )
        for key, entry in entries.items():
            self.arrays[key] = self.restore(key, raw[key], entry)

    def restore(self, key: str, stored: np.ndarray, entry: Any) -> Any:
        if not isinstance(entry, dict):
            self.fail(f"array {key!r}: its entry is not a JSON object")
        try:
            dtype = np.dtype(jnp.dtype(entry["dtype"]))
            shape = tuple(int(s) for s in entry["shape"])
        except Exception:
            self.fail(f"array {key!r}: bad dtype or shape in its entry")
        if sha256_bytes(np.asarray(stored, order="C").tobytes()) != entry.get("sha256"):
            self.fail(f"array {key!r} does not match its recorded sha256")
        # only the bits of a dtype NPZ lacks (bfloat16, float8, ...) are stored as unsigned
        # integers of its size; any other difference is not this file's array
        bits = dtype.kind not in "biufcmM" and stored.dtype == np.dtype(f"u{dtype.itemsize}")
        if stored.dtype != dtype and not bits:
            self.fail(f"array {key!r} is stored as {stored.dtype}, its entry says {dtype}")
        a = stored if stored.dtype == dtype else stored.view(dtype)
        if a.shape != shape or a.dtype != dtype:
            self.fail(f"array {key!r} has dtype {a.dtype} and shape {a.shape}, not as recorded")
        kind = entry.get("kind")
        if kind == "numpy":
            return a
        if kind == "numpy-scalar":
            return a[()]
        if kind != "jax":
            self.fail(f"array {key!r}: unknown kind {kind!r}")
        if jax.dtypes.canonicalize_dtype(dtype) != dtype:
            return a  # e.g. float64 with x64 off: keep every bit, as NumPy
        if entry.get("weak_type") and a.ndim == 0 and jnp.asarray(a.item()).dtype == dtype:
            return jnp.asarray(a.item())
        return jnp.asarray(a)

    # ---------------------------------------------------------------- the object
    def decode(self, v: Any, depth: int = 0) -> Any:
        if depth > _MAX_DEPTH:
            self.fail(f"its object is nested more than {_MAX_DEPTH} levels deep")
        if v is None or isinstance(v, (bool, str, int, float)):
            return v
        if isinstance(v, list):
            return [self.decode(x, depth + 1) for x in v]
        if not isinstance(v, dict):
            self.fail(f"unexpected JSON value {v!r}")
        tags = [k for k in v if k in _TAGS]
        if not tags:
            return {k: self.decode(x, depth + 1) for k, x in v.items()}
        tag = tags[0]
        body = v[tag]
        if tag == "$array":
            if body not in self.arrays:
                self.fail(f"it refers to an array {body!r} that its arrays file does not hold")
            return self.arrays[body]
        if tag == "$float":
            if body not in ("nan", "inf", "-inf"):
                self.fail(f"bad special float {body!r}")
            return float(body)
        if tag == "$complex":
            re_, im = (self.decode(x, depth + 1) for x in body)
            return complex(re_, im)
        if tag == "$tuple":
            return tuple(self.decode(x, depth + 1) for x in body)
        if tag == "$dict":
            return {k: self.decode(x, depth + 1) for k, x in body.items()}
        return self.object(v, depth)

    def object(self, v: dict[str, Any], depth: int) -> Any:
        name = v["$object"]
        if not isinstance(name, str):
            self.fail(f"bad class name {name!r}")
        cls = self.classes.get(name)
        try:
            if "fields" in v:
                if not dataclasses.is_dataclass(cls):
                    self.fail(f"class {name} has no fields (it is not a dataclass)")
                known = {f.name: f for f in dataclasses.fields(cls)}
                values = {k: self.decode(x, depth + 1) for k, x in v["fields"].items()}
                # a field added to the class later, with a default, may be missing (a file
                # written before it): the default stands in; any other difference is refused
                added = [
                    k
                    for k in set(known) - set(values)
                    if known[k].default is not dataclasses.MISSING
                    or known[k].default_factory is not dataclasses.MISSING
                ]
                if set(values) | set(added) != set(known):
                    self.fail(
                        f"the fields of {name} ({sorted(values)}) are not those of the class "
                        f"({sorted(known)}); was the class changed since the file was written?"
                    )
                obj = cls(**{k: x for k, x in values.items() if known[k].init})
                for k, x in values.items():
                    if not known[k].init:
                        object.__setattr__(obj, k, x)
                return obj
            children = [self.decode(x, depth + 1) for x in v["children"]]
            aux = self.decode(v["aux"], depth + 1)
            return cls.tree_unflatten(aux, children)  # type: ignore[attr-defined]
        except SaveFileError:
            raise
        except Exception as e:
            self.fail(f"cannot rebuild the {name} it holds ({type(e).__name__}: {e})")


def load(path: str | os.PathLike[str], *, classes: Iterable[type] = ()) -> Any:
    """Loads an object written by :func:`save`, equal bit for bit to the one saved.

    Args:
        path: the JSON file :func:`save` wrote (its arrays file next to it).
        classes: the user's own classes the file may hold (e.g. a kernel subclass), by
            class object: ``load(path, classes=[MyKernel])``. gpchol's own classes need
            not be listed; a file never makes gpchol import a module.

    Returns:
        The object: same classes, structure, numbers, array dtypes and shapes.

    Raises:
        SaveFileError: the file is missing, not JSON, not written by :func:`save`, written
            by a newer gpchol (format version), edited by hand (its content does not match
            its SHA-256), or its arrays file is missing, damaged or replaced; or it holds a
            class that is neither gpchol's nor in ``classes``. The message names the file.

    Example:
        >>> import os, tempfile
        >>> import jax.numpy as jnp
        >>> from gpchol import means
        >>> from gpchol import load, save
        >>> path = os.path.join(tempfile.mkdtemp(), "m.json")
        >>> save({"mean": means.Linear(weights=jnp.array([1.0, -2.0])), "note": "x"}, path)
        >>> back = load(path)
        >>> print(back["mean"].weights, back["note"])
        [ 1. -2.] x
    """
    reader = _Reader(os.fspath(path), classes)
    doc = _FILES.read(reader.path)
    reader.check_header(doc)
    if "object" not in doc:
        reader.fail("'object' is missing")
    try:
        reader.read_arrays(doc.get("arrays"))
        return reader.decode(doc["object"])
    except SaveFileError:
        raise
    except RecursionError:
        reader.fail("its object is nested too deeply")
    except Exception as e:  # a malformed tag or entry: the file's fault, said as such
        reader.fail(f"it is malformed ({type(e).__name__}: {e}); was it edited by hand?")
