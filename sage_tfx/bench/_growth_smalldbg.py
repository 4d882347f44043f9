"""SmallDBG on GENERATED data (``sage bench growth --smalldbg``): SmallDB synthetic databases re-run as the database
grows, under BBImprover and BBScheduler, against re-running at every block with the horizon declared (the paper's
Theorem 9 / Table 1).

Data: GENERATED rows of one column over ``CELLS`` equal bins on [0, 1], drawn from the fixed distribution ``P``
(fixed seeds), ``--blocks`` blocks of ``--rows-per-block``; queries: all 36 range counts [a, b) over the bins. SmallDB
enumerates every synthetic database of ``--synthetic-size`` m records over the 8 cells (C(8 + m - 1, m): 1,716 at
m = 6; exponential in the domain, so the domain is kept this small). Every schedule's blocks are charged on a real
SQLite ledger before they are read. Error at block count t: the worst range-count error of the newest synthetic
database against the CURRENT database; ``opt_m`` is the best size-m synthetic database's (non-private, the floor).
Variants (same total per-record budget):
- ``bbimprover``: SmallDBG under BBImprover (a run at every block, epsilon_t = c t^-(1/2 + a), zCDP; (epsilon, delta));
- ``bbscheduler``: SmallDBG under BBScheduler (pure epsilon, a run each time the data grew by 1 + gamma);
- ``rerun``: SmallDB at every block at epsilon / T (pure, basic composition; the horizon T declared in advance).
"""

from __future__ import annotations

import argparse
import math
import tempfile
import time

import numpy as np

from sage_tfx.bench._trials import block_reader, trial_ledger
from sage_tfx.plots import pyplot, save_figure

VARIANTS = ("bbimprover", "bbscheduler", "rerun")
CELLS = 8
P = np.array([0.3, 0.2, 0.1, 0.1, 0.1, 0.1, 0.05, 0.05])
DEFAULT_PLOT = "docs/img/growth_smalldbg.png"


def run(args: argparse.Namespace, growth_plot: str) -> dict:
    """SmallDBG's figures: the median worst-query error by t of each variant over ``args.trials`` seeds, the floor
    opt_m, and the slope of BBImprover's excess over it.

    Args:
        args: the parsed options of ``sage bench growth --smalldbg``.
        growth_plot: ``sage bench growth``'s default --plot (given: this figure goes to ``DEFAULT_PLOT``).

    Returns:
        The figures (JSON-ready).
    """
    from sage_tfx.release.growth import Universe
    from sage_tfx.release.growth.smalldbg import candidate_count, candidates, scores

    began = time.time()
    T, m0, m = args.blocks, args.rows_per_block, args.synthetic_size
    universe = Universe(columns=("x",), edges=(np.linspace(0, 1, CELLS + 1),))
    queries = np.array([[int(a <= c < b) for c in range(CELLS)] for a in range(CELLS) for b in range(a + 1, CELLS + 1)])
    data = [universe.centres()[np.random.default_rng(40_000 + i).choice(CELLS, size=m0, p=P)] for i in range(T)]
    table = candidates(CELLS, m)
    truth, opt = [], []
    for t in range(1, T + 1):
        counts = sum(np.bincount(universe.cells(b), minlength=CELLS) for b in data[:t])
        truth.append(queries @ counts / (t * m0))
        opt.append(float(scores(counts, t * m0, queries, table).min()) / (t * m0 * m))
    err = {v: np.full((args.trials, T), np.nan) for v in VARIANTS}
    audits = []
    with tempfile.TemporaryDirectory() as tmp:
        for trial in range(args.trials):
            audits.append(_trial(args, trial, tmp, (universe, queries, data, truth), err))
    med = {v: np.nanmedian(err[v], axis=0) for v in VARIANTS}
    bins = _doubling_excess(err, np.array(opt))
    figures = {
        "data": f"GENERATED: {T} blocks x {m0} rows over {CELLS} cells (fixed P), 36 range-count queries",
        "synthetic_size": m,
        "candidates": candidate_count(CELLS, m),
        "epsilon": args.epsilon,
        "delta": args.delta,
        "a": args.a,
        "gamma": args.gamma,
        "trials": args.trials,
        "median_error_by_t": {v: [round(float(e), 5) for e in med[v]] for v in VARIANTS},
        "opt_m_by_t": [round(e, 5) for e in opt],
        "mean_error": {v: float(np.nanmean(med[v])) for v in VARIANTS},
        "rerun_over_bbimprover_mean": float(np.nanmean(med["rerun"]) / np.nanmean(med["bbimprover"])),
        "excess_over_opt_m_by_doubling": {v: [round(e, 5) for _, e in bins[v]] for v in VARIANTS},
        "doubling_bins_first_t": [first for first, _ in bins["bbimprover"]],
        "excess_log_slope": {v: _slope(bins[v]) for v in ("bbimprover", "bbscheduler")},
        "predicted_log_slope": {"bbimprover": -(0.5 - args.a), "bbscheduler": 0.0},
        "audit_ok": all(audits),
        "seconds": round(time.time() - began, 1),
    }
    if args.plot:
        plot = DEFAULT_PLOT if args.plot == growth_plot else args.plot
        _plot(med, opt, figures, plot)
        figures["plot"] = plot
    return figures


def _doubling_excess(err: dict, opt: np.ndarray) -> dict:
    """{variant: [(first t, mean over trials and t in [2^k, 2^(k+1)) of error - opt_m)]}: the excess over the best
    synthetic database, averaged over doubling bins of t (one draw per trial and t is too noisy to fit alone)."""
    T = len(opt)
    out = {}
    for v, e in err.items():
        excess = e - opt[None, :]
        out[v] = [
            (lo, float(np.nanmean(excess[:, lo - 1 : min(2 * lo - 1, T)])))
            for lo in (2**k for k in range(T.bit_length()))
        ]
    return out


def _slope(bins: list) -> float:
    """The log-log slope of the doubling bins' mean excess against their first t (bins with a positive excess)."""
    pts = [(math.log(t), math.log(e)) for t, e in bins if e > 0]
    return float(np.polyfit(*zip(*pts), 1)[0]) if len(pts) >= 2 else float("nan")


def _trial(args: argparse.Namespace, trial: int, tmp: str, world: tuple, err: dict) -> bool:
    from sage_tfx.privacy.randomness import secure_rng
    from sage_tfx.release.growth import (
        BBImprover,
        BBScheduler,
        ImproverParams,
        SchedulerParams,
        smalldb_mechanism,
        smalldbg,
        synthetic_answers,
    )

    universe, queries, data, truth = world
    T, m0, m = args.blocks, args.rows_per_block, args.synthetic_size
    ledger = trial_ledger(tmp, f"sdb{trial}", ("impr", "sched"), T, m0, args.epsilon, args.delta)
    reader = block_reader(ledger, data)
    schedules = {
        "bbimprover": ("impr", BBImprover(ImproverParams(args.epsilon, args.delta, args.a))),
        "bbscheduler": ("sched", BBScheduler(SchedulerParams(args.epsilon, gamma=args.gamma))),
    }
    runs = {
        v: smalldbg(ledger, s, f"{v}{trial}", sch, universe, queries, reader, rows_per_block=m0, synthetic_size=m)
        for v, (s, sch) in schedules.items()
    }
    rerun = smalldb_mechanism(schedules["bbscheduler"][1], universe, queries, m0, m)
    rng = secure_rng(50_000 + trial)
    for t in range(1, T + 1):
        for v, rel in runs.items():
            rel.observe(f"b{t - 1:03d}")
            if rel.current is not None:
                err[v][trial, t - 1] = np.abs(synthetic_answers(rel.current, queries) - truth[t - 1]).max()
        out = rerun(data[:t], args.epsilon / T, rng)
        err["rerun"][trial, t - 1] = np.abs(synthetic_answers(out, queries) - truth[t - 1]).max()
    ok = bool(ledger.audit().ok)
    ledger.close()
    return ok


def _plot(med: dict, opt: list, figures: dict, path: str) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    t = np.arange(1, len(opt) + 1)
    for v in VARIANTS:
        ax.plot(t, med[v], marker="o", ms=2, label=v)
    ax.plot(t, opt, "k--", label="opt_m (best synthetic DB, non-private)")
    ax.set_xscale("log")
    ax.set_xlabel("blocks t")
    ax.set_ylabel("worst range-count error")
    ax.set_title(f"SmallDBG, GENERATED, m={figures['synthetic_size']}, total eps={figures['epsilon']}")
    ax.legend(fontsize=8)
    save_figure(fig, path, dpi=120)
