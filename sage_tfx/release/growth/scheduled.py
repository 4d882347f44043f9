"""A black-box epsilon-DP mechanism run under a growth schedule against the ledger: each block's one lifetime grant
charged before it is read, each run's releases bound to the blocks it reads (docs/release_strategies.md, "Growth
schedules and PMWG: the proofs").
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from sage_tfx.privacy import gaussian
from sage_tfx.privacy.digests import bound_to_data
from sage_tfx.privacy.randomness import as_secure_rng
from sage_tfx.privacy.samplers import grid_gaussian_sum, grid_laplace_sum
from sage_tfx.privacy.split import per_row_budget
from sage_tfx.privacy.streams import require_row_unit
from sage_tfx.privacy.vocabulary import Composition

from .errors import STAGE, GrowthError, _int_at_least, _positive
from .improver import BBImprover
from .scheduler import BBScheduler

Schedule = Any  # BBScheduler | BBImprover


Mechanism = Callable[[list, float, Any], Any]  # (blocks' data, epsilon, rng) -> output; must be epsilon-DP


Reader = Callable[[object], Any]  # grant -> the data of its (single) block


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
    the grid release keeps the continuous Gaussian's rho-zCDP, hence its RDP curve and (epsilon, delta).

    Args:
        bound: the column's public upper bound B (values clipped to [0, B]).
        rows_per_block: the declared (public) rows per block.
    """
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


def charge_lifetime(
    ledger,
    stream: str,
    pipeline: str,
    block: str,
    epsilon: float,
    delta: float,
    meta: dict,
    fingerprint: str,
    *,
    reads: bool = False,
):
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
    ledger.release(
        grant,
        STAGE,
        bound_to_data(fingerprint, ledger, grant) if reads else fingerprint,
        *per_row_budget(epsilon, delta, ledger.stream(stream).unit_rows),
    )
    return grant


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

    Args:
        ledger: the privacy ledger.
        stream: the stream (its unit one row).
        pipeline: the pipeline name the grants are charged to.
        schedule: a BBScheduler or BBImprover.
        mechanism: the black box (blocks' data, epsilon, rng) -> output.
        reader: grant -> the data of its one block.
        name: the mechanism's public name (in the grants' meta).
    """

    def __init__(
        self,
        ledger,
        stream: str,
        pipeline: str,
        schedule: Schedule,
        mechanism: Mechanism,
        reader: Reader,
        *,
        name: str = "mechanism",
    ):
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
        """Charge ``block``'s lifetime grant, read it, and run the mechanism if the schedule runs now (the Run, or None).

        Args:
            block: the arriving block's id.
        """
        if block in self.grants:
            raise GrowthError(f"block {block!r} was already observed: give each block once, in order")
        grant = charge_lifetime(
            self.ledger,
            self.stream,
            self.pipeline,
            block,
            self.epsilon,
            self.delta,
            self.meta,
            self.fingerprint,
            reads=True,
        )
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
            self.ledger.release(
                self.grants[b],
                STAGE,
                bound_to_data(self.fingerprint, self.ledger, self.grants[b]),
                self.epsilon,
                self.delta,
            )
        rng = as_secure_rng(self.ledger.private_seed(self.grants[self.order[0]].id, f"{self.name}/run/{t}"))
        data = [self.data[b] for b in self.order]
        out = self.mechanism(data, eps, rng, delta=delta_i) if basic else self.mechanism(data, eps, rng)
        run = Run(t, epoch, eps, list(self.order), out, delta_i)
        self.runs.append(run)
        self.current = out
        return run
