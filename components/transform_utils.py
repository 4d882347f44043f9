"""Helpers for DPTransform: the raw feature spec of a stream, and filling in missing values in a preprocessing_fn.

Raw features parse as ``tf.io.VarLenFeature`` (a record lacking one has no value); densify them with
`fill_in_missing` and a PUBLIC fill value: docs/dp_preprocessing.md, "Raw features and missing values".
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from sage_tfx.ingest.records import KINDS
from sage_tfx.privacy.errors import SageError

if TYPE_CHECKING:
    import tensorflow as tf
    from tensorflow_metadata.proto.v0 import schema_pb2


class SchemaError(SageError, ValueError):
    """A raw schema that cannot be used; the message names the bad feature or kind."""


def parse_schema(schema: str | Mapping[str, str] | None) -> dict[str, str]:
    """{feature: kind} from a dict or its JSON, each kind one of int / float / bytes (the stream's kinds)."""
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except ValueError:
            raise SchemaError(f'schema {schema!r} is not JSON like {{"trip_miles": "float"}}') from None
    if not isinstance(schema, dict) or not schema:
        raise SchemaError(f"schema {schema!r} must be a non-empty mapping of feature name -> kind")
    for name, kind in schema.items():
        if not isinstance(name, str) or not name:
            raise SchemaError(f"feature name {name!r} in the schema must be a non-empty string")
        if kind not in KINDS:
            raise SchemaError(f"feature {name!r} has kind {kind!r}: use one of {', '.join(KINDS)}")
    return dict(schema)


def stream_schema(data_root: str, stream: str) -> dict[str, str]:
    """The public schema of a stream, from DATA_ROOT/STREAM/_stream.json."""
    from sage_tfx.ingest.layout import STREAM_FILE, stream_config, stream_dir

    config = stream_config(data_root, stream)
    if config is None:
        raise SchemaError(f"stream {stream!r} has no {STREAM_FILE} under {stream_dir(data_root, stream)}")
    return parse_schema(config.get("schema"))


def schema_proto(schema: str | Mapping[str, str] | None) -> schema_pb2.Schema:
    """A tensorflow_metadata Schema of the raw features: no shape, so each parses as a VarLenFeature."""
    from tensorflow_metadata.proto.v0 import schema_pb2

    from sage_tfx.ingest.records import tfmd_schema

    return schema_pb2.Schema.FromString(tfmd_schema(parse_schema(schema)))


def raw_feature_spec(schema: str | Mapping[str, str] | None) -> dict[str, tf.io.VarLenFeature]:
    """{feature: tf.io.VarLenFeature(dtype)}: int -> int64, float -> float32, bytes -> string."""
    import tensorflow as tf

    dtypes = {"int": tf.int64, "float": tf.float32, "bytes": tf.string}
    return {name: tf.io.VarLenFeature(dtypes[kind]) for name, kind in parse_schema(schema).items()}


def fill_in_missing(x: tf.SparseTensor | tf.Tensor, default_value: Any) -> tf.Tensor:
    """A dense [batch] tensor from an optional feature: the record's value, or ``default_value`` if it has none.

    A record with several values gives its first (the stream's records hold at most one).

    Args:
        x: the SparseTensor of a VarLenFeature (dense shape [batch, n]), a RaggedTensor, or a dense tensor of
            shape [batch] or [batch, 1] (reshaped to [batch]).
        default_value: the public fill value (never computed from the data), of x's kind.

    Returns:
        A dense tensor of shape [batch] and x's dtype.

    Raises:
        SchemaError: a non-string default_value for a bytes feature.
    """
    import tensorflow as tf

    if isinstance(x, tf.SparseTensor):
        if x.dtype == tf.string and not isinstance(default_value, (str, bytes)):
            raise SchemaError(f"default_value {default_value!r} of a bytes feature must be a string")
        default = tf.constant(default_value, dtype=x.dtype)
        dense = tf.sparse.to_dense(x, default)  # [batch, max values in the batch], maybe 0 columns
        padded = tf.concat([dense, tf.fill(tf.stack([tf.shape(dense)[0], 1]), default)], axis=1)
        return padded[:, 0]
    if isinstance(x, tf.RaggedTensor):
        return tf.reshape(x.to_tensor(default_value=default_value, shape=[None, 1]), [-1])
    return tf.reshape(x, [-1])
