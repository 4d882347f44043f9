"""DP-SGD training speed vs the same model trained without DP, per implementation, in one run.

Models: the paper's Taxi NN (ReLU 5000/100, batch 1024, lr 0.01, momentum 0.9)
and a small MLP (64/32). Data: GENERATED taxi-like rows (61 one-hot features
from 6 contextual features, as the paper's 61 binary taxi features; duration
label), not real trips. Every implementation and the non-private baseline run
the same Poisson-sampled batches; the first steps (tracing) are not timed.

tensorflow-privacy with one example per microbatch needs a [B, B, 5000] float
tensor (21 GiB at B ~ 1024) on the Taxi NN and runs out of memory, so on that
model it is measured only microbatched (64 microbatches of 16, fixed batches of
1024): row ``taxi_nn_tf_privacy_mb64``. That row is a speed reference only:
clipping per microbatch is not the per-example clipping the accounting assumes.

``wide_deep``: TFX's own taxi model (``_build_keras_model`` of
tfx/examples/chicago_taxi_pipeline/taxi_utils_native_keras.py, rebuilt here layer for layer: 3 dense
float inputs -> Normalization -> Dense 100/70/50/25 (linear, as in TFX); 2 vocabulary ids (1000 + 10 OOV),
4 bucket ids (10) and 3 categorical ints (24, 31, 13) -> CategoryEncoding -> concatenated with the deep
output -> Dense(1, sigmoid); binary cross-entropy, Adam lr 0.001) on GENERATED rows of the same shapes
(not real trips). DP: ``make_private(...).fit`` end to end (Poisson sampling, per-example clipping, noise,
Adam; its default per-example engine), timed per step by fit's callback. Baseline: the same model and
optimizer with a plain Keras train step (GradientTape, mean loss, Adam) over the SAME Poisson batches
(same seed), in the same run; the first --warmup steps (tracing) are not timed on either side. Repeated
--repeats times alternating the order. Per repeat, ``overhead_ratio`` = median DP step time / median
non-DP step time over the same batches (a step's median resists the load spikes of a shared machine, a
few ms per step here); ``overhead_ratio_total_time`` = non-DP examples/s / DP examples/s over all timed
steps. Each figure is the median over the repeats. ``--nn-repeats`` repeats the small and Taxi NN runs the
same way (each ratio's median, min and runs); ``..._overhead_ratio_cpu`` is the same ratio in process CPU time.
"""

import statistics
import sys
import time

import numpy as np

from sage_tfx import comma_lists
from sage_tfx.bench._dp_sgd_fit import DEFAULT_FIT_MODELS, FIT_MODELS, measure_fits

IMPLEMENTATIONS = ("ghost", "vmap", "tf_privacy")
# (name, cardinality): 24 + 7 + 5 + 10 + 10 + 5 = 61 one-hot columns
CONTEXT = (("hour", 24), ("day", 7), ("week_of_month", 5), ("pickup_zone", 10), ("dropoff_zone", 10), ("payment", 5))


def add_arguments(parser):
    parser.add_argument("--rows", type=int, default=60_000, help="generated rows (default 60000)")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per implementation (default 20)")
    parser.add_argument(
        "--slow-steps",
        type=int,
        default=4,
        help="timed steps for vmap/tf_privacy on the Taxi NN (default 4; they are slow)",
    )
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first (default 2)")
    parser.add_argument(
        "--implementations",
        type=comma_lists.names,
        default=",".join(IMPLEMENTATIONS),
        help="comma list of ghost,vmap,tf_privacy (default all)",
    )
    parser.add_argument("--skip-taxi-nn", action="store_true", help="skip the paper's Taxi NN")
    parser.add_argument("--skip-wide-deep", action="store_true", help="skip TFX's taxi wide-and-deep model")
    parser.add_argument("--only-wide-deep", action="store_true", help="only TFX's taxi wide-and-deep model")
    parser.add_argument(
        "--wide-deep-rows",
        type=int,
        default=100_000,
        help="generated rows for the wide-and-deep model (default 100000)",
    )
    parser.add_argument(
        "--wide-deep-batch", type=int, default=256, help="expected batch size for the wide-and-deep model (default 256)"
    )
    parser.add_argument(
        "--wide-deep-steps", type=int, default=200, help="timed steps per wide-and-deep run (default 200)"
    )
    parser.add_argument(
        "--repeats", type=int, default=5, help="wide-and-deep: DP and non-DP runs, alternating (median; default 5)"
    )
    parser.add_argument(
        "--nn-repeats",
        type=int,
        default=1,
        help="small and Taxi NN: runs of every implementation and the baseline (median, min, all; default 1)",
    )
    parser.add_argument("--skip-fit", action="store_true", help="skip the whole-fit comparison")
    parser.add_argument("--only-fit", action="store_true", help="only the whole-fit comparison")
    parser.add_argument("--fit-rows", type=int, default=20_000, help="whole fit: generated rows (default 20000)")
    parser.add_argument("--fit-batch", type=int, default=256, help="whole fit: batch size (default 256)")
    parser.add_argument("--fit-epochs", type=int, default=4, help="whole fit: epochs (default 4, ~313 steps)")
    parser.add_argument("--fit-repeats", type=int, default=3, help="whole fit: repeats per side (default 3)")
    parser.add_argument(
        "--fit-models",
        type=comma_lists.names,
        default=",".join(DEFAULT_FIT_MODELS),
        help=f"whole fit: comma list of {FIT_MODELS} (default all but wide_deep: tf-privacy takes ~4 s a step on it)",
    )
    parser.add_argument("--seed", type=int, default=0)


def generated_taxi(rows, rng):
    """One-hot contextual features (61 columns) and a duration label (minutes / 10)."""

    blocks, label = [], np.zeros(rows)
    for _, card in CONTEXT:
        values = rng.integers(0, card, size=rows)
        blocks.append(np.eye(card, dtype=np.float32)[values])
        label += rng.normal(size=card)[values]
    label = np.clip(1.5 + 0.3 * label + 0.3 * rng.normal(size=rows), 0, 6)
    return np.concatenate(blocks, axis=1), label.astype(np.float32)


def _time_steps(step, batches, x, y, warmup):
    """(examples per wall second, examples per process CPU second) of the steps after ``warmup``."""
    for rows in batches[:warmup]:
        step(x[rows], y[rows])
    examples, start, cpu = 0, time.perf_counter(), time.process_time()
    for rows in batches[warmup:]:
        step(x[rows], y[rows])
        examples += len(rows)
    return examples / (time.perf_counter() - start), examples / (time.process_time() - cpu)


def _measure(label, hidden, batch, lr, x, y, implementations, steps, slow_steps, warmup, seed):
    import tensorflow as tf

    from sage_tfx.bench.dp_quality import plain_sgd_step
    from sage_tfx.models.dpsgd_engine import make_engine
    from sage_tfx.models.dpsgd_models import _mse, build_mlp
    from sage_tfx.models.private import poisson_batches

    rng = np.random.default_rng(seed)
    q = batch / len(x)
    batches = [r for r in poisson_batches(rng, len(x), q, warmup + steps) if len(r)]

    sig = [tf.TensorSpec([None, x.shape[1]], tf.float32), tf.TensorSpec([None], tf.float32)]

    def dp_step(implementation, **options):
        """One DP-SGD step of engine ``implementation`` (clip 1, sigma 1): the noisy sum / batch, SGD."""
        model = build_mlp(x.shape[1], hidden, 1, seed=seed)
        engine = make_engine(implementation, model, _mse, 1.0, 1.0, seed, **options)
        optimizer = tf.keras.optimizers.SGD(learning_rate=lr, momentum=0.9)
        return tf.function(
            lambda xb, yb: optimizer.apply_gradients(
                zip([g / batch for g in engine.noisy_sum(xb, yb)], engine.variables)
            ),
            input_signature=sig,
        )

    print(f"[{label}] non-private baseline ({len(batches) - warmup} steps)", file=sys.stderr, flush=True)
    nondp = _time_steps(
        plain_sgd_step(build_mlp(x.shape[1], hidden, 1, seed=seed), _mse, lr, input_signature=sig),
        batches,
        x,
        y,
        warmup,
    )
    figures = {f"{label}_nondp_examples_per_second": round(nondp[0], 1)}
    for implementation in implementations:
        n = steps if implementation == "ghost" or label == "small" else slow_steps
        name, rows, options = implementation, batches[: warmup + n], {}
        if implementation == "tf_privacy" and label == "taxi_nn":  # per-example would need 21 GiB
            name, options = "tf_privacy_mb64", {"num_microbatches": 64}
            rows = [rng.choice(len(x), size=batch, replace=False) for _ in range(warmup + n)]
        print(f"[{label}] DP-SGD {name} ({n} steps)", file=sys.stderr, flush=True)
        step = dp_step(implementation, **options)
        dp = _time_steps(step, rows, x, y, warmup)
        figures[f"{label}_{name}_examples_per_second"] = round(dp[0], 1)
        figures[f"{label}_{name}_overhead_ratio"] = round(nondp[0] / dp[0], 3)
        figures[f"{label}_{name}_overhead_ratio_cpu"] = round(nondp[1] / dp[1], 3)
    return figures


def _repeated(measure, repeats):
    """``measure()``'s figures over ``repeats`` runs: each figure's median, and every ratio's runs
    (``..._all``) and minimum (``..._min``)."""
    runs = [measure() for _ in range(repeats)]
    figures = {}
    for key in runs[0]:
        values = [run[key] for run in runs]
        figures[key] = round(statistics.median(values), 3)
        if "_ratio" in key:
            figures[f"{key}_all"], figures[f"{key}_min"] = values, min(values)
    return figures


# TFX taxi_utils_native_keras.py: (transformed name, tokens) of each wide input, and the dense inputs
WIDE_DEEP_DENSE = ("trip_miles_xf", "fare_xf", "trip_seconds_xf")
WIDE_DEEP_WIDE = (
    ("payment_type_xf", 1010),
    ("company_xf", 1010),
    ("pickup_latitude_xf", 10),
    ("pickup_longitude_xf", 10),
    ("dropoff_latitude_xf", 10),
    ("dropoff_longitude_xf", 10),
    ("trip_start_hour_xf", 24),
    ("trip_start_day_xf", 31),
    ("trip_start_month_xf", 13),
)
WIDE_DEEP_HIDDEN = (100, 70, 50, 25)


def build_wide_and_deep(seed=0):
    """TFX's taxi ``_build_keras_model`` (default hidden units), with seeded initialisers."""
    import tensorflow as tf

    tf.keras.utils.set_random_seed(seed)
    deep_in = {k: tf.keras.layers.Input(name=k, shape=(1,), dtype=tf.float32) for k in WIDE_DEEP_DENSE}
    wide_in = {k: tf.keras.layers.Input(name=k, shape=(1,), dtype="int32") for k, _ in WIDE_DEEP_WIDE}
    deep = tf.keras.layers.concatenate([tf.keras.layers.Normalization()(v) for v in deep_in.values()])
    for units in WIDE_DEEP_HIDDEN:
        deep = tf.keras.layers.Dense(units)(deep)
    wide = tf.keras.layers.concatenate(
        [tf.keras.layers.CategoryEncoding(num_tokens=tokens)(wide_in[k]) for k, tokens in WIDE_DEEP_WIDE]
    )
    output = tf.keras.layers.Dense(1, activation="sigmoid")(tf.keras.layers.concatenate([deep, wide]))
    output = tf.keras.layers.Reshape((1,))(output)
    return tf.keras.Model(list(deep_in.values()) + list(wide_in.values()), output)


def generated_wide_and_deep(rows, rng):
    """GENERATED rows shaped like TFX taxi's transformed features: z-scored floats [rows, 1], Zipf-like
    vocabulary ids, uniform bucket and categorical ids [rows, 1] int32; a 0/1 "big tipper" label from a
    logistic model of a few of them."""

    x = {k: rng.normal(size=(rows, 1)).astype(np.float32) for k in WIDE_DEEP_DENSE}
    for k, tokens in WIDE_DEEP_WIDE:
        if tokens > 100:
            ids = np.minimum(rng.zipf(1.3, size=rows) - 1, tokens - 1)
        else:
            ids = rng.integers(0, tokens, size=rows)
        x[k] = ids.reshape(-1, 1).astype(np.int32)
    logit = (
        0.8 * x["fare_xf"][:, 0]
        - 0.5 * x["trip_miles_xf"][:, 0]
        + 1.5 * (x["payment_type_xf"][:, 0] == 0)
        - 1.0
        + 0.3 * np.cos(x["trip_start_hour_xf"][:, 0] / 24 * 2 * np.pi)
    )
    y = (rng.random(rows) < 1 / (1 + np.exp(-logit))).astype(np.float32)
    return x, y


def _wide_deep_dp(x, y, batch, epochs, seed):
    """Per-step end times of one make_private fit (default engine), and its implementation."""
    from sage_tfx.models import make_private

    times = []
    private = make_private(
        build_wide_and_deep(seed),
        privacy_budget=(1.0, 1e-6),
        num_examples=len(y),
        loss="binary_crossentropy",
        optimizer="adam",
        learning_rate=0.001,
        clip_norm=1.0,
        batch_size=batch,
        epochs=epochs,
        seed=seed,
    )
    private.fit(x, y, callback=lambda _: times.append(time.perf_counter()))
    return times, private.privacy_spent["implementation"]


def _wide_deep_plain(x, y, batches, seed):
    """Per-step end times of plain (non-private) Keras training of the same model on the same batches."""
    import tensorflow as tf

    from sage_tfx.models.private import _take

    model = build_wide_and_deep(seed)
    optimizer = tf.keras.optimizers.Adam(learning_rate=0.001)
    loss_fn = tf.keras.losses.BinaryCrossentropy()

    @tf.function(reduce_retracing=True)
    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = loss_fn(yb[:, None], model(xb, training=True))
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))

    times = []
    for rows in batches:
        if len(rows):
            step(_take(x, rows), y[rows])
        times.append(time.perf_counter())
    return times


def _throughput(times, batches, warmup):
    """(examples/s over the timed steps, median seconds of a timed step)."""

    examples = sum(len(rows) for rows in batches[warmup + 1 :])
    return examples / (times[-1] - times[warmup]), float(np.median(np.diff(times[warmup:])))


def measure_wide_deep(rows, batch, steps, warmup, repeats, seed):
    """The wide-and-deep figures (module docstring): medians over ``repeats`` alternating runs."""

    from sage_tfx.models.private import poisson_batches
    from sage_tfx.privacy import dpsgd

    x, y = generated_wide_and_deep(rows, np.random.default_rng(seed))
    total = warmup + 1 + steps
    epochs = total * batch / rows
    n_steps = dpsgd.num_steps(rows, batch, epochs)
    # make_private(seed=s) outside DPTrainer samples with numpy's default_rng(s): the same batches here
    batches = list(poisson_batches(np.random.default_rng(seed), rows, dpsgd.sampling_rate(rows, batch), n_steps))
    dp_rates, plain_rates, ratios, total_ratios, implementation = [], [], [], [], None
    for repeat in range(repeats):
        order = ("dp", "plain") if repeat % 2 == 0 else ("plain", "dp")
        rates = {}
        for side in order:
            print(f"[wide_deep] repeat {repeat + 1}/{repeats}: {side} ({n_steps} steps)", file=sys.stderr, flush=True)
            if side == "dp":
                times, implementation = _wide_deep_dp(x, y, batch, epochs, seed)
            else:
                times = _wide_deep_plain(x, y, batches, seed)
            rates[side] = _throughput(times, batches, warmup)
        dp_rates.append(rates["dp"][0])
        plain_rates.append(rates["plain"][0])
        total_ratios.append(rates["plain"][0] / rates["dp"][0])
        ratios.append(rates["dp"][1] / rates["plain"][1])
    wide = sum(tokens for _, tokens in WIDE_DEEP_WIDE)
    return {
        "wide_deep_data": f"GENERATED rows shaped like TFX taxi's transformed features: {rows} rows, "
        f"{len(WIDE_DEEP_DENSE)} dense + {len(WIDE_DEEP_WIDE)} categorical inputs ({wide} one-hot)",
        "wide_deep_model": "TFX taxi _build_keras_model: Normalization, Dense 100/70/50/25 + CategoryEncoding wide "
        "-> Dense(1, sigmoid); Adam 0.001, binary cross-entropy",
        "wide_deep_batch_size": batch,
        "wide_deep_timed_steps": n_steps - warmup - 1,
        "wide_deep_repeats": repeats,
        "wide_deep_implementation": implementation,
        "wide_deep_dp_examples_per_second": round(statistics.median(dp_rates), 1),
        "wide_deep_nondp_examples_per_second": round(statistics.median(plain_rates), 1),
        "wide_deep_overhead_ratio": round(statistics.median(ratios), 3),
        "wide_deep_overhead_ratio_all": [round(r, 3) for r in ratios],
        "wide_deep_overhead_ratio_total_time": round(statistics.median(total_ratios), 3),
        "wide_deep_overhead_ratio_total_time_all": [round(r, 3) for r in total_ratios],
    }


def run(args):

    import sage_tfx  # noqa: F401  (before TensorFlow)
    from sage_tfx.models.dpsgd_models import DEFAULT_ENGINE as DEFAULT_IMPLEMENTATION

    implementations = args.implementations
    for name in implementations:
        if name not in IMPLEMENTATIONS:
            raise SystemExit(f"--implementations: {name!r} is not one of {IMPLEMENTATIONS}")
    for name in args.fit_models:
        if name not in FIT_MODELS:
            raise SystemExit(f"--fit-models: {name!r} is not one of {FIT_MODELS}")
    for name in (
        "rows",
        "steps",
        "wide_deep_rows",
        "wide_deep_batch",
        "wide_deep_steps",
        "repeats",
        "nn_repeats",
        "fit_rows",
        "fit_batch",
        "fit_epochs",
        "fit_repeats",
    ):
        if getattr(args, name) < 1:
            raise SystemExit(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.warmup < 0:
        raise SystemExit(f"--warmup must be >= 0, got {args.warmup}")
    if args.wide_deep_batch > args.wide_deep_rows:
        raise SystemExit(
            f"--wide-deep-batch {args.wide_deep_batch} exceeds --wide-deep-rows {args.wide_deep_rows}: lower it"
        )
    if args.only_fit:
        return _fits(args)
    if args.only_wide_deep:
        return measure_wide_deep(
            args.wide_deep_rows, args.wide_deep_batch, args.wide_deep_steps, args.warmup, args.repeats, args.seed
        )
    x, y = generated_taxi(args.rows, np.random.default_rng(args.seed))
    figures = {
        "data": f"generated taxi-like rows: {args.rows} x {x.shape[1]} one-hot features",
        "default_implementation": DEFAULT_IMPLEMENTATION,
    }
    common = (x, y, implementations, args.steps)
    figures.update(
        _repeated(
            lambda: _measure("small", (64, 32), 256, 0.01, *common, args.steps, args.warmup, args.seed),
            args.nn_repeats,
        )
    )
    if not args.skip_taxi_nn:
        figures.update(
            _repeated(
                lambda: _measure("taxi_nn", (5000, 100), 1024, 0.01, *common, args.slow_steps, args.warmup, args.seed),
                args.nn_repeats,
            )
        )
    main = "taxi_nn" if not args.skip_taxi_nn else "small"
    if f"{main}_{DEFAULT_IMPLEMENTATION}_examples_per_second" in figures:
        figures["dp_examples_per_second"] = figures[f"{main}_{DEFAULT_IMPLEMENTATION}_examples_per_second"]
        figures["nondp_examples_per_second"] = figures[f"{main}_nondp_examples_per_second"]
        figures["overhead_ratio"] = figures[f"{main}_{DEFAULT_IMPLEMENTATION}_overhead_ratio"]
    if not args.skip_wide_deep:
        figures.update(
            measure_wide_deep(
                args.wide_deep_rows, args.wide_deep_batch, args.wide_deep_steps, args.warmup, args.repeats, args.seed
            )
        )
    if not args.skip_fit:
        figures.update(_fits(args))
    return figures


def _fits(args):
    return measure_fits(args.fit_models, args.fit_rows, args.fit_batch, args.fit_epochs, args.fit_repeats, args.seed)
