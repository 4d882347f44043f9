"""make_private's traced step: one trace for every Poisson batch size, and the user's own layers and losses
still converted by AutoGraph (Python ``if`` on tensors) while sage_tfx's step code is not. GENERATED data."""

import numpy as np
import pytest

pytestmark = pytest.mark.tf

import sage_tfx  # noqa: E402,F401  (before TensorFlow)

tf = pytest.importorskip("tensorflow")

from sage_tfx.models import make_private  # noqa: E402
from sage_tfx.models.step_function import row_signature  # noqa: E402


class _Branching(tf.keras.layers.Layer):
    """Python ``if`` on a tensor (needs AutoGraph inside a graph); counts how often its ``call`` runs."""

    calls = 0

    def call(self, inputs):
        type(self).calls += 1
        if tf.reduce_max(tf.abs(inputs)) > 1e9:
            inputs = inputs * 0.0
        return inputs


def _branching_loss(y, out):
    """A plain per-example loss with a Python ``if`` on a tensor."""
    if tf.reduce_any(tf.math.is_nan(out)):
        out = tf.zeros_like(out)
    return tf.reduce_mean(tf.square(out - y), axis=1)


def _data(n=600, seed=3):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 4)).astype(np.float32)
    return x, (x @ np.array([1.0, -2.0, 0.5, 0.0], np.float32)).astype(np.float32)


def _model():
    inputs = tf.keras.Input((4,))
    hidden = tf.keras.layers.Dense(8, kernel_initializer=tf.keras.initializers.GlorotUniform(seed=0))(inputs)
    outputs = tf.keras.layers.Dense(1, kernel_initializer=tf.keras.initializers.GlorotUniform(seed=1))(
        _Branching()(hidden)
    )
    return tf.keras.Model(inputs, outputs)


@pytest.mark.parametrize("per_example", ["ghost", "vmap"])
@pytest.mark.parametrize("loss", ["mse", _branching_loss], ids=["mse", "python-if-loss"])
def test_one_trace_for_every_batch_size_and_user_code_still_converted(per_example, loss):
    x, y = _data()
    calls_after = []
    private = make_private(
        _model(),
        privacy_budget=(1.0, 1e-5),
        num_examples=len(y),
        loss=loss,
        batch_size=60,
        epochs=2,
        per_example=per_example,
        seed=0,
    )
    private.fit(x, y, callback=lambda step: calls_after.append(_Branching.calls))
    steps = private.privacy_spent["steps"]
    assert len(calls_after) == steps == 20
    # the Poisson batches have many sizes; the layer's Python call runs only while the first step traces
    assert calls_after[-1] == calls_after[0]
    assert private.privacy_spent["implementation"].endswith(per_example)
    assert np.all(np.isfinite(private.predict(x[:5])))


def test_row_signature_leaves_the_batch_axis_open():
    x = {"a": np.zeros((3, 2), np.float32), "b": np.array([["u"], ["v"], ["w"]])}
    spec = row_signature(x)
    assert spec["a"] == tf.TensorSpec([None, 2], tf.float32)
    assert spec["b"] == tf.TensorSpec([None, 1], tf.string)


def test_the_step_is_traced_once_per_fit(monkeypatch):
    """The optimizer's variables exist before the step is first traced: created inside the first trace, they
    made tf.function trace the step a second time."""
    from sage_tfx.models import private as private_module
    from sage_tfx.models.step_function import step_function

    traces = []

    def counting(fn, signature):
        return step_function(lambda *args: (traces.append(1), fn(*args))[1], signature)

    monkeypatch.setattr(private_module, "step_function", counting)
    x, y = _data()
    for optimizer in ("sgd", "adam", "debiased_momentum"):
        traces.clear()
        momentum = 0.9 if optimizer != "adam" else 0.0
        private = make_private(
            _model(),
            privacy_budget=(1.0, 1e-5),
            num_examples=len(y),
            loss="mse",
            batch_size=60,
            optimizer=optimizer,
            momentum=momentum,
            seed=0,
        )
        private.fit(x, y)
        assert len(traces) == 1, optimizer
