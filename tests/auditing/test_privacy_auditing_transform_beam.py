"""Auditing ``dp_scale_to_z_score`` and ``dp_quantiles`` through tf.Transform on Beam
(``sage_tfx.auditing.z_score_beam``, ``sage_tfx.auditing.quantiles_beam``): F features in two DirectRunner runs,
each seeded from its own throwaway grant; the shipped analyzers stay below each feature's claim (eps, 0);
tf.Transform's exact ``scale_to_z_score`` / ``quantiles`` in their place (built here, never shipped) are flagged.

The noise comes from a fresh ledger's key (the real path: each grant's private seed), so the audits vary run to
run: a correct analyzer is flagged with probability at most 1 - confidence, and the no-false-alarm test runs at
confidence 0.999.
"""

import json

import pytest

from sage_tfx.auditing import AuditConfig
from sage_tfx.auditing.quantiles_beam import QUANTILES_BEAM, audit_quantiles_beam, quantiles_features_fn
from sage_tfx.auditing.report import audit_names, describe_audits
from sage_tfx.auditing.z_score_beam import Z_SCORE_BEAM, _column, audit_z_score_beam, z_score_features_fn
from sage_tfx.cli import main

EPSILON = 1.0
FEATURES = 40


def _exact_z_score_fn(features):
    """The planted bug: tf.Transform's exact ``scale_to_z_score`` on each column in place of the DP one."""

    def preprocessing_fn(inputs):
        import tensorflow_transform as tft

        return {f"z{f}": tft.scale_to_z_score(inputs[_column(f)]) for f in range(features)}

    return preprocessing_fn


def _exact_quantiles_fn(features):
    """The planted bug: tf.Transform's exact ``quantiles`` (the median) on each column in place of the DP one."""

    def preprocessing_fn(inputs):
        import tensorflow as tf
        import tensorflow_transform as tft

        return {
            f"q{f}": tf.zeros_like(inputs[_column(f)]) + tft.quantiles(inputs[_column(f)], 2, 0.01)[0, 0]
            for f in range(features)
        }

    return preprocessing_fn


@pytest.mark.parametrize("features_fn", [z_score_features_fn, quantiles_features_fn])
def test_each_feature_is_one_release_charged_its_own_epsilon(features_fn):
    """The preprocessing_fn records one spend of eps per feature (F x eps in all: the neighbour's record is in
    every column), so each feature's release is audited against (eps, 0)."""
    import tensorflow as tf

    from sage_tfx.transform import trace_requested_epsilon

    spec = {_column(f): tf.io.FixedLenFeature([], tf.float32) for f in range(3)}
    total, spends = trace_requested_epsilon(features_fn(3, EPSILON, 10.0), spec)
    assert [s.epsilon for s in spends] == [EPSILON] * 3 and total == pytest.approx(3 * EPSILON)


@pytest.mark.parametrize("audit_fn", [audit_z_score_beam, audit_quantiles_beam])
def test_the_dp_analyzers_through_beam_are_not_flagged(audit_fn):
    result = audit_fn(EPSILON, AuditConfig(trials=FEATURES, confidence=0.999, seed=7))
    assert result.claimed_epsilon == EPSILON and result.claimed_delta == 0.0
    assert 0.0 <= result.epsilon_lower_bound <= EPSILON, result.to_dict()


@pytest.mark.parametrize(
    ("audit_fn", "planted_fn"), [(audit_z_score_beam, _exact_z_score_fn), (audit_quantiles_beam, _exact_quantiles_fn)]
)
def test_the_exact_analyzers_through_beam_are_flagged(audit_fn, planted_fn):
    result = audit_fn(EPSILON, AuditConfig(trials=FEATURES, seed=7), preprocessing_fn=planted_fn(FEATURES))
    assert result.flagged and result.epsilon_lower_bound > 1.2 * EPSILON, result.to_dict()


def test_the_z_score_beam_audit_is_registered_and_runs_from_the_cli(capsys):
    assert {Z_SCORE_BEAM, QUANTILES_BEAM} <= set(audit_names())
    assert "dp_scale_to_z_score" in describe_audits()[Z_SCORE_BEAM]
    assert "dp_quantiles" in describe_audits()[QUANTILES_BEAM]
    assert main(["audit-privacy", Z_SCORE_BEAM, "--trials", "20", "--seed", "3", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["mechanism"] == Z_SCORE_BEAM and out["claimed_epsilon"] == EPSILON and not out["flagged"]
