"""The confined side of the grant channel: a ledger stand-in that asks the launcher's grant server.

A pipeline run in a confined child (``sage_tfx.pipelines.confined``) holds no key and no ledger. Its components'
``ledger`` execution parameter is ``ADDRESS``; ``components._grant._connection`` then hands them ``GrantClient``,
which answers the few ``Ledger`` calls the grant door makes (``verify``, ``blocks``, ``block_digest``,
``keyring.block_key``, ``release``, ``private_seed``) and ``released_record_count`` by asking the server over the
socket the launcher passed (file descriptor ``$SAGE_GRANT_FD``). The server (``components._grant_server``) checks
every request against the ledger and the ONE grant of the iteration it serves; whatever else is asked is refused.

Messages are JSON (``send_bytes``), never pickles, both ways: a child cannot make the launcher run code.
"""

from __future__ import annotations

import base64
import json
import os
import threading
from multiprocessing.connection import Connection

from sage_tfx.privacy import Grant, GrantError, LedgerError
from sage_tfx.privacy.errors import StorageError

ADDRESS = "sage-grant://launcher"  # the `ledger` execution parameter of a confined run (the same in every run)
FD_ENV = "SAGE_GRANT_FD"
MAX_MESSAGE = 64 << 20

# What a server's refusal becomes in the child, by the kind the server names (anything else: RuntimeError).
_ERRORS = {"grant": GrantError, "ledger": LedgerError, "storage": StorageError}


class _Keys:
    """``ledger.keyring`` of a ``GrantClient``: ``block_key`` for the granted blocks only."""

    def __init__(self, client):
        self._client = client

    def block_key(self, stream: str, block: str) -> bytes:
        return base64.b64decode(self._client.call("block_key", stream=stream, block=block))


class _Block:
    def __init__(self, block_id):
        self.id = block_id


class GrantClient:
    """The ledger, as a confined child may use it: through the launcher's grant server, for one grant."""

    def __init__(self, connection: Connection):
        self._connection, self._lock = connection, threading.Lock()
        self.keyring = _Keys(self)

    def call(self, op: str, **args):
        """Send request ``op`` and return the server's answer; the server's refusal raised as its kind of error."""
        with self._lock:
            self._connection.send_bytes(json.dumps({"op": op, **args}).encode())
            reply = json.loads(self._connection.recv_bytes(MAX_MESSAGE))
        if "error" in reply:
            error = reply["error"]
            if error.get("kind") == "os":
                raise OSError(error.get("errno"), error.get("message"))
            raise _ERRORS.get(error.get("kind"), RuntimeError)(error.get("message"))
        return reply.get("ok")

    # ---------------------------------------------------------------- the Ledger calls of the grant door
    def verify(self, grant, stream=None, epsilon=None, delta=None) -> Grant:
        text = grant.to_json() if isinstance(grant, Grant) else grant
        return Grant.from_json(self.call("verify", grant=text, stream=stream, epsilon=epsilon, delta=delta))

    def blocks(self, stream, state=None) -> list:
        """The granted blocks registered in ``stream`` (the only blocks a confined run may know of)."""
        return [_Block(b) for b in self.call("blocks", stream=stream)]

    def block_digest(self, stream, block):
        return self.call("block_digest", stream=stream, block=block)

    def release(self, grant, stage, computation, epsilon, delta=0.0, per_unit=None):
        return self.call(
            "release",
            grant=grant.id,
            stage=stage,
            computation=computation,
            epsilon=epsilon,
            delta=delta,
            per_unit=per_unit,
        )

    def private_seed(self, grant_id, purpose) -> int:
        return int(self.call("private_seed", grant=grant_id, purpose=purpose))

    def private_row_count(self, stream, block):
        raise GrantError(
            "a confined pipeline gets no exact row count: ask for released_record_count (the grant's DP count) instead"
        )

    def released_record_count(self, grant):
        """The grant's DP record count (value, epsilon), released by the server; None without a count stage."""
        answer = self.call("released_record_count", grant=grant.id)
        return None if answer is None else (float(answer[0]), float(answer[1]))

    # ---------------------------------------------------------------- the child's side of the run
    def job(self) -> dict:
        """What the launcher asks this child to do (``sage_tfx.pipelines.confined``)."""
        return self.call("job")

    def report(self, result: dict) -> None:
        """Send the child's result (its last message)."""
        self.call("result", result=result)

    def close(self):
        pass  # shared by every component of the run: the socket closes when the child exits


_CLIENT = None


def channel_client() -> GrantClient:
    """This process's ``GrantClient`` over the socket ``$SAGE_GRANT_FD`` (made once); GrantError if there is none."""
    global _CLIENT
    if _CLIENT is None:
        fd = os.environ.get(FD_ENV)
        if not fd or not fd.isdigit():
            raise GrantError(
                f"ledger {ADDRESS!r} is the grant server of a confined run, and this process has none "
                f"(no {FD_ENV}): give the ledger's location"
            )
        _CLIENT = GrantClient(Connection(int(fd)))
    return _CLIENT
