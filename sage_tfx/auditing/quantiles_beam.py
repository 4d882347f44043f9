"""Auditing ``dp_quantiles`` through the path DPTransform runs (``transform-quantiles-beam``): traced by
tf.Transform, executed on Beam's DirectRunner, its noise seeded from a grant on a throwaway ledger.

Trials are features, as in ``z_score_beam`` (its module docstring says why each feature's release is one
independent trial of the (eps, 0) analyzer, and what each is charged): the preprocessing_fn calls
``dp_quantiles(x_f, 2, eps, R, grid_size=GRID)`` (the median) on each of ``trials`` columns. On D every column
holds ``ROWS`` = 11 values, 6 at R/4 and 5 at 3R/4 (one grid cell each: the exact median is R/4, and the
added record moves it up); D' adds ONE record of value R in EVERY
column. The statistic per feature is its released boundary: a monotone function of the noisy share of the lower
cell (``monotone_cdf``, ``cdf_quantiles``), which the added record moves down. The grid is coarse (``GRID``
cells, a public parameter of the analyzer): each cell is its own Laplace(1/eps) draw whatever the grid, so the
coarse grid changes no cell's law, only how much of the noise the boundary averages over.

TensorFlow, tf.Transform and Beam are imported when an audit runs (never by ``import sage_tfx.auditing``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .core import AuditConfig, AuditResult
from .transform_beam import VALUE_RANGE
from .z_score_beam import _column, audit_features_beam

__all__ = ["QUANTILES_BEAM", "quantiles_features_fn", "audit_quantiles_beam"]

QUANTILES_BEAM = "transform-quantiles-beam"
ROWS = 11  # 6 at R/4, 5 at 3R/4: the exact median is R/4 on D and moves up on D'
GRID = 2


def quantiles_features_fn(features: int, epsilon: float, value_range: float) -> Callable:
    """The audited preprocessing_fn: ``dp_quantiles`` (2 buckets: the median; ``GRID`` cells) of each of
    ``features`` columns x_0 .. x_{F-1} (range [0, ``value_range``], ``epsilon`` each), its boundary on every row
    in columns q_0 .. q_{F-1}.

    Args:
        features: the number of columns F.
        epsilon: each analyzer's epsilon.
        value_range: the public range's top R.
    """

    def preprocessing_fn(inputs):
        import tensorflow as tf  # noqa: TID253

        from sage_tfx.transform import dp_quantiles

        out = {}
        for f in range(features):
            x = inputs[_column(f)]
            boundary = dp_quantiles(x, 2, epsilon, value_range, grid_size=GRID, name=f"quantiles_{f}")
            out[f"q{f}"] = tf.zeros_like(x) + boundary[0, 0]
        return out

    return preprocessing_fn


def _rows(features: int, neighbour: bool, value_range: float) -> list[dict[str, Any]]:
    values = [value_range / 4.0] * (ROWS - ROWS // 2) + [3.0 * value_range / 4.0] * (ROWS // 2)
    values += [value_range] if neighbour else []
    return [{_column(f): v for f in range(features)} for v in values]


def _boundaries(transformed, features: int, epsilon: float, value_range: float) -> np.ndarray:
    """Per feature: its released boundary (the same on every row)."""
    return np.array([float(transformed[0][f"q{f}"]) for f in range(features)])


def audit_quantiles_beam(
    epsilon: float = 1.0, config: AuditConfig | None = None, *, preprocessing_fn: Callable | None = None
) -> AuditResult:
    """Audit ``dp_quantiles`` through tf.Transform on Beam (module docstring): ``config.trials`` features, one
    DirectRunner run on D and one on D', each seeded from its own throwaway grant (preprocessing share
    ``config.trials`` x ``epsilon``); each feature's release is audited against (``epsilon``, 0).

    Args:
        epsilon: each analyzer's claimed epsilon.
        config: trials (features), confidence and seed (default 200 features).
        preprocessing_fn: the traced function (default ``quantiles_features_fn``; a planted variant's in the
            tests).
    """
    config = config or AuditConfig(trials=200)
    fn = preprocessing_fn or quantiles_features_fn(config.trials, epsilon, VALUE_RANGE)
    return audit_features_beam(QUANTILES_BEAM, epsilon, config, fn, _rows, _boundaries)
