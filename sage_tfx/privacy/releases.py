"""A stage's release under a grant, run by ``Ledger.release`` (docs/block_composition.md, "what a grant pays for").

``check_release_args`` checks the stage, the computation's fingerprint and the spend before any transaction;
``open_release`` records the stage's one release, or re-opens it, in the facade's write transaction (what a stage
may spend: ``grants.stage_allowance``). This module imports neither the ``Ledger`` facade nor the audit.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from .checks import finite
from .errors import LedgerError
from .grants import Grant, Release, stage_allowance
from .split import STAGES
from .store import sql
from .unit_share import PER_UNIT_KEY

if TYPE_CHECKING:
    from .store import Tx


def check_release_args(stage: str, computation: str, epsilon: float, delta: float) -> tuple[float, float]:
    """A known stage, a fingerprint of 1-256 characters and a finite spend with 0 <= delta < 1.

    Returns:
        ``(epsilon, delta)`` as floats.

    Raises:
        LedgerError: naming the bad value.
    """
    if stage not in STAGES:
        raise LedgerError(f"stage {stage!r} is unknown: use one of {', '.join(STAGES)}")
    if not isinstance(computation, str) or not 0 < len(computation) <= 256:
        raise LedgerError(f"computation {computation!r} must be a fingerprint string of 1-256 characters")
    epsilon = finite(epsilon, "release epsilon", allow_none=False, nonnegative=True)
    delta = finite(delta, "release delta", allow_none=False, nonnegative=True)
    if not delta < 1:
        raise LedgerError(f"release delta {delta!r} is invalid: need 0 <= delta < 1")
    return epsilon, delta


def open_release(
    tx: Tx,
    log: Callable[..., None],
    grant: Grant,
    stage: str,
    computation: str,
    epsilon: float,
    delta: float,
    cap: tuple[float, float] | None,
    per_unit: str | None = None,
) -> Release:
    """``stage``'s one release under ``grant``: re-opened if recorded for ``computation``, else recorded now.

    Args:
        tx: the facade's write transaction (the check and the record are one transaction).
        log: the facade's ``Ledger._log``.
        grant: the ledger's copy of the grant (``Ledger.verify``).
        stage, computation, epsilon, delta: the release, checked by ``check_release_args``.
        cap: what an older rdp grant's cost pays for (``grants.stage_cap``), or None.
        per_unit: the unit column a mechanism calibrated to the unit names (``unit_share``; None: per row), signed
            into the release's log entry.

    Returns:
        The ``Release`` (``reopened`` True when it was recorded before).

    Raises:
        GrantError: another computation already holds the stage, or the stage may not spend this much.
    """
    done = {r[0]: r[1:] for r in tx.all(sql.RELEASE_OF_GRANT, (grant.id,))}
    reopened = stage_allowance(grant, stage, done, computation, epsilon, delta, cap, per_unit)
    if reopened is not None:
        return reopened
    now = time.time()
    tx.run(sql.RELEASE_INSERT, (grant.id, stage, grant.stream, grant.pipeline, computation, epsilon, delta, now))
    log(
        tx,
        "release",
        {
            "grant": grant.id,
            "stream": grant.stream,
            "pipeline": grant.pipeline,
            "stage": stage,
            "computation": computation,
            "epsilon": epsilon,
            "delta": delta,
            **({} if per_unit is None else {PER_UNIT_KEY: per_unit}),
        },
        at=now,
    )
    return Release(grant.id, stage, computation, epsilon, delta, now, reopened=False)
