"""PMWG (Cummings et al. 2018, Algorithm 3): private multiplicative weights on a growing database
(docs/release_strategies.md, "Growth schedules and PMWG: the proofs").
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from sage_tfx.privacy.digests import bound_to_data
from sage_tfx.privacy.randomness import as_secure_rng
from sage_tfx.privacy.samplers import grid_laplace
from sage_tfx.privacy.streams import require_row_unit

from .calibration import pmwg_round_scale
from .errors import STAGE, GrowthError, _int_at_least, _positive
from .scheduled import Reader, schedule_fingerprint


@dataclass(frozen=True)
class Universe:
    """A declared finite discretisation: for each column, bin edges (values are clipped into the outer bins).

    Args:
        columns: the column names, in the rows' order.
        edges: one increasing sequence of >= 2 finite bin edges per column.
    """

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
        """Flat cell index of each row (rows: (n, len(columns)) array).

        Args:
            rows: an (n, len(columns)) array.
        """
        rows = np.asarray(rows, dtype=float)
        if rows.ndim != 2 or rows.shape[1] != len(self.columns):
            raise GrowthError(f"rows of shape {rows.shape} do not match the universe's {len(self.columns)} columns")
        idx = [
            np.clip(np.searchsorted(np.asarray(e), rows[:, k], side="right") - 1, 0, len(e) - 2)
            for k, e in enumerate(self.edges)
        ]
        return np.ravel_multi_index(idx, self.shape)

    def centres(self) -> np.ndarray:
        """(size, columns) array of the cells' centres (for sum queries)."""
        mids = [(np.asarray(e)[1:] + np.asarray(e)[:-1]) / 2 for e in self.edges]
        grid = np.meshgrid(*mids, indexing="ij")
        return np.stack([g.ravel() for g in grid], axis=1)


@dataclass(frozen=True)
class PMWGParams:
    """PMWG's parameters (docs/release_strategies.md), checked before anything is charged.

    Args:
        epsilon: the total per-record epsilon.
        hard_budget: k, the hard-query budget at the first block's size n0 (growing as k (1 + ln(n / n0)),
            Corollary 16).
        threshold: T, the hardness threshold (fraction units).
        eta: the multiplicative-weights learning rate.
        growth_exponent: p of the per-round epsilon c (n0 / n)^p.
        delta: 0 for pure epsilon-DP (basic composition of the rounds); > 0 for (epsilon, delta)-DP by zCDP
            composition of the rounds (Theorem 17): a larger c, so less noise per round.
    """

    epsilon: float
    hard_budget: int = 20
    threshold: float = 0.05
    eta: float = 0.5
    growth_exponent: float = 0.5
    delta: float = 0.0

    def __post_init__(self):
        _positive("epsilon", self.epsilon, "give the total per-record epsilon > 0")
        _int_at_least("hard_budget", self.hard_budget, 1, "give the number of hard queries k >= 1")
        _positive("threshold", self.threshold, "give the hardness threshold T > 0 (in fraction units)")
        _positive("eta", self.eta, "give the multiplicative-weights rate eta > 0")
        p = self.growth_exponent
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 < p <= 1:
            raise GrowthError(
                f"growth_exponent {p!r} is invalid: give 0 < p <= 1 (a round opened at size n "
                "gets epsilon c (n0 / n)^p; p <= 0 would not converge under a growing budget)"
            )
        d = self.delta
        if isinstance(d, bool) or not isinstance(d, (int, float)) or not 0 <= d < 1:
            raise GrowthError(f"delta {d!r} is invalid: give 0 <= delta < 1 (0 = pure epsilon-DP)")

    @functools.cached_property
    def round_scale(self) -> float:
        """c: a round opened at n <= n0 costs c (``calibration.pmwg_round_scale``; docs/release_strategies.md)."""
        return pmwg_round_scale(self.epsilon, self.delta, self.hard_budget, self.growth_exponent)

    def to_dict(self) -> dict:
        """The parameters as signed into every grant (delta left out when 0: pure runs keep their fingerprints)."""
        out = asdict(self)
        if self.delta == 0:
            del out["delta"]
        return out


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
    growth (docs/release_strategies.md: at most h(n) = floor(k (1 + ln(n / n0))) hard queries by size n, a round opened
    at size n costs c min(1, (n0 / n)^p), and the rounds' sum is at most epsilon), charged per block: each
    arriving block's grant charges epsilon before it is read.

    Args:
        ledger: the privacy ledger.
        stream: the stream (its unit one row).
        pipeline: the pipeline name the grants are charged to.
        params: the checked PMWGParams.
        universe: the declared Universe.
        reader: grant -> the (n, columns) rows of its one block.
        computation: a public description of the declared query stream (signed into every grant), or None.
    """

    def __init__(
        self,
        ledger,
        stream: str,
        pipeline: str,
        params: PMWGParams,
        universe: Universe,
        reader: Reader,
        *,
        computation: str | None = None,
    ):
        if not isinstance(params, PMWGParams):
            raise GrowthError(f"params {params!r} must be a PMWGParams")
        if not isinstance(universe, Universe):
            raise GrowthError(f"universe {universe!r} must be a Universe")
        require_row_unit(ledger, stream, type(self).__name__)
        self.ledger, self.stream, self.pipeline = ledger, stream, pipeline
        if computation is not None and not isinstance(computation, str):
            raise GrowthError(
                f"computation {computation!r} must be a string (a public description of the "
                "declared query stream, e.g. its digest) or None"
            )
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
        meta = {"strategy": "pmwg", **self.params.to_dict(), "universe_shape": list(self.universe.shape)}
        if self.computation is not None:  # signed into every grant and the release fingerprint
            meta["computation"] = self.computation
        return meta

    @property
    def fingerprint(self) -> str:
        return schedule_fingerprint(self.pipeline, self.stream, self.meta)

    def observe(self, block: str, declared_rows: int) -> None:
        """Charge ``block`` epsilon, read it under its grant, update the counts and the public histogram.

        Args:
            block: the arriving block's id.
            declared_rows: its declared (public) row count.
        """
        if block in self.grants:
            raise GrowthError(f"block {block!r} was already observed: give each block once, in order")
        m = _int_at_least("declared_rows", declared_rows, 1, "give the block's declared (public) row count >= 1")
        grant = self.ledger.request(
            self.pipeline,
            self.stream,
            blocks=[block],
            epsilon=self.params.epsilon,
            delta=self.params.delta,
            meta=self.meta,
        )
        self.grants[block] = grant
        self.order.append(block)
        self.ledger.release(
            grant, STAGE, bound_to_data(self.fingerprint, self.ledger, grant), self.params.epsilon, self.params.delta
        )
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
        (default: now; Corollary 16, docs/release_strategies.md). 0 before the first block.

        Args:
            n: a public size (default: now).
        """
        n = self.n if n is None else n
        if self.n0 is None or n <= 0:
            return 0
        # no rounding slack upward: a budget one short is safe, one over would break the privacy bound
        return int(math.floor(self.params.hard_budget * (1.0 + math.log(max(n, self.n0) / self.n0))))

    def round_epsilon(self, n: int | None = None) -> float:
        """eps_r(n) = c min(1, (n0 / n)^p): the epsilon of an AboveThreshold round opened at public size n.

        Args:
            n: a public size (default: now).
        """
        n = self.n if n is None else n
        return self.params.round_scale * min(1.0, (self.n0 / n) ** self.params.growth_exponent)

    @property
    def epsilon_spent_bound(self) -> float:
        """The sum of the opened rounds' epsilons: a record's loss so far (<= params.epsilon when delta = 0,
        docs/release_strategies.md)."""
        return float(sum(self.round_epsilons))

    @property
    def rho_spent_bound(self) -> float:
        """The sum of the opened rounds' eps_r^2 / 2: a record's zCDP rho so far (<= zcdp_rho(epsilon, delta) when
        delta > 0)."""
        return float(sum(e * e / 2 for e in self.round_epsilons))

    def _rng(self):
        self._draws += 1
        return as_secure_rng(self.ledger.private_seed(self.grants[self.order[0]].id, f"pmwg/{self._draws}"))

    def true_answer(self, weights: np.ndarray) -> float:
        """The exact (non-private) answer; for tests and benches only.

        Args:
            weights: the query's weights per cell.
        """
        return float(np.asarray(weights) @ self.counts / self.n)

    def query(self, weights: Sequence[float]) -> Answer:
        """Answer a linear query (weights in [0, 1] per cell) on the current database.

        Args:
            weights: one weight in [0, 1] per cell of the universe.
        """
        w = np.asarray(weights, dtype=float)
        if w.shape != (self.universe.size,) or not np.isfinite(w).all() or w.min() < 0 or w.max() > 1:
            raise GrowthError(
                f"query weights of shape {w.shape} are invalid: give {self.universe.size} values "
                "in [0, 1], one per cell"
            )
        if not self.order:
            raise GrowthError("no block observed yet: observe a block before querying")
        estimate = float(w @ self.public)
        t = len(self.order)
        if self.noisy_threshold is None and self.hard_used >= self.hard_limit():
            ans = Answer(t, estimate, False)  # budget h(n) used up: the public histogram alone (no privacy cost)
            self.answers.append(ans)
            return ans
        for b in self.order:  # every query reads all blocks: re-open their releases (same computation)
            self.ledger.release(
                self.grants[b],
                STAGE,
                bound_to_data(self.fingerprint, self.ledger, self.grants[b]),
                self.params.epsilon,
                self.params.delta,
            )
        if self.noisy_threshold is None:  # a new AboveThreshold round at the current sensitivity and epsilon
            self.round_sensitivity = 1.0 / self.n
            eps_r = self.round_epsilon()
            self.round_epsilons.append(eps_r)
            self.eps1 = self.eps2 = eps_r / 2
            self.noisy_threshold = float(
                grid_laplace(np.array([self.params.threshold]), self.round_sensitivity, self.eps1 / 2, rng=self._rng())[
                    0
                ]
            )
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
    """0/1 weights of the cells whose centre satisfies ``predicate`` (centres: (size, columns) array).

    Args:
        universe: the declared Universe.
        predicate: (size, columns) centres -> booleans.
    """
    return np.asarray(predicate(universe.centres()), dtype=float)


def sum_query(
    universe: Universe, column: int, bound: float, predicate: Callable[[np.ndarray], np.ndarray] | None = None
) -> np.ndarray:
    """Weights centre[column] / bound (clipped to [0, 1]) on the cells satisfying ``predicate``.

    Args:
        universe: the declared Universe.
        column: the summed column's index.
        bound: the column's public upper bound B > 0.
        predicate: (size, columns) centres -> booleans, or None for all cells.
    """
    bound = _positive("bound", bound, "give the column's public upper bound B > 0")
    c = universe.centres()
    w = np.clip(c[:, column] / bound, 0, 1)
    return w * (count_query(universe, predicate) if predicate else 1.0)
