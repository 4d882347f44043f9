"""CPU time per DP-SGD step with a ghost plan (LayerNormalization or Conv) against the vmap fallback.

The same model, its layer's variables clipped by the ghost plan or (the plan switched off) by the per-example
vmap fallback the engine used for them before. Run: ``sage bench ghost-plans --layer layer-norm --json``
(or ``--layer conv``; GENERATED data).
"""

from __future__ import annotations

import argparse
import statistics
import time
from unittest import mock

import numpy as np

import sage_tfx  # noqa: F401  (before TensorFlow)
from sage_tfx.privacy.vocabulary import Metric


def _model(tf, layer: str):
    """layer-norm: [B, 16, 32] Dense -> LayerNormalization -> Dense -> LayerNormalization -> head.
    conv: [B, 16, 16, 3] Conv2D 16 (3x3, same) -> Conv2D 16 (3x3, stride 2) -> head."""
    if layer == "conv":
        inp = tf.keras.Input(shape=(16, 16, 3))
        h = tf.keras.layers.Conv2D(16, 3, padding="same", activation="relu")(inp)
        h = tf.keras.layers.Conv2D(16, 3, strides=2, activation="relu")(h)
        return tf.keras.Model(inp, tf.keras.layers.Dense(1)(tf.keras.layers.GlobalAveragePooling2D()(h)))
    inp = tf.keras.Input(shape=(16, 32))
    h = tf.keras.layers.LayerNormalization()(tf.keras.layers.Dense(64, activation="relu")(inp))
    h = tf.keras.layers.LayerNormalization()(tf.keras.layers.Dense(32)(h))
    return tf.keras.Model(inp, tf.keras.layers.Dense(1)(tf.keras.layers.GlobalAveragePooling1D()(h)))


def _engine(tf, model, plan: str | None):
    """The engine with every plan (plan None) or with the plan function ``plan`` of ghost_plans switched off."""
    from sage_tfx.models import ghost_plans
    from sage_tfx.models.dpsgd_engine import LayerGhostEngine
    from sage_tfx.models.losses import per_example_loss

    if plan is None:
        engine = LayerGhostEngine(model, per_example_loss(Metric.MSE, model), 1.0, 1.0, seed=0)
    else:
        with mock.patch.object(ghost_plans, plan, lambda layer, keras_input: None):
            engine = LayerGhostEngine(model, per_example_loss(Metric.MSE, model), 1.0, 1.0, seed=0)
    return engine, tf.function(engine.noisy_sum)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The benchmark's options: batch size, steps a round, interleaved rounds.

    Args:
      parser: the ``sage bench ghost-plans`` parser.
    """
    parser.add_argument("--layer", choices=("layer-norm", "conv"), default="layer-norm", help="the plan timed")
    parser.add_argument("--batch", type=int, default=64, help="records a step (default 64)")
    parser.add_argument("--steps", type=int, default=30, help="steps timed in each round (default 30)")
    parser.add_argument("--repeats", type=int, default=5, help="interleaved rounds, median taken (default 5)")


def run(args: argparse.Namespace) -> dict:
    """Median CPU seconds per step (process time over ``args.steps`` steps, ``args.repeats`` interleaved rounds)
    of the ghost plan of ``args.layer`` and of the vmap fallback, and their ratio.

    Args:
      args: ``layer``, ``batch``, ``steps`` and ``repeats`` (add_arguments).
    """
    batch, steps, repeats = args.batch, args.steps, args.repeats
    import tensorflow as tf  # noqa: TID253

    rng = np.random.default_rng(0)
    shape = (16, 16, 3) if args.layer == "conv" else (16, 32)
    x = tf.constant(rng.normal(size=(batch, *shape)).astype(np.float32))
    y = tf.constant(rng.normal(size=batch).astype(np.float32))
    model = _model(tf, args.layer)
    plan = "conv_plan" if args.layer == "conv" else "layer_norm_plan"
    runs = {name: _engine(tf, model, None if name == "ghost" else plan) for name in ("ghost", "vmap_fallback")}
    if runs["ghost"][0].fallback or len(runs["vmap_fallback"][0].fallback) != 4:
        raise RuntimeError(f"the {args.layer} plan did not take (or leave) the model's 4 variables")
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _, step in runs.values():
        step(x, y)  # trace
    for _ in range(repeats):
        for name, (_, step) in runs.items():
            start = time.process_time()
            for _ in range(steps):
                step(x, y)
            times[name].append((time.process_time() - start) / steps)
    med = {name: statistics.median(t) for name, t in times.items()}
    return {
        "layer": args.layer,
        "batch": batch,
        "steps": steps,
        "repeats": repeats,
        "cpu_s_per_step": med,
        "speedup": med["vmap_fallback"] / med["ghost"],
    }
