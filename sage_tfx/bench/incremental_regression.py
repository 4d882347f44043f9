"""Incremental regression: excess empirical risk of PrivIncReg1 (Tree Mechanism) vs re-running AdaSSP at every block.

For each horizon T in ``--horizons`` the same rows are split, in time order, into T consecutive blocks; at every
arrival t both methods release a regressor on blocks 1..t, each block's records getting the SAME (epsilon,
delta) over the whole horizon:

  tree      ``sage_tfx.release.incremental_regression.TreeRegressor`` (PrivIncReg1): each block in <= floor(log2 T)+1
            noisy tree nodes, calibrated once for the horizon;
  rerun     the BASELINE, today's path: ``sage_tfx.privacy.adassp.release`` re-run on blocks 1..t at every arrival
            (PrivIncERM with tau = 1 under block composition). Block 1 takes part in T runs, so every run gets
            the AdaSSP noise multiplier c with 3T Gaussian releases of c (epsilon, delta)-DP (dp_accounting RDP,
            ``adassp.exact_multiplier(eps, delta, releases=3T)``); the per-run (eps_run, delta / T) passed to
            AdaSSP is the RDP epsilon of its three releases at that c (calibration "exact").

Excess empirical risk at t: sum over rows 1..n_t of (y - x theta_t)^2 minus that of the non-private least squares
on the same clipped rows, divided by n_t (per-row excess squared error). Figures: its mean over t = 1..T and its
value at t = T for each method, its median over t, the fraction of arrivals where the tree is better, and the
per-arrival curves, the mean over the second half t > T/2, and the ratio rerun / tree (> 1: the tree is better).
Caveat: at t = T a power of two the tree's prefix is ONE noisy node (its best case; at t = T - 1 it is log2 T
nodes), so quote the mean, median and second-half figures, not only the value at t = T. All figures are averaged
over ``--seeds`` noise seeds. Data: the real Chicago taxi rows (``sage_tfx.data.taxi``, 15k trips: fare ~ trip
miles, seconds and hour), or ``--data generated``: GENERATED Gaussian rows with a linear model (say so when quoting).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

import numpy as np

from sage_tfx import comma_lists
from sage_tfx.bench import _incremental_highdim
from sage_tfx.plots import pyplot, save_figure

DEFAULT_PLOT = os.path.join("docs", "img", "incremental_regression.png")
GENERATED = "GENERATED rows: x ~ N(0, I/4) in 4 dimensions, y = x theta* + N(0, 0.1^2), theta* fixed"
TAXI = (
    "real Chicago taxi trips (sage_tfx.data.taxi 'simple', time order): "
    "fare/50 ~ [1/2, miles/40, seconds/7200, hour/46]"
)
BOUND_X, BOUND_Y, RADIUS = 1.0, 1.0, 4.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--horizons", type=comma_lists.counts, default="8,16,32,64,128,256", help="comma list of horizons T (blocks)"
    )
    parser.add_argument("--epsilon", type=float, default=1.0, help="each block's epsilon over the horizon (default 1)")
    parser.add_argument("--delta", type=float, default=1e-6, help="each block's delta over the horizon (default 1e-6)")
    parser.add_argument("--seeds", type=int, default=3, help="noise seeds per horizon (default 3)")
    parser.add_argument("--data", choices=("taxi", "generated"), default="taxi", help="taxi (real) or generated rows")
    parser.add_argument("--rows", type=int, default=0, help="use only the first ROWS rows (0: all; generated: 12000)")
    parser.add_argument("--iterations", type=int, default=200, help="projected-gradient steps per tree release")
    parser.add_argument(
        "--ridge",
        action="store_true",
        help="the tree descends on Q_t + lambda_t I (incremental_regression.noise_ridge)",
    )
    parser.add_argument("--plot", default=DEFAULT_PLOT, help=f"PNG to write ('' for none; default {DEFAULT_PLOT})")
    parser.add_argument(
        "--high-dim",
        action="store_true",
        help="instead: PrivIncReg2 vs PrivIncReg1 as d grows, on GENERATED sparse rows with a small-width set "
        "(--dims, --sketch-dims, --set, --blocks, --rows-per-block; the paper's Section 5 regime)",
    )
    parser.add_argument(
        "--dims", type=comma_lists.counts, default="50,200,800", help="--high-dim: comma list of dimensions d"
    )
    parser.add_argument(
        "--sketch-dims",
        type=comma_lists.counts,
        default="20,80",
        help="--high-dim: comma list of PrivIncReg2's m (<= d)",
    )
    parser.add_argument("--set", choices=("l1_ball", "simplex"), default="l1_ball", help="--high-dim: the set C")
    parser.add_argument("--blocks", type=int, default=4, help="--high-dim: the horizon T in blocks (default 4)")
    parser.add_argument("--rows-per-block", type=int, default=500, help="--high-dim: rows per block (default 500)")


def _check_args(args) -> list[int]:
    horizons = args.horizons
    if not (math.isfinite(args.epsilon) and args.epsilon > 0):
        raise SystemExit(f"--epsilon must be a finite number > 0, got {args.epsilon}")
    if not 0 < args.delta < 1:
        raise SystemExit(f"--delta must be in (0, 1), got {args.delta}")
    if args.seeds < 1:
        raise SystemExit(f"--seeds must be >= 1, got {args.seeds}")
    if args.rows < 0:
        raise SystemExit(f"--rows must be >= 0, got {args.rows}")
    if args.iterations < 1:
        raise SystemExit(f"--iterations must be >= 1, got {args.iterations}")
    return horizons


def load_rows(data: str, rows: int) -> tuple[np.ndarray, np.ndarray, str]:
    """(x, y, description): taxi rows in time order with public scalings, or GENERATED rows."""
    if data == "generated":
        rng = np.random.default_rng(2017)
        n = rows or 12_000
        x = rng.normal(size=(n, 4)) / 2.0
        y = x @ np.array([0.6, -0.4, 0.3, 0.2]) + 0.1 * rng.normal(size=n)
        return x, y, GENERATED
    from sage_tfx.data.taxi import load_taxi

    table = load_taxi().sort_by("trip_start_timestamp")
    cols = {
        c: table.column(c).to_numpy(zero_copy_only=False).astype(float)
        for c in ("fare", "trip_miles", "trip_seconds", "trip_start_hour")
    }
    keep = np.all([np.isfinite(v) for v in cols.values()], axis=0)
    x = np.column_stack(
        [
            np.full(keep.sum(), 0.5),
            cols["trip_miles"][keep] / 40.0,
            cols["trip_seconds"][keep] / 7200.0,
            cols["trip_start_hour"][keep] / 46.0,
        ]
    )
    y = cols["fare"][keep] / 50.0
    if rows:
        x, y = x[:rows], y[:rows]
    return x, y, TAXI


def rerun_budget(epsilon: float, delta: float, horizon: int) -> tuple[float, float]:
    """(eps_run, delta_run) of one AdaSSP re-run so that ``horizon`` runs on a block compose to (epsilon, delta)."""
    import dp_accounting
    from dp_accounting import rdp

    from sage_tfx.privacy.adassp import exact_multiplier

    c = exact_multiplier(epsilon, delta, releases=3 * horizon)
    delta_run = delta / horizon
    accountant = rdp.RdpAccountant()
    accountant.compose(dp_accounting.ComposedDpEvent([dp_accounting.GaussianDpEvent(noise_multiplier=c)] * 3))
    return float(accountant.get_epsilon(delta_run)), delta_run


def _risk(xtx, xty, yty, theta):
    return float(theta @ xtx @ theta - 2.0 * theta @ xty + yty)


def one_horizon(
    x, y, horizon: int, epsilon: float, delta: float, seed: int, iterations: int, ridge: bool = False
) -> dict:
    """Per-arrival excess risks of the tree and of the re-run baseline on one split into ``horizon`` blocks."""
    from sage_tfx.privacy import adassp
    from sage_tfx.release.incremental_regression import IncrementalRegressionParams, TreeRegressor

    params = IncrementalRegressionParams(
        horizon=horizon,
        epsilon=epsilon,
        delta=delta,
        bound_x=BOUND_X,
        bound_y=BOUND_Y,
        radius=RADIUS,
        iterations=iterations,
        ridge=ridge,
    )
    eps_run, delta_run = rerun_budget(epsilon, delta, horizon)
    tree = TreeRegressor(params, x.shape[1])
    xc, yc = adassp.clip_rows(x, BOUND_X), adassp.clip_labels(y, BOUND_Y)
    bounds = np.linspace(0, x.shape[0], horizon + 1).astype(int)
    xtx, xty, yty, n = np.zeros((x.shape[1],) * 2), np.zeros(x.shape[1]), 0.0, 0
    tree_excess, rerun_excess = [], []
    for t in range(horizon):
        rows = slice(bounds[t], bounds[t + 1])
        bx, by = xc[rows], yc[rows]
        xtx, xty, yty, n = xtx + bx.T @ bx, xty + bx.T @ by, yty + float(by @ by), n + bx.shape[0]
        theta_tree = tree.add(bx, by, seed * 1_000_003 + t)
        theta_rerun = adassp.release(
            xtx, xty, eps_run, delta_run, BOUND_X, BOUND_Y, calibration="exact", rng=seed * 1_000_003 + 500_000 + t
        ).theta
        best = _risk(xtx, xty, yty, np.linalg.lstsq(xtx, xty, rcond=None)[0])
        tree_excess.append((_risk(xtx, xty, yty, theta_tree) - best) / max(n, 1))
        rerun_excess.append((_risk(xtx, xty, yty, theta_rerun) - best) / max(n, 1))
    return {
        "tree": tree_excess,
        "rerun": rerun_excess,
        "tree_multiplier": params.noise_multiplier,
        "rerun_epsilon_per_run": eps_run,
        "rows_per_block": float(x.shape[0]) / horizon,
    }


def run(args: argparse.Namespace) -> dict:
    horizons = _check_args(args)
    if args.high_dim:
        args.horizon = args.blocks
        if args.blocks < 1 or args.rows_per_block < 1:
            raise SystemExit("--blocks and --rows-per-block must be >= 1")
        return _incremental_highdim.run(args)
    x, y, description = load_rows(args.data, args.rows)
    if x.shape[0] < max(horizons):
        raise SystemExit(f"--horizons: {max(horizons)} blocks but only {x.shape[0]} rows; give fewer blocks")
    started = time.time()
    results = []
    for horizon in horizons:
        runs = [
            one_horizon(x, y, horizon, args.epsilon, args.delta, seed, args.iterations, args.ridge)
            for seed in range(args.seeds)
        ]
        tree_mean = float(np.mean([np.mean(r["tree"]) for r in runs]))
        rerun_mean = float(np.mean([np.mean(r["rerun"]) for r in runs]))
        tree_final = float(np.mean([r["tree"][-1] for r in runs]))
        rerun_final = float(np.mean([r["rerun"][-1] for r in runs]))
        tree_t = np.mean([r["tree"] for r in runs], axis=0)  # per-arrival excess, averaged over seeds
        rerun_t = np.mean([r["rerun"] for r in runs], axis=0)
        results.append(
            {
                "tree_excess_median": float(np.median(tree_t)),
                "rerun_excess_median": float(np.median(rerun_t)),
                "tree_better_fraction": float(np.mean(tree_t < rerun_t)),
                "tree_excess_second_half": float(np.mean(tree_t[horizon // 2 :])),
                "rerun_excess_second_half": float(np.mean(rerun_t[horizon // 2 :])),
                "tree_excess_by_t": [float(v) for v in tree_t],
                "rerun_excess_by_t": [float(v) for v in rerun_t],
                "horizon": horizon,
                "rows_per_block": runs[0]["rows_per_block"],
                "tree_noise_multiplier": runs[0]["tree_multiplier"],
                "rerun_epsilon_per_run": runs[0]["rerun_epsilon_per_run"],
                "tree_excess_mean": tree_mean,
                "rerun_excess_mean": rerun_mean,
                "tree_excess_final": tree_final,
                "rerun_excess_final": rerun_final,
                "ratio_mean_rerun_over_tree": rerun_mean / tree_mean if tree_mean > 0 else float("inf"),
                "ratio_final_rerun_over_tree": rerun_final / tree_final if tree_final > 0 else float("inf"),
            }
        )
        print(
            f"T={horizon}: excess risk per row, mean over t: tree {tree_mean:.3g}, rerun {rerun_mean:.3g} "
            f"(rerun/tree {results[-1]['ratio_mean_rerun_over_tree']:.3g})",
            file=sys.stderr,
            flush=True,
        )
    figures = {
        "data": description,
        "rows": int(x.shape[0]),
        "epsilon": args.epsilon,
        "delta": args.delta,
        "seeds": args.seeds,
        "ridge": args.ridge,
        "bound_x": BOUND_X,
        "bound_y": BOUND_Y,
        "radius": RADIUS,
        "baseline": "rerun (AdaSSP on blocks 1..t at every arrival, budget split over T runs by RDP)",
        "metric": "excess empirical risk per row vs non-private least squares on the same clipped rows",
        "horizons": results,
        "seconds": round(time.time() - started, 1),
    }
    if args.plot:
        figures["plot"] = write_plot(args.plot, results, description, args.epsilon, args.delta)
    return figures


def write_plot(path: str, results: list[dict], description: str, epsilon: float, delta: float) -> str:
    plt = pyplot()
    horizons = [r["horizon"] for r in results]
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4.5))
    ax.plot(horizons, [r["tree_excess_mean"] for r in results], "o-", label="tree (PrivIncReg1), mean over t")
    ax.plot(horizons, [r["rerun_excess_mean"] for r in results], "s-", label="re-run AdaSSP, mean over t")
    ax.plot(horizons, [r["tree_excess_final"] for r in results], "o:", label="tree, at t = T")
    ax.plot(horizons, [r["rerun_excess_final"] for r in results], "s:", label="re-run AdaSSP, at t = T")
    last = results[-1]
    steps = np.arange(1, last["horizon"] + 1)
    ax2.plot(steps, last["tree_excess_by_t"], "-", label="tree (PrivIncReg1)")
    ax2.plot(steps, last["rerun_excess_by_t"], "-", label="re-run AdaSSP")
    ax2.set_xscale("log", base=2)
    ax2.set_yscale("log")
    ax2.set_xlabel(f"arrival t (T = {last['horizon']} blocks)")
    ax2.set_ylabel("excess empirical risk per row at t")
    ax2.legend(fontsize=8)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("horizon T (blocks; same rows split finer)")
    ax.set_ylabel("excess empirical risk per row")
    ax.set_title(f"Incremental regression, eps={epsilon:g}, delta={delta:g} per block\n{description[:70]}", fontsize=9)
    ax.legend(fontsize=8)
    save_figure(fig, path, dpi=100)
    return path
