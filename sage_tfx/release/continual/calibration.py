"""A strategy's participation sum: a record's worst-case zCDP over all its releases, in units of 1/z^2
(docs/release_strategies.md, "Continual and sliding-window release: the proofs").
"""

from __future__ import annotations

import math

from . import alg5
from .params import Strategy


def participation_sum(strategy: Strategy, window: int | None = None) -> float:
    """c with 1/z_eff^2 = c / z^2: a record's worst-case sum over its releases of 1/(z 2^j)^2, times z^2."""
    if Strategy(strategy) is Strategy.CUMULATIVE:
        return 4.0 / 3.0
    if Strategy(strategy) is Strategy.SLIDING_AS_WRITTEN:
        return alg5.participation(window)
    levels = int(math.floor(math.log2(window)))
    return sum(4.0**-j for j in range(levels + 1))
