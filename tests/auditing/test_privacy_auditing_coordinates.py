"""The coordinate audit of DP-SGD (``sage_tfx.auditing.coordinates``): ONE ``make_private`` fit of a bias-free
linear model on one-hot inputs, each of its 100,000 coordinates an independent run with its own Dirac canary (in
for a random half), stays below its claim; two fits under one share (the share's filter bypassed, both releases
observed) are flagged.

Fixed seeds, so each test is deterministic. False-failure rates: for a fit that is (epsilon, delta)-DP as claimed,
P(bound > epsilon) <= 1 - confidence = 5% (the audit's guarantee); the planted second fit's miss rate is measured
by ``test_two_fits_are_flagged_at_every_seed_of_the_gaussian_the_fit_draws`` (0 of 20 seeds, the weakest 1.23
times the claim, on the per-coordinate distribution the fit draws, itself checked on the real fit by
``test_the_coordinates_are_independent_runs_of_the_calibrated_gaussian``).
"""

import json

import sage_tfx  # noqa: F401  (before TensorFlow: tf.keras is Keras 2)  # isort: skip
import numpy as np
import pytest

from sage_tfx.auditing import AuditConfig, AuditConfigError, CoordinateAudit, audit_dpsgd_coordinates, audit_outputs
from sage_tfx.auditing.coordinates import coordinate_bound, coordinate_data, make_coordinate_fit
from sage_tfx.cli import main
from sage_tfx.models.seeding import FitBudgetError, TrainingBlock, derive_seed, training_seed
from sage_tfx.privacy.dpsgd import calibrate_noise_multiplier

AUDIT = CoordinateAudit(seed=0)  # ghost, 100,000 coordinates, claim (1, 1e-2), pld, one step at q = 1


@pytest.fixture(scope="module")
def shipped():
    """The shipped path: ONE fit under the claim's share, as DPTrainer runs run_fn."""
    return audit_dpsgd_coordinates(AUDIT)


def test_one_fit_under_its_share_stays_below_its_claim(shipped):
    assert 0.5 * AUDIT.epsilon < shipped.epsilon_lower_bound <= AUDIT.epsilon, shipped.to_dict()
    assert not shipped.flagged and shipped.trials == AUDIT.coordinates // 2
    assert shipped.fit["implementation"] == "make_private/ghost" and shipped.fit["releases"] == 1
    assert shipped.fit["sampling_rate"] == 1.0 and shipped.fit["steps"] == 1


def test_the_coordinates_are_independent_runs_of_the_calibrated_gaussian(shipped):
    """Weight i * B / (lr C) is N(0, sigma^2) for a coordinate out and N(1, sigma^2) for one in (one step, q = 1,
    the canary clipped to C), and neighbouring coordinates are uncorrelated: what the audit's runs must be."""
    sigma, scale = shipped.fit["noise_multiplier"], AUDIT.num_examples / (AUDIT.learning_rate * AUDIT.clip_norm)
    out, into = shipped.outputs["d"] * scale, shipped.outputs["d_prime"] * scale
    n = out.size
    for values, mean in ((out, 0.0), (into, 1.0)):
        assert abs(values.mean() - mean) < 5 * sigma / np.sqrt(n)
        assert abs(values.std() / sigma - 1.0) < 5 / np.sqrt(2 * n)
        assert abs(np.corrcoef(values[:-1], values[1:])[0, 1]) < 5 / np.sqrt(n)


def _fits_under_one_share(fits):
    """``fits`` DP fits of the whole claim in one training block; every fitted model is released."""

    def train(audit, ids, y):
        releases = []
        with training_seed(derive_seed("coordinate audit", audit.seed, bits=63), share=(audit.epsilon, audit.delta)):
            for _ in range(fits):
                private = make_coordinate_fit(audit)
                private.fit(ids, y)
                releases.append(private)
        return releases

    return train


def test_a_second_fit_under_one_share_is_refused_and_would_be_flagged(monkeypatch):
    ids, y, included = coordinate_data(AUDIT)
    with pytest.raises(FitBudgetError, match="training share"):
        _fits_under_one_share(2)(AUDIT, ids, y)  # the shipped filter, before the second fit reads anything
    monkeypatch.setattr(TrainingBlock, "_admit", lambda self, name, budget: None)  # the unrefused variant
    releases = _fits_under_one_share(2)(AUDIT, ids, y)
    first = coordinate_bound(AUDIT, releases[:1], included)
    both = coordinate_bound(AUDIT, releases, included)
    assert not first.flagged, first.to_dict()  # the first release alone is the shipped fit
    assert both.flagged and both.epsilon_lower_bound > 1.2 * AUDIT.epsilon, both.to_dict()
    assert both.fit["releases"] == 2


def test_two_fits_are_flagged_at_every_seed_of_the_gaussian_the_fit_draws():
    """The miss rate of the planted second fit, and the margin of one fit, over 20 seeds: each coordinate's
    statistic drawn from the distribution the fit draws (the calibrated sigma; the test above checks it on
    the fit), summed over k fits, bounded by ``audit_outputs`` as the audit does."""
    sigma = calibrate_noise_multiplier(AUDIT.epsilon, AUDIT.delta, 1000, 1000, 1, AUDIT.accountant)
    n = AUDIT.num_examples
    ratios = {1: [], 2: []}
    for seed in range(20):
        rng = np.random.default_rng(seed)
        for k in ratios:
            d = sigma * np.sqrt(k) * rng.normal(size=n)
            d_prime = k + sigma * np.sqrt(k) * rng.normal(size=n)
            result = audit_outputs("two fits", d, d_prime, AUDIT.epsilon, AUDIT.delta, AuditConfig(trials=n))
            ratios[k].append(result.ratio)
    assert max(ratios[1]) < 0.95 and min(ratios[2]) > 1.2, ratios


@pytest.mark.parametrize("engine", ["vmap", "loop"])
def test_the_vmap_and_loop_paths_give_the_ghost_paths_weights(engine):
    """The same sums on each engine path (dense per-example gradients: a small audit), hence the same runs."""
    small = CoordinateAudit(coordinates=2000, accountant="rdp", seed=3)
    ghost = audit_dpsgd_coordinates(small)
    other = audit_dpsgd_coordinates(CoordinateAudit(engine=engine, coordinates=2000, accountant="rdp", seed=3))
    assert other.fit["implementation"] == f"make_private/{engine}"
    np.testing.assert_allclose(other.outputs["d"], ghost.outputs["d"], rtol=1e-4, atol=1e-9)
    np.testing.assert_allclose(other.outputs["d_prime"], ghost.outputs["d_prime"], rtol=1e-4, atol=1e-9)
    assert not other.flagged and other.epsilon_lower_bound == pytest.approx(ghost.epsilon_lower_bound)


def test_cli_audits_dpsgd_coordinates_prints_json(capsys):
    assert main(["audit-privacy", "dpsgd-coordinates", "--trials", "2000", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["mechanism"] == "dpsgd-coordinates" and out["method"] == "coordinates"
    assert out["coordinates"] == 4000 and out["claimed_delta"] == 0.01 and not out["flagged"]
    assert out["fit"]["implementation"] == "make_private/ghost" and out["fit"]["config"]["accountant"] == "pld"


@pytest.mark.parametrize(
    "kwargs, word",
    [
        ({"engine": "tf_privacy"}, "engine"),
        ({"coordinates": 41}, "coordinates"),
        ({"coordinates": 20}, "coordinates"),
        ({"engine": "vmap", "coordinates": 10000}, "ghost"),
        ({"accountant": "gdp"}, "accountant"),
        ({"epochs": 0.5}, "epochs"),
        ({"confidence": 1.0}, "confidence"),
        ({"delta": 0.0}, "delta"),
    ],
)
def test_bad_coordinate_parameters_are_refused_before_any_fit(kwargs, word):
    with pytest.raises(AuditConfigError, match=word):
        CoordinateAudit(**kwargs)
