"""Auditing the release strategies and the stages' own paths (``sage_tfx.auditing.releases``): the Tree Mechanism
(PrivIncReg1), PMWG on a throwaway ledger, the custom validator's metric path and AdaSSP as DPTrainer fits it stay
below their claims; deliberately broken variants (built here, never shipped) are flagged.

The Tree Mechanism and the custom validator run at fixed seeds (deterministic). PMWG and AdaSSP draw their noise
from a fresh ledger's key (the real path: each grant's private seed), so their audits vary run to run: a correct
mechanism is flagged with probability at most 1 - confidence, and their no-false-alarm tests run at confidence
0.999 (a false failure at most once in a thousand runs).
"""

from types import SimpleNamespace

import numpy as np
import pytest

from sage_tfx.auditing import AuditConfig, audit, mechanism, mechanism_names
from sage_tfx.auditing.releases import adassp_dptrainer_mechanism, pmwg_mechanism, tree_mechanism
from sage_tfx.components import dp_model_validator_executor, validator_records
from sage_tfx.privacy.randomness import as_secure_rng
from sage_tfx.privacy.samplers import grid_laplace
from sage_tfx.release.incremental_regression import TreeRegressor
from sage_tfx.validation import noisy
from tests.helpers.planted import pmwg_laplace_scaled

EPSILON = 1.0
TREE_CONFIG = AuditConfig(trials=400, seed=7)
PMWG_TRIALS = 200
LEVEL_ONE_VECTOR = 3  # tree_residuals: (X'X, X'y) after blocks 1, 2, 4; index 3 is X'y of the node [1, 2]


def test_the_new_entries_are_registered():
    assert {"tree-mechanism", "pmwg", "validator-custom", "adassp-dptrainer"} <= set(mechanism_names())
    # in the CI-sized no-false-alarm sweep (test_privacy_auditing.py::test_no_shipped_mechanism_is_flagged)
    assert "validator-custom" in mechanism_names(include_slow=False)


# ---------------------------------------------------------------- the Tree Mechanism


def _level_one_node(residuals):
    return residuals[LEVEL_ONE_VECTOR]


@pytest.mark.parametrize("statistic", [np.sum, _level_one_node], ids=["likelihood ratio", "level-1 node"])
def test_the_tree_mechanism_is_not_flagged(statistic):
    result = audit(tree_mechanism(EPSILON, statistic=statistic), TREE_CONFIG)
    assert 0.0 <= result.epsilon_lower_bound <= EPSILON, result.to_dict()


class _LevelOneNoiseOff(TreeRegressor):
    """The planted bug: the node at level 1 (blocks [1, 2]) released without its noise."""

    def _release_node(self, value, rng):
        if self.t + 1 == 2:
            return value.copy()
        return super()._release_node(value, rng)


def test_the_tree_mechanism_with_its_noise_off_at_one_level_is_flagged():
    result = audit(tree_mechanism(EPSILON, tree_class=_LevelOneNoiseOff, statistic=_level_one_node), TREE_CONFIG)
    assert result.flagged and result.epsilon_lower_bound > 3.0 * EPSILON, result.to_dict()


# ---------------------------------------------------------------- PMWG


def test_pmwg_is_not_flagged():
    result = audit(pmwg_mechanism(EPSILON), AuditConfig(trials=PMWG_TRIALS, confidence=0.999, seed=7))
    assert 0.0 <= result.epsilon_lower_bound <= EPSILON, result.to_dict()


def test_pmwg_with_its_hard_answer_released_exactly_is_flagged(monkeypatch):
    # the round's halves: threshold at eps1 / 2, gap at eps1 / 4, the hard answer at eps2 = eps1 = round / 2
    pmwg_laplace_scaled(monkeypatch, lambda eps: np.isclose(eps, EPSILON / 2), np.inf)
    result = audit(pmwg_mechanism(EPSILON), AuditConfig(trials=PMWG_TRIALS, seed=7))
    assert result.flagged and result.epsilon_lower_bound > 2.0 * EPSILON, result.to_dict()


# ---------------------------------------------------------------- the custom validator


# Imported before any test patches validator_records: its names re-exported by the executor stay the real ones.
assert dp_model_validator_executor.custom_losses is validator_records.custom_losses


def _unclipped_custom_losses(loss_fn, labels, outputs, loss_bound):
    """The planted ``custom_losses``: the user's loss used as it comes (non-finite to B, no clip to [0, B])."""
    values = np.asarray(loss_fn(np.asarray(labels), dict(outputs)), dtype=np.float64).reshape(-1)
    return np.where(np.isfinite(values), values, loss_bound)


def _unclipped_release_pair(values, bound, epsilon, rng, mode):
    """The planted ``release_pair``: Laplace(B / eps) on the sum of the values as given (no clip to [0, B])."""
    total = float(grid_laplace(np.array([np.sum(values)]), bound, epsilon, rng=as_secure_rng(rng))[0])
    return SimpleNamespace(value=total), None


def test_the_custom_validator_keeps_its_bound_when_one_clip_is_removed(monkeypatch):
    """Defence in depth: with ``custom_losses``' clip removed, ``release_pair`` still clips to [0, B]: the neighbour's
    loss of about 1e9 moves the noisy sum by B = 1 only, and the audit stays below the claim."""
    monkeypatch.setattr(validator_records, "custom_losses", _unclipped_custom_losses)
    result = audit(mechanism("validator-custom", EPSILON), AuditConfig(trials=400, seed=7))
    assert 0.0 <= result.epsilon_lower_bound <= EPSILON, result.to_dict()


def test_the_custom_validator_with_both_clips_removed_is_flagged(monkeypatch):
    """The planted bug: the user's loss reaches the Laplace release unclipped (released at sensitivity B = 1)."""
    monkeypatch.setattr(validator_records, "custom_losses", _unclipped_custom_losses)
    monkeypatch.setattr(noisy, "release_pair", _unclipped_release_pair)
    result = audit(mechanism("validator-custom", EPSILON), AuditConfig(trials=400, seed=7))
    assert result.flagged and result.epsilon_lower_bound > 3.0 * EPSILON, result.to_dict()


# ---------------------------------------------------------------- AdaSSP as DPTrainer fits it


@pytest.mark.slow
def test_adassp_through_the_dptrainer_path_is_not_flagged():
    result = audit(adassp_dptrainer_mechanism(EPSILON), AuditConfig(trials=200, confidence=0.999, seed=7))
    assert 0.0 <= result.epsilon_lower_bound <= EPSILON, result.to_dict()


@pytest.mark.slow
def test_adassp_with_the_grants_seed_replaced_by_a_fixed_one_is_flagged(monkeypatch):
    """The planted bug: the fit's noise seeded by a constant instead of the grant's private seed (the charge and
    the release are still made): the same noise on D and on D' cancels in their difference."""
    from sage_tfx.auditing import releases

    real = releases._training_grant_seed
    monkeypatch.setattr(releases, "_training_grant_seed", lambda *args: real(*args) * 0 + 12345)
    result = audit(adassp_dptrainer_mechanism(EPSILON), AuditConfig(trials=60, seed=7))
    assert result.flagged and result.epsilon_lower_bound > 1.5 * EPSILON, result.to_dict()
