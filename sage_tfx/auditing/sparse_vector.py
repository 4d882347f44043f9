"""A multi-query audit of PMWG's sparse vector (``pmwg-sparse-vector``): the AboveThreshold part of a round,
which the one-query ``pmwg`` entry does not see.

Each AboveThreshold round of ``release.growth.PMWG`` is asked a crafted stream of ``QUERIES`` linear queries on a
throwaway ledger (the real ``observe``/``query`` path: the block's grant, its release, its private seed). The
neighbour D' adds one record to cell 0: it moves the first ``QUERIES - 1`` queries' gaps one sensitivity d = 1/n
TOWARD the threshold (D: T - d, D': T) and the last one AWAY from it (D: T + d, D': T); the statistic is the index
of the round's first hard query (``QUERIES - 0.5`` when none is hard), a function of the round's hard/not-hard
outcomes only. Claim: the sparse vector's half of the round, eps1 = ``round_epsilon`` / 2 (PMWG draws the
threshold at eps1 / 2 and each gap at eps1 / 4 with sensitivity d, so the outcomes are eps1-DP; the hard answer's
half eps2 is not looked at).

Trials are rounds: one grant holds ``ROUNDS`` rounds (``hard_budget``), each with its own draws from the grant's
private seed (``pmwg/<draw>``); the multiplicative-weights rate is 1e-300, so exp(+-eta w) is exactly 1 and the
public histogram every round sees is the first one's up to float rounding. A round with no hard crafted query is
closed by a query far above the threshold (its outcome unused). Contract: as ``mechanisms``' entries; ledger-seeded,
so not reproducible run to run.

Set-up, figures and limits: docs/privacy_auditing.md ("What is covered", "Planted bugs", "Limits").
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable

import numpy as np

from .core import Mechanism
from .mechanisms import register_mechanism
from .releases import _pmwg_ledger, observed_pmwg

__all__ = ["QUERIES", "ROUNDS", "sparse_vector_mechanism"]

QUERIES = 6  # crafted queries per round: 5 toward the threshold, the last away from it
ROUNDS = 50  # AboveThreshold rounds per grant (the trials of one grant)
ROWS = 100  # the block's declared (public) rows: d = 1 / ROWS
THRESHOLD = 0.05
# D's rows per cell of the 10-cell universe (public estimate 0.1 per cell): cell 0 on target, cell 1 a surplus
# of 0.5, cell 2 a deficit of 0.1; D' adds one row to cell 0
COUNTS = (10, 60, 0, 5, 5, 5, 5, 5, 5, 0)


def _queries(size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(toward, away, close): weight vectors whose gaps on D are T - d (T on D'), T + d (T on D') and 0.5."""
    d = 1.0 / ROWS
    toward, away, close = np.zeros(size), np.zeros(size), np.zeros(size)
    toward[0], toward[1] = 1.0, (THRESHOLD - d) / 0.5  # gap 0.5 w_1; the row in cell 0 raises it by d
    away[0], away[2] = 1.0, (THRESHOLD + d) / 0.1  # gap 0.1 w_2; the row in cell 0 lowers it by d
    close[1] = 1.0
    return toward, away, close


def _round(pmwg, toward, away, close) -> float:
    """One AboveThreshold round: the crafted stream, then (if none was hard) the closing query."""
    for i in range(QUERIES):
        if pmwg.query(away if i == QUERIES - 1 else toward).hard:
            return float(i + 1)
    while not pmwg.query(close).hard:
        pass
    return QUERIES - 0.5


def sparse_vector_mechanism(
    epsilon: float, pmwg_class: Callable | None = None, name: str = "pmwg-sparse-vector"
) -> Mechanism:
    """PMWG's AboveThreshold rounds on a crafted query stream, claim eps1 = ``epsilon`` (module docstring). The
    ledger lives in a temporary folder (on /dev/shm when there is one) for the mechanism's lifetime.

    Args:
        epsilon: the claimed epsilon: the sparse vector's half of the round (the round's epsilon is 2 epsilon).
        pmwg_class: the class run (default ``PMWG``; a planted variant's subclass in the tests).
        name: the mechanism's name in the result.
    """
    from sage_tfx.release.growth import PMWG, PMWGParams, Universe

    def params(total: float) -> PMWGParams:
        return PMWGParams(epsilon=total, hard_budget=ROUNDS, threshold=THRESHOLD, eta=1e-300, growth_exponent=1.0)

    scale = params(1.0).round_scale  # the round's epsilon per unit of the grant's
    chosen = params(2.0 * epsilon / scale)
    universe = Universe(("v",), (np.arange(11.0),))
    base = np.repeat(np.arange(10.0) + 0.5, COUNTS)[:, None]
    queries = _queries(universe.size)
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
    folder = tempfile.TemporaryDirectory(prefix="sage-audit-svt-", dir=shm)
    ledger = _pmwg_ledger(folder.name, chosen.epsilon)
    sides: dict[bool, list] = {False: [], True: []}
    blocks = iter(range(1 << 62))

    def fresh_grant(neighbour: bool) -> None:
        rows = np.vstack([base, [[0.5]]]) if neighbour else base
        pmwg = observed_pmwg(ledger, next(blocks), (pmwg_class or PMWG), chosen, universe, rows, ROWS)
        sides[neighbour] = [_round(pmwg, *queries) for _ in range(ROUNDS)]

    def release(neighbour, seed):
        if not sides[neighbour]:
            fresh_grant(neighbour)
        return sides[neighbour].pop()

    release.folder = folder  # type: ignore[attr-defined]  # keeps the ledger's folder as long as the mechanism
    return Mechanism(name, release, epsilon)


register_mechanism(
    "pmwg-sparse-vector",
    "PMWG's AboveThreshold rounds (release.growth.PMWG, throwaway ledger) on a crafted "
    f"stream of {QUERIES} queries the neighbour moves toward / away from the threshold; "
    "statistic: the first hard query; claim: the sparse vector's half of the round",
    slow=True,
)(sparse_vector_mechanism)
