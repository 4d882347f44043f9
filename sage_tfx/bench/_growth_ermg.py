"""ERMG on REAL data (``sage bench growth --ermg``): private ERM re-run as the database grows, under BBImprover and
BBScheduler, against re-running at every block with the horizon declared (the paper's Table 1 / Theorem 12).

Data: the REAL taxi trips of ``sage bench continual-release`` (big-tipper logistic regression, 6 features, rows
clipped to norm 1) in time order, ``--blocks`` blocks of ``--rows-per-block``. Every strategy's blocks are charged
on a real SQLite ledger before they are read. Error at block count t: the excess regularised empirical risk
J(w) - J(w_np) of the newest released model on all t blocks (J = sum of log losses / (t m0) + lam/2 ||w||^2, w_np its
exact minimiser). Variants (same total (epsilon, delta) per record):
- ``bbimprover``: ERMG under BBImprover (a run at every block, epsilon_t = c t^-(1/2 + a), zCDP);
- ``bbscheduler``: ERMG under BBScheduler (zCDP mode, a run each time the data grew by 1 + gamma);
- ``rerun``: a run at every block at rho / T each (the horizon T declared in advance; Gaussian).
"""

from __future__ import annotations

import argparse
import math
import tempfile
import time

import numpy as np

from sage_tfx.bench._trials import block_reader, trial_ledger

VARIANTS = ("bbimprover", "bbscheduler", "rerun")
LAM = 0.05


def run(args: argparse.Namespace) -> dict:
    """ERMG's figures: the median excess risk by t of each variant over ``args.trials`` seeds, and its slope.

    Args:
        args: the parsed options of ``sage bench growth --ermg``.

    Returns:
        The figures (JSON-ready).
    """
    from sage_tfx.bench.continual_release import taxi_blocks
    from sage_tfx.release.continual import clip_features, solve_erm

    began = time.time()
    T, m0 = args.blocks, args.rows_per_block
    data = [clip_features(x, y, "logistic") for x, y in taxi_blocks(T, m0)]
    fits = []
    for t in range(1, T + 1):
        x, y = np.concatenate([b[0] for b in data[:t]]), np.concatenate([b[1] for b in data[:t]])
        fits.append((x, y, solve_erm(x, y, normaliser=t * m0, lam=LAM, radius=10.0, loss="logistic")))
    err = {v: np.full((args.trials, T), np.nan) for v in VARIANTS}
    audits = []
    with tempfile.TemporaryDirectory() as tmp:
        for trial in range(args.trials):
            audits.append(_trial(args, trial, tmp, data, fits, err))
    med = {v: np.nanmedian(err[v], axis=0) for v in VARIANTS}
    t = np.arange(1, T + 1)
    late = t > T // 4
    return {
        "data": f"REAL taxi trips: {T} blocks x {m0} rows, big-tipper logistic regression (lam {LAM})",
        "epsilon": args.epsilon,
        "delta": args.delta,
        "a": args.a,
        "gamma": args.gamma,
        "trials": args.trials,
        "excess_median_by_t": {v: [round(float(e), 6) for e in med[v]] for v in VARIANTS},
        "mean_excess": {v: float(np.nanmean(med[v])) for v in VARIANTS},
        "rerun_over_bbimprover_mean": float(np.nanmean(med["rerun"]) / np.nanmean(med["bbimprover"])),
        "bbimprover_log_slope_after_first_quarter": float(
            np.polyfit(np.log(t[late]), np.log(med["bbimprover"][late]), 1)[0]
        ),
        "audit_ok": all(audits),
        "seconds": round(time.time() - began, 1),
    }


def _excess(w, x, y, w_np, n):
    def j(u):
        return float(np.logaddexp(0.0, -y * (x @ u)).sum() / n + 0.5 * LAM * (u @ u))

    return j(w) - j(w_np)


def _trial(args: argparse.Namespace, trial: int, tmp: str, data: list, fits: list, err: dict) -> bool:
    from sage_tfx.privacy import gaussian
    from sage_tfx.privacy.randomness import secure_rng
    from sage_tfx.privacy.samplers import grid_gaussian
    from sage_tfx.release.continual import ReleaseParams, sensitivity
    from sage_tfx.release.growth import BBImprover, BBScheduler, ImproverParams, SchedulerParams, ermg

    T, m0 = args.blocks, args.rows_per_block
    ledger = trial_ledger(tmp, f"ermg{trial}", ("impr", "sched"), T, m0, args.epsilon, args.delta)
    reader = block_reader(ledger, data)
    runs = {
        "bbimprover": ermg(
            ledger,
            "impr",
            f"i{trial}",
            BBImprover(ImproverParams(args.epsilon, args.delta, args.a)),
            reader,
            rows_per_block=m0,
            lam=LAM,
        ),
        "bbscheduler": ermg(
            ledger,
            "sched",
            f"s{trial}",
            BBScheduler(SchedulerParams(args.epsilon, args.delta, args.gamma)),
            reader,
            rows_per_block=m0,
            lam=LAM,
        ),
    }
    spec = ReleaseParams(epsilon=1.0, delta=0.5, records_per_block=m0, lam=LAM)
    z_rerun = math.sqrt(T) * gaussian.rdp_multiplier(args.epsilon, args.delta)  # T Gaussians of rho / T each
    rng = secure_rng(30_000 + trial)
    for t in range(1, T + 1):
        x, y, w_np = fits[t - 1]
        for name, rel in runs.items():
            rel.observe(f"b{t - 1:03d}")
            if rel.current is not None:
                err[name][trial, t - 1] = _excess(rel.current, x, y, w_np, t * m0)
        d2 = sensitivity(spec, t)
        err["rerun"][trial, t - 1] = _excess(
            grid_gaussian(w_np, d2, z_rerun * d2, rng=rng, cells=w_np.size), x, y, w_np, t * m0
        )
    ok = bool(ledger.audit().ok)
    ledger.close()
    return ok
