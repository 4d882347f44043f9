"""The head file's on-disk form: two fixed-size slots A and B (and slot C for ``HeadSync.USE``), each a header with a
generation number, the heads as JSON and a SHA-256 of both (``HeadFile`` writes them; docs/security.md).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import struct
from json.encoder import encode_basestring_ascii as _json_string

from .errors import LedgerUpgradeNeeded
from .keys import KeyFileError

HEAD_MAGIC = b"SAGEHD02"  # the first bytes of every slot of the two-slot head file (an old head file is JSON: "{")
HEAD_SLOT_BYTES = 4096  # the smallest slot: one page; a bigger head doubles it (HeadFile._replace)


_SLOT_HEADER = struct.Struct(">8sIQI")  # magic, slot size, generation, payload length
_SLOT_DIGEST = 32  # SHA-256 of header + payload, after the payload


def _slot_bytes(slot_size, generation, payload):
    """One slot: header, payload (the heads as JSON), SHA-256 of both, zeros up to ``slot_size``."""
    head = _SLOT_HEADER.pack(HEAD_MAGIC, slot_size, generation, len(payload)) + payload
    return (head + hashlib.sha256(head).digest()).ljust(slot_size, b"\0")


def _heads_payload(heads):
    """``json.dumps(heads, sort_keys=True, separators=(",", ":")).encode()``, byte for byte, at a third of its cost.

    An entry of the form this module writes ({"chain": text, "seq": int}, a text ledger id) is formatted directly
    (ASCII-escaped as json.dumps escapes text by default; keys in sorted order); anything else (a form another
    version wrote) goes through json.dumps. tests/privacy/test_head_file_payload.py compares the two on odd ids and entries.
    """
    parts = []
    for ledger_id in sorted(heads):
        entry = heads[ledger_id]
        if (
            type(ledger_id) is str
            and type(entry) is dict
            and len(entry) == 2
            and type(entry.get("seq")) is int
            and type(entry.get("chain")) is str
        ):
            parts.append(f'{_json_string(ledger_id)}:{{"chain":{_json_string(entry["chain"])},"seq":{entry["seq"]}}}')
        else:
            parts.append(json.dumps({ledger_id: entry}, sort_keys=True, separators=(",", ":"))[1:-1])
    return ("{" + ",".join(parts) + "}").encode()


def _slot_size_for(payload):
    size = HEAD_SLOT_BYTES
    while size < _SLOT_HEADER.size + len(payload) + _SLOT_DIGEST:
        size *= 2
    return size


def _parse_slot(data, slot_size):
    """(generation, heads) of one slot, or None if it is not intact (torn by a crash mid-write, or never written)."""
    if len(data) < _SLOT_HEADER.size:
        return None
    magic, size, generation, length = _SLOT_HEADER.unpack_from(data)
    end = _SLOT_HEADER.size + length
    if magic != HEAD_MAGIC or size != slot_size or end + _SLOT_DIGEST > slot_size:
        return None
    if not hmac.compare_digest(hashlib.sha256(data[:end]).digest(), data[end : end + _SLOT_DIGEST]):
        return None
    try:
        heads = json.loads(data[_SLOT_HEADER.size : end].decode())
    except ValueError:
        return None
    return (generation, heads) if isinstance(heads, dict) else None


HEAD_DURABLE_SLOTS = 2  # slots A and B: written in place, each write fdatasync'd before the flock is released
HEAD_LAZY_SLOT = 2  # slot C, after them (HeadSync.USE): a grant's head, written without a sync


def _is_slot_size(size):
    """Slot sizes are HEAD_SLOT_BYTES times a power of two (``_slot_size_for``): so a file of two slots (a power
    of two pages) and one of three (three times one) never have the same length."""
    pages, rest = divmod(size, HEAD_SLOT_BYTES)
    return rest == 0 and pages >= 1 and pages & (pages - 1) == 0


class _HeadState:
    """A head file's content as parsed: the heads (of the newest intact slot), and where the next in-place write goes
    (``slot_size`` None: an old JSON file). ``count``: the file's slots (2, or 3 with slot C); ``durable``: the index
    of the newest intact slot among A and B (None if neither is), whose heads are ``durable_heads`` and generation
    ``durable_generation``: what the file holds durably, where slot C may hold more, not yet synced."""

    __slots__ = (
        "heads",
        "slot_size",
        "generation",
        "newest",
        "count",
        "durable",
        "durable_heads",
        "durable_generation",
    )

    def __init__(
        self,
        heads,
        slot_size=None,
        generation=0,
        newest=None,
        count=HEAD_DURABLE_SLOTS,
        durable=None,
        durable_heads=None,
        durable_generation=0,
    ) -> None:
        self.heads, self.slot_size, self.generation, self.newest = heads, slot_size, generation, newest
        self.count, self.durable = count, durable
        self.durable_heads = heads if durable_heads is None else durable_heads
        self.durable_generation = generation if durable_heads is None else durable_generation


def _parse_head_file(data, path, old_form=False):
    """A head file's bytes -> _HeadState; KeyFileError if no slot is intact. The JSON form of older versions is read
    only with ``old_form`` (``sage ledger upgrade``, which rewrites it: ``HeadFile.upgrade_form``); otherwise it is
    refused with ``LedgerUpgradeNeeded`` naming the command."""
    if data[:1] == b"{":  # written by sage before the two-slot form: one JSON map, replaced atomically
        if not old_form:
            raise LedgerUpgradeNeeded(
                f"head file {path} is in the JSON form of an older sage-tfx: nothing was written; upgrade it once "
                f"with: sage ledger upgrade --db LEDGER --key-file {path.removesuffix('.head')} (its ledger's "
                "location), then retry"
            )
        try:
            heads = json.loads(data.decode())
            if not isinstance(heads, dict):
                raise ValueError("not a map")
        except ValueError:
            raise KeyFileError(f"head file {path} is malformed (not the JSON sage writes)") from None
        return _HeadState(heads)
    slots, slot_size, count = [], None, HEAD_DURABLE_SLOTS
    for count in (HEAD_DURABLE_SLOTS, HEAD_DURABLE_SLOTS + 1):  # A and B; or A, B and C (HeadSync.USE)
        slot_size = len(data) // count
        if len(data) == count * slot_size and _is_slot_size(slot_size):
            slots = [(_parse_slot(data[i * slot_size : (i + 1) * slot_size], slot_size), i) for i in range(count)]
            slots = [(slot[0], i, slot[1]) for slot, i in slots if slot is not None]
            break
    if not slots:
        raise KeyFileError(
            f"head file {path} is malformed ({len(data)} bytes and no intact slot: not a head file "
            "sage writes); restore it from backup, or move it away and audit (the audit will say the "
            "ledger has no head record)"
        )
    generation, newest, heads = max(slots)
    durable = [slot for slot in slots if slot[1] < HEAD_DURABLE_SLOTS]
    durable_generation, durable_index, durable_heads = max(durable) if durable else (0, None, {})
    return _HeadState(heads, slot_size, generation, newest, count, durable_index, durable_heads, durable_generation)
