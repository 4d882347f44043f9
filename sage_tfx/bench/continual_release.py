"""Continual / sliding-window release (seed 000): excess risk over time vs re-training from scratch at the same per-record budget.

``--dataset digits``: the paper's Fig. 4 (test accuracy by t and by epsilon) with the multiclass softmax release
on scikit-learn's bundled digits (``sage_tfx/bench/_continual_digits.py``). The default, ``taxi``:

Data: the 15,002 REAL Chicago taxi trips of the tfx wheel in time order, cut into ``--blocks`` blocks of
``--rows-per-block`` rows (the declared m0); task: big tipper (tips > 0.2 fare) by regularised logistic
regression on 6 features (fare, miles, seconds, hour, credit card, bias; each scaled to [0, 1] by a public
range, rows clipped to norm 1). A real SQLite ledger (temp dir) charges every block before it is read.
At every arrival t, for each variant, the excess empirical risk J(w) - J(w_np) >= 0, J the regularised objective
(sum of log losses / N + lam/2 ||w||^2, N = covered blocks x m0) on the blocks the release covers and w_np the
NON-PRIVATE minimiser of J on the same blocks:
- ``continual``: ContinualRelease (all history), every record (epsilon, delta)-DP over an infinite horizon;
- ``sliding``: SlidingWindowRelease (``--window`` blocks), measured on its window;
- ``scratch`` (baseline): at every arrival, the regularised ERM re-trained on ALL blocks so far, output
  perturbation with the same Gaussian; block 0 is read at all T arrivals, so under zCDP composition each
  release gets rho/T of the same per-record budget (noise multiplier z_eff sqrt(T)): the horizon T must be
  declared in advance (with T unbounded it cannot run at all).
Also the mean log loss on the NEWEST block (the paper's target b0, Theorem 5; trained on) and on the NEXT
block (held out: what the deployed model meets) of each release and of the non-private all-history ERM. Figures:
per-t medians over ``--trials`` noise seeds; the ratio scratch / continual per t; the late/early
excess ratio of each variant (flatness); each block's loss (rho, or epsilon when sampled) against its charge.
``--variant sampled`` runs each strategy beside its sampled variant (the paper's App. B,
``ReleaseParams(sampling="poisson")``) at the same per-record budget; ``--variant alg5`` the dyadic sliding window
beside the paper's Algorithm 5 as written (``SlidingWindowAsWritten``, window 2^k - 1, default 7).
"""

from __future__ import annotations

import argparse
import math
import os
import tempfile
import time

import numpy as np

from sage_tfx import comma_lists
from sage_tfx.bench import _continual_digits
from sage_tfx.bench._trials import block_reader, first_taxi_trips, numeric_column, trial_ledger
from sage_tfx.plots import pyplot, save_figure

DEFAULT_PLOT = "docs/img/continual_release.png"
DIGITS_PLOT = "docs/img/continual_release_digits.png"
VARIANTS = ("continual", "sliding", "scratch")  # the default comparison (--variant none)
# model variant -> (its class in sage_tfx.release.continual, measured on its window, extra ReleaseParams)
MODELS = {
    "continual": ("ContinualRelease", False, {}),
    "sliding": ("SlidingWindowRelease", True, {}),
    "continual_sampled": ("ContinualRelease", False, {"sampling": "poisson"}),
    "sliding_sampled": ("SlidingWindowRelease", True, {"sampling": "poisson"}),
    "sliding_alg5": ("SlidingWindowAsWritten", True, {}),
}
# --variant -> the model variants compared (the from-scratch baseline always runs beside them)
COMPARISONS = {
    "none": ("continual", "sliding"),
    "sampled": ("continual", "continual_sampled", "sliding", "sliding_sampled"),
    "alg5": ("sliding", "sliding_alg5"),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dataset",
        choices=("taxi", "digits"),
        default="taxi",
        help="taxi: REAL taxi trips, binary logistic regression (default); digits: scikit-learn's "
        "bundled digits, 10-class softmax regression, test accuracy by t and by epsilon "
        "(the paper's Fig. 4)",
    )
    parser.add_argument(
        "--variant",
        choices=tuple(COMPARISONS),
        default="none",
        help="taxi: none (continual, sliding; default); sampled: each beside its sampled variant (the paper's "
        "App. B, ReleaseParams(sampling='poisson')); alg5: the dyadic sliding window beside the paper's Alg. 5 as "
        "written (SlidingWindowAsWritten; --window 2^k - 1, default 7)",
    )
    parser.add_argument("--epsilon", type=float, default=1.0, help="per-record budget charged per block (default 1)")
    parser.add_argument(
        "--epsilons",
        type=comma_lists.positive_numbers,
        default="0.3,1,3,10",
        help="digits: the per-record epsilons compared, comma-separated (default 0.3,1,3,10; the ledger refuses above 10)",
    )
    parser.add_argument("--delta", type=float, default=1e-6, help="per-record delta (default 1e-6)")
    parser.add_argument(
        "--blocks", type=int, default=None, help="blocks in the stream (default 32 taxi; digits: all that fit)"
    )
    parser.add_argument(
        "--rows-per-block", type=int, default=None, help="rows per block, m0 (default 450 taxi, 128 digits)"
    )
    parser.add_argument("--window", type=int, default=None, help="sliding window in blocks (default 8 taxi, 4 digits)")
    parser.add_argument("--lam", type=float, default=0.05, help="ridge weight lam (default 0.05)")
    parser.add_argument("--trials", type=int, default=None, help="noise seeds (default 5 taxi, 3 digits)")
    parser.add_argument(
        "--plot", default=None, help=f"PNG to write ('' for none; default {DEFAULT_PLOT} taxi, {DIGITS_PLOT} digits)"
    )


DEFAULTS = {
    "taxi": {"blocks": 32, "rows_per_block": 450, "window": 8, "trials": 5, "plot": DEFAULT_PLOT},
    "digits": {"blocks": None, "rows_per_block": 128, "window": 4, "trials": 3, "plot": DIGITS_PLOT},
}


def _resolve(args: argparse.Namespace) -> argparse.Namespace:
    """The data set's defaults for the options left unset (Alg. 5 as written needs a window 2^k - 1: 7)."""
    if args.variant == "alg5" and args.window is None:
        args.window = 7
    if args.variant != "none" and args.plot is None:
        args.plot = f"docs/img/continual_release_{args.variant}.png"
    for name, value in DEFAULTS[args.dataset].items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    return args


FEATURES = ("fare", "trip_miles", "trip_seconds", "trip_start_hour", "credit_card", "bias")
RANGES = {"fare": 100.0, "trip_miles": 30.0, "trip_seconds": 3600.0, "trip_start_hour": 23.0}


def taxi_blocks(blocks: int, rows: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """The first blocks * rows REAL taxi trips in time order as ``blocks`` (X, y) blocks (big tipper label)."""
    table = first_taxi_trips(blocks, rows)
    fare, tips = numeric_column(table, "fare"), numeric_column(table, "tips")
    x = np.stack(
        [np.clip(numeric_column(table, n) / RANGES[n], 0, 1) for n in RANGES]
        + [
            np.array([p == "Credit Card" for p in table.column("payment_type").to_pylist()], float),
            np.ones(table.num_rows),
        ],
        axis=1,
    ) / math.sqrt(len(FEATURES))
    y = np.where(tips > 0.2 * fare, 1.0, -1.0)
    return [(x[i * rows : (i + 1) * rows], y[i * rows : (i + 1) * rows]) for i in range(blocks)]


def _check(args):
    for name in ("blocks", "rows_per_block", "trials", "window"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise SystemExit(f"--{name.replace('_', '-')} {getattr(args, name)} is invalid: give an integer >= 1")
    if args.dataset == "digits" and args.variant != "none":
        raise SystemExit(f"--variant {args.variant} compares taxi runs: give --dataset taxi or --variant none")
    if args.blocks is not None and args.window > args.blocks:
        raise SystemExit(f"--window {args.window} is larger than the stream ({args.blocks} blocks): lower it")


def _objective(w, x, y, normaliser, lam):
    return float(np.logaddexp(0.0, -y * (x @ w)).sum() / normaliser + 0.5 * lam * (w @ w))


def _excess(w, x, y, w_np, normaliser, lam):
    """J(w) - J(w_np) >= 0, J the regularised objective (ref 0) on the covered blocks; w_np its minimiser."""
    return _objective(w, x, y, normaliser, lam) - _objective(w_np, x, y, normaliser, lam)


def run(args: argparse.Namespace) -> dict:
    """Run the benchmark: the ``--variant``'s strategies and the from-scratch baseline on the same real blocks,
    ``args.trials`` times.

    Args:
        args: the parsed options (``add_arguments``), checked by ``_check``.

    Returns:
        The figures (JSON-ready): excess risks by block count, their ratios, log losses, the per-record loss
        against its bound and the audits.
    """
    _check(_resolve(args))
    if args.dataset == "digits":
        return _continual_digits.run(args)
    began = time.time()
    data = taxi_blocks(args.blocks, args.rows_per_block)
    T = args.blocks
    models = COMPARISONS[args.variant]
    variants = (*models, "scratch")
    scores = {
        "excess": {v: np.zeros((args.trials, T)) for v in variants},
        "newest": {v: np.zeros((args.trials, T)) for v in (*variants, "non_private")},
        "following": {v: np.zeros((args.trials, T - 1)) for v in (*variants, "non_private")},
    }
    fits = _non_private_fits(data, args, 10.0)
    loss_ratio: dict[str, list] = {v: [] for v in models}
    audit_ok, charged = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for trial in range(args.trials):
            releases, z_scratch, ok, spent = _run_trial(args, trial, tmp, data, models, fits, scores)
            for v, rel in releases.items():
                loss_ratio[v].append(_loss_over_bound(rel))
            audit_ok.append(ok)
            charged.extend(spent)
    med = {v: np.median(scores["excess"][v], axis=0) for v in variants}
    figures = _figures(args, med, scores, (releases, z_scratch), loss_ratio, charged, audit_ok, began)
    if args.plot:
        plot(med, figures, args.plot)
        figures["plot"] = args.plot
    return figures


def _params(args: argparse.Namespace, name: str):
    """The ReleaseParams of model variant ``name`` (``MODELS``)."""
    from sage_tfx.release.continual import ReleaseParams

    _, windowed, extra = MODELS[name]
    base = dict(epsilon=args.epsilon, delta=args.delta, records_per_block=args.rows_per_block, lam=args.lam)
    return ReleaseParams(**base, window=args.window if windowed else None, **extra)


def _loss_over_bound(rel) -> float:
    """The worst block's loss over what it was charged: rho / rho bound, or (sampled) epsilon / epsilon."""
    if rel.sampled:
        return max(e for e, _ in rel.per_record_epsilon().values()) / rel.params.epsilon
    return max(rel.per_record_rho().values()) / rel.rho_bound()


def _non_private_fits(data: list, args: argparse.Namespace, radius: float) -> tuple[list, list]:
    """The non-private minimisers (same objective, same blocks) at every t: on all blocks, and on the window."""
    from sage_tfx.release.continual import clip_features, solve_erm

    m0 = args.rows_per_block

    def np_fit(blocks_):
        x = np.concatenate([data[i][0] for i in blocks_])
        y = np.concatenate([data[i][1] for i in blocks_])
        x, y = clip_features(x, y, "logistic")
        return x, y, solve_erm(x, y, normaliser=len(blocks_) * m0, lam=args.lam, radius=radius, loss="logistic")

    T = args.blocks
    return (
        [np_fit(range(t)) for t in range(1, T + 1)],
        [np_fit(range(max(0, t - args.window), t)) for t in range(1, T + 1)],
    )


def _run_trial(
    args: argparse.Namespace, trial: int, tmp: str, data: list, models: tuple, fits: tuple, scores: dict
) -> tuple:
    """One trial on a fresh ledger (one stream per model variant, the same blocks), filling row ``trial``.

    Returns:
        ``({variant: its release}, z of a from-scratch release, audit ok, each block's charge)``.
    """
    from sage_tfx.privacy.randomness import secure_rng
    from sage_tfx.release.continual import SlidingWindowRelease

    T, d, m0 = args.blocks, len(FEATURES), args.rows_per_block
    ledger = trial_ledger(tmp, trial, [f"taxi_{v}" for v in models], T, m0, args.epsilon, args.delta)
    reader = block_reader(ledger, data)
    releases = {}
    for v in models:
        cls = _strategy(v)
        extra = {"horizon": T} if cls is SlidingWindowRelease else {}
        releases[v] = cls(ledger, f"taxi_{v}", f"{v}{trial}", _params(args, v), reader, dim=d, **extra)
    z_scratch = _z_eff(args) * math.sqrt(T)
    rng = secure_rng(10_000 + trial)
    for t in range(1, T + 1):
        weights = {v: rel.observe(f"b{t - 1:03d}").weights for v, rel in releases.items()}
        _score_arrival(args, trial, t, data, fits, scores, weights, z_scratch, rng)
    ok = bool(ledger.audit().ok)
    spent = [b["epsilon_spent"] for v in models for b in ledger.status(f"taxi_{v}")["blocks"]]
    ledger.close()
    return releases, z_scratch, ok, spent


def _z_eff(args: argparse.Namespace) -> float:
    """z_eff: one Gaussian release's multiplier at the per-record (epsilon, delta) (the from-scratch baseline's unit)."""
    from sage_tfx.privacy import gaussian

    return gaussian.rdp_multiplier(args.epsilon, args.delta)


def _strategy(name: str):
    from sage_tfx.release import continual

    return getattr(continual, MODELS[name][0])


def _score_arrival(
    args: argparse.Namespace,
    trial: int,
    t: int,
    data: list,
    fits: tuple,
    scores: dict,
    released: dict,
    z_scratch: float,
    rng,
) -> None:
    """Score the models released at arrival ``t`` ({variant: weights}) and a from-scratch release into ``scores``."""
    from sage_tfx.privacy.samplers import grid_gaussian
    from sage_tfx.release.continual import clip_features, sensitivity

    T, d, m0 = args.blocks, len(FEATURES), args.rows_per_block
    excess, newest, following = scores["excess"], scores["newest"], scores["following"]
    x, y, w_np = fits[0][t - 1]
    xs, ys, ws_np = fits[1][t - 1]
    for v, w in released.items():
        if MODELS[v][1]:  # measured on its window
            excess[v][trial, t - 1] = _excess(w, xs, ys, ws_np, min(t, args.window) * m0, args.lam)
        else:
            excess[v][trial, t - 1] = _excess(w, x, y, w_np, t * m0, args.lam)
    delta_t = sensitivity(_params(args, "continual"), t)
    w_scratch = grid_gaussian(w_np, delta_t, z_scratch * delta_t, rng=rng, cells=d)
    excess["scratch"][trial, t - 1] = _excess(w_scratch, x, y, w_np, t * m0, args.lam)
    xb, yb = clip_features(*data[t - 1], "logistic")  # the newest block: the paper's target window
    for v, w in {**released, "scratch": w_scratch, "non_private": w_np}.items():
        newest[v][trial, t - 1] = float(np.mean(np.logaddexp(0.0, -yb * (xb @ w))))
        if t < T:  # held out: the block that arrives next (what a deployed model meets)
            xn, yn = clip_features(*data[t], "logistic")
            following[v][trial, t - 1] = float(np.mean(np.logaddexp(0.0, -yn * (xn @ w))))


def _figures(
    args: argparse.Namespace,
    med: dict,
    scores: dict,
    last: tuple,
    loss_ratio: dict,
    charged: list,
    audit_ok: list,
    began: float,
) -> dict:
    """The benchmark's figures from the median excess risks (``med``) and the trials' scores."""
    T, d, m0 = args.blocks, len(FEATURES), args.rows_per_block
    releases, z_scratch = last
    newest, following = scores["newest"], scores["following"]
    variants = tuple(med)
    q = max(1, T // 4)
    out = {
        "data": f"REAL taxi trips: {T} blocks x {m0} rows (time order), big-tipper logistic regression, d={d}",
        "variant": args.variant,
        "epsilon": args.epsilon,
        "delta": args.delta,
        "lam": args.lam,
        "window": args.window,
        "trials": args.trials,
        "z_eff": _z_eff(args),
        "z": {v: rel.z for v, rel in releases.items()},
        "z_scratch_per_release": z_scratch,
        "excess_median_by_t": {v: [round(float(e), 6) for e in med[v]] for v in variants},
        "late_over_early_excess": {v: float(np.mean(med[v][-q:]) / np.mean(med[v][:q])) for v in variants},
        "mean_excess": {v: float(np.mean(med[v])) for v in variants},
        "mean_excess_t_ge_window": {v: float(np.mean(med[v][args.window - 1 :])) for v in variants},
        "newest_block_logloss_mean": {v: float(np.mean(newest[v])) for v in newest},
        "next_block_logloss_mean": {v: float(np.mean(following[v])) for v in following},
        "next_block_logloss_ratio_vs_non_private": {
            v: float(np.mean(following[v]) / np.mean(following["non_private"])) for v in variants
        },
        "newest_block_logloss_by_t": {v: [round(float(e), 4) for e in np.median(newest[v], axis=0)] for v in newest},
        "max_block_loss_over_bound": {v: float(max(r)) for v, r in loss_ratio.items()},
        "block_epsilon_charged": [float(min(charged)), float(max(charged))],
        "audit_ok": all(audit_ok),
        "seconds": round(time.time() - began, 1),
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }
    if "continual" in med:
        for name, part in (
            ("mean_excess", slice(None)),
            ("first_quarter", slice(None, q)),
            ("last_quarter", slice(-q, None)),
        ):
            key = "scratch_over_continual_" + name
            out[key] = float(np.mean(med["scratch"][part]) / np.mean(med["continual"][part]))
    return out


LABELS = {
    "continual": "continual (all history, infinite horizon)",
    "continual_sampled": "continual, sampled (App. B)",
    "sliding": "sliding window (w={w}, dyadic)",
    "sliding_sampled": "sliding window (w={w}), sampled (App. B)",
    "sliding_alg5": "sliding window (w={w}), Alg. 5 as written",
    "scratch": "re-train from scratch (horizon T declared)",
}


def plot(med: dict, figures: dict, path: str) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    for v, curve in med.items():
        t = np.arange(1, len(curve) + 1)
        ax.plot(t, np.maximum(curve, 1e-6), marker="o", ms=3, label=LABELS[v].format(w=figures["window"]))
    ax.set_yscale("log")
    ax.set_xlabel("block arrivals t")
    ax.set_ylabel("excess regularised risk vs non-private ERM")
    ax.set_title(f"REAL taxi, eps={figures['epsilon']} per record, delta={figures['delta']:g}")
    ax.legend(fontsize=8)
    save_figure(fig, path, dpi=120)
