"""The main job (`make demo`): privacy-adaptive training on the real Chicago taxi trips, end to end.

1. The 15,002 real trips shipped in the tfx wheel are replayed as a growing stream of daily blocks
   into an embedded SQLite ledger (one global guarantee: epsilon = 1, delta = 1e-6).
2. taxi_regression (paper List. 1: BlockExampleGen -> DPTransform -> DPTrainer -> DPModelValidator
   -> Pusher) runs under Sage's iterator: each RETRY doubles epsilon or the window of days, waiting
   for new days to arrive, until the SLAed validator ACCEPTs with 95% confidence.
3. The ACCEPTed model is pushed to ``serving/``.
4. The pushed model is loaded with plain TensorFlow and scored from raw features on the 10,000
   other real trips of the tfx wheel, which the demo never ingested.
5. The ledger summary, the audit and the budget heat-map PNG close the run.
"""
import os
import shutil
import time

DEFAULT_TARGET = 500_000.0  # MSE, seconds^2 (RMSE ~12 min), squared errors clipped at (30 min)^2
STREAM = "taxi"


def say(text=""):
    print(text, flush=True)


def run(out_dir="demo_out", serving_dir="serving", target=DEFAULT_TARGET, initial_days=512, days_per_step=64,
        runner="local", max_iterations=8):
    from sage_tfx import pipelines
    from sage_tfx.cli.run import build_runner
    from sage_tfx.data.taxi import taxi_csv_path
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

    replay = Replay.from_file(ledger, STREAM, data_root, taxi_csv_path("simple"), "trip_start_timestamp", "1d")
    steps = replay.run(steps=initial_days)
    say(f"[2/5] replaying the real taxi trips (tfx wheel) as daily blocks: {len(steps)} days so far "
        f"({steps[0].block} .. {steps[-1].block}), {replay.remaining} still to come")

    def wait_for_blocks(_timeout):
        added = replay.run(steps=days_per_step)
        if not added:
            say("      [replay] the historical data set is exhausted")
            return False
        say(f"      [replay] {len(added)} new day(s) arrive with a fresh budget, up to {added[-1].block}")
        return True

    module = pipelines.get("taxi_regression")
    work_dir = os.path.join(out_dir, "work")
    pipeline = build_runner(module, db, STREAM, data_root, work_dir, target, serving_dir=serving_dir,
                            runner=runner, model="linear")
    say(f"[3/5] taxi_regression until ACCEPT: MSE target {target:,.0f} s^2 (clipped at (30 min)^2), "
        "confidence 0.95; one TFX run per iteration")
    iterator = SageIterator(ledger, STREAM, "taxi_regression", pipeline.run_iteration, eta=0.05,
                            max_iterations=max_iterations, wait_for_blocks=wait_for_blocks,
                            progress=lambda line: say("      " + line), **module.DEFAULTS)
    result = iterator.run()
    say(f"      -> {result.outcome} after {len(result.iterations)} iteration(s)")

    pushed = _pushed_model(serving_dir)
    if result.outcome == "ACCEPT":
        say(f"[4/5] pushed to {pushed}; scoring it with plain TensorFlow on 10,000 real trips never ingested")
        mse, clipped, n = held_out_mse(pushed, module.LOSS_BOUND, data_root)
        verdict = "meets" if clipped <= target else "MISSES"
        say(f"      held-out MSE {mse:,.0f} s^2 (RMSE {mse ** 0.5:,.0f} s); clipped at (30 min)^2: "
            f"{clipped:,.0f} s^2 on {n:,} trips: {verdict} the target {target:,.0f}")
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
    from sage_tfx.pipelines._runner import pushed_models

    models = pushed_models(serving_dir)
    return models[-1] if models else None


def held_out_mse(model_dir, loss_bound, data_root, stream=STREAM):
    """(MSE, MSE with squared errors clipped at loss_bound, n) of a pushed model on the external trips.

    The trips are encoded as raw tf.Examples with the stream's public schema, as serving would receive them.
    """
    import numpy as np
    import tensorflow as tf

    from sage_tfx.components.transform_utils import stream_schema
    from sage_tfx.data.taxi import load_taxi
    from sage_tfx.ingest.records import encode

    # The raw features the taxi preprocessing_fn reads (serving parses every raw feature as optional).
    used = ("trip_miles", "trip_seconds", "trip_start_hour", "fare", "payment_type")
    schema = {k: v for k, v in stream_schema(data_root, stream).items() if k in used}
    table = load_taxi("external").select(list(schema))
    labels = table.column("trip_seconds").to_numpy(zero_copy_only=False).astype(float)
    serve = tf.saved_model.load(model_dir).signatures["serving_default"]
    predictions = []
    for batch in table.to_batches(max_chunksize=2048):
        out = serve(examples=tf.constant(list(encode(batch, schema))))
        predictions.append(np.asarray(next(iter(out.values()))).reshape(-1))
    pred = np.concatenate(predictions)
    keep = np.isfinite(labels)
    errors = (pred[keep] - labels[keep]) ** 2
    return float(errors.mean()), float(np.minimum(errors, loss_bound).mean()), int(keep.sum())
