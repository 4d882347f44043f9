"""Resuming from the ledger: a pipeline's past read back from its grants, nothing kept outside the ledger.

``held`` is the one read every resuming driver makes (the Sage iterator's ``run``, ``ScheduledPipeline``, a release
session): the pipeline's grants on the stream in charge order, each with its recorded outcome, filtered by the driver's
own rule. ``ReplayingLedger`` replays a release strategy's held one-block grants instead of charging them again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from .split import RECORDS_KEY, SPLIT_KEY

if TYPE_CHECKING:
    from .blocks import Block
    from .grants import Grant, Release
    from .ledger import Ledger
    from .streams import Stream


class Held(NamedTuple):
    """A grant the pipeline holds, with its recorded outcome and details (None while running or killed)."""

    grant: Any
    outcome: str | None
    details: dict | None


def held(ledger: Ledger, stream: str, pipeline: str, keep: Callable[[Any], bool] | None = None) -> list[Held]:
    """The grants ``pipeline`` holds on ``stream`` (``Ledger.history``: charge order) that ``keep`` accepts (all
    when None), each with its outcome: what a restart resumes from."""
    return [
        Held(g, outcome, details) for g, outcome, details in ledger.history(stream, pipeline) if keep is None or keep(g)
    ]


def meta_diff(signed: dict, ours: dict) -> list[str]:
    """The keys where a grant's signed meta and a run's meta differ; ``split`` and ``records`` are the ledger's own
    additions (the split derived from epsilon and validation_epsilon, which are compared; the record split signed
    with it)."""
    keys = sorted((set(signed) | set(ours)) - {SPLIT_KEY, RECORDS_KEY})
    return [k for k in keys if signed.get(k) != ours.get(k)]


class ReplayingLedger:
    """The ledger a resumed release strategy charges through: ``request`` of the one block of a grant in
    ``previous`` ({block: grant}, the pipeline's held grants, checked by the caller to match the strategy) returns
    that grant as the ledger verifies it -- no new charge -- and notes the block in ``replayed``; every other
    request is charged by the ledger. ``release`` re-opens the same computation and ``private_seed`` gives the same
    noise, so a replayed block releases what it released before."""

    def __init__(self, ledger: Ledger, previous: dict) -> None:
        self.ledger, self.previous = ledger, dict(previous)
        self.replayed: set = set()

    def request(self, pipeline: str, stream: str, blocks: Sequence[str] | str | None = None, **kwargs: Any) -> Grant:
        if blocks and len(blocks) == 1 and blocks[0] in self.previous:
            grant = self.previous[blocks[0]]
            if meta_diff(grant.meta, kwargs.get("meta") or {}) or grant.pipeline != pipeline or grant.stream != stream:
                raise RuntimeError(f"grant {grant.id} does not match the resumed strategy")  # checked up front
            self.replayed.add(blocks[0])
            return self.ledger.verify(grant)
        return self.ledger.request(pipeline, stream, blocks=blocks, **kwargs)

    def release(self, *args: Any, **kwargs: Any) -> Release:
        return self.ledger.release(*args, **kwargs)

    def private_seed(self, *args: Any, **kwargs: Any) -> int:
        return self.ledger.private_seed(*args, **kwargs)

    def verify(self, *args: Any, **kwargs: Any) -> Grant:
        return self.ledger.verify(*args, **kwargs)

    def blocks(self, *args: Any, **kwargs: Any) -> list[Block]:
        return self.ledger.blocks(*args, **kwargs)

    def stream(self, *args: Any, **kwargs: Any) -> Stream:
        return self.ledger.stream(*args, **kwargs)

    def block_digest(self, *args: Any, **kwargs: Any) -> str | None:
        return self.ledger.block_digest(*args, **kwargs)

    def get_grant(self, *args: Any, **kwargs: Any) -> Grant:
        return self.ledger.get_grant(*args, **kwargs)
