"""A pipeline's life on a stream, run by the ``Ledger`` facade: register, claim, outcomes, finish (docs/block_composition.md).

``register_pipeline`` and ``finish_pipeline`` run in the facade's write transaction (a queued stream's arrival and
departure are scheduling points: ``charges.schedule``); ``check_outcome``/``insert_outcome`` record what a run
under a grant concluded; ``claim_pipelines`` takes the store's per-name locks for one process. This module
imports neither the ``Ledger`` facade nor the audit.
"""

from __future__ import annotations

import collections.abc
import time
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from . import charges as _charges
from .chain import canonical
from .errors import GrantError, LedgerError, PipelineBusy
from .session import PipelineClaim
from .store import sql
from .vocabulary import GRANT_OUTCOMES, PIPELINE_OUTCOMES, PipelineState
from .write import StreamWrite

if TYPE_CHECKING:
    from .keys import KeyRing
    from .store import Tx
    from .streams import Stream


def register_pipeline(tx: Tx, log: Callable[..., None], keys: KeyRing, s: Stream, pipeline: str) -> None:
    """Mark ``pipeline`` waiting on ``s`` (nothing if it already waits); a queued stream's scheduling point.

    Raises:
        LedgerError: the pipeline already finished on the stream.
    """
    row = tx.one(sql.PIPELINE_STATE_OUTCOME, (s.name, pipeline))
    if row is not None:
        if row[0] == PipelineState.WAITING:
            return
        raise LedgerError(f"pipeline {pipeline!r} already finished on stream {s.name!r} with {row[1]}")
    now = time.time()
    tx.run(sql.PIPELINE_INSERT, (s.name, pipeline, now))
    log(tx, "register", {"stream": s.name, "pipeline": pipeline}, at=now)
    if s.rules().queued:  # an arrival: one more share of every live block unlocks (DPF-N, DPack)
        tx.run(sql.BLOCK_COUNT_ARRIVAL, (s.name,))
        _charges.schedule(StreamWrite(tx, log, keys, s, s.filter()), time.time())


def check_finish_outcome(outcome: str) -> None:
    """Raises LedgerError unless ``outcome`` ends a pipeline (ACCEPT, REJECT, TIMEOUT)."""
    if outcome not in PIPELINE_OUTCOMES:
        raise LedgerError(f"outcome {outcome!r} is unknown: use one of {', '.join(PIPELINE_OUTCOMES)}")


def finish_pipeline(tx: Tx, log: Callable[..., None], keys: KeyRing, s: Stream, pipeline: str, outcome: str) -> None:
    """End a waiting ``pipeline`` with ``outcome``; its unused reservations go to those still waiting.

    Raises:
        LedgerError: the pipeline is not registered, or already finished.
    """
    row = tx.one(sql.PIPELINE_STATE, (s.name, pipeline))
    if row is None:
        raise LedgerError(f"pipeline {pipeline!r} is not registered on stream {s.name!r}")
    if row[0] != PipelineState.WAITING:
        raise LedgerError(f"pipeline {pipeline!r} already finished on stream {s.name!r}")
    now = time.time()
    tx.run(sql.PIPELINE_FINISH, (outcome, now, s.name, pipeline))
    others = [r[0] for r in tx.all(sql.PIPELINE_WAITING, (s.name,))]
    moved = _charges.release_reservations(tx, s, pipeline, others)
    log(
        tx,
        "finish",
        {"stream": s.name, "pipeline": pipeline, "outcome": outcome, "blocks_released": moved, "to": others},
        at=now,
    )
    if s.rules().queued:  # its demand (pending, or admitted and never collected) is withdrawn
        tx.run(sql.DEMAND_DELETE, (s.name, pipeline))
        _charges.schedule(StreamWrite(tx, log, keys, s, s.filter()), time.time())


def check_outcome(outcome: str, details: Mapping[str, Any] | None) -> tuple[dict[str, Any], str]:
    """A grant outcome (ACCEPT, REJECT, RETRY, FAILED) and its details as a dict and its canonical JSON text.

    Raises:
        LedgerError: an unknown outcome, or details that are not a dict or cannot be written as JSON.
    """
    if outcome not in GRANT_OUTCOMES:
        raise LedgerError(f"outcome {outcome!r} is unknown: use {', '.join(GRANT_OUTCOMES)}")
    if details is not None and not isinstance(details, collections.abc.Mapping):
        raise LedgerError(f"outcome details {details!r} must be a dict (or None)")
    details = dict(details or {})
    try:
        return details, canonical(details)
    except (TypeError, ValueError) as exc:
        raise LedgerError(f"outcome details {details!r} cannot be written as JSON ({exc})") from None


def insert_outcome(
    tx: Tx, log: Callable[..., None], grant_id: str, outcome: str, details: dict[str, Any], details_text: str
) -> None:
    """Record ``grant_id``'s one outcome, appended to the audit log.

    Raises:
        GrantError: the grant is unknown to this ledger.
        LedgerError: the grant already has an outcome.
    """
    row = tx.one(sql.GRANT_OWNER, (grant_id,))
    if row is None:
        raise GrantError(f"grant {grant_id!r} is unknown to this ledger")
    if tx.one(sql.OUTCOME_EXISTS, (grant_id,)):
        raise LedgerError(f"grant {grant_id!r} already has an outcome")
    now = time.time()
    tx.run(sql.OUTCOME_INSERT, (grant_id, row[0], row[1], outcome, details_text, now))
    log(
        tx,
        "outcome",
        {"grant": grant_id, "stream": row[0], "pipeline": row[1], "outcome": outcome, "details": details},
        at=now,
    )


def claim_pipelines(store: Any, stream: str, names: Iterable[str]) -> PipelineClaim:
    """Take the store's lock of every name of ``stream`` for this process, all or none (``Ledger.claim``).

    Raises:
        PipelineBusy: another process holds any of them (naming each and its holder); then none is claimed.
    """
    held, busy = [], []
    for name in dict.fromkeys(names):
        handle, holder = store.try_claim(f"{stream}\0{name}")
        if handle is None:
            busy.append(f"{name!r} (held by {holder})")
        else:
            held.append(handle)
    if busy:
        for handle in held:
            store.release_claim(handle)
        raise PipelineBusy(
            f"pipeline(s) {', '.join(busy)} of stream {stream!r} are being run by another process: one process "
            "runs a pipeline name at a time (else both would charge and resume the same pipeline's grants). "
            "Give this run other names (sage serve --pipeline OTHER=..., sage run --name OTHER), or wait until "
            "that process ends"
        )
    return PipelineClaim(store, held)
