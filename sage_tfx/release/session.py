"""A release session: one release strategy on one ledger and stream, advanced as blocks arrive.

``open_release(settings)`` does every check before any charge (the stream, the schema's columns, the parameters, the
pipeline's previous grants) and returns a ``ReleaseSession``; ``advance()`` releases every block not yet observed.
`sage release` advances once; a `sage serve --release` worker (``sage_tfx.release.worker``) after every replay step --
one code path (docs/release_strategies.md, "Restart" and "From sage serve / sage run").
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any

from sage_tfx.ingest.layout import stream_config
from sage_tfx.privacy import Ledger
from sage_tfx.privacy.errors import BudgetRefused, SageError
from sage_tfx.privacy.resume import ReplayingLedger, held, meta_diff

from .settings import ReleaseInputError, ReleaseSettings


class SessionStatus(enum.StrEnum):
    """Where a session stands: OK while it can go on; REFUSED once the budget refused a block's charge (nothing
    charged for it); FAILED once a block failed after its charge (the charge stays spent). The CLI maps each to its
    exit code."""

    OK = "ok"
    REFUSED = "refused"
    FAILED = "failed"


class Plan:
    """What a strategy's plan (``sage_tfx.release.plans``) returns, every check done and nothing charged: the
    summary it fills, ``observe(block)`` (the strategy's step: charge, then read), ``emit(block, output, replayed)``
    (the block's line and summary entry; a SessionStatus if it failed after the charge, else None), the replaying ledger
    and the previous grants {block: grant} (``resume``); ``limit``: the most blocks the charge covers (a horizon),
    or None; ``finalize()``: the summary's last fields."""

    def __init__(
        self,
        summary: dict,
        observe: Callable,
        emit: Callable,
        replaying: ReplayingLedger,
        previous: dict,
        *,
        limit: int | None = None,
        finalize: Callable[[], Any] | None = None,
    ):
        self.summary, self.observe, self.emit = summary, observe, emit
        self.replaying, self.previous, self.limit, self.finalize = replaying, dict(previous), limit, finalize


def previous_grants(ledger, settings: ReleaseSettings, strategies: set, meta: dict) -> dict:
    """The grants of this pipeline on this stream, in charge order, {block: grant}; ReleaseInputError unless every
    one is a one-block grant of this strategy with exactly these parameters."""
    previous = {}
    for g, _, _ in held(ledger, settings.stream, settings.pipeline):
        mismatch = None
        if len(g.blocks) != 1 or g.meta.get("strategy") not in strategies:
            mismatch = f"grant {g.id} is not a {'/'.join(strategies)} grant (strategy {g.meta.get('strategy')!r})"
        else:
            diff = meta_diff(g.meta, meta)
            if diff:
                mismatch = (
                    "its grants were charged with "
                    + ", ".join(f"{k}={g.meta.get(k)!r}" for k in diff)
                    + ", this run asks for "
                    + ", ".join(f"{k}={meta.get(k)!r}" for k in diff)
                )
        if mismatch:
            raise ReleaseInputError(
                f"--pipeline {settings.pipeline!r} already released on stream "
                f"{settings.stream!r} with other parameters: {mismatch}; rerun with the same "
                "parameters to resume, or give a new --pipeline (its blocks are charged again)"
            )
        previous[g.blocks[0]] = g
    return previous


def resume(ledger, settings: ReleaseSettings, strategies: set, build: Callable, meta: dict | None = None):
    """``build(ledger)`` -> the strategy instance, resumed: (instance on a ``ReplayingLedger``, previous grants
    {block: grant}, the replaying ledger). ``previous_grants`` refuses (before any charge) a pipeline whose grants
    were signed with other parameters than the probe's ``meta``."""
    probe_meta = build(ledger).meta if meta is None else meta
    previous = previous_grants(ledger, settings, strategies, probe_meta)
    replaying = ReplayingLedger(ledger, previous)
    return build(replaying), previous, replaying


def new_summary(
    command: str, strategy: str, settings: ReleaseSettings, params: dict, fingerprint: str, delta: float, **lists
) -> dict:
    """The summary a session fills (`sage release --json` prints it)."""
    return {
        "command": command,
        "strategy": strategy,
        "stream": settings.stream,
        "pipeline": settings.pipeline,
        "epsilon": settings.epsilon,
        "delta": delta,
        "params": params,
        "fingerprint": fingerprint,
        "charged_blocks": 0,
        "resumed_blocks": 0,
        **lists,
    }


def spent_line(grant, replayed: bool) -> str:
    if replayed:
        return f"resumed (grant {grant.id}, nothing charged)"
    return f"charged eps {grant.epsilon:g} delta {grant.delta:g}"


def step(observe: Callable, block: str, warn: Callable[[str], None]):
    """``(observe(block), None)``, or ``(None, status)`` after saying why through ``warn``: REFUSED when the budget
    refused the block (nothing charged), FAILED for any other sage-tfx error (a charge already made stays spent: the
    ledger's rule)."""
    try:
        return observe(block), None
    except BudgetRefused as exc:
        warn(f"error: {exc}")
        return None, SessionStatus.REFUSED
    except SageError as exc:
        warn(f"error: block {block}: {exc}")
        return None, SessionStatus.FAILED


class Walk:
    """The blocks in order, each through ``observe`` (``step``): yields (block, output, replayed) and counts it
    charged or resumed in ``summary``; stops at the first refused / failed block with ``status`` set."""

    def __init__(self, blocks: list, plan: Plan, settings: ReleaseSettings):
        self.blocks, self.plan, self.settings = blocks, plan, settings
        self.status = SessionStatus.OK

    def __iter__(self):
        for block in self.blocks:
            out, failed = step(self.plan.observe, block, self.settings.warn)
            if failed is not None:
                self.status = failed
                return
            replayed = block in self.plan.replaying.replayed
            self.plan.summary["resumed_blocks" if replayed else "charged_blocks"] += 1
            yield block, out, replayed


class ReleaseSession:
    """One release strategy on one ledger and stream: ``advance()`` releases every block not yet observed.

    The first ``advance()`` replays the pipeline's previous grants (no charge, the same noise: a restart); every
    later block is charged its whole bound in ONE grant before it is read. After a block is refused or fails after
    its charge the session stops (the strategy's state is the whole history). Build one with ``open_release``;
    docs/release_strategies.md, "From the command line".

    Args:
        settings: the strategy's settings.
        ledger: the open ``Ledger`` (closed by ``close``).
        plan: the strategy's `Plan` (``sage_tfx.release.plans``), every check done.
    """

    def __init__(self, settings: ReleaseSettings, ledger, plan: Plan):
        self.settings, self.ledger, self.plan = settings, ledger, plan
        self.summary = plan.summary
        self.status = SessionStatus.OK
        self._seen: set = set()  # blocks observed in this session (released or replayed)

    @property
    def observed(self) -> int:
        return len(self._seen)

    def pending(self) -> list:
        """The blocks the next ``advance`` walks: the previous grants' blocks not yet replayed (in charge order),
        then the stream's blocks without a grant of this pipeline (in the ledger's block order)."""
        previous = self.plan.previous
        return [b for b in previous if b not in self._seen] + [
            b.id for b in self.ledger.blocks(self.settings.stream) if b.id not in previous and b.id not in self._seen
        ]

    def _within_limit(self, blocks: list) -> list:
        """``blocks`` up to the plan's horizon; those past it are noted unobserved (never charged), with a warning."""
        limit = self.plan.limit
        if limit is None:
            return blocks
        room = max(0, limit - len(self._seen))
        left = [b for b in blocks[room:] if b not in self.summary["unobserved"]]
        if left:
            self.summary["unobserved"].extend(left)
            self.settings.warn(
                f"warning: horizon {limit} reached: {len(left)} block(s) left unobserved (the charge "
                "covers the horizon only); give a new --pipeline with a new --horizon"
            )
        return blocks[:room]

    def advance(self) -> SessionStatus:
        """Release every pending block; the session's status (OK while it can go on)."""
        if self.status != SessionStatus.OK:
            return self.status
        walk = Walk(self._within_limit(self.pending()), self.plan, self.settings)
        for block, out, replayed in walk:
            self._seen.add(block)
            failed = self.plan.emit(block, out, replayed)
            if failed is not None:
                self.status = failed
                return failed
        self.status = walk.status
        return self.status

    def audit(self) -> bool:
        """Audit the ledger (``Ledger.audit``); its verdict, also in the summary's ``audit_ok``."""
        ok = bool(self.ledger.audit().ok)
        self.summary["audit_ok"] = ok
        return ok

    def close(self) -> None:
        """Fill the summary's last fields and close the ledger."""
        if self.plan.finalize is not None:
            self.plan.finalize()
        self.ledger.close()


def _open(settings: ReleaseSettings, schema: dict | None):
    """The ledger and the stream's schema (``schema`` when the data root holds none yet); ReleaseInputError if
    either is missing (nothing charged)."""
    try:
        ledger = Ledger.open(settings.db)
    except (SageError, OSError, ValueError) as exc:
        raise ReleaseInputError(f"--db {settings.db!r}: {exc}") from None
    try:
        ledger.stream(settings.stream)
    except SageError as exc:
        ledger.close()
        raise ReleaseInputError(f"--stream {settings.stream!r}: {exc}") from None
    config = stream_config(settings.data_root, settings.stream)
    if config is None and schema is not None:
        return ledger, dict(schema)
    if config is None:
        ledger.close()
        raise ReleaseInputError(
            f"--data-root {settings.data_root!r} holds no stream {settings.stream!r}: give the "
            "directory `sage ingest` wrote it to"
        )
    return ledger, dict(config["schema"])


def open_release(settings: ReleaseSettings, *, schema: dict | None = None, claim: bool = True) -> ReleaseSession:
    """The ``ReleaseSession`` of ``settings``, every check done and nothing charged.

    Args:
        settings: the strategy's settings (``sage_tfx.release.settings``).
        schema: the stream's schema when its data root holds none yet (`sage serve` before its first replay step).
        claim: hold the pipeline name for this process (``Ledger.claim``: a name another `sage release`, `sage
            serve` or `sage run` runs is refused); `sage serve` claims its names itself, in the parent.

    Raises:
        ReleaseInputError, SageError or ValueError: bad input, naming the value; the ledger is closed and unchanged.
    """
    from .plans import PLANS  # noqa: PLC0415 (plans imports this module)

    ledger, schema = _open(settings, schema)
    try:
        if claim:
            ledger.claim(settings.stream, [settings.pipeline])
        plan = PLANS[type(settings)](settings, ledger, schema)
    except BaseException:
        ledger.close()
        raise
    return ReleaseSession(settings, ledger, plan)
