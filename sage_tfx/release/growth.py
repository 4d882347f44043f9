"""Release on a growing database: BBScheduler, BBImprover and PMWG (Cummings et al., "Differential privacy for
growing databases", NeurIPS 2018; the paper seed 001). numpy only, no TensorFlow.

Size unit: the database grows by ledger blocks; its size is counted in blocks t = 1, 2, ... and its public record
count n_t is the sum of the blocks' DECLARED row counts: a number the caller fixes independently of the data (a
design block size, as ``m0`` in ``release.continual``), NEVER the ledger's exact count (``Ledger.private_row_count``
is trusted-only: docs/growing_database.md, "what a pipeline learns about its data size"). So every normalisation
below uses a public number (add/remove neighbours: a record changes a sum of values in [0, B] by at most B, so a
sum divided by the public n_t has sensitivity B / n_t, whatever the block really holds).

Schedules (Section 3 of the paper). A black box ``mechanism(data, epsilon, rng)`` must be epsilon-DP (pure) on
its input for every epsilon > 0.
- ``BBScheduler`` (Section 3.1, Algorithm 1, Theorem 10): re-run when the database has grown by a factor
  (1 + gamma): epoch i starts at the first block count t >= t0 (1 + gamma)^i. Pure mode (delta = 0):
  epsilon_i = epsilon * gamma / (1 + gamma)^(i + 1), so sum_i epsilon_i = epsilon (geometric series) and by basic
  composition (Theorem 3) every record, which can at worst be read by every run, is epsilon-DP over the infinite
  horizon. zCDP mode (delta > 0; Theorem 4, the paper's CDP composition): rho = 1 / (2 z^2) with z the Gaussian
  multiplier calibrated by dp-accounting's RDP accountant to (epsilon, delta); epsilon_i = sqrt(2 rho (1 - r^2))
  r^i, r = 1 / (1 + gamma); an epsilon_i-DP run is epsilon_i^2 / 2-zCDP, the sum is rho (1 - r^2) sum r^(2i) =
  rho, and rho-zCDP has the same RDP curve (alpha rho) as the calibrated Gaussian, so the accountant's
  conversion gives (epsilon, delta)-DP. Accuracy: n_i epsilon_i ~ t0 (1+gamma)^i r^i = t0 stays constant in both modes, so an error ~ 1/(n eps)
  is held, as in Theorem 10, plus the mid-epoch staleness of Lemma 11 (at most a factor (1 + gamma) of growth).
  Basic (eps, delta) mode (``composition="basic"``, delta >= 0; Theorem 3 for (epsilon, delta) black boxes):
  run i is (epsilon_i, delta_i)-DP with epsilon_i = epsilon gamma / (1 + gamma)^(i + 1) and delta_i = delta
  gamma / (1 + gamma)^(i + 1): both shrink geometrically, so sum_i epsilon_i = epsilon and sum_i delta_i = delta
  and basic composition gives (epsilon, delta)-DP over the infinite horizon (the black box is called with
  ``delta=delta_i``; ``clipped_mean`` then adds grid Gaussian noise calibrated by dp-accounting).
  When several epoch thresholds are passed by one block arrival, one run is made with their summed epsilon (pure)
  or summed rho (zCDP): the same privacy as running each, so the totals above are unchanged.
- ``BBImprover`` (Section 3.2, Algorithm 2, Theorem 13): re-run at every block count t >= t0 with
  epsilon_t = c t^-(1/2 + a) (a > 0), zCDP mode only (the series of squares converges; the series of epsilon_t
  does not): rho_total = c^2 / 2 sum_{t >= t0} t^-(1 + 2a) <= c^2 / 2 (t0^-(1+2a) + t0^-2a / (2a)) (integral
  bound), and c is set so this bound equals rho; then as above. Accuracy ~ 1/(n_t epsilon_t) ~ t^-(1/2 - a): it
  improves as the database grows.

Approximate runs (``approximate=True``: BBScheduler's zcdp mode and BBImprover over a TFX pipeline, whose runs are
(epsilon_i, delta_i)-DP, not pure; ``release.scheduled_pipeline``). Each run is delta_i-approximately
(epsilon_i^2 / 2)-zCDP (Bun & Steinke 2016, Section 8 and Prop. 3.3), and the ledger draws every run from the
per-block lifetime grants under the "zcdp" rule of ``sage_tfx.privacy.draws``: the runs' deltas sum to at most
delta / 2, and the RDP filter of (epsilon, delta) admits sum_i min(epsilon_i, alpha epsilon_i^2 / 2) at some order
alpha of ``curves.DEFAULT_ORDERS`` with the conversion term at delta / 2. So here: delta_i = (delta / 2) (1 - r)
r^i (BBScheduler, r = 1 / (1 + gamma)) or (delta / 2) (6 / pi^2) / (t - t0 + 1)^2 (BBImprover), each summing to
delta / 2 over the infinite horizon; and epsilon_i = c w_i (w_i = r^i, or t^-(1/2 + a)) with c the largest scale
for which some order's bound on the INFINITE sum, sum_{i < N} min(c w_i, alpha c^2 w_i^2 / 2) + alpha c^2 / 2
sum_{i >= N} w_i^2 (the tail of squares in closed form: r^(2N) / (1 - r^2), or the integral bound N'^-2a / (2a)),
plus conversion_term(alpha, delta / 2), is at most epsilon (``filter_scale``, bisection; times (1 - 1e-9) for
float round-off). Then every prefix of the run sequence is admitted by the ledger, forever; and the bound is
tight (the head is exact, the tail's integral bound is within a term of the sum), so a 10% larger c is refused
at a finite run (tests/release/test_scheduled_pipeline.py). Several epochs merged into one run (BBScheduler) cost
min(sqrt(S), alpha S / 2) <= the sum of their own costs (S the sum of their squares), so the calibration holds.

Charging (docs/growing_database.md): every arriving block gets ONE grant charging the whole
(epsilon, delta) its records can ever lose under the schedule, BEFORE it is read; each run re-opens the release of
the grant of every block it reads with the schedule instance's fingerprint bound to that block's registered content
(``privacy.digests.bound_to_data``; same computation: counted once; other data: another computation, refused).

``PMWG`` (Section 4, Algorithm 3): private multiplicative weights on a growing database for a stream of linear
queries over a declared finite universe X (``Universe``: per-column bin edges). Its public histogram is updated on
arrival (the new records are assumed uniform: x~ <- (n_old x~ + m u) / (n_old + m)) and by multiplicative weights
on hard queries; hardness is decided by the sparse vector technique (AboveThreshold, Dwork & Roth Alg. 1) whose
noise is scaled to the CURRENT sensitivity 1 / n (n the public declared record count), so the error shrinks as
the database grows.

Hard-query budget growing with n (the paper's Lemma 15, Corollary 16, Theorem 18). The uniform arrival update
raises the relative entropy D(x || x~) between the database and the public histogram by at most log|X| / (n + 1)
per arriving record: by joint convexity of D, D(x' || x~') <= n/(n+1) D(x || x~) + 1/(n+1) D(e_j || u)
and D(e_j || u) = log|X| (Lemma 15). Each hard query lowers it by a constant (static PMW), so the number of hard
queries by size n is at most the static budget k plus k sum_{tau = n0+1..n} 1/tau <= k (1 + ln(n / n0))
(Corollary 16; k = 4 log|X| / alpha^2 in the paper, ``hard_budget`` here, n0 the declared count after the first
block). PMWG ENFORCES h(n) = floor(k (1 + ln(n / n0))): a new AboveThreshold round opens only while
hard_used < h(n); otherwise the query is answered from the public histogram alone (no privacy cost).
Per-round epsilon (the paper's noise function that falls with n, Algorithm 3 / Theorem 18): a round opened at
size n gets eps_r(n) = c min(1, (n0 / n)^p) (p = ``growth_exponent`` in (0, 1]), split eps_1 = eps_2 = eps_r / 2:
threshold noise Laplace(2 D / eps_1), query noise Laplace(4 D / eps_1) (AboveThreshold, eps_1-DP for a round that
halts at its first hard query; D = 1 / n at the round's start bounds the sensitivity of every later query of
the round since n only grows), and the hard query's answer Laplace((1 / n) / eps_2). The noise scale is
D / eps_r ~ n^(p - 1) / (c n0^p): the answers get more accurate as the database grows (for p < 1).
Privacy proof sketch (pure, add/remove one record; Theorem 18's argument with our constants): round i (i = 1,
2, ...) can only open at a size n_i with i <= h(n_i), i.e. n_i >= n0 exp(i/k - 1), and eps_r is non-increasing in
n, so the worst case is every round opening as early as the budget allows: rounds i <= k cost at most c each and
round k + j costs at most c exp(-p j / k). Basic composition over all rounds, however many queries are asked
and however long the stream grows: total <= c (k + sum_{j >= 1} exp(-p j / k)) = c (k + 1 / (exp(p / k) - 1)),
and c = epsilon / (k + 1 / (exp(p / k) - 1)) makes it epsilon. The arrival and MW updates use only public numbers
and released answers (post-processing). So every record is epsilon-DP over the infinite query stream, charged
epsilon per block, once. ``PMWG.epsilon_spent_bound`` sums the rounds actually opened (<= epsilon; tested).
Noise: ``sage_tfx.privacy.samplers.grid_laplace`` (exact discrete Laplace on a grid, keyed by the grant's seed;
docs/noise.md).
"""
from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from sage_tfx.privacy import checks, gaussian
from sage_tfx.privacy.digests import bound_to_data
from sage_tfx.privacy.draws import ZCDP_RUN_DELTA_SHARE as ZCDP_SHARE
from sage_tfx.privacy.draws import zcdp_filter
from sage_tfx.privacy.errors import LedgerError, SageError
from sage_tfx.privacy.randomness import as_secure_rng
from sage_tfx.privacy.samplers import grid_gaussian_sum, grid_laplace, grid_laplace_sum
from sage_tfx.privacy.split import per_row_budget
from sage_tfx.privacy.streams import require_row_unit
from sage_tfx.privacy.vocabulary import Composition, Stage

STAGE = Stage.TRAINING  # a released statistic is the grant's one release


class GrowthError(SageError, ValueError):
    """Bad parameters or input for a growth schedule / PMWG (raised before anything is charged)."""


def _positive(name: str, value, fix: str) -> float:
    fix = fix.replace("{", "{{").replace("}", "}}")  # a literal in the message template
    return checks.positive(value, name, error=GrowthError, message="{what} {value!r} is invalid: " + fix)


def _int_at_least(name: str, value, low: int, fix: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise GrowthError(f"{name} {value!r} is invalid: {fix}")
    return int(value)


@dataclass(frozen=True)
class SchedulerParams:
    """BBScheduler: total per-record (epsilon, delta); growth factor 1 + gamma; first run at t0 blocks."""

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
            raise GrowthError(f"composition {self.composition!r} is invalid: give None (pure if delta = 0, zCDP "
                              "otherwise), 'zcdp' (needs delta > 0) or 'basic' ((epsilon_i, delta_i) runs)")
        if self.composition == Composition.ZCDP and self.delta == 0:
            raise GrowthError("composition 'zcdp' needs delta > 0: give delta, or composition None for pure DP")

    @property
    def mode(self) -> Composition:
        if self.composition == Composition.BASIC:
            return Composition.BASIC
        return Composition.ZCDP if self.delta > 0 else Composition.PURE


@dataclass(frozen=True)
class ImproverParams:
    """BBImprover: total per-record (epsilon, delta > 0); exponent a in (0, 1/2); first run at t0 blocks."""

    epsilon: float
    delta: float
    a: float = 0.1
    t0: int = 1

    def __post_init__(self):
        _positive("epsilon", self.epsilon, "give the total per-record epsilon > 0")
        if not (isinstance(self.delta, (int, float)) and 0 < self.delta < 1):
            raise GrowthError(f"delta {self.delta!r} is invalid: BBImprover composes infinitely many runs under "
                              "zCDP, give 0 < delta < 1 (use BBScheduler for pure epsilon-DP)")
        if not (isinstance(self.a, (int, float)) and 0 < self.a < 0.5):
            raise GrowthError(f"a {self.a!r} is invalid: give 0 < a < 1/2 (epsilon_t ~ t^-(1/2 + a))")
        _int_at_least("t0", self.t0, 1, "give the first run's block count t0 >= 1")


def filter_scale(epsilon: float, delta: float, head: np.ndarray, tail_squares: float) -> float:
    """The largest c (times 1 - 1e-9) such that runs epsilon_i = c w_i, w = ``head`` followed by weights whose
    squares sum to at most ``tail_squares``, stay admitted by the ledger's "zcdp" draw rule on a lifetime grant of
    (epsilon, delta) over the infinite horizon: some order alpha of ``curves.DEFAULT_ORDERS`` has
    sum_i min(c w_i, alpha c^2 w_i^2 / 2) <= epsilon - conversion_term(alpha, delta / 2) (module docstring)."""
    head = np.asarray(head, dtype=float)
    best = 0.0
    try:
        filt = zcdp_filter(epsilon, delta)
    except LedgerError:  # no order has any budget once delta / 2 converts: refused below
        filt = None
    for alpha, term in ([] if filt is None else zip(filt.orders, filt.terms)):
        budget = epsilon - term
        if budget <= 0:
            continue

        def cost(c: float) -> float:
            return float(np.minimum(c * head, alpha * c * c * head * head / 2).sum()) + alpha * c * c * tail_squares / 2  # noqa: B023

        low, high = 0.0, 1.0
        while cost(high) <= budget:
            low, high = high, 2.0 * high
        for _ in range(200):
            mid = (low + high) / 2
            low, high = (mid, high) if cost(mid) <= budget else (low, mid)
        best = max(best, low)
    if best <= 0:
        raise GrowthError(f"(epsilon {epsilon!r}, delta {delta!r}) leaves no Renyi budget at any order once delta / 2 "
                          "converts it: raise epsilon or delta")
    return best * (1.0 - 1e-9)


class BBScheduler:
    """Re-run times and per-run epsilons of BBScheduler (the paper's Section 3.1, Algorithm 1, Theorem 10).

    Privacy: every record is (epsilon, delta)-DP over the infinite sequence of runs (module docstring: pure mode
    sum_i epsilon_i = epsilon, Theorem 3; zCDP mode sum_i epsilon_i^2 / 2 = rho, Theorem 4; basic mode
    sum_i epsilon_i = epsilon and sum_i delta_i = delta, Theorem 3). ``approximate=True`` (zCDP mode only): runs
    of (epsilon_i, delta_i), drawn by the ledger's "zcdp" rule (module docstring, "Approximate runs").
    """

    def __init__(self, params: SchedulerParams, *, approximate: bool = False):
        if not isinstance(params, SchedulerParams):
            raise GrowthError(f"params {params!r} must be a SchedulerParams")
        if approximate and params.mode is not Composition.ZCDP:
            raise GrowthError(f"approximate runs need composition 'zcdp' and delta > 0, not composition "
                              f"{params.composition!r} with delta {params.delta!r}")
        self.params, self.approximate = params, bool(approximate)
        self.rho = gaussian.zcdp_rho(params.epsilon, params.delta) if params.mode is Composition.ZCDP and not approximate else None
        self.c = None
        if self.approximate:
            r, n = 1.0 / (1.0 + params.gamma), 400
            self.c = filter_scale(params.epsilon, params.delta, r ** np.arange(n), r ** (2 * n) / (1.0 - r * r))

    def epoch_start(self, i: int) -> int:
        """The first block count at which epoch i's run is made: ceil(t0 (1 + gamma)^i)."""
        return int(math.ceil(self.params.t0 * (1.0 + self.params.gamma) ** i - 1e-9))

    def epsilon_of(self, i: int) -> float:
        g = self.params.gamma
        if self.params.mode is not Composition.ZCDP:
            return self.params.epsilon * g / (1.0 + g) ** (i + 1)
        r = 1.0 / (1.0 + g)
        if self.approximate:
            return self.c * r ** i
        return math.sqrt(2.0 * self.rho * (1.0 - r * r)) * r ** i

    def delta_of(self, i: int) -> float:
        """delta_i of epoch i's run: delta gamma / (1 + gamma)^(i + 1) in basic mode, (delta / 2) gamma /
        (1 + gamma)^(i + 1) for approximate runs (module docstring), else 0 (pure runs)."""
        g = self.params.gamma
        if self.approximate:
            return self.params.delta * ZCDP_SHARE * g / (1.0 + g) ** (i + 1)
        if self.params.mode is not Composition.BASIC:
            return 0.0
        return self.params.delta * g / (1.0 + g) ** (i + 1)

    def run_budget(self, t: int) -> tuple[int, float, float] | None:
        """(epoch, epsilon_i, delta_i) of the run made at t blocks (None if none); several epochs passed at once
        are one run at their summed epsilon (zCDP: summed squares) and summed delta -- no more than running each."""
        plan = self.run_at(t)
        if plan is None:
            return None
        first = 0 if self._epoch(t - 1) is None else self._epoch(t - 1) + 1
        return plan[0], plan[1], sum(self.delta_of(i) for i in range(first, plan[0] + 1))

    def total_delta(self, horizon: int) -> float:
        """A record's worst-case delta over the runs up to ``horizon`` blocks (basic mode; 0 otherwise)."""
        return sum(r[2] for r in (self.run_budget(t) for t in range(1, horizon + 1)) if r)

    def run_at(self, t: int) -> tuple[int, float] | None:
        """(epoch, epsilon) of the run made when the database reaches t blocks, None if no run then."""
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
        blocks."""
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


class BBImprover:
    """Run at every block count t >= t0 with epsilon_t = c t^-(1/2 + a) (the paper's Section 3.2, Theorem 13).

    Privacy: (epsilon, delta)-DP per record over the infinite horizon (zCDP: sum_t epsilon_t^2 / 2 <= rho by the
    integral bound in the module docstring; Theorem 4). ``approximate=True``: runs of (epsilon_t, delta_t), drawn
    by the ledger's "zcdp" rule, c calibrated to its RDP filter (module docstring, "Approximate runs"). Run index
    (epoch) of the run at t blocks: t - t0.
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
        return self.c * t ** -(0.5 + self.params.a)

    def delta_of(self, t: int) -> float:
        """delta_t of the run at t blocks: (delta / 2) (6 / pi^2) / (t - t0 + 1)^2 for approximate runs (summing to
        delta / 2 over t >= t0), else 0."""
        if not self.approximate or t < self.params.t0:
            return 0.0
        return self.params.delta * ZCDP_SHARE * 6.0 / math.pi ** 2 / (t - self.params.t0 + 1) ** 2

    def run_at(self, t: int) -> tuple[int, float] | None:
        return (t, self.epsilon_of(t)) if t >= self.params.t0 else None

    def epoch_start(self, i: int) -> int:
        """The block count of run i: t0 + i."""
        return self.params.t0 + i

    def run_budget(self, t: int) -> tuple[int, float, float] | None:
        """(run index t - t0, epsilon_t, delta_t) of the run at t blocks, None before t0."""
        return (t - self.params.t0, self.epsilon_of(t), self.delta_of(t)) if t >= self.params.t0 else None

    @property
    def draw_composition(self) -> str | None:
        """The ledger's draw rule for this schedule's runs over a pipeline (``sage_tfx.privacy.draws``): "zcdp"
        for approximate runs, None for pure runs (no pipeline runs under them)."""
        return Composition.ZCDP if self.approximate else None

    def total_loss(self, horizon: int) -> float:
        """A record's worst-case rho over runs up to ``horizon`` blocks."""
        return sum(self.epsilon_of(t) ** 2 / 2 for t in range(self.params.t0, horizon + 1))

    @property
    def meta(self) -> dict:
        return {"strategy": "bbimprover", **asdict(self.params), **({"approximate": True} if self.approximate else {})}


def clipped_mean(bound: float, rows_per_block: int) -> Mechanism:
    """A black box for ``ScheduledRelease``: the epsilon-DP mean of values clipped to [0, bound].

    Input: one 1-D array of values per block read. Output: sum_i clip(v_i, 0, bound) / n + noise, with
    n = blocks * ``rows_per_block`` the PUBLIC declared record count (never the data's own count).
    Sensitivity (add/remove one record): the clipped sum moves by at most ``bound`` and n is public, so the
    output moves by at most bound / n. Noise: ``samplers.grid_laplace_sum`` (the records' shares summed exactly
    on the grid) at that sensitivity and the run's
    epsilon, so each run is (epsilon, 0)-DP exactly (docs/noise.md), as the schedules' analysis needs of its
    black box (the paper's Section 3: an epsilon-DP static algorithm). Called with ``delta > 0`` (a basic-mode
    BBScheduler run), it adds ``samplers.grid_gaussian_sum`` noise of sigma = z bound / n instead, z the Gaussian
    multiplier dp-accounting's RDP accountant calibrates to (epsilon, delta) (``gaussian.rdp_multiplier``):
    the grid release keeps the continuous Gaussian's rho-zCDP, hence its RDP curve and (epsilon, delta)."""
    bound = _positive("bound", bound, "give the column's public upper bound B > 0 (values are clipped to [0, B])")
    m = _int_at_least("rows_per_block", rows_per_block, 1, "give the declared (public) rows per block >= 1")

    def mechanism(blocks: list, epsilon: float, rng, delta: float = 0.0) -> float:
        n = m * len(blocks)
        # each record's share of the mean, v / n <= bound / n (float division is monotone), summed exactly on the
        # grid by the release (never a float64 sum first: its rounding would depend on the other records)
        shares = np.concatenate([np.clip(np.asarray(b, dtype=float).ravel(), 0.0, bound) for b in blocks]) / n
        if delta > 0:  # (epsilon, delta)-DP: the Gaussian multiplier z calibrated by dp-accounting (RDP)
            sigma = gaussian.rdp_multiplier(epsilon, delta) * bound / n
            return float(grid_gaussian_sum(shares, bound / n, sigma, rng=rng)[0])
        return float(grid_laplace_sum(shares, bound / n, epsilon, rng=rng)[0])

    return mechanism


def schedule_fingerprint(pipeline: str, stream: str, meta: dict) -> str:
    """The release fingerprint of a schedule instance: SHA-256 of its pipeline, stream and meta (public)."""
    text = json.dumps({"pipeline": pipeline, "stream": stream, **meta}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def charge_lifetime(ledger, stream: str, pipeline: str, block: str, epsilon: float, delta: float, meta: dict,
                    fingerprint: str, *, reads: bool = False):
    """A block's lifetime grant under a schedule: ONE grant charging ``block`` alone the whole (epsilon, delta)
    its records can ever lose under the schedule, BEFORE it is read, and its one release opened (or re-opened)
    with the schedule's ``fingerprint``, so nothing but the schedule's runs ever spends it (docs/growing_database.md).
    ``reads``: the caller reads the block under this grant itself (``ScheduledRelease``), so the release's
    fingerprint is bound to the block's registered content (``bound_to_data``). Without it the grant is only drawn
    from (``ScheduledPipeline``): the draw check wants the bare schedule fingerprint, and each run grant's
    components bind their releases to the run grant's records. Returns the Grant."""
    if reads:  # the caller's mechanisms take the schedule's epsilon, calibrated to one row
        require_row_unit(ledger, stream, "a scheduled release reading its blocks")
    grant = ledger.request(pipeline, stream, blocks=[block], epsilon=epsilon, delta=delta, meta=meta)
    # the schedule's one release, at what the grant hands a stage (per row on a unit stream; the run grants drawn
    # from it hand their stages the per-row budget of their own share)
    ledger.release(grant, STAGE, bound_to_data(fingerprint, ledger, grant) if reads else fingerprint,
                   *per_row_budget(epsilon, delta, ledger.stream(stream).unit_rows))
    return grant


Schedule = Any  # BBScheduler | BBImprover
Mechanism = Callable[[list, float, Any], Any]  # (blocks' data, epsilon, rng) -> output; must be epsilon-DP
Reader = Callable[[object], Any]  # grant -> the data of its (single) block


@dataclass
class Run:
    t: int
    epoch: int
    epsilon: float
    blocks: list
    output: Any
    delta: float = 0.0  # the run's own delta_i (basic mode; 0 for pure runs)


class ScheduleIdentity:
    """The public identity of a schedule instance on a pipeline and stream: its ``meta`` (the schedule's
    parameters and the mechanism's name, signed into every lifetime grant) and its release ``fingerprint``.
    Needs ``schedule``, ``name``, ``pipeline`` and ``stream`` attributes."""

    @property
    def meta(self) -> dict:
        return {**self.schedule.meta, "mechanism": self.name}

    @property
    def fingerprint(self) -> str:
        return schedule_fingerprint(self.pipeline, self.stream, self.meta)


class ScheduledRelease(ScheduleIdentity):
    """Runs an epsilon-DP static ``mechanism`` under a schedule (BBScheduler or BBImprover) against the ledger.

    ``observe(block)``: charges the block's grant (the schedule's whole per-record (epsilon, delta)), reads it
    under that grant, and, if the schedule runs at this block count, runs ``mechanism(list of all blocks' data,
    epsilon_i, rng)`` (a basic-mode BBScheduler: ``mechanism(..., delta=delta_i)``, which must then be
    (epsilon_i, delta_i)-DP) after re-opening every read block's release with this instance's fingerprint. The
    mechanism's output is public; it is answered from until the next run. Privacy: as the schedule's.
    """

    def __init__(self, ledger, stream: str, pipeline: str, schedule: Schedule, mechanism: Mechanism,
                 reader: Reader, *, name: str = "mechanism"):
        if not isinstance(schedule, (BBScheduler, BBImprover)):
            raise GrowthError(f"schedule {schedule!r} must be a BBScheduler or BBImprover")
        if not callable(mechanism) or not callable(reader):
            raise GrowthError("mechanism and reader must be callables (data, epsilon, rng) and (grant)")
        require_row_unit(ledger, stream, type(self).__name__)
        self.ledger, self.stream, self.pipeline = ledger, stream, pipeline
        self.schedule, self.mechanism, self.reader, self.name = schedule, mechanism, reader, name
        self.epsilon, self.delta = schedule.params.epsilon, schedule.params.delta
        self.grants: dict[str, object] = {}
        self.order: list[str] = []
        self.data: dict[str, Any] = {}
        self.runs: list[Run] = []
        self.reads: list[tuple[str, str]] = []
        self.current: Any = None

    def observe(self, block: str) -> Run | None:
        if block in self.grants:
            raise GrowthError(f"block {block!r} was already observed: give each block once, in order")
        grant = charge_lifetime(self.ledger, self.stream, self.pipeline, block, self.epsilon, self.delta,
                                self.meta, self.fingerprint, reads=True)
        self.grants[block] = grant
        self.order.append(block)
        self.data[block] = self.reader(grant)
        self.reads.append((block, grant.id))
        t = len(self.order)
        plan = self.schedule.run_at(t)
        if plan is None:
            return None
        epoch, eps = plan
        basic = isinstance(self.schedule, BBScheduler) and self.schedule.params.mode is Composition.BASIC
        delta_i = self.schedule.run_budget(t)[2] if basic else 0.0
        for b in self.order:  # re-open (same computation): nothing counted twice
            self.ledger.release(self.grants[b], STAGE, bound_to_data(self.fingerprint, self.ledger, self.grants[b]),
                                self.epsilon, self.delta)
        rng = as_secure_rng(self.ledger.private_seed(self.grants[self.order[0]].id, f"{self.name}/run/{t}"))
        data = [self.data[b] for b in self.order]
        out = self.mechanism(data, eps, rng, delta=delta_i) if basic else self.mechanism(data, eps, rng)
        run = Run(t, epoch, eps, list(self.order), out, delta_i)
        self.runs.append(run)
        self.current = out
        return run


# ------------------------------------------------------------------ PMWG

@dataclass(frozen=True)
class Universe:
    """A declared finite discretisation: for each column, bin edges (values are clipped into the outer bins)."""

    columns: tuple
    edges: tuple  # one increasing sequence of edges per column

    def __post_init__(self):
        if len(self.columns) == 0 or len(self.columns) != len(self.edges):
            raise GrowthError(f"columns {self.columns!r} and edges must be non-empty and of the same length")
        for c, e in zip(self.columns, self.edges):
            e = np.asarray(e, dtype=float)
            if e.ndim != 1 or len(e) < 2 or not np.all(np.diff(e) > 0) or not np.isfinite(e).all():
                raise GrowthError(f"edges of column {c!r} are invalid: give >= 2 finite increasing edges")

    @property
    def shape(self) -> tuple:
        return tuple(len(e) - 1 for e in self.edges)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape))

    def cells(self, rows: np.ndarray) -> np.ndarray:
        """Flat cell index of each row (rows: (n, len(columns)) array)."""
        rows = np.asarray(rows, dtype=float)
        if rows.ndim != 2 or rows.shape[1] != len(self.columns):
            raise GrowthError(f"rows of shape {rows.shape} do not match the universe's {len(self.columns)} columns")
        idx = [np.clip(np.searchsorted(np.asarray(e), rows[:, k], side="right") - 1, 0, len(e) - 2)
               for k, e in enumerate(self.edges)]
        return np.ravel_multi_index(idx, self.shape)

    def centres(self) -> np.ndarray:
        """(size, columns) array of the cells' centres (for sum queries)."""
        mids = [(np.asarray(e)[1:] + np.asarray(e)[:-1]) / 2 for e in self.edges]
        grid = np.meshgrid(*mids, indexing="ij")
        return np.stack([g.ravel() for g in grid], axis=1)


@dataclass(frozen=True)
class PMWGParams:
    """PMWG: total per-record epsilon (pure); hard-query budget k at the first block's size n0 (growing as
    k (1 + ln(n / n0)), Corollary 16); threshold T; MW learning rate eta; growth_exponent p of the per-round
    epsilon c (n0 / n)^p (module docstring)."""

    epsilon: float
    hard_budget: int = 20
    threshold: float = 0.05
    eta: float = 0.5
    growth_exponent: float = 0.5

    def __post_init__(self):
        _positive("epsilon", self.epsilon, "give the total per-record epsilon > 0")
        _int_at_least("hard_budget", self.hard_budget, 1, "give the number of hard queries k >= 1")
        _positive("threshold", self.threshold, "give the hardness threshold T > 0 (in fraction units)")
        _positive("eta", self.eta, "give the multiplicative-weights rate eta > 0")
        p = self.growth_exponent
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 < p <= 1:
            raise GrowthError(f"growth_exponent {p!r} is invalid: give 0 < p <= 1 (a round opened at size n "
                              "gets epsilon c (n0 / n)^p; p <= 0 would not converge under a growing budget)")

    @property
    def round_scale(self) -> float:
        """c = epsilon / (k + 1 / (exp(p / k) - 1)): a round opened at n <= n0 costs c (module docstring)."""
        k, p = self.hard_budget, self.growth_exponent
        return self.epsilon / (k + 1.0 / math.expm1(p / k))


@dataclass
class Answer:
    t: int
    answer: float
    hard: bool


class PMWG:
    """Private multiplicative weights for a growing database (the paper's Section 4, Algorithm 3).

    Queries are linear: a weight vector w over the universe's cells with values in [0, 1]; the answer is
    sum_i w(cell(x_i)) / n_t (n_t the public record count), sensitivity 1 / n_t (add/remove). Counts over
    a predicate use 0/1 weights; a sum of a column is the cells' centres scaled by 1 / B into [0, 1]
    (``sum_query``). Privacy: epsilon-DP per record over the whole (unbounded) query stream and unbounded
    growth (module docstring: at most h(n) = floor(k (1 + ln(n / n0))) hard queries by size n, a round opened
    at size n costs c min(1, (n0 / n)^p), and the rounds' sum is at most epsilon), charged per block: each
    arriving block's grant charges epsilon before it is read.
    """

    def __init__(self, ledger, stream: str, pipeline: str, params: PMWGParams, universe: Universe,
                 reader: Reader, *, computation: str | None = None):
        if not isinstance(params, PMWGParams):
            raise GrowthError(f"params {params!r} must be a PMWGParams")
        if not isinstance(universe, Universe):
            raise GrowthError(f"universe {universe!r} must be a Universe")
        require_row_unit(ledger, stream, type(self).__name__)
        self.ledger, self.stream, self.pipeline = ledger, stream, pipeline
        if computation is not None and not isinstance(computation, str):
            raise GrowthError(f"computation {computation!r} must be a string (a public description of the "
                              "declared query stream, e.g. its digest) or None")
        self.params, self.universe, self.reader, self.computation = params, universe, reader, computation
        self.grants: dict[str, object] = {}
        self.order: list[str] = []
        self.counts = np.zeros(universe.size)
        self.n = 0  # public record count (declared rows)
        self.public = np.full(universe.size, 1.0 / universe.size)
        self.hard_used = 0
        self.n0: int | None = None  # the declared count after the first block
        self.round_epsilons: list[float] = []  # eps_r of every AboveThreshold round opened (the privacy spent)
        self.eps1 = self.eps2 = None  # the open round's halves
        self.noisy_threshold: float | None = None
        self.round_sensitivity: float | None = None
        self.answers: list[Answer] = []
        self.reads: list[tuple[str, str]] = []
        self._draws = 0

    @property
    def meta(self) -> dict:
        meta = {"strategy": "pmwg", **asdict(self.params), "universe_shape": list(self.universe.shape)}
        if self.computation is not None:  # signed into every grant and the release fingerprint
            meta["computation"] = self.computation
        return meta

    @property
    def fingerprint(self) -> str:
        return schedule_fingerprint(self.pipeline, self.stream, self.meta)

    def observe(self, block: str, declared_rows: int) -> None:
        """Charge ``block`` epsilon, read it under its grant, update the counts and the public histogram."""
        if block in self.grants:
            raise GrowthError(f"block {block!r} was already observed: give each block once, in order")
        m = _int_at_least("declared_rows", declared_rows, 1, "give the block's declared (public) row count >= 1")
        grant = self.ledger.request(self.pipeline, self.stream, blocks=[block], epsilon=self.params.epsilon,
                                    delta=0.0, meta=self.meta)
        self.grants[block] = grant
        self.order.append(block)
        self.ledger.release(grant, STAGE, bound_to_data(self.fingerprint, self.ledger, grant), self.params.epsilon, 0.0)
        rows = self.reader(grant)
        self.reads.append((block, grant.id))
        self.counts += np.bincount(self.universe.cells(rows), minlength=self.universe.size)
        uniform = np.full(self.universe.size, 1.0 / self.universe.size)
        self.public = (self.n * self.public + m * uniform) / (self.n + m)  # the arrival update (Algorithm 3)
        self.n += m
        if self.n0 is None:
            self.n0 = self.n

    def hard_limit(self, n: int | None = None) -> int:
        """h(n) = floor(k (1 + ln(n / n0))): how many hard queries PMWG may have answered by public size n
        (default: now; Corollary 16, module docstring). 0 before the first block."""
        n = self.n if n is None else n
        if self.n0 is None or n <= 0:
            return 0
        # no rounding slack upward: a budget one short is safe, one over would break the privacy bound
        return int(math.floor(self.params.hard_budget * (1.0 + math.log(max(n, self.n0) / self.n0))))

    def round_epsilon(self, n: int | None = None) -> float:
        """eps_r(n) = c min(1, (n0 / n)^p): the epsilon of an AboveThreshold round opened at public size n."""
        n = self.n if n is None else n
        return self.params.round_scale * min(1.0, (self.n0 / n) ** self.params.growth_exponent)

    @property
    def epsilon_spent_bound(self) -> float:
        """The sum of the opened rounds' epsilons: a record's loss so far (<= params.epsilon, module docstring)."""
        return float(sum(self.round_epsilons))

    def _rng(self):
        self._draws += 1
        return as_secure_rng(self.ledger.private_seed(self.grants[self.order[0]].id, f"pmwg/{self._draws}"))

    def true_answer(self, weights: np.ndarray) -> float:
        """The exact (non-private) answer; for tests and benches only."""
        return float(np.asarray(weights) @ self.counts / self.n)

    def query(self, weights: Sequence[float]) -> Answer:
        """Answer a linear query (weights in [0, 1] per cell) on the current database."""
        w = np.asarray(weights, dtype=float)
        if w.shape != (self.universe.size,) or not np.isfinite(w).all() or w.min() < 0 or w.max() > 1:
            raise GrowthError(f"query weights of shape {w.shape} are invalid: give {self.universe.size} values "
                              "in [0, 1], one per cell")
        if not self.order:
            raise GrowthError("no block observed yet: observe a block before querying")
        estimate = float(w @ self.public)
        t = len(self.order)
        if self.noisy_threshold is None and self.hard_used >= self.hard_limit():
            ans = Answer(t, estimate, False)  # budget h(n) used up: the public histogram alone (no privacy cost)
            self.answers.append(ans)
            return ans
        for b in self.order:  # every query reads all blocks: re-open their releases (same computation)
            self.ledger.release(self.grants[b], STAGE, bound_to_data(self.fingerprint, self.ledger, self.grants[b]),
                                self.params.epsilon, 0.0)
        if self.noisy_threshold is None:  # a new AboveThreshold round at the current sensitivity and epsilon
            self.round_sensitivity = 1.0 / self.n
            eps_r = self.round_epsilon()
            self.round_epsilons.append(eps_r)
            self.eps1 = self.eps2 = eps_r / 2
            self.noisy_threshold = float(grid_laplace(np.array([self.params.threshold]), self.round_sensitivity,
                                                      self.eps1 / 2, rng=self._rng())[0])
        d = self.round_sensitivity
        true = self.true_answer(w)
        gap = abs(true - estimate)
        noisy_gap = float(grid_laplace(np.array([gap]), d, self.eps1 / 4, rng=self._rng())[0])
        if noisy_gap < self.noisy_threshold:
            ans = Answer(t, estimate, False)
        else:
            noisy = float(grid_laplace(np.array([true]), 1.0 / self.n, self.eps2, rng=self._rng())[0])
            sign = 1.0 if noisy > estimate else -1.0
            self.public = self.public * np.exp(sign * self.params.eta * w)
            self.public /= self.public.sum()
            self.hard_used += 1
            self.noisy_threshold = None
            ans = Answer(t, noisy, True)
        self.answers.append(ans)
        return ans


def count_query(universe: Universe, predicate: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """0/1 weights of the cells whose centre satisfies ``predicate`` (centres: (size, columns) array)."""
    return np.asarray(predicate(universe.centres()), dtype=float)


def sum_query(universe: Universe, column: int, bound: float,
              predicate: Callable[[np.ndarray], np.ndarray] | None = None) -> np.ndarray:
    """Weights centre[column] / bound (clipped to [0, 1]) on the cells satisfying ``predicate``."""
    bound = _positive("bound", bound, "give the column's public upper bound B > 0")
    c = universe.centres()
    w = np.clip(c[:, column] / bound, 0, 1)
    return w * (count_query(universe, predicate) if predicate else 1.0)
