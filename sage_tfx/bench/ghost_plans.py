"""CPU time per DP-SGD step: a ghost plan (LayerNormalization, Conv, EinsumDense, attention) vs the vmap fallback.

The same model, its layer's variables clipped by the ghost plan or (the layer type left out of the engine's
``ghost_types``) by the per-example vmap fallback the engine used for them before. Run:
``sage bench ghost-plans --layer layer-norm --json`` (or ``--layer conv``, ``einsum``, ``mha``; GENERATED data).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import sage_tfx  # noqa: F401  (before TensorFlow)
from sage_tfx.privacy.vocabulary import Metric

LAYERS = ("layer-norm", "conv", "einsum", "mha")
_PLANNED = {
    "layer-norm": ("LayerNormalization",),
    "conv": ("Conv1D", "Conv2D"),
    "einsum": ("EinsumDense",),
    "mha": ("MultiHeadAttention",),
}  # the layer classes each --layer times
_FALLBACK = {"layer-norm": 4, "conv": 4, "einsum": 4, "mha": 8}  # the timed layers' variables


def _model(tf, layer: str):
    """layer-norm: [B, 16, 32] Dense -> LayerNormalization -> Dense -> LayerNormalization -> head.
    conv: [B, 16, 16, 3] Conv2D 16 (3x3, same) -> Conv2D 16 (3x3, stride 2) -> head.
    einsum: [B, 16, 32] EinsumDense abc,cde->abde (4 heads x 8) -> EinsumDense abde,dej->abj (32) -> head.
    mha: [B, 16, 32] MultiHeadAttention self-attention (4 heads, key_dim 8) -> head."""
    inp = tf.keras.Input(shape=(16, 32))
    if layer == "einsum":
        dense = tf.keras.layers.EinsumDense
        h = dense("abc,cde->abde", output_shape=(16, 4, 8), bias_axes="de", activation="relu")(inp)
        h = dense("abde,dej->abj", output_shape=(16, 32), bias_axes="j")(h)
        return tf.keras.Model(inp, tf.keras.layers.Dense(1)(tf.keras.layers.GlobalAveragePooling1D()(h)))
    if layer == "mha":
        h = tf.keras.layers.MultiHeadAttention(4, 8)(inp, inp)
        return tf.keras.Model(inp, tf.keras.layers.Dense(1)(tf.keras.layers.GlobalAveragePooling1D()(h)))
    if layer == "conv":
        inp = tf.keras.Input(shape=(16, 16, 3))
        h = tf.keras.layers.Conv2D(16, 3, padding="same", activation="relu")(inp)
        h = tf.keras.layers.Conv2D(16, 3, strides=2, activation="relu")(h)
        return tf.keras.Model(inp, tf.keras.layers.Dense(1)(tf.keras.layers.GlobalAveragePooling2D()(h)))
    h = tf.keras.layers.LayerNormalization()(tf.keras.layers.Dense(64, activation="relu")(inp))
    h = tf.keras.layers.LayerNormalization()(tf.keras.layers.Dense(32)(h))
    return tf.keras.Model(inp, tf.keras.layers.Dense(1)(tf.keras.layers.GlobalAveragePooling1D()(h)))


def _engine(tf, model, layer: str | None):
    """The ghost engine planning every layer type (layer None) or all but ``layer``'s (its variables in the
    per-example vmap fallback)."""
    from sage_tfx.models.dpsgd_engine import make_engine
    from sage_tfx.models.ghost_plans import ghost_types
    from sage_tfx.models.losses import per_example_loss

    types = None
    if layer is not None:
        types = {t for t in ghost_types() if t.__name__ not in _PLANNED[layer]}
    engine = make_engine("ghost", model, per_example_loss(Metric.MSE, model), 1.0, 1.0, 0, ghost_types=types)
    return engine, tf.function(engine.noisy_sum)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The benchmark's options: batch size, steps a round, interleaved rounds.

    Args:
      parser: the ``sage bench ghost-plans`` parser.
    """
    parser.add_argument("--layer", choices=LAYERS, default="layer-norm", help="the plan timed")
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
    runs = {name: _engine(tf, model, None if name == "ghost" else args.layer) for name in ("ghost", "vmap_fallback")}
    want = _FALLBACK[args.layer]
    if runs["ghost"][0].fallback or len(runs["vmap_fallback"][0].fallback) != want:
        raise RuntimeError(f"the {args.layer} plan did not take (or leave) the model's {want} variables")
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
