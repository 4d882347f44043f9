"""Amplification by sampling for the continual releases (the paper's App. B, Algorithms 6 and 8;
docs/release_strategies.md, "Sampled variants").

With ``ReleaseParams(sampling="poisson")`` a release on 2^j blocks reads a Poisson sample of its records (each kept
independently with rate p_j = (e^(epsilon0 / 2^j) - 1) / (e^epsilon0 - 1)) and adds the noise of its FULL declared
size (noise multiplier z on the sensitivity of 2^j blocks): the unsampled release is (epsilon0, delta0)-DP, the
sampled one (epsilon0 / 2^j, p_j delta0)-DP. A record is in at most one release of each size, so its total is at
most (S epsilon0, S delta0) with S the strategy's ``sampling_sum``; epsilon0 = epsilon / S, delta0 = delta / S.
"""

from __future__ import annotations

import math

import numpy as np

from .params import ContinualReleaseError, Strategy

RATE_BITS = 53  # the rate is rounded DOWN to a multiple of 2^-53: the sample's rate is never above p_j


def sampling_sum(strategy: Strategy, window: int | None = None) -> float:
    """S = the worst record's sum of 2^-j over its releases (one per size 2^j): 2 cumulative, 2 - 2^-J sliding.

    Args:
        strategy: the release strategy (the paper's Algorithm 5 as written re-trains buckets: refused).
        window: the sliding window in blocks (J = floor(log2 window)); None for the cumulative release.
    """
    strategy = Strategy(strategy)
    if strategy is Strategy.CUMULATIVE:
        return 2.0
    if strategy is Strategy.SLIDING:
        return 2.0 - 2.0 ** -int(math.floor(math.log2(window)))
    raise ContinualReleaseError(
        f"sampling is not defined for {strategy.value}: its buckets are re-trained, so a record is in several "
        "releases of one size; give sampling='none' or use SlidingWindowRelease"
    )


def sampling_rate(epsilon0: float, blocks: int) -> float:
    """p_j = (e^(epsilon0 / blocks) - 1) / (e^epsilon0 - 1) <= 1 / blocks: the amplified release is epsilon0 / blocks.

    Args:
        epsilon0: the unsampled release's epsilon.
        blocks: the blocks the release reads (2^j).
    """
    return math.expm1(epsilon0 / blocks) / math.expm1(epsilon0)


def amplified(epsilon0: float, delta0: float, p: float) -> tuple[float, float]:
    """(log(1 + p (e^epsilon0 - 1)), p delta0): an (epsilon0, delta0)-DP release on a Poisson sample of rate p
    (add/remove neighbours; Li, Qardaji and Su 2012, Balle, Barthe and Gaboardi 2018, Thm. 8).

    Args:
        epsilon0: the unsampled release's epsilon.
        delta0: the unsampled release's delta.
        p: the sampling rate.
    """
    return math.log1p(p * math.expm1(epsilon0)), p * delta0


def poisson_mask(n: int, p: float, rng) -> np.ndarray:
    """Keep each of ``n`` records independently with probability floor(p 2^53) / 2^53 (<= p), from ``rng``.

    Args:
        n: the records.
        p: the rate in [0, 1].
        rng: the secure generator (a SecureRNG: the sample must stay secret).
    """
    threshold = np.uint64(math.floor(p * 2**RATE_BITS))
    return (rng.words(n) >> np.uint64(64 - RATE_BITS)) < threshold
