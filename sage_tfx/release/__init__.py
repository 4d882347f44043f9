"""Release strategies for a growing database, on the same ledger as Sage's iterator (docs/release_strategies.md).

One module (or package of one module per concept) per method; each charges the ledger, per block and before it
reads, what its privacy analysis says:

- ``continual``: continual and sliding-window release of regularised ERM models (Watson et al.).
- ``incremental_regression``: incremental linear regression by the Tree Mechanism (Kasiviswanathan et al.).
- ``blessing``: the ModelBlessing writer and pusher (TFX's layout), shared with DPModelValidator.
- ``growth``: BBScheduler / BBImprover growth schedules and PMWG for linear queries (Cummings et al.).
- DP-SGD noise schedules (Hong et al.) live with DP-SGD: ``sage_tfx.privacy.noise_schedules``.

``open_release`` opens one strategy's ``ReleaseSession`` from its checked settings (``ContinualSettings``, ...): what
`sage release` and `sage serve --release` run (docs/release_strategies.md).

Importing this package imports no TensorFlow, and none of the modules until a name is used.
"""

import importlib

# name -> module that defines it (loaded on first use)
_EXPORTS = {
    "ContinualRelease": "continual.cumulative",
    "SlidingWindowRelease": "continual.sliding_window",
    "ReleaseParams": "continual.params",
    "ContinualReleaseError": "continual.params",
    "release_stream": "continual.stream",
    "check_sla": "continual.sla",
    "push_model": "continual.push",
    "push_blessed": "blessing",
    "write_blessing": "blessing",
    "is_blessed": "blessing",
    "Pushed": "continual.push",
    "IncrementalRegression": "incremental_regression",
    "IncrementalRegressionParams": "incremental_regression",
    "TreeRegressor": "incremental_regression",
    "IncrementalRegressionError": "incremental_regression",
    "HorizonExhausted": "incremental_regression",
    "BBScheduler": "growth.scheduler",
    "SchedulerParams": "growth.scheduler",
    "BBImprover": "growth.improver",
    "ImproverParams": "growth.improver",
    "ScheduledRelease": "growth.scheduled",
    "clipped_mean": "growth.scheduled",
    "PMWG": "growth.pmwg",
    "PMWGParams": "growth.pmwg",
    "Universe": "growth.pmwg",
    "count_query": "growth.pmwg",
    "sum_query": "growth.pmwg",
    "GrowthError": "growth.errors",
    # `sage release`'s library: the checked settings of each strategy, and the session that releases block by block
    "ReleaseSettings": "settings",
    "FeatureSettings": "settings",
    "ContinualSettings": "settings",
    "IncrementalSettings": "settings",
    "GrowthSettings": "settings",
    "PMWGSettings": "settings",
    "ReleaseInputError": "settings",
    "open_release": "session",
    "ReleaseSession": "session",
    "SessionStatus": "session",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'sage_tfx.release' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
