"""Sliding-window release over the last w blocks (a dyadic variant of the paper's Algorithm 5;
docs/release_strategies.md, "Continual and sliding-window release: the proofs").
"""

from __future__ import annotations

import math

import numpy as np

from .base import Released, _Base
from .params import ContinualReleaseError, Strategy


def dyadic_cover(start: int, end: int, max_level: int) -> list[tuple[int, int]]:
    """[start, end) as disjoint aligned dyadic intervals [a 2^j, (a+1) 2^j), j <= max_level, largest first."""
    out, s = [], start
    while s < end:
        j = 0
        while j < max_level and s % (2 ** (j + 1)) == 0 and s + 2 ** (j + 1) <= end:
            j += 1
        out.append((s, s + 2**j))
        s += 2**j
    return sorted(out, key=lambda iv: -(iv[1] - iv[0]))


class SlidingWindowRelease(_Base):
    """Sliding-window release over the last ``params.window`` blocks (a dyadic variant of Algorithm 5).

    Each aligned dyadic bucket of <= 2^J blocks (J = floor(log2 w)) is trained once, when complete, regularised
    toward the newest model of the level above; the release at t combines the buckets covering [t - w, t).
    Privacy: every record is (epsilon, delta)-DP over all releases (docs/release_strategies.md; the paper's Theorem 7).
    Before t = w the window is the whole stream so far. A window larger than the declared horizon is refused.

    Args:
        *args: ``ledger, stream, pipeline, params, reader`` as ContinualRelease (params with a window).
        horizon: the stream's length in blocks, if known (a larger window is refused).
        **kwargs: ``dim``, ``validation_epsilon``, ``test_fraction`` as ContinualRelease.
    """

    strategy = Strategy.SLIDING

    def __init__(self, *args, horizon: int | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        if horizon is not None:
            if isinstance(horizon, bool) or not isinstance(horizon, (int, np.integer)) or horizon < 1:
                raise ContinualReleaseError(f"horizon {horizon!r} is invalid: give the stream's length in blocks")
            if self.params.window > horizon:
                raise ContinualReleaseError(
                    f"window {self.params.window} is larger than the stream "
                    f"({horizon} blocks): give a window <= {horizon}"
                )
        self.levels = int(math.floor(math.log2(self.params.window)))
        self.buckets: dict[tuple[int, int], Released] = {}
        self.latest: dict[int, np.ndarray] = {}
        self._trained: list[Released] = []
        self.removed: list[tuple[int, int]] = []

    def _check_window(self, params):
        if params.window is None:
            raise ContinualReleaseError("window None is invalid: give the sliding window in blocks (>= 1)")

    def _step(self) -> Released:
        t = len(self.order)
        # 1. train the buckets completed by this arrival, largest first (they regularise the smaller ones)
        for j in range(self.levels, -1, -1):
            if t % (2**j) == 0:
                iv = (t - 2**j, t)
                rel = self._train(t, self.order[iv[0] : iv[1]], self.latest.get(j + 1), f"bucket-{j}")
                self.buckets[iv] = rel
                self.latest[j] = rel.weights
                self._trained.append(rel)
        # 2. drop the buckets that left the window; forget their blocks' records
        start = max(0, t - self.params.window)
        for iv in [iv for iv in self.buckets if iv[0] < start]:
            del self.buckets[iv]
            self.removed.append(iv)
        for b in self.order[:start]:
            self.data.pop(b, None)
        # 3. the release: the chain over the window's cover, largest bucket first (post-processing)
        cover = dyadic_cover(start, t, self.levels)
        chain, n_chain = None, 0
        for iv in cover:
            w_b, n_b = self.buckets[iv].weights, iv[1] - iv[0]
            chain = w_b if chain is None else chain + (n_b / (n_b + n_chain)) * (w_b - chain)
            n_chain += n_b
        return Released(t, self.order[start:t], "window", chain, 0)
