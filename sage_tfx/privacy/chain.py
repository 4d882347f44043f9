"""The ledger's hash-chained log: canonical bodies and the chain's constants (docs/security.md; paper §3.2).

Shared by the ledger, which appends entries, and the audit, which re-verifies them, so neither imports the
other. The KEYED chain value of an entry is ``KeyRing.chain_value`` (``keys.py``); ``chain_hash`` is the
UNKEYED chain of ledgers written before the key migration, kept to verify their old entries.
"""
import hashlib
import json

GENESIS = "0" * 64  # the ``prev`` of the first log entry


# json.dumps(obj, sort_keys=True, separators=(",", ":")) builds this encoder anew on every call (about 2 us, as much
# as encoding a grant's short texts); one encoder, built once, gives the same text (json.dumps is its ``encode``).
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"))
# ... and ``encode`` itself builds its C encoder on every call of a map or list (another 1-2 us): this one is built
# once, with the same arguments ``_CANONICAL.iterencode`` passes it, except ``markers``: None, not a fresh {} per
# call (no check for a map or list containing itself, which no ledger text does; that one recursion would end in a
# RecursionError instead of a ValueError). Without the C encoder (another Python implementation): ``_CANONICAL``.
_C_ENCODE = (json.encoder.c_make_encoder(None, _CANONICAL.default, json.encoder.encode_basestring_ascii, None, ":",
                                         ",", True, False, True)
             if json.encoder.c_make_encoder is not None else None)


def canonical(obj) -> str:
    """The one JSON text of ``obj`` that is signed, chained and stored: sorted keys, no spaces (``json.dumps(obj,
    sort_keys=True, separators=(",", ":"))``, character for character; tests/test_ledger_request_reads.py)."""
    if _C_ENCODE is not None and type(obj) in (dict, list):
        return "".join(_C_ENCODE(obj, 0))
    return _CANONICAL.encode(obj)


def chain_hash(prev: str, seq: int, kind: str, body_text: str) -> str:
    """The UNKEYED chain of ledgers before the key migration (kept to verify their old entries)."""
    return hashlib.sha256(f"{prev}|{seq}|{kind}|{body_text}".encode()).hexdigest()
