"""CPU time per DP-SGD step of a small model with LayerNormalization: its gamma/beta clipped by the ghost
plan against the per-example vmap fallback the engine used for them before (the plan switched off).

Run: ``sage bench ghost-layer-norm --json`` (GENERATED data).
"""

from __future__ import annotations

import argparse
import statistics
import time
from unittest import mock

import numpy as np

import sage_tfx  # noqa: F401  (before TensorFlow)
from sage_tfx.privacy.vocabulary import Metric


def _model(tf):
    """Transformer-block-like: [B, 16, 32] Dense -> LayerNormalization -> Dense -> LayerNormalization -> head."""
    inp = tf.keras.Input(shape=(16, 32))
    h = tf.keras.layers.LayerNormalization()(tf.keras.layers.Dense(64, activation="relu")(inp))
    h = tf.keras.layers.LayerNormalization()(tf.keras.layers.Dense(32)(h))
    return tf.keras.Model(inp, tf.keras.layers.Dense(1)(tf.keras.layers.GlobalAveragePooling1D()(h)))


def _engine(tf, model, ghost_norm: bool):
    from sage_tfx.models import ghost_plans
    from sage_tfx.models.dpsgd_engine import LayerGhostEngine
    from sage_tfx.models.losses import per_example_loss

    if ghost_norm:
        engine = LayerGhostEngine(model, per_example_loss(Metric.MSE, model), 1.0, 1.0, seed=0)
    else:
        with mock.patch.object(ghost_plans, "layer_norm_plan", lambda layer, keras_input: None):
            engine = LayerGhostEngine(model, per_example_loss(Metric.MSE, model), 1.0, 1.0, seed=0)
    return engine, tf.function(engine.noisy_sum)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The benchmark's options: batch size, steps a round, interleaved rounds.

    Args:
      parser: the ``sage bench ghost-layer-norm`` parser.
    """
    parser.add_argument("--batch", type=int, default=64, help="records a step (default 64)")
    parser.add_argument("--steps", type=int, default=30, help="steps timed in each round (default 30)")
    parser.add_argument("--repeats", type=int, default=5, help="interleaved rounds, median taken (default 5)")


def run(args: argparse.Namespace) -> dict:
    """Median CPU seconds per step (process time over ``args.steps`` steps, ``args.repeats`` interleaved rounds)
    of the ghost LayerNormalization plan and of the vmap fallback, and their ratio.

    Args:
      args: ``batch``, ``steps`` and ``repeats`` (add_arguments).
    """
    batch, steps, repeats = args.batch, args.steps, args.repeats
    import tensorflow as tf  # noqa: TID253

    rng = np.random.default_rng(0)
    x = tf.constant(rng.normal(size=(batch, 16, 32)).astype(np.float32))
    y = tf.constant(rng.normal(size=batch).astype(np.float32))
    model = _model(tf)
    runs = {name: _engine(tf, model, name == "ghost") for name in ("ghost", "vmap_fallback")}
    assert not runs["ghost"][0].fallback and len(runs["vmap_fallback"][0].fallback) == 4
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
        "batch": batch,
        "steps": steps,
        "repeats": repeats,
        "cpu_s_per_step": med,
        "speedup": med["vmap_fallback"] / med["ghost"],
    }
