"""ERMG (Cummings et al. 2018, Section 3.2.1, Theorem 12, Table 1): private empirical risk minimisation re-run on a
growing database under BBScheduler or BBImprover (docs/release_strategies.md, "Growth schedules and PMWG: the
proofs").
"""

from __future__ import annotations

import math

import numpy as np

from sage_tfx.privacy import gaussian
from sage_tfx.privacy.samplers import grid_gaussian, grid_laplace
from sage_tfx.privacy.vocabulary import Composition
from sage_tfx.release.continual import ReleaseParams, clip_features, sensitivity, solve_erm

from .errors import GrowthError
from .improver import BBImprover
from .scheduled import Mechanism, Reader, Schedule, ScheduledRelease
from .scheduler import BBScheduler

SPEC_DELTA = 0.5  # a placeholder: the ERM spec's own (epsilon, delta) are never used, the schedule's run budgets are


def noise_mode(schedule: Schedule) -> Composition:
    """What each run of ``schedule`` must be: PURE (epsilon_i-DP), ZCDP (epsilon_i^2 / 2-zCDP) or BASIC
    ((epsilon_i, delta_i)-DP).

    Args:
        schedule: a BBScheduler or BBImprover (not an approximate one: those runs are TFX pipelines).
    """
    if not isinstance(schedule, (BBScheduler, BBImprover)):
        raise GrowthError(f"schedule {schedule!r} must be a BBScheduler or BBImprover")
    if getattr(schedule, "approximate", False):
        raise GrowthError(
            "an approximate schedule's runs are drawn from the ledger by a pipeline: give ERMG a "
            "schedule with approximate=False"
        )
    return Composition.ZCDP if isinstance(schedule, BBImprover) else schedule.params.mode


def erm_mechanism(
    schedule: Schedule,
    rows_per_block: int,
    *,
    lam: float = 0.05,
    radius: float = 10.0,
    loss: str = "logistic",
    classes: int | None = None,
) -> Mechanism:
    """ERMG's black box: regularised ERM on all blocks so far, released by output perturbation at the run's budget.

    The ERM is ``release.continual.solve_erm`` on the clipped rows, normalised by the PUBLIC n = blocks *
    ``rows_per_block``; its L2 sensitivity is Delta_2 = (1 + 4 xi) L / (lam n) (``release.continual.sensitivity``).
    The noise matches what the schedule's proof needs of a run at epsilon_i: PURE, grid Laplace at L1 sensitivity
    sqrt(D) Delta_2 (D the weights' size; ||v||_1 <= sqrt(D) ||v||_2), epsilon_i-DP exactly; ZCDP (BBImprover,
    BBScheduler with delta > 0), the grid Gaussian with sigma = Delta_2 / epsilon_i, rho = epsilon_i^2 / 2 as the
    zCDP composition counts it; BASIC, the grid Gaussian with sigma = z Delta_2, z calibrated to
    (epsilon_i, delta_i) by dp-accounting. Every parameter is checked here, before anything is charged.

    Args:
        schedule: the BBScheduler or BBImprover the runs follow.
        rows_per_block: m0, the declared (public) rows per block.
        lam: the ridge weight.
        radius: the parameter ball's radius.
        loss: logistic, squared or softmax.
        classes: the number of classes (softmax only).
    """
    mode = noise_mode(schedule)
    try:
        spec = ReleaseParams(
            epsilon=1.0,
            delta=SPEC_DELTA,
            records_per_block=rows_per_block,
            lam=lam,
            radius=radius,
            loss=loss,
            classes=classes,
        )
    except ValueError as exc:
        raise GrowthError(str(exc)) from None

    def mechanism(blocks: list, epsilon: float, rng, delta: float = 0.0) -> np.ndarray:
        x, y = clip_features(
            np.concatenate([b[0] for b in blocks]), np.concatenate([b[1] for b in blocks]), spec.loss, spec.classes
        )
        w = solve_erm(
            x,
            y,
            normaliser=len(blocks) * spec.records_per_block,
            lam=spec.lam,
            radius=spec.radius,
            loss=spec.loss,
            classes=spec.classes,
        )
        d2 = sensitivity(spec, len(blocks))
        if mode is Composition.PURE:
            return grid_laplace(w, math.sqrt(w.size) * d2, epsilon, rng=rng, cells=w.size)
        sigma = d2 / epsilon if mode is Composition.ZCDP else gaussian.rdp_multiplier(epsilon, delta) * d2
        return grid_gaussian(w, d2, sigma, rng=rng, cells=w.size)

    return mechanism


def ermg(
    ledger,
    stream: str,
    pipeline: str,
    schedule: Schedule,
    reader: Reader,
    *,
    rows_per_block: int,
    lam: float = 0.05,
    radius: float = 10.0,
    loss: str = "logistic",
    classes: int | None = None,
) -> ScheduledRelease:
    """ERMG: a ``ScheduledRelease`` of ``erm_mechanism`` under ``schedule`` (each block's lifetime grant charged
    before it is read); ``observe(block)`` returns the run made at that arrival (its ``output`` the released
    weights) or None, and ``current`` is the newest released model. Privacy: the schedule's (epsilon, delta)
    per record over the infinite horizon.

    Args:
        ledger: the privacy ledger.
        stream: the stream the blocks belong to (its unit one row).
        pipeline: the pipeline name the grants are charged to.
        schedule: a BBScheduler or BBImprover.
        reader: grant -> (X, y) of its one block.
        rows_per_block: m0, the declared rows per block.
        lam: the ridge weight.
        radius: the parameter ball's radius.
        loss: logistic, squared or softmax.
        classes: the number of classes (softmax only).
    """
    mechanism = erm_mechanism(schedule, rows_per_block, lam=lam, radius=radius, loss=loss, classes=classes)
    name = f"ermg/{loss}/lam={lam!r}/R={radius!r}/m0={rows_per_block}" + (f"/k={classes}" if classes else "")
    return ScheduledRelease(ledger, stream, pipeline, schedule, mechanism, reader, name=name)
