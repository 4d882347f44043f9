"""DPModelValidator's reading of the eval records and running of the model: the per-example values (losses
clipped to [0, B], or 0/1 correctness) the DP test releases. A record that lacks the label or a feature the
signature needs is skipped, a fixed function of the record alone, so every count and sum keeps its sensitivity
(docs/validation.md).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from sage_tfx.components._units import UNIT_PLAN_KEY, unit_id
from sage_tfx.privacy.errors import SageError
from sage_tfx.privacy.vocabulary import LOG_LOSS_FLOOR, Metric

if TYPE_CHECKING:
    from tfx.types.artifact import Artifact

BATCH = 4096


class ValidatorConfigError(SageError, ValueError):
    """A bad DPModelValidator parameter; the message names it."""


def split_records(examples: Artifact, split: str) -> list[bytes]:
    """The serialized tf.Examples of one split of an Examples artifact (gzip or plain TFRecord files)."""
    import tensorflow as tf
    from tfx.types import artifact_utils

    names = artifact_utils.decode_split_names(examples.split_names)
    if split not in names:
        raise ValidatorConfigError(f"split {split!r} is not in the Examples artifact (splits: {names})")
    folder = artifact_utils.get_split_uri([examples], split)
    files = sorted(os.path.join(folder, f) for f in tf.io.gfile.listdir(folder))
    records = []
    for path in files:
        compression = "GZIP" if path.endswith(".gz") else ""
        records.extend(r.numpy() for r in tf.data.TFRecordDataset(path, compression_type=compression))
    return records


def _feature_values(example, key, index=None):
    """The values of ``key`` in a parsed tf.Example as a list of floats ([] when absent or empty).

    NaN / inf values are returned as they are: ``per_example_values`` gives such a record the worst value.
    Bytes raise RecordError naming ``key`` only (never a value, nor the record's index).
    """
    from sage_tfx.privacy.errors import RecordError

    feature = example.features.feature.get(key)
    if feature is None:
        return []
    kind = feature.WhichOneof("kind")
    if kind in ("float_list", "int64_list"):
        return [float(v) for v in getattr(feature, kind).value]
    if kind == "bytes_list" and feature.bytes_list.value:
        raise RecordError(key, index, "holds bytes: a label or a model input must be numeric")
    return []


class ServingModel:
    """A SavedModel's ``serving_default`` signature: takes serialized tf.Examples (one string input) or
    features by name (float inputs, shape [None] or [None, width])."""

    def __init__(self, path: str) -> None:
        import tensorflow as tf

        if not tf.io.gfile.exists(os.path.join(path, "saved_model.pb")):
            raise ValidatorConfigError(f"no SavedModel at {path!r} (the Model artifact's serving directory)")
        self._loaded = tf.saved_model.load(path)
        if "serving_default" not in self._loaded.signatures:
            raise ValidatorConfigError(f"the SavedModel at {path!r} has no 'serving_default' signature")
        self.signature = self._loaded.signatures["serving_default"]
        _, specs = self.signature.structured_input_signature
        self.inputs = dict(specs)
        strings = [k for k, s in self.inputs.items() if s.dtype == tf.string]
        self.examples_input = strings[0] if len(self.inputs) == 1 and strings else None
        if strings and self.examples_input is None:
            raise ValidatorConfigError(
                f"signature inputs {sorted(self.inputs)}: mixed string/feature inputs "
                "are not supported (expected one 'examples' string or numeric features)"
            )

    def widths(self) -> dict[str, int]:
        return {k: (1 if len(s.shape) == 1 else int(s.shape[1])) for k, s in self.inputs.items()}

    def run(self, batch_records: Sequence[bytes], batch_features: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Signature outputs (numpy) for one batch."""
        import tensorflow as tf

        if self.examples_input is not None:
            out = self.signature(**{self.examples_input: tf.constant(batch_records)})
        else:
            feeds = {}
            for key, spec in self.inputs.items():
                values = np.asarray(batch_features[key], dtype=spec.dtype.as_numpy_dtype)
                feeds[key] = tf.constant(values.reshape(-1) if len(spec.shape) == 1 else values)
            out = self.signature(**feeds)
        return {k: v.numpy() for k, v in out.items()}

    def labels(self, records: Sequence[bytes], signature_name: str, label_key: str) -> np.ndarray:
        """The label of each serialized record as the SavedModel's ``signature_name`` signature computes it
        (TFMA's ``preprocessing_function_names``: e.g. TFX's ``transform_features`` gives the transformed
        label, such as the taxi example's ``tips > 0.2 * fare``). One float per record."""
        import tensorflow as tf

        signature = self._loaded.signatures.get(signature_name)
        if signature is None:
            raise ValidatorConfigError(
                f"label_signature {signature_name!r} is not a signature of the SavedModel "
                f"(it has {sorted(self._loaded.signatures)})"
            )
        _, specs = signature.structured_input_signature
        if len(specs) != 1 or next(iter(specs.values())).dtype != tf.string:
            raise ValidatorConfigError(
                f"label_signature {signature_name!r} must take one string input (serialized "
                f"tf.Examples), not {sorted(specs)}"
            )
        (name,) = specs
        out = []
        for start in range(0, len(records), BATCH):
            batch = records[start : start + BATCH]
            result = signature(**{name: tf.constant(batch)})
            if label_key not in result:
                raise ValidatorConfigError(
                    f"label_signature {signature_name!r} returns no {label_key!r} (it returns {sorted(result)})"
                )
            values = np.asarray(result[label_key].numpy(), dtype=np.float64).reshape(-1)
            if values.shape != (len(batch),):  # the sizes are counts of records: not in the message
                raise ValidatorConfigError(
                    f"label_signature {signature_name!r} did not give one {label_key!r} per "
                    "record: the label must be one value per record"
                )
            out.append(values)
        return np.concatenate(out) if out else np.zeros(0)


def model_outputs(
    model: ServingModel, records: Sequence[bytes], label_key: str, label_signature: str | None = None
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """``kept_outputs`` without unit ids."""
    labels, outputs, _ = kept_outputs(model, records, label_key, label_signature)
    return labels, outputs


def kept_outputs(
    model: ServingModel,
    records: Sequence[bytes],
    label_key: str,
    label_signature: str | None = None,
    unit_column: str | None = None,
) -> tuple[np.ndarray, dict[str, np.ndarray], np.ndarray | None]:
    """(labels, {output: array}, units) over the records that carry the label and every feature the model reads;
    ``units``: each kept record's ``unit_column`` id (``_units.unit_id``, read in the same parse), None without a
    column.

    Which records are kept is a fixed function of each record alone (its label and inputs present with the
    right width). Values are not checked here: a NaN / inf label or output gets the worst per-example value.
    With ``label_signature`` the label is that signature's ``label_key`` output for the record (a fixed
    function of the record and of the model, which was fixed before this test read anything), so every
    record is kept for its label and each per-example value still depends on its own record alone.
    """
    import tensorflow as tf

    widths = {} if model.examples_input is not None else model.widths()
    labels, kept, features = [], [], {k: [] for k in widths}
    units: list[str] | None = None if unit_column is None else []
    for index, record in enumerate(records):
        example = tf.train.Example.FromString(record)
        if label_signature is None:
            label = _feature_values(example, label_key, index)
            if len(label) != 1:
                continue
        values = {k: _feature_values(example, k, index) for k in widths}
        if any(len(values[k]) != w for k, w in widths.items()):
            continue
        labels.append(label[0] if label_signature is None else None)
        kept.append(record)
        if units is not None:
            units.append(unit_id(example, unit_column))
        for k in widths:
            features[k].append(values[k])
    if not labels:  # validated as an empty set (noise only): saying so after the charge would publish a count
        return np.zeros(0), {}, None if units is None else np.asarray(units, dtype=object)
    if label_signature is not None:
        labels = model.labels(kept, label_signature, label_key)
    outputs = {}
    for start in range(0, len(labels), BATCH):
        part = model.run(kept[start : start + BATCH], {k: v[start : start + BATCH] for k, v in features.items()})
        for k, v in part.items():
            outputs.setdefault(k, []).append(v)
    unit_ids = None if units is None else np.asarray(units, dtype=object)
    return np.asarray(labels), {k: np.concatenate(v) for k, v in outputs.items()}, unit_ids


def _pick(outputs, wanted, metric):
    for key in wanted:
        if key in outputs:
            return outputs[key]
    if len(outputs) == 1:
        return next(iter(outputs.values()))
    raise ValidatorConfigError(
        f"metric {metric!r}: cannot tell which signature output to use among {sorted(outputs)}; set prediction_key"
    )


def split_values(
    model: ServingModel, records: Sequence[bytes], plan: Mapping[str, Any], loss_fn: Callable[..., Any] | None = None
) -> tuple[np.ndarray, np.ndarray | None]:
    """(values, units): the per-example values of one split's serialized records (the model run on them, the label
    derived by ``label_threshold`` when the plan has one, then ``per_example_values``), and on a unit stream each
    kept record's unit id (``_units.unit_id``; None on a row stream)."""

    labels, outputs, units = kept_outputs(
        model, records, plan["label_key"], plan.get("label_signature"), plan.get(UNIT_PLAN_KEY)
    )
    if not len(labels):
        return np.zeros(0), units
    if plan.get("label_threshold") is not None:
        # A derived binary label, e.g. "delayed" = arr_delay > 15: a fixed function of the record's own label
        # (NaN compares False: 0), so every count and sum keeps its sensitivity.
        labels = (labels > plan["label_threshold"]).astype(np.float64)
    return per_example_values(
        plan["metric"], labels, outputs, plan["prediction_key"], plan["loss_bound"], loss_fn
    ), units


def per_example_values(
    metric: str,
    labels: np.ndarray,
    outputs: Mapping[str, np.ndarray],
    prediction_key: str | None = None,
    loss_bound: float | None = None,
    loss_fn: Callable[..., Any] | None = None,
) -> np.ndarray:
    """Per-example losses (mse: squared error, mae: absolute error, log_loss: -log p(label)) or 0/1
    correctness (accuracy), from the signature's outputs. Multi-class outputs ([n, k] probabilities) take
    integer labels in [0, k).

    A record whose label or model output is NaN or +-inf gets the WORST value: ``loss_bound`` B for a loss
    (what clipping its infinite loss to [0, B] gives), 0 ("incorrect") for accuracy. It is a fixed function
    of the record alone, so the validator's sensitivity (B per record in a clipped sum, 1 in a count) and
    its epsilon are unchanged, and nothing fails because of a value. Without ``loss_bound`` (called outside
    the executor) a non-finite record of mse / mae raises RecordError; log_loss defaults to ln(1/floor). A
    finite label that is not a class id (multi-class outputs) or not 0/1 (binary) is a bad record too: the
    worst value, never an error naming it.
    """

    from sage_tfx.validation import absolute_errors, correctness, log_losses, squared_errors

    if metric == Metric.CUSTOM:
        return custom_losses(loss_fn, labels, outputs, loss_bound)

    if prediction_key is not None:
        if prediction_key not in outputs:
            raise ValidatorConfigError(
                f"prediction_key {prediction_key!r} is not an output of the signature (outputs: {sorted(outputs)})"
            )
        out = outputs[prediction_key]
    elif metric in (Metric.MSE, Metric.MAE):
        out = _pick(outputs, ("predictions",), metric)
    elif metric == Metric.LOG_LOSS:
        out = _pick(outputs, ("probabilities",), metric)
    else:
        out = _pick(outputs, ("classes", "probabilities", "predictions"), metric)
    out = np.asarray(out, dtype=np.float64)

    if metric == Metric.MSE:
        return squared_errors(labels, out, loss_bound=loss_bound)
    if metric == Metric.MAE:
        return absolute_errors(labels, out, loss_bound=loss_bound)
    if out.ndim == 2 and out.shape[1] > 1:  # multi-class probabilities
        labels = np.asarray(labels, dtype=np.float64).reshape(-1)
        classes = _class_ids(labels, out.shape[1])  # -1 where the label is not finite or not a class id
        bad = (classes < 0) | ~np.all(np.isfinite(out), axis=1)
        safe = np.where(bad, 0, classes)
        if metric == Metric.ACCURACY:
            return ((np.argmax(np.where(bad[:, None], 0.0, out), axis=1) == safe) & ~bad).astype(np.float64)
        worst = -math.log(LOG_LOSS_FLOOR) if loss_bound is None else loss_bound
        picked = np.where(bad, 1.0, out[np.arange(len(safe)), safe])
        return np.where(bad, worst, -np.log(np.clip(picked, LOG_LOSS_FLOOR, 1.0)))
    if metric == Metric.LOG_LOSS:
        return log_losses(labels, out, floor=LOG_LOSS_FLOOR, loss_bound=loss_bound)
    # accuracy from class ids (0/1) or from P(label = 1): correct iff (score >= 0.5) == label
    return correctness(labels, out, threshold=0.5)


def custom_losses(
    loss_fn: Callable[..., Any], labels: np.ndarray, outputs: Mapping[str, np.ndarray], loss_bound: float
) -> np.ndarray:
    """The user's ``loss_fn(labels, outputs)`` per example, clipped to the public [0, B]; a non-finite loss is B.

    Clipping to [0, B] is what makes the validator's sensitivity B hold whatever the function computes, and
    the non-finite rule is a fixed function of the record alone, as for the built-in metrics.
    """

    if loss_fn is None or loss_bound is None:
        raise ValidatorConfigError("metric 'custom' needs a loss function and its loss_bound B")
    values = np.asarray(loss_fn(np.asarray(labels), dict(outputs)), dtype=np.float64).reshape(-1)
    if values.shape != (len(labels),):  # the sizes are counts of records: not in the message
        raise ValidatorConfigError(
            "the custom loss function did not return one loss per record: it must return "
            "an array of shape [n] for n labels (reproduce it with `sage run --check`)"
        )
    return np.clip(np.where(np.isfinite(values), values, loss_bound), 0.0, loss_bound)


def _class_ids(labels, k):
    """Integer class ids of ``labels`` in [0, k); -1 where a label is NaN / +-inf or not an integer in [0, k):
    the caller gives that record the worst value (a fixed function of the record alone, as for NaN), so no
    record's label fails the release after its charge."""

    labels = np.asarray(labels, dtype=np.float64)
    finite = np.isfinite(labels)
    safe = np.where(finite, labels, -1.0)
    ids = safe.astype(np.int64)
    return np.where(finite & (ids == safe) & (ids >= 0) & (ids < k), ids, -1)
