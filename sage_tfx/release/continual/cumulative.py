"""Cumulative continual release (the paper's Algorithm 4 over Algorithm 2's bases; docs/release_strategies.md,
"Continual and sliding-window release: the proofs").
"""

from __future__ import annotations

import numpy as np

from .base import Released, _Base
from .params import ContinualReleaseError, Strategy


class ContinualRelease(_Base):
    """Cumulative continual release (the paper's Algorithm 4 over Algorithm 2's bases); proof in the docs.

    ``ContinualRelease(ledger, stream, pipeline, params, reader, dim=d)``; ``observe(block)`` per arrival returns
    the released model. Privacy: every record is (epsilon, delta)-DP over the infinite sequence of releases
    (per-record rho <= 1/(2 z_eff^2) * (1 + 4 xi)^2 with z_eff calibrated to (epsilon, delta); proof in the
    docs/release_strategies.md, the paper's Theorems 1 and 4).

    Args:
        *args: ``ledger, stream, pipeline, params, reader``: the ledger; the stream (its unit one row); the
            pipeline name charged; the checked ReleaseParams (window None); grant -> (X, y) of its block.
        **kwargs: ``dim`` (the features), ``validation_epsilon`` and ``test_fraction`` (the SLA check's parallel split).
    """

    strategy = Strategy.CUMULATIVE

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._trained: list[Released] = []
        self.base: np.ndarray | None = None
        self.chain: np.ndarray | None = None
        self.t_g = 0

    def _check_window(self, params):
        if params.window is not None:
            raise ContinualReleaseError(
                f"window {params.window!r} is for SlidingWindowRelease: the cumulative "
                "release uses all history (give window=None)"
            )

    def _step(self) -> Released:
        t = len(self.order)
        if t & (t - 1) == 0:  # t = 2^k: a new base on all data
            rel = self._train(t, self.order, None, "base")
            self.base, self.chain, self.t_g = rel.weights, rel.weights, t
        else:
            i = t - self.t_g
            if i & (i - 1) == 0:  # i = 2^j: the blocks since t_g, regularised toward the base
                rel = self._train(t, self.order[self.t_g :], self.base, "doubling-update")
                self.chain = rel.weights
            else:  # the newest block, regularised toward the chain's model
                rel = self._train(t, self.order[-1:], self.chain, "block-update")
        self._trained.append(rel)
        return rel
