"""DP-SGD noise schedules (step / exponential / polynomial / bound-optimal decay) vs constant sigma at EQUAL epsilon on real taxi trips.

Data: the 15,002 REAL Chicago taxi trips of the tfx wheel, the split and 39 features of ``sage bench dp-quality``
(sage_tfx.bench.dp_quality.taxi_task_data: 80:20 at random, fixed seed). Tasks: fare regression with
DPDNNRegressor (64/32; test MSE) and, with ``--models dnn_classifier``, big_tipper with DPDNNClassifier (64/32;
test accuracy). DP-SGD: batch 256, lr 0.05, momentum 0.9, clip 1, --epochs passes, delta 1e-5, calibrated on the
training-set size (public data here; pipelines use the ledger's DP count).

Every schedule runs at the SAME (epsilon, delta), steps and batch: its scale is calibrated (dp_accounting's
calibrate_dp_mechanism on the composition of the per-step Poisson-sampled Gaussian events) so the whole run
spends the budget; the realised epsilon of each is reported. Schedules (sage_tfx.privacy.noise_schedules,
10 stages): constant (the baseline), step (x0.5 at 2 points), exponential (last sigma 0.3 of the first),
polynomial (power 2, last 0.3), bound_optimal (Hong et al. Lemma 3.1, sigma_t ~ gamma^(t/4), gamma set so the
last sigma is 0.5 of the first: the condition number is unknown). Each seed gives every schedule the same
initial weights, batches and noise generator (paired); ``ratio`` = median over seeds of schedule metric /
constant metric of the same seed (< 1 is better for MSE, > 1 better for accuracy).

``--regime full-batch``: the paper's own regime (Theorem 3.2): full-batch noisy GD with step 1/M on
L2-regularised logistic regression (strongly convex, condition number kappa) over the same real training
rows, T = each of ``--t-over-kappa`` times kappa, every schedule at the same zCDP budget; the metric is the
excess empirical risk (sage_tfx.bench._full_batch_gd says exactly how).
"""

import sys

import numpy as np

from sage_tfx import comma_lists
from sage_tfx.bench._full_batch_gd import run_full_batch
from sage_tfx.plots import pyplot, save_figure

MODELS = ("dnn_regressor", "dnn_classifier")
SCHEDULES = ("constant", "step", "exponential", "polynomial", "bound_optimal")
DEFAULT_PLOT = "docs/img/noise_schedule.png"
REGIMES = ("subsampled", "full-batch")


def add_arguments(parser):
    parser.add_argument("--epsilon", type=float, default=1.0, help="the budget of every run (default 1)")
    parser.add_argument(
        "--models", type=comma_lists.names, default="dnn_regressor", help=f"comma list of {','.join(MODELS)}"
    )
    parser.add_argument(
        "--schedules", type=comma_lists.names, default=",".join(SCHEDULES), help=f"comma list of {','.join(SCHEDULES)}"
    )
    parser.add_argument("--seeds", type=int, default=3, help="seeds (paired across schedules; default 3)")
    parser.add_argument("--epochs", type=int, default=3, help="epochs of DP-SGD (default 3)")
    parser.add_argument("--rows", type=int, default=0, help="use only this many training rows (0: all)")
    parser.add_argument("--plot", default=DEFAULT_PLOT, help=f"PNG to write ('' for none; default {DEFAULT_PLOT})")
    parser.add_argument(
        "--regime",
        default="subsampled",
        choices=REGIMES,
        help="subsampled DP-SGD on the taxi DNNs (default) or full-batch GD on a strongly convex "
        "logistic regression (the paper's regime)",
    )
    parser.add_argument("--lam", type=float, default=0.01, help="full-batch: the L2 weight (mu; default 0.01)")
    parser.add_argument(
        "--t-over-kappa",
        type=comma_lists.positive_numbers,
        default="2,8,32",
        help="full-batch: run lengths T / kappa (default 2,8,32)",
    )
    parser.add_argument(
        "--floor", type=float, default=1e-8, help="full-batch: the floor of the bound-optimal schedule (default 1e-8)"
    )
    parser.add_argument(
        "--momentum",
        action="store_true",
        help="full-batch: also run each schedule through debiased momentum (Hong et al. Alg. 2)",
    )


def make_schedules(names, steps):
    """The compared schedules, by name (bound_optimal's gamma from the run's step count)."""
    from sage_tfx.privacy import noise_schedules as ns

    table = {
        "constant": lambda: ns.ConstantSchedule(),
        "step": lambda: ns.StepSchedule(factor=0.5, drops=2),
        "exponential": lambda: ns.ExponentialSchedule(final_ratio=0.3),
        "polynomial": lambda: ns.PolynomialSchedule(final_ratio=0.3, power=2.0),
        # the last stage starts at step ceil(9 T / 10): gamma^(t/4) = 0.5 there
        "bound_optimal": lambda: ns.BoundOptimalSchedule(gamma=0.5 ** (4.0 / max(1.0, -(-9 * steps // 10)))),
    }
    for name in names:
        if name not in table:
            raise SystemExit(f"--schedules: {name!r} is not one of {SCHEDULES}")
    return {name: table[name]() for name in names}


def _fit(model_name, schedule, epsilon, data, epochs, seed):
    """(test metric, privacy_spent) of one DP model trained with one schedule."""

    from sage_tfx.models import DPDNNClassifier, DPDNNRegressor

    x, fare, tipper, xt, fare_t, tipper_t = data
    sgd = dict(
        num_examples=len(x),
        epochs=epochs,
        batch_size=256,
        learning_rate=0.05,
        clip_norm=1.0,
        seed=seed,
        noise_schedule=schedule,
    )
    if model_name == "dnn_regressor":
        est = DPDNNRegressor((epsilon, 1e-5), hidden_units=(64, 32), **sgd).fit(x, fare)
        return float(np.mean((est.predict(xt) - fare_t) ** 2)), est.privacy_spent
    est = DPDNNClassifier((epsilon, 1e-5), hidden_units=(64, 32), n_classes=2, **sgd).fit(x, tipper)
    return float(np.mean(est.predict(xt) == tipper_t)), est.privacy_spent


def run(args):

    import sage_tfx  # noqa: F401  (before TensorFlow)
    from sage_tfx.bench.dp_quality import taxi_task_data
    from sage_tfx.privacy import dpsgd

    models = args.models
    for m in models:
        if m not in MODELS:
            raise SystemExit(f"--models: {m!r} is not one of {MODELS}")
    if args.seeds < 1 or args.epochs < 1 or args.rows < 0 or not args.epsilon > 0:
        raise SystemExit("--seeds and --epochs must be >= 1, --rows >= 0, --epsilon > 0")
    data = list(taxi_task_data())
    if args.regime == "full-batch":
        if not args.lam > 0:
            raise SystemExit(f"--lam={args.lam!r} must be > 0")
        return run_full_batch(args, data[:3] if not args.rows else [d[: args.rows] for d in data[:3]])
    if args.rows:
        for i in range(3):
            data[i] = data[i][: args.rows]
    n = len(data[0])
    steps = dpsgd.num_steps(n, 256, args.epochs)
    schedules = make_schedules(args.schedules, steps)
    if "constant" not in schedules:
        raise SystemExit("--schedules must include constant (the baseline)")
    figures = {
        "data": f"real taxi trips (tfx wheel, big_tipper file): {n} train / {len(data[3])} test rows, "
        f"{data[0].shape[1]} features",
        "epsilon": args.epsilon,
        "delta": 1e-5,
        "epochs": args.epochs,
        "steps": steps,
        "batch_size": 256,
        "seeds": args.seeds,
        "schedules": {k: v.describe() for k, v in schedules.items()},
    }
    curves = {}
    for name in models:
        metric = "mse" if name == "dnn_regressor" else "accuracy"
        values = {s: [] for s in schedules}
        spent = {}
        for seed in range(args.seeds):
            for sname, sched in schedules.items():
                print(f"[{name}] seed {seed} schedule {sname}", file=sys.stderr, flush=True)
                value, ps = _fit(name, sched, args.epsilon, data, args.epochs, seed)
                values[sname].append(value)
                spent[sname] = ps
        base = np.array(values["constant"])
        row = {
            "metric": metric,
            "median": {},
            "ratio_vs_constant": {},
            "wins_vs_constant": {},
            "realised_epsilon": {},
            "first_sigma": {},
            "last_sigma": {},
        }
        for sname in schedules:
            v = np.array(values[sname])
            row["median"][sname] = round(float(np.median(v)), 4)
            row["ratio_vs_constant"][sname] = round(float(np.median(v / base)), 4)
            better = v < base if metric == "mse" else v > base
            row["wins_vs_constant"][sname] = f"{int(better.sum())}/{len(v)}"
            ps = spent[sname]
            row["realised_epsilon"][sname] = round(float(ps["epsilon"]), 5)
            report = ps.get("noise_schedule")
            row["first_sigma"][sname] = round(float(ps["noise_multiplier"]), 4)
            row["last_sigma"][sname] = round(float(report["last_sigma"] if report else ps["noise_multiplier"]), 4)
            curves.setdefault(sname, (report["stages"] if report else [[ps["noise_multiplier"], ps["steps"]]]))
        row["values"] = {k: [round(x, 4) for x in v] for k, v in values.items()}
        figures[name] = row
    if args.plot:
        plot(figures, models, curves, args.plot)
        figures["plot"] = args.plot
    return figures


def plot(figures, models, curves, path):

    plt = pyplot()
    fig, axes = plt.subplots(1, 1 + len(models), figsize=(5 * (1 + len(models)), 4))
    ax = axes[0]
    for sname, stages in curves.items():
        sig = np.concatenate([np.full(int(k), float(s)) for s, k in stages])
        ax.step(np.arange(len(sig)), sig, where="post", label=sname)
    ax.set_xlabel("step")
    ax.set_ylabel("noise multiplier sigma_t")
    ax.set_title(f"calibrated to epsilon={figures['epsilon']:g}, delta=1e-5")
    ax.legend(fontsize=8)
    for ax, name in zip(axes[1:], models):
        row = figures[name]
        names = list(row["values"])
        for i, sname in enumerate(names):
            v = row["values"][sname]
            ax.scatter([i] * len(v), v, color="grey", s=12)
            ax.scatter([i], [row["median"][sname]], color="C3", marker="_", s=400)
        ax.set_xticks(range(len(names)))
        ax.set_xticklabels(names, rotation=30, fontsize=8)
        ax.set_ylabel(f"test {row['metric']} (real taxi trips)")
        ax.set_title(f"{name}: seeds (grey), median (red)")
    save_figure(fig, path, dpi=100)
