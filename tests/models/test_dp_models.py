"""DP models: DP-SGD engines' privacy (clipping bound, noise std), learning, export. Imports TensorFlow.

Statistical checks use fixed seeds; each bound fails for a correct
implementation with probability below 1e-6 (stated per test).
"""

import csv
import importlib.resources
import math
import re

import numpy as np
import pytest
from scipy import stats

pytestmark = pytest.mark.tf

import sage_tfx  # noqa: E402,F401  (before TensorFlow)

tf = pytest.importorskip("tensorflow")

from sage_tfx.bench.dp_quality import plain_sgd_step  # noqa: E402
from sage_tfx.models import DPDNNClassifier, DPDNNRegressor, DPLinearRegressor, DPLogisticRegressor  # noqa: E402
from sage_tfx.models.dpsgd_engine import (  # noqa: E402
    ENGINES,
    make_engine,
)
from sage_tfx.models.dpsgd_models import (  # noqa: E402
    _mse,
    build_mlp,
)
from sage_tfx.models.private import poisson_batches  # noqa: E402

CLIP = 0.7


def _small_problem(seed=0, n=32, d=6):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d)).astype(np.float32)
    y = (rng.normal(size=n) * 20).astype(np.float32)  # large residuals: most gradients get clipped
    y[:4] = 0.0  # a few small ones
    return x, y


def _flat(grads):
    return np.concatenate([np.asarray(g).ravel() for g in grads])


@pytest.mark.parametrize("implementation", ENGINES)
def test_per_example_clipping_bound_holds(implementation):
    x, y = _small_problem()
    model = build_mlp(x.shape[1], (16,), 1, seed=3)
    engine = make_engine(implementation, model, _mse, CLIP, 0.0)
    total = _flat(engine.clipped_sum(x, y)[0])
    singles = []
    for i in range(len(x)):
        g = _flat(engine.clipped_sum(x[i : i + 1], y[i : i + 1])[0])
        assert np.linalg.norm(g) <= CLIP * (1 + 1e-5)  # one record moves the sum by <= C
        singles.append(g)
        # and its contribution is its true gradient, scaled down only if longer than C
        with tf.GradientTape() as tape:
            loss = _mse(y[i : i + 1], model(x[i : i + 1]))[0]
        raw = _flat(tape.gradient(loss, engine.variables))
        expected = raw * min(1.0, CLIP / np.linalg.norm(raw))
        np.testing.assert_allclose(g, expected, rtol=2e-4, atol=1e-6)
    np.testing.assert_allclose(total, np.sum(singles, axis=0), rtol=1e-4, atol=1e-5)
    norms = [np.linalg.norm(s) for s in singles]
    assert sum(n > CLIP * 0.999 for n in norms) >= len(x) // 2  # the test exercised clipping


@pytest.mark.parametrize("implementation", ENGINES)
def test_noise_std_on_summed_gradient_is_sigma_times_clip(implementation):
    """20 draws x 129 coordinates: variance ratio inside the chi2 two-sided 1e-6 band, mean within 5 s.e."""
    sigma = 1.3
    x, y = _small_problem(1)
    model = build_mlp(x.shape[1], (16,), 1, seed=4)
    tf.random.set_seed(11)  # tensorflow-privacy draws from the global generator
    noisy = make_engine(implementation, model, _mse, CLIP, sigma, seed=12)
    exact = _flat(make_engine(implementation, model, _mse, CLIP, 0.0).clipped_sum(x, y)[0])
    noise = np.concatenate([_flat(noisy.noisy_sum(x, y)) - exact for _ in range(20)])
    std = sigma * CLIP
    dof = noise.size
    ratio = np.mean(noise**2) / std**2
    assert stats.chi2.ppf(5e-7, dof) / dof < ratio < stats.chi2.ppf(1 - 5e-7, dof) / dof, ratio
    assert abs(noise.mean()) < 5 * std / math.sqrt(dof)


def test_poisson_batches_sample_each_row_with_probability_q():
    """Inclusion counts over 4000 steps: every row's count within 5.5 binomial s.d. (p < 1e-6 overall)."""
    rng = np.random.default_rng(5)
    n, q, steps = 200, 0.05, 4000
    counts = np.zeros(n)
    sizes = []
    for rows in poisson_batches(rng, n, q, steps):
        assert len(np.unique(rows)) == len(rows)
        counts[rows] += 1
        sizes.append(len(rows))
    sd = math.sqrt(steps * q * (1 - q))
    assert np.all(np.abs(counts - steps * q) < 5.5 * sd)
    assert np.var(sizes) == pytest.approx(n * q * (1 - q), rel=0.15)  # Binomial, not fixed, batch sizes


def test_ghost_engine_refuses_models_without_a_dense_or_embedding_graph():
    class Subclassed(tf.keras.Model):  # no graph to walk
        def __init__(self):
            super().__init__()
            self.dense = tf.keras.layers.Dense(1)

        def call(self, x):
            return self.dense(x)

    model = Subclassed()
    model(tf.zeros([1, 3]))
    conv = tf.keras.Sequential(
        [tf.keras.layers.Reshape((3, 1)), tf.keras.layers.Conv1D(1, 2, dilation_rate=2), tf.keras.layers.Flatten()]
    )
    conv.build((None, 3))
    for refused in (model, conv):
        with pytest.raises(
            ValueError, match="Dense, Embedding, LayerNormalization, Conv1D/Conv2D, EinsumDense or MultiHeadAttention"
        ):
            make_engine("ghost", refused, _mse, 1.0, 1.0)
    with pytest.raises(ValueError, match="engine 'fast' is invalid"):
        make_engine("fast", conv, _mse, 1.0, 1.0)


# ---- learning on real taxi rows ------------------------------------------------------------


def _taxi():
    path = importlib.resources.files("tfx") / "examples/chicago_taxi_pipeline/data/simple/data.csv"
    feats, labels = [], []
    with path.open() as handle:
        for r in csv.DictReader(handle):
            try:
                miles, secs, fare = float(r["trip_miles"]), float(r["trip_seconds"]), float(r["fare"])
                hour, day = int(r["trip_start_hour"]), int(r["trip_start_day"])
            except ValueError:
                continue  # empty fields
            f = np.zeros(33, np.float32)
            f[0], f[1] = min(miles, 30) / 10, min(secs, 7200) / 1800
            f[2 + hour] = 1
            f[26 + day - 1] = 1
            feats.append(f)
            labels.append(min(fare, 100) / 10)
    x, y = np.array(feats), np.array(labels, np.float32)
    perm = np.random.default_rng(0).permutation(len(x))
    cut = int(0.8 * len(x))
    return x[perm[:cut]], y[perm[:cut]], x[perm[cut:]], y[perm[cut:]]


@pytest.fixture(scope="module")
def taxi():
    return _taxi()


def _nondp_mlp_mse(x, y, xt, yt, hidden, epochs, batch, lr):
    model = build_mlp(x.shape[1], hidden, 1, seed=0)
    step = plain_sgd_step(model, _mse, lr)
    rng = np.random.default_rng(0)
    for _ in range(epochs):
        perm = rng.permutation(len(x))
        for i in range(0, len(x), batch):
            step(x[perm[i : i + batch]], y[perm[i : i + batch]])
    return float(np.mean((model(xt).numpy().ravel() - yt) ** 2))


def test_dp_dnn_regressor_tracks_nonprivate_on_real_taxi(taxi):
    """Fare from miles, seconds, hour, day on 12k real trips; eps = 1. Measured: DP 0.208, non-DP 0.164."""
    x, y, xt, yt = taxi
    trivial = float(np.mean((yt - y.mean()) ** 2))
    nondp = _nondp_mlp_mse(x, y, xt, yt, (64, 32), 5, 256, 0.05)
    dp = DPDNNRegressor(
        (1.0, 1e-5),
        hidden_units=(64, 32),
        num_examples=12_000,
        batch_size=256,
        epochs=5,
        learning_rate=0.05,
        clip_norm=1.0,
        seed=0,
    ).fit(x, y)
    mse = dp.evaluate(xt, yt)["mse"]
    assert mse <= 1.5 * nondp, (mse, nondp)
    assert mse <= 0.4 * trivial, (mse, trivial)
    spent = dp.privacy_spent
    assert spent["epsilon"] <= 1.0 and spent["delta"] == 1e-5
    assert spent["dp_event"].count == spent["steps"] == math.ceil(5 * 12_000 / 256)


def test_dp_linear_regressor_on_real_taxi(taxi):
    """AdaSSP at eps = 3 on 12k rows, d = 34. Measured: DP 0.45, OLS 0.21, trivial 0.97."""
    x, y, xt, yt = taxi
    design = np.c_[x, np.ones(len(x))]
    ols = np.linalg.lstsq(design, y, rcond=None)[0]
    ols_mse = float(np.mean((np.c_[xt, np.ones(len(xt))] @ ols - yt) ** 2))
    trivial = float(np.mean((yt - y.mean()) ** 2))
    dp = DPLinearRegressor((3.0, 1e-5), feature_bound=4.0, label_range=(0, 10), seed=0).fit(x, y)
    mse = dp.evaluate(xt, yt)["mse"]
    assert mse <= 3.0 * ols_mse and mse <= 0.7 * trivial, (mse, ols_mse, trivial)
    assert dp.privacy_spent["epsilon"] == 3.0


def test_classifiers_beat_majority_and_export(tmp_path):
    rng = np.random.default_rng(2)
    n = 8000
    x = rng.normal(size=(n, 5)).astype(np.float32)
    y = (x @ np.array([1.0, -2.0, 0.5, 0.0, 1.0]) + 0.3 * rng.normal(size=n) > 0).astype(np.int32)
    majority = max(y.mean(), 1 - y.mean())
    for model in (
        DPDNNClassifier((2.0, 1e-5), hidden_units=(16,), num_examples=8000, batch_size=128, learning_rate=0.05, seed=0),
        DPLogisticRegressor((2.0, 1e-5), num_examples=8000, batch_size=128, learning_rate=0.05, seed=0),
    ):
        model.fit({"a": x[:, :2], "b": x[:, 2:]}, y)
        acc = model.evaluate({"a": x[:, :2], "b": x[:, 2:]}, y)["accuracy"]
        assert acc > majority + 0.2, (type(model).__name__, acc, majority)
        path = model.export(tmp_path / type(model).__name__)
        served = tf.saved_model.load(path).signatures["serving_default"](
            a=tf.constant(x[:50, :2]), b=tf.constant(x[:50, 2:])
        )
        proba = model.predict_proba({"a": x[:50, :2], "b": x[:50, 2:]})
        got = served["probabilities"].numpy()
        np.testing.assert_allclose(got if got.ndim == 2 else np.stack([1 - got, got], 1), proba, atol=1e-5)


def test_fit_from_dataset_and_linear_export(tmp_path):
    rng = np.random.default_rng(3)
    x = rng.normal(size=(4000, 3)).astype(np.float32)
    y = (x @ np.array([1.0, 2.0, -1.0]) + 0.5).astype(np.float32)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(100)
    reg = DPDNNRegressor(
        (4.0, 1e-5),
        hidden_units=(8,),
        num_examples=4000,
        batch_size=100,
        epochs=2,
        learning_rate=0.05,
        clip_norm=2.0,
        seed=1,
    ).fit(ds)
    assert reg.evaluate(ds)["mse"] < 0.5 * float(np.var(y))
    lin = DPLinearRegressor((2.0, 1e-5), feature_bound=5.0, label_range=(-10, 10), seed=0).fit(ds)
    path = lin.export(tmp_path / "lin")
    served = tf.saved_model.load(path).signatures["serving_default"](x=tf.constant(x[:20]))["predictions"]
    np.testing.assert_allclose(served.numpy(), lin.predict(x[:20]), rtol=1e-4, atol=1e-4)
    assert lin.evaluate(x, y)["mse"] < 0.1 * float(np.var(y))


@pytest.mark.parametrize(
    "kwargs,bad",
    [
        (dict(privacy_budget=(0.0, 1e-5)), "epsilon=0.0"),
        (dict(privacy_budget=(1.0, 1.5)), "delta=1.5"),
        (dict(privacy_budget=1.0), "privacy_budget=1.0"),
        (dict(momentum=1.2), "momentum=1.2"),
        (dict(clip_norm=-1.0), "clip_norm=-1.0"),
        (dict(implementation="fast"), "implementation='fast'"),
        # through sage_tfx.privacy.checks: a fraction, a bool or a string is named, not truncated or a TypeError
        (dict(hidden_units=(4, 2.5)), "hidden_units=(4, 2.5) is invalid"),
        (dict(hidden_units=(4, 0)), "hidden_units=(4, 0) is invalid"),
        (dict(momentum=True), "momentum=True is invalid: must be in [0, 1)"),
        (dict(learning_rate="fast"), "learning_rate='fast' is invalid: must be finite and > 0"),
    ],
)
def test_bad_hyperparameters_name_the_value(kwargs, bad):
    from sage_tfx.privacy.dpsgd import DpSgdConfigError

    args = dict(privacy_budget=(1.0, 1e-5), hidden_units=(4,))
    args.update(kwargs)
    with pytest.raises(DpSgdConfigError, match=re.escape(bad)):
        DPDNNRegressor(**args)


def test_classifier_n_classes_is_an_integer_of_at_least_two():
    from sage_tfx.privacy.dpsgd import DpSgdConfigError

    for bad in (1, 2.5, "3"):
        with pytest.raises(DpSgdConfigError, match=rf"^n_classes={bad!r} is invalid: must be an integer >= 2$"):
            DPDNNClassifier((1.0, 1e-5), hidden_units=(4,), n_classes=bad)
    assert DPDNNClassifier((1.0, 1e-5), hidden_units=(4,), n_classes=3.0).n_classes == 3


def test_linear_ranges_are_finite_pairs_low_below_high():
    from sage_tfx.privacy.adassp import AdaSSPConfigError

    rule = r"is invalid: must be a pair \(low, high\) of finite numbers, low < high$"
    for bad in ((1.0, 1.0), (0.0, math.inf), 5.0):
        with pytest.raises(AdaSSPConfigError, match=rf"^label_range={re.escape(repr(bad))} {rule}"):
            DPLinearRegressor((1.0, 1e-5), feature_bound=1.0, label_range=bad)
    with pytest.raises(AdaSSPConfigError, match=rf"^residual_range=\(2\.0, -2\.0\) {rule}"):
        DPLinearRegressor(
            (1.0, 1e-5), feature_bound=1.0, label_range=(0, 1), prior_coef=[1.0], residual_range=(2.0, -2.0)
        )


def test_fit_refuses_without_a_dp_count_and_names_bad_labels():
    x = np.zeros((10, 2), np.float32)
    with pytest.raises(ValueError, match="num_examples is required"):
        DPDNNRegressor((1.0, 1e-5), hidden_units=(4,)).fit(x, np.zeros(10))
    # the column only: never the value, the record's index or a count (RecordError is a ValueError)
    with pytest.raises(ValueError, match=r"^column 'label': is not a class id in \[0, 2\)$"):
        DPLogisticRegressor((1.0, 1e-5), num_examples=10, batch_size=2).fit(x, np.array([0, 1, 2] + [0] * 7))
    with pytest.raises(ValueError, match="missing column"):
        reg = DPLinearRegressor((1.0, 1e-5), feature_bound=1.0, label_range=(0, 1)).fit({"a": x[:, 0]}, x[:, 1])
        reg.predict({"b": x[:, 0]})


@pytest.mark.slow
def test_dp_tracks_nonprivate_at_one_million_generated_rows():
    """Generated data (not taxi): 1M rows, eps = 1, 3 epochs. DP within 1.2x of non-DP MSE."""
    rng = np.random.default_rng(9)
    n, d = 1_000_000, 10
    x = rng.normal(size=(n, d)).astype(np.float32)
    y = (np.tanh(x[:, :5]) @ np.ones(5) + 0.5 * x[:, 5] + 0.3 * rng.normal(size=n)).astype(np.float32)
    xt, yt = x[-50_000:], y[-50_000:]
    x, y = x[:-50_000], y[:-50_000]
    nondp = _nondp_mlp_mse(x, y, xt, yt, (32, 16), 3, 1024, 0.05)
    dp = DPDNNRegressor(
        (1.0, 1e-6),
        hidden_units=(32, 16),
        num_examples=950_000,
        batch_size=1024,
        epochs=3,
        learning_rate=0.05,
        clip_norm=1.0,
        seed=0,
    ).fit(x, y)
    assert dp.evaluate(xt, yt)["mse"] <= 1.2 * nondp


def test_estimators_train_through_make_private():
    """The estimator is make_private on its network: the same seed gives the same weights and report."""
    from sage_tfx.models import make_private

    x, y = _small_problem(n=200)
    common = dict(num_examples=200, batch_size=20, epochs=1, learning_rate=0.05, clip_norm=1.0, seed=3)
    for engine in ("ghost", "vmap"):
        ours = DPDNNRegressor((1.0, 1e-5), hidden_units=(8,), implementation=engine, **common).fit(x, y)
        theirs = make_private(
            lambda init: build_mlp(x.shape[1], (8,), 1, init),
            privacy_budget=(1.0, 1e-5),
            loss=_mse,
            momentum=0.9,
            per_example=engine,
            name="DPDNNRegressor",
            **common,
        ).fit(x, y)
        for a, b in zip(ours.model.get_weights(), theirs.model.get_weights()):
            np.testing.assert_array_equal(a, b)
        assert ours.privacy_spent["implementation"] == f"DPDNNRegressor/{engine}"
        assert {k: v for k, v in ours.privacy_spent.items() if k != "dp_event"} == {
            k: v for k, v in theirs.privacy_spent.items() if k != "dp_event"
        }
