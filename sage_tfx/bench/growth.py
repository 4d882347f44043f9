"""Growing database (seed 001): BBScheduler / BBImprover / PMWG error as the data grows vs naive re-runs at the same total epsilon.

Data: the 15,002 REAL Chicago taxi trips of the tfx wheel in time order, cut into ``--blocks`` blocks of
``--rows-per-block`` rows (the declared rows; public). A real SQLite ledger (temp dir) charges every block the
schedule's whole per-record bound before it is read.
Static mechanism: the epsilon-DP mean of fare / 100 (clipped to [0, 1]) over the public record count
(sensitivity 1 / n, grid Laplace). Variants, all at the same total per-record budget, error = |released - true
mean of the CURRENT database| at every block count t:
- ``bbscheduler``: pure epsilon, re-run at growth factor 1 + gamma (held accuracy);
- ``bbimprover``: (epsilon, delta), re-run at every t with epsilon_t ~ t^-(1/2 + a) (improving accuracy);
- ``naive_every`` (baseline): re-run at every t with epsilon / T (basic composition; the horizon T declared);
- ``naive_once`` (baseline): one run at t = 1 with the whole epsilon, answered from forever.
PMWG: ``--queries-per-block`` random range-count queries over fare x miles (a declared 10 x 6 grid) after each
arrival; error against ``pmw_per_epoch`` (baseline): a fresh static PMW per BBScheduler epoch (same epsilon_i
schedule) on the epoch-start snapshot. Figures: per-t median errors over ``--trials`` seeds and mean ratios.
"""

from __future__ import annotations

import argparse
import tempfile
import time

import numpy as np

from sage_tfx.bench import _growth_ermg, _growth_smalldbg
from sage_tfx.bench._trials import block_reader, first_taxi_trips, numeric_column, trial_ledger
from sage_tfx.plots import pyplot, save_figure

DEFAULT_PLOT = "docs/img/growth.png"
VARIANTS = ("bbscheduler", "bbimprover", "naive_every", "naive_once")
FARE_MAX, MILES_MAX = 100.0, 30.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--epsilon", type=float, default=1.0, help="total per-record epsilon (default 1)")
    parser.add_argument("--delta", type=float, default=1e-6, help="delta for BBImprover (default 1e-6)")
    parser.add_argument("--blocks", type=int, default=60, help="blocks in the stream (default 60)")
    parser.add_argument("--rows-per-block", type=int, default=200, help="rows per block (default 200)")
    parser.add_argument("--gamma", type=float, default=0.5, help="BBScheduler growth factor - 1 (default 0.5)")
    parser.add_argument("--a", type=float, default=0.1, help="BBImprover exponent a (default 0.1)")
    parser.add_argument("--queries-per-block", type=int, default=5, help="PMWG queries per arrival (default 5)")
    parser.add_argument("--hard-budget", type=int, default=20, help="PMWG hard queries k (default 20)")
    parser.add_argument("--trials", type=int, default=3, help="noise seeds (default 3)")
    parser.add_argument("--plot", default=DEFAULT_PLOT, help=f"PNG to write ('' for none; default {DEFAULT_PLOT})")
    parser.add_argument(
        "--ermg",
        action="store_true",
        help="instead: ERMG (private logistic regression re-run on growth) under BBImprover and "
        "BBScheduler vs a run at every block, on the REAL taxi big-tipper task (Theorem 12)",
    )
    parser.add_argument(
        "--smalldbg",
        action="store_true",
        help="instead: SmallDBG (SmallDB synthetic databases re-run on growth) under BBImprover and BBScheduler vs "
        "a run at every block, on GENERATED rows over 8 cells and 36 range counts (Theorem 9; exponential in the "
        "domain, so the domain is this small); plot docs/img/growth_smalldbg.png",
    )
    parser.add_argument(
        "--synthetic-size", type=int, default=6, help="SmallDBG: the synthetic database's records m (default 6)"
    )


def taxi_rows(blocks: int, rows: int) -> list[np.ndarray]:
    """The first blocks * rows REAL taxi trips in time order: per block an (rows, 2) array (fare, miles)."""
    table = first_taxi_trips(blocks, rows)
    fare, miles = numeric_column(table, "fare"), numeric_column(table, "trip_miles")
    x = np.stack([np.clip(fare, 0, FARE_MAX), np.clip(miles, 0, MILES_MAX)], axis=1)
    return [x[i * rows : (i + 1) * rows] for i in range(blocks)]


def _check(args):
    if args.ermg and args.smalldbg:
        raise SystemExit("--ermg and --smalldbg are two benchmarks: give one of them")
    for name in ("blocks", "rows_per_block", "trials", "queries_per_block", "hard_budget", "synthetic_size"):
        if getattr(args, name) < 1:
            raise SystemExit(f"--{name.replace('_', '-')} {getattr(args, name)} is invalid: give an integer >= 1")
    for name in ("epsilon", "gamma"):
        if not getattr(args, name) > 0:
            raise SystemExit(f"--{name} {getattr(args, name)} is invalid: give a number > 0")


class StaticPMW:
    """Static PMW (HR10) on a frozen histogram snapshot: the same SVT + MW steps as PMWG, no arrivals; epsilon-DP
    for the snapshot's records over all its queries (k hard queries at epsilon / (2k) + epsilon / (2k) each)."""

    def __init__(self, counts, n, epsilon, hard_budget, threshold, eta, rng):
        self.counts, self.n, self.d = counts, n, 1.0 / n
        self.public = np.full(len(counts), 1.0 / len(counts))
        self.e = epsilon / (2 * hard_budget)
        self.k, self.threshold, self.eta, self.rng = hard_budget, threshold, eta, rng
        self.hard, self.noisy_t = 0, None

    def query(self, w) -> float:
        from sage_tfx.privacy.samplers import grid_laplace

        est = float(w @ self.public)
        if self.hard >= self.k:
            return est
        if self.noisy_t is None:
            self.noisy_t = float(grid_laplace(np.array([self.threshold]), self.d, self.e / 2, rng=self.rng)[0])
        true = float(w @ self.counts / self.n)
        if float(grid_laplace(np.array([abs(true - est)]), self.d, self.e / 4, rng=self.rng)[0]) < self.noisy_t:
            return est
        noisy = float(grid_laplace(np.array([true]), self.d, self.e, rng=self.rng)[0])
        self.public = self.public * np.exp((1.0 if noisy > est else -1.0) * self.eta * w)
        self.public /= self.public.sum()
        self.hard, self.noisy_t = self.hard + 1, None
        return noisy


def run(args: argparse.Namespace) -> dict:
    """Run the benchmark: every schedule and baseline on the same real blocks, ``args.trials`` times.

    Args:
        args: the parsed options (``add_arguments``), checked by ``_check``.

    Returns:
        The figures (JSON-ready): errors by block count, their ratios, the charges per block and the audits.
    """
    from sage_tfx.release.growth import BBImprover, BBScheduler, ImproverParams, PMWGParams, SchedulerParams, Universe

    _check(args)
    if args.ermg:
        return _growth_ermg.run(args)
    if args.smalldbg:
        return _growth_smalldbg.run(args, DEFAULT_PLOT)
    began = time.time()
    data = taxi_rows(args.blocks, args.rows_per_block)
    T = args.blocks
    truth = np.array([np.mean(np.concatenate([b[:, 0] for b in data[:t]])) / FARE_MAX for t in range(1, T + 1)])
    err = {v: np.zeros((args.trials, T)) for v in VARIANTS}
    pm_err = {v: np.zeros((args.trials, T)) for v in ("pmwg", "pmw_per_epoch")}
    setup = {
        "uni": Universe(
            columns=("fare", "trip_miles"), edges=(np.linspace(0, FARE_MAX, 11), np.linspace(0, MILES_MAX, 7))
        ),
        "pm_params": PMWGParams(epsilon=args.epsilon, hard_budget=args.hard_budget),
        "sched": BBScheduler(SchedulerParams(epsilon=args.epsilon, gamma=args.gamma)),
        "impr": BBImprover(ImproverParams(epsilon=args.epsilon, delta=args.delta, a=args.a)),
        "mean_mech": _mean_mechanism(args.rows_per_block),
    }
    audit_ok, charged = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        for trial in range(args.trials):
            ok, spent = _run_trial(args, trial, tmp, data, truth, setup, err, pm_err)
            audit_ok.append(ok)
            for s_, values in spent.items():
                charged.setdefault(s_, set()).update(values)
    med = {v: np.median(err[v], axis=0) for v in VARIANTS}
    pmed = {v: np.median(pm_err[v], axis=0) for v in pm_err}
    figures = _figures(args, med, pmed, setup["sched"], charged, audit_ok, began)
    if args.plot:
        plot(med, pmed, figures, args.plot)
        figures["plot"] = args.plot
    return figures


def _mean_mechanism(m: int):
    """The epsilon-DP mean of fare/100 over whole blocks of ``m`` declared rows (grid Laplace)."""
    from sage_tfx.privacy.samplers import grid_laplace

    def mean_mech(blocks, epsilon, rng):
        n = m * len(blocks)
        total = sum(float(b[:, 0].sum()) for b in blocks) / FARE_MAX
        return float(grid_laplace(np.array([total / n]), 1.0 / n, epsilon, rng=rng)[0])

    return mean_mech


def _run_trial(
    args: argparse.Namespace, trial: int, tmp: str, data: list, truth: np.ndarray, setup: dict, err: dict, pm_err: dict
) -> tuple[bool, dict]:
    """One trial on a fresh ledger: fills row ``trial`` of ``err``/``pm_err``; returns (audit ok, charges)."""
    from sage_tfx.privacy.randomness import secure_rng
    from sage_tfx.release.growth import PMWG, ScheduledRelease

    T, m = args.blocks, args.rows_per_block
    mean_mech, sched, uni, pm_params = setup["mean_mech"], setup["sched"], setup["uni"], setup["pm_params"]
    ledger = trial_ledger(tmp, trial, ("sched", "impr", "pmwg"), T, m, args.epsilon, args.delta)
    reader = block_reader(ledger, data)
    rs = ScheduledRelease(ledger, "sched", f"bbs{trial}", sched, mean_mech, reader, name="dp_mean_fare")
    ri = ScheduledRelease(ledger, "impr", f"bbi{trial}", setup["impr"], mean_mech, reader, name="dp_mean_fare")
    pm = PMWG(ledger, "pmwg", f"pmwg{trial}", pm_params, uni, reader)
    rng = secure_rng(20_000 + trial)
    qrng = np.random.default_rng(30_000 + trial)
    once = None
    epoch_pmw = None
    for t in range(1, T + 1):
        b = f"b{t - 1:03d}"
        rs.observe(b)
        ri.observe(b)
        pm.observe(b, m)
        err["bbscheduler"][trial, t - 1] = abs(rs.current - truth[t - 1])
        err["bbimprover"][trial, t - 1] = abs(ri.current - truth[t - 1])
        err["naive_every"][trial, t - 1] = abs(mean_mech(data[:t], args.epsilon / T, rng) - truth[t - 1])
        if once is None:
            once = mean_mech(data[:1], args.epsilon, rng)
        err["naive_once"][trial, t - 1] = abs(once - truth[t - 1])
        queries = _queries(uni, qrng, args.queries_per_block)
        pm_err["pmwg"][trial, t - 1] = np.mean([abs(pm.query(w).answer - pm.true_answer(w)) for w in queries])
        plan = sched.run_at(t)
        if plan is not None:  # a new epoch of the baseline: fresh PMW on the snapshot at epsilon_i
            epoch_pmw = StaticPMW(
                pm.counts.copy(), pm.n, plan[1], args.hard_budget, pm_params.threshold, pm_params.eta, rng
            )
        pm_err["pmw_per_epoch"][trial, t - 1] = np.mean([abs(epoch_pmw.query(w) - pm.true_answer(w)) for w in queries])
    ok = bool(ledger.audit().ok)
    spent = {
        s_: {round(b["epsilon_spent"], 9) for b in ledger.status(s_)["blocks"]} for s_ in ("sched", "impr", "pmwg")
    }
    ledger.close()
    return ok, spent


def _queries(uni, qrng: np.random.Generator, count: int) -> list:
    """``count`` random box counting queries over fare x miles."""
    from sage_tfx.release.growth import count_query

    queries = []
    for _ in range(count):
        lo_f, lo_m = qrng.uniform(0, 0.6, size=2)
        queries.append(
            count_query(
                uni,
                lambda c, f=lo_f, g=lo_m: (
                    (
                        (c[:, 0] / FARE_MAX >= f)
                        & (c[:, 0] / FARE_MAX < f + 0.4)
                        & (c[:, 1] / MILES_MAX >= g)
                        & (c[:, 1] / MILES_MAX < g + 0.4)
                    )
                    | (f > 0.59)
                ),
            )
        )
    return queries


def _figures(
    args: argparse.Namespace, med: dict, pmed: dict, sched, charged: dict, audit_ok: list, began: float
) -> dict:
    """The benchmark's figures from the median errors over the trials (``med``, ``pmed``: by variant)."""
    T, m = args.blocks, args.rows_per_block
    q = max(1, T // 4)
    return {
        "data": f"REAL taxi trips: {T} blocks x {m} rows (time order); mean of fare/100; PMWG over fare x miles",
        "epsilon": args.epsilon,
        "delta": args.delta,
        "gamma": args.gamma,
        "a": args.a,
        "trials": args.trials,
        "scheduler_runs": [t for t in range(1, T + 1) if sched.run_at(t)],
        "median_abs_error_by_t": {v: [round(float(e), 6) for e in med[v]] for v in VARIANTS},
        "mean_abs_error": {v: float(np.mean(med[v])) for v in VARIANTS},
        "last_quarter_error": {v: float(np.mean(med[v][-q:])) for v in VARIANTS},
        "naive_every_over_bbscheduler": float(np.mean(med["naive_every"]) / np.mean(med["bbscheduler"])),
        "naive_every_over_bbimprover_last_quarter": float(
            np.mean(med["naive_every"][-q:]) / np.mean(med["bbimprover"][-q:])
        ),
        "naive_once_over_bbscheduler": float(np.mean(med["naive_once"]) / np.mean(med["bbscheduler"])),
        "pmwg_error_by_t": [round(float(e), 6) for e in pmed["pmwg"]],
        "pmw_per_epoch_error_by_t": [round(float(e), 6) for e in pmed["pmw_per_epoch"]],
        "pmw_per_epoch_over_pmwg": float(np.mean(pmed["pmw_per_epoch"]) / np.mean(pmed["pmwg"])),
        "block_epsilon_charged": {k: sorted(v) for k, v in charged.items()},
        "audit_ok": all(audit_ok),
        "seconds": round(time.time() - began, 1),
    }


def plot(med: dict, pmed: dict, figures: dict, path: str) -> None:
    plt = pyplot()
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4))
    t = np.arange(1, len(med["bbscheduler"]) + 1)
    for v in VARIANTS:
        ax.plot(t, np.maximum(med[v], 1e-7), marker="o", ms=2, label=v)
    ax.set_yscale("log")
    ax.set_xlabel("blocks t")
    ax.set_ylabel("|DP mean - true mean| (fare / 100)")
    ax.set_title(f"REAL taxi, total eps={figures['epsilon']} per record")
    ax.legend(fontsize=8)
    for v in pmed:
        bx.plot(t, np.maximum(pmed[v], 1e-7), marker="o", ms=2, label=v)
    bx.set_yscale("log")
    bx.set_xlabel("blocks t")
    bx.set_ylabel("mean |answer - truth| (range-count fraction)")
    bx.set_title("PMWG vs static PMW re-run per epoch")
    bx.legend(fontsize=8)
    save_figure(fig, path, dpi=120)
