"""Auditing through the pipeline's own path (``sage_tfx.auditing.transform_beam``): a DP analyzer traced by
tf.Transform and run on Beam's DirectRunner, its seed drawn through a grant on a throwaway ledger, stays below its
claim; the planted bug "the exact mean baked into the transform graph" is refused by DPTransform's trace check and,
with the check out of the way, flagged by the auditor.

Fixed seeds: deterministic. A correct analyzer is flagged for at most 5% of master seeds (95% confidence).
"""

import sage_tfx  # noqa: F401  (before TensorFlow: tf.keras is Keras 2)  # isort: skip
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_transform as tft

from sage_tfx.auditing import AuditConfig, transform_beam
from sage_tfx.auditing.transform_beam import audit_transform_beam, dp_mean_tables_fn
from sage_tfx.components.dp_transform_executor import trace_spend
from sage_tfx.transform.errors import NonPrivateAnalyzer

pytestmark = pytest.mark.slow  # two tf.Transform runs on the DirectRunner per audit (about 20 s CPU)

CONFIG = AuditConfig(trials=400, seed=7)
EPSILON = 1.0
SPEC = {"key": tf.io.FixedLenFeature([], tf.int64), "value": tf.io.FixedLenFeature([], tf.float32)}


def test_dp_mean_per_key_through_tf_transform_on_beam_stays_below_its_claim(monkeypatch):
    seeds = []
    real = transform_beam.grant_seed

    def recorded(*args, **kwargs):
        seeds.append(real(*args, **kwargs))
        return seeds[-1]

    monkeypatch.setattr(transform_beam, "grant_seed", recorded)
    result = audit_transform_beam(EPSILON, CONFIG)
    assert 0.0 <= result.epsilon_lower_bound <= EPSILON, result.to_dict()
    assert len(seeds) == 2 and seeds[0] != seeds[1]  # one grant per run, each its own ledger seed


def _exact_mean_baked_in(nkeys):
    """The planted bug: beside the DP tables, the exact per-key mean from tft.sum (an exact analyzer), baked
    into the transform graph as a constant and read back by every row."""
    dp = dp_mean_tables_fn(nkeys, EPSILON)

    def preprocessing_fn(inputs):
        out = dp(inputs)
        onehot = tf.one_hot(inputs["key"], nkeys)
        sums = tft.sum(onehot * inputs["value"][:, None], reduce_instance_dims=False)
        counts = tft.sum(onehot, reduce_instance_dims=False)
        out["exact_mean"] = tf.gather(sums / tf.maximum(counts, 1.0), inputs["key"])
        return out

    return preprocessing_fn


def _exact_mean(transformed, nkeys, epsilon, value_range):
    means = np.zeros(nkeys)
    for row in transformed:
        means[int(row["key"])] = float(row["exact_mean"])
    return means


def test_the_exact_mean_baked_into_the_transform_graph_is_refused_and_would_be_flagged():
    with pytest.raises(NonPrivateAnalyzer, match="not differentially private"):
        trace_spend(_exact_mean_baked_in(CONFIG.trials), SPEC, {}, 12345)  # DPTransform's plan, before any read
    result = audit_transform_beam(
        EPSILON, CONFIG, preprocessing_fn=_exact_mean_baked_in(CONFIG.trials), statistic=_exact_mean
    )
    assert result.flagged and result.epsilon_lower_bound > 3.9, result.to_dict()  # the cap at 200 runs: 3.98
