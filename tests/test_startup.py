"""Start-up: the command line's compilation cache, the compile clock, one compiled step
per fit, and no heavy optional module imported by ``import gpchol``.

The commands run in-process through :func:`gpchol.cli.main` on a 30-row CSV (a few
steps), so each takes about a second on a quiet machine.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import backend_compiles

import gpchol
from gpchol import kernels
from gpchol._internal import fit_programs_module
from gpchol.cli import main
from gpchol.cli.cache import ENV_VAR, CompileClock, compilation_cache, resolve_cache_dir

# gpchol's cache settings are tested from a session without the test suite's own cache
pytestmark = pytest.mark.usefixtures("without_session_jax_cache")

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    "option, no_cache, env, program, expected",
    [
        (None, False, {}, True, "HOME/.cache/gpchol/jax"),
        (None, False, {"XDG_CACHE_HOME": "/x"}, True, "/x/gpchol/jax"),
        (None, False, {}, False, None),  # from Python: only when asked for
        (None, True, {}, True, None),
        ("/d", True, {}, True, None),  # --no-cache wins
        ("/d", False, {ENV_VAR: "/e"}, False, "/d"),  # the option wins over the variable
        (None, False, {ENV_VAR: "/e"}, True, "/e"),
        (None, False, {ENV_VAR: "/e"}, False, "/e"),
        (None, False, {ENV_VAR: "off"}, True, None),
        (None, False, {ENV_VAR: ""}, True, None),
        (None, False, {ENV_VAR: " OFF "}, True, None),
        ("", False, {}, True, None),
    ],
)
def test_resolve_cache_dir(option, no_cache, env, program, expected) -> None:
    got = resolve_cache_dir(option, no_cache=no_cache, environ=env, program=program)
    if expected is not None and expected.startswith("HOME"):
        expected = os.path.join(os.path.expanduser("~"), expected[5:])
    assert got == expected


@pytest.fixture
def small_csv(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> pathlib.Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(ENV_VAR, raising=False)
    x = np.linspace(0.0, 5.0, 30)
    rows = "".join(f"{float(a)!r},{float(b)!r}\n" for a, b in zip(x, np.sin(x), strict=True))
    (tmp_path / "d.csv").write_text("x,y\n" + rows)
    return tmp_path


FIT = ["fit", "--csv", "d.csv", "--x", "x", "--y", "y", "--steps", "3", "--no-plot", "--quiet"]


def test_fit_fills_the_cache_and_restores_jax(small_csv, capsys) -> None:
    cache = small_csv / "cache"
    # a fit of this structure earlier in the process would be served from memory (compiling
    # nothing, so writing nothing): start from an empty program cache
    fit_programs_module.clear_cache()
    keys = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs")
    before = {k: getattr(jax.config, k) for k in keys}
    rc = main([*FIT, "--cache-dir", str(cache)])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert "warning" not in err
    assert len(os.listdir(cache)) > 0  # the fit's programs were written
    assert not [p for p in os.listdir(cache) if p.startswith(".gpchol-probe-")]
    # JAX's settings are as before the command (a library call leaves no global state)
    assert {k: getattr(jax.config, k) for k in keys} == before
    # compile time and step time apart in the summary line
    line = next(x for x in out.splitlines() if x.startswith("log marginal likelihood"))
    assert "compile" in line and "steps" in line and "ms/step" in line


def test_unwritable_cache_dir_warns_once_and_fits(small_csv, capsys) -> None:
    (small_csv / "file").write_text("not a directory")
    rc = main([*FIT, "--cache-dir", str(small_csv / "file" / "sub")])
    err = capsys.readouterr().err
    assert rc == 0, err
    warnings = [x for x in err.splitlines() if x.startswith("gpchol: warning:")]
    assert len(warnings) == 1, err
    assert "cache" in warnings[0] and "--no-cache" in warnings[0]
    assert "Traceback" not in err
    assert os.path.exists("gpchol-fit.json")


def test_no_cache_and_env_off(small_csv, capsys, monkeypatch) -> None:
    monkeypatch.setenv(ENV_VAR, str(small_csv / "envcache"))
    assert main([*FIT, "--no-cache"]) == 0
    assert not os.path.exists(small_csv / "envcache")
    monkeypatch.setenv(ENV_VAR, "off")
    assert main(FIT) == 0
    capsys.readouterr()


def test_compilation_cache_keeps_a_callers_own_cache(tmp_path) -> None:
    old = jax.config.jax_compilation_cache_dir
    jax.config.update("jax_compilation_cache_dir", str(tmp_path / "mine"))
    try:
        with compilation_cache(str(tmp_path / "other")) as used:
            assert used is None
        assert jax.config.jax_compilation_cache_dir == str(tmp_path / "mine")
    finally:
        jax.config.update("jax_compilation_cache_dir", old)
    assert not os.path.exists(tmp_path / "other")


def test_compile_clock_counts_compiles_not_runs() -> None:
    f = jax.jit(lambda x: jnp.sin(x) @ jnp.cos(x).T)
    x = jnp.ones((50, 50))
    with CompileClock() as first:
        f(x).block_until_ready()
    with CompileClock() as again:
        for _ in range(3):
            f(x).block_until_ready()
    assert 0.0 < first.seconds <= first.wall
    assert again.seconds == 0.0 and again.wall > 0.0


@pytest.mark.parametrize("optimizer", ["lbfgs", "adam"])
def test_one_compiled_step_across_restarts(rng, optimizer) -> None:
    X = jnp.asarray(rng.uniform(0, 5, (20, 1)))
    y = jnp.asarray(np.sin(np.asarray(X[:, 0])))

    def build(p):
        return gpchol.GaussianProcess(
            p["amp"] * kernels.ExpSquared(lengthscale=p["ell"]), X, noise=p["noise"]
        )

    p0 = {"amp": 1.0, "ell": 1.0, "noise": 0.1}
    names = backend_compiles(
        lambda: gpchol.fit(build, p0, y, optimizer=optimizer, steps=3, restarts=2, progress=False)
    )
    # the step is compiled once for all three starts (no retrace between restarts): Adam's
    # one program; L-BFGS's value and gradient (its line search is driven from Python)
    main = "jit(step)" if optimizer == "adam" else "jit(flat_loss)"
    assert names.count(main) == 1, names


def test_import_loads_no_heavy_optional_module() -> None:
    code = (
        "import sys, gpchol, gpchol.cli\n"
        "heavy = ('matplotlib', 'numpyro', 'scipy', 'sklearn', 'tinygp', 'pandas')\n"
        "print(','.join(m for m in heavy if m in sys.modules))\n"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300
    )
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.strip() == "", f"imported at `import gpchol`: {p.stdout.strip()}"


def test_a_default_fit_imports_neither_scipy_linalg_nor_optax() -> None:
    """A fit with the default optimiser (gpchol's L-BFGS) on the compiled CPU handlers
    imports neither ``optax`` (0.1 s) nor ``scipy.linalg`` (0.2 s; the handlers take the
    routines of the OpenBLAS SciPy's wheel bundles, where it bundles one)."""
    code = (
        "import sys, numpy as np, gpchol\n"
        "from gpchol import kernels\n"
        "from gpchol._internal import cpu_ffi\n"
        "X = np.linspace(0.0, 5.0, 30)[:, None]; y = np.sin(X[:, 0])\n"
        "r = gpchol.fit(lambda p: gpchol.GaussianProcess(p['a'] * kernels.ExpSquared(p['l']),\n"
        "    X, noise=p['n']), {'a': 1.0, 'l': 1.0, 'n': 0.1}, y, steps=3, progress=False)\n"
        "assert cpu_ffi.cpu_unavailable_reason() is None, cpu_ffi.cpu_unavailable_reason()\n"
        "bundled = cpu_ffi._bundled_openblas() is not None\n"
        "print(bundled, 'scipy.linalg' in sys.modules, 'optax' in sys.modules)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300
    )
    assert p.returncode == 0, p.stderr[-2000:]
    bundled, linalg, optax = p.stdout.split()
    assert optax == "False"
    if bundled == "True":
        assert linalg == "False"


# slow: two fresh interpreters each import JAX and run a fit
@pytest.mark.slow
def test_enable_compile_cache_reuses_programs_across_processes(tmp_path) -> None:
    """gpchol.enable_compile_cache: a second process of the same fit reads every program
    back from the persistent cache (JAX's cache reports no miss there)."""
    code = (
        "import jax, numpy as np, gpchol\n"
        "from gpchol import kernels, GaussianProcess, Positive\n"
        "used = gpchol.enable_compile_cache()\n"
        "misses = []\n"
        "jax.monitoring.register_event_listener(\n"
        "    lambda e, **k: misses.append(e) if e.endswith('cache_misses') else None)\n"
        "X = np.linspace(0.0, 5.0, 30)[:, None]; y = np.sin(X[:, 0])\n"
        "p0 = {'a': 1.0, 'l': 1.0, 'n': 0.1}\n"
        "r = gpchol.fit(lambda p: GaussianProcess(p['a'] * kernels.ExpSquared(p['l']), X,\n"
        "               noise=p['n']), p0, y, transforms={k: Positive() for k in p0},\n"
        "               progress=False, steps=20)\n"
        "print(used, len(misses) > 0, repr(r.loss))\n"
    )
    env = {**os.environ, "GPCHOL_CACHE_DIR": str(tmp_path / "cache")}
    outs = [
        subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        ).stdout.split()
        for _ in range(2)
    ]
    assert outs[0][0] == outs[1][0] == str(tmp_path / "cache")
    assert outs[0][1] == "True" and outs[1][1] == "False", outs
    assert outs[0][2] == outs[1][2]  # the same fit, bit for bit


def test_enable_compile_cache_off_and_unusable(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("GPCHOL_CACHE_DIR", "off")
    assert gpchol.enable_compile_cache() is None
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(OSError, match="cannot be used"):
        gpchol.enable_compile_cache(blocker / "sub")
