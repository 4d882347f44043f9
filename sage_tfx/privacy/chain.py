"""The ledger's hash-chained log: canonical bodies and the chain's constants (docs/security.md; paper §3.2).

Shared by the ledger, which appends entries, and the audit, which re-verifies them, so neither imports the
other. The KEYED chain value of an entry is ``KeyRing.chain_value`` (``keys.py``); ``chain_hash`` is the
UNKEYED chain of ledgers written before the key migration, kept to verify their old entries.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any

GENESIS = "0" * 64  # the ``prev`` of the first log entry
TRUSTED_READ = "trusted_read"  # the kind of the entry trusted code writes before it decrypts blocks outside a grant


def json_text(*, sort_keys: bool = False, separators: tuple = (", ", ": ")) -> Callable[[Any], str]:
    """``json.dumps(obj, sort_keys=sort_keys, separators=separators)`` as a function of ``obj``, character for
    character, at a fraction of its cost on the ledger's hot path (a grant's body, its spent vectors).

    json.dumps with arguments builds a JSONEncoder on every call (about 2 us, as much as encoding a grant's short
    texts), and ``encode`` builds its C encoder on every call of a map, list or tuple (another 1-2 us): both are
    built once here, the C encoder with the arguments ``iterencode`` passes it, except ``markers``: None, not a fresh
    {} per call (no check for a container holding itself, which no ledger text does; that one recursion would end in
    a RecursionError instead of a ValueError). Without the C encoder (another Python implementation): ``encode``."""
    encoder = json.JSONEncoder(sort_keys=sort_keys, separators=separators)
    make = json.encoder.c_make_encoder  # type: ignore[attr-defined]  # CPython's C encoder, checked below
    fast = (
        make(
            None,
            encoder.default,
            json.encoder.encode_basestring_ascii,
            None,
            separators[1],
            separators[0],
            sort_keys,
            False,
            True,
        )
        if make is not None
        else None
    )

    def text(obj) -> str:
        if fast is not None and type(obj) in (dict, list, tuple):
            return "".join(fast(obj, 0))
        return encoder.encode(obj)

    return text


_CANONICAL = json_text(sort_keys=True, separators=(",", ":"))


def canonical(obj: Any) -> str:
    """The one JSON text of ``obj`` that is signed, chained and stored: sorted keys, no spaces (``json.dumps(obj,
    sort_keys=True, separators=(",", ":"))``, character for character; tests/privacy/test_ledger_request_reads.py)."""
    return _CANONICAL(obj)


def chain_hash(prev: str, seq: int, kind: str, body_text: str) -> str:
    """The UNKEYED chain of ledgers before the key migration (kept to verify their old entries)."""
    return hashlib.sha256(f"{prev}|{seq}|{kind}|{body_text}".encode()).hexdigest()
