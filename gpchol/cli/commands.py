"""The subcommands: ``gpchol check``, ``gpchol fit`` and ``gpchol predict``.

Each takes the parsed arguments (:func:`gpchol.cli.parsing.build_parser`) and returns the
exit status; a problem with the user's input is a :class:`~gpchol.cli.errors.CLIError`.
:data:`COMMANDS` maps each name to its function.

Example:
    >>> import jax.numpy as jnp
    >>> from gpchol.cli.commands import COMMANDS, median_time
    >>> sorted(COMMANDS)
    ['check', 'fit', 'predict']
    >>> median_time(jnp.sin, jnp.ones(3)) >= 0.0
    True
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import gpchol
from gpchol import CheckpointError, FitResult
from gpchol._cuda.ffi import cuda_unavailable_reason
from gpchol._fit.checkpoint import manifest_path
from gpchol.cli.cache import CompileClock
from gpchol.cli.csvio import format_predictions, read_csv
from gpchol.cli.errors import CLIError, checkpoint_message, one_line
from gpchol.cli.files import check_fit_outputs, check_output, resumed_steps, write_file
from gpchol.cli.model import Model, read_models
from gpchol.cli.parsing import fit_options, model_columns
from gpchol.cli.resources import (
    FIT_FLOPS,
    FIT_MATRICES,
    LARGE_N,
    check_memory,
    estimate,
    format_bytes,
    format_seconds,
    machine_memory,
)

__all__ = ["COMMANDS", "announce_cost", "median_time", "run_check", "run_fit", "run_predict"]


def median_time(fn: Callable[..., Any], *args: Any, repeat: int = 3) -> float:
    """Median wall time in seconds of ``fn(*args)`` over ``repeat`` calls.

    One warm-up call (compilation) comes first; each call waits for JAX's asynchronous
    results. The command line's one timing helper (``gpchol check``).
    """
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def _float_dtype(float32: bool) -> type[np.floating]:
    """float32, or float64 (turning on JAX's x64 mode)."""
    if float32:
        return np.float32
    jax.config.update("jax_enable_x64", True)
    return np.float64


# --------------------------------------------------------------------------------- check

_CHECK_MATRICES = 14
"""``n x n`` float64 matrices ``gpchol check`` holds (host copies, references, gradients)."""


def run_check(args: argparse.Namespace) -> int:
    """``gpchol check``: every backend's factor and gradient against JAX's, with timings."""
    if args.n < 1:
        raise CLIError(f"--n must be >= 1 (got {args.n}).")
    cost = estimate(args.n, 0, itemsize=8, matrices=_CHECK_MATRICES, flops_per_eval=1.0, rate=1.0)
    check_memory(f"gpchol check --n {args.n}", cost.bytes, args.no_memory_check)
    dtype = _float_dtype(args.float32)
    rng = np.random.default_rng(args.seed)
    n = args.n
    m = rng.standard_normal((n, n))
    a = jnp.asarray((m @ m.T / n + np.eye(n)).astype(dtype))
    w = jnp.asarray(rng.standard_normal((n, n)).astype(dtype))

    def loss(chol: Callable[[jax.Array], jax.Array]) -> Callable[[jax.Array], jax.Array]:
        return lambda x: jnp.sum(chol(x) * w)

    ref_L = jax.jit(jnp.linalg.cholesky)(a)
    ref_grad_fn = jax.jit(jax.grad(loss(jnp.linalg.cholesky)))
    ref_grad = ref_grad_fn(a)
    t_ref_fwd = median_time(jax.jit(jnp.linalg.cholesky), a)
    t_ref_grad = median_time(ref_grad_fn, a)

    backends = ["xla", "tiled"]
    reason = cuda_unavailable_reason() if jax.default_backend() == "gpu" else "no GPU"
    if reason is None:
        backends.append("cuda")
    print(
        f"gpchol {gpchol.__version__} check: n={n}, {np.dtype(dtype).name}, "
        f"jax {jax.__version__} on {jax.default_backend()}"
    )
    print(
        f"  reference jnp.linalg.cholesky: forward {t_ref_fwd * 1e3:8.1f} ms, "
        f"forward+grad {t_ref_grad * 1e3:8.1f} ms"
    )
    eps = float(np.finfo(dtype).eps)
    ok = True
    for be in backends:

        def chol(x: jax.Array, be: str = be) -> jax.Array:
            return gpchol.cholesky(x, backend=be, tile_size=args.tile_size)

        fwd = jax.jit(chol)
        grad = jax.jit(jax.grad(loss(chol)))
        L = fwd(a)
        g = grad(a)
        L64 = np.asarray(L, np.float64)
        a64 = np.asarray(a, np.float64)
        resid = np.linalg.norm(a64 - L64 @ L64.T, 1) / (n * np.linalg.norm(a64, 1) * eps)
        err_L = float(jnp.max(jnp.abs(L - ref_L)) / jnp.max(jnp.abs(ref_L)))
        err_g = float(jnp.max(jnp.abs(g - ref_grad)) / jnp.max(jnp.abs(ref_grad)))
        t_fwd = median_time(fwd, a)
        t_grad = median_time(grad, a)
        good = resid < 30 and err_g < (1e-3 if args.float32 else 1e-8)
        ok &= good
        print(
            f"  backend={be:5s}  residual ratio {resid:6.2f}  |L-L_jax| {err_L:8.1e}  "
            f"|grad-grad_jax| {err_g:8.1e}  forward {t_fwd * 1e3:8.1f} ms  "
            f"forward+grad {t_grad * 1e3:8.1f} ms ({t_ref_grad / t_grad:4.2f}x JAX)  "
            f"{'ok' if good else 'FAILED'}"
        )
    if "cuda" not in backends:
        print(f"  backend=cuda  not available: {reason}")
    return 0 if ok else 1


# ----------------------------------------------------------------------------------- fit


def _fit_data(args: argparse.Namespace) -> tuple[Model, str, float]:
    """The model to fit: ``(model, a line on the data, how far the plot extrapolates)``."""
    if args.csv is None:
        if args.x or args.y or args.kernel:
            raise CLIError("--x, --y and --kernel need --csv FILE")
        return Model.co2(), "embedded Mauna Loa CO2, monthly means (n=521)", 10.0
    x_cols, y_col, spec = model_columns(args)
    X, y = read_csv(args.csv, x_cols, y_col, dropna=args.dropna, min_rows=3)
    assert y is not None  # read with a target column
    model = Model.standardized(spec, X, y, x_cols, y_col)
    source = f"{args.csv}: {X.shape[0]} rows, x={','.join(x_cols)}, y={y_col}"
    extrapolate = 0.0
    if X.shape[1] == 1:  # a tenth of the range, where the end of the plot can be represented
        hi, lo = float(X[:, 0].max()), float(X[:, 0].min())
        extrapolate = 0.1 * hi - 0.1 * lo
        if not math.isfinite(hi + extrapolate):
            extrapolate = 0.0
    return model, source, extrapolate


def announce_cost(
    what: str, n: int, d: int, itemsize: int, *, evals: str, override: bool, extra: int = 0
) -> None:
    """Refuses work that cannot fit in memory; prints the estimate before a large one.

    The estimate (one line on stderr) is printed from :data:`LARGE_N` points on, or when
    the work needs a quarter of the machine's memory or more.

    Args:
        what: the work, for the messages (e.g. ``"the fit"``).
        n: number of training points (the GP's matrices are ``n x n``).
        d: number of input columns.
        itemsize: bytes per number.
        evals: how many evaluations of the likelihood and gradient the work takes (text).
        override: ``--no-memory-check`` was given.
        extra: bytes needed beyond the GP step's (e.g. the test points' cross-covariance).

    Raises:
        CLIError: the estimate exceeds the machine's memory (names the override flag).
    """
    base = estimate(n, d, itemsize=itemsize, matrices=FIT_MATRICES, flops_per_eval=1.0, rate=1.0)
    need = base.bytes + extra
    check_memory(f"{what} of n={n} points", need, override)
    have = machine_memory()
    if n < LARGE_N and (have is None or need < have // 4):
        return
    cost = estimate(n, d, itemsize=itemsize, matrices=FIT_MATRICES, flops_per_eval=FIT_FLOPS)
    print(
        f"gpchol: {what} of n={n} points needs about {format_bytes(need)} of memory"
        + (f" (this machine: {format_bytes(have)})" if have else "")
        + f" and roughly {format_seconds(cost.seconds_per_eval)} per evaluation of the "
        f"likelihood and its gradient here ({evals}); Ctrl-C stops it",
        file=sys.stderr,  # stdout may be the predictions' CSV
        flush=True,
    )


def _fit_model(
    model: Model, args: argparse.Namespace, dtype: type[np.floating]
) -> tuple[FitResult, dict[str, np.ndarray], float]:
    """Runs :func:`gpchol.fit`; returns ``(result, params, lml of the raw data)``."""
    ys = jnp.asarray(model.ys(model.y), dtype)
    init = {k: jnp.asarray(v, dtype) for k, v in model.spec.init_params().items()}
    try:
        result = gpchol.fit(
            lambda p: model.gp(p, dtype),
            init,
            ys,
            transforms=model.spec.transforms(),
            **fit_options(args),
        )
    except CheckpointError as e:
        raise CLIError(checkpoint_message(e)) from None
    except ValueError as e:
        raise CLIError(str(e)) from None
    # the likelihood of the raw data: p(y) = p(z) / y_scale^n for z = (y - shift) / scale
    assert result.log_marginal_likelihood is not None  # a GP fit (y given)
    lml = result.log_marginal_likelihood - model.X.shape[0] * math.log(model.y_scale)
    if not result.success:
        print(f"gpchol: warning: {result.message}", file=sys.stderr)
    params = {k: np.asarray(v) for k, v in result.params.items()}
    return result, params, float(lml)


def _print_params(model: Model, params: dict[str, np.ndarray]) -> None:
    def f(v: Any) -> str:
        a = np.asarray(v, np.float64)
        return f"{float(a):.4g}" if a.ndim == 0 else "[" + ", ".join(f"{x:.4g}" for x in a) + "]"

    if model.spec.spec != "co2":
        print("fitted hyperparameters (inputs and target standardized: lengthscales, periods in")
        print("units of each input's std; amplitudes and noise in units of the target's variance):")
        for k, v in params.items():
            print(f"  {k:32s} {f(v)}")
        return

    def sd(k: str) -> float:
        return float(np.sqrt(params[k]))

    print("fitted hyperparameters (Rasmussen & Williams CO2 kernel):")
    print(
        f"  long-term trend : amplitude {sd('long.amplitude'):8.3f} ppm, lengthscale "
        f"{float(params['long.lengthscale']):8.3f} years"
    )
    print(
        f"  seasonal        : amplitude {sd('seasonal.amplitude'):8.3f} ppm, decay "
        f"{float(params['seasonal.decay']):8.3f} years, smoothness "
        f"{float(params['seasonal.smoothness']):.3f}, period 1 year (fixed)"
    )
    print(
        f"  medium-term     : amplitude {sd('medium.amplitude'):8.3f} ppm, lengthscale "
        f"{float(params['medium.lengthscale']):8.3f} years, alpha "
        f"{float(params['medium.alpha']):.3f}"
    )
    print(
        f"  short-term      : amplitude {sd('short.amplitude'):8.3f} ppm, lengthscale "
        f"{float(params['short.lengthscale']) * 12:8.3f} months"
    )
    print(f"  noise           : std {sd('noise'):8.3f} ppm")


def run_fit(args: argparse.Namespace) -> int:
    """``gpchol fit``: fit, print the parameters, write the model file and the plot.

    Every output path is checked first, the data read and standardized, the memory and
    time estimated (printed for a large fit; refused, naming ``--no-memory-check``, when
    it exceeds the machine's memory); only then does the fit start.
    """
    t_start = time.perf_counter()
    if args.steps < 0:
        raise CLIError(f"--steps must be >= 0 (got {args.steps})")
    if args.resume and not args.checkpoint:
        raise CLIError("--resume needs --checkpoint PATH")
    if args.resume and resumed_steps(args.checkpoint) is None:  # e.g. a mistyped path
        print(
            f"gpchol: note: no checkpoint at {args.checkpoint} yet (no "
            f"{manifest_path(args.checkpoint)}); --resume starts a new fit there",
            file=sys.stderr,
        )
    if getattr(args, "group", None) is not None:  # one GP per group (gpchol.cli.group)
        from gpchol.cli.group import run_group_fit

        return run_group_fit(args, _float_dtype(args.float32))
    out, png = check_fit_outputs(args, plot=not args.no_plot)
    dtype = _float_dtype(args.float32)
    model, source, extrapolate = _fit_data(args)
    print(
        f"gpchol fit: {source}; kernel {model.spec.spec}; {np.dtype(dtype).name}; "
        f"{args.optimizer}, up to {args.steps} steps",
        flush=True,
    )
    n, d = model.X.shape
    per_step = "one per Adam step" if args.optimizer == "adam" else "one to a few per L-BFGS step"
    announce_cost(
        "the fit",
        n,
        d,
        np.dtype(dtype).itemsize,
        evals=f"{per_step}, up to {args.steps} steps",
        override=args.no_memory_check,
    )
    before = resumed_steps(args.checkpoint) if args.resume else None
    with CompileClock() as clock:
        result, params, lml = _fit_model(model, args, dtype)
    print(f"{result.message}")
    compiling = clock.seconds
    stepping = max(clock.wall - compiling, 0.0)
    # the steps this process ran (a resumed fit's result counts those before it too)
    ran = result.n_steps if before is None else max(result.n_steps - before, 0)
    per_step = f", {1e3 * stepping / ran:.1f} ms/step" if ran else ""
    resumed = "" if before is None else f", {ran} of them here after resuming at step {before}"
    print(
        f"log marginal likelihood: {lml:.4f}  ({result.n_steps} steps{resumed}; compile "
        f"{compiling:.1f} s, steps {stepping:.1f} s{per_step})"
    )
    _print_params(model, params)
    info: dict[str, Any] = {
        "optimizer": args.optimizer,
        "steps": args.steps,
        "dtype": np.dtype(dtype).name,
        "source": source,
        "seconds": round(time.perf_counter() - t_start, 2),
        "compile_seconds": round(compiling, 2),
        "step_seconds": round(stepping, 2),
        "steps_run": ran,  # the steps the seconds above timed (this process's)
    }
    if before is not None:
        info["resumed_at_step"] = before
    model.save(out, params, lml, result, info)  # gpchol.save: JSON + NPZ, atomic
    print(f"wrote {out}")
    if png is not None:  # after the model is saved: a failed plot loses nothing
        from gpchol.cli.plotting import plot_fit

        unit = " years" if model.spec.spec == "co2" else ""
        try:
            drawn = plot_fit(model, params, dtype, png, extrapolate, unit)
        except Exception as e:
            print(
                f"gpchol: warning: the plot {png} could not be drawn ({type(e).__name__}: "
                f"{one_line(e)}); the model {out} is written",
                file=sys.stderr,
            )
        else:
            if drawn:
                print(f"wrote {png}")
    print(f"total time {time.perf_counter() - t_start:.1f} s")
    return 0 if result.success else 1


# ------------------------------------------------------------------------------- predict


_PREDICT_CHUNK_BYTES = 128 * 2**20
"""The most memory one chunk of test points' cross-covariance may take."""


def run_predict(args: argparse.Namespace) -> int:
    """``gpchol predict``: posterior mean and std at the inputs of a CSV file.

    The model file is validated, the output path checked and the memory estimated before
    the GP is conditioned; the test points go through in chunks (bounded memory, and
    Ctrl-C acts between two of them). With a file of per-group models (``gpchol fit
    --group``) the CSV must have the group column: each row is predicted by its group's
    model, and the output starts with that column.
    """
    if args.out:
        check_output(
            args.out,
            "--out",
            protect={"the input CSV (--csv)": args.csv, "the model file (--model)": args.model},
        )
    column, models = read_models(args.model)
    x_names = next(iter(models.values()))[0].x_names
    Xs, _ = read_csv(args.csv, x_names, None, dropna=args.dropna, min_rows=1)
    if column is None:
        ((model, params),) = models.values()
        text = format_predictions(x_names, Xs, _predict(model, params, Xs, args, ""))
    else:
        from gpchol.cli.group import group_labels  # the --group machinery, on demand

        flag = "group column (of the model file)"
        labels = group_labels(args.csv, column, x_names, args.dropna, flag=flag)
        keep = np.array([bool(k) for k in labels], dtype=bool)  # "": empty cell, --dropna
        labels = [k for k in labels if k]
        Xs = Xs[keep]
        if not labels:
            raise CLIError(f"the {flag} {column!r} of {args.csv} is empty on every row")
        unknown = [k for k in dict.fromkeys(labels) if k not in models]
        if unknown:
            shown = ", ".join(repr(k) for k in unknown[:5]) + (" ..." if len(unknown) > 5 else "")
            known = ", ".join(repr(k) for k in list(models)[:10]) + (
                " ..." if len(models) > 10 else ""
            )
            raise CLIError(
                f"{len(unknown)} group(s) in the column {column!r} of {args.csv} have no model "
                f"in {args.model} ({shown}); its groups are: {known}"
            )
        rows = np.asarray(labels, dtype=object)
        columns = {k: np.empty(Xs.shape[0]) for k in ("mean", "std", "std_y")}
        for label in dict.fromkeys(labels):
            idx = np.flatnonzero(rows == label)
            model, params = models[label]
            part = _predict(model, params, Xs[idx], args, f"group {label!r}: ", idx)
            for k, v in part.items():
                columns[k][idx] = v
        text = format_predictions(x_names, Xs, columns, labels=(column, labels))
    if args.out:
        write_file(args.out, text.encode())
        print(f"wrote {Xs.shape[0]} predictions to {args.out}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


def _predict(
    model: Model,
    params: dict[str, np.ndarray],
    Xs: np.ndarray,
    args: argparse.Namespace,
    where: str,
    rows: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """``mean``, ``std`` and ``std_y`` of one model at the raw inputs ``Xs``.

    ``where`` prefixes the messages (the group); ``rows`` are the data rows (0-based) of
    ``Xs`` in the CSV file, for them (default: ``0, 1, ...``).
    """
    dtype = _float_dtype(False)
    gs = model.xs(Xs)
    bad = ~np.all(np.isfinite(gs), axis=1)
    if np.any(bad):
        first = int(np.flatnonzero(bad)[0])
        row = (first if rows is None else int(rows[first])) + 1
        raise CLIError(
            f"{where}data row {row} of {args.csv} is too far from the model's training data to "
            "be standardized (its standardized value overflows)"
        )
    n, d = model.X.shape
    chunk = max(1, min(Xs.shape[0], _PREDICT_CHUNK_BYTES // (8 * n)))
    announce_cost(
        f"{where}the prediction",
        n,
        d,
        8,
        evals="one, then the test points in chunks",
        override=args.no_memory_check,
        extra=3 * 8 * chunk * n,
    )
    p = {k: jnp.asarray(v, dtype) for k, v in params.items()}
    post = model.gp(p, dtype).condition(jnp.asarray(model.ys(model.y), dtype))
    if not bool(np.isfinite(np.asarray(post.log_marginal_likelihood))):
        raise CLIError(
            f"{where}the model in {args.model} cannot be conditioned on its data (covariance "
            "not positive definite); refit it"
        )
    means, variances = [], []
    for start in range(0, gs.shape[0], chunk):
        part = jnp.asarray(gs[start : start + chunk], dtype)
        means.append(np.asarray(post.mean(part)))
        variances.append(np.asarray(post.variance(part)))
    var = np.concatenate(variances)
    noise = np.asarray(model.spec.build(p)[1], np.float64)
    return {
        "mean": np.concatenate(means) * model.y_scale + model.y_shift,
        "std": np.sqrt(var) * model.y_scale,
        "std_y": np.sqrt(var + noise) * model.y_scale,
    }


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "check": run_check,
    "fit": run_fit,
    "predict": run_predict,
}
"""Subcommand name -> its function (parsed arguments -> exit status)."""
