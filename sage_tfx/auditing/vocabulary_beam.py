"""Auditing the DP vocabulary through the path DPTransform runs (``transform-vocabulary-beam``): traced by
tf.Transform, executed on Beam's DirectRunner, its noise seeded from a grant on a throwaway ledger.

Many trials in two pipeline runs, as ``transform_beam`` does for the mean: Laplace partition selection keeps or
drops each value on its own count and its own noise draw, and with one value per row the values' rows are
disjoint (parallel composition), so ``trials`` distinct values give ``trials`` independent releases. On D every
value has ``at_threshold`` rows (ceil of the threshold tau: kept about half the time); D' adds one row to EVERY
value. The statistic per value is whether it is kept (``dp_compute_and_apply_vocabulary`` with no OOV bucket:
its rows get id -1 when it is not). Claim: the analyzer's (epsilon, 1e-5).

TensorFlow, tf.Transform and Beam are imported when an audit runs (never by ``import sage_tfx.auditing``).
"""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Callable
from typing import Any

import numpy as np

from .core import AuditConfig, AuditResult, audit_outputs, trial_seeds
from .mechanisms import GAUSSIAN_DELTA
from .transform_beam import _run, grant_seed

__all__ = ["VOCABULARY_BEAM", "vocabulary_ids_fn", "audit_vocabulary_beam"]

VOCABULARY_BEAM = "transform-vocabulary-beam"


def vocabulary_ids_fn(epsilon: float, delta: float = GAUSSIAN_DELTA) -> Callable:
    """The audited preprocessing_fn: each row's id in ``dp_compute_and_apply_vocabulary`` (-1 when its value was
    not kept), beside its value.

    Args:
        epsilon: the analyzer's epsilon.
        delta: its delta.
    """

    def preprocessing_fn(inputs):
        import tensorflow as tf  # noqa: TID253

        from sage_tfx.transform import dp_compute_and_apply_vocabulary

        ids = dp_compute_and_apply_vocabulary(inputs["value"], epsilon, delta, num_oov_buckets=0, default_value=-1)
        return {"value": tf.identity(inputs["value"]), "id": ids}

    return preprocessing_fn


def _rows(values: int, at_threshold: int, neighbour: bool) -> list[dict[str, Any]]:
    per_value = at_threshold + int(neighbour)
    return [{"value": f"v{i}".encode()} for i in range(values) for _ in range(per_value)]


def _kept(transformed, values: int) -> np.ndarray:
    kept = np.zeros(values)
    for row in transformed:
        value = row["value"]
        kept[int((value.decode() if isinstance(value, bytes) else value)[1:])] = float(int(row["id"]) >= 0)
    return kept


def audit_vocabulary_beam(
    epsilon: float = 1.0, config: AuditConfig | None = None, *, preprocessing_fn: Callable | None = None
) -> AuditResult:
    """Audit the DP vocabulary through tf.Transform on Beam (module docstring): ``config.trials`` values, one
    DirectRunner run on D and one on D', each seeded from its own throwaway grant (preprocessing share
    (``epsilon``, 1e-5)).

    Args:
        epsilon: the analyzer's claimed epsilon.
        config: trials (values), confidence and seed (default 1000 values).
        preprocessing_fn: the traced function (default ``vocabulary_ids_fn(epsilon)``; a planted variant's in the
            tests).
    """
    import sage_tfx  # noqa: F401  (before TensorFlow: tf.keras is Keras 2)  # isort: skip
    import tensorflow as tf  # noqa: TID253

    from sage_tfx.transform.vocabulary import threshold

    config = config or AuditConfig(trials=1000)
    at_threshold = int(math.ceil(threshold(epsilon, GAUSSIAN_DELTA)))
    preprocessing_fn = preprocessing_fn or vocabulary_ids_fn(epsilon)
    spec = {"value": tf.io.FixedLenFeature([], tf.string)}
    outputs = []
    with tempfile.TemporaryDirectory() as tmp:
        for neighbour in (False, True):
            label = "d_prime" if neighbour else "d"
            computation = f"audit {VOCABULARY_BEAM} {config.seed} {trial_seeds(config.seed, 1)[0]}"
            seed = grant_seed(tmp, epsilon, computation, label, GAUSSIAN_DELTA)
            rows = _rows(config.trials, at_threshold, neighbour)
            transformed = _run(preprocessing_fn, rows, seed, os.path.join(tmp, f"tft_{label}"), spec)
            outputs.append(_kept(transformed, config.trials))
    return audit_outputs(VOCABULARY_BEAM, outputs[0], outputs[1], epsilon, GAUSSIAN_DELTA, config)
