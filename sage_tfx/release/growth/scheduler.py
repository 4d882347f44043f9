"""BBScheduler (Cummings et al. 2018, Algorithm 1): re-run when the database has grown by (1 + gamma)
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
class SchedulerParams:
    """BBScheduler: total per-record (epsilon, delta); growth factor 1 + gamma; first run at t0 blocks.

    Args:
        epsilon: the total per-record epsilon.
        delta: the total per-record delta (0: pure epsilon-DP).
        gamma: the growth factor - 1: a run each time the data grew by 1 + gamma.
        t0: the block count of the first run.
        composition: None (pure if delta = 0, zCDP otherwise), "zcdp" or "basic" ((epsilon_i, delta_i) runs).
    """

    epsilon: float
    delta: float = 0.0
    gamma: float = 0.5
    t0: int = 1
    composition: str | None = None  # None: pure if delta = 0, zCDP otherwise; "basic": (eps_i, delta_i) runs

    def __post_init__(self):
        _positive("epsilon", self.epsilon, "give the total per-record epsilon > 0")
        if not (isinstance(self.delta, (int, float)) and 0 <= self.delta < 1):
            raise GrowthError(f"delta {self.delta!r} is invalid: give 0 <= delta < 1 (0 = pure epsilon-DP)")
        _positive("gamma", self.gamma, "give the growth factor gamma > 0 (re-run at size t0 (1 + gamma)^i)")
        _int_at_least("t0", self.t0, 1, "give the first run's block count t0 >= 1")
        if self.composition not in (None, Composition.BASIC, Composition.ZCDP):
            raise GrowthError(
                f"composition {self.composition!r} is invalid: give None (pure if delta = 0, zCDP "
                "otherwise), 'zcdp' (needs delta > 0) or 'basic' ((epsilon_i, delta_i) runs)"
            )
        if self.composition == Composition.ZCDP and self.delta == 0:
            raise GrowthError("composition 'zcdp' needs delta > 0: give delta, or composition None for pure DP")

    @property
    def mode(self) -> Composition:
        if self.composition == Composition.BASIC:
            return Composition.BASIC
        return Composition.ZCDP if self.delta > 0 else Composition.PURE


class BBScheduler:
    """Re-run times and per-run epsilons of BBScheduler (the paper's Section 3.1, Algorithm 1, Theorem 10).

    Privacy: every record is (epsilon, delta)-DP over the infinite sequence of runs (docs/release_strategies.md: pure mode
    sum_i epsilon_i = epsilon, Theorem 3; zCDP mode sum_i epsilon_i^2 / 2 = rho, Theorem 4; basic mode
    sum_i epsilon_i = epsilon and sum_i delta_i = delta, Theorem 3). ``approximate=True`` (zCDP mode only): runs
    of (epsilon_i, delta_i), drawn by the ledger's "zcdp" rule (docs/release_strategies.md, "Approximate runs").

    Args:
        params: the checked SchedulerParams.
        approximate: runs of (epsilon_i, delta_i) drawn by the ledger's "zcdp" rule (zCDP mode only).
    """

    def __init__(self, params: SchedulerParams, *, approximate: bool = False):
        if not isinstance(params, SchedulerParams):
            raise GrowthError(f"params {params!r} must be a SchedulerParams")
        if approximate and params.mode is not Composition.ZCDP:
            raise GrowthError(
                f"approximate runs need composition 'zcdp' and delta > 0, not composition "
                f"{params.composition!r} with delta {params.delta!r}"
            )
        self.params, self.approximate = params, bool(approximate)
        self.rho = (
            gaussian.zcdp_rho(params.epsilon, params.delta)
            if params.mode is Composition.ZCDP and not approximate
            else None
        )
        self.c = None
        if self.approximate:
            r, n = 1.0 / (1.0 + params.gamma), 400
            self.c = filter_scale(params.epsilon, params.delta, r ** np.arange(n), r ** (2 * n) / (1.0 - r * r))

    def epoch_start(self, i: int) -> int:
        """The first block count at which epoch i's run is made: ceil(t0 (1 + gamma)^i).

        Args:
            i: the epoch.
        """
        return int(math.ceil(self.params.t0 * (1.0 + self.params.gamma) ** i - 1e-9))

    def epsilon_of(self, i: int) -> float:
        """epsilon_i of epoch i's run (pure / basic: epsilon gamma / (1 + gamma)^(i + 1); zCDP: its geometric share of rho).

        Args:
            i: the epoch.
        """
        g = self.params.gamma
        if self.params.mode is not Composition.ZCDP:
            return self.params.epsilon * g / (1.0 + g) ** (i + 1)
        r = 1.0 / (1.0 + g)
        if self.approximate:
            return self.c * r**i
        return math.sqrt(2.0 * self.rho * (1.0 - r * r)) * r**i

    def delta_of(self, i: int) -> float:
        """delta_i of epoch i's run: delta gamma / (1 + gamma)^(i + 1) in basic mode, (delta / 2) gamma /
        (1 + gamma)^(i + 1) for approximate runs (docs/release_strategies.md), else 0 (pure runs).

        Args:
            i: the epoch.
        """
        g = self.params.gamma
        if self.approximate:
            return self.params.delta * ZCDP_SHARE * g / (1.0 + g) ** (i + 1)
        if self.params.mode is not Composition.BASIC:
            return 0.0
        return self.params.delta * g / (1.0 + g) ** (i + 1)

    def run_budget(self, t: int) -> tuple[int, float, float] | None:
        """(epoch, epsilon_i, delta_i) of the run made at t blocks (None if none); several epochs passed at once
        are one run at their summed epsilon (zCDP: summed squares) and summed delta -- no more than running each.

        Args:
            t: the block count of the run.
        """
        plan = self.run_at(t)
        if plan is None:
            return None
        first = 0 if self._epoch(t - 1) is None else self._epoch(t - 1) + 1
        return plan[0], plan[1], sum(self.delta_of(i) for i in range(first, plan[0] + 1))

    def total_delta(self, horizon: int) -> float:
        """A record's worst-case delta over the runs up to ``horizon`` blocks (basic mode; 0 otherwise).

        Args:
            horizon: the last block count counted.
        """
        return sum(r[2] for r in (self.run_budget(t) for t in range(1, horizon + 1)) if r)

    def run_at(self, t: int) -> tuple[int, float] | None:
        """(epoch, epsilon) of the run made when the database reaches t blocks, None if no run then.

        Args:
            t: the block count reached.
        """
        if t < self.params.t0:
            return None
        e_now, e_before = self._epoch(t), self._epoch(t - 1)
        if e_before is not None and e_now == e_before:
            return None  # no epoch threshold was passed by this arrival
        first = 0 if e_before is None else e_before + 1
        eps = [self.epsilon_of(i) for i in range(first, e_now + 1)]
        if self.params.mode is not Composition.ZCDP:  # one run at the epochs' summed epsilon (basic composition)
            return e_now, sum(eps)
        return e_now, math.sqrt(sum(e * e for e in eps))  # zCDP: the epochs' rhos add up

    def _epoch(self, t: int) -> int | None:
        """The largest epoch i with epoch_start(i) <= t (None if t < t0)."""
        if t < self.params.t0:
            return None
        i = max(0, int(math.floor(math.log(t / self.params.t0) / math.log1p(self.params.gamma))) - 1)
        while self.epoch_start(i + 1) <= t:
            i += 1
        return i

    def total_loss(self, horizon: int) -> float:
        """A record's worst-case loss (epsilon in pure / basic mode, rho in zCDP mode) over runs up to ``horizon``
        blocks.

        Args:
            horizon: the last block count counted.
        """
        runs = [self.run_at(t) for t in range(1, horizon + 1)]
        eps = [r[1] for r in runs if r]
        return sum(eps) if self.params.mode is not Composition.ZCDP else sum(e * e / 2 for e in eps)

    @property
    def draw_composition(self) -> str | None:
        """The ledger's draw rule for this schedule's runs over a pipeline (``sage_tfx.privacy.draws``): "basic"
        in basic mode, "zcdp" for approximate runs, None for pure runs (no pipeline runs under them)."""
        if self.approximate:
            return Composition.ZCDP
        return Composition.BASIC if self.params.mode is Composition.BASIC else None

    @property
    def meta(self) -> dict:
        return {"strategy": "bbscheduler", **asdict(self.params), **({"approximate": True} if self.approximate else {})}
