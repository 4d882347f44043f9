"""Auditing a tf.Transform analyzer through the path DPTransform runs: traced by tf.Transform, executed on Beam's
DirectRunner, its noise seeded from a grant on a throwaway ledger.

Many trials in two pipeline runs. A per-key analyzer (``dp_mean_per_key``) releases one independent noisy cell
pair per key (the keys' rows are disjoint: parallel composition, the analyzer's own proof), so with ``trials``
keys ONE run on D gives ``trials`` independent releases on D's key tables, and one run on D' (D plus one record
of value ``value_range`` on EVERY key) gives ``trials`` on D' (each key's pair differs by one record). Each run
gets its OWN grant on its own throwaway SQLite ledger (``grant_seed``): the ledger's ``open_release`` for the
preprocessing stage returns the seed that DPTransform puts around the trace (``transform.noise_seed``), and
each analyzer derives its own from it (``transform.seeding.analyzer_seed``). The statistic per key is the
Laplace log-likelihood ratio of its (count, sum) pair, as in the numpy ``transform-dp-mean`` entry; the bound
is ``core.audit_outputs``' (threshold test chosen on half the keys, Clopper-Pearson on the other half).

TensorFlow, tf.Transform and Beam are imported when an audit runs (never by ``import sage_tfx.auditing``).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from typing import Any

import numpy as np

from sage_tfx.privacy.vocabulary import Stage

from .core import AuditConfig, AuditResult, audit_outputs, trial_seeds

__all__ = ["grant_seed", "dp_mean_tables_fn", "audit_transform_beam", "ROWS_PER_KEY", "VALUE_RANGE"]

ROWS_PER_KEY = 5  # D: this many rows of value VALUE_RANGE * BASE_FRACTION on every key
VALUE_RANGE = 10.0
BASE_FRACTION = 0.4


def grant_seed(directory: str, epsilon: float, computation: str, label: str, delta: float = 0.0) -> int:
    """A fresh throwaway SQLite ledger under ``directory`` (file ``label``.db): one stream and block, one grant
    whose preprocessing share is (``epsilon``, ``delta``), and the seed its ``open_release`` of ``computation``
    returns for the preprocessing stage (what DPTransform's executor gets). The stream's limit is raised to
    ``epsilon`` when it is above the default (an audit of F analyzers over one record's F columns holds F x eps)."""
    from sage_tfx.components._grant import open_release
    from sage_tfx.privacy import BudgetSplit, ChargeRule, Ledger
    from sage_tfx.privacy.streams import DEFAULT_MAX_STREAM_EPSILON

    location = os.path.join(directory, f"{label}.db")
    with Ledger.open(location, create=True) as ledger:
        ledger.create_stream("audit", epsilon, max(delta, 1e-5), max_epsilon=max(epsilon, DEFAULT_MAX_STREAM_EPSILON))
        ledger.add_block("audit", "b0", start=0.0, end=86400.0, rows=1)
        grant = ledger.request(
            "audit",
            "audit",
            blocks=["b0"],
            epsilon=epsilon,
            delta=delta,
            split=BudgetSplit(epsilon, 0.0, 0.0, 0.0, 0.0, ChargeRule.PARALLEL.value, preprocessing_delta=delta),
        )
        return open_release(ledger, grant, Stage.PREPROCESSING, computation, epsilon, delta)


def dp_mean_tables_fn(nkeys: int, epsilon: float, value_range: float = VALUE_RANGE) -> Callable:
    """The audited preprocessing_fn: ``dp_mean_per_key`` over (key, value); each row gets its key's noisy count
    and sum (columns ``count``, ``sum``)."""

    def preprocessing_fn(inputs):
        import tensorflow as tf  # noqa: TID253

        from sage_tfx.transform import dp_mean_per_key

        tables = dp_mean_per_key(inputs["key"], inputs["value"], nkeys, epsilon, value_range)
        return {
            "key": tf.identity(inputs["key"]),
            "count": tf.gather(tables.counts, inputs["key"]),
            "sum": tf.gather(tables.sums, inputs["key"]),
        }

    return preprocessing_fn


def _rows(nkeys: int, neighbour: bool, value_range: float) -> list[dict[str, Any]]:
    base = [{"key": k, "value": value_range * BASE_FRACTION} for k in range(nkeys) for _ in range(ROWS_PER_KEY)]
    return base + ([{"key": k, "value": value_range} for k in range(nkeys)] if neighbour else [])


def _run(preprocessing_fn, rows, seed: int, temp_dir: str, spec: dict | None = None) -> list[dict[str, Any]]:
    """AnalyzeAndTransformDataset on the DirectRunner, traced under ``noise_seed(seed)`` (DPTransform's way);
    ``spec`` the rows' feature spec (default int64 ``key``, float32 ``value``)."""
    import sage_tfx  # noqa: F401  (before TensorFlow: tf.keras is Keras 2)  # isort: skip
    import tensorflow as tf  # noqa: TID253
    import tensorflow_transform as tft  # noqa: TID253
    import tensorflow_transform.beam as tft_beam  # noqa: TID253

    from sage_tfx.transform import noise_seed

    spec = spec or {"key": tf.io.FixedLenFeature([], tf.int64), "value": tf.io.FixedLenFeature([], tf.float32)}
    metadata = tft.DatasetMetadata.from_feature_spec(spec)
    with tft_beam.Context(temp_dir=temp_dir), noise_seed(seed):
        (transformed, _), _ = (rows, metadata) | tft_beam.AnalyzeAndTransformDataset(preprocessing_fn)
    return transformed


def _llr_per_key(transformed, nkeys: int, epsilon: float, value_range: float) -> np.ndarray:
    """Per key: the log-likelihood ratio of D' to D of its noisy (count, sum), scales 2/eps and 2R/eps (the
    analyzer's half-half split), D's exact cells public here."""
    count = np.zeros(nkeys)
    total = np.zeros(nkeys)
    for row in transformed:
        count[int(row["key"])], total[int(row["key"])] = float(row["count"]), float(row["sum"])
    exact_count, exact_sum = float(ROWS_PER_KEY), ROWS_PER_KEY * value_range * BASE_FRACTION
    scale_count, scale_sum = 2.0 / epsilon, 2.0 * value_range / epsilon
    return (np.abs(count - exact_count) - np.abs(count - exact_count - 1.0)) / scale_count + (
        np.abs(total - exact_sum) - np.abs(total - exact_sum - value_range)
    ) / scale_sum


def audit_transform_beam(
    epsilon: float = 1.0,
    config: AuditConfig | None = None,
    *,
    preprocessing_fn: Callable | None = None,
    statistic: Callable | None = None,
    seeds: tuple[int, int] | None = None,
) -> AuditResult:
    """Audit ``dp_mean_per_key`` through tf.Transform on Beam (module docstring): ``config.trials`` keys, one
    DirectRunner run on D and one on D', each seeded from its own throwaway grant. ``preprocessing_fn`` (default
    ``dp_mean_tables_fn``) and ``statistic(transformed_rows, nkeys, epsilon, value_range) -> per-key array``
    (default the (count, sum) likelihood ratio) are for planted variants; ``seeds`` = (seed on D, seed on D')
    replaces the two grants' seeds (a planted reuse).

    Args:
        epsilon: the analyzer's claimed epsilon.
        config: trials (keys), confidence and seed (default 1000 keys).
        preprocessing_fn: the traced function (default ``dp_mean_tables_fn``).
        statistic: the per-key statistic of the transformed rows.
        seeds: (seed on D, seed on D') in place of the grants' seeds.
    """
    config = config or AuditConfig(trials=1000)
    nkeys = config.trials
    preprocessing_fn = preprocessing_fn or dp_mean_tables_fn(nkeys, epsilon)
    statistic = statistic or _llr_per_key
    name = "transform-dp-mean-beam"
    outputs = []
    with tempfile.TemporaryDirectory() as tmp:
        for neighbour in (False, True):
            label = "d_prime" if neighbour else "d"
            # the computation's name differs per master seed, so every audit opens a release of its own
            computation = f"audit {name} {config.seed} {trial_seeds(config.seed, 1)[0]}"
            seed = seeds[int(neighbour)] if seeds else grant_seed(tmp, epsilon, computation, label)
            transformed = _run(
                preprocessing_fn, _rows(nkeys, neighbour, VALUE_RANGE), seed, os.path.join(tmp, f"tft_{label}")
            )
            outputs.append(statistic(transformed, nkeys, epsilon, VALUE_RANGE))
    return audit_outputs(name, outputs[0], outputs[1], epsilon, 0.0, config)
