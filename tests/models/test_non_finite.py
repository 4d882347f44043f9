"""Non-finite values after the charge, and the training seed.

* One NaN / inf row (feature or label) changes nothing observable but the noisy output: every DP model and
  AdaSSP completes, reports the same privacy_spent, and fits EXACTLY what it fits with that row replaced by
  its documented public default (same seed: identical noise), so the row's only effect is that of a
  default-valued record.
* The validator's per-example values give a NaN label or prediction the worst value (B, or "incorrect").
* RecordError messages name the column only: never the value, the record's index or a count; a label that is not
  0/1 or not a class id gets the validator's worst value, as a NaN does.
* ``sage_tfx.models.training_seed``: reproducible inside, explicit ``seed=`` refused inside, allowed outside.

All comparisons are exact (same seeds, same mapped data) except "two fits differ", which fails only if two
independent continuous noise draws coincide (probability 0 up to floating point).
"""

import math
import re
import threading
from types import SimpleNamespace

import numpy as np
import pytest

from sage_tfx.privacy import adassp
from sage_tfx.privacy.errors import RecordError, public_error_text
from sage_tfx.validation import (
    DPAccuracyValidator,
    DPLossValidator,
    absolute_errors,
    correctness,
    log_losses,
    squared_errors,
)

BUDGET = (2.0, 1e-5)


@pytest.fixture(autouse=True)
def _accounting_once(monkeypatch):
    """DP-SGD's calibration (dp_accounting, ~4 s) depends only on its public arguments, the same in every
    fit here: compute it once. The fits themselves are unchanged."""
    from sage_tfx.privacy import dpsgd

    real, cache = dpsgd.dpsgd_spend, _SPEND_CACHE

    def spend(*args):
        if args not in cache:
            cache[args] = real(*args)
        return cache[args]

    monkeypatch.setattr(dpsgd, "dpsgd_spend", spend)


_SPEND_CACHE = {}


def _no_value(err, *values):
    """The message of ``err``, checked to hold none of ``values`` and no record index ("record N")."""

    text = str(err)
    for value in values:
        assert value not in text, (value, text)
    assert not re.search(r"record \d", text), text
    return text


# ---------------------------------------------------------------- AdaSSP (numpy only)


def _regression(n=200, d=3, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d))
    y = x @ np.array([1.0, -0.5, 0.25]) + 0.1 * rng.normal(size=n)
    return x, y


def _with_row(x, y, row, label):
    return np.vstack([x, row]), np.append(y, label)


@pytest.mark.parametrize(
    "row,label,default_row,default_label",
    [
        ([np.nan, 0.5, 0.5], 0.3, [0.0, 0.5, 0.5], 0.3),  # NaN feature entry -> 0, then row clipping
        ([np.inf, 0.5, -np.inf], 0.3, [0.0, 0.5, 0.0], 0.3),  # +-inf feature entries -> 0
        ([0.5, 0.5, 0.5], np.nan, [0.5, 0.5, 0.5], 0.0),  # NaN label -> 0, the centre of [-B_y, B_y]
        ([0.5, 0.5, 0.5], np.inf, [0.5, 0.5, 0.5], 2.0),  # +inf label -> clipped to B_y
        ([0.5, 0.5, 0.5], -np.inf, [0.5, 0.5, 0.5], -2.0),  # -inf label -> -B_y
    ],
)
def test_adassp_maps_a_non_finite_row_to_its_public_default(row, label, default_row, default_label):
    x, y = _regression()
    bad = adassp.adassp(*_with_row(x, y, row, label), 1.0, 1e-6, 1.5, 2.0, rng=np.random.default_rng(5))
    mapped = adassp.adassp(
        *_with_row(x, y, default_row, default_label), 1.0, 1e-6, 1.5, 2.0, rng=np.random.default_rng(5)
    )
    clean = adassp.adassp(x, y, 1.0, 1e-6, 1.5, 2.0, rng=np.random.default_rng(5))
    for name in ("theta", "xtx_noisy", "xty_noisy"):
        np.testing.assert_array_equal(getattr(bad, name), getattr(mapped, name))
        assert np.all(np.isfinite(getattr(bad, name)))
        assert getattr(bad, name).shape == getattr(clean, name).shape
    # the noise-free parts of the release: the same with or without the row
    for name in ("noise_multiplier", "epsilon", "delta", "calibration"):
        assert getattr(bad, name) == getattr(clean, name)
    assert bad.dp_event == clean.dp_event


def test_adassp_row_clipping_survives_huge_finite_entries():
    x = np.array([[1e200, 1e200, 0.0], [3.0, 4.0, 0.0], [0.0, 0.0, 0.0], [1e-200, 0.0, 0.0]])
    clipped = adassp.clip_rows(x, 2.0)
    norms = np.linalg.norm(clipped, axis=1)
    assert np.all(np.isfinite(clipped)) and np.all(norms <= 2.0 * (1 + 1e-12))
    np.testing.assert_allclose(clipped[0], [math.sqrt(2.0), math.sqrt(2.0), 0.0])
    np.testing.assert_allclose(clipped[1], [1.2, 1.6, 0.0])
    np.testing.assert_array_equal(clipped[2:], x[2:])  # rows inside the bound are unchanged


# ---------------------------------------------------------------- per-example values (numpy only)


def test_metric_helpers_give_a_non_finite_record_the_worst_value():
    labels = np.array([1.0, np.nan, 2.0, 0.0])
    predictions = np.array([1.5, 1.0, np.nan, np.inf])
    np.testing.assert_array_equal(squared_errors(labels, predictions, loss_bound=4.0), [0.25, 4.0, 4.0, 4.0])
    np.testing.assert_array_equal(absolute_errors(labels, predictions, loss_bound=3.0), [0.5, 3.0, 3.0, 3.0])
    # an error that overflows is an infinite loss: clipped to B as well
    assert squared_errors([0.0], [1e200], loss_bound=4.0).tolist() == [4.0]
    binary = np.array([1.0, 0.0, np.nan, 1.0])
    scores = np.array([0.9, 0.2, 0.9, np.nan])
    assert correctness(binary, scores).tolist() == [1.0, 1.0, 0.0, 0.0]
    losses = log_losses(binary, scores, floor=1e-7)
    assert losses[2] == losses[3] == pytest.approx(-math.log(1e-7))  # default: the largest loss, ln(1/floor)
    assert log_losses(binary, scores, loss_bound=5.0)[2:].tolist() == [5.0, 5.0]
    np.testing.assert_allclose(losses[:2], [-math.log(0.9), -math.log(0.8)])
    # the other records' values do not depend on the non-finite one
    assert squared_errors(labels[:1], predictions[:1], loss_bound=4.0).tolist() == [0.25]


def test_metric_errors_name_the_column_never_the_record():
    """The messages named the record's index ("record 1"), and a label other than 0/1 failed the validation
    after its charge; now the column only, and such a label gets the worst value as a NaN does."""
    with pytest.raises(RecordError) as err:
        squared_errors([1.0, 2.0], [1.0, float("nan")])
    text = _no_value(err.value, "nan")
    assert "column 'predictions'" in text and "loss_bound" in text
    assert public_error_text(err.value).startswith("RecordError: column 'predictions': ")
    assert correctness([1.0, 0.0, 0.37], [0.9, 0.1, 0.5]).tolist() == [1.0, 1.0, 0.0]
    assert log_losses([0.0, 7.5], [0.5, 0.5], loss_bound=5.0).tolist() == [pytest.approx(math.log(2)), 5.0]
    with pytest.raises(ValueError) as err:  # lengths are counts of records: only the trailing shapes
        squared_errors(np.zeros(5), np.zeros(7))
    assert "5" not in str(err.value) and "7" not in str(err.value) and "one prediction per label" in str(err.value)


def test_validators_run_on_values_with_a_nan_record():
    """One NaN prediction: the release completes; the values differ from the clean ones in that record only."""
    rng = np.random.default_rng(0)
    labels = rng.normal(size=400)
    predictions = labels + 0.1 * rng.normal(size=400)
    clean = squared_errors(labels, predictions, loss_bound=1.0)
    predictions[17] = np.nan
    dirty = squared_errors(labels, predictions, loss_bound=1.0)
    assert dirty[17] == 1.0 and np.array_equal(np.delete(dirty, 17), np.delete(clean, 17))
    v = DPLossValidator(0.1, 1.0, loss_bound=1.0)
    a = v.validate(clean, rng=np.random.default_rng(3))
    b = v.validate(dirty, rng=np.random.default_rng(3))
    assert a.to_dict().keys() == b.to_dict().keys() and a.epsilon_test == b.epsilon_test
    hits = correctness((labels > 0).astype(float), np.where(np.arange(400) == 5, np.nan, labels > 0))
    assert hits[5] == 0.0 and hits.sum() == 399
    DPAccuracyValidator(0.8, 1.0).validate(hits, rng=np.random.default_rng(3))


# ---------------------------------------------------------------- DP models (TensorFlow)


def _tf():
    pytest.importorskip("tensorflow")
    import sage_tfx.models as models

    return models


def _weights(model):
    if hasattr(model, "coef_"):
        return [np.asarray(model.coef_), np.asarray([model.intercept_])]
    return [np.asarray(w) for w in model.model.get_weights()]


def _dpsgd_common():
    return dict(num_examples=64, epochs=1, batch_size=16, learning_rate=0.1)


FAMILIES = {
    # name: (factory, labels, default label of a non-finite one)
    "DPDNNRegressor": (
        lambda m, seed: m.DPDNNRegressor(BUDGET, hidden_units=(4,), seed=seed, **_dpsgd_common()),
        "real",
        0.0,
    ),
    "DPDNNClassifier": (
        lambda m, seed: m.DPDNNClassifier(BUDGET, hidden_units=(4,), n_classes=3, seed=seed, **_dpsgd_common()),
        "three",
        0.0,
    ),
    "DPLogisticRegressor": (lambda m, seed: m.DPLogisticRegressor(BUDGET, seed=seed, **_dpsgd_common()), "binary", 0.0),
    # AdaSSP: NaN label -> the midpoint of label_range (0.5); +inf -> its high end (handled below)
    "DPLinearRegressor": (
        lambda m, seed: m.DPLinearRegressor(BUDGET, feature_bound=2.0, label_range=(0.0, 1.0), seed=seed),
        "unit",
        0.5,
    ),
}


def _data(kind, n=63, seed=1):
    rng = np.random.default_rng(seed)
    x = {"a": rng.normal(size=n).astype(np.float32), "b": rng.normal(size=(n, 2)).astype(np.float32)}
    score = x["a"] + x["b"][:, 0]
    y = {
        "real": score,
        "three": np.digitize(score, [-0.5, 0.5]),
        "binary": (score > 0),
        "unit": 1 / (1 + np.exp(-score)),
    }[kind].astype(np.float64)
    return x, y


def _append(x, y, a, b, label):
    return (
        {"a": np.append(x["a"], np.float32(a)), "b": np.vstack([x["b"], np.asarray(b, np.float32)])},
        np.append(y, label),
    )


CASES = {  # name: (bad a, bad b, bad label) -> mapped by the family's defaults
    "feature_nan": (np.nan, [0.3, 0.2], 1.0),
    "feature_inf": (0.4, [np.inf, -np.inf], 1.0),
    "label_nan": (0.4, [0.3, 0.2], np.nan),
    "label_inf": (0.4, [0.3, 0.2], np.inf),
}


@pytest.mark.tf
@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("case", sorted(CASES))
def test_one_non_finite_row_changes_nothing_but_the_noisy_output(family, case):
    m = _tf()
    make, kind, label_default = FAMILIES[family]
    x, y = _data(kind)
    a, b, label = CASES[case]
    default_a = 0.0 if not np.isfinite(a) else a
    default_b = [v if np.isfinite(v) else 0.0 for v in b]
    default_label = label
    if not np.isfinite(label):
        default_label = 1.0 if (family == "DPLinearRegressor" and label == np.inf) else label_default
    bad = make(m, 11).fit(*_append(x, y, a, b, label))
    mapped = make(m, 11).fit(*_append(x, y, default_a, default_b, default_label))
    clean = make(m, 11).fit(x, y)
    for got, want in zip(_weights(bad), _weights(mapped)):
        np.testing.assert_array_equal(got, want)  # the row acted exactly as its public default
        assert np.all(np.isfinite(got))
    # what the fit reports: the same keys, and every noise-free figure the same as without the row
    noisy = {"ridge"}  # AdaSSP's ridge is post-processing of a noisy eigenvalue
    assert bad.privacy_spent.keys() == clean.privacy_spent.keys()
    for key in bad.privacy_spent.keys() - noisy:
        assert bad.privacy_spent[key] == clean.privacy_spent[key], key
    assert [w.shape for w in _weights(bad)] == [w.shape for w in _weights(clean)]
    probe = {"a": np.array([np.nan, 0.1], np.float32), "b": np.array([[0.2, np.inf], [0.2, 0.3]], np.float32)}
    assert np.all(np.isfinite(bad.predict(probe)))  # predict maps alike


@pytest.mark.tf
@pytest.mark.parametrize("implementation", ["ghost", "vmap"])
def test_a_record_whose_gradient_overflows_contributes_zero(implementation):
    _tf()
    from sage_tfx.models.dpsgd_engine import make_engine
    from sage_tfx.models.dpsgd_models import _mse, build_mlp

    rng = np.random.default_rng(0)
    x = rng.normal(size=(8, 3)).astype(np.float32)
    y = rng.normal(size=8).astype(np.float32)
    huge = np.vstack([x, [[3e38, -3e38, 1e30]]]).astype(np.float32)  # finite, but its squares overflow
    engine = make_engine(implementation, build_mlp(3, (4,), 1, seed=2), _mse, 1.0, 0.0)
    with_huge, norms = engine.clipped_sum(huge, np.append(y, np.float32(1.0)))
    without, _ = engine.clipped_sum(x, y)
    assert not np.isfinite(norms.numpy()[-1])
    for got, want in zip(with_huge, without):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-6, atol=1e-7)


@pytest.mark.tf
def test_a_label_that_is_not_a_class_id_names_the_column_not_the_record():
    m = _tf()
    x = np.zeros((10, 2), np.float32)
    with pytest.raises(RecordError) as err:
        m.DPDNNClassifier(BUDGET, hidden_units=(2,), n_classes=3, num_examples=10, batch_size=2).fit(
            x, np.array([0, 1, 2, 2.5, 0, 0, 0, 0, 0, 0])
        )
    assert str(err.value) == "column 'label': is not a class id in [0, 3)"
    with pytest.raises(RecordError) as err:
        m.DPLogisticRegressor(BUDGET, num_examples=10, batch_size=2).fit(x, np.array([0, 1, 0, 0, 0.75] + [0] * 5))
    assert "column 'label'" in _no_value(err.value, "0.75", "4")
    from sage_tfx.models.data import labels_vector

    with pytest.raises(ValueError) as err:  # x and y of other lengths: counts of records, not in the message
        labels_vector(np.zeros(9), 10, np.float32)
    assert "9" not in str(err.value) and "10" not in str(err.value)


@pytest.mark.tf
def test_an_empty_dataset_fits_without_an_error():
    m = _tf()
    import tensorflow as tf

    ds = tf.data.Dataset.from_tensor_slices((np.zeros((0, 3), np.float32), np.zeros(0, np.float32))).batch(4)
    lin = m.DPLinearRegressor(BUDGET, feature_bound=1.0, label_range=(0.0, 1.0), seed=0).fit(ds)
    assert lin.coef_.shape == (3,) and np.all(np.isfinite(lin.coef_))
    reg = m.DPDNNRegressor(BUDGET, hidden_units=(2,), seed=0, **_dpsgd_common()).fit(ds)
    assert reg.predict(np.zeros((2, 3), np.float32)).shape == (2,)


# ---------------------------------------------------------------- the validator executor's values


def _executor():
    """The validator executor's record-reading step (``components/validator_records.py``)."""
    pytest.importorskip("tfx")
    import sage_tfx.components.validator_records as records

    return records


@pytest.mark.tf
def test_validator_values_give_a_nan_prediction_the_worst_value():
    ex = _executor()
    labels = np.array([1.0, 2.0, np.nan])
    values = ex.per_example_values("mse", labels, {"predictions": np.array([1.5, np.nan, 2.0])}, loss_bound=4.0)
    assert values.tolist() == [0.25, 4.0, 4.0]
    values = ex.per_example_values("mae", labels, {"predictions": np.array([1.5, np.nan, 2.0])}, loss_bound=4.0)
    assert values.tolist() == [0.5, 4.0, 4.0]
    binary = np.array([1.0, 0.0, np.nan])
    p = {"probabilities": np.array([np.nan, 0.2, 0.9])}
    assert ex.per_example_values("accuracy", binary, p).tolist() == [0.0, 1.0, 0.0]
    bound = math.log(1 / ex.LOG_LOSS_FLOOR)
    got = ex.per_example_values("log_loss", binary, p, loss_bound=bound)
    assert got[0] == got[2] == bound and got[1] == pytest.approx(-math.log(0.8))
    # multi-class: a NaN row of probabilities or a NaN label is incorrect / the worst loss
    proba = np.array([[0.7, 0.2, 0.1], [np.nan, 0.5, 0.5], [0.1, 0.1, 0.8]])
    classes = np.array([0.0, 1.0, np.nan])
    assert ex.per_example_values("accuracy", classes, {"probabilities": proba}).tolist() == [1.0, 0.0, 0.0]
    got = ex.per_example_values("log_loss", classes, {"probabilities": proba}, loss_bound=3.0)
    assert got[1:].tolist() == [3.0, 3.0] and got[0] == pytest.approx(-math.log(0.7))


@pytest.mark.tf
def test_validator_messages_after_the_charge_name_no_record_count_or_value():
    """After the charge, the validator failed on a label that is not a class id naming the record's index, on a
    custom loss of the wrong length naming both lengths (counts of records), and on an eval split with no usable
    record ("no eval record carries label", a count of 0). Now a non-class label gets the worst value (as NaN),
    an empty split is validated as one (noise only), and the remaining messages name columns only."""
    ex = _executor()
    assert ex._class_ids(np.array([0.0, 2.5, 1.0, -1.0, 3.0, np.nan]), 3).tolist() == [0, -1, 1, -1, -1, -1]
    uniform = {"probabilities": np.full((3, 3), 1 / 3)}
    assert ex.per_example_values("accuracy", np.array([0.0, 1.0, 7.0]), uniform).tolist()[2] == 0.0
    assert ex.per_example_values("log_loss", np.array([0.0, 1.0, 7.0]), uniform, loss_bound=3.0)[2] == 3.0
    import tensorflow as tf

    example = tf.train.Example()
    example.features.feature["fare"].bytes_list.value.append(b"secret-123")
    with pytest.raises(RecordError) as err:
        ex._feature_values(example, "fare", 41)
    assert str(_no_value(err.value, "secret-123", "41")).startswith("column 'fare': ")
    with pytest.raises(ex.ValidatorConfigError) as err:
        ex.custom_losses(lambda y, o: np.zeros(1234), np.zeros(4321), {}, 10.0)
    assert "1234" not in str(err.value) and "4321" not in str(err.value), err.value
    assert "one loss per record" in str(err.value)

    class NoRecordCarriesTheLabel:
        examples_input = "examples"

    labels, outputs = ex.model_outputs(NoRecordCarriesTheLabel(), [tf.train.Example().SerializeToString()] * 3, "tips")
    assert labels.size == 0 and outputs == {}
    for validator in (DPLossValidator(0.5, 1.0, loss_bound=1.0), DPAccuracyValidator(0.5, 1.0)):
        assert validator.validate(np.zeros(0), np.zeros(0), None, eta=0.01).outcome == "RETRY"


# ---------------------------------------------------------------- load_examples


@pytest.mark.tf
def test_load_examples_drops_incomplete_records_and_never_fails_on_data(tmp_path):
    pytest.importorskip("tfx")
    import tensorflow as tf

    from sage_tfx.components import trainer_utils

    def write(path, rows):
        with tf.io.TFRecordWriter(str(path)) as w:
            for miles, fare in rows:
                ex = tf.train.Example()
                if miles is not None:
                    ex.features.feature["miles"].float_list.value.append(miles)
                if fare is not None:
                    ex.features.feature["fare"].float_list.value.append(fare)
                w.write(ex.SerializeToString())

    write(tmp_path / "a.tfrecord", [(1.0, 5.0), (float("nan"), 6.0), (2.0, float("inf")), (3.0, None), (4.0, 8.0)])
    x, y = trainer_utils.load_examples(
        SimpleNamespace(train_files=[str(tmp_path / "a.tfrecord")]), {"miles": (0.0, 10.0)}, "fare"
    )
    np.testing.assert_allclose(x["miles"], [0.1, 0.4])
    np.testing.assert_allclose(y, [5.0, 8.0])
    # no complete record: empty arrays, not an error after the charge
    write(tmp_path / "b.tfrecord", [(1.0, None), (None, 2.0), (float("nan"), 1.0)])
    x, y = trainer_utils.load_examples(SimpleNamespace(train_files=[str(tmp_path / "b.tfrecord")]), ["miles"], "fare")
    assert x["miles"].shape == (0,) and y.shape == (0,)


# ---------------------------------------------------------------- training_seed


def _linear(m, seed=None):
    return m.DPLinearRegressor(BUDGET, feature_bound=2.0, label_range=(-3.0, 3.0), seed=seed)


@pytest.mark.tf
def test_training_seed_reproduces_fits_and_keeps_them_independent():
    m = _tf()
    x, y = _regression()
    with m.training_seed(123):
        first = _linear(m).fit(x, y).coef_
        second = _linear(m).fit(x, y).coef_  # the second fit of the block: fresh, independent noise
    with m.training_seed(123):
        again_first = _linear(m).fit(x, y).coef_
        again_second = _linear(m).fit(x, y).coef_
    with m.training_seed(124):
        other = _linear(m).fit(x, y).coef_
    np.testing.assert_array_equal(first, again_first)
    np.testing.assert_array_equal(second, again_second)
    assert not np.array_equal(first, second) and not np.array_equal(first, other)


@pytest.mark.tf
def test_training_seed_reproduces_dpsgd():
    m = _tf()
    x, y = _data("real")
    runs = []
    for _ in range(2):
        with m.training_seed(2**100 + 7):
            runs.append(_weights(m.DPDNNRegressor(BUDGET, hidden_units=(4,), **_dpsgd_common()).fit(x, y)))
    for a, b in zip(*runs):
        np.testing.assert_array_equal(a, b)
    with m.training_seed(8):
        other = _weights(m.DPDNNRegressor(BUDGET, hidden_units=(4,), **_dpsgd_common()).fit(x, y))
    assert not np.array_equal(runs[0][0], other[0])


@pytest.mark.tf
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_an_explicit_seed_is_refused_inside_training_seed(family):
    m = _tf()
    make, kind, _ = FAMILIES[family]
    x, y = _data(kind)
    with m.training_seed(5):
        with pytest.raises(ValueError, match=rf"{family}: seed=0 .*the component \(DPTrainer\) supplies"):
            make(m, 0).fit(x, y)


@pytest.mark.tf
def test_outside_training_seed_a_seed_is_allowed_and_none_is_fresh():
    m = _tf()
    x, y = _regression()
    np.testing.assert_array_equal(_linear(m, 0).fit(x, y).coef_, _linear(m, 0).fit(x, y).coef_)
    assert not np.array_equal(_linear(m).fit(x, y).coef_, _linear(m).fit(x, y).coef_)
    with m.training_seed(5):
        pass
    _linear(m, 3).fit(x, y)  # the block has exited: allowed again
    seen = []
    with m.training_seed(5):  # a new thread does not inherit the block (contextvars)
        thread = threading.Thread(target=lambda: seen.append(_linear(m, 3).fit(x, y).coef_))
        thread.start()
        thread.join()
    assert len(seen) == 1


@pytest.mark.tf
@pytest.mark.parametrize("bad", [-1, 1.5, True, "7", None])
def test_training_seed_refuses_a_bad_seed(bad):
    m = _tf()
    with pytest.raises(ValueError, match="training_seed: seed must be an integer >= 0"):
        with m.training_seed(bad):
            pass


@pytest.mark.tf
def test_the_tf_privacy_engine_is_refused_inside_training_seed():
    """tensorflow-privacy's noise comes from TensorFlow's global generator, not from the seed it is given: two
    engines with different seeds (the grant's would be one) draw the SAME noise after a module's
    tf.random.set_seed(0), so the module could subtract it. Inside training_seed (DPTrainer) the engine is
    refused before the fit reads anything; 'ghost' and 'vmap' draw from the grant's seed."""
    import tensorflow as tf

    from sage_tfx.models.dpsgd_engine import TfPrivacyEngine
    from sage_tfx.models.dpsgd_models import build_mlp

    m = _tf()
    model = build_mlp(3, (4,), 1, seed=0)
    sums = []
    for seed in (123, 456):
        engine = TfPrivacyEngine(model, lambda y, out: tf.square(tf.reshape(out, [-1]) - y), 1.0, 1.0, seed=seed)
        tf.random.set_seed(0)
        sums.append([g.numpy() for g in engine.noisy_sum(tf.zeros([2, 3]), tf.zeros([2]))])
    for a, b in zip(*sums):
        np.testing.assert_array_equal(a, b)
    x, y = _data("real")
    with m.training_seed(5):
        with pytest.raises(ValueError, match="implementation='tf_privacy' is refused under DPTrainer"):
            m.DPDNNRegressor(BUDGET, hidden_units=(4,), implementation="tf_privacy", **_dpsgd_common()).fit(x, y)
