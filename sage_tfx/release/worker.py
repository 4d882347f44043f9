"""`sage serve --release`'s participant: a release strategy's session in its own worker process.

``ReleaseSpec`` names the strategy and carries its checked settings (picklable); ``release_worker_main`` is the
function its worker process runs (spawn) under ``sage_tfx.adaptive.workers.ProcessPlatform``: the same
``open_release`` / ``ReleaseSession.advance`` as `sage release`, advanced after every replay step (docs/
release_strategies.md, "From sage serve / sage run"). Killed, it is restarted and resumes under its grants.
"""

import dataclasses
import os
from dataclasses import dataclass

from sage_tfx.adaptive.workers import BlockWaiter, WorkerResult, die
from sage_tfx.privacy import public_error_text
from sage_tfx.privacy.keys import ENV_KEY_FILE

from .session import SessionStatus, open_release
from .settings import ReleaseSettings


@dataclass
class ReleaseSpec:
    """A release strategy's worker (`sage serve --release`): its name, strategy, settings (its ``db``, ``stream``,
    ``data_root`` and ``pipeline`` included) and the stream's schema for a data root that holds none yet
    (picklable: names and numbers only)."""

    name: str
    strategy: str
    settings: ReleaseSettings
    schema: dict | None = None
    key_file: str | None = None
    source: str = ""  # the --release value, for messages

    def entry(self):
        """The function this participant's worker process runs."""
        return release_worker_main


def check_release(spec: ReleaseSpec, schema: dict) -> None:
    """Every check of ``open_release`` (the columns, the parameters, the pipeline's previous grants) on ``schema``;
    nothing is charged. ValueError naming the bad value."""
    try:
        session = open_release(spec.settings, schema=schema, claim=False)  # serve holds the claim
    except ValueError as exc:
        raise ValueError(f"{spec.source}: {exc}") from None
    session.ledger.close()


def release_worker_main(spec: ReleaseSpec, conn) -> None:
    """A release strategy's worker process (``ReleaseSpec``): its session, advanced after every replay step until
    the stream ends. Module level (spawn)."""
    if spec.key_file:
        os.environ[ENV_KEY_FILE] = spec.key_file
    waiter = BlockWaiter(conn)

    def say(line):
        conn.send(("progress", f"[{spec.name}] {line}"))

    try:
        settings = dataclasses.replace(spec.settings, progress=say)
        session = open_release(settings, schema=spec.schema, claim=False)  # the parent holds the claim
        try:
            while True:
                status = session.advance()
                if status != SessionStatus.OK:
                    why = (
                        "the budget refused a block's charge (nothing charged for it)"
                        if status == SessionStatus.REFUSED
                        else "a block failed after its charge"
                    )
                    conn.send(("failed", f"{why}; {session.observed} block(s) released before it ({status})"))
                    conn.close()
                    return
                if not waiter.wait(3600.0):
                    break
            summary = session.summary
        finally:
            session.close()
    except Exception as exc:
        die(conn, spec.name, public_error_text(exc))
    conn.send(
        (
            "done",
            WorkerResult(
                "RELEASED",
                summary["charged_blocks"] + summary["resumed_blocks"],
                f"{spec.strategy}: {summary['charged_blocks']} block(s) charged and released, "
                f"{summary['resumed_blocks']} resumed without a charge",
            ),
        )
    )
    conn.close()
