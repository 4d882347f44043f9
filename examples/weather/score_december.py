"""Score the model `sage run examples/weather/pipeline.py` pushed on December 2013, beside non-private baselines.

    python examples/weather/score_december.py --serving-dir serving --train weather.csv --held-out december.csv \
        --window 2013-03-20 2013-11-30

The stream holds the REAL hourly weather of New York's airports from January to November 2013 (`weather.csv`,
written by export.py); December (`december.csv`) was never ingested: it is the hold-out. `--window` is the
first and last block of the ACCEPTed iteration (UTC days, as `sage run` printed them). This script reports, on
the December hours, the SLA's metric (the log loss of "it rains this hour", each loss clipped to ln(100)) and
the accuracy, for:

- the pushed DP model, called through its serving signature on tf.Examples of the raw rows (as the validator
  reads them);
- the public prior alone (a constant probability of 0.07: no data);
- a NON-PRIVATE constant: the rain rate of the window's rows;
- a NON-PRIVATE logistic regression on the same features (the same public ranges), fitted on the window's rows.

It prints one JSON object. Everything here reads data without privacy: an evaluation for the docs, never part
of a pipeline. (`sage score` does this in one command.)
"""

import argparse
import json
import math
import os
import sys

import numpy as np
import pandas as pd

import sage_tfx  # noqa: F401  (before TensorFlow)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from preprocessing import AIRPORTS, PUBLIC_RANGES, SPREAD  # noqa: E402
from trainer import FLOOR, PRIOR_RATE  # noqa: E402

LOSS_BOUND = math.log(1 / FLOOR)  # the SLA's loss bound, ln(100)


def features(frame: pd.DataFrame) -> np.ndarray:
    """The preprocessing_fn's features, in numpy, from raw rows."""

    def scaled(value, low, high):
        return (np.clip(value, low, high) - low) / (high - low) - 0.5

    raw = {c: frame[c].fillna(missing).to_numpy(float) for c, (_, _, missing) in PUBLIC_RANGES.items()}
    cols = [scaled(raw[c], low, high) for c, (low, high, _) in PUBLIC_RANGES.items()]
    cols.append(scaled(raw["temp"] - raw["dewp"], *SPREAD))
    cols += [(frame["origin"] == a).to_numpy(float) - 0.5 for a in AIRPORTS]
    return np.column_stack(cols)


def log_loss(y: np.ndarray, p: np.ndarray) -> tuple:
    """Mean log loss with each loss clipped to [0, LOSS_BOUND], and its standard error."""
    p = np.clip(p, 1e-7, 1 - 1e-7)
    losses = np.minimum(-(y * np.log(p) + (1 - y) * np.log1p(-p)), LOSS_BOUND)
    return float(losses.mean()), float(losses.std(ddof=1) / math.sqrt(len(losses)))


def logistic_fit(x: np.ndarray, y: np.ndarray, ridge: float = 1e-6, steps: int = 50) -> np.ndarray:
    """Non-private logistic regression by Newton's method (intercept first)."""
    x = np.column_stack([np.ones(len(x)), x])
    w = np.zeros(x.shape[1])
    for _ in range(steps):
        p = 1 / (1 + np.exp(-x @ w))
        hessian = x.T @ (x * (p * (1 - p))[:, None]) + ridge * np.eye(x.shape[1])
        w -= np.linalg.solve(hessian, x.T @ (p - y) + ridge * w)
    return w


def serve(serving_dir: str, frame: pd.DataFrame) -> np.ndarray:
    """The pushed model's probabilities on raw rows, through its serving signature on tf.Examples."""
    import tensorflow as tf

    from sage_tfx.pipelines import pushed_models

    newest = pushed_models(serving_dir)[-1]  # TFX's Pusher writes SERVING_DIR/VERSION
    signature = tf.saved_model.load(newest).signatures["serving_default"]
    records = []
    for row in frame.to_dict("records"):
        feature = {}
        for name, value in row.items():
            if name in ("rain", "time_hour") or (isinstance(value, float) and math.isnan(value)):
                continue  # the label is not an input; a missing value is an absent feature, as ingested
            if isinstance(value, str):
                feature[name] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[value.encode()]))
            elif isinstance(value, (int, np.integer)):
                feature[name] = tf.train.Feature(int64_list=tf.train.Int64List(value=[int(value)]))
            else:
                feature[name] = tf.train.Feature(float_list=tf.train.FloatList(value=[float(value)]))
        records.append(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
    out = [
        signature(examples=tf.constant(records[i : i + 4096]))["predictions"].numpy()
        for i in range(0, len(records), 4096)
    ]
    return np.concatenate(out)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--serving-dir", required=True, help="the pushed model (sage run --serving-dir)")
    parser.add_argument("--train", required=True, help="the CSV the stream was ingested from")
    parser.add_argument("--held-out", required=True, help="the held-out CSV (never ingested)")
    parser.add_argument(
        "--window",
        nargs=2,
        required=True,
        metavar=("FIRST", "LAST"),
        help="first and last block (UTC day, YYYY-MM-DD) of the ACCEPTed iteration",
    )
    args = parser.parse_args(argv)

    train, held = pd.read_csv(args.train), pd.read_csv(args.held_out)
    day = pd.to_datetime(train["time_hour"]).dt.strftime("%Y-%m-%d")
    window = train[(day >= args.window[0]) & (day <= args.window[1])]
    overlap = len(pd.merge(window, held, how="inner"))
    if overlap:
        raise SystemExit(f"{overlap} held-out row(s) are rows of the window: not a hold-out")
    y, y_window = held["rain"].to_numpy(float), window["rain"].to_numpy(float)
    w = logistic_fit(features(window), y_window)
    x = np.column_stack([np.ones(len(held)), features(held)])
    scored = {
        "the pushed DP model": serve(args.serving_dir, held),
        f"the public prior alone (constant {PRIOR_RATE})": np.full(len(held), PRIOR_RATE),
        "the window's rain rate, NOT private": np.full(len(held), y_window.mean()),
        "logistic regression on the window's rows, NOT private": 1 / (1 + np.exp(-x @ w)),
    }
    report = {
        "held_out_rows": len(held),
        "held_out_rain_rate": float(y.mean()),
        "window_rows": len(window),
        "window_rain_rate": float(y_window.mean()),
        "loss_bound": LOSS_BOUND,
        "overlapping_rows": overlap,
        "scores": {},
    }
    for name, p in scored.items():
        loss, se = log_loss(y, p)
        report["scores"][name] = {
            "log_loss": round(loss, 4),
            "se": round(se, 4),
            "accuracy": round(float(np.mean((p >= 0.5) == (y == 1))), 4),
            "mean_probability": round(float(np.mean(p)), 4),
        }
    print(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    main()
