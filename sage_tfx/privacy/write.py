"""What the ledger facade hands its step modules (charges, blocks) for one write: the transaction, the log, the
key ring and the stream (``StreamWrite``), and what a request charges (``Charge``). The steps run inside the
facade's write transaction and import neither the facade nor the audit."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .filters import BasicFilter, RdpFilter
    from .keys import KeyRing
    from .split import BudgetSplit
    from .store import Tx
    from .streams import Stream


@dataclass(frozen=True)
class StreamWrite:
    """One stream's write in the facade's transaction.

    Attributes:
        tx: the write transaction every step runs in (all its writes commit together, or none).
        log: the facade's ``Ledger._log``: ``log(tx, kind, body, text=None)`` appends to the chained log.
        keyring: the ledger's ``KeyRing``, which signs each grant.
        stream: the stream as read in ``tx``.
        filt: the stream's privacy filter (``streams.stream_filter(stream)``).
    """

    tx: Tx
    log: Callable[..., None]
    keyring: KeyRing
    stream: Stream
    filt: BasicFilter | RdpFilter

    def append(
        self, kind: str, body: Mapping[str, Any] | None, text: str | None = None, at: float | None = None
    ) -> None:
        """Append one log entry in this write's transaction (``body``, or its canonical ``text``) at time ``at``
        (default now), the time of the rows it writes."""
        self.log(self.tx, kind, body, text, at=at)


@dataclass(frozen=True)
class Charge:
    """What a request asks to charge, checked by the facade.

    Attributes:
        pipeline: the requesting pipeline's name.
        blocks: the block ids, in grant order, each once.
        cost: the filter's cost vector of the request's (epsilon, delta) or curve.
        rule: the grant's charge rule (``vocabulary.ChargeRule`` value).
        meta: the grant's metadata, signed into it.
        split: the grant's stage split (``split.BudgetSplit``), if any.
    """

    pipeline: str
    blocks: Sequence[str]
    cost: tuple
    rule: str
    meta: Mapping[str, Any]
    split: BudgetSplit | None = None
