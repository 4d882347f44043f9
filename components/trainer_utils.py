"""Helpers for DPTrainer module files: read the examples, export the model, report what it spent.

``load_examples`` drops each record that lacks a declared feature or the label or holds a non-finite value
there (a rule applied to each record alone), ``export_model`` writes the serving SavedModel, and
``report_spent`` writes ``privacy_spent.json`` (the DpEvent as JSON) for DPTrainer to re-account; a spend
outside the grant's training share is refused and the model deleted. DP models fitted inside ``run_fn`` take
their seed from the grant (pass none).

A module file, step by step: docs/your_pipeline.md, "Inside `run_fn`: `fn_args` and `trainer_utils`".
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from sage_tfx.privacy.checks import number, positive
from sage_tfx.privacy.errors import SageError

if TYPE_CHECKING:
    import dp_accounting

SPENT_FILE = "privacy_spent.json"
TYPE_KEY = "__event__"  # the DpEvent class name in its JSON (events have a field called "event")
# privacy_spent keys copied into the report (the DpEvent goes in as JSON)
_REPORTED = (
    "epsilon",
    "delta",
    "noise_multiplier",
    "steps",
    "sampling_rate",
    "num_examples",
    "accountant",
    "mechanism",
    "implementation",
    "calibration",
    "ridge",
    "noise_schedule",
    "adaptive_clip",
)


class TrainerDataError(SageError, ValueError):
    """A module file's data request cannot be met; the message names the feature or file."""


# ------------------------------------------------------------------------------------------- DpEvent JSON


def event_to_json(event: dp_accounting.DpEvent) -> Any:
    """A dp_accounting DpEvent as plain JSON: {"__event__": class name, fields...}, nested events alike."""
    import attr

    def encode(value):
        if attr.has(type(value)):
            body = {TYPE_KEY: type(value).__name__}
            body.update({k: encode(v) for k, v in attr.asdict(value, recurse=False).items()})
            return body
        if isinstance(value, (list, tuple)):
            return [encode(v) for v in value]
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"DpEvent field value {value!r} is not finite")
        return value

    if not attr.has(type(event)) or not type(event).__module__.startswith("dp_accounting"):
        raise ValueError(f"dp_event {event!r} is not a dp_accounting DpEvent")
    return encode(event)


def event_from_json(data: Any) -> dp_accounting.DpEvent:
    """Inverse of ``event_to_json``: only dp_accounting's own event classes are rebuilt."""
    import dp_accounting

    def decode(value):
        if isinstance(value, dict):
            name = value.get(TYPE_KEY)
            cls = getattr(dp_accounting, str(name), None)
            if not (isinstance(cls, type) and issubclass(cls, dp_accounting.DpEvent)):
                raise ValueError(f"dp_event type {name!r} is not a dp_accounting DpEvent")
            return cls(**{k: decode(v) for k, v in value.items() if k != TYPE_KEY})
        if isinstance(value, list):
            return [decode(v) for v in value]
        return value

    return decode(data)


# ------------------------------------------------------------------------------------------- spend report


def spent_report(model_or_spent: Any) -> dict[str, Any]:
    """The JSON-able report of a fitted DP model's ``privacy_spent`` (or of that dict itself)."""
    spent = getattr(model_or_spent, "privacy_spent", model_or_spent)
    if not isinstance(spent, dict):
        raise ValueError(
            f"{type(model_or_spent).__name__} reports no privacy_spent dict: fit a sage_tfx DP model first"
        )
    missing = [k for k in ("epsilon", "delta", "dp_event") if spent.get(k) is None]
    if missing:
        raise ValueError(f"privacy_spent lacks {missing}: it must hold the DpEvent and its (epsilon, delta)")
    report = {k: spent[k] for k in _REPORTED if spent.get(k) is not None}
    report["dp_event"] = spent["dp_event"] if isinstance(spent["dp_event"], dict) else event_to_json(spent["dp_event"])
    return report


def report_spent(fn_args: Any, model: Any) -> dict[str, Any]:
    """Write what ``model`` spent to ``<model_run_dir>/privacy_spent.json``; return the report.

    One DP model per DPTrainer run: the grant's training share pays for one, so a second report is refused.
    """
    import tensorflow as tf

    path = os.path.join(fn_args.model_run_dir, SPENT_FILE)
    if tf.io.gfile.exists(path):
        raise ValueError(f"{path} exists: a DPTrainer run reports one model (its grant's training share pays for one)")
    report = spent_report(model)
    tf.io.gfile.makedirs(fn_args.model_run_dir)
    with tf.io.gfile.GFile(path, "w") as f:
        f.write(json.dumps(report, indent=2, sort_keys=True))
    return report


def read_report(model_run_dir: str) -> dict[str, Any] | None:
    """The report written by ``report_spent``, or None."""
    import tensorflow as tf

    path = os.path.join(model_run_dir, SPENT_FILE)
    if not tf.io.gfile.exists(path):
        return None
    with tf.io.gfile.GFile(path) as f:
        return json.loads(f.read())


# ------------------------------------------------------------------------------------------- examples


def _feature_maps(features):
    """{name: (low, high, clip)} from a list of names, {name: scale} or {name: (low, high)}.

    A value v becomes (v - low) / (high - low): a scale s is (0, s) without clipping; a public range
    (low, high) clips v into it first, so the model sees [0, 1].
    """
    if isinstance(features, str):
        features = [features]
    given = dict(features) if isinstance(features, dict) else {name: 1.0 for name in features}
    if not given:
        raise TrainerDataError("features: declare at least one feature name")
    maps = {}
    for name, spec in given.items():
        if isinstance(spec, (int, float)):
            low, high, clip = 0.0, float(spec), False
        else:
            try:
                low, high = (float(v) for v in spec)
            except (TypeError, ValueError):
                raise TrainerDataError(f"feature {name!r}: {spec!r} must be a scale or a (low, high) range") from None
            clip = True
        if not (math.isfinite(low) and math.isfinite(high) and high > low):
            raise TrainerDataError(f"feature {name!r}: {spec!r} must be a finite scale > 0 or a range low < high")
        maps[name] = (low, high, clip)
    return maps


def _apply_map(values, low, high, clip, lib):
    """(v - low) / (high - low), clipped to [low, high] first if ``clip`` (numpy or tf as ``lib``)."""
    if clip:
        values = lib.clip(values, low, high) if lib.__name__ == "numpy" else lib.clip_by_value(values, low, high)
    return (values - low) / (high - low)


def _files(patterns):
    import tensorflow as tf

    files = sorted(f for p in patterns for f in tf.io.gfile.glob(p))
    if not files:
        raise TrainerDataError(f"no example files match {list(patterns)}")
    return files


def _record_dataset(files):
    import tensorflow as tf

    gz = [f for f in files if f.endswith(".gz")]
    plain = [f for f in files if not f.endswith(".gz")]
    parts = [tf.data.TFRecordDataset(fs, compression_type=c) for fs, c in ((gz, "GZIP"), (plain, "")) if fs]
    ds = parts[0]
    for p in parts[1:]:
        ds = ds.concatenate(p)
    return ds


def _specs_from_transform(transform_graph_path, names):
    """{name: (dtype, width)} from the transformed feature spec of a tf.Transform output."""
    import tensorflow as tf
    import tensorflow_transform as tft

    spec = tft.TFTransformOutput(transform_graph_path).transformed_feature_spec()
    out = {}
    for name in names:
        if name not in spec:
            raise TrainerDataError(f"feature {name!r} is not a transformed feature (have {sorted(spec)})")
        feature = spec[name]
        shape = list(getattr(feature, "shape", []) or [])
        out[name] = (feature.dtype, int(math.prod(shape)) if shape else 1)
    for name, (dtype, _) in out.items():
        if dtype == tf.string:
            raise TrainerDataError(f"feature {name!r} holds strings: DP models take numbers")
    return out


def _specs_from_records(files, names):
    """{name: (dtype, 1)} for raw tf.Examples: the kind of the first record that carries each feature."""
    import tensorflow as tf

    found = {}
    for record in _record_dataset(files).take(1000):
        example = tf.train.Example.FromString(record.numpy())
        for name in names:
            feature = example.features.feature.get(name)
            if name in found or feature is None:
                continue
            kind = feature.WhichOneof("kind")
            if kind == "bytes_list":
                raise TrainerDataError(f"feature {name!r} holds bytes: DP models take numbers")
            if kind and getattr(feature, kind).value:
                found[name] = (tf.float32 if kind == "float_list" else tf.int64, 1)
        if len(found) == len(names):
            break
    missing = [n for n in names if n not in found]
    if missing:
        raise TrainerDataError(f"feature(s) {missing} carry no value in the first 1000 examples of {files[0]}")
    return found


def load_examples(
    fn_args: Any,
    features: Sequence[str] | Mapping[str, Any],
    label: str | None,
    split: str = "train",
    batch_size: int = 8192,
) -> Any:
    """(features {name: float32 array}, labels float32 array) of a split, as numpy.

    ``split`` "train" reads ``fn_args.train_files``, "eval" ``fn_args.eval_files``; under a parallel grant
    DPTrainer hands ``run_fn`` no eval files (its test records are the validator's ACCEPT test's alone) and
    "eval" is refused with TrainerDataError. ``features``: a list of
    names, {name: public scale} (each value divided by it) or {name: (low, high)} (each value clipped to
    the public range, then mapped to [0, 1]); pass the same to ``export_model`` so that serving maps
    alike. Scales and ranges must be public, chosen without looking at the data. With a transform graph
    (``fn_args.transform_graph_path``) the names are transformed features and their widths come from its
    spec; raw features are scalars. Records lacking a declared feature or the label (missing, empty, or
    another number of values than the width) or holding NaN / inf in one are dropped, each on its own
    values alone, so one record changes what is returned by at most itself (the sensitivity the DP models
    assume). No record left (or none read) gives empty arrays, not an error: a failure there would reveal
    the data after the charge. Errors name features, files or the split, never a value.
    """
    import tensorflow as tf

    maps = _feature_maps(features)
    if split not in ("train", "eval"):
        raise TrainerDataError(f"split {split!r} must be 'train' or 'eval'")
    if split == "eval" and getattr(fn_args, "grant_id", None) and not fn_args.eval_files:
        raise TrainerDataError(
            f"split 'eval' is not given to run_fn under grant {fn_args.grant_id!r}: its parallel "
            "rule charges each test record for the validator's ACCEPT test only, so training may "
            "not read it (no early stopping or model selection on it). Hold out part of the "
            "training split for that, or charge a grant with the sum rule"
        )
    files = _files(fn_args.train_files if split == "train" else fn_args.eval_files)
    names = list(maps) + ([label] if label not in maps else [])
    transform = getattr(fn_args, "transform_graph_path", None)
    specs = _specs_from_transform(transform, names) if transform else _specs_from_records(files, names)
    if specs[label][1] != 1:
        raise TrainerDataError(f"label {label!r} has width {specs[label][1]}: a label is one number")
    parse = {name: tf.io.VarLenFeature(dtype) for name, (dtype, _) in specs.items()}

    def dense(batch):
        parsed = tf.io.parse_example(batch, parse)
        out = {}
        for name, (_, width) in specs.items():
            ragged = tf.RaggedTensor.from_sparse(parsed[name])
            values = tf.cast(ragged, tf.float32).to_tensor(default_value=float("nan"), shape=[None, width])
            # a record whose feature has another number of values than its width counts as missing
            bad = tf.not_equal(ragged.row_lengths(), width)
            out[name] = tf.where(bad[:, None], tf.fill(tf.shape(values), float("nan")), values)
        return out

    chunks = {name: [np.zeros((0, width), np.float32)] for name, (_, width) in specs.items()}
    for batch in _record_dataset(files).batch(batch_size).map(dense).as_numpy_iterator():
        for name in specs:
            chunks[name].append(batch[name])
    columns = {name: np.concatenate(chunks[name]) for name in specs}
    # a record is kept iff each declared column holds exactly its width of finite values (its own values only)
    keep = np.all([np.all(np.isfinite(c), axis=1) for c in columns.values()], axis=0)
    x = {}
    for name, (low, high, clip) in maps.items():
        column = _apply_map(columns[name][keep], low, high, clip, np).astype(np.float32)
        x[name] = column[:, 0] if column.shape[1] == 1 else column
    return x, columns[label][keep, 0]


def batch_size(fn_args: Any, config: Mapping[str, Any], default: int = 256) -> int:
    """``config["batch_size"]`` (default 256), at most an eighth of ``fn_args.num_examples``.

    Early in a stream a window can hold fewer records than a usual batch; DP-SGD's Poisson sampling
    needs batch < n. ``num_examples`` is the DP (or public) count, so using it here is free.
    """
    wanted = int(config.get("batch_size", default))
    if fn_args.num_examples is None:
        return wanted
    return max(8, min(wanted, int(fn_args.num_examples) // 8))


# ------------------------------------------------------------------------------------------- export


def export_model(
    fn_args: Any,
    model: Any,
    features: Sequence[str] | Mapping[str, Any] | None = None,
    label_key: str | None = None,
    output_scale: float | None = None,
    output_offset: float | None = None,
) -> str:
    """Write ``model``'s SavedModel to ``fn_args.serving_model_dir``; return the path.

    With a transform graph the signature takes serialized tf.Examples and applies the graph
    (``model.export(..., transform_output=...)``). Otherwise it takes the features by name; with
    ``features`` as {name: scale or (low, high)} it takes them RAW and maps them as ``load_examples``
    does, so the serving model reads raw feature values. ``output_scale`` multiplies the ``predictions``
    output (a regressor trained on label / scale serves in label units) and ``output_offset`` is added after
    (a regressor trained on the residual label - offset, for a PUBLIC offset, serves the label). Wrapping keeps the inner model in
    ``<model_run_dir>/inner_model``.
    """
    path = fn_args.serving_model_dir
    transform = getattr(fn_args, "transform_graph_path", None)
    maps = {} if transform or features is None else _feature_maps(features)
    scale = (
        1.0
        if output_scale is None
        else positive(
            output_scale, "output_scale", error=TrainerDataError, message="{what}={value!r} must be a finite number > 0"
        )
    )
    offset = (
        0.0
        if output_offset is None
        else number(
            output_offset, "output_offset", error=TrainerDataError, message="{what}={value!r} must be a finite number"
        )
    )
    plain = all(m == (0.0, 1.0, False) for m in maps.values()) and scale == 1.0 and offset == 0.0
    inner_path = path if plain else os.path.join(fn_args.model_run_dir, "inner_model")
    if transform:
        model.export(inner_path, transform_output=transform, label_key=label_key)
    else:
        model.export(inner_path)
    return path if plain else _wrap(inner_path, path, maps, scale, offset)


def _wrap(inner_path, path, maps, scale, offset=0.0):
    """Re-export a SavedModel: map raw features by ``maps`` before it, ``predictions`` * ``scale`` + ``offset``."""
    import tensorflow as tf

    module = tf.Module()
    module.inner = tf.saved_model.load(inner_path)
    inner = module.inner.signatures["serving_default"]
    _, specs = inner.structured_input_signature
    if maps:
        missing = [k for k in specs if k not in maps]
        if missing:
            raise TrainerDataError(f"features {missing} of the model are not among the declared {sorted(maps)}")
    signature = [{k: tf.TensorSpec(s.shape, s.dtype, name=k) for k, s in specs.items()}]

    @tf.function(input_signature=signature)
    def serve(inputs):
        out = inner(**{k: _apply_map(v, *maps[k], tf) if k in maps else v for k, v in inputs.items()})
        return {k: v * scale + offset if k == "predictions" else v for k, v in out.items()}

    tf.saved_model.save(module, path, signatures={"serving_default": serve.get_concrete_function()})
    return path
