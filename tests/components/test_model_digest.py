"""The validator's model digest (components/dp_model_validator_executor.py ``model_digest``): the same model exported
twice (as a resumed iteration re-trains it under the same seed) has ONE digest, although TensorFlow numbers the
exported functions, nodes and arguments with a process-wide counter and writes a random uuid into fingerprint.pb;
any change to a weight or to the graph gives another digest (two releases under one seed must be of one model)."""

import numpy as np
import pytest

import sage_tfx  # noqa: F401 (sets TF_USE_LEGACY_KERAS before TensorFlow loads)

pytestmark = pytest.mark.tf


def _export(path, activation="relu", bump=0.0):
    import tensorflow as tf

    tf.keras.backend.clear_session()  # Keras's layer names restart, as in a new process; TensorFlow's counter does not
    tf.keras.utils.set_random_seed(3)
    model = tf.keras.Sequential(
        [
            tf.keras.Input(shape=(3,), name="x"),
            tf.keras.layers.Dense(4, activation=activation),
            tf.keras.layers.Dense(1),
        ]
    )
    if bump:
        kernel = model.layers[0].kernel
        kernel.assign(kernel.numpy() + np.eye(3, 4, dtype="float32") * bump)

    @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.float32, name="x")])
    def serve(x):
        return {"y": model(x)}

    tf.saved_model.save(model, str(path), signatures={"serving_default": serve})
    return str(path)


def test_same_model_exported_twice_has_one_digest_and_any_change_another(tmp_path):
    from sage_tfx.components.dp_model_validator_executor import model_digest

    first, again = _export(tmp_path / "a"), _export(tmp_path / "b")
    # The precondition the digest exists for: the two exports' bytes differ (counters, fingerprint uuid).
    assert (tmp_path / "a" / "saved_model.pb").read_bytes() != (tmp_path / "b" / "saved_model.pb").read_bytes()
    assert (tmp_path / "a" / "fingerprint.pb").read_bytes() != (tmp_path / "b" / "fingerprint.pb").read_bytes()
    assert model_digest(first) == model_digest(again)

    weight = _export(tmp_path / "w", bump=1e-3)
    graph = _export(tmp_path / "g", activation="tanh")
    digests = {model_digest(first), model_digest(weight), model_digest(graph)}
    assert len(digests) == 3, "a changed weight or activation must change the digest"


def test_saved_model_text_ranks_counters_one_to_one():
    from tensorflow.core.framework import function_pb2
    from tensorflow.core.protobuf import saved_model_pb2

    from sage_tfx.components._grant import canonical_saved_model_text

    def model(a, b):
        m = saved_model_pb2.SavedModel()
        lib = m.meta_graphs.add().graph_def.library
        for name in (f"__inference_f_{a}", f"__inference_f_{b}"):
            f = function_pb2.FunctionDef()
            f.signature.name = name
            f.node_def.add(name=f"dense_{a + 1}", op="Identity", input=[f"__inference_f_{b}"])
            lib.function.append(f)
        return canonical_saved_model_text(m)

    assert model(7055, 7060) == model(7167, 7172)  # the same creation order, other counters
    assert model(7055, 7060) != model(7060, 7055)  # the calls swapped: another graph
