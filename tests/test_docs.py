"""The documentation site's API reference and the README stay in step with the code.

The reference (``docs/api/*.rst``) lists every public object by an explicit autodoc
directive; these tests compare those entries with ``gpchol.__all__`` and the ``__all__``
of every public submodule, both ways: nothing public is left out, nothing listed is gone
or private. They read the ``.rst`` files as text, so they need no Sphinx. The README's
test command is the one ``.ci/run`` runs, and its pictures exist.
"""

from __future__ import annotations

import importlib
import pathlib
import pkgutil
import re
import types

import gpchol

ROOT = pathlib.Path(__file__).resolve().parent.parent
API = ROOT / "docs" / "api"
DIRECTIVE = re.compile(r"^\.\. (?:auto)?(module|class|function|exception|data)::\s+(\S+)", re.M)
# public submodules that are programs, not Python API: documented on their guide pages
PROGRAMS = {"cli": "docs/guide/cli.md", "build": "docs/guide/gpu.md"}


def reference_entries() -> dict[str, set[str]]:
    """``{"module": {...}, "object": {...}}``: the dotted names the reference documents."""
    found: dict[str, set[str]] = {"module": set(), "object": set()}
    for page in sorted(API.glob("*.rst")):
        for kind, name in DIRECTIVE.findall(page.read_text()):
            found["module" if kind == "module" else "object"].add(name)
    return found


def public_submodules() -> set[str]:
    names = {m.name for m in pkgutil.iter_modules(gpchol.__path__) if not m.name.startswith("_")}
    return {f"gpchol.{n}" for n in names - set(PROGRAMS)}


def public_objects() -> set[str]:
    expected = set()
    for modname in ["gpchol", *sorted(public_submodules())]:
        mod = importlib.import_module(modname)
        for name in mod.__all__:
            if not isinstance(getattr(mod, name), types.ModuleType):
                expected.add(f"{modname}.{name}")
    return expected


def test_every_public_submodule_has_a_reference_page():
    documented = reference_entries()["module"]
    assert public_submodules() <= documented, sorted(public_submodules() - documented)
    modules_in_all = {
        f"gpchol.{n}" for n in gpchol.__all__ if isinstance(getattr(gpchol, n), types.ModuleType)
    }
    assert modules_in_all <= public_submodules()


def test_every_public_name_is_in_the_reference():
    missing = public_objects() - reference_entries()["object"]
    assert not missing, f"public names missing from docs/api/*.rst: {sorted(missing)}"


def test_the_reference_lists_nothing_private_or_gone():
    extra = reference_entries()["object"] - public_objects()
    assert not extra, f"docs/api/*.rst documents names that are not public: {sorted(extra)}"
    stale = reference_entries()["module"] - public_submodules() - {"gpchol"}
    assert not stale, stale


def test_programs_have_their_guide_pages():
    for module, page in PROGRAMS.items():
        importlib.import_module(f"gpchol.{module}")
        assert (ROOT / page).is_file(), page


def test_readme_commands_match_ci():
    """The README's quickstart is two commands; the second is what .ci/run runs."""
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"## Quickstart.*?```bash\n(.*?)```", readme, re.S)
    assert block, "README.md has no Quickstart code block"
    commands = [ln for ln in block.group(1).splitlines() if ln.strip()]
    assert len(commands) == 2, commands
    assert commands[0].rstrip().endswith("gpchol fit"), commands[0]
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert commands[1].strip() in [ln.strip() for ln in ci], (
        f".ci/run does not run the README's test command {commands[1]!r}"
    )


def test_readme_pictures_exist():
    readme = (ROOT / "README.md").read_text()
    pictures = re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", readme)
    assert len(pictures) >= 2, pictures
    for path in pictures:
        assert (ROOT / path).is_file(), path
