"""Trusted code's reads outside any grant, logged before a key is derived (docs/security.md).

``check_trusted_read`` checks the purpose and the block list before any transaction; ``log_trusted_read`` writes
the ``trusted_read`` entry in the facade's write transaction (``Ledger.record_trusted_read``). This module imports
neither the ``Ledger`` facade nor the audit.
"""

from __future__ import annotations

import collections.abc
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from .blocks import read_blocks
from .chain import TRUSTED_READ
from .errors import LedgerError, UnknownBlock

if TYPE_CHECKING:
    from .store import Tx


def check_trusted_read(blocks: Sequence[str], purpose: str) -> list[str]:
    """The block ids of a trusted read that says why it reads.

    Returns:
        The ids as strings, in the given order.

    Raises:
        LedgerError: an empty purpose, blocks that are not a list, or no block.
    """
    if not isinstance(purpose, str) or not purpose.strip():
        raise LedgerError(
            f"purpose {purpose!r} must say why trusted code decrypts blocks outside a grant "
            "(e.g. 'non-private baseline'): it is written to the audit log"
        )
    if isinstance(blocks, str) or not isinstance(blocks, collections.abc.Iterable):
        raise LedgerError(f"blocks {blocks!r} is not a list of block ids: give the blocks it decrypts")
    ids = [str(b) for b in blocks]
    if not ids:
        raise LedgerError("a trusted read names no block: give the blocks it decrypts")
    return ids


def log_trusted_read(tx: Tx, log: Callable[..., None], stream: str, ids: list[str], purpose: str) -> None:
    """Append the ``trusted_read`` entry naming ``ids`` of ``stream`` and ``purpose``.

    Raises:
        UnknownBlock: a block the stream does not hold (nothing written).
    """
    missing = sorted(set(ids) - set(read_blocks(tx, stream, ids)))
    if missing:
        raise UnknownBlock(
            f"block(s) {', '.join(map(repr, missing))} do not exist in stream {stream!r}: no key for them"
        )
    log(tx, TRUSTED_READ, {"stream": stream, "blocks": ids, "purpose": purpose.strip()})
