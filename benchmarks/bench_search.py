"""The optimisers' work: steps and loss evaluations to the same optimum, gpchol vs scikit-learn.

Time per fit is steps x (evaluation + bookkeeping); this benchmark counts the first two on
``benchmarks/bench_refit.py``'s problems, in one process, so that a change to the line
search or the stopping rule shows in evaluations, not only in noisy seconds:

* ``a``: one fit of the diabetes model (n = 400, amplitude x ARD ExpSquared + White,
  ``normalize_y=True``), each library's estimator with its default optimiser;
* ``b``: the five folds of ``cross_val_score`` on diabetes (n = 442), summed;
* ``d``: the 40 warm-started refits on n = 40 ... 79 (Branin), summed; gpchol also with
  ``warm_start=`` the previous fit's result (its L-BFGS curvature pairs).

scikit-learn's count is L-BFGS-B's own (``nit``, ``nfev`` of ``scipy.optimize.minimize``,
called as the estimator's default optimiser calls it). gpchol's is its L-BFGS's steps
(``FitResult.n_steps``) and evaluations of the compiled loss and gradient, counted around
the host-driven line search (:meth:`gpchol._fit.lbfgs.LBFGS.host_step`). The log marginal
likelihoods are printed beside them: fewer evaluations count only at the same optimum.
``--tol`` and ``--patience`` set gpchol's stopping rule in (d) (its defaults otherwise),
to set it beside L-BFGS-B's (one step of relative change below ``factr * eps``, about
2.2e-9, or a projected gradient below 1e-5).

Usage::

    python -m benchmarks.bench_search [--quick] [--sections a,b,d] [--json PATH]
                                      [--tol T] [--patience K]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from benchmarks import bench_refit as refit

SECTIONS = ("a", "b", "d")


class Counts:
    """Steps and evaluations of one library over a section's fits."""

    def __init__(self) -> None:
        self.steps = 0
        self.evaluations = 0
        self.fits = 0
        self.lml: list[float] = []

    def record(self) -> dict:
        return {
            "fits": self.fits,
            "steps": self.steps,
            "evaluations": self.evaluations,
            "lml": self.lml,
        }


def _count_gpchol(now: dict[str, Counts]) -> None:
    """Counts gpchol's evaluations into ``now["counts"]`` from here on (the whole process)."""
    from gpchol._internal import lbfgs_module

    host_step = lbfgs_module.LBFGS.host_step

    def counted_host_step(self, value_and_grad, *args, **kwargs):
        def evaluate(x, data):
            now["counts"].evaluations += 1
            return value_and_grad(x, data)

        return host_step(self, evaluate, *args, **kwargs)

    lbfgs_module.LBFGS.host_step = counted_host_step


def _sklearn_optimizer(counts: Counts):
    """The estimator's default optimiser (L-BFGS-B on the log hyperparameters), counted."""
    import scipy.optimize

    def optimizer(obj_func, initial_theta, bounds):
        res = scipy.optimize.minimize(
            obj_func, initial_theta, method="L-BFGS-B", jac=True, bounds=bounds
        )
        counts.steps += int(res.nit)
        counts.evaluations += int(res.nfev)
        counts.fits += 1
        return res.x, res.fun

    return optimizer


def _estimator(lib: str, d: int, counts: Counts):
    est = refit._diabetes_estimator(lib, d)
    if lib == refit.SK:
        est.set_params(optimizer=_sklearn_optimizer(counts))
    return est


def section_ab(section: str, lib: str, counts: Counts, sz: dict) -> None:
    from sklearn.model_selection import KFold

    n = sz["a_n"] if section == "a" else sz["bc_n"]
    X, y = (a[:n] for a in refit.diabetes())
    splits = [(slice(None), None)] if section == "a" else KFold(5).split(X)
    for train, _ in splits:
        est = _estimator(lib, X.shape[1], counts).fit(X[train], y[train])
        if lib != refit.SK:
            counts.steps += est.fit_result_.n_steps
            counts.fits += 1
        counts.lml.append(float(est.log_marginal_likelihood_value_))


def section_d(lib: str, counts: Counts, sz: dict, tol: float, patience: int) -> None:
    spec = {"n0": sz["d_n0"], "fits": sz["d_fits"]}
    if lib == refit.SK:
        for gp in refit.bo_fits_sklearn(spec, optimizer=_sklearn_optimizer(counts)):
            counts.lml.append(float(gp.log_marginal_likelihood_value_))
        return
    warm = lib.endswith("warm_start")
    for res in refit.bo_fits_gpchol(spec, warm_start=warm, tol=tol, patience=patience):
        counts.steps += res.n_steps
        counts.fits += 1
        counts.lml.append(float(res.log_marginal_likelihood))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sections", default=",".join(SECTIONS), help="of a,b,d")
    ap.add_argument("--json", help="write the record here")
    ap.add_argument("--quick", action="store_true", help="bench_refit's quick sizes")
    ap.add_argument("--tol", type=float, default=refit.TOL, help="gpchol.fit's tol in (d)")
    ap.add_argument(
        "--patience", type=int, default=refit.PATIENCE, help="gpchol.fit's patience in (d)"
    )
    args = ap.parse_args(argv)
    sections = [s for s in args.sections.split(",") if s]
    if bad := [s for s in sections if s not in SECTIONS]:
        ap.error(f"unknown sections {bad}; choose from {','.join(SECTIONS)}")

    import warnings

    import jax
    from sklearn.exceptions import ConvergenceWarning

    # lengthscales at the bounds (inputs switched off) are part of these optima
    warnings.filterwarnings("ignore", category=ConvergenceWarning)
    jax.config.update("jax_enable_x64", True)
    from benchmarks._common import machine_info, versions

    sz = refit.sizes(args.quick)
    now = {"counts": Counts()}
    _count_gpchol(now)
    record: dict = {"quick": args.quick, "sizes": sz, "sections": {}}
    record["gpchol_d"] = {"tol": args.tol, "patience": args.patience}
    print("bench_search: steps and evaluations to the optimum (one process)")
    print(f"  {'section':8} {'library':18} {'fits':>5} {'steps':>6} {'evals':>6}  LML (sum)")
    for s in sections:
        rows = {}
        for lib in (refit.SK, "gpchol", *(["gpchol warm_start"] if s == "d" else [])):
            counts = now["counts"] = Counts()
            if s == "d":
                section_d(lib, counts, sz, args.tol, args.patience)
            else:
                section_ab(s, lib, counts, sz)
            rows[lib] = counts.record()
            print(
                f"  {s:8} {lib:18} {counts.fits:5d} {counts.steps:6d} {counts.evaluations:6d}"
                f"  {sum(counts.lml):.6f}",
                flush=True,
            )
        record["sections"][s] = rows
    record.update(machine=machine_info(), versions=versions())
    if args.json:
        Path(args.json).write_text(json.dumps(record, indent=1) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
