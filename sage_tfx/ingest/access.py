"""Who gets a block's key: a charged, signed grant, or trusted code.

Two doors hand out block keys: ``grant_block_keys`` for a grant the ledger signed and recorded (exactly its
blocks), and ``trusted_block_keys`` for trusted code only, which logs a ``trusted_read`` entry with its purpose
before deriving a key. ``open_blocks`` then opens each block and checks its content digest against the ledger's.
The key file remains the trust boundary: these are the only doors this package has.

docs/security.md, "Blocks at rest, and reads gated by a grant".
"""

import os

from sage_tfx.privacy.errors import SageError, UnknownBlock
from sage_tfx.privacy.grants import require_registered

from . import sealed


class GrantKeyError(SageError, ValueError):
    """No keys: the grant is forged, unknown, of another stream, or names unregistered blocks."""


def ledger_digest(ledger, stream, block):
    """The content digest the ledger registered for a block at ingest (None for blocks registered without one).

    TRUSTED CODE ONLY (``Ledger.block_digest``); an unregistered block gets no key (SealedError).
    """
    try:
        return ledger.block_digest(stream, block)
    except UnknownBlock:
        raise sealed.SealedError(f"block {block!r} is not registered in stream {stream!r}: no key for it") from None


def grant_block_keys(ledger, grant, stream=None):
    """``(grant, {block id: key})`` for a grant the ledger signed and charged; GrantError otherwise.

    ``grant``: a Grant or its JSON. The signature, the ledger's record of the grant (so it was charged), the
    stream and that every block is registered are all checked before any key is derived.
    """
    grant = ledger.verify(grant, stream=stream)  # forged / altered / unknown (never charged) / other stream
    require_registered(ledger, grant, ": no keys given")
    return grant, {b: ledger.keyring.block_key(grant.stream, b) for b in grant.blocks}


def trusted_block_keys(ledger, stream, blocks, *, purpose: str) -> dict:
    """{block id: key} without a grant, after the ledger logged a ``trusted_read`` of ``blocks`` for ``purpose``
    (committed first: a refused or failed log write derives no key). TRUSTED CODE ONLY: never call it from a
    pipeline component."""
    blocks = list(blocks)
    ledger.record_trusted_read(stream, blocks, purpose)
    return {b: ledger.keyring.block_key(stream, b) for b in blocks}


def open_blocks(ledger, data_root, stream, keys):
    """Open every block of ``keys`` ({block: key}) for reading; each is checked before any record is read."""
    return [
        sealed.open_block(data_root, stream, block, key, expected_digest=ledger_digest(ledger, stream, block))
        for block, key in keys.items()
    ]


def check_blocks(ledger, data_root, stream, blocks) -> None:
    """Verify, BEFORE a charge, that each of ``blocks`` can be read from ``data_root``: its folder is there, its
    manifest authenticates under the block's key and records the content digest the ledger registered, and every
    file it names is a regular file of the recorded size (the SHA-256 is checked as the grant reads it). No record
    is read and no key is kept (each data key is unwrapped only to authenticate its manifest and dropped), so
    nothing is logged. SealedError naming the block folder or file and the fix."""
    for block in blocks:
        opened = sealed.open_block(
            data_root,
            stream,
            block,
            ledger.keyring.block_key(stream, block),
            expected_digest=ledger_digest(ledger, stream, block),
        )
        for path, _name, size, _sha in opened.files:
            if os.path.getsize(path) != size:
                raise sealed.SealedError(
                    f"block file {path} has {os.path.getsize(path)} bytes, {size} recorded at "
                    "ingest: it was altered or damaged; restore it from your backup"
                )


def grant_blocks(ledger, data_root, grant, stream=None):
    """``(grant, [sealed.Block])``: the opened blocks of a charged, signed grant (BlockExampleGen's door)."""
    grant, keys = grant_block_keys(ledger, grant, stream=stream)
    return grant, open_blocks(ledger, data_root, grant.stream, keys)


def read_block_records(ledger, data_root, stream, blocks, *, purpose: str):
    """The records of ``blocks`` of ``stream``, in order (an iterator). TRUSTED CODE ONLY (no grant is checked):
    the ``trusted_read`` of ``blocks`` for ``purpose`` is logged when it is called, before any block is opened."""
    keys = trusted_block_keys(ledger, stream, blocks, purpose=purpose)
    return (record for block in open_blocks(ledger, data_root, stream, keys) for record in block.records())
