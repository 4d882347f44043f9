"""The empirical privacy auditor: it flags deliberately broken variants of the shipped mechanisms (planted bugs,
built here by wrapping the real release, never shipped) and raises no false alarm on the shipped ones.

Every audit runs at fixed seeds, so each test is deterministic. The auditor's guarantee: for a mechanism that is
(epsilon, delta)-DP, P(lower bound > epsilon) <= 1 - confidence over the trial seeds; so each no-false-alarm
assertion below could fail, for a correct mechanism, for at most a 1 - 0.95 = 5% fraction of master seeds (the
one fixed here passes), and a planted bug's flag holds at 95% confidence.
"""

import json

import numpy as np
import pytest

from sage_tfx.auditing import (
    AuditConfig,
    AuditConfigError,
    Mechanism,
    audit,
    audit_privacy,
    clopper_pearson_upper,
    epsilon_lower_bound,
    guesses_from_scores,
    mechanism,
    mechanism_names,
    one_run_epsilon_lower_bound,
)
from sage_tfx.auditing import mechanisms as registry
from sage_tfx.cli import main
from sage_tfx.components._grant import laplace_count
from sage_tfx.privacy.randomness import secure_rng
from sage_tfx.privacy.samplers import grid_laplace_sum

EPSILON = 1.0
CONFIG = AuditConfig(trials=1000, confidence=0.95, seed=7)


# ---------------------------------------------------------------- planted bugs: each must be flagged


def _noise_off(neighbour, seed):
    return float(1000 + int(neighbour))  # the exact count, as a release that forgot its noise


def _scale_halved(neighbour, seed):
    # laplace_count at 2 epsilon: noise of scale 1 / (2 epsilon), half the claimed 1 / epsilon
    return laplace_count(1000 + int(neighbour), 2.0 * EPSILON, secure_rng(seed, "record_count"))


def _sensitivity_understated(neighbour, seed):
    # values in [0, 4] released with the sensitivity of values in [0, 1]: one record moves the sum by 4
    records = np.full(200, 2.0)
    records = np.append(records, 4.0) if neighbour else records
    return float(grid_laplace_sum(records, 1.0, EPSILON, secure_rng(seed, "audit"))[0])


def _split_counts(stream_a, stream_b):
    """Two record counts of disjoint splits A and B (parallel composition: epsilon for the pair), drawn from the
    streams named; D' adds one record to A. Statistic: A~ - B~."""

    def release(neighbour, seed):
        a = laplace_count(600 + int(neighbour), EPSILON, secure_rng(seed, stream_a))
        b = laplace_count(400, EPSILON, secure_rng(seed, stream_b))
        return a - b

    return release


def _unit_ignored(neighbour, seed):
    # a stream whose privacy unit has K = 5 rows, counted at the per-ROW epsilon: one unit moves the count by 5
    return laplace_count(1000 + registry.UNIT_ROWS * int(neighbour), EPSILON, secure_rng(seed, "record_count"))


PLANTED = {
    "noise off": _noise_off,
    "privacy unit ignored (per-row budget on a unit stream)": _unit_ignored,
    "noise scale halved": _scale_halved,
    "sensitivity understated 4x": _sensitivity_understated,
    # the same seed and stream for the two data sets: the same noise on both, which cancels in the difference
    "one seed reused on two data sets": _split_counts("record_count", "record_count"),
}


@pytest.mark.parametrize("bug", sorted(PLANTED))
def test_a_planted_bug_is_flagged_above_its_claim(bug):
    result = audit(Mechanism(bug, PLANTED[bug], EPSILON), CONFIG)
    assert result.flagged, result.to_dict()
    assert result.epsilon_lower_bound > EPSILON


def test_the_two_split_counts_with_their_own_streams_are_not_flagged():
    """The correct form of the reused-seed bug (one stream per split): below the claim."""
    result = audit(Mechanism("split counts", _split_counts("record_count/a", "record_count/b"), EPSILON), CONFIG)
    assert not result.flagged, result.to_dict()


def test_the_centred_mean_release_without_its_shift_is_flagged():
    """The centred mean's sum released on RAW values (v, not v - R/2: one record of value R moves it by R) at the
    centred form's sensitivity R/2 and its share of epsilon: the auditor flags it above the share it claims."""
    from sage_tfx.transform.noise import add_laplace, mean_release

    value_range = 10.0
    release = mean_release(EPSILON, value_range)
    claim = release.epsilons[1]

    def unshifted(neighbour, seed):
        sums = np.array([800.0 + value_range * int(neighbour)])
        (noisy,) = add_laplace(
            [sums], release.scales[1:], seed=seed, stream="dp_mean", sensitivities=release.sensitivities[1:], cells=[1]
        )
        return float(registry._laplace_llr(noisy[0], 800.0, value_range, release.scales[1]))

    result = audit(Mechanism("centred sum, no shift", unshifted, claim), CONFIG)
    assert result.flagged and result.epsilon_lower_bound > claim, result.to_dict()


# ---------------------------------------------------------------- no false alarm on what ships


@pytest.mark.parametrize("name", mechanism_names(include_slow=False))
def test_no_shipped_mechanism_is_flagged(name):
    result = audit(mechanism(name, EPSILON), CONFIG)
    assert 0.0 <= result.epsilon_lower_bound <= result.claimed_epsilon, result.to_dict()


@pytest.mark.slow
def test_adassp_is_not_flagged():
    result = audit(mechanism("adassp", EPSILON), AuditConfig(trials=200, seed=7))
    assert not result.flagged, result.to_dict()


def test_the_bound_is_tight_enough_to_matter_on_the_record_count():
    """A sound auditor that always said 0 would pass the test above: on the shipped DP count at epsilon 1 the bound
    reaches more than half the claim with 1000 trials a side."""
    assert audit(mechanism("record-count", EPSILON), CONFIG).epsilon_lower_bound > 0.5


def test_the_bound_exceeds_a_correct_laplace_mechanism_at_most_one_minus_confidence_of_the_time():
    """The confidence statement, checked: 300 audits of numpy's Laplace(1/eps) on a count, each at 95%: the bound
    exceeds eps in at most 5% of them in law; 30 or more of 300 has probability < 1e-3 if that holds."""
    exceed = 0
    for seed in range(300):

        def release(neighbour, s):
            return float(int(neighbour) + np.random.default_rng(s).laplace(0.0, 1.0 / EPSILON))

        exceed += audit(Mechanism("numpy laplace", release, EPSILON), AuditConfig(trials=100, seed=seed)).flagged
    assert exceed < 30


# ---------------------------------------------------------------- the pieces


def test_clopper_pearson_upper_matches_its_closed_forms():
    n, alpha = 100, 0.025
    assert clopper_pearson_upper(0, n, alpha)[()] == pytest.approx(1.0 - alpha ** (1.0 / n))
    assert clopper_pearson_upper(n, n, alpha)[()] == 1.0
    assert clopper_pearson_upper(30, n, alpha)[()] > 0.30


def test_epsilon_lower_bound_takes_both_directions_and_delta():
    assert epsilon_lower_bound(0.1, 0.5) == pytest.approx(np.log(0.5 / 0.1))
    assert epsilon_lower_bound(0.5, 0.1) == pytest.approx(np.log(0.5 / 0.1))
    assert epsilon_lower_bound(0.1, 0.5, delta=0.1) == pytest.approx(np.log(0.4 / 0.1))
    assert epsilon_lower_bound(0.6, 0.6) == 0.0


@pytest.mark.parametrize(
    "kwargs, word",
    [
        ({"trials": 10}, "trials"),
        ({"trials": 2.5}, "trials"),
        ({"confidence": 1.0}, "confidence"),
        ({"confidence": 0}, "confidence"),
        ({"seed": -1}, "seed"),
    ],
)
def test_bad_parameters_are_refused_before_any_run(kwargs, word):
    with pytest.raises(AuditConfigError, match=word):
        AuditConfig(**kwargs)


def test_unknown_mechanism_and_bad_epsilon_are_refused():
    with pytest.raises(AuditConfigError, match="unknown mechanism 'nope'.*record-count"):
        mechanism("nope")
    with pytest.raises(AuditConfigError, match="epsilon"):
        mechanism("record-count", epsilon=0.0)


def test_a_claim_in_delta_enters_the_bound():
    m = mechanism("grid-gaussian", 1.0)
    assert m.delta == registry.GAUSSIAN_DELTA
    assert registry.gaussian_sigma(1.0, 1e-5) == pytest.approx(4.897, abs=0.01)


# ---------------------------------------------------------------- the command


def test_cli_prints_json_writes_a_plot_and_lists(tmp_path, capsys):
    png = tmp_path / "audit.png"
    assert main(["audit-privacy", "record-count", "--trials", "200", "--json", "--plot", str(png)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["mechanism"] == "record-count" and out["claimed_epsilon"] == 1.0 and not out["flagged"]
    assert 0.0 <= out["epsilon_lower_bound"] <= 1.0 and out["confidence"] == 0.95
    assert png.stat().st_size > 0
    assert main(["audit-privacy", "--list"]) == 0
    assert "validator-log-loss" in capsys.readouterr().out


def test_cli_exits_1_on_a_violation_and_2_on_bad_input(monkeypatch, capsys):
    monkeypatch.setitem(
        registry._REGISTRY,
        "planted-noise-off",
        (lambda eps: Mechanism("planted-noise-off", _noise_off, eps), "test only", False),
    )
    assert main(["audit-privacy", "planted-noise-off", "--trials", "200"]) == 1
    assert "VIOLATION" in capsys.readouterr().out
    assert main(["audit-privacy", "record-count", "--confidence", "2"]) == 2
    assert "confidence 2.0 must be" in capsys.readouterr().err
    assert main(["audit-privacy"]) == 2


def test_audit_privacy_is_the_library_call_behind_the_command():
    result = audit_privacy("validator-accuracy", trials=200, seed=3)
    assert result.trials == 200 and result.seed == 3 and set(result.outputs) == {"d", "d_prime"}


@pytest.mark.slow
def test_the_continual_release_is_not_flagged():
    result = audit(mechanism("continual-release", EPSILON), AuditConfig(trials=200, seed=7))
    assert not result.flagged, result.to_dict()


def test_bench_privacy_audit_reports_every_fast_mechanism(capsys):
    assert main(["bench", "privacy-audit", "--trials", "40", "--json"]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert set(mechanism_names(include_slow=False)) <= set(figures) and figures["flagged"] == []
    assert all(0.0 <= figures[n]["ratio"] <= 1.0 for n in mechanism_names(include_slow=False))


# ---------------------------------------------------------------- one-run auditing's bound (pure DP)


def _randomized_response_run(epsilon, m, seed):
    """One run of per-canary randomized response: canary i is in with probability 1/2 and the output reports its
    membership truthfully with probability e^eps / (1 + e^eps): epsilon-DP in each canary, exactly."""
    rng = np.random.default_rng(seed)
    included = rng.random(m) < 0.5
    truthful = rng.random(m) < np.exp(epsilon) / (1.0 + np.exp(epsilon))
    return included, np.where(truthful, included, ~included).astype(np.float64)


def test_one_run_bound_stays_below_a_correct_claim_and_flags_a_doubled_epsilon():
    m = 20000
    included, scores = _randomized_response_run(EPSILON, m, seed=11)
    correct, guesses = guesses_from_scores(scores + 1e-9 * np.arange(m), included, m // 2, m // 2)
    bound = one_run_epsilon_lower_bound(correct, guesses, 0.95)
    assert 0.8 < bound <= EPSILON  # one run, 20000 canaries: within 20% of the truth
    included, scores = _randomized_response_run(2.0 * EPSILON, m, seed=12)  # the planted bug: eps 2 claimed as 1
    correct, guesses = guesses_from_scores(scores + 1e-9 * np.arange(m), included, m // 2, m // 2)
    assert one_run_epsilon_lower_bound(correct, guesses, 0.95) > EPSILON


def test_one_run_bound_refuses_bad_counts_and_is_zero_at_chance():
    assert one_run_epsilon_lower_bound(50, 100) == 0.0
    assert one_run_epsilon_lower_bound(0, 0) == 0.0
    with pytest.raises(AuditConfigError, match="correct"):
        one_run_epsilon_lower_bound(5, 3)
    with pytest.raises(AuditConfigError, match="k_plus"):
        guesses_from_scores([0.1, 0.2], [True, False], 2, 1)
