"""The ``gpchol`` command line.

Subcommands:

* ``gpchol check`` -- factor and differentiate a random SPD matrix with every available
  backend, compare with JAX's own Cholesky, print errors and timings.
* ``gpchol fit`` -- fit GP hyperparameters: with no arguments the Rasmussen & Williams
  kernel on the embedded monthly Mauna Loa CO2 data; with ``--csv FILE --x COLS --y COL
  --kernel SPEC`` the user's own data. Writes ``gpchol-fit.json`` (parameters, log
  marginal likelihood, training data and its hash, versions, kernel spec; no pickle) and
  ``gpchol-fit.png``.
* ``gpchol predict --model gpchol-fit.json --csv FILE`` -- CSV of posterior mean and std.

Example (shell)::

    gpchol fit --steps 50
    gpchol fit --csv data.csv --x t --y value --kernel "matern52*periodic+white"
    gpchol predict --model gpchol-fit.json --csv new.csv --out pred.csv

Errors in the user's input are reported as one line on stderr with a non-zero exit
status, never as a traceback.
"""

from __future__ import annotations

import argparse
import sys
import time

__all__ = ["main"]


class CLIError(Exception):
    """A user-facing error: printed as one line on stderr, exit status 2."""


def _timeit(fn, *args, repeat=3):
    import jax

    jax.block_until_ready(fn(*args))  # compile + warm up
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def _cmd_check(args) -> int:
    import jax
    import jax.numpy as jnp
    import numpy as np

    import gpchol
    from gpchol._cuda import ffi as _ffi

    if args.n < 1:
        raise CLIError(f"--n must be >= 1 (got {args.n}).")
    if args.float32:
        dtype = np.float32
    else:
        jax.config.update("jax_enable_x64", True)
        dtype = np.float64
    rng = np.random.default_rng(args.seed)
    n = args.n
    m = rng.standard_normal((n, n))
    a = jnp.asarray((m @ m.T / n + np.eye(n)).astype(dtype))
    w = jnp.asarray(rng.standard_normal((n, n)).astype(dtype))

    def loss(chol):
        return lambda x: jnp.sum(chol(x) * w)

    ref_L = jax.jit(jnp.linalg.cholesky)(a)
    ref_grad_fn = jax.jit(jax.grad(loss(jnp.linalg.cholesky)))
    ref_grad = ref_grad_fn(a)
    t_ref_fwd = _timeit(jax.jit(jnp.linalg.cholesky), a)
    t_ref_grad = _timeit(ref_grad_fn, a)

    backends = ["xla", "tiled"]
    reason = _ffi.cuda_unavailable_reason() if jax.default_backend() == "gpu" else "no GPU"
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
        fwd = jax.jit(lambda x, be=be: gpchol.cholesky(x, backend=be, tile_size=args.tile_size))
        grad = jax.jit(
            jax.grad(
                loss(lambda x, be=be: gpchol.cholesky(x, backend=be, tile_size=args.tile_size))
            )
        )
        L = fwd(a)
        g = grad(a)
        L64 = np.asarray(L, np.float64)
        a64 = np.asarray(a, np.float64)
        resid = np.linalg.norm(a64 - L64 @ L64.T, 1) / (n * np.linalg.norm(a64, 1) * eps)
        err_L = float(jnp.max(jnp.abs(L - ref_L)) / jnp.max(jnp.abs(ref_L)))
        err_g = float(jnp.max(jnp.abs(g - ref_grad)) / jnp.max(jnp.abs(ref_grad)))
        t_fwd = _timeit(fwd, a)
        t_grad = _timeit(grad, a)
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


# ----------------------------------------------------------------------------- data input

_MISSING = {"", "na", "nan", "n/a", "null", "none"}


def _read_csv(path: str, x_cols: list[str], y_col: str | None, *, dropna: bool, min_rows: int):
    """Reads numeric columns from a CSV with a header; returns ``(X (n, d), y (n,) | None)``.

    Every problem is a :class:`CLIError` with one line that names the file, the column and
    the rows.
    """
    import csv
    import os

    import numpy as np

    if not os.path.exists(path):
        raise CLIError(f"no such file: {path}")
    if os.path.isdir(path):
        raise CLIError(f"{path} is a directory, not a CSV file")
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            rows = list(csv.reader(f))
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise CLIError(f"cannot read {path} as CSV: {e}") from None
    rows = [r for r in rows if any(c.strip() for c in r)]
    if not rows:
        raise CLIError(f"{path} is empty (a header row with column names is needed)")
    header = [h.strip() for h in rows[0]]
    wanted = list(x_cols) + ([y_col] if y_col is not None else [])
    missing = [c for c in wanted if c not in header]
    if missing:
        raise CLIError(
            f"column {missing[0]!r} not found in {path}; its columns are: " + ", ".join(header)
        )
    idx = [header.index(c) for c in wanted]
    data = np.full((len(rows) - 1, len(wanted)), np.nan)
    for i, row in enumerate(rows[1:]):
        for j, k in enumerate(idx):
            cell = row[k].strip() if k < len(row) else ""
            if cell.lower() in _MISSING:
                continue
            try:
                data[i, j] = float(cell)
            except ValueError:
                raise CLIError(
                    f"non-numeric value {cell!r} in column {wanted[j]!r} at data row {i + 1} "
                    f"(line {i + 2}) of {path}"
                ) from None
    bad = ~np.all(np.isfinite(data), axis=1)
    if np.any(bad):
        rows_bad = (np.flatnonzero(bad) + 1).tolist()
        shown = ", ".join(map(str, rows_bad[:10])) + (
            f" and {len(rows_bad) - 10} more" if len(rows_bad) > 10 else ""
        )
        if not dropna:
            raise CLIError(
                f"{len(rows_bad)} data row(s) of {path} have missing, NaN or inf values in "
                f"{', '.join(wanted)}: row(s) {shown}; pass --dropna to drop them"
            )
        print(f"gpchol: dropping {len(rows_bad)} row(s) with NaN/inf: {shown}", file=sys.stderr)
        data = data[~bad]
    if data.shape[0] < min_rows:
        raise CLIError(
            f"too few points: {data.shape[0]} usable row(s) in {path}; at least {min_rows} "
            "are needed"
        )
    X = data[:, : len(x_cols)]
    y = data[:, len(x_cols)] if y_col is not None else None
    return X, y


def _data_hash(X, y) -> str:
    import hashlib

    import numpy as np

    h = hashlib.sha256()
    h.update(np.ascontiguousarray(X, np.float64).tobytes())
    h.update(np.ascontiguousarray(y, np.float64).tobytes())
    return h.hexdigest()


def _versions() -> dict:
    import platform

    import jax
    import numpy as np
    import optax

    import gpchol

    return {
        "gpchol": gpchol.__version__,
        "jax": jax.__version__,
        "optax": optax.__version__,
        "numpy": np.__version__,
        "python": platform.python_version(),
    }


# ------------------------------------------------------------------------------- the model


class _Model:
    """A fitted or to-be-fitted model: spec, parameters, training data, standardization."""

    def __init__(self, spec, X, y, *, x_names, y_name, x_shift, x_scale, y_shift, y_scale):
        self.spec = spec
        self.X, self.y = X, y  # raw training data (NumPy float64)
        self.x_names, self.y_name = list(x_names), y_name
        self.x_shift, self.x_scale = x_shift, x_scale
        self.y_shift, self.y_scale = float(y_shift), float(y_scale)

    def xs(self, X):
        import numpy as np

        return (np.asarray(X, np.float64) - self.x_shift) / self.x_scale

    def ys(self, y):
        return (y - self.y_shift) / self.y_scale

    def gp(self, params, dtype):
        import jax.numpy as jnp

        from gpchol import GaussianProcess

        kernel, noise = self.spec.build(params)
        return GaussianProcess(kernel, jnp.asarray(self.xs(self.X), dtype), noise=noise)

    def to_json(self, params, lml, result, args_info) -> dict:
        import numpy as np

        def plain(v):
            a = np.asarray(v, np.float64)
            return a.tolist()

        return {
            "format": "gpchol-fit",
            "format_version": 1,
            "kernel": {
                "spec": self.spec.spec,
                "input_dim": self.spec.d,
                "learn_noise": self.spec.learn_noise,
                "fixed_noise": self.spec.fixed_noise,
            },
            "params": {k: plain(v) for k, v in params.items()},
            "log_marginal_likelihood": lml,
            "fit": args_info
            | {
                "n_steps": result.n_steps,
                "converged": result.converged,
                "success": result.success,
                "message": result.message,
            },
            "standardization": {
                "x_shift": np.asarray(self.x_shift, np.float64).tolist(),
                "x_scale": np.asarray(self.x_scale, np.float64).tolist(),
                "y_shift": self.y_shift,
                "y_scale": self.y_scale,
            },
            "data": {
                "x_columns": self.x_names,
                "y_column": self.y_name,
                "n": int(self.X.shape[0]),
                "sha256": _data_hash(self.X, self.y),
                "X": np.asarray(self.X, np.float64).tolist(),
                "y": np.asarray(self.y, np.float64).tolist(),
            },
            "versions": _versions(),
        }

    @classmethod
    def from_json(cls, path: str):
        import json
        import os

        import numpy as np

        from gpchol.cli.spec import ModelSpec

        if not os.path.exists(path):
            raise CLIError(f"no such model file: {path} (write one with `gpchol fit`)")
        try:
            with open(path, encoding="utf-8") as f:
                m = json.load(f)
            if m.get("format") != "gpchol-fit":
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
        if _data_hash(X, y) != data.get("sha256"):
            raise CLIError(f"{path}: the training data does not match its recorded sha256")
        return model, params


def _fit_model(model, args, dtype):
    """Runs :func:`gpchol._fit.driver.fit` on the model; returns ``(result, lml in raw units)``."""
    import math

    import jax.numpy as jnp
    import numpy as np

    from gpchol import fit

    ys = jnp.asarray(model.ys(model.y), dtype)
    init = model.spec.init_params()
    init = {k: jnp.asarray(v, dtype) for k, v in init.items()}
    try:
        result = fit(
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
    lml = result.log_marginal_likelihood - model.X.shape[0] * math.log(model.y_scale)
    if not result.success:
        print(f"gpchol: warning: {result.message}", file=sys.stderr)
    params = {k: np.asarray(v) for k, v in result.params.items()}
    return result, params, float(lml)


def _print_params(model, params) -> None:
    import numpy as np

    def f(v):
        a = np.asarray(v, np.float64)
        return f"{float(a):.4g}" if a.ndim == 0 else "[" + ", ".join(f"{x:.4g}" for x in a) + "]"

    if model.spec.spec == "co2":
        sd = lambda k: float(np.sqrt(params[k]))  # noqa: E731
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
        return
    print("fitted hyperparameters (inputs and target standardized: lengthscales, periods in")
    print("units of each input's std; amplitudes and noise in units of the target's variance):")
    for k, v in params.items():
        print(f"  {k:32s} {f(v)}")


def _plot(model, post, dtype, path, extrapolate: float, unit: str = "") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import jax.numpy as jnp
    import matplotlib.pyplot as plt
    import numpy as np

    X = model.X
    if X.shape[1] != 1:
        print("gpchol: no plot for inputs with more than one column", file=sys.stderr)
        return
    lo, hi = float(X.min()), float(X.max())
    grid = np.linspace(lo, hi + extrapolate, 800)[:, None]
    gs = jnp.asarray(model.xs(grid), dtype)
    mean = np.asarray(post.mean(gs)) * model.y_scale + model.y_shift
    std = np.sqrt(np.asarray(post.variance(gs, include_noise=True))) * model.y_scale
    fig, ax = plt.subplots(figsize=(10, 5))
    ax.plot(X[:, 0], model.y, ".", ms=2.5, color="k", label="data")
    ax.plot(grid[:, 0], mean, color="C0", lw=1.2, label="posterior mean")
    ax.fill_between(grid[:, 0], mean - 2 * std, mean + 2 * std, color="C0", alpha=0.3, label="±2σ")
    ax.axvline(hi, color="gray", lw=0.8, ls="--")
    ax.set_xlabel(model.x_names[0])
    ax.set_ylabel(model.y_name)
    ax.legend(loc="upper left")
    ax.set_title(
        f"gpchol GP fit ({model.spec.spec}), extrapolated {extrapolate:.3g}{unit} beyond the data"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _cmd_fit(args) -> int:
    import os
    import time

    import jax
    import numpy as np

    from gpchol.cli.spec import ModelSpec, SpecError

    t_start = time.perf_counter()
    if args.steps < 0:
        raise CLIError(f"--steps must be >= 0 (got {args.steps})")
    if args.resume and not args.checkpoint:
        raise CLIError("--resume needs --checkpoint PATH")
    if args.float32:
        dtype = np.float32
    else:
        jax.config.update("jax_enable_x64", True)
        dtype = np.float64
    if args.csv is None:
        if args.x or args.y or args.kernel:
            raise CLIError("--x, --y and --kernel need --csv FILE")
        from gpchol import datasets

        data = datasets.load("co2", monthly=True)
        X, y = np.asarray(data.X, np.float64), np.asarray(data.y, np.float64)
        spec = ModelSpec.parse("co2", 1)
        # R&W: years and ppm as they are, the data mean subtracted
        model = _Model(
            spec,
            X,
            y,
            x_names=["t"],
            y_name="co2",
            x_shift=np.zeros(1),
            x_scale=np.ones(1),
            y_shift=float(y.mean()),
            y_scale=1.0,
        )
        source = "embedded Mauna Loa CO2, monthly means (n=521)"
        extrapolate = 10.0
    else:
        if not args.x or not args.y:
            raise CLIError("--csv needs --x COLS (comma-separated) and --y COL")
        x_cols = [c.strip() for c in args.x.split(",") if c.strip()]
        if not x_cols:
            raise CLIError("--x needs at least one column name")
        try:
            spec = ModelSpec.parse(args.kernel or "rbf+white", len(x_cols))
        except SpecError as e:
            raise CLIError(str(e)) from None
        X, y = _read_csv(args.csv, x_cols, args.y, dropna=args.dropna, min_rows=3)
        x_scale = X.std(axis=0)
        x_scale[x_scale == 0] = 1.0
        y_scale = float(y.std()) or 1.0
        model = _Model(
            spec,
            X,
            y,
            x_names=x_cols,
            y_name=args.y,
            x_shift=X.mean(axis=0),
            x_scale=x_scale,
            y_shift=float(y.mean()),
            y_scale=y_scale,
        )
        source = f"{args.csv}: {X.shape[0]} rows, x={','.join(x_cols)}, y={args.y}"
        extrapolate = 0.1 * float(X[:, 0].max() - X[:, 0].min()) if X.shape[1] == 1 else 0.0
    print(
        f"gpchol fit: {source}; kernel {spec.spec}; {np.dtype(dtype).name}; "
        f"{args.optimizer}, up to {args.steps} steps",
        flush=True,
    )
    result, params, lml = _fit_model(model, args, dtype)
    print(f"{result.message}")
    print(f"log marginal likelihood: {lml:.4f}  ({result.n_steps} steps)")
    _print_params(model, params)
    out = args.out
    info = {
        "optimizer": args.optimizer,
        "steps": args.steps,
        "dtype": np.dtype(dtype).name,
        "source": source,
        "seconds": None,
    }
    png = os.path.splitext(out)[0] + ".png"
    if not args.no_plot:
        post = model.gp(params, dtype).condition(model.ys(model.y).astype(dtype))
        _plot(model, post, dtype, png, extrapolate, " years" if spec.spec == "co2" else "")
    info["seconds"] = round(time.perf_counter() - t_start, 2)
    from gpchol._base.io import save_json_atomic

    save_json_atomic(out, model.to_json(params, lml, result, info))
    print(f"wrote {out}" + ("" if args.no_plot else f" and {png}"))
    print(f"total time {info['seconds']:.1f} s")
    return 0 if result.success else 1


def _cmd_predict(args) -> int:
    import csv
    import io

    import jax
    import jax.numpy as jnp
    import numpy as np

    jax.config.update("jax_enable_x64", True)
    model, params = _Model.from_json(args.model)
    Xs, _ = _read_csv(args.csv, model.x_names, None, dropna=args.dropna, min_rows=1)
    dtype = np.float64
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
    std = np.sqrt(var) * model.y_scale
    std_y = np.sqrt(var + noise) * model.y_scale
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow([*model.x_names, "mean", "std", "std_y"])
    for i in range(Xs.shape[0]):
        w.writerow(
            [
                *(repr(float(v)) for v in Xs[i]),
                repr(float(mean[i])),
                repr(float(std[i])),
                repr(float(std_y[i])),
            ]
        )
    if args.out:
        from gpchol._base.io import write_bytes_atomic

        write_bytes_atomic(args.out, buf.getvalue().encode())
        print(f"wrote {Xs.shape[0]} predictions to {args.out}", file=sys.stderr)
    else:
        sys.stdout.write(buf.getvalue())
    return 0


def build_parser() -> argparse.ArgumentParser:
    from gpchol.cli.spec import KERNEL_NAMES

    parser = argparse.ArgumentParser(
        prog="gpchol",
        description="gpchol: differentiable tiled Cholesky and exact Gaussian processes.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    p = sub.add_parser(
        "check",
        help="factor and differentiate a random SPD matrix with every backend",
        description="Factor and differentiate a random SPD matrix with every available "
        "backend; compare with jnp.linalg.cholesky; print errors and timings.",
    )
    p.add_argument("--n", type=int, default=1000, help="matrix size (default 1000)")
    p.add_argument("--tile-size", type=int, default=None, help="tile size (default: auto)")
    p.add_argument("--float32", action="store_true", help="use float32 (default float64)")
    p.add_argument("--seed", type=int, default=0, help="random seed")
    p.set_defaults(func=_cmd_check)

    p = sub.add_parser(
        "fit",
        help="fit GP hyperparameters (default: the R&W kernel on the embedded CO2 data)",
        description="Fit the hyperparameters of an exact GP by maximising the log marginal "
        "likelihood. Without --csv: the Rasmussen & Williams kernel on the embedded monthly "
        "Mauna Loa CO2 data (n=521). Writes the model (JSON, no pickle) and a plot.",
        epilog="Kernel SPEC: a sum of products of names, e.g. 'rbf+white', "
        "'matern52*periodic+white'; 'white' is the learned observation noise. Names: "
        + ", ".join(KERNEL_NAMES),
    )
    p.add_argument("--csv", metavar="FILE", help="CSV file with a header row")
    p.add_argument("--x", metavar="COLS", help="comma-separated input column names")
    p.add_argument("--y", metavar="COL", help="target column name")
    p.add_argument("--kernel", metavar="SPEC", help="kernel SPEC (default 'rbf+white')")
    p.add_argument("--steps", type=int, default=200, help="max optimiser steps (default 200)")
    p.add_argument("--optimizer", choices=("lbfgs", "adam"), default="lbfgs")
    p.add_argument("--learning-rate", type=float, default=None, help="Adam step (0.05)")
    p.add_argument("--tol", type=float, default=1e-9, help="relative loss-change tolerance")
    p.add_argument("--float32", action="store_true", help="float32 (default float64)")
    p.add_argument("--checkpoint", metavar="PATH", help="checkpoint base path")
    p.add_argument("--checkpoint-every", type=int, default=10, metavar="K")
    p.add_argument("--resume", action="store_true", help="resume from --checkpoint")
    p.add_argument("--dropna", action="store_true", help="drop rows with NaN/inf/missing")
    p.add_argument("--out", default="gpchol-fit.json", help="model file (gpchol-fit.json)")
    p.add_argument("--no-plot", action="store_true", help="do not write the PNG plot")
    p.add_argument("--quiet", action="store_true", help="no progress line")
    p.set_defaults(func=_cmd_fit)

    p = sub.add_parser(
        "predict",
        help="predict with a fitted model: CSV of mean and std",
        description="Posterior mean and standard deviation (of the latent function: std; "
        "of a new observation: std_y) at the inputs of a CSV file.",
    )
    p.add_argument("--model", default="gpchol-fit.json", help="model file from `gpchol fit`")
    p.add_argument("--csv", metavar="FILE", required=True, help="CSV with the input columns")
    p.add_argument("--out", metavar="FILE", help="output CSV (default: stdout)")
    p.add_argument("--dropna", action="store_true", help="drop rows with NaN/inf/missing")
    p.set_defaults(func=_cmd_predict)
    return parser


def main(argv=None) -> int:
    import os

    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return args.func(args)
    except CLIError as e:
        print(f"gpchol: error: {e}", file=sys.stderr)
        return 2
    except (ValueError, TypeError) as e:
        print(f"gpchol: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("gpchol: interrupted", file=sys.stderr)
        return 130
    except Exception as e:
        if os.environ.get("GPCHOL_DEBUG"):
            raise
        print(
            f"gpchol: internal error: {type(e).__name__}: {e} (set GPCHOL_DEBUG=1 for the "
            "traceback)",
            file=sys.stderr,
        )
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
