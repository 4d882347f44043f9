"""DP preprocessing for tf.Transform: dp_group_by_mean (Sage, List. 1) and its family, DP counterparts of
tft's scalers and bucketizers (dp_scale_to_z_score, dp_scale_to_0_1, dp_quantiles, dp_bucketize), public-vocabulary lookups
(apply_public_vocabulary, one_hot), the budget helper,
and `noise_seed` (trusted code seeds the analyzers' noise, e.g. DPTransform from the grant).

The analyzers (TensorFlow, Beam) load on first use, so importing this package for
the budget names (`BUDGET_KEY`, `PreprocessingBudget`, ...) stays fast.
"""

from .budget import (
    BUDGET_KEY,
    EPSILON_FIELD,
    PreprocessingBudget,
    Spend,
    budget_custom_config,
    call_preprocessing_fn,
    requested_epsilon,
    requested_spends,
    trace_requested_epsilon,
)
from .errors import BudgetExceeded, DPTransformError, MissingBudget, NonPrivateAnalyzer, RowMixing, TraceMismatch
from .seeding import analyzer_seed, noise_seed

_ANALYZERS = (
    "dp_group_by_mean",
    "dp_mean_per_key",
    "dp_count_per_key",
    "dp_sum_per_key",
    "dp_histogram",
    "dp_mean",
    "dp_variance",
    "PerKeyMean",
)
_VOCABULARY = ("dp_vocabulary", "dp_compute_and_apply_vocabulary")  # in .vocabulary_analyzer
_SCALING = ("dp_scale_to_z_score", "dp_scale_to_0_1", "dp_quantiles", "dp_bucketize")  # in .scaling
_LOOKUP = ("apply_public_vocabulary", "one_hot")  # in .lookup: public vocabularies, no privacy cost

__all__ = [
    "BUDGET_KEY",
    "EPSILON_FIELD",
    "PreprocessingBudget",
    "Spend",
    "budget_custom_config",
    "call_preprocessing_fn",
    "requested_epsilon",
    "requested_spends",
    "trace_requested_epsilon",
    "BudgetExceeded",
    "DPTransformError",
    "MissingBudget",
    "NonPrivateAnalyzer",
    "RowMixing",
    "TraceMismatch",
    "analyzer_seed",
    "noise_seed",
    *_ANALYZERS,
    *_SCALING,
    *_VOCABULARY,
    *_LOOKUP,
]


def __getattr__(name):
    if name in _ANALYZERS:
        from . import analyzers  # noqa: PLC0415

        return getattr(analyzers, name)
    if name in _SCALING:
        from . import scaling  # noqa: PLC0415

        return getattr(scaling, name)
    if name in _LOOKUP:
        from . import lookup  # noqa: PLC0415

        return getattr(lookup, name)
    if name in _VOCABULARY:
        from . import vocabulary_analyzer  # noqa: PLC0415

        return getattr(vocabulary_analyzer, name)
    raise AttributeError(f"module 'sage_tfx.transform' has no attribute {name!r}")
