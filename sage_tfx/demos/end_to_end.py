"""The main job (`make demo`): privacy-adaptive training on the real Chicago taxi trips, end to end.

1. The 15,002 real trips shipped in the tfx wheel are split by time: the trips that start before
   HELD_OUT_FROM (2016-01-01, Chicago local time as the file writes it) are replayed as a growing
   stream of daily blocks into an embedded SQLite ledger (one global guarantee: epsilon = 1,
   delta = 1e-6); the trips from that day on (the file's last year) are held out and never replayed.
2. taxi_regression (paper List. 1: BlockExampleGen -> DPTransform -> DPTrainer -> DPModelValidator
   -> Pusher) runs under Sage's iterator: each RETRY doubles epsilon or the window of days, waiting
   for new days to arrive, until the SLAed validator ACCEPTs with 95% confidence.
3. The ACCEPTed model is pushed to ``serving/``.
4. The pushed model is loaded with plain TensorFlow and scored from raw features on the held-out
   trips, beside two NON-PRIVATE baselines fitted, for comparison only, on exactly the rows the
   ACCEPTed iteration trained on (the train split of its granted blocks, read as trusted code reads
   them): least squares on the same features with exact hourly speeds, and the mean label. The demo
   checks that no held-out trip is a row of any ingested block. (The tfx wheel's ``external`` test
   file is no held-out set: each of its rows is also a row of the replayed file.)
5. The ledger summary, the audit and the budget heat-map PNG close the run.
"""
import json
import os
import shutil
import time

from sage_tfx.pipelines.scoring import example_rows, held_out_overlap, pushed_models, training_rows

DEFAULT_TARGET = 500_000.0  # MSE, seconds^2 (RMSE ~12 min), squared errors clipped at (30 min)^2
STREAM = "taxi"
TIME_COLUMN = "trip_start_timestamp"
# Trips from this day on are the held-out range: never replayed. The stream before it has 1,095 days.
HELD_OUT_FROM = "2016-01-01"
# The iterator's schedule on that stream: the first iteration takes the newest 512 blocks at epsilon 0.5; a
# RETRY cannot double epsilon on blocks that spent half their budget, so it doubles the window to 1,024 blocks
# (the 512 again and 512 new days), which the 1,095 days can still give. (taxi_regression's own defaults,
# epsilon 0.25 on 256 blocks, reach a window of 1,024 blocks only at iteration 4, after the newest 256
# blocks are spent: that needs 1,280 days, more than the stream holds once its last year is held out.)
ITERATOR = {"epsilon_start": 0.5, "min_window": 512}


def say(text=""):
    print(text, flush=True)


def run(out_dir="demo_out", serving_dir="serving", target=DEFAULT_TARGET, initial_days=512, days_per_step=64,
        runner="local", max_iterations=8):
    from sage_tfx import pipelines
    from sage_tfx.cli.run import build_runner
    from sage_tfx.ingest.replay import Replay
    from sage_tfx.privacy import Ledger
    from sage_tfx.privacy.report import heatmap_png, status_table
    from sage_tfx.adaptive import SageIterator

    started = time.monotonic()
    for path in (out_dir, serving_dir):
        if os.path.exists(path):
            shutil.rmtree(path)
    os.makedirs(out_dir)
    db, data_root = os.path.join(out_dir, "ledger.db"), os.path.join(out_dir, "data")
    ledger = Ledger.open(db, create=True)
    ledger.create_stream(STREAM, epsilon=1.0, delta=1e-6, accounting="basic", policy="conserve")
    say(f"[1/5] ledger {db}: stream {STREAM!r}, one global guarantee (epsilon=1, delta=1e-6) for every release")

    stream_rows, held_out = stream_and_held_out()
    replay = Replay(ledger, STREAM, data_root, stream_rows, TIME_COLUMN, "1d")
    steps = replay.run(steps=initial_days)
    say(f"[2/5] replaying the real taxi trips (tfx wheel) before {HELD_OUT_FROM} ({stream_rows.num_rows:,} trips) "
        f"as daily blocks: {len(steps)} days so far ({steps[0].block} .. {steps[-1].block}), "
        f"{replay.remaining} still to come; the {held_out.num_rows:,} trips from {HELD_OUT_FROM} on are held out "
        "and never replayed")

    def wait_for_blocks(_timeout):
        added = replay.run(steps=days_per_step)
        if not added:
            say("      [replay] the historical data set is exhausted")
            return False
        say(f"      [replay] {len(added)} new day(s) arrive with a fresh budget, up to {added[-1].block}")
        return True

    definition = pipelines.load_pipeline("taxi_regression")
    work_dir = os.path.join(out_dir, "work")
    pipeline = build_runner(definition, db, STREAM, data_root, work_dir, target, serving_dir=serving_dir,
                            runner=runner, model="linear")
    say(f"[3/5] taxi_regression until ACCEPT: MSE target {target:,.0f} s^2 (clipped at (30 min)^2), "
        "confidence 0.95; one TFX run per iteration")
    iterator = SageIterator(ledger, STREAM, "taxi_regression", pipeline.run_iteration, eta=0.05,
                            max_iterations=max_iterations, wait_for_blocks=wait_for_blocks,
                            progress=lambda line: say("      " + line), request=pipeline.request(),
                            **{**definition.defaults, **ITERATOR})
    result = iterator.run()
    say(f"      -> {result.outcome} after {len(result.iterations)} iteration(s); target {target:g}, bound "
        f"{'none' if result.bound is None else format(result.bound, '.6g')}")

    pushed = _pushed_model(serving_dir)
    if result.outcome == "ACCEPT":
        grant = ledger.get_grant(result.final_grant_id)
        say(f"[4/5] pushed to {pushed}; scoring it with plain TensorFlow on the held-out trips "
            f"(from {HELD_OUT_FROM} on, never replayed)")
        overlap = held_out_overlap(data_root, STREAM, [b.id for b in ledger.blocks(STREAM)], held_out, ledger=ledger)
        if overlap:
            raise RuntimeError(f"{overlap} held-out trip(s) are rows of ingested blocks: the held-out set is not "
                               "held out")
        summary = held_out_scores(pushed, definition.sla.loss_bound, data_root, grant, held_out, ledger=ledger)
        summary.update({"held_out_from": HELD_OUT_FROM, "stream_trips": stream_rows.num_rows,
                        "days_replayed": len(ledger.blocks(STREAM)), "outcome": result.outcome,
                        "iterations": len(result.iterations), "target": target})
        n, rows, blocks = summary["held_out_trips"], summary["baseline_rows"], len(grant.blocks)
        say(f"      held-out: {n:,} trips ({HELD_OUT_FROM} .. the file's end); none is a row of the "
            f"{summary['days_replayed']:,} ingested blocks (checked)")
        say(f"      baselines, NOT PRIVATE (for comparison only): fitted on the {rows:,} train-split rows of "
            f"the ACCEPTed grant's {blocks:,} blocks")
        say(f"      {'predictor':<44}{'MSE (s^2)':>12}{'RMSE (s)':>10}{'clipped MSE (s^2)':>19}")
        for key, label in (("dp_model", "pushed DP model (AdaSSP, the ACCEPTed one)"),
                           ("nonprivate_least_squares", "least squares, NOT private"),
                           ("mean_predictor", "mean label, NOT private")):
            mse, clipped, se = (summary[key][k] for k in ("mse", "clipped_mse", "clipped_mse_se"))
            say(f"      {label:<44}{mse:>12,.0f}{mse ** 0.5:>10,.0f}{clipped:>12,.0f} +- {se:,.0f}")
        clipped = summary["dp_model"]["clipped_mse"]
        verdict = "meets" if clipped <= target else "MISSES"
        say(f"      (+- one standard error over the held-out trips) the DP model's held-out clipped MSE "
            f"{verdict} the target {target:,.0f}")
        if summary["mean_predictor"]["clipped_mse"] <= target:
            say("      note: the mean label meets this target too, so the SLA certifies little on this small stream")
        with open(os.path.join(out_dir, "held_out.json"), "w") as f:
            json.dump(summary, f, indent=1, sort_keys=True)
    else:
        say(f"[4/5] no model was ACCEPTed ({result.outcome}), so nothing was pushed")

    say("[5/5] the ledger after the run:")
    say(status_table(ledger.status(STREAM)).split("\n\n")[0])
    status = ledger.status(STREAM)
    over = [b["id"] for b in status["blocks"] if b["epsilon_spent"] > status["epsilon"]]
    report = ledger.audit()
    say(f"      audit: {'OK' if report.ok else 'FAILED'}; blocks over the global budget: {len(over)}")
    png = heatmap_png(ledger, STREAM, os.path.join(out_dir, "budget_heatmap.png"))
    say(f"      budget heat-map: {png}")
    say(f"      sage ledger status --db {db} --stream {STREAM}   # the per-block table")
    say(f"done in {time.monotonic() - started:.0f} s")
    ledger.close()
    ok = report.ok and not over and result.outcome == "ACCEPT"
    return 0 if ok else 1


def _pushed_model(serving_dir):
    models = pushed_models(serving_dir)
    return models[-1] if models else None


def stream_and_held_out(held_out_from=HELD_OUT_FROM):
    """(stream rows, held-out rows): the ``simple`` trips read as ``Replay.from_file`` reads a file, split by time.

    Trips that start before ``held_out_from`` (an ISO day; midnight of the file's clock, the same clock the
    daily blocks are cut by) are the stream; the trips from that day on are held out.
    """
    import datetime as _dt

    import pyarrow as pa
    import pyarrow.compute as pc

    from sage_tfx.data.taxi import taxi_csv_path
    from sage_tfx.ingest.records import infer_schema, input_format, read_batches

    path = taxi_csv_path("simple")
    fmt = input_format(path)
    table = pa.Table.from_batches(list(read_batches(path, fmt, infer_schema(path, fmt))))
    day = _dt.date.fromisoformat(held_out_from)
    cutoff = _dt.datetime(day.year, day.month, day.day, tzinfo=_dt.timezone.utc).timestamp()
    times = table.column(TIME_COLUMN)
    if times.null_count:
        raise ValueError(f"{times.null_count} trip(s) have no {TIME_COLUMN}: they fit neither side of the cut")
    before = pc.less(times, cutoff)
    return table.filter(before), table.filter(pc.invert(before))


def _column(example_batch, name):
    """A list column with at most one value per row as a float array (NaN where missing)."""
    import numpy as np

    return np.array([v[0] if v else np.nan for v in example_batch.column(name).to_pylist()], dtype=float)


def taxi_features(example_batch, hourly_speed=None):
    """(x, y, hourly_speed) of taxi_regression, computed in numpy WITHOUT privacy (for baselines only).

    The features of the pipeline's preprocessing_fn and trainer (dist_scaled, hour_of_day_speed,
    expected_hours) with the same public constants and fill values, but with the EXACT mean speed of each
    hour (fitted here when ``hourly_speed`` is None) in place of the DP one; y is trip_seconds clipped to
    [0, 1 h], the training label.
    """
    import numpy as np

    from sage_tfx.pipelines.modules import taxi_preprocessing as pre

    miles = np.clip(np.nan_to_num(_column(example_batch, "trip_miles"), nan=0.0), 0.0, pre.MAX_MILES)
    seconds = np.nan_to_num(_column(example_batch, "trip_seconds"), nan=0.0)
    hour = np.clip(np.nan_to_num(_column(example_batch, "trip_start_hour"), nan=0.0), 0, pre.HOURS - 1).astype(int)
    if hourly_speed is None:
        mph = np.clip(miles / (np.maximum(seconds, 1.0) / 3600.0), 0.0, pre.MAX_MPH)
        counts = np.bincount(hour, minlength=pre.HOURS)
        sums = np.bincount(hour, weights=mph / pre.MAX_MPH, minlength=pre.HOURS)
        hourly_speed = np.where(counts > 0, sums / np.maximum(counts, 1), 0.0)
    speed = hourly_speed[hour]
    hourly_mph = np.maximum(speed * pre.MAX_MPH, pre.MIN_MPH)
    x = np.column_stack([miles / pre.MAX_MILES, speed, np.minimum(miles / hourly_mph, 1.0)])
    return x, np.clip(seconds, 0.0, pre.MAX_SECONDS), hourly_speed


def _errors(pred, labels, loss_bound):
    import numpy as np

    errors = (pred - labels) ** 2
    clipped = np.minimum(errors, loss_bound)
    return {"mse": float(errors.mean()), "clipped_mse": float(clipped.mean()),
            "clipped_mse_se": float(clipped.std(ddof=1) / np.sqrt(len(clipped)))}


def held_out_scores(model_dir, loss_bound, data_root, grant, held_out, stream=STREAM, *, ledger):
    """Held-out MSE (and MSE with squared errors clipped at ``loss_bound``) of the pushed model and of two
    NON-PRIVATE baselines fitted on the train split of ``grant``'s blocks: least squares on the same features
    (exact hourly speeds) and the mean training label. Labels are the raw trip_seconds (trips without one are
    left out). The pushed model is served raw tf.Examples with the stream's public schema.
    """
    import numpy as np
    import tensorflow as tf

    from sage_tfx.ingest.records import encode
    from sage_tfx.ingest.store import stream_config

    schema = stream_config(data_root, stream)["schema"]
    rows = example_rows(held_out, schema)
    labels = _column(rows, "trip_seconds")
    keep = np.isfinite(labels)

    serve = tf.saved_model.load(model_dir).signatures["serving_default"]
    used = ("trip_miles", "trip_seconds", "trip_start_hour", "fare", "payment_type")  # what the model reads
    raw = held_out.select([k for k in schema if k in used])
    predictions = []
    for batch in raw.to_batches(max_chunksize=2048):
        out = serve(examples=tf.constant(list(encode(batch, {k: schema[k] for k in raw.column_names}))))
        predictions.append(np.asarray(next(iter(out.values()))).reshape(-1))
    dp_pred = np.concatenate(predictions)

    train = training_rows(data_root, stream, grant, ledger=ledger,
                          purpose="non-private baseline: least squares on the accepted model's training split")
    x, y, hourly = taxi_features(train)
    design = np.column_stack([x, np.ones(len(x))])
    coef, *_ = np.linalg.lstsq(design, y, rcond=None)
    held_x, _, _ = taxi_features(rows, hourly)
    ls_pred = np.column_stack([held_x, np.ones(len(held_x))]) @ coef
    mean_pred = np.full(len(labels), y.mean())
    return {
        "held_out_trips": int(keep.sum()), "baseline_rows": int(len(y)), "grant_blocks": len(grant.blocks),
        "dp_model": _errors(dp_pred[keep], labels[keep], loss_bound),
        "nonprivate_least_squares": _errors(ls_pred[keep], labels[keep], loss_bound),
        "mean_predictor": _errors(mean_pred[keep], labels[keep], loss_bound),
    }
