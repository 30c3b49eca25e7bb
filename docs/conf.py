"""Sphinx configuration of gpchol's documentation site.

Build (strict: every warning is an error, every cross-reference must resolve)::

    pip install -e ".[docs]"
    python -m sphinx -W -n --keep-going -b html docs docs/_build/html

The notebooks in ``notebooks/`` are the source of the example pages: they are stored
without outputs, copied into ``docs/notebooks/`` (ignored by git) when the build starts and
executed by MyST-NB at the sizes they have, with jupyter-cache keeping the outputs in
``docs/_build/.jupyter_cache`` so that a rebuild with unchanged notebooks runs none of them.
``GPCHOL_DOCS_EXECUTE=off`` builds without executing them (pages without outputs; for
quick checks of the prose only, never in CI).
"""

from __future__ import annotations

import filecmp
import os
import pathlib
import re
import shutil

import gpchol

DOCS = pathlib.Path(__file__).resolve().parent
ROOT = DOCS.parent

project = "gpchol"
author = "the gpchol developers"
copyright = "2026, the gpchol developers"
version = release = gpchol.__version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",  # the docstrings are Google style
    "sphinx.ext.mathjax",
    # MathJax 3 served from _static/mathjax instead of a CDN: equations render offline
    "sphinx-mathjax-offline",
    "myst_nb",  # Markdown pages and executed notebooks
]

source_suffix = {".rst": "restructuredtext", ".md": "myst-nb", ".ipynb": "myst-nb"}
exclude_patterns = ["_build", "scripts", "README.md", "**/.ipynb_checkpoints"]
root_doc = "index"

# -- strictness ------------------------------------------------------------------------
# Every cross-reference to gpchol must resolve. References into other projects (JAX,
# NumPy, optax, NumPyro, scikit-learn, the standard library) come from type hints; there
# is no network at build time for intersphinx inventories, so those targets are left
# unlinked on purpose instead of failing the build.
nitpicky = True
nitpick_ignore_regex = [
    (r"py:.*", r"(jax|jaxlib|numpy|np|jnp|optax|numpyro|sklearn|scipy|matplotlib)(\..*)?"),
    (r"py:.*", r"(collections\.abc|typing|types|pathlib|os|enum|dataclasses|warnings)\..*"),
    # typing names as they appear in hints
    (r"py:class", r"(ArrayLike|DTypeLike|Array|Callable|Sequence|Mapping|Iterable|Any)"),
    # private gpchol modules and classes (base classes, the backend record, the sharded
    # setup) named by hints and docstrings: private on purpose, so they have no page
    (r"py:.*", r"gpchol(\.\w+)*\._\w+(\.\w+)*"),
    (r"py:.*", r"_\w+"),
]
nitpick_ignore = [
    # BatchedFitResult's docstring names its status codes (1, 2, 3) by the constants of
    # the private module gpchol/_fit/batched.py, which are not exported
    ("py:data", "CONVERGED"),
    ("py:data", "STEPS"),
    ("py:data", "FAILED"),
    # fit's and Posterior's docstrings name private helpers (the default transforms of a
    # parameter tree, the default block size) that are not exported
    ("py:func", "default_transforms"),
    ("py:func", "default_block_size"),
    # a "Raises:" entry of ChangePoints and Power naming two exceptions at once
    ("py:exc", "TypeError / ValueError"),
]

# -- autodoc -----------------------------------------------------------------------------
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_preserve_defaults = True

autodoc_default_options = {"members": True, "show-inheritance": False}
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False
# "Attributes:" sections become field lists: a NamedTuple's fields are then documented
# once (by autodoc), not twice
napoleon_use_ivar = True

# -- MyST and MyST-NB ----------------------------------------------------------------------
myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence", "deflist"]
myst_heading_anchors = 3
nb_execution_mode = os.environ.get("GPCHOL_DOCS_EXECUTE", "cache")
nb_execution_cache_path = str(DOCS / "_build" / ".jupyter_cache")
# per cell: the slowest cell took under 3 minutes on the 2-core machine at a load of 8; a
# cell that hangs fails the build after this instead of hanging it
nb_execution_timeout = 300
nb_execution_raise_on_error = True  # a failed cell fails the build
nb_execution_in_temp = True  # files a notebook writes stay out of the repository
nb_merge_streams = True

# -- HTML ------------------------------------------------------------------------------------
html_theme = "furo"  # every asset ships in the wheel: nothing is fetched by the reader
html_title = f"gpchol {release}"
html_static_path = ["_static"]
html_last_updated_fmt = None
html_show_sourcelink = False


def _copy_notebooks() -> None:
    """Mirror ``notebooks/*.ipynb`` into ``docs/notebooks/`` (copied only when changed).

    ``copy2`` keeps the modification time, so Sphinx re-reads a page only when its
    notebook changed; jupyter-cache keys on the code cells, so an unchanged notebook is
    never executed again.
    """
    target = DOCS / "notebooks"
    target.mkdir(exist_ok=True)
    sources = sorted((ROOT / "notebooks").glob("*.ipynb"))
    names = {p.name for p in sources}
    for stale in target.glob("*.ipynb"):
        if stale.name not in names:
            stale.unlink()
    for src in sources:
        dst = target / src.name
        if not dst.exists() or not filecmp.cmp(src, dst, shallow=False):
            shutil.copy2(src, dst)


_copy_notebooks()


# -- private paths to public names -------------------------------------------------------------
# Docstrings and type hints name objects where they are defined (``gpchol._gp.model.Posterior``)
# or relative to their own module (``Constant`` inside ``gpchol/means.py``); the reference
# documents them under their public names (``gpchol.Posterior``, ``gpchol.means.Constant``).
# This handler resolves such a reference to the public entry of the same object, so that
# it links instead of failing the strict build.

PUBLIC_MODULES = (
    "gpchol.kernels",
    "gpchol.means",
    "gpchol.datasets",
    "gpchol.distributed",
    "gpchol.numpyro",
    "gpchol.sklearn",
)


def _public_names() -> dict[int, list[str]]:
    import importlib
    import types

    names: dict[int, list[str]] = {}
    for modname in ("gpchol", *PUBLIC_MODULES):
        mod = importlib.import_module(modname)
        for name in mod.__all__:
            obj = getattr(mod, name)
            if isinstance(obj, types.ModuleType) or isinstance(obj, str | int | float | tuple):
                continue
            names.setdefault(id(obj), []).append(f"{modname}.{name}")
            for attr, member in vars(obj).items() if isinstance(obj, type) else ():
                if not attr.startswith("_"):
                    names.setdefault(id(member), []).append(f"{modname}.{name}.{attr}")
    return names


def _lookup(path: str):
    import importlib

    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        try:
            for attr in parts[i:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return None
        return obj
    return None


def _resolve_public(app, env, node, contnode):
    if node.get("refdomain") != "py":
        return None
    target = node["reftarget"].lstrip("~.")
    if not target or target.split(".")[0] in ("jax", "numpy", "optax", "numpyro", "sklearn"):
        return None
    public = app.config._gpchol_public if hasattr(app.config, "_gpchol_public") else None
    if public is None:
        public = _public_names()
        app.config._gpchol_public = public
    # where to look: the target as written, then relative to the module the docstring
    # came from ("docstring of gpchol.means.as_mean") and to the page's current module
    contexts = [""]
    source = node.source or ""
    m = re.search(r"docstring of ([\w.]+)", source)
    if m:
        parts = m.group(1).split(".")
        contexts += [".".join(parts[:i]) + "." for i in range(len(parts), 0, -1)]
    if node.get("py:module"):
        contexts.append(node["py:module"] + ".")
    for prefix in contexts:
        obj = _lookup(prefix + target)
        if obj is None:
            continue
        for name in public.get(id(obj), []):
            if name == target:
                continue
            domain = env.get_domain("py")
            for typ in (node["reftype"], "obj"):
                found = domain.resolve_xref(
                    env, node["refdoc"], app.builder, typ, name, node, contnode
                )
                if found is not None:
                    return found
    return None


# Sphinx expands ``jax.typing.ArrayLike`` into the union it stands for; write it back as
# the name the code uses (autodoc_type_aliases would do it, but turns ``ArrayLike | None``
# into a broken forward reference in Sphinx 9).
_ARRAYLIKE = re.compile(
    r"~?jax(\.\w+)*\.Array \| ~?numpy\.ndarray \| ~?numpy\.bool \| ~?numpy\.number"
    r" \| bool \| int \| float \| complex"
)


def _short_signature(app, what, name, obj, options, signature, return_annotation):
    if signature is None:
        return None
    return _ARRAYLIKE.sub("~jax.typing.ArrayLike", signature), return_annotation


def setup(app):
    app.connect("missing-reference", _resolve_public)
    app.connect("autodoc-process-signature", _short_signature)
