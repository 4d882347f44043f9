"""BBImprover (Cummings et al. 2018, Algorithm 2): re-run at every block with a shrinking epsilon
(docs/release_strategies.md, "Growth schedules and PMWG: the proofs").
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from sage_tfx.privacy import gaussian
from sage_tfx.privacy.draws import ZCDP_RUN_DELTA_SHARE as ZCDP_SHARE
from sage_tfx.privacy.vocabulary import Composition

from .calibration import filter_scale
from .errors import GrowthError, _int_at_least, _positive


@dataclass(frozen=True)
class ImproverParams:
    """BBImprover: total per-record (epsilon, delta > 0); exponent a in (0, 1/2); first run at t0 blocks.

    Args:
        epsilon: the total per-record epsilon.
        delta: the total per-record delta (> 0: zCDP composition).
        a: the exponent of epsilon_t = c t^-(1/2 + a), 0 < a < 1/2.
        t0: the block count of the first run.
    """

    epsilon: float
    delta: float
    a: float = 0.1
    t0: int = 1

    def __post_init__(self):
        _positive("epsilon", self.epsilon, "give the total per-record epsilon > 0")
        if not (isinstance(self.delta, (int, float)) and 0 < self.delta < 1):
            raise GrowthError(
                f"delta {self.delta!r} is invalid: BBImprover composes infinitely many runs under "
                "zCDP, give 0 < delta < 1 (use BBScheduler for pure epsilon-DP)"
            )
        if not (isinstance(self.a, (int, float)) and 0 < self.a < 0.5):
            raise GrowthError(f"a {self.a!r} is invalid: give 0 < a < 1/2 (epsilon_t ~ t^-(1/2 + a))")
        _int_at_least("t0", self.t0, 1, "give the first run's block count t0 >= 1")


class BBImprover:
    """Run at every block count t >= t0 with epsilon_t = c t^-(1/2 + a) (the paper's Section 3.2, Theorem 13).

    Privacy: (epsilon, delta)-DP per record over the infinite horizon (zCDP: sum_t epsilon_t^2 / 2 <= rho by the
    integral bound in the proofs, docs/release_strategies.md; Theorem 4). ``approximate=True``: runs of (epsilon_t, delta_t), drawn
    by the ledger's "zcdp" rule, c calibrated to its RDP filter (docs/release_strategies.md, "Approximate runs"). Run index
    (epoch) of the run at t blocks: t - t0.

    Args:
        params: the checked ImproverParams.
        approximate: runs of (epsilon_t, delta_t) drawn by the ledger's "zcdp" rule (a TFX pipeline per run).
    """

    HEAD = 4096  # exact terms of the approximate calibration before the integral bound

    def __init__(self, params: ImproverParams, *, approximate: bool = False):
        if not isinstance(params, ImproverParams):
            raise GrowthError(f"params {params!r} must be an ImproverParams")
        self.params, self.approximate = params, bool(approximate)
        t0, a = params.t0, params.a
        if self.approximate:
            self.rho = None
            end = t0 + self.HEAD  # sum_{t >= end} t^-(1+2a) <= int_{end-1}^inf = (end - 1)^-2a / (2a)
            head = np.arange(t0, end, dtype=float) ** -(0.5 + a)
            self.c = filter_scale(params.epsilon, params.delta, head, (end - 1) ** (-2 * a) / (2 * a))
            return
        self.rho = gaussian.zcdp_rho(params.epsilon, params.delta)
        tail = t0 ** -(1 + 2 * a) + t0 ** (-2 * a) / (2 * a)  # >= sum_{t >= t0} t^-(1+2a)
        self.c = math.sqrt(2.0 * self.rho / tail)

    def epsilon_of(self, t: int) -> float:
        """epsilon_t = c t^-(1/2 + a) of the run at t blocks.

        Args:
            t: the block count of the run.
        """
        return self.c * t ** -(0.5 + self.params.a)

    def delta_of(self, t: int) -> float:
        """delta_t of the run at t blocks: (delta / 2) (6 / pi^2) / (t - t0 + 1)^2 for approximate runs (summing to
        delta / 2 over t >= t0), else 0.

        Args:
            t: the block count of the run.
        """
        if not self.approximate or t < self.params.t0:
            return 0.0
        return self.params.delta * ZCDP_SHARE * 6.0 / math.pi**2 / (t - self.params.t0 + 1) ** 2

    def run_at(self, t: int) -> tuple[int, float] | None:
        """(run index t, epsilon_t) of the run made at t blocks, None before t0.

        Args:
            t: the block count reached.
        """
        return (t, self.epsilon_of(t)) if t >= self.params.t0 else None

    def epoch_start(self, i: int) -> int:
        """The block count of run i: t0 + i.

        Args:
            i: the run index.
        """
        return self.params.t0 + i

    def run_budget(self, t: int) -> tuple[int, float, float] | None:
        """(run index t - t0, epsilon_t, delta_t) of the run at t blocks, None before t0.

        Args:
            t: the block count of the run.
        """
        return (t - self.params.t0, self.epsilon_of(t), self.delta_of(t)) if t >= self.params.t0 else None

    @property
    def draw_composition(self) -> str | None:
        """The ledger's draw rule for this schedule's runs over a pipeline (``sage_tfx.privacy.draws``): "zcdp"
        for approximate runs, None for pure runs (no pipeline runs under them)."""
        return Composition.ZCDP if self.approximate else None

    def total_loss(self, horizon: int) -> float:
        """A record's worst-case rho over runs up to ``horizon`` blocks.

        Args:
            horizon: the last block count counted.
        """
        return sum(self.epsilon_of(t) ** 2 / 2 for t in range(self.params.t0, horizon + 1))

    @property
    def meta(self) -> dict:
        return {"strategy": "bbimprover", **asdict(self.params), **({"approximate": True} if self.approximate else {})}
