"""Ledger errors. Every one names the bad value; none leaves the ledger changed.

``LedgerError`` (a ValueError) is bad input: the CLI exits 2. ``BudgetRefused``
is a well-formed request that the budget cannot cover: the CLI exits 3.
``SageError`` is the root of them all, and of every other error sage-tfx raises on purpose.
"""

from __future__ import annotations

import errno
from collections.abc import Mapping
from typing import Any


class SageError(Exception):
    """The root of every error sage-tfx raises on purpose; ``except SageError`` catches them all.

    Each sage-tfx error also keeps the built-in base it had before this root existed (most are
    ``ValueError``s, ``BudgetRefused`` is not), so ``except ValueError`` catches what it caught before.
    """


class LedgerError(SageError, ValueError):
    """Bad input or an unusable ledger."""


class LedgerNotFound(LedgerError):
    """No ledger exists at the given location."""


class LedgerCorrupt(LedgerError):
    """The ledger file or database is corrupt, truncated, or not a sage ledger."""


class LedgerUpgradeNeeded(LedgerError):
    """The ledger was written by an older sage-tfx (schema or key layout): ``sage ledger upgrade`` brings it to
    this version (``migrations.py``); nothing else migrates it."""


class LedgerRollback(LedgerError):
    """The database does not match the head file outside it: rolled back, cut, re-identified or replaced
    (``anchor.py``)."""


class UnknownStream(LedgerError):
    pass


class UnknownBlock(LedgerError):
    pass


class BlockRetired(LedgerError):
    """A request named a block whose budget is exhausted; retired blocks are never offered again."""


class DuplicateContent(LedgerError):
    """A new block's records (its content digest) are already registered in another stream."""


class PipelineBusy(LedgerError):
    """A pipeline name is already being run by another process (``Ledger.claim``): pick another name or wait."""


class RefusedBeforeCharge(LedgerError):
    """Bad input found by a check that runs right before a charge (a block the run would read is missing or
    altered, ``SageIterator``'s ``check_blocks``): nothing was charged for it."""


class GrantError(LedgerError):
    """A grant is missing, unknown, forged, of another stream, or was never charged."""


class BudgetRefused(SageError):
    """The request is valid but some blocks lack the budget. Nothing was charged.

    ``shortfalls`` maps each refused block id to what it lacked.
    """

    def __init__(self, stream: str, pipeline: str, shortfalls: Mapping[str, str]) -> None:
        self.stream = stream
        self.pipeline = pipeline
        self.shortfalls = dict(shortfalls)
        lines = "; ".join(f"{block}: {why}" for block, why in sorted(self.shortfalls.items()))
        super().__init__(
            f"refused: pipeline {pipeline!r} on stream {stream!r}: "
            f"{len(self.shortfalls)} block(s) lack budget ({lines})"
        )

    def __reduce__(self) -> tuple[Any, ...]:  # pickles across processes (sage serve workers, Beam)
        return (type(self), (self.stream, self.pipeline, self.shortfalls), self.__dict__)


class RecordError(SageError, ValueError):
    """A data-dependent failure after a grant was charged, named by its column only: NEVER a record's value,
    index or an exact count.

    A release that fails because of one record's value, with that value in its message, reveals the
    record (docs/growing_database.md); its index (where it sits among what was read) or a count of records is
    data too. Code that reads records under a grant maps non-finite values to public defaults instead of
    failing; where it must fail, it raises this, whose message holds only the column and a fixed description
    of the problem (``problem`` must hold no value or count). ``index`` is accepted for the callers' signature
    and dropped. It is the one error type whose message the ledger's append-only log records for a FAILED run
    (others: the type only).
    """

    def __init__(self, column: str | None, index: int | None, problem: str) -> None:
        self.column, self.index, self.problem = str(column), None, str(problem)
        super().__init__(f"column {self.column!r}: {self.problem}")

    def __reduce__(self) -> tuple[Any, ...]:  # pickles across processes (sage serve workers, Beam)
        return (type(self), (self.column, self.index, self.problem), self.__dict__)


def error_chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and the errors it was raised while handling (``__cause__``, else ``__context__``), newest first:
    the last one is where the failure began (TFX's runners raise a clean-up error while handling a module's).

    Args:
      exc: The error.

    Returns:
      The chain, newest first.
    """
    chain, seen = [exc], {id(exc)}
    while True:
        nxt = chain[-1].__cause__ or chain[-1].__context__
        if nxt is None or id(nxt) in seen:
            return chain
        chain.append(nxt)
        seen.add(id(nxt))


def public_error_text(exc: BaseException) -> str:
    """What may be logged or shown about ``exc`` after a grant: its type, and its message only when the
    message is known to hold no data value (``RecordError``, the ledger's own errors, ``BudgetRefused``).
    When ``exc`` was raised while handling another error, the first error is named (where it began), then
    ``exc`` (e.g. ``TypeError (...), then NotFoundError while handling it``): types only, as above. A confined
    child's error (``ConfinedRunError``) carries the text the child made by this same rule.

    Args:
      exc: The error.

    Returns:
      The text that may be shown.
    """
    if isinstance(exc, ConfinedRunError):
        return exc.public

    def text(error):
        if isinstance(error, (RecordError, LedgerError, BudgetRefused)):
            return f"{type(error).__name__}: {error}"
        return f"{type(error).__name__} (message withheld: it may hold data values)"

    first = error_chain(exc)[-1]
    if first is exc or type(first) is type(exc):
        return text(exc)
    return f"{text(first)}, then {type(exc).__name__} while handling it"


class ConfinedRunError(SageError):
    """A pipeline run in a confined child process (``sage_tfx.pipelines.confined``) failed: the child classified its
    error and sent only its public parts, so the launcher reports it as it would the error itself.

    ``public``: ``public_error_text`` of the child's error; ``environment``: ``is_environment_error`` of it, with
    ``environment_text`` its ``environment_error_text``; ``detail``: the whole error with its traceback, sent
    only by a ``--check`` child (generated rows), else None. The message is ``detail`` or ``public``."""

    def __init__(
        self, public: str, environment: bool = False, environment_text: str = "", detail: str | None = None
    ) -> None:
        super().__init__(detail or public)
        self.public, self.environment = str(public), bool(environment)
        self.environment_text, self.detail = str(environment_text or public), detail

    def __reduce__(self):  # pickles with its classification (the default would keep the message only)
        return type(self), (self.public, self.environment, self.environment_text, self.detail)


class StorageError(SageError):
    """A stored file could not be used as written (missing, altered, unreadable): the environment's fault, not the
    data's. Its message names the file and the fix and holds no record's value (sage-tfx writes it)."""


# The errors of TensorFlow's file layer and of MLMD's store (same names: both carry absl status codes) for a
# missing, unreadable or full filesystem, by module and name (the privacy core imports neither)
_STATUS_MODULES = ("tensorflow", "ml_metadata")
_STATUS_ERRORS = (
    "NotFoundError",
    "PermissionDeniedError",
    "ResourceExhaustedError",
    "InternalError",
    "UnavailableError",
    "DataLossError",
    "AlreadyExistsError",
)


def is_environment_error(exc: BaseException) -> bool:
    """Whether ``exc`` is an error of the environment that re-running after fixing it cures, not of the data: an
    ``OSError`` (a missing folder, a permission, ENOSPC), a ``StorageError`` (a block file missing or altered),
    TensorFlow's file layer's or MLMD's NotFoundError, PermissionDeniedError, ResourceExhaustedError,
    InternalError, UnavailableError, DataLossError or AlreadyExistsError (MLMD's SQLite file on a full disk), or
    the RuntimeError Beam re-raises a step's error as when it cannot rebuild its type. Every exception it was
    raised while handling (its ``__context__`` and ``__cause__`` chain) must be one too: TFX's clean-up after a
    failed ``run_fn`` raises an OSError (a NotFoundError) while handling the user's error, which may depend on
    the data."""
    if isinstance(exc, ConfinedRunError):
        return exc.environment
    seen = set()
    link: BaseException | None = exc
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        if not (_beam_reraise(link) or isinstance(link, (OSError, StorageError)) or _status_error(link)):
            return False
        link = link.__cause__ or link.__context__
    return True


def _beam_reraise(exc: BaseException) -> bool:
    """The RuntimeError ``apache_beam.runners.common.DoFnRunner._reraise_augmented`` raises for a step's error
    whose type it cannot rebuild (an OSError among them), while handling that error."""
    return isinstance(exc, RuntimeError) and getattr(exc, "_tagged_with_step", False) and exc.__context__ is not None


def _status_error(exc: BaseException) -> bool:
    kind = type(exc)
    return kind.__module__.split(".")[0] in _STATUS_MODULES and kind.__name__ in _STATUS_ERRORS


class IterationInterrupted(SageError):
    """An environment error (``is_environment_error``) stopped a pipeline run after its charge. No outcome is
    recorded: the grant stays in use, as after a kill, and the next run of the pipeline resumes it without a new
    charge once the cause is fixed. The message holds the error's public part (``environment_error_text``) and
    the grant id."""


def environment_error_text(exc: BaseException) -> str:
    """What may be shown of an environment error (``is_environment_error``): an OSError's errno and its
    strerror, a StorageError's message (sage-tfx's own: a path and the fix), the type and its package only
    otherwise (a TensorFlow or MLMD message may quote what user code passed it)."""
    if isinstance(exc, ConfinedRunError):
        return exc.environment_text
    context = exc.__context__
    if _beam_reraise(exc) and context is not None:  # _beam_reraise needs a context: it is there
        return environment_error_text(context)
    name = type(exc).__name__
    if isinstance(exc, StorageError):
        return f"{name}: {exc}"
    if isinstance(exc, OSError) and exc.errno is not None:
        return f"{name}: {errno.errorcode.get(exc.errno, exc.errno)} ({exc.strerror})"
    return f"{type(exc).__module__.split('.')[0]} {name} (message withheld: it may hold data values)"
