"""Fingerprints of a computation and of the records a grant gives to read: one home for the components
(``components/_grant.py``) and the release strategies (``sage_tfx.release``).

A release's fingerprint (``Ledger.release``'s ``computation``) binds WHAT it computes; ``data_digest`` binds
what it READS: the grant's stream, each granted block with the content digest the ledger registered for it at
ingest (the block readers check the block's files against that digest before a record is read) and the grant's
signed record split. ``bound_to_data`` joins the two, so a release re-opened under one grant on other records
is another computation, which the ledger refuses before any noise is drawn.
"""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING, Any

from .split import record_split

if TYPE_CHECKING:
    from .blocks import BlockSource
    from .grants import Grant


def computation_digest(*parts: Any) -> str:
    """A SHA-256 fingerprint of a computation from its parts (bytes as they are, anything else as canonical JSON)."""
    digest = hashlib.sha256()
    for part in parts:
        data = part if isinstance(part, bytes) else json.dumps(part, sort_keys=True, default=str).encode()
        digest.update(len(data).to_bytes(8, "big"))
        digest.update(data)
    return digest.hexdigest()


def data_digest(ledger: BlockSource, grant: Grant) -> str:
    """A SHA-256 of the records a grant gives to read: its stream, each granted block with the content digest
    the ledger registered for it at ingest (None for a block registered without one: its id stands for it), and
    the grant's record split (``record_split``). Readers of the grant's blocks (BlockExampleGen,
    ``ingest.access.grant_blocks``) read exactly these records, so two reads of one grant with the same digest
    read the same records in the same splits. ``ledger``: an open ``Ledger`` (its ``block_digest``)."""
    blocks = [[b, ledger.block_digest(grant.stream, b)] for b in grant.blocks]
    return computation_digest("records/v1", grant.stream, blocks, record_split(grant).to_dict())


def bound_to_data(computation: str, ledger: BlockSource, grant: Grant) -> str:
    """The fingerprint of ``computation`` (a fingerprint string) reading ``grant``'s records (``data_digest``):
    what a release strategy opens each grant's release with. The same computation on another grant's records,
    or on a block registered with other content, is another fingerprint."""
    return computation_digest("release-data/v1", computation, data_digest(ledger, grant))
