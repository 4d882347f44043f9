"""A per-instance memo of Beam's DoFn state and timer introspection (`apache_beam.transforms.userstate.get_dofn_specs`).

Beam asks for a DoFn's state and timer specs several times per ParDo while it builds and translates a pipeline
(`is_stateful_dofn`, `to_runner_api`, the runner's checks), and each answer re-inspects the signature of every
method of the DoFn: for tf.Transform's ~270 transforms that is ~29,000 `inspect.signature` calls, about a third of
the CPU of a 200,000-row `dp_group_by_mean` analysis (docs/BENCHMARKS.md). The memo answers a repeated question about
the SAME DoFn object from its first answer; another object (a copy, an equal one) is inspected afresh, so the
answers are Beam's own. An object that cannot be weakly referenced is never memoised. Installed once, by
`beam_tables` (the Beam side of the DP analyzers).
"""

import weakref
from typing import Any

from apache_beam.transforms import userstate  # noqa: TID253


def install() -> None:
    """Replace ``userstate.get_dofn_specs`` by its per-instance memo (idempotent)."""
    if getattr(userstate.get_dofn_specs, "memoised", False):
        return
    userstate.get_dofn_specs = _memoised(userstate.get_dofn_specs)


def _memoised(original):
    memo: dict[int, tuple[Any, Any]] = {}  # id(dofn) -> (weak reference to it, its specs)

    def get_dofn_specs(dofn):
        key = id(dofn)
        entry = memo.get(key)
        if entry is not None and entry[0]() is dofn:
            return entry[1]
        specs = original(dofn)
        try:
            ref = weakref.ref(dofn, lambda _, key=key: memo.pop(key, None))
        except TypeError:
            return specs
        memo[key] = (ref, specs)
        return specs

    get_dofn_specs.memoised = True  # type: ignore[attr-defined]
    get_dofn_specs.__doc__ = original.__doc__
    get_dofn_specs.__wrapped__ = original  # type: ignore[attr-defined]
    return get_dofn_specs
