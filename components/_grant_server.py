"""The launcher's side of the grant channel: it serves one confined run ONE grant, checked against the ledger.

``GrantServer.serve`` answers a confined child's JSON requests (never pickles) until the child closes the
socket; every answer is the ledger's, for the served grant only, and nothing else is served: no other grant,
registration or exact count.

The requests it answers: docs/security.md, "User code runs without the key".
"""

from __future__ import annotations

import base64
import json

from sage_tfx.components import _grant
from sage_tfx.components._grant_channel import MAX_MESSAGE
from sage_tfx.ingest.access import grant_block_keys
from sage_tfx.privacy import Grant, GrantError, Ledger, LedgerError
from sage_tfx.privacy.errors import StorageError
from sage_tfx.privacy.grants import registered_blocks
from sage_tfx.privacy.vocabulary import Stage


class GrantServer:
    """Serves ``job`` to one confined child, and, given ``grant`` (a verified grant of the ledger at
    ``location``), that grant's door. ``opened``: the stages whose release the child opened; ``result``: the
    child's last message (None if it ended without one)."""

    def __init__(self, job: dict, location=None, grant: Grant | None = None):
        self.job, self.location, self.served = job, location, grant
        self.ledger, self.grant, self._keys = None, None, None
        self.opened, self.result = set(), None

    def serve(self, connection) -> dict | None:
        """Answer requests until the child closes its end; return its result. The ledger is closed at the end."""
        try:
            while True:
                try:
                    request = json.loads(connection.recv_bytes(MAX_MESSAGE))
                except (EOFError, OSError):
                    return self.result
                except (ValueError, UnicodeDecodeError):
                    request = {}
                try:
                    reply = {"ok": self._answer(request)}
                except Exception as exc:  # a refusal, or the ledger's own error: the child gets its kind and text
                    reply = {"error": _error(exc)}
                connection.send_bytes(json.dumps(reply).encode())
        finally:
            if self.ledger is not None:
                self.ledger.close()

    def _answer(self, request):
        op = request.get("op") if isinstance(request, dict) else None
        if op == "job":
            return self.job
        if op == "result":
            self.result = request.get("result") if isinstance(request.get("result"), dict) else {}
            return None
        handler = _OPS.get(op)
        if handler is None:
            raise GrantError(f"the grant server has no request {op!r}")
        if self.served is None:
            raise GrantError("this confined run has no grant: it may read no data")
        self._open()
        return handler(self, request)

    def _open(self):
        if self.ledger is None:
            self.ledger = Ledger.open(self.location)
            self.grant = _grant.verify_grant(self.ledger, self.served.to_json())

    def _granted(self, request, key="grant"):
        if request.get(key) not in (self.grant.id, self.grant.to_json()):
            raise GrantError(f"this run is served grant {self.grant.id!r} only, not {str(request.get(key))[:80]!r}")

    def _granted_block(self, request):
        if request.get("stream") != self.grant.stream or request.get("block") not in self.grant.blocks:
            raise GrantError(
                f"block {request.get('block')!r} of stream {request.get('stream')!r} is not granted to "
                f"this run (grant {self.grant.id!r})"
            )
        return request["block"]

    def _verify(self, request):
        text = request.get("grant")
        if not isinstance(text, str) or Grant.from_json(text).id != self.grant.id:
            raise GrantError(f"this run is served grant {self.grant.id!r} only")
        return self.ledger.verify(
            text, stream=request.get("stream"), epsilon=request.get("epsilon"), delta=request.get("delta")
        ).to_json()

    def _blocks(self, request):
        if request.get("stream") != self.grant.stream:
            raise GrantError(f"this run is granted blocks of stream {self.grant.stream!r} only")
        return registered_blocks(self.ledger, self.grant)

    def _block_digest(self, request):
        return self.ledger.block_digest(self.grant.stream, self._granted_block(request))

    def _block_key(self, request):
        block = self._granted_block(request)
        if self._keys is None:  # the key door: the grant re-verified, every block registered
            _, self._keys = grant_block_keys(self.ledger, self.grant)
        return base64.b64encode(self._keys[block]).decode()

    def _release(self, request):
        self._granted(request)
        stage = request.get("stage")
        if stage not in _grant.SEED_PURPOSES:
            raise GrantError(f"stage {stage!r} is unknown: one of {', '.join(_grant.SEED_PURPOSES)}")
        self.ledger.release(
            self.grant,
            stage,
            request.get("computation"),
            request.get("epsilon"),
            request.get("delta") or 0.0,
            per_unit=request.get("per_unit"),
        )
        self.opened.add(stage)

    def _private_seed(self, request):
        self._granted(request)
        allowed = {_grant.SEED_PURPOSES[stage] for stage in self.opened}
        if request.get("purpose") not in allowed:
            raise GrantError(
                f"no seed for {request.get('purpose')!r}: open the stage's release first (this run "
                f"opened {', '.join(sorted(self.opened)) or 'none'})"
            )
        return str(self.ledger.private_seed(self.grant.id, request["purpose"]))

    def _released_record_count(self, request):
        self._granted(request)
        released = _grant.released_record_count(self.ledger, self.grant)
        if released is not None:
            self.opened.add(Stage.COUNT)
        return released


_OPS = {
    "verify": GrantServer._verify,
    "blocks": GrantServer._blocks,
    "block_digest": GrantServer._block_digest,
    "block_key": GrantServer._block_key,
    "release": GrantServer._release,
    "private_seed": GrantServer._private_seed,
    "released_record_count": GrantServer._released_record_count,
}


def _error(exc) -> dict:
    """A refusal as the child may see it: its kind (``grant``, ``ledger``, ``storage``, ``os``, else ``other``)
    and message (the ledger's own messages hold no record value)."""
    if isinstance(exc, GrantError):
        kind = "grant"
    elif isinstance(exc, StorageError):
        kind = "storage"
    elif isinstance(exc, LedgerError):
        kind = "ledger"
    elif isinstance(exc, OSError):
        return {"kind": "os", "errno": exc.errno, "message": exc.strerror or str(exc)}
    else:
        return {"kind": "other", "message": type(exc).__name__}
    return {"kind": kind, "message": str(exc)}
