"""Auditing ``dp_scale_to_z_score`` through the path DPTransform runs (``transform-z-score-beam``): traced by
tf.Transform, executed on Beam's DirectRunner, its noise seeded from a grant on a throwaway ledger.

Many trials in two pipeline runs, as ``transform_beam`` does for the mean, but over FEATURES: the
preprocessing_fn calls ``dp_scale_to_z_score(x_f, eps, [0, R])`` on each of ``trials`` columns x_0 .. x_{F-1}.
On D every column holds the same ``ROWS`` values (half at R/4, half at 3R/4); D' adds ONE record whose value is
R (the top of the range: the most a record moves the count, the centred sum and the centred sum of squares) in
EVERY column. Each feature's release is then one run of the same mechanism on the same neighbouring pair: its
three Laplace cells are its own draws (each analyzer derives its own seed from the run's, ``analyzer_seed``), so
the F releases are independent trials. What each is charged: ``eps``, the analyzer's own ``epsilon`` (the record
is in every column, so the whole preprocessing_fn spends F x eps by sequential composition, and each run's grant
holds that: its preprocessing share is F x eps); the audit tests each feature's release against its own claim
(eps, 0).

The statistic per feature: the rows' z-scores are post-processing of the release (the noisy mean m and std s;
z = (v - m) / s), and two rows of known distinct values give s and m back. From them, with D's public row count
n, the release's centred sum and sum of squares are estimated (S ~ n (m - R/2), Q ~ n (s^2 + (m - R/2)^2)), and
the statistic is those two cells' Laplace log-likelihood ratio of D' to D, as the numpy ``transform-z-score``
entry uses for its cells (the count is not recoverable from the z-scores; any statistic gives a sound bound,
this one is near the most the two cells give). The bound is ``core.audit_outputs``'.

TensorFlow, tf.Transform and Beam are imported when an audit runs (never by ``import sage_tfx.auditing``).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from typing import Any

import numpy as np

from .core import AuditConfig, AuditResult, audit_outputs, trial_seeds
from .transform_beam import VALUE_RANGE, _run, grant_seed

__all__ = ["Z_SCORE_BEAM", "z_score_features_fn", "audit_z_score_beam"]

Z_SCORE_BEAM = "transform-z-score-beam"
ROWS = 100  # D's rows: half at R/4, half at 3R/4 (variance R^2/16, above the noise floor of the variance)


def _column(feature: int) -> str:
    return f"x{feature}"


def z_score_features_fn(features: int, epsilon: float, value_range: float = VALUE_RANGE) -> Callable:
    """The audited preprocessing_fn: ``dp_scale_to_z_score`` of each of ``features`` columns x_0 .. x_{F-1}
    (range [0, ``value_range``], ``epsilon`` each), each row's z-scores in columns z_0 .. z_{F-1}.

    Args:
        features: the number of columns F.
        epsilon: each analyzer's epsilon.
        value_range: the public range's top R.
    """

    def preprocessing_fn(inputs):
        from sage_tfx.transform import dp_scale_to_z_score

        return {
            f"z{f}": dp_scale_to_z_score(inputs[_column(f)], epsilon, value_range, name=f"z_score_{f}")
            for f in range(features)
        }

    return preprocessing_fn


def _rows(features: int, neighbour: bool, value_range: float) -> list[dict[str, Any]]:
    values = [value_range / 4.0] * (ROWS // 2) + [3.0 * value_range / 4.0] * (ROWS - ROWS // 2)
    values += [value_range] if neighbour else []
    return [{_column(f): v for f in range(features)} for v in values]


def _released_mean_and_std(transformed, features: int, value_range: float) -> tuple[np.ndarray, np.ndarray]:
    """Per feature (m, s) from the z-scores of a row at R/4 and a row at 3R/4: s = (b - a) / (z_b - z_a). z is
    increasing in the value (s > 0), and the rows come back in any order: sorted, a feature's first z-score is a
    row at R/4's and its (ROWS / 2)-th one a row at 3R/4's (on D and on D', whose added row sorts last)."""
    low, high = value_range / 4.0, 3.0 * value_range / 4.0
    z = np.sort(np.array([[float(row[f"z{f}"]) for f in range(features)] for row in transformed]), axis=0)
    z_a, z_b = z[0], z[ROWS // 2]
    std = (high - low) / (z_b - z_a)
    return low - z_a * std, std


def _z_score_llr(transformed, features: int, epsilon: float, value_range: float) -> np.ndarray:
    """Per feature: the Laplace log-likelihood ratio of D' to D of its (centred sum, centred sum of squares) as
    estimated from its released mean and std (module docstring); scales 3 (R/2)/eps and 3 (R^2/4)/eps (the
    analyzer's thirds), shifts the expected moves of the estimates under the added record."""
    mean, std = _released_mean_and_std(transformed, features, value_range)
    half, n = value_range / 2.0, float(ROWS)
    centred = mean - half
    sums, squares = n * centred, n * (std**2 + centred**2)
    exact_square = n * (half / 2.0) ** 2  # every D value is R/4 from the centre
    # on D' the release divides (S + R/2, Q + R^2/4) by n + 1: the estimates (times n) move by this much
    shift_sum = half * n / (n + 1.0)
    shift_square = (exact_square + half * half) * n / (n + 1.0) - exact_square
    scale_sum, scale_square = 3.0 * half / epsilon, 3.0 * half * half / epsilon

    def llr(x, exact, shift, scale):
        return (np.abs(x - exact) - np.abs(x - exact - shift)) / scale

    return llr(sums, 0.0, shift_sum, scale_sum) + llr(squares, exact_square, shift_square, scale_square)


def audit_z_score_beam(
    epsilon: float = 1.0, config: AuditConfig | None = None, *, preprocessing_fn: Callable | None = None
) -> AuditResult:
    """Audit ``dp_scale_to_z_score`` through tf.Transform on Beam (module docstring): ``config.trials``
    features, one DirectRunner run on D and one on D', each seeded from its own throwaway grant (preprocessing
    share ``config.trials`` x ``epsilon``); each feature's release is audited against (``epsilon``, 0).

    Args:
        epsilon: each analyzer's claimed epsilon.
        config: trials (features), confidence and seed (default 200 features).
        preprocessing_fn: the traced function (default ``z_score_features_fn(trials, epsilon)``; a planted
            variant's in the tests).
    """
    config = config or AuditConfig(trials=200)
    fn = preprocessing_fn or z_score_features_fn(config.trials, epsilon)
    return audit_features_beam(Z_SCORE_BEAM, epsilon, config, fn, _rows, _z_score_llr)


def audit_features_beam(
    name: str, epsilon: float, config: AuditConfig, preprocessing_fn: Callable, rows: Callable, statistic: Callable
) -> AuditResult:
    """The per-feature Beam audit: ``config.trials`` float columns x_0 .. x_{F-1}, one DirectRunner run of
    ``preprocessing_fn`` on ``rows(F, False, R)`` and one on ``rows(F, True, R)``, each seeded from its own
    throwaway grant of F x ``epsilon``; ``statistic(transformed, F, epsilon, R)`` per feature, each feature's
    release audited against (``epsilon``, 0).

    Args:
        name: the audit's name (in its result and its grants' computation).
        epsilon: each feature's analyzer's claimed epsilon.
        config: trials (features), confidence and seed.
        preprocessing_fn: the traced function.
        rows: the data set's rows, D or D' (``neighbour``).
        statistic: the per-feature statistic of the transformed rows.
    """
    import sage_tfx  # noqa: F401  (before TensorFlow: tf.keras is Keras 2)  # isort: skip
    import tensorflow as tf  # noqa: TID253

    features = config.trials
    spec = {_column(f): tf.io.FixedLenFeature([], tf.float32) for f in range(features)}
    outputs = []
    with tempfile.TemporaryDirectory() as tmp:
        for neighbour in (False, True):
            label = "d_prime" if neighbour else "d"
            computation = f"audit {name} {config.seed} {trial_seeds(config.seed, 1)[0]}"
            seed = grant_seed(tmp, features * epsilon, computation, label)
            data = rows(features, neighbour, VALUE_RANGE)
            transformed = _run(preprocessing_fn, data, seed, os.path.join(tmp, f"tft_{label}"), spec)
            outputs.append(statistic(transformed, features, epsilon, VALUE_RANGE))
    return audit_outputs(name, outputs[0], outputs[1], epsilon, 0.0, config)
