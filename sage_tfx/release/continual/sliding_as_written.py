"""Sliding-window release by the paper's Algorithm 5 as written: a refreshed base and a fine-tuning chain that
re-trains shifted buckets (``alg5``; docs/release_strategies.md, "Sliding window as written").
"""

from __future__ import annotations

import numpy as np

from . import alg5
from .base import Released, _Base
from .params import ContinualReleaseError, Sampling, Strategy
from .sampling import sampling_sum


class SlidingWindowAsWritten(_Base):
    """Sliding-window release over the last ``params.window`` = 2^k - 1 blocks by Algorithm 5 as written.

    Every 2^(k-1) arrivals a base model is trained on the newest 2^(k-1) blocks; the rest of the window (the older
    blocks left of the base and the blocks arrived since) is cut into power-of-two buckets, each trained
    regularised toward the next larger model of the chain (``alg5.chain_at``); a bucket's model is trained again
    whenever its bucket or its chain above changes (the paper's Example 1). The release is the chain's last
    model. Privacy: one sigma for every model (noise multiplier z 2^j on a bucket of 2^j blocks), z_eff calibrated
    to (epsilon, delta) with the worst block's sum of 4^-j over the models trained on it (``alg5.participation``,
    computed exactly from the data-independent structure); proof in the docs.

    Args:
        *args: ``ledger, stream, pipeline, params, reader`` as ContinualRelease (params with a window 2^k - 1).
        **kwargs: ``dim``, ``validation_epsilon``, ``test_fraction`` as ContinualRelease.
    """

    strategy = Strategy.SLIDING_AS_WRITTEN

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.models: dict[tuple, Released] = {}
        self._trained: list[Released] = []

    def _check_window(self, params):
        if params.window is None:
            raise ContinualReleaseError("window None is invalid: give the sliding window in blocks (2^k - 1)")
        alg5.check_window(params.window)
        if params.sampling is not Sampling.NONE:
            sampling_sum(self.strategy, params.window)  # refuses, naming the fix

    def _step(self) -> Released:
        t = len(self.order)
        reference: np.ndarray | None = None
        model = None
        for key in alg5.chain_keys(t, self.params.window):
            model = self.models.get(key)
            if model is None:
                a, b = key[-1]
                model = self._train(t, self.order[a:b], reference, f"alg5-{b - a}")
                self.models[key] = model
                self._trained.append(model)
            reference = model.weights
        start = max(0, t - self.params.window)
        live = {k: m for k, m in self.models.items() if min(iv[0] for iv in k) >= start}
        self.models = live  # models on blocks that left the window are never used again
        for b in self.order[:start]:
            self.data.pop(b, None)
        assert model is not None  # the chain always holds the newest block's bucket
        return Released(t, self.order[start:t], "window", model.weights, 0)
