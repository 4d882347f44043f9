"""SavedModel export with a serving signature, optionally behind a tf.Transform graph.

``serving_default`` takes the model's features by name, or, with ``transform_output``, serialized
``tf.Example``s run through the transform graph. Contract: serving adds no privacy cost (the DP statistics in
the transform graph were released once at analysis time), and non-finite feature values become 0.0 as in
``fit``. ``export_keras_model`` exports a ``make_private`` model by its own Keras inputs.

Signatures in detail: docs/models.md ("Export and serving signatures").
"""

from __future__ import annotations

import sage_tfx  # noqa: F401  # isort: skip
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import tensorflow as tf  # noqa: TID253

from sage_tfx.models.data import FEATURE_DEFAULT

if TYPE_CHECKING:
    import tensorflow_transform as tft

    from sage_tfx.models.data import FeatureLayout


def _features_to_matrix(features, layout):
    blocks = [tf.reshape(tf.cast(features[k], tf.float32), [-1, w]) for k, w in zip(layout.keys, layout.widths)]
    matrix = tf.concat(blocks, axis=1)
    return tf.where(tf.math.is_finite(matrix), matrix, tf.fill(tf.shape(matrix), FEATURE_DEFAULT))


def export_saved_model(
    path: str,
    keras_model: tf.keras.Model,
    layout: FeatureLayout,
    outputs_fn: Callable[[tf.Tensor], dict[str, tf.Tensor]],
    transform_output: str | tft.TFTransformOutput | None = None,
    label_key: str | None = None,
) -> str:
    """Write ``keras_model`` as a SavedModel at ``path``; return ``path``.

    ``outputs_fn(model_output) -> dict of tensors`` maps the raw model output
    (predictions or logits) to the signature's outputs.
    """
    module = tf.Module()
    module.model = keras_model

    if transform_output is None:
        spec = {
            k: tf.TensorSpec([None] if w == 1 else [None, w], tf.float32, name=k)
            for k, w in zip(layout.keys, layout.widths)
        }

        @tf.function(input_signature=[spec])
        def serve(features):
            return outputs_fn(module.model(_features_to_matrix(features, layout), training=False))

        signature = serve.get_concrete_function()
    else:
        raw_spec = attach_transform(module, transform_output, label_key)

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="examples")])
        def serve(examples):
            raw = tf.io.parse_example(examples, raw_spec)
            transformed = module.tft_layer(raw)
            return outputs_fn(module.model(_features_to_matrix(transformed, layout), training=False))

        signature = serve.get_concrete_function()

    tf.saved_model.save(module, str(path), signatures={"serving_default": signature})
    return str(path)


def attach_transform(
    module: tf.Module, transform_output: str | tft.TFTransformOutput, label_key: str | None = None
) -> dict[str, Any]:
    """Attach a tf.Transform graph's layer to ``module`` (as ``module.tft_layer``, saved with it); return the raw
    feature spec the serving signature parses: every raw feature but the label."""
    import tensorflow_transform as tft

    if not isinstance(transform_output, tft.TFTransformOutput):
        transform_output = tft.TFTransformOutput(str(transform_output))
    module.tft_layer = transform_output.transform_features_layer()
    raw_spec = dict(transform_output.raw_feature_spec())
    if label_key is not None:
        raw_spec.pop(label_key, None)
    return raw_spec


def _input_specs(model):
    names = list(getattr(model, "input_names", None) or ["x"])
    inputs = tf.nest.flatten(model.inputs) if getattr(model, "inputs", None) else None
    if inputs is None:
        raise ValueError("export needs a model with known inputs: build it with an Input shape or fit it")
    return {name: tf.TensorSpec([None] + list(t.shape[1:]), t.dtype, name=name) for name, t in zip(names, inputs)}


def _call(model, features, names):
    args = [features[k] for k in names]
    return model(args[0] if len(args) == 1 else args, training=False)


def export_keras_model(
    model: tf.keras.Model, path: str, transform_output: Any = None, label_key: str | None = None
) -> str:
    """Write the Keras ``model`` (``make_private``'s) as a SavedModel with a ``serving_default`` signature; return
    ``path``.

    Without ``transform_output`` the signature takes the model's inputs by their Keras input names (one
    input of a Sequential model is usually named after its first layer); with it (a tf.Transform output,
    as ``trainer_utils.export_model`` passes) it takes serialized tf.Examples, applies the transform graph
    and feeds the transformed features of those names. Output: ``predictions`` (the model's output; a
    width-1 output is flattened to [None]). Post-processing only: no privacy cost.
    """
    specs = _input_specs(model)
    names = list(specs)
    module = tf.Module()
    module.model = model

    def outputs(out):
        if out.shape.rank == 2 and out.shape[1] == 1:
            out = tf.reshape(out, [-1])
        return {"predictions": out}

    if transform_output is None:

        @tf.function(input_signature=[specs])
        def serve(features):
            return outputs(_call(model, features, names))
    else:
        raw_spec = attach_transform(module, transform_output, label_key)

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="examples")])
        def serve(examples):
            transformed = module.tft_layer(tf.io.parse_example(examples, raw_spec))
            feats = {
                k: tf.reshape(tf.cast(transformed[k], specs[k].dtype), [-1] + list(specs[k].shape[1:])) for k in names
            }
            return outputs(_call(model, feats, names))

    tf.saved_model.save(module, str(path), signatures={"serving_default": serve.get_concrete_function()})
    return str(path)
