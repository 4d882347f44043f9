"""Tab. 2: how often ACCEPTed DP models miss their target on held-out data (No SLA, NP, UC DP, Sage SLA).

Columns: ``no_sla``, ``non_private`` (NP SLA, the default bound on exact values), ``uncorrected`` (UC DP SLA: the
spec's DP test without its noise corrections, as in the paper), ``sage_spec`` (Sage SLA with the paper's App. B
bounds) and ``sage`` (Sage SLA with the default joint test of sage_tfx.validation.noisy).

Setting (a faithful numpy stand-in for the paper's experiment; the data is GENERATED, not the paper's):
rows are drawn from distributions fitted to the 15,002 real Chicago taxi trips shipped in the tfx wheel
(``tfx/examples/chicago_taxi_pipeline/data/simple/data.csv``): payment type, start hour and weekday from their
empirical frequencies; miles from a per-payment zero/log-normal mixture; log duration from a least-squares
fit on the real rows plus resampled real residuals; the big-tipper label (tip > 20% of fare) from a logistic
fit on the real rows. Two tasks, as in the issue:
- ``taxi_mse``: trip duration (hours, clipped to [0, 1]) by DP linear regression: the library's AdaSSP
  (``sage_tfx.privacy.adassp``, the core of DPLinearRegressor, with its exact Gaussian calibration) on the
  window's sufficient statistics; squared-error loss, B = 1; DPLossValidator.
- ``taxi_accuracy``: big tipper by DP logistic regression (objective perturbation, Chaudhuri et al. 2011);
  DPAccuracyValidator (Clopper-Pearson).
Each trial draws a target uniformly between the best achievable model and the naive model, then runs
privacy-adaptive training as Sage's iterator does it (the Sage paper §3.3): epsilon starts small and doubles while
it stays under the cap, then the window (90:10 train:test per record) doubles; at iteration i a DP model is
trained on the window's train rows with epsilon_i and validated on its test rows with epsilon_i at
eta_i = eta/(i(i+1)). The same models (same data, same training noise) face every validator; each validator
draws its own noise. An ACCEPTed model is re-evaluated on a held-out set (100K generated rows by default);
it violates when its held-out metric misses the target. Reported: violations / accepted per validator,
with a 95% Clopper-Pearson upper limit, beside the paper's numbers.
"""

import copy
import csv
import math
import sys
import time
from importlib import resources

import numpy as np

from sage_tfx import comma_lists
from sage_tfx.plots import pyplot, save_figure

from . import _validation_epsilons as sweep

PAPER_TABLE2 = {  # the Sage paper §5, Tab. 2: fraction of ACCEPTed models that violate their target (100K held-out)
    "taxi_mse": {
        "0.01": {"no_sla": 0.379, "non_private": 0.0019, "uncorrected": 0.0172, "sage": 0.0027},
        "0.05": {"no_sla": 0.379, "non_private": 0.0034, "uncorrected": 0.0224, "sage": 0.0051},
    },
    "criteo_accuracy": {
        "0.01": {"no_sla": 0.2515, "non_private": 0.0052, "uncorrected": 0.0544, "sage": 0.0018},
        "0.05": {"no_sla": 0.2515, "non_private": 0.0065, "uncorrected": 0.0556, "sage": 0.0023},
    },
}
MODES = ("no_sla", "non_private", "uncorrected", "sage_spec", "sage")
SPEC_BOUND = {True: "bernstein", False: "clopper_pearson"}  # the paper's App. B bounds (regression?: bound)
TASKS = ("taxi_mse", "taxi_accuracy")
DATA_PATH = "examples/chicago_taxi_pipeline/data/simple/data.csv"
HOUR_BANDS = np.array([0, 0, 0, 0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 5, 5, 5, 5, 0])  # 6 bands


def add_arguments(parser):
    parser.add_argument("--plot", metavar="FILE", help="write a PNG of the false-ACCEPT rates (the paper's §5.1)")
    parser.add_argument("--trials", type=int, default=250, help="models (targets) per task (default 250)")
    parser.add_argument(
        "--etas",
        type=comma_lists.positive_numbers,
        default="0.01,0.05",
        help="comma-separated eta = 1 - confidence values",
    )
    parser.add_argument(
        "--tasks", type=comma_lists.names, default=",".join(TASKS), help=f"comma-separated, from {TASKS}"
    )
    parser.add_argument(
        "--epsilon-start",
        type=float,
        default=0.05,
        help="first iteration's epsilon, for training and for validation each (default 0.05)",
    )
    parser.add_argument(
        "--epsilon-max",
        type=float,
        default=1.0,
        help="epsilon doubles while it stays <= this, then the window doubles (default 1.0)",
    )
    parser.add_argument("--delta", type=float, default=1e-6, help="delta of DP linear regression")
    parser.add_argument("--start-rows", type=int, default=10_000, help="first window size (train + test)")
    parser.add_argument("--max-iterations", type=int, default=9, help="iterations before TIMEOUT (default 9)")
    parser.add_argument("--holdout", type=int, default=100_000, help="held-out rows for re-evaluation")
    parser.add_argument(
        "--reference-rows",
        type=int,
        default=500_000,
        help="rows of the non-private fit that defines the best achievable metric",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the whole run (a benchmark, not a pipeline)")
    parser.add_argument(
        "--by-epsilon",
        type=comma_lists.positive_numbers,
        metavar="LIST",
        help="instead of Tab. 2: the paper's §5.1 over epsilon: for each epsilon in LIST (comma-separated), "
        "every iteration trains and validates at that fixed epsilon (the window doubles), and only No SLA "
        "(a plain TFX evaluator) and Sage SLA are compared; --plot then draws the rate against epsilon",
    )


# ---------------------------------------------------------------- generated taxi rows fitted to the real ones


def load_real_rows():
    """The real trips: dict of numpy arrays (payment 0 cash / 1 card / 2 other)."""

    with (resources.files("tfx") / DATA_PATH).open() as handle:
        rows = list(csv.DictReader(handle))

    def column(name):
        return np.array([float(r[name]) if r[name] not in ("", None) else np.nan for r in rows])

    payment = np.array([{"Cash": 0, "Credit Card": 1}.get(r["payment_type"], 2) for r in rows])
    data = {
        "payment": payment,
        "hour": column("trip_start_hour"),
        "day": column("trip_start_day"),
        "miles": column("trip_miles"),
        "seconds": column("trip_seconds"),
        "fare": column("fare"),
        "tips": column("tips"),
    }
    keep = np.all([np.isfinite(v) for v in data.values()], axis=0) & (data["fare"] > 0)
    return {k: v[keep] for k, v in data.items()}


def _duration_design(miles, hour, day, payment):
    lm = np.log1p(miles)
    return np.column_stack(
        [
            np.ones_like(lm),
            lm,
            miles == 0,
            np.eye(6)[HOUR_BANDS[hour]][:, 1:],
            (day == 1) | (day == 7),
            payment == 1,
            payment == 2,
        ]
    ).astype(float)


def _tipper_design(miles, seconds, hour, payment):
    return np.column_stack(
        [
            np.ones(len(miles)),
            payment == 1,
            payment == 2,
            np.log1p(miles),
            np.log1p(seconds),
            np.eye(6)[HOUR_BANDS[hour]][:, 1:],
        ]
    ).astype(float)


class TaxiGenerator:
    """Draws taxi-like rows from distributions fitted to the real trips (see the module docstring)."""

    def __init__(self, real):
        from scipy.optimize import minimize

        self.payment_p = np.bincount(real["payment"], minlength=3) / real["payment"].size
        self.hour_p = np.bincount(real["hour"].astype(int), minlength=24) / real["hour"].size
        self.day_p = np.bincount(real["day"].astype(int) - 1, minlength=7) / real["day"].size
        self.zero_miles, self.log_miles = [], []
        for p in range(3):
            miles = real["miles"][real["payment"] == p]
            self.zero_miles.append(np.mean(miles == 0))
            logs = np.log(miles[(miles > 0) & (miles < 100)])
            self.log_miles.append((logs.mean(), logs.std()))
        ok = (real["seconds"] >= 60) & (real["seconds"] <= 7200) & (real["miles"] < 100)
        hour, day, pay = real["hour"][ok].astype(int), real["day"][ok].astype(int), real["payment"][ok]
        design = _duration_design(real["miles"][ok], hour, day, pay)
        target = np.log(real["seconds"][ok])
        self.duration_coef, *_ = np.linalg.lstsq(design, target, rcond=None)
        self.duration_residuals = target - design @ self.duration_coef
        tip_design = _tipper_design(real["miles"][ok], real["seconds"][ok], hour, pay)
        label = (real["tips"][ok] > 0.2 * real["fare"][ok]).astype(float)

        def nll(w):
            z = tip_design @ w
            return np.mean(np.logaddexp(0, z) - label * z), tip_design.T @ (1 / (1 + np.exp(-z)) - label) / z.size

        self.tipper_coef = minimize(nll, np.zeros(tip_design.shape[1]), jac=True, method="L-BFGS-B").x

    def draw(self, n, rng):
        payment = rng.choice(3, n, p=self.payment_p)
        hour = rng.choice(24, n, p=self.hour_p)
        day = rng.choice(7, n, p=self.day_p) + 1
        mean, sd = np.array(self.log_miles)[payment].T
        miles = np.where(
            rng.random(n) < np.array(self.zero_miles)[payment], 0.0, np.minimum(np.exp(rng.normal(mean, sd)), 100.0)
        )
        log_seconds = _duration_design(miles, hour, day, payment) @ self.duration_coef + rng.choice(
            self.duration_residuals, n
        )
        seconds = np.exp(log_seconds)
        z = _tipper_design(miles, seconds, hour, payment) @ self.tipper_coef
        big_tipper = (rng.random(n) < 1 / (1 + np.exp(-z))).astype(float)
        return {
            "payment": payment,
            "hour": hour,
            "day": day,
            "miles": miles,
            "seconds": seconds,
            "big_tipper": big_tipper,
        }


# ---------------------------------------------------------------- model features (bounded norms for DP)


def regression_xy(rows):
    """x = [1, m, m^2, hour band one-hot (5), weekend, card] with m = log1p(miles)/log(101) in [0, 1]:
    ||x||^2 <= 6, so B_x = sqrt(6); y = duration in hours clipped to [0, 1] (B_y = 1)."""
    m = np.log1p(rows["miles"]) / math.log(101.0)
    x = np.column_stack(
        [
            np.ones_like(m),
            m,
            m * m,
            np.eye(6)[HOUR_BANDS[rows["hour"]]][:, 1:],
            (rows["day"] == 1) | (rows["day"] == 7),
            rows["payment"] == 1,
        ]
    ).astype(float)
    return x, np.minimum(rows["seconds"] / 3600.0, 1.0)


def classification_xy(rows):
    """x = [1, card, other, m, s, weekend] / sqrt(6) (||x|| <= 1), s = log1p(seconds)/log(7201) clipped."""
    m = np.log1p(rows["miles"]) / math.log(101.0)
    s = np.minimum(np.log1p(rows["seconds"]) / math.log(7201.0), 1.0)
    x = np.column_stack(
        [np.ones_like(m), rows["payment"] == 1, rows["payment"] == 2, m, s, (rows["day"] == 1) | (rows["day"] == 7)]
    ).astype(float) / math.sqrt(6.0)
    return x, rows["big_tipper"]


# ---------------------------------------------------------------- the logistic model (numpy, for 1000s of fits)


def logistic_minimiser(x, y, ridge=1e-3, tolerance=1e-12, max_steps=100, linear=None, start=None):
    """The minimiser of (1/n) sum log(1 + exp(-y' w.x)) + (ridge/2)||w||^2 + linear.w / n (labels y in {0, 1};
    ``linear`` defaults to 0), by damped Newton steps from ``start`` (default 0) until the gradient norm is below
    ``tolerance`` (the objective is ridge-strongly convex)."""
    n, d = x.shape
    w = np.zeros(d) if start is None else np.array(start, dtype=float)
    linear = np.zeros(d) if linear is None else linear

    def objective(w):
        z = x @ w
        return np.mean(np.logaddexp(0, z) - y * z) + ridge / 2 * w @ w + linear @ w / n

    value = objective(w)
    for _ in range(max_steps):
        p = 1 / (1 + np.exp(-(x @ w)))
        gradient = x.T @ (p - y) / n + ridge * w + linear / n
        if np.linalg.norm(gradient) < tolerance:
            break
        hessian = (x * (p * (1 - p))[:, None]).T @ x / n + ridge * np.eye(d)
        step, scale = np.linalg.solve(hessian, gradient), 1.0
        while objective(w - scale * step) > value and scale > 1e-10:  # backtrack when a full step overshoots
            scale /= 2
        if scale <= 1e-10:
            # No step decreases the objective: w is its minimiser to float precision (on millions of rows
            # the gradient's rounding floor can exceed ``tolerance``; looping on would only burn time).
            break
        w = w - scale * step
        value = objective(w)
    return w


def objective_perturbation(x, y, epsilon, rng, ridge=1e-3, start=None):
    """epsilon-DP L2-regularised logistic regression by objective perturbation (Chaudhuri, Monteleoni and
    Sarwate 2011, Alg. 2 and Thm. 9).

    Conditions: ||x|| <= 1 (``classification_xy``), the logistic loss l(z) = log(1 + e^{-z}) is convex with
    |l'| <= 1 and 0 <= l'' <= c = 1/4, neighbouring datasets of the same size n differ in one record, and the
    perturbed objective is minimised exactly (Newton to a 1e-12 gradient). With
        eps' = eps - ln(1 + 2c/(n ridge) + c^2/(n ridge)^2),
    if eps' > 0 no extra ridge is added; otherwise the ridge gets Delta = c/(n (e^{eps/4} - 1)) - ridge more and
    eps' = eps/2. Then b with density proportional to exp(-eps' ||b|| / 2) (norm ~ Gamma(d, 2/eps'), uniform
    direction) and w = argmin (1/n) sum l + ((ridge + Delta)/2)||w||^2 + b.w / n is epsilon-DP: the
    theorem bounds the density ratio of w on neighbouring datasets by e^{eps' } from b's density and by
    e^{eps - eps'} from the Jacobian of the map b -> w. The noise enters through the data's curvature rather
    than through the ridge alone, so it is far smaller than output perturbation's (Alg. 1) at these n.
    ``start`` (the unperturbed minimiser) only speeds up Newton.
    """
    n, d = x.shape
    c = 0.25
    eps_prime = epsilon - math.log(1 + 2 * c / (n * ridge) + (c / (n * ridge)) ** 2)
    extra = 0.0
    if eps_prime <= 0:
        extra = c / (n * (math.exp(epsilon / 4) - 1)) - ridge
        eps_prime = epsilon / 2
    direction = rng.normal(size=d)
    direction /= np.linalg.norm(direction)
    b = direction * rng.gamma(d, 2.0 / eps_prime)
    return logistic_minimiser(x, y, ridge=ridge + max(extra, 0.0), linear=b, start=start)


# ---------------------------------------------------------------- the experiment


class Task:
    """One task: features, a DP trainer, per-example values for the validator, a metric and its direction."""

    def __init__(self, name, args, held_out):
        self.name, self.args = name, args
        self.regression = name == "taxi_mse"
        self.features = regression_xy if self.regression else classification_xy
        self.held_x, self.held_y = self.features(held_out)

    def values(self, w, x, y):
        """Per-example squared errors (predictions clipped to [0, 1]) or 0/1 correctness."""
        if self.regression:
            return (np.clip(x @ w, 0.0, 1.0) - y) ** 2
        return ((x @ w >= 0) == (y == 1)).astype(float)

    def held_out_metric(self, w):
        return float(np.mean(self.values(w, self.held_x, self.held_y)))

    def violates(self, metric, target):
        return metric > target if self.regression else metric < target

    def validator(self, mode, eta, target, epsilon):
        """The validator of one Tab. 2 column. ``sage`` is the default (joint) test; ``sage_spec`` and
        ``uncorrected`` use the paper's App. B bounds with and without their noise corrections (the paper's UC DP SLA
        is the spec's test without the corrections); ``non_private`` the default bound on exact values."""
        from sage_tfx.validation import DPAccuracyValidator, DPLossValidator

        eps = None if mode == "non_private" else epsilon
        bound = {} if mode in ("sage", "non_private", "no_sla") else {"bound": SPEC_BOUND[self.regression]}
        mode = "sage" if mode == "sage_spec" else mode
        if self.regression:
            return DPLossValidator(target, eps, 1 - eta, loss_bound=1.0, mode=mode, **bound)
        return DPAccuracyValidator(target, eps, 1 - eta, mode=mode, **bound)

    def reference(self, generator, rng):
        """(best achievable, naive) held-out metric: a non-private fit on --reference-rows rows; the mean /
        majority."""
        x, y = self.features(generator.draw(self.args.reference_rows, rng))
        if self.regression:
            w = np.linalg.lstsq(x, y, rcond=None)[0]
            naive = float(np.mean((self.held_y - y.mean()) ** 2))
        else:
            w = logistic_minimiser(x, y, ridge=1e-6)  # the non-private fit
            naive = float(max(self.held_y.mean(), 1 - self.held_y.mean()))
        return self.held_out_metric(w), naive

    def fit(self, x, y):
        """The data-dependent part of training, shared by the iterations on one window: (X'X, X'y) for the
        regression; for the logistic model the rows and the unperturbed minimiser (a warm start)."""
        if self.regression:
            return x.T @ x, x.T @ y
        return x, y, logistic_minimiser(x, y)

    def release(self, fitted, epsilon, n, rng):
        """The DP model from ``fit``'s output at this iteration's epsilon (fresh noise each iteration)."""
        if self.regression:
            from sage_tfx.privacy import adassp  # the library's DP linear regression (DPLinearRegressor's core)

            return adassp.release(
                *fitted, epsilon, self.args.delta, math.sqrt(6.0), 1.0, calibration="exact", rng=rng
            ).theta
        x, y, minimiser = fitted
        return objective_perturbation(x, y, epsilon, rng, start=minimiser)


def schedule(args):
    """[(epsilon_i, window_i)]: Sage's doubling (the Sage paper §3.3): double epsilon while 2 eps <= the cap,
    else double the window."""
    epsilon, window, steps = args.epsilon_start, args.start_rows, []
    for _ in range(args.max_iterations):
        steps.append((epsilon, window))
        if 2 * epsilon <= args.epsilon_max:
            epsilon *= 2
        else:
            window *= 2
    return steps


TARGET_BINS = 3  # targets by their fraction of the way from the naive metric to the best: easy, middle, hard


def run_task(task, generator, etas, rng, modes=MODES, reference=None):
    """(best, naive, counts): per (mode, eta), the models ACCEPTed, how many miss their target on the held-out
    rows, the iterations spent, and ``by_target``: [accepted, violations] per third of the target range.
    ``reference``: (best, naive) already measured (else ``task.reference`` on fresh rows)."""
    best, naive = reference or task.reference(generator, rng)
    configs = [(mode, eta) for eta in etas for mode in modes]
    counts = {
        c: {"accepted": 0, "violations": 0, "iterations": 0, "by_target": [[0, 0] for _ in range(TARGET_BINS)]}
        for c in configs
    }
    steps = schedule(task.args)
    started = time.time()
    for trial in range(task.args.trials):
        target = float(rng.uniform(min(best, naive), max(best, naive)))
        fraction = (naive - target) / (naive - best)
        target_bin = min(TARGET_BINS - 1, int(fraction * TARGET_BINS))  # 0: near the naive metric (easy)
        pending = set(configs)
        x = np.empty((0, task.held_x.shape[1]))
        y, is_test, fitted = np.empty(0), np.empty(0, bool), None
        for i, (epsilon, window) in enumerate(steps, start=1):
            if window > y.size:  # the window grew: new rows, new fit
                x_new, y_new = task.features(generator.draw(window - y.size, rng))
                x, y = np.vstack([x, x_new]), np.concatenate([y, y_new])
                is_test = np.concatenate([is_test, rng.random(y_new.size) < 0.1])
                fitted = task.fit(x[~is_test], y[~is_test])
            w = task.release(fitted, epsilon, int((~is_test).sum()), rng)
            test_values = task.values(w, x[is_test], y[is_test])
            held_metric = None
            for mode, eta in sorted(pending):
                result = task.validator(mode, eta, target, epsilon).validate(test_values, rng=rng, attempt=i)
                if result.accepted:
                    held_metric = task.held_out_metric(w) if held_metric is None else held_metric
                    counts[(mode, eta)]["accepted"] += 1
                    counts[(mode, eta)]["violations"] += task.violates(held_metric, target)
                    counts[(mode, eta)]["iterations"] += i
                    counts[(mode, eta)]["by_target"][target_bin][0] += 1
                    counts[(mode, eta)]["by_target"][target_bin][1] += task.violates(held_metric, target)
                    pending.discard((mode, eta))
            if not pending:
                break
        if (trial + 1) % max(1, task.args.trials // 10) == 0:
            print(
                f"[bench validation] {task.name}: {trial + 1}/{task.args.trials} trials "
                f"({time.time() - started:.0f} s)",
                file=sys.stderr,
                flush=True,
            )
    return best, naive, counts


def _upper95(violations, accepted):
    from sage_tfx.validation import clopper_pearson_upper

    return clopper_pearson_upper(violations, accepted, 0.05) if accepted else None


def run(args):
    etas, tasks = args.etas, args.tasks
    for name in tasks:
        if name not in TASKS:
            raise ValueError(f"task {name!r} is not one of {TASKS}")
    if not 0 < args.epsilon_start <= args.epsilon_max < float("inf"):
        raise ValueError(f"need 0 < epsilon_start ({args.epsilon_start}) <= epsilon_max ({args.epsilon_max}) < inf")
    if args.trials < 1 or args.max_iterations < 1 or args.start_rows < 100:
        raise ValueError(
            f"need trials >= 1 ({args.trials}), max_iterations >= 1 ({args.max_iterations}), "
            f"start_rows >= 100 ({args.start_rows})"
        )
    rng = np.random.default_rng(args.seed)
    started = time.time()
    generator = TaxiGenerator(load_real_rows())
    held_out = generator.draw(args.holdout, rng)
    if getattr(args, "by_epsilon", None):
        return run_by_epsilon(args, tasks, etas, generator, held_out, rng, started)
    figures = {
        "data": (
            "GENERATED rows from distributions fitted to the 15,002 real Chicago taxi trips in the tfx "
            "wheel; the paper used 37M NYC taxi rides (MSE) and Criteo (accuracy)"
        ),
        "settings": {
            "trials": args.trials,
            "etas": etas,
            "epsilon_start": args.epsilon_start,
            "epsilon_max": args.epsilon_max,
            "schedule (epsilon, window)": schedule(args),
            "epsilon_use": "each iteration: epsilon_i for training, epsilon_i for validation",
            "delta": args.delta,
            "start_rows": args.start_rows,
            "max_iterations": args.max_iterations,
            "held_out_rows": args.holdout,
            "reference_rows": args.reference_rows,
            "seed": args.seed,
            "train_test": "90:10 per record",
            "eta_schedule": "eta/(i(i+1)) at iteration i",
        },
        "paper_table2": PAPER_TABLE2,
    }
    for name in tasks:
        best, naive, counts = run_task(Task(name, args, held_out), generator, etas, rng)
        table = {}
        for (mode, eta), c in counts.items():
            rate = c["violations"] / c["accepted"] if c["accepted"] else None
            table.setdefault(str(eta), {})[mode] = {
                "violation_rate": rate,
                "violations": c["violations"],
                "accepted": c["accepted"],
                "accept_rate": c["accepted"] / args.trials,
                "violation_rate_upper95": _upper95(c["violations"], c["accepted"]),
                "mean_iterations_to_accept": c["iterations"] / c["accepted"] if c["accepted"] else None,
            }
        figures[name] = {"best_metric": best, "naive_metric": naive, "table2": table}
        paper = PAPER_TABLE2["taxi_mse" if name == "taxi_mse" else "criteo_accuracy"]
        figures[f"{name}_summary"] = {
            eta: {
                mode: f"{row[mode]['violation_rate'] if row[mode]['violation_rate'] is not None else float('nan'):.4f}"
                f" ({row[mode]['violations']}/{row[mode]['accepted']}; paper "
                f"{paper.get(eta, {}).get(mode.replace('sage_spec', 'sage'), 'n/a')})"
                for mode in MODES
            }
            for eta, row in table.items()
        }
    if getattr(args, "plot", None):
        plot(figures, tasks, etas, args.plot)
        figures["plot"] = args.plot
    figures["seconds"] = round(time.time() - started, 1)
    return figures


def run_by_epsilon(args, tasks, etas, generator, held_out, rng, started):
    """The figures of ``--by-epsilon``: per task and epsilon, No SLA's and Sage SLA's false-ACCEPT rates
    (``_validation_epsilons``), each epsilon on fresh trials against the task's one reference."""
    epsilons = args.by_epsilon
    figures = {"data": "GENERATED taxi rows (as Tab. 2)", "settings": sweep.settings(args, etas, epsilons)}
    for name in tasks:
        reference = Task(name, args, held_out).reference(generator, rng)
        rows = {}
        for epsilon in epsilons:
            fixed = copy.copy(args)
            fixed.epsilon_start = fixed.epsilon_max = epsilon
            _, _, counts = run_task(Task(name, fixed, held_out), generator, etas, rng, sweep.MODES, reference)
            rows[str(epsilon)] = sweep.summarize(counts, args.trials)
        figures[name] = {"best_metric": reference[0], "naive_metric": reference[1], "by_epsilon": rows}
    if getattr(args, "plot", None):
        sweep.plot(figures, tasks, etas, epsilons, args.plot)
        figures["plot"] = args.plot
    figures["seconds"] = round(time.time() - started, 1)
    return figures


LABELS = {
    "no_sla": "No SLA\n(TFX evaluator)",
    "non_private": "NP SLA",
    "uncorrected": "UC DP SLA",
    "sage_spec": "Sage SLA\n(paper bounds)",
    "sage": "Sage SLA",
}


def plot(figures, tasks, etas, path):
    """The paper's §5.1 claim as its own figure: per task and eta, the false-ACCEPT rate (ACCEPTed models that
    miss their target on the held-out rows) of each validator, with its 95% Clopper-Pearson upper limit, the
    eta line, and the paper's No SLA rate."""
    plt = pyplot()
    fig, axes = plt.subplots(1, len(tasks), figsize=(6 * len(tasks), 4.2), squeeze=False)
    for ax, name in zip(axes[0], tasks):
        width = 0.8 / len(etas)
        for j, eta in enumerate(etas):
            row = figures[name]["table2"][str(eta)]
            rates = [row[m]["violation_rate"] or 0.0 for m in MODES]
            uppers = [row[m]["violation_rate_upper95"] or 0.0 for m in MODES]
            xs = np.arange(len(MODES)) + (j - (len(etas) - 1) / 2) * width
            ax.bar(
                xs,
                rates,
                width,
                yerr=[[0] * len(MODES), np.maximum(0, np.subtract(uppers, rates))],
                capsize=3,
                label=f"eta = {eta:g}",
                color=f"C{j}",
            )
            ax.hlines(eta, xs[0] - width / 2, xs[-1] + width / 2, colors=f"C{j}", linestyles=":")
        paper = PAPER_TABLE2["taxi_mse" if name == "taxi_mse" else "criteo_accuracy"]["0.05"]["no_sla"]
        ax.plot([0], [paper], "k*", markersize=10, label=f"paper's No SLA ({paper:.1%})")
        ax.set_xticks(np.arange(len(MODES)), [LABELS[m] for m in MODES], fontsize=8)
        ax.set(ylabel="false-ACCEPT rate (among ACCEPTed)", title=f"{name} (GENERATED taxi rows)")
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize=8)
    save_figure(fig, path)
