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
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import gpchol
from gpchol import FitResult
from gpchol._base.io import save_json_atomic, write_bytes_atomic
from gpchol._cuda.ffi import cuda_unavailable_reason
from gpchol.cli.csvio import format_predictions, read_csv
from gpchol.cli.errors import CLIError
from gpchol.cli.model import Model
from gpchol.cli.spec import ModelSpec, SpecError

__all__ = ["COMMANDS", "median_time", "run_check", "run_fit", "run_predict"]


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


def run_check(args: argparse.Namespace) -> int:
    """``gpchol check``: every backend's factor and gradient against JAX's, with timings."""
    if args.n < 1:
        raise CLIError(f"--n must be >= 1 (got {args.n}).")
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
    if not args.x or not args.y:
        raise CLIError("--csv needs --x COLS (comma-separated) and --y COL")
    x_cols = [c.strip() for c in args.x.split(",") if c.strip()]
    if not x_cols:
        raise CLIError("--x needs at least one column name")
    try:
        spec = ModelSpec.parse(args.kernel or "rbf+white", len(x_cols))
    except SpecError as e:
        raise CLIError(str(e)) from None
    X, y = read_csv(args.csv, x_cols, args.y, dropna=args.dropna, min_rows=3)
    assert y is not None  # read with a target column
    model = Model.standardized(spec, X, y, x_cols, args.y)
    source = f"{args.csv}: {X.shape[0]} rows, x={','.join(x_cols)}, y={args.y}"
    extrapolate = 0.1 * float(X[:, 0].max() - X[:, 0].min()) if X.shape[1] == 1 else 0.0
    return model, source, extrapolate


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
            optimizer=args.optimizer,
            steps=args.steps,
            learning_rate=args.learning_rate,
            tol=args.tol,
            checkpoint=args.checkpoint,
            checkpoint_every=args.checkpoint_every,
            resume=args.resume,
            progress=not args.quiet,
        )
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
    """``gpchol fit``: fit, print the parameters, write the model file and the plot."""
    t_start = time.perf_counter()
    if args.steps < 0:
        raise CLIError(f"--steps must be >= 0 (got {args.steps})")
    if args.resume and not args.checkpoint:
        raise CLIError("--resume needs --checkpoint PATH")
    dtype = _float_dtype(args.float32)
    model, source, extrapolate = _fit_data(args)
    print(
        f"gpchol fit: {source}; kernel {model.spec.spec}; {np.dtype(dtype).name}; "
        f"{args.optimizer}, up to {args.steps} steps",
        flush=True,
    )
    result, params, lml = _fit_model(model, args, dtype)
    print(f"{result.message}")
    print(f"log marginal likelihood: {lml:.4f}  ({result.n_steps} steps)")
    _print_params(model, params)
    out = args.out
    png = os.path.splitext(out)[0] + ".png"
    if not args.no_plot:
        from gpchol.cli.plotting import plot_fit

        post = model.gp(params, dtype).condition(model.ys(model.y).astype(dtype))
        unit = " years" if model.spec.spec == "co2" else ""
        plot_fit(model, post, dtype, png, extrapolate, unit)
    info = {
        "optimizer": args.optimizer,
        "steps": args.steps,
        "dtype": np.dtype(dtype).name,
        "source": source,
        "seconds": round(time.perf_counter() - t_start, 2),
    }
    save_json_atomic(out, model.to_json(params, lml, result, info))
    print(f"wrote {out}" + ("" if args.no_plot else f" and {png}"))
    print(f"total time {info['seconds']:.1f} s")
    return 0 if result.success else 1


# ------------------------------------------------------------------------------- predict


def run_predict(args: argparse.Namespace) -> int:
    """``gpchol predict``: posterior mean and std at the inputs of a CSV file."""
    dtype = _float_dtype(False)
    model, params = Model.from_json(args.model)
    Xs, _ = read_csv(args.csv, model.x_names, None, dropna=args.dropna, min_rows=1)
    p = {k: jnp.asarray(v, dtype) for k, v in params.items()}
    post = model.gp(p, dtype).condition(jnp.asarray(model.ys(model.y), dtype))
    if not bool(np.isfinite(np.asarray(post.log_marginal_likelihood))):
        raise CLIError(
            f"the model in {args.model} cannot be conditioned on its data (covariance not "
            "positive definite); refit it"
        )
    gs = jnp.asarray(model.xs(Xs), dtype)
    mean = np.asarray(post.mean(gs)) * model.y_scale + model.y_shift
    var = np.asarray(post.variance(gs))
    noise = np.asarray(model.spec.build(p)[1], np.float64)
    text = format_predictions(
        model.x_names,
        Xs,
        {
            "mean": mean,
            "std": np.sqrt(var) * model.y_scale,
            "std_y": np.sqrt(var + noise) * model.y_scale,
        },
    )
    if args.out:
        write_bytes_atomic(args.out, text.encode())
        print(f"wrote {Xs.shape[0]} predictions to {args.out}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "check": run_check,
    "fit": run_fit,
    "predict": run_predict,
}
"""Subcommand name -> its function (parsed arguments -> exit status)."""
