"""Privacy-adaptive training: Sage's iterator for one pipeline (paper §3.3).

Each iteration charges a grant on the newest window of blocks BEFORE any read, runs the DP pipeline
validated at eta_i = eta / (i (i+1)) and, on RETRY, doubles epsilon or the window. Contract: the eta_i
sum to eta, so the SLA holds across retries; doubling bounds the total at about 4x the ideal budget where
its premises hold (docs/BENCHMARKS.md, "Privacy-adaptive training's budget against the ideal"); a run
resumes an attempt without an outcome under the SAME grant (no new charge). The loop, the cost bound and
resumption: docs/block_composition.md, "Privacy-adaptive training: the iterator".
"""

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from sage_tfx.privacy import BlockRetired, BudgetRefused, BudgetSplit, LedgerError, eval_share_split, public_error_text
from sage_tfx.privacy.checks import number
from sage_tfx.privacy.errors import IterationInterrupted, environment_error_text, is_environment_error
from sage_tfx.privacy.grants import Grant
from sage_tfx.privacy.resume import held
from sage_tfx.privacy.split import RECORDS_KEY
from sage_tfx.privacy.vocabulary import Outcome, PipelineState, Policy
from sage_tfx.validation import eta_for_attempt

from .plan import next_attempt
from .request import (  # noqa: F401 (LOGGED_REQUEST, RequestMismatch, ...: re-exported)
    LOGGED_REQUEST,
    REQUEST_KEY,
    RequestMismatch,
    check_request,
    request_differences,
    stored_request,
)
from .results import OUTCOMES, Iteration, IterationResult, RunResult  # noqa: F401 (OUTCOMES, ...: re-exported)
from .settings import IteratorSettings

# a bad iterator setting: names it, its value and the rule; raised before anything is charged
_SETTING = "{what} {value!r} is invalid: must be {rule}"

DECIDED = (Outcome.ACCEPT, Outcome.REJECT)  # the outcomes that end a pipeline before its TIMEOUT
GRANT_STAYS_SPENT = "its grant stays spent"  # the FAILED line's end (`sage run --check` says whose ledger)


@dataclass
class _Attempts:
    """One ``SageIterator.run``'s state: what it has tried, what the ledger refused, how long it waited."""

    started: float
    epsilon: float
    window: int
    number: int = 1
    iterations: list = field(default_factory=list)
    refused: set = field(default_factory=set)  # (blocks, epsilon) refused in this run: asking again is never useful
    refusals: int = 0
    idle_waits: int = 0
    before_wait: dict | None = None  # the availability read before the last wait, to tell whether it changed
    timed_out: bool = False  # max_refusals reached


class SageIterator:
    """Drive one pipeline to ACCEPT, REJECT or TIMEOUT under the ledger's budget.

    ``run_iteration(grant, split, eta, iteration) -> IterationResult`` runs one
    DP pipeline execution (a TFX run) on the granted blocks only.
    ``wait_for_blocks(timeout) -> bool`` is called when the stream has too few
    blocks with budget; it returns True once new blocks may have arrived (e.g.
    a replay step), False when no more will come (then: TIMEOUT). ``timeout`` is
    the time left before ``max_seconds`` (None without a deadline).

    Each attempt is chosen from a fresh read of this pipeline's availability.
    Conserve asks its current epsilon on the newest ``window`` blocks that each
    offer it. Aggressive asks what the newest ``window`` blocks offering at least
    the stream's ``min_epsilon`` offer together NOW (not the most it was ever
    offered: a later window may offer less, and asking more is refused).

    Termination: ``run`` ends in ACCEPT, REJECT or TIMEOUT after a bounded number
    of steps, also with ``max_seconds=None``, because every pass of its loop does
    one of three things, each bounded:

    1. a charged attempt: at most ``max_iterations`` in all;
    2. a refused one (``BudgetRefused``, or ``BlockRetired``: another writer spent
       between our read and our charge; nothing is charged): the choice, (blocks,
       epsilon), is never asked again in this run, and the ``max_refusals``-th
       refusal ends the run in TIMEOUT;
    3. no choice (too few blocks with budget, an aggressive window under
       ``min_epsilon``, or only choices already refused): wait for blocks; without
       ``wait_for_blocks``, or when it returns False, TIMEOUT. A wait after which
       this pipeline's availability reads exactly as before changed nothing (an
       idle wait); ``max_idle_waits`` idle waits in a row end the run in TIMEOUT.

    So ``ledger.request`` is called at most ``max_iterations + max_refusals`` times,
    and between two calls the loop passes without waiting only to make one. Waits
    are bounded while nothing changes; a wait that changed something (a block
    arrived, another pipeline spent or finished) was paced by that event, so only
    an endless stream can keep a pipeline waiting without end; ``max_seconds``
    bounds that too. Refusals and idle waits are counted per ``run`` (the ledger
    keeps charges, not refusals): a restarted iterator starts both counts afresh.
    """

    def __init__(
        self,
        ledger,
        stream: str,
        pipeline: str,
        run_iteration: Callable,
        *,
        settings: IteratorSettings | None = None,
        wait_for_blocks: Callable | None = None,
        progress: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        request: dict | None = None,
        check_blocks: Callable | None = None,
    ):
        """The iterator of pipeline ``pipeline`` on ``stream``, checked before anything is registered or charged.

        Args:
            ledger: the open ``Ledger``: every grant is charged there before any read.
            stream: the stream's name.
            pipeline: the pipeline's name (its grants, history and outcome in the ledger).
            run_iteration: ``run_iteration(grant, split, eta, iteration) -> IterationResult``: one DP pipeline
                run on the granted blocks only.
            settings: what its run may do (None: the defaults).
            wait_for_blocks: ``wait_for_blocks(timeout) -> bool`` when too few blocks have budget (None: TIMEOUT).
            progress: called with one line per event (None: silent).
            clock: the monotonic clock ``max_seconds`` is measured on.
            request: what the run certifies (``SagePipeline.certificate_request``), signed into each grant.
            check_blocks: ``check_blocks(blocks)`` verifies what a run will read, before each charge.

        Raises:
            LedgerError: an unknown stream, a ``request`` other than the name's stored one (``RequestMismatch``),
                or settings the stream refuses (``IteratorSettings``).
        """
        self.ledger, self.stream, self.pipeline = ledger, stream, pipeline
        self.run_iteration, self.check_blocks = run_iteration, check_blocks
        self.settings = s = IteratorSettings() if settings is None else settings
        if not isinstance(s, IteratorSettings):
            raise LedgerError(f"settings {s!r} must be an IteratorSettings(epsilon_start=..., ...) or None")
        stream_info = ledger.stream(stream)  # raises UnknownStream before anything is spent
        self.request = None if request is None else dict(request)
        self.check_request()
        self._check_budget(stream_info)
        self.wait_for_blocks = wait_for_blocks
        self.progress = progress or (lambda line: None)
        self.clock = clock
        self.policy, self.min_epsilon = stream_info.policy, stream_info.min_epsilon

    def _check_budget(self, stream_info):
        """The settings the stream decides, checked against it (``__init__``'s step; LedgerError naming the
        setting): epsilon_start, the iteration's delta, the grant's delta, the record split, the first grant."""
        s, stream = self.settings, self.stream
        self.epsilon_start = number(
            s.epsilon_start,
            "epsilon_start",
            low=0.0,
            low_open=True,
            high=stream_info.epsilon,
            message=_SETTING + " (the stream's global epsilon)",
        )
        self.delta = (
            stream_info.delta / 100.0
            if s.delta is None
            else number(
                s.delta,
                "iteration delta",
                low=0.0,
                high=stream_info.delta,
                high_open=True,
                message=_SETTING + " (the stream's global delta)",
            )
        )
        # what each grant charges in delta: training's plus preprocessing's (BudgetSplit.total_delta)
        self.grant_delta = self.delta + s.preprocessing_delta
        if not self.grant_delta < stream_info.delta:
            raise LedgerError(
                f"preprocessing_delta {s.preprocessing_delta!r} must be >= 0 with the iteration delta "
                f"{self.delta!r} adding to less than the stream's global delta {stream_info.delta}"
            )
        # the test side's share of the records, signed into each grant (None: the platform's default split)
        self.records = None if s.eval_share is None else eval_share_split(s.eval_share)
        first = self.split(self.epsilon_start).charged_epsilon  # bad shares fail here, before anything is spent
        if first < stream_info.grant_floor:  # the ledger would refuse every grant: say so before anything
            raise LedgerError(
                f"epsilon_start {s.epsilon_start!r} charges epsilon {first:.6g}, below stream "
                f"{stream!r}'s minimum grant epsilon {stream_info.grant_floor:g}: start at a larger "
                "epsilon (--epsilon-start), or lower the stream's --min-grant-epsilon"
            )

    # -------------------------------------------------------------- helpers
    def split(self, epsilon: float) -> BudgetSplit:
        """The split a grant of per-block ``epsilon`` signs, from the settings' shares.

        Args:
            epsilon: the grant's per-block epsilon, all stages together.

        Returns:
            The ``BudgetSplit``.

        Raises:
            LedgerError: shares the split refuses (named with the rule).
        """
        s = self.settings
        try:
            return BudgetSplit.for_epsilon(
                epsilon,
                self.delta,
                s.preprocessing_share,
                s.count_share,
                rejection_share=s.rejection_share,
                disjoint_split=s.disjoint_split,
                preprocessing_delta=s.preprocessing_delta,
            )
        except ValueError as exc:
            raise LedgerError(str(exc)) from None

    def _available(self, blocks):
        """What this pipeline could spend on ALL of ``blocks`` together (one grant)."""
        return self.ledger.available_epsilon(self.pipeline, self.stream, list(blocks), self.grant_delta)

    def _read_availability(self) -> dict:
        """One read of the ledger: {active block: what this pipeline could be granted on it alone}, oldest first."""
        return self.ledger.available_per_block(self.pipeline, self.stream, delta=self.grant_delta)

    def choose_blocks(self, epsilon: float, window: int, available: dict | None = None) -> list | None:
        """The newest ``window`` active blocks on which this pipeline can still spend ``epsilon``, oldest first.

        Args:
            epsilon: the per-block epsilon each chosen block must still offer this pipeline.
            window: the number of blocks.
            available: a ``_read_availability()`` already taken this step (None: read it now), so that one step
                decides on one read and can tell whether a wait changed anything.

        Returns:
            The block ids, or None when fewer than ``window`` blocks offer ``epsilon``.
        """
        if available is None:
            available = self._read_availability()
        chosen = [b for b in reversed(available) if available[b] >= epsilon][:window]
        return chosen[::-1] if len(chosen) == window else None

    def _choose(self, available: dict, epsilon: float, window: int):
        """This step's attempt as (blocks, epsilon), or None when the window cannot be served now.

        Aggressive takes what the chosen blocks offer together now, read fresh, never more than that: the
        offer may be less than last time (another pipeline spent, or a wider window of older blocks), and
        asking more would be refused every time. Under ``min_epsilon`` is no offer: wait for blocks.
        """
        if self.policy != Policy.AGGRESSIVE:
            blocks = self.choose_blocks(epsilon, window, available)
            return None if blocks is None else (tuple(blocks), epsilon)
        blocks = self.choose_blocks(self.min_epsilon, window, available)
        if blocks is None:
            return None
        offer = self._available(blocks)
        return (tuple(blocks), offer) if offer >= self.min_epsilon else None

    def _time_left(self, started: float) -> float | None:
        if self.settings.max_seconds is None:
            return None
        return max(0.0, self.settings.max_seconds - (self.clock() - started))

    def check_request(self) -> None:
        """``check_request`` of this iterator's ``request`` against this pipeline name's iterations."""
        check_request(self.ledger, self.stream, self.pipeline, self.request, self._history())

    def _history(self):
        entries = held(self.ledger, self.stream, self.pipeline, keep=lambda g: "iteration" in g.meta)
        return sorted(entries, key=lambda e: e.grant.meta["iteration"])

    def check_first_window(self) -> None:
        """LedgerError (nothing registered or charged) if this pipeline name would start with fewer active blocks
        than its first window (``min_window``) and cannot wait for more (``wait_for_blocks`` None, as in `sage
        run`): its run would end at once in TIMEOUT, which finishes the name for good. A name with history (to
        resume, or finished: ``run`` reports it) is left to ``run``."""
        if self.wait_for_blocks is not None or self._history():
            return
        status = {p["name"]: p for p in self.ledger.pipelines(self.stream)}.get(self.pipeline)
        if status is not None and status["state"] == PipelineState.DONE:
            return
        active = len(self._read_availability())
        if active < self.settings.min_window:
            fix = f", or lower --min-window to at most {active}" if active else ""
            window = self.settings.min_window
            raise LedgerError(
                f"stream {self.stream!r} has {active} active block(s) and pipeline {self.pipeline!r}'s "
                f"first attempt needs min_window {window}: it would end in TIMEOUT at once, "
                f"which finishes the name for good, so nothing was registered or charged. Ingest at "
                f"least {window - active} more block(s){fix}"
            )

    # ------------------------------------------------------------------ run
    def run(self) -> RunResult:
        """Resume this pipeline's history, then attempt until ACCEPT, REJECT or TIMEOUT (bounded: see the class).

        Returns:
            The ``RunResult``: the outcome, every iteration (resumed ones marked) and the deciding grant's id.

        Raises:
            RequestMismatch: the pipeline finished under another request (nothing charged).
            LedgerError: from the ledger's checks, before the attempt they concern is charged.
        """
        status = {p["name"]: p for p in self.ledger.pipelines(self.stream)}.get(self.pipeline)
        if status is not None and status["state"] == PipelineState.DONE:  # finished earlier: report, spend nothing
            return self._finished_result(status)
        self.ledger.register(self.stream, self.pipeline)
        run = _Attempts(started=self.clock(), epsilon=self.epsilon_start, window=self.settings.min_window)
        decided = self._resume(run)
        if decided is not None:
            return decided
        # Every pass charges (<= max_iterations), is refused (<= max_refusals) or waits (idle waits in a row
        # <= max_idle_waits): see the class docstring for why that bounds the loop.
        while True:
            result = self._attempt(run)
            if result is not None:
                return result

    def _finished_result(self, status: dict) -> RunResult:
        """The result of a pipeline that finished earlier, from its history: nothing is spent."""
        self.check_request()
        history = self._history()
        return RunResult(
            status["outcome"],
            [
                Iteration(
                    g.meta["iteration"],
                    g.id,
                    g.blocks,
                    g.meta["epsilon"],
                    g.meta["eta"],
                    outcome,
                    (details or {}).get("bound"),
                    resumed=True,
                )
                for g, outcome, details in history
            ],
            history[-1][0].id if history and status["outcome"] != Outcome.TIMEOUT else None,
            self._target(),
        )

    def _resume(self, run: _Attempts) -> RunResult | None:
        """Replay the pipeline's history into ``run`` (after a crash or a restart) and re-execute an unfinished
        grant's iteration (already charged, not charged again); the result if the history decides the run."""
        pending = None
        for grant, outcome, details in self._history():
            meta = grant.meta
            record = Iteration(
                meta["iteration"],
                grant.id,
                grant.blocks,
                meta["epsilon"],
                meta["eta"],
                outcome,
                (details or {}).get("bound"),
                resumed=True,
            )
            run.iterations.append(record)
            run.epsilon, run.window, run.number = meta["epsilon"], meta["window"], meta["iteration"] + 1
            if outcome is None:
                pending = (grant, record)
            elif outcome in DECIDED:
                return RunResult(outcome, run.iterations, grant.id, self._target())
            else:  # RETRY, or FAILED (the run raised: its budget is spent, move on as after a RETRY)
                run.epsilon, run.window = self._next(run.epsilon, run.window, grant.blocks)
        if pending is None:
            return None
        grant, record = pending
        self.progress(
            f"[{self.pipeline}] resuming iteration {record.number} under its grant {grant.id} "
            "(already charged; not charged again)"
        )
        result = self._execute(grant, record)
        if result.outcome in DECIDED:
            return self._finish(result.outcome, run.iterations, grant.id)
        run.epsilon, run.window = self._next(run.epsilon, run.window, grant.blocks)
        run.number = record.number + 1
        return None

    def _attempt(self, run: _Attempts) -> RunResult | None:
        """One pass of the attempt loop: time out, wait, charge a grant and execute it; the result once decided."""
        limit = self.settings.max_seconds
        if run.number > self.settings.max_iterations or (limit is not None and self.clock() - run.started > limit):
            return self._finish(Outcome.TIMEOUT, run.iterations, None)
        available = self._read_availability()
        if run.before_wait is not None:
            run.idle_waits = run.idle_waits + 1 if available == run.before_wait else 0
            run.before_wait = None
        choice = self._choose(available, run.epsilon, run.window)
        if choice is None or choice in run.refused:
            return self._wait(run, choice, available)
        blocks, run.epsilon = list(choice[0]), choice[1]
        eta = eta_for_attempt(self.settings.eta, run.number)
        grant = self._charge(run, choice, blocks, eta)
        if grant is None:
            return self._finish(Outcome.TIMEOUT, run.iterations, None) if run.timed_out else None
        record = Iteration(run.number, grant.id, grant.blocks, run.epsilon, eta, None)
        run.iterations.append(record)
        result = self._execute(grant, record)
        if result.outcome in DECIDED:
            return self._finish(result.outcome, run.iterations, grant.id)
        run.epsilon, run.window = self._next(run.epsilon, run.window, blocks)
        run.number += 1
        return None

    def _wait(self, run: _Attempts, choice: tuple | None, available: dict) -> RunResult | None:
        """No useful choice now: wait for new blocks, or TIMEOUT when waiting brings nothing (or cannot)."""
        if choice is not None:
            why = (
                f"the only choice, epsilon {choice[1]:.4g} on {len(choice[0])} block(s), was refused "
                "and the ledger reads as before"
            )
        elif self.policy == Policy.AGGRESSIVE:
            why = f"fewer than {run.window} blocks offer min_epsilon {self.min_epsilon:.4g}"
        else:
            why = f"fewer than {run.window} blocks with epsilon {run.epsilon:.4g} available"
        if run.idle_waits >= self.settings.max_idle_waits:
            self.progress(
                f"[{self.pipeline}] TIMEOUT: {why}, and {run.idle_waits} waits in a row brought "
                f"nothing new (max_idle_waits {self.settings.max_idle_waits})"
            )
            return self._finish(Outcome.TIMEOUT, run.iterations, None)
        if self.wait_for_blocks is None:  # no source of new blocks (`sage run`): say so, do not wait
            self.progress(
                f"[{self.pipeline}] TIMEOUT: {why}; this run does not wait for new blocks: run "
                "again once they arrive, or start at a smaller window or epsilon (min_window, "
                "epsilon_start)"
            )
            return self._finish(Outcome.TIMEOUT, run.iterations, None)
        self.progress(f"[{self.pipeline}] waiting: {why}")
        if not self.wait_for_blocks(self._time_left(run.started)):
            return self._finish(Outcome.TIMEOUT, run.iterations, None)
        run.before_wait = available
        return None

    def _charge(self, run: _Attempts, choice: tuple, blocks: list, eta: float) -> Grant | None:
        """Request the attempt's grant; None when refused (``run.timed_out`` once ``max_refusals`` is reached)."""
        split = self.split(run.epsilon)
        meta = {
            "iteration": run.number,
            "epsilon": run.epsilon,
            "window": run.window,
            "eta": eta,
            "split": split.to_dict(),
        }
        if self.request is not None:
            meta[REQUEST_KEY] = self.request
        if self.records is not None:
            meta[RECORDS_KEY] = self.records.to_dict()
        if self.check_blocks is not None:  # raises naming the block and the fix: nothing charged
            self.check_blocks(blocks)
        try:
            return self.ledger.request(
                self.pipeline,
                self.stream,
                blocks=blocks,
                epsilon=split.charged_epsilon,
                delta=split.total_delta,
                rule=split.rule,
                meta=meta,
            )
        except (BudgetRefused, BlockRetired) as refusal:  # another writer spent between our read and charge
            run.refused.add(choice)
            run.refusals += 1
            if run.refusals >= self.settings.max_refusals:
                self.progress(
                    f"[{self.pipeline}] TIMEOUT: {run.refusals} requests refused (max_refusals "
                    f"{self.settings.max_refusals}); other pipelines took the budget first. Last: "
                    f"{public_error_text(refusal)}"
                )
                run.timed_out = True
                return None
            self.progress(f"[{self.pipeline}] refused, choosing again from a fresh read: {public_error_text(refusal)}")
            return None

    def _execute(self, grant, record):
        split = BudgetSplit.from_meta(grant.meta)
        try:
            result = self.run_iteration(grant, split, record.eta, record.number)
        except Exception as exc:
            if is_environment_error(exc):  # no outcome: the grant stays in use, resumed as after a kill
                error = environment_error_text(exc)
                self.progress(
                    f"[{self.pipeline}] iteration {record.number}: interrupted ({error}); its grant "
                    f"{grant.id} stays in use: fix the cause and run again, it resumes without a new charge"
                )
                raise IterationInterrupted(
                    f"iteration {record.number} under grant {grant.id} was interrupted by {error}"
                ) from exc
            # the grant stays spent; a new run resumes after it
            # The log is append-only and outlives the run: a message from a data path can hold a record's
            # values, so it keeps the type and only the messages known to hold none (public_error_text).

            error = public_error_text(exc)
            self.ledger.record_outcome(grant.id, Outcome.FAILED, {"error": error})
            self.progress(f"[{self.pipeline}] iteration {record.number}: FAILED ({error}); {GRANT_STAYS_SPENT}")
            raise
        self.ledger.record_outcome(grant.id, result.outcome, {"bound": result.bound, **result.details})
        record.outcome, record.bound = result.outcome, result.bound
        bound = "-" if result.bound is None else f"{result.bound:.6g}"
        self.progress(
            f"[{self.pipeline}] iteration {record.number}: blocks {record.blocks[0]}..{record.blocks[-1]} "
            f"({len(record.blocks)}), epsilon {record.epsilon:.4g}, eta {record.eta:.3g}, "
            f"bound {bound} -> {result.outcome}"
        )
        return result

    def _next(self, epsilon, window, blocks):
        """After RETRY: double epsilon if the allocation on the window allows it, else double the window."""
        aggressive = self.policy == Policy.AGGRESSIVE
        return next_attempt(epsilon, window, 0.0 if aggressive else self._available(blocks), aggressive)

    def _finish(self, outcome, iterations, grant_id):
        try:
            self.ledger.finish(self.stream, self.pipeline, outcome)
        except LedgerError:
            pass  # already finished by an earlier run of this pipeline
        return RunResult(
            outcome,
            iterations,
            grant_id,
            self._target(),
            self._ledger_spent(iterations),
            None if self.request is None else 1.0 - self.settings.eta,
        )

    def _ledger_spent(self, iterations) -> dict:
        """{block: the ledger's epsilon spent on it (every pipeline, every run)} for the blocks ``iterations``
        charged; {} if the ledger cannot say."""
        charged = {block for it in iterations for block in it.blocks}
        if not charged:
            return {}
        try:
            rows = self.ledger.status(self.stream)["blocks"]
        except LedgerError:
            return {}
        return {row["id"]: row["epsilon_spent"] for row in rows if row["id"] in charged}

    def _target(self):
        return None if self.request is None else self.request.get("target")
