"""Quality against epsilon of each DP model on the real taxi trips, vs the same model without DP in the same run.

Data: the 15,002 REAL Chicago taxi trips of the tfx wheel (``big_tipper`` file), rows with every field used,
split 80:20 at random (fixed seed). Features: miles (clipped to 30, /10), seconds (clipped to 7200, /1800),
one-hot hour (24), day of week (7) and payment type (5 most common + other): 39 columns.
Tasks: fare regression (fare clipped to $100, /10; MSE on the test rows) with DPLinearRegressor (AdaSSP; the
baseline is exact least squares) and DPDNNRegressor (64/32; the baseline is the same network and SGD loop
without clipping or noise); big_tipper classification (test accuracy) with DPLogisticRegressor and
DPDNNClassifier (64/32), baselines likewise. AdaSSP clips rows to L2 norm 2 (public bound) and labels to
[0, 10]. DP-SGD: batch 256, lr 0.05, momentum 0.9, clip 1; it calibrates on the true training-set size here
(a benchmark on public data; pipelines use the ledger's DP count). delta = 1e-5. Each point is the median
over --seeds seeds; the ratio is DP MSE / non-DP MSE (regression) or DP accuracy / non-DP accuracy.
"""

import sys

import numpy as np

from sage_tfx import comma_lists
from sage_tfx.plots import pyplot, save_figure

EPSILONS = (0.1, 0.3, 1.0, 3.0, 10.0)
MODELS = ("linear", "dnn_regressor", "logistic", "dnn_classifier")
PAYMENTS = ("Cash", "Credit Card", "No Charge", "Unknown", "Dispute")


def add_arguments(parser):
    parser.add_argument(
        "--epsilons",
        type=comma_lists.positive_numbers,
        default=",".join(str(e) for e in EPSILONS),
        help="comma list of epsilons (default 0.1,0.3,1,3,10)",
    )
    parser.add_argument(
        "--models", type=comma_lists.names, default=",".join(MODELS), help=f"comma list of {','.join(MODELS)}"
    )
    parser.add_argument("--seeds", type=int, default=3, help="seeds per point, median taken (default 3)")
    parser.add_argument("--epochs", type=int, default=5, help="epochs of SGD, DP and non-DP (default 5)")
    parser.add_argument("--plot", default=None, help="write the quality-vs-epsilon figure to this PNG")


def taxi_task_data(seed=0):
    """(x_train, fare_train, tipper_train, x_test, fare_test, tipper_test) from the real trips."""
    table, train, test = taxi_split(seed)
    x, fare, tipper = _taxi_xy(table)
    return x[train], fare[train], tipper[train], x[test], fare[test], tipper[test]


def taxi_split(seed=0):
    """(table, train row indices, test row indices): the real trips (big_tipper file, 15,002 distinct rows) with
    every used field, split 80:20 at random. The test rows are the held-out set: no row is on both sides."""

    from sage_tfx.data.taxi import load_taxi

    table = load_taxi("big_tipper")
    used = _taxi_columns(table)
    complete = [i for i in range(table.num_rows) if all(v[i] is not None for v in used.values())]
    table = table.take(np.array(complete, dtype=np.int64))
    perm = np.random.default_rng(seed).permutation(table.num_rows)
    cut = int(0.8 * table.num_rows)
    return table, perm[:cut], perm[cut:]


def _taxi_columns(table):
    return {
        k: table[k].to_pylist()
        for k in (
            "trip_miles",
            "trip_seconds",
            "trip_start_hour",
            "trip_start_day",
            "payment_type",
            "fare",
            "big_tipper",
        )
    }


def _taxi_xy(table):
    """(features, fare, big_tipper) of every row of ``table`` (rows with every used field)."""

    cols = _taxi_columns(table)
    feats, fares, tippers = [], [], []
    for i in range(table.num_rows):
        row = {k: v[i] for k, v in cols.items()}
        f = np.zeros(39, np.float32)
        f[0] = min(row["trip_miles"], 30.0) / 10.0
        f[1] = min(row["trip_seconds"], 7200.0) / 1800.0
        f[2 + int(row["trip_start_hour"])] = 1.0
        f[26 + int(row["trip_start_day"]) - 1] = 1.0
        pay = row["payment_type"]
        f[33 + (PAYMENTS.index(pay) if pay in PAYMENTS else len(PAYMENTS))] = 1.0
        feats.append(f)
        fares.append(min(float(row["fare"]), 100.0) / 10.0)
        tippers.append(int(row["big_tipper"]))
    return np.array(feats), np.array(fares, np.float32), np.array(tippers, np.int32)


def plain_sgd_step(model, per_example_loss, learning_rate, momentum=0.9, input_signature=None):
    """A traced non-private step of SGD + momentum on the batch's mean loss (no clipping, no noise): the
    baseline the DP runs are compared with. ``input_signature``: (x, y) specs, traced once (timing)."""
    import tensorflow as tf

    optimizer = tf.keras.optimizers.SGD(learning_rate=learning_rate, momentum=momentum)

    @tf.function(reduce_retracing=True, input_signature=input_signature)
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(per_example_loss(y, model(x, training=True)))
        variables = model.trainable_variables
        optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))

    return step


def _nondp_sgd(x, y, xt, hidden, outputs, loss, epochs, batch, lr, seed):
    """The DP models' network and SGD + momentum loop without clipping or noise; test outputs (raw)."""
    import numpy as np

    from sage_tfx.models.dpsgd_models import build_mlp

    model = build_mlp(x.shape[1], hidden, outputs, seed=seed)
    step = plain_sgd_step(model, loss, lr)
    rng = np.random.default_rng(seed)
    for _ in range(epochs):
        perm = rng.permutation(len(x))
        for i in range(0, len(x), batch):
            step(x[perm[i : i + batch]], y[perm[i : i + batch]])
    return model(xt).numpy()


def _quality(model_name, epsilon, data, epochs, seed):
    """Test metric of one model at one epsilon (None: non-private)."""
    import numpy as np

    from sage_tfx.models import DPDNNClassifier, DPDNNRegressor, DPLinearRegressor, DPLogisticRegressor
    from sage_tfx.models.dpsgd_models import _mse, _sigmoid_xent, _softmax_xent

    x, fare, tipper, xt, fare_t, tipper_t = data
    budget, n = (epsilon, 1e-5), len(x)
    sgd = dict(num_examples=n, epochs=epochs, batch_size=256, learning_rate=0.05, clip_norm=1.0, seed=seed)
    if model_name == "linear":
        if epsilon is None:
            design = np.c_[x, np.ones(n)]
            theta = np.linalg.lstsq(design, fare, rcond=None)[0]
            pred = np.c_[xt, np.ones(len(xt))] @ theta
        else:
            pred = DPLinearRegressor(budget, feature_bound=2.0, label_range=(0, 10), seed=seed).fit(x, fare).predict(xt)
        return float(np.mean((pred - fare_t) ** 2))
    if model_name == "dnn_regressor":
        if epsilon is None:
            pred = _nondp_sgd(x, fare, xt, (64, 32), 1, _mse, epochs, 256, 0.05, seed).reshape(-1)
        else:
            pred = DPDNNRegressor(budget, hidden_units=(64, 32), **sgd).fit(x, fare).predict(xt)
        return float(np.mean((pred - fare_t) ** 2))
    if model_name == "logistic":
        if epsilon is None:
            logits = _nondp_sgd(
                x, tipper.astype(np.float32), xt, (), 1, _sigmoid_xent, epochs, 256, 0.05, seed
            ).reshape(-1)
            pred = (logits > 0).astype(np.int32)
        else:
            pred = DPLogisticRegressor(budget, **sgd).fit(x, tipper).predict(xt)
        return float(np.mean(pred == tipper_t))
    if epsilon is None:
        logits = _nondp_sgd(x, tipper, xt, (64, 32), 2, _softmax_xent, epochs, 256, 0.05, seed)
        pred = np.argmax(logits, axis=1)
    else:
        pred = DPDNNClassifier(budget, hidden_units=(64, 32), n_classes=2, **sgd).fit(x, tipper).predict(xt)
    return float(np.mean(pred == tipper_t))


METRIC = {"linear": "mse", "dnn_regressor": "mse", "logistic": "accuracy", "dnn_classifier": "accuracy"}


def run(args):

    import sage_tfx  # noqa: F401  (before TensorFlow)

    epsilons, models = args.epsilons, args.models
    for m in models:
        if m not in MODELS:
            raise SystemExit(f"--models: {m!r} is not one of {MODELS}")
    if args.seeds < 1:
        raise SystemExit(f"--seeds {args.seeds} must be >= 1")
    data = taxi_task_data()
    figures = {
        "data": f"real taxi trips (tfx wheel, big_tipper file): {len(data[0])} train / {len(data[3])} test "
        f"rows, {data[0].shape[1]} features",
        "delta": 1e-5,
        "epochs": args.epochs,
        "seeds": args.seeds,
    }
    trivial_mse = float(np.mean((data[4] - data[1].mean()) ** 2))
    majority = float(max(np.mean(data[5]), 1 - np.mean(data[5])))
    for name in models:
        print(f"[{name}] non-private baseline", file=sys.stderr, flush=True)
        base = float(np.median([_quality(name, None, data, args.epochs, s) for s in range(args.seeds)]))
        row = {
            "metric": METRIC[name],
            "nonprivate": round(base, 4),
            "trivial": round(trivial_mse if METRIC[name] == "mse" else majority, 4),
            "dp": {},
            "ratio": {},
        }
        for eps in epsilons:
            print(f"[{name}] epsilon {eps:g}", file=sys.stderr, flush=True)
            value = float(np.median([_quality(name, eps, data, args.epochs, s) for s in range(args.seeds)]))
            row["dp"][f"{eps:g}"] = round(value, 4)
            row["ratio"][f"{eps:g}"] = round(value / base, 3)
        figures[name] = row
    if args.plot:
        plot(figures, models, epsilons, args.plot)
        figures["plot"] = args.plot
    return figures


def plot(figures, models, epsilons, path):
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    titles = {
        "mse": "fare regression: test MSE (fare/10)^2, lower is better",
        "accuracy": "big_tipper classification: test accuracy",
    }
    for ax, metric in zip(axes, ("mse", "accuracy")):
        for i, name in enumerate(m for m in models if METRIC[m] == metric):
            row = figures[name]
            ax.plot(epsilons, [row["dp"][f"{e:g}"] for e in epsilons], "o-", color=f"C{i}", label=f"{name} (DP)")
            ax.axhline(row["nonprivate"], color=f"C{i}", ls="--", lw=1, label=f"{name} non-private")
        trivial = next((figures[m]["trivial"] for m in models if METRIC[m] == metric), None)
        if trivial is not None:
            ax.axhline(trivial, color="gray", ls=":", lw=1, label="constant predictor")
        ax.set_xscale("log")
        ax.set_xlabel("epsilon (delta = 1e-5)")
        ax.set_title(titles[metric], fontsize=10)
        ax.legend(fontsize=8)
    fig.suptitle("DP models on the real taxi trips (same rows, same run)", fontsize=11)
    save_figure(fig, path)
