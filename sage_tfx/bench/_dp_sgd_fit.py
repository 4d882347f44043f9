"""Whole ``fit`` against whole ``fit`` (part of ``sage bench dp-sgd``): make_private, plain Keras ``fit`` and
tensorflow-privacy 0.9.0's fast gradient clipping (``make_dp_model_class`` with its default layer registry,
Dense and Embedding) on the same model, data, batch size and epochs, in one process, interleaved.

Figures are process CPU seconds (the machine is shared: CPU time is the steadier measure): the whole fit (from
the call, model built, to its return: tracing, noise calibration, every step), the first step (to the end of
step 0, the fixed start-up) and the median later step, each timed by a per-step callback. Each side builds a
fresh model from the same seed; make_private's calibration cache is cleared before each of its fits, so every
fit calibrates (dp_accounting is imported before any timing, as in a pipeline's process). tensorflow-privacy
gets make_private's noise multiplier. Ratios are DP / Keras per repeat; the figures are min and median over
``repeats`` (the order of the three sides rotates). Models: a 3x256 ReLU MLP on 32 GENERATED normal features,
an Embedding(10000, 32) of 4 GENERATED Zipf-like ids -> Dense 64 -> Dense 1, and a small Conv2D (16x16x3
GENERATED normal images -> Conv2D 16 3x3 -> Conv2D 16 3x3 stride 2 -> Dense 1) and TFX's taxi wide-and-deep
(``dp_sgd.build_wide_and_deep`` on ``dp_sgd.generated_wide_and_deep`` rows); Keras MeanSquaredError, SGD
lr 0.05 on every model. tensorflow-privacy's default registry has no Conv2D entry: on that model its DP model class turns its
fast clipping off for the whole model and computes per-example gradients (its ``vectorized_map`` path).
"""

import statistics
import sys
import time

import numpy as np

SIDES = ("keras", "make_private", "tf_privacy_fast")
FIT_MODELS = ("mlp_3x256", "embedding_10k", "conv2d_small", "wide_deep")
# wide_deep is left out by default: tensorflow-privacy's fast clipping took about 4 s a step on it
DEFAULT_FIT_MODELS = FIT_MODELS[:3]


def _build(name, seed):
    import tensorflow as tf

    if name == "wide_deep":
        from sage_tfx.bench.dp_sgd import build_wide_and_deep  # noqa: PLC0415 (dp_sgd imports this module)

        model = build_wide_and_deep(seed)
        return model.inputs, model.outputs[0]
    tf.keras.utils.set_random_seed(seed)
    if name == "mlp_3x256":
        inputs = tf.keras.Input((32,))
        hidden = inputs
        for _ in range(3):
            hidden = tf.keras.layers.Dense(256, activation="relu")(hidden)
    elif name == "conv2d_small":
        inputs = tf.keras.Input((16, 16, 3))
        hidden = tf.keras.layers.Conv2D(16, 3, activation="relu")(inputs)
        hidden = tf.keras.layers.Conv2D(16, 3, strides=2, activation="relu")(hidden)
        hidden = tf.keras.layers.Flatten()(hidden)
    else:
        inputs = tf.keras.Input((4,), dtype="int32")
        hidden = tf.keras.layers.Flatten()(tf.keras.layers.Embedding(10_000, 32)(inputs))
        hidden = tf.keras.layers.Dense(64, activation="relu")(hidden)
    return inputs, tf.keras.layers.Dense(1)(hidden)


def _data(name, rows, rng):
    if name == "wide_deep":
        from sage_tfx.bench.dp_sgd import generated_wide_and_deep  # noqa: PLC0415

        return generated_wide_and_deep(rows, rng)
    if name == "mlp_3x256":
        x = rng.normal(size=(rows, 32)).astype(np.float32)
        return x, (x[:, :4].sum(axis=1) + 0.1 * rng.normal(size=rows)).astype(np.float32)
    if name == "conv2d_small":
        x = rng.normal(size=(rows, 16, 16, 3)).astype(np.float32)
        return x, (x[:, :4, :4, 0].mean(axis=(1, 2)) + 0.1 * rng.normal(size=rows)).astype(np.float32)
    x = (np.minimum(rng.zipf(1.3, size=(rows, 4)), 10_000) - 1).astype(np.int32)
    return x, (np.log1p(x).mean(axis=1) / 5).astype(np.float32)


class _Clock:
    """CPU seconds at each step's end (a callback of make_private, or of a Keras fit)."""

    def __init__(self):
        self.start, self.ends = time.process_time(), []

    def step(self, *_):
        self.ends.append(time.process_time())

    def figures(self):
        total = time.process_time() - self.start
        steps = np.diff([self.start] + self.ends)
        return {"fit": total, "first_step": float(steps[0]), "step": float(np.median(steps[1:]))}


def _keras_callback(clock):
    import tensorflow as tf

    return tf.keras.callbacks.LambdaCallback(on_train_batch_end=clock.step)


def _fit(side, name, x, y, batch, epochs, sigma, seed):
    import tensorflow as tf

    from sage_tfx.models import make_private
    from sage_tfx.privacy import dpsgd

    inputs, outputs = _build(name, seed)
    if side == "make_private":
        dpsgd._calibrated_multiplier.cache_clear()  # every fit calibrates, as a fresh process does
        dpsgd._memo_epsilon.cache_clear()
        private = make_private(
            tf.keras.Model(inputs, outputs),
            privacy_budget=(1.0, 1e-5),
            num_examples=len(y),
            batch_size=batch,
            epochs=epochs,
            loss=tf.keras.losses.MeanSquaredError(),  # the same loss object as the other two sides
            learning_rate=0.05,
            seed=seed,
        )
        clock = _Clock()
        private.fit(x, y, callback=clock.step)
        return clock.figures()
    if side == "keras":
        model = tf.keras.Model(inputs, outputs)
        loss = tf.keras.losses.MeanSquaredError()
    else:
        from sage_tfx.compat.tf_privacy import import_submodule

        registry = import_submodule("privacy.fast_gradient_clipping.layer_registry").make_default_layer_registry()
        dp_model = import_submodule("privacy.keras_models.dp_keras_model").make_dp_model_class(tf.keras.Model)
        model = dp_model(
            l2_norm_clip=1.0, noise_multiplier=sigma, layer_registry=registry, inputs=inputs, outputs=outputs
        )
        loss = tf.keras.losses.MeanSquaredError()  # reduced: its fast clipping refuses an unreduced loss
    model.compile(optimizer=tf.keras.optimizers.SGD(learning_rate=0.05), loss=loss)
    clock = _Clock()
    model.fit(x, y[:, None], batch_size=batch, epochs=int(epochs), verbose=0, callbacks=[_keras_callback(clock)])
    return clock.figures()


def _summary(values):
    return {"min": round(min(values), 3), "median": round(statistics.median(values), 3)}


def measure_fits(models, rows, batch, epochs, repeats, seed):
    """The whole-fit figures (module docstring) of ``models``: {model: {figure: {min, median}}}."""
    import dp_accounting.mechanism_calibration  # noqa: F401  (imported before timing, see the docstring)
    import dp_accounting.rdp.rdp_privacy_accountant  # noqa: F401

    from sage_tfx.privacy import dpsgd

    sigma = dpsgd.calibrate_noise_multiplier(1.0, 1e-5, rows, batch, epochs)
    out = {}
    for name in models:
        x, y = _data(name, rows, np.random.default_rng(seed))
        runs = {side: [] for side in SIDES}
        for repeat in range(repeats):
            order = SIDES[repeat % 3 :] + SIDES[: repeat % 3]
            for side in order:
                print(f"[fit] {name} repeat {repeat + 1}/{repeats}: {side}", file=sys.stderr, flush=True)
                runs[side].append(_fit(side, name, x, y, batch, epochs, sigma, seed))
        figures = {}
        for side in SIDES[1:]:
            for key in ("fit", "first_step", "step"):
                ratios = [dp[key] / plain[key] for dp, plain in zip(runs[side], runs["keras"])]
                figures[f"{side}_{key}_ratio"] = _summary(ratios)
        for side in SIDES:
            for key in ("fit", "first_step", "step"):
                figures[f"{side}_{key}_cpu_s"] = _summary([run[key] for run in runs[side]])
        out[name] = figures
    return {
        "fit_comparison": out,
        "fit_setting": f"{rows} GENERATED rows, batch {batch}, {epochs:g} epochs, {repeats} repeats, CPU seconds",
    }
