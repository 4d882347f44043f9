"""The main job (`make demo`): privacy-adaptive training on the real Chicago taxi trips, end to end.

The real trips before HELD_OUT_FROM are replayed as daily blocks into an SQLite ledger (epsilon = 1,
delta = 1e-6); taxi_classification runs under Sage's iterator until the SLAed validator ACCEPTs accuracy
>= 0.8 (above what the majority class reaches); the pushed model is scored on the held-out trips beside
two non-private baselines; the ledger summary, the audit and the budget heat-map close the run. No
held-out trip is a row of any ingested block. Steps and measurements: docs/running.md, "The demo".
"""

import datetime as _dt
import json
import os
import shutil
import time

import numpy as np

from sage_tfx.pipelines.scoring import example_rows, held_out_overlap, pushed_models, training_rows

PIPELINE = "taxi_classification"
DEFAULT_TARGET = 0.8  # accuracy on the big-tipper label; the majority class reaches 0.735-0.78 on the stream
DATA_FILE = "big_tipper"  # the shipped taxi file the stream and the held-out trips come from
LABEL = "big_tipper"
MODEL_COLUMNS = ("trip_miles", "trip_seconds", "trip_start_hour", "fare", "payment_type")  # what the model reads
STREAM = "taxi"
TIME_COLUMN = "trip_start_timestamp"
# Trips from this day on are the held-out range: never replayed. The stream before it has 1,095 days.
HELD_OUT_FROM = "2016-01-01"
# The iterator's schedule on that stream (all 1,095 days replayed first): the first iteration takes the newest
# 512 blocks (2014-08-07 .. 2015-12-31, the days nearest the held-out year; the majority class reaches 0.735 there)
# at epsilon 0.5; a RETRY cannot double epsilon on blocks that spent half their budget, so it doubles the window
# to 1,024 blocks (the 512 again and 512 older days, majority about 0.78). (The pipeline's own defaults, epsilon
# 0.25 on 256 blocks, reach a window of 1,024 blocks only at iteration 4, after the newest 256 blocks are
# spent: that needs 1,280 days, more than the stream holds once its last year is held out.)
ITERATOR = {"epsilon_start": 0.5, "min_window": 512}


def check_target(target: float) -> float:
    """The accuracy target as a float; ValueError naming it when it lies outside (0, 1)."""
    from sage_tfx import pipelines

    return pipelines.load_pipeline(PIPELINE).check_target(target)


def say(text=""):
    print(text, flush=True)


def run(
    out_dir="demo_out",
    serving_dir="serving",
    target=DEFAULT_TARGET,
    initial_days=None,
    days_per_step=64,
    runner="local",
    max_iterations=8,
) -> int:
    """The demo: a fresh ledger, real taxi trips replayed as daily blocks, the pipeline until ACCEPT, then the
    pushed model scored on held-out trips and the ledger audited. Returns the exit code (0: ACCEPT, audit OK)."""
    from sage_tfx import pipelines
    from sage_tfx.privacy import Ledger

    definition = pipelines.load_pipeline(PIPELINE)
    target = check_target(target)  # before any change
    started = time.monotonic()
    for path in (out_dir, serving_dir):
        if os.path.exists(path):
            shutil.rmtree(path)
    os.makedirs(out_dir)
    db, data_root = os.path.join(out_dir, "ledger.db"), os.path.join(out_dir, "data")
    ledger = Ledger.open(db, create=True)
    ledger.create_stream(STREAM, epsilon=1.0, delta=1e-6, accounting="basic", policy="conserve")
    say(f"[1/5] ledger {db}: stream {STREAM!r}, one global guarantee (epsilon=1, delta=1e-6) for every release")
    replay, stream_rows, held_out = _start_replay(ledger, data_root, initial_days)
    result = _iterate(
        definition, ledger, db, data_root, out_dir, serving_dir, target, runner, max_iterations, replay, days_per_step
    )
    if result.outcome == "ACCEPT":
        _score_pushed(ledger, result, out_dir, serving_dir, data_root, target, stream_rows, held_out)
    else:
        say(f"[4/5] no model was ACCEPTed ({result.outcome}), so nothing was pushed")
    ok = _show_ledger(ledger, db, out_dir)
    say(f"done in {time.monotonic() - started:.0f} s")
    ledger.close()
    return 0 if ok and result.outcome == "ACCEPT" else 1


def _start_replay(ledger, data_root: str, initial_days):
    """Replay the stream's first days as daily blocks: ``(replay, stream rows, held-out rows)``."""
    from sage_tfx.ingest.replay import Replay

    stream_rows, held_out = stream_and_held_out(data_file=DATA_FILE)
    replay = Replay(ledger, STREAM, data_root, stream_rows, TIME_COLUMN, "1d")
    steps = replay.run(steps=initial_days)
    say(
        f"[2/5] replaying the real taxi trips (tfx wheel) before {HELD_OUT_FROM} ({stream_rows.num_rows:,} trips) "
        f"as daily blocks: {len(steps):,} days ({steps[0].block} .. {steps[-1].block}), "
        f"{replay.remaining} still to come; the {held_out.num_rows:,} trips from {HELD_OUT_FROM} on are held out "
        "and never replayed"
    )
    return replay, stream_rows, held_out


def _iterate(
    definition,
    ledger,
    db: str,
    data_root: str,
    out_dir: str,
    serving_dir: str,
    target: float,
    runner: str,
    max_iterations: int,
    replay,
    days_per_step: int,
):
    """Sage's iterator on the pipeline until ACCEPT (new days replayed while it waits); its ``RunResult``."""
    from sage_tfx.adaptive import IteratorSettings, SageIterator
    from sage_tfx.pipelines.runner import build_runner

    def wait_for_blocks(_timeout):
        added = replay.run(steps=days_per_step)
        if not added:
            say("      [replay] the historical data set is exhausted")
            return False
        say(f"      [replay] {len(added)} new day(s) arrive with a fresh budget, up to {added[-1].block}")
        return True

    work_dir = os.path.join(out_dir, "work")
    pipeline = build_runner(
        definition, db, STREAM, data_root, work_dir, target, serving_dir=serving_dir, runner=runner, model="logistic"
    )
    say(
        f"[3/5] {PIPELINE} until ACCEPT: is the tip more than 20% of the fare? accuracy target {target:g}, "
        "confidence 0.95; one TFX run per iteration"
    )
    settings = IteratorSettings(**{**definition.defaults, **ITERATOR}, eta=0.05, max_iterations=max_iterations)
    iterator = SageIterator(
        ledger,
        STREAM,
        PIPELINE,
        pipeline.run_iteration,
        settings=settings,
        wait_for_blocks=wait_for_blocks,
        progress=lambda line: say("      " + line),
        request=pipeline.request(),
    )
    result = iterator.run()
    say(
        f"      -> {result.outcome} after {len(result.iterations)} iteration(s); target {target:g}, bound "
        f"{'none' if result.bound is None else format(result.bound, '.4f')} (the validator's lower bound on "
        "the accuracy)"
    )
    return result


def _score_pushed(
    ledger, result, out_dir: str, serving_dir: str, data_root: str, target: float, stream_rows, held_out
) -> None:
    """Score the ACCEPTed, pushed model on the held-out trips (never replayed); write held_out.json."""
    pushed = _pushed_model(serving_dir)
    grant = ledger.get_grant(result.final_grant_id)
    say(
        f"[4/5] pushed to {pushed}; scoring it with plain TensorFlow on the held-out trips "
        f"(from {HELD_OUT_FROM} on, never replayed)"
    )
    overlap = held_out_overlap(data_root, STREAM, [b.id for b in ledger.blocks(STREAM)], held_out, ledger=ledger)
    if overlap:
        raise RuntimeError(f"{overlap} held-out trip(s) are rows of ingested blocks: the held-out set is not held out")
    summary = held_out_scores(pushed, data_root, grant, held_out, ledger=ledger)
    summary.update(
        {
            "held_out_from": HELD_OUT_FROM,
            "stream_trips": stream_rows.num_rows,
            "days_replayed": len(ledger.blocks(STREAM)),
            "outcome": result.outcome,
            "iterations": len(result.iterations),
            "target": target,
            "bound": result.bound,
        }
    )
    _print_held_out(summary, target, len(grant.blocks))
    with open(os.path.join(out_dir, "held_out.json"), "w") as f:
        json.dump(summary, f, indent=1, sort_keys=True)


def _show_ledger(ledger, db: str, out_dir: str) -> bool:
    """Print the ledger's table, audit and heat-map; True if the audit is OK and no block is over the budget."""
    from sage_tfx.privacy.report import heatmap_png, status_table

    say("[5/5] the ledger after the run:")
    say(status_table(ledger.status(STREAM)).split("\n\n")[0])
    status = ledger.status(STREAM)
    over = [b["id"] for b in status["blocks"] if b["epsilon_spent"] > status["epsilon"]]
    report = ledger.audit()
    say(f"      audit: {'OK' if report.ok else 'FAILED'}; blocks over the global budget: {len(over)}")
    png = heatmap_png(ledger, STREAM, os.path.join(out_dir, "budget_heatmap.png"))
    say(f"      budget heat-map: {png}")
    say(f"      sage ledger status --db {db} --stream {STREAM}   # the per-block table")
    return report.ok and not over


def _print_held_out(summary, target, blocks):
    """The held-out table: the DP model and the two non-private baselines, each against the target."""
    n, rows = summary["held_out_trips"], summary["baseline_rows"]
    say(
        f"      held-out: {n:,} trips ({HELD_OUT_FROM} .. the file's end; big-tipper rate "
        f"{summary['held_out_big_tipper_rate']:.3f}); none is a row of the {summary['days_replayed']:,} ingested "
        "blocks (checked)"
    )
    say(
        f"      baselines, NOT PRIVATE (for comparison only): fitted on the {rows:,} train-split rows of "
        f"the ACCEPTed grant's {blocks:,} blocks"
    )
    say(f"      {'predictor':<52}{'held-out accuracy':>20}   vs the target {target:g}")
    majority = "always 'big tipper'" if summary["majority_class"] else "never a big tipper"
    for key, label in (
        ("dp_model", "pushed DP model (DP-SGD logistic, the ACCEPTed one)"),
        ("nonprivate_logistic_regression", "logistic regression, NOT private"),
        ("majority_predictor", f"majority class ({majority}), NOT private"),
    ):
        accuracy, se = summary[key]["accuracy"], summary[key]["accuracy_se"]
        verdict = "meets" if accuracy >= target else "MISSES"
        say(f"      {label:<52}{accuracy:>12.3f} +- {se:.3f}   {verdict}")
    say(
        f"      (+- one standard error over the held-out trips) the certificate: accuracy >= {target:g} at 95% "
        f"confidence; the majority class reaches {summary['majority_predictor']['accuracy']:.3f} on the held-out "
        "trips, so it does not meet the target"
    )


def _pushed_model(serving_dir):
    models = pushed_models(serving_dir)
    return models[-1] if models else None


def stream_and_held_out(held_out_from=HELD_OUT_FROM, data_file="simple"):
    """(stream rows, held-out rows): a shipped taxi file's trips (``data_file``: ``simple``, or ``big_tipper``, the
    same trips with TFX's label) read as ``Replay.from_file`` reads a file, split by time.

    Trips that start before ``held_out_from`` (an ISO day; midnight of the file's clock, the same clock the
    daily blocks are cut by) are the stream; the trips from that day on are held out.
    """

    import pyarrow as pa
    import pyarrow.compute as pc

    from sage_tfx.data.taxi import taxi_csv_path
    from sage_tfx.ingest.records import infer_schema, input_format, read_batches

    path = taxi_csv_path(data_file)
    fmt = input_format(path)
    table = pa.Table.from_batches(list(read_batches(path, fmt, infer_schema(path, fmt))))
    day = _dt.date.fromisoformat(held_out_from)
    cutoff = _dt.datetime(day.year, day.month, day.day, tzinfo=_dt.UTC).timestamp()
    times = table.column(TIME_COLUMN)
    if times.null_count:
        raise ValueError(f"{times.null_count} trip(s) have no {TIME_COLUMN}: they fit neither side of the cut")
    before = pc.less(times, cutoff)
    return table.filter(before), table.filter(pc.invert(before))


def _column(example_batch, name):
    """A list column with at most one value per row as a float array (NaN where missing)."""

    return np.array([v[0] if v else np.nan for v in example_batch.column(name).to_pylist()], dtype=float)


def paid_by_card(example_batch):
    """1.0 where the trip was paid by credit card, else 0.0 (the preprocessing_fn's ``credit_card``); list-column
    strings are bytes, as the blocks store them."""

    return np.array(
        [bool(v) and v[0] == b"Credit Card" for v in example_batch.column("payment_type").to_pylist()], dtype=float
    )


def taxi_features(example_batch, hourly_speed=None):
    """(x, y, hourly_speed) of taxi_classification, computed in numpy WITHOUT privacy (for baselines only).

    The trainer's features (dist_scaled, hour_of_day_speed, fare_scaled, credit_card) with the pipeline's
    public constants and fill values, but with the EXACT mean speed of each hour (fitted here when
    ``hourly_speed`` is None) in place of the DP one; y is the 0/1 ``big_tipper`` label (missing: 0, as the
    preprocessing_fn fills it).
    """

    from sage_tfx.pipelines.modules import taxi_preprocessing as pre

    miles = np.clip(np.nan_to_num(_column(example_batch, "trip_miles"), nan=0.0), 0.0, pre.MAX_MILES)
    seconds = np.nan_to_num(_column(example_batch, "trip_seconds"), nan=0.0)
    hour = np.clip(np.nan_to_num(_column(example_batch, "trip_start_hour"), nan=0.0), 0, pre.HOURS - 1).astype(int)
    if hourly_speed is None:
        mph = np.clip(miles / (np.maximum(seconds, 1.0) / 3600.0), 0.0, pre.MAX_MPH)
        counts = np.bincount(hour, minlength=pre.HOURS)
        sums = np.bincount(hour, weights=mph / pre.MAX_MPH, minlength=pre.HOURS)
        hourly_speed = np.where(counts > 0, sums / np.maximum(counts, 1), 0.0)
    fare = np.clip(np.nan_to_num(_column(example_batch, "fare"), nan=0.0), 0.0, pre.MAX_FARE)
    x = np.column_stack([miles / pre.MAX_MILES, hourly_speed[hour], fare / pre.MAX_FARE, paid_by_card(example_batch)])
    return x, np.nan_to_num(_column(example_batch, LABEL), nan=0.0), hourly_speed


def logistic_regression(x, y, iterations=50, ridge=1e-6):
    """Coefficients (features..., intercept) of a NON-PRIVATE logistic regression fitted by Newton's method."""

    design = np.column_stack([x, np.ones(len(x))])
    coef = np.zeros(design.shape[1])
    for _ in range(iterations):
        p = 1.0 / (1.0 + np.exp(-(design @ coef)))
        hessian = design.T @ (design * (p * (1.0 - p))[:, None]) + ridge * np.eye(len(coef))
        step = np.linalg.solve(hessian, design.T @ (y - p) - ridge * coef)
        coef += step
        if np.abs(step).max() < 1e-10:
            break
    return coef


def _accuracy(predicted, labels):

    correct = (predicted == labels).astype(float)
    return {"accuracy": float(correct.mean()), "accuracy_se": float(correct.std(ddof=1) / np.sqrt(len(correct)))}


def held_out_scores(model_dir, data_root, grant, held_out, stream=STREAM, *, ledger):
    """Held-out accuracy on the big-tipper label of the pushed model (P(big tipper) >= 0.5, as the validator
    scores it) and of two NON-PRIVATE baselines fitted on the train split of ``grant``'s blocks: logistic
    regression on the same features (exact hourly speeds) and the majority class of the training labels.
    The pushed model is served raw tf.Examples with the stream's public schema.
    """
    import tensorflow as tf

    from sage_tfx.ingest.layout import stream_config
    from sage_tfx.ingest.records import encode

    schema = stream_config(data_root, stream)["schema"]
    rows = example_rows(held_out, schema)
    serve = tf.saved_model.load(model_dir).signatures["serving_default"]
    raw = held_out.select([k for k in schema if k in MODEL_COLUMNS])
    scores = []
    for batch in raw.to_batches(max_chunksize=2048):
        out = serve(examples=tf.constant(list(encode(batch, {k: schema[k] for k in raw.column_names}))))
        scores.append(np.asarray(out["probabilities"]).reshape(-1))
    dp_pred = (np.concatenate(scores) >= 0.5).astype(float)

    train = training_rows(
        data_root,
        stream,
        grant,
        ledger=ledger,
        purpose="non-private baseline: logistic regression on the accepted model's training split",
    )
    x, y, hourly = taxi_features(train)
    coef = logistic_regression(x, y)
    held_x, labels, _ = taxi_features(rows, hourly)
    lr_pred = (np.column_stack([held_x, np.ones(len(held_x))]) @ coef >= 0.0).astype(float)
    majority = float(y.mean() >= 0.5)
    return {
        "held_out_trips": int(len(labels)),
        "held_out_big_tipper_rate": float(labels.mean()),
        "baseline_rows": int(len(y)),
        "grant_blocks": len(grant.blocks),
        "majority_class": int(majority),
        "dp_model": _accuracy(dp_pred, labels),
        "nonprivate_logistic_regression": _accuracy(lr_pred, labels),
        "majority_predictor": _accuracy(np.full(len(labels), majority), labels),
    }
