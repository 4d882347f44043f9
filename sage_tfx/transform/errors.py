"""Errors of DP preprocessing. Every one names the bad value."""

from sage_tfx.privacy.errors import SageError


class DPTransformError(SageError, ValueError):
    """Bad argument to a DP preprocessing function (epsilon, range, number of keys...)."""


class MissingBudget(DPTransformError):
    """The preprocessing_fn's custom_config carries no preprocessing budget."""


class BudgetExceeded(DPTransformError):
    """A preprocessing_fn asked for more epsilon than its grant. Raised while it is traced,
    before tf.Transform reads any data."""


class NonPrivateAnalyzer(DPTransformError):
    """An analyzer whose output would not be differentially private: a non-DP tf.Transform analyzer
    (its exact statistic would be baked into the graph), or a DP analyzer given a seed the pipeline knows."""


class TraceMismatch(DPTransformError):
    """A trace of the preprocessing_fn differs from the checked one (analyzers, spend, operations, constants)."""


class RowMixing(DPTransformError):
    """A preprocessing_fn whose output for one row depends on the other rows of its batch (outside a DP
    analyzer), or is not a function of its inputs."""
