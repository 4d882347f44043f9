"""Adaptive clipping (Andrew et al. 2021): the private quantile estimate of the clip norm, its noise and its
accounting, on every own engine. Imports TensorFlow.

Statistical checks use fixed seeds; each bound fails for a correct implementation with probability below 1e-6
(stated per test).
"""

import numpy as np
import pytest
from scipy import stats

pytestmark = pytest.mark.tf

import sage_tfx  # noqa: E402,F401  (before TensorFlow)

tf = pytest.importorskip("tensorflow")

from sage_tfx.models import DPDNNClassifier, DPLogisticRegressor, make_private, training_seed  # noqa: E402
from sage_tfx.models.dpsgd_engine import make_engine  # noqa: E402
from sage_tfx.models.dpsgd_models import _sigmoid_xent, build_mlp  # noqa: E402
from sage_tfx.models.private import poisson_batches  # noqa: E402
from sage_tfx.models.seeding import PublicParameterError  # noqa: E402
from sage_tfx.privacy import dpsgd  # noqa: E402
from sage_tfx.privacy.adaptive_clip import IMBALANCED, AdaptiveClip, as_clip_norm, next_clip, sum_noise_multiplier  # noqa: E402
from sage_tfx.privacy.dpsgd import DpSgdConfigError  # noqa: E402

ENGINES = ("ghost", "vmap", "loop")  # the registry's own engines (tf_privacy refuses an adaptive clip)


def _imbalanced(n=4000, d=5, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d)).astype(np.float32)
    y = (rng.random(n) < 0.12).astype(np.float32)
    return x, y


def _logistic(d=5, seed=3):
    return build_mlp(d, (), 1, seed=seed)


def _make(kind, model, clip, sigma, seed):
    """An engine of each own kind from the one registry (the DP models' and make_private's)."""
    return make_engine(kind, model, _sigmoid_xent, clip, sigma, seed)


# --------------------------------------------------------------------------- refusals, before anything drawn


class _Untouchable:
    """Data that fails the test if read: a refusal must come before any read."""

    def __getattr__(self, name):
        raise AssertionError(f"the data was read ({name}) before the refusal")

    def __len__(self):
        raise AssertionError("the data was read (len) before the refusal")

    def __array__(self, *args, **kwargs):
        raise AssertionError("the data was read (array) before the refusal")


@pytest.mark.parametrize(
    "kwargs, named",
    [
        ({"target_quantile": 1.0}, "target_quantile=1.0"),
        ({"target_quantile": 0}, "target_quantile=0"),
        ({"target_quantile": float("nan")}, "target_quantile=nan"),
        ({"learning_rate": -0.2}, "learning_rate=-0.2"),
        ({"initial": 0.0}, "initial=0.0"),
        ({"count_stddev": 0}, "count_stddev=0"),
        ({"target_quantile": True}, "target_quantile=True"),
        ({"learning_rate": "fast"}, "learning_rate='fast'"),
    ],
)
def test_bad_parameters_named(kwargs, named):
    with pytest.raises(DpSgdConfigError, match=named.replace("(", r"\(")):
        AdaptiveClip(**kwargs)


def test_keyword_only_and_bad_clip_names():
    with pytest.raises(TypeError):
        AdaptiveClip(0.9)  # the parameters are keyword-only
    with pytest.raises(DpSgdConfigError, match="clip_norm='adaptve' is invalid.*'adaptive'"):
        as_clip_norm("adaptve")
    with pytest.raises(DpSgdConfigError, match="clip_norm=-1 is invalid.*'adaptive'"):
        as_clip_norm(-1)
    assert as_clip_norm("adaptive") == AdaptiveClip() and as_clip_norm(2) == 2.0


def test_too_little_count_noise_refused_by_make_private_before_fit():
    """2 sigma_b must exceed z: refused by make_private (nothing built, read or drawn), naming the value."""
    model = _logistic()
    z = dpsgd.calibrate_noise_multiplier(1.0, 1e-5, 4000, 200, 1)
    with pytest.raises(DpSgdConfigError, match=rf"count_stddev=0.5 is invalid for noise multiplier {z:.4g}"):
        make_private(
            model,
            privacy_budget=(1.0, 1e-5),
            num_examples=4000,
            batch_size=200,
            epochs=1,
            loss="binary_crossentropy",
            clip_norm=AdaptiveClip(count_stddev=0.5),
        )
    with pytest.raises(DpSgdConfigError, match="clip_norm='quantile' is invalid"):
        make_private(model, privacy_budget=(1.0, 1e-5), num_examples=4000, clip_norm="quantile")


def test_estimator_refuses_before_reading_and_before_the_share_is_charged():
    """A DP estimator given num_examples at fit: refused after its public calibration, before x is read; with
    num_examples at construction, refused by the constructor."""
    bad = AdaptiveClip(count_stddev=0.5)
    with pytest.raises(DpSgdConfigError, match="count_stddev=0.5 is invalid"):
        DPLogisticRegressor((1.0, 1e-5), num_examples=4000, batch_size=200, epochs=1, clip_norm=bad)
    model = DPLogisticRegressor((1.0, 1e-5), batch_size=200, epochs=1, clip_norm=bad, seed=1)
    with pytest.raises(DpSgdConfigError, match="count_stddev=0.5 is invalid"):
        model.fit(_Untouchable(), _Untouchable(), num_examples=4000)
    assert model.model is None
    with pytest.raises(DpSgdConfigError, match="implementation='tf_privacy'"):
        DPLogisticRegressor((1.0, 1e-5), clip_norm="adaptive", implementation="tf_privacy")


def test_data_derived_target_quantile_refused_under_the_share():
    """Under DPTrainer's training_seed(public=...) a target quantile computed from the data (the exact positive
    share) is refused before the fit reads or draws anything, like a data-derived batch size; the public default
    passes."""
    x, y = _imbalanced(n=400)
    leaked = AdaptiveClip(target_quantile=1 - float(np.mean(y)))
    public = frozenset({200.0, 1.0, *AdaptiveClip().public_numbers().values()})
    model = DPLogisticRegressor((1.0, 1e-5), num_examples=400, batch_size=200, epochs=1, clip_norm=leaked)
    with training_seed(5, share=(1.0, 1e-5), public=public):
        with pytest.raises(PublicParameterError, match="clip_target_quantile is not one of this run's public"):
            model.fit(_Untouchable(), _Untouchable())
    assert model.model is None
    with training_seed(5, share=(1.0, 1e-5), public=public):
        ok = DPLogisticRegressor((1.0, 1e-5), num_examples=400, batch_size=200, epochs=1, clip_norm="adaptive").fit(
            x, y
        )
    assert ok.privacy_spent["adaptive_clip"]["target_quantile"] == 0.5


# --------------------------------------------------------------------------- the mechanism


def test_sum_multiplier_formula_is_one_gaussian_mechanism():
    """Thm 1 through dp_accounting: the sum (sensitivity 1, std z_Delta) and the count (sensitivity 1/2, std
    sigma_b, i.e. a Gaussian of multiplier 2 sigma_b) composed over T full-batch steps have the epsilon of T
    Gaussian(z) steps, to the accountant's precision; and z_Delta inverts the formula."""
    import dp_accounting

    for z, sigma_b in ((1.1, 10.0), (0.8, 0.6), (3.0, 2.0)):
        z_delta = sum_noise_multiplier(z, sigma_b)
        assert z_delta > z
        assert (z_delta**-2 + (2 * sigma_b) ** -2) ** -0.5 == pytest.approx(z, rel=1e-12)
        pair = dp_accounting.ComposedDpEvent(
            [dp_accounting.GaussianDpEvent(z_delta), dp_accounting.GaussianDpEvent(2 * sigma_b)]
        )
        for accountant in ("rdp", "pld"):
            one = dpsgd.event_epsilon(
                dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(z), 50), 1e-5, accountant
            )
            both = dpsgd.event_epsilon(dp_accounting.SelfComposedDpEvent(pair, 50), 1e-5, accountant)
            assert both == pytest.approx(one, rel=2e-3), (z, sigma_b, accountant)
    with pytest.raises(DpSgdConfigError, match="count_stddev=0.5 is invalid for noise multiplier 1"):
        sum_noise_multiplier(1.0, 0.5)


@pytest.mark.parametrize("make_fit", ["make_private", "estimator"])
def test_accounted_epsilon_and_share_spend_equal_the_fixed_clip(make_fit):
    """Same budget, same calibrated z, same DpEvent and epsilon as a fixed clip; the training share composes the
    same spend; the report holds sigma_b = batch/20 and z_Delta."""
    x, y = _imbalanced(n=2000)
    spent = {}
    for clip in (1.0, "adaptive"):
        with training_seed(9, share=(0.8, 1e-5)) as block:
            if make_fit == "make_private":
                model = make_private(
                    _logistic(),
                    privacy_budget=(0.8, 1e-5),
                    num_examples=2000,
                    batch_size=100,
                    epochs=1,
                    loss=tf.keras.losses.BinaryCrossentropy(from_logits=True),
                    clip_norm=clip,
                ).fit(x, y)
            else:
                model = DPLogisticRegressor(
                    (0.8, 1e-5), num_examples=2000, batch_size=100, epochs=1, clip_norm=clip
                ).fit(x, y)
            spent[clip] = (model.privacy_spent, block.composed())
    fixed, adaptive = spent[1.0][0], spent["adaptive"][0]
    for key in ("epsilon", "delta", "noise_multiplier", "steps", "sampling_rate"):
        assert adaptive[key] == fixed[key], key
    assert repr(adaptive["dp_event"]) == repr(fixed["dp_event"])
    assert adaptive["epsilon"] == pytest.approx(
        dpsgd.epsilon_for(fixed["noise_multiplier"], 1e-5, 2000, 100, 1), rel=1e-12
    )
    assert spent["adaptive"][1] == spent[1.0][1] == (adaptive["epsilon"], 1e-5)
    report = adaptive["adaptive_clip"]
    assert report["count_stddev"] == 100 / 20
    assert report["sum_noise_multiplier"] == pytest.approx(
        (fixed["noise_multiplier"] ** -2 - (2 * 5.0) ** -2) ** -0.5, rel=1e-12
    )
    assert report["final_clip_norm"] > 0 and "adaptive_clip" not in fixed
    # DPTrainer's spend report keeps the clip's parameters, and its audit re-accounts the same event
    from sage_tfx.components.dp_trainer_executor import audit_spend
    from sage_tfx.components.trainer_utils import spent_report

    audits = {clip: audit_spend(spent_report(spent[clip][0]), (0.8, 1e-5), 2000) for clip in spent}
    assert audits["adaptive"] == audits[1.0] and audits[1.0][0] <= 0.8 * (1 + 1e-9)
    assert spent_report(adaptive)["adaptive_clip"] == report


@pytest.mark.parametrize("kind", ENGINES)
def test_sum_noise_has_the_adjusted_multiplier(kind):
    """Noise-only steps (an empty batch) of a 64x32 + 32 model, 40 draws x 2,113 coordinates: the variance ratio
    to (z_Delta C_t)^2 inside the chi2 two-sided 1e-6 band; z C_t (15% smaller std here) lies far outside it."""
    z, sigma_b = 1.0, 1.0
    model = build_mlp(64, (32,), 1, seed=1)
    engine = _make(kind, model, 1.0, z, seed=21)
    engine.adapt_clip(AdaptiveClip(count_stddev=sigma_b, initial=0.7), batch_size=50)
    z_delta = sum_noise_multiplier(z, sigma_b)
    assert engine.sum_noise_multiplier == pytest.approx(z_delta, rel=1e-12)
    step = tf.function(engine.noise_sum)
    ratios = []
    for _ in range(40):
        clip = engine.current_clip_norm  # C_t: the draw's scale; the step then moves it (a DP release)
        noise = np.concatenate([np.asarray(g).ravel() for g in step()])
        ratios.append(noise**2 / (z_delta * clip) ** 2)
    ratios = np.concatenate(ratios)
    dof = ratios.size
    band = stats.chi2.ppf(5e-7, dof) / dof, stats.chi2.ppf(1 - 5e-7, dof) / dof
    assert band[0] < ratios.mean() < band[1], ratios.mean()
    assert not band[0] < ratios.mean() * (z_delta / z) ** 2 < band[1]
    assert engine.current_clip_norm != 0.7  # the empty steps released counts and moved C


@pytest.mark.parametrize("kind", ENGINES)
def test_clip_update_is_the_geometric_step(kind):
    """With negligible count noise one step moves C exactly as next_clip says from the true norms."""
    x, y = _imbalanced(n=64)
    model = _logistic()
    engine = _make(kind, model, 1.0, 1e-4, seed=2)
    adaptive = AdaptiveClip(target_quantile=0.7, learning_rate=0.3, initial=0.2, count_stddev=1e-3)
    engine.adapt_clip(adaptive, batch_size=64)
    _, norms = engine.clipped_sum(x, y)
    unclipped = int(np.sum(np.asarray(norms) <= 0.2))
    assert 0 < unclipped < 64  # the step sees both kinds
    engine.noisy_sum(x, y)
    expected = next_clip(0.2, unclipped - 0.5 * 64, 64, adaptive)
    assert engine.current_clip_norm == pytest.approx(expected, rel=1e-4)


# The per-example loop (make_private's fallback) runs one seed: each of its steps costs ~100 gradient tapes, ~40 s
# of CI per seed. The margin is per seed, so its false-failure bound stays below 1e-6 (2e-6 with two seeds).
@pytest.mark.parametrize(
    "kind, quantile, seeds",
    [("ghost", 0.5, (1, 2)), ("vmap", 0.9, (1, 2)), ("ghost", 0.9, (1, 2)), ("loop", 0.5, (1,))],
    ids=["ghost-0.5", "vmap-0.9", "ghost-0.9", "loop-0.5"],
)
def test_estimate_converges_to_the_quantile_of_the_norms(kind, quantile, seeds):
    """A fixed model (no update applied), Poisson batches of 100 from 3,000 rows, sigma_b = 5 (the default):
    after 120 steps from C_0 = 1 the mean estimate over the last 40 steps leaves between quantile -+ 0.08 of the
    rows unclipped. Each step's b has s.d. about 0.07 (count noise 5/100, sampling 0.05) and moves log C by
    eta = 0.2 times it; the unclipped share at the running C fluctuates by about 0.02 and its mean over 40 steps
    by about 0.01, so 0.08 is about 8 s.d. for each seed (fixed): below 1e-6 per seed."""
    x = np.random.default_rng(4).normal(size=(3000, 5)).astype(np.float32) * np.random.default_rng(5).gamma(
        2.0, 0.5, size=(3000, 1)
    ).astype(np.float32)
    y = (np.random.default_rng(6).random(3000) < 0.12).astype(np.float32)
    for seed in seeds:
        model = _logistic(seed=7)
        engine = _make(kind, model, 1.0, 1.0, seed=seed)
        engine.adapt_clip(AdaptiveClip(target_quantile=quantile), batch_size=100)
        _, norms = engine.clipped_sum(x, y)
        norms = np.asarray(norms)
        step = tf.function(engine.noisy_sum, reduce_retracing=True)
        clips = []
        for rows in poisson_batches(np.random.default_rng(seed), len(x), 100 / 3000, 120):
            step(x[rows], y[rows])
            clips.append(engine.current_clip_norm)
        share = float(np.mean(norms <= np.mean(clips[-40:])))
        assert abs(share - quantile) < 0.08, (seed, share, quantile)


def test_same_grant_seed_reproduces_the_estimate_and_imbalanced_default():
    x, y = _imbalanced(n=1000)
    finals = []
    for _ in range(2):
        with training_seed(33):
            model = DPDNNClassifier(
                (1.0, 1e-5), hidden_units=(4,), num_examples=1000, batch_size=100, epochs=1, clip_norm=IMBALANCED
            ).fit(x, y.astype(np.int64))
        finals.append(model.privacy_spent["adaptive_clip"]["final_clip_norm"])
    assert finals[0] == finals[1]
    assert IMBALANCED.target_quantile == 0.9
