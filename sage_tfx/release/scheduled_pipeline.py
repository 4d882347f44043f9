"""A TFX pipeline re-run under a growth schedule (BBScheduler and BBImprover, the paper seed 001's Sections 3.1
and 3.2).

``ScheduledPipeline`` drives any pipeline's ``run_iteration(grant, split, eta, iteration)`` by a schedule: each
arriving block is charged its LIFETIME grant once (``growth.charge_lifetime``), each run i draws an
(epsilon_i, delta_i) run grant from the lifetime grants of the blocks so far (``Ledger.draw``, rule "basic" or
"zcdp") and is validated at eta_i = eta / ((i + 1) (i + 2)). Contract: every record is (epsilon, delta)-DP over
all runs, what its block was charged once; a name run for another request is refused; a run killed before its
outcome re-runs under the same run grant.

Proofs, draw rules, certificate and resuming: docs/release_strategies.md ("A TFX pipeline under a growth
schedule").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sage_tfx.adaptive.iterator import REQUEST_KEY, check_request
from sage_tfx.privacy import BudgetSplit, eval_share_split, public_error_text
from sage_tfx.privacy.draws import DRAW_KEY, is_run_grant
from sage_tfx.privacy.errors import IterationInterrupted, SageError, environment_error_text, is_environment_error
from sage_tfx.privacy.resume import held
from sage_tfx.privacy.split import RECORDS_KEY
from sage_tfx.privacy.vocabulary import BlockState, Composition, Outcome
from sage_tfx.release.growth import (
    BBImprover,
    BBScheduler,
    GrowthError,
    ImproverParams,
    ScheduleIdentity,
    SchedulerParams,
    charge_lifetime,
)
from sage_tfx.validation import eta_for_attempt

RunIteration = Callable[[Any, BudgetSplit, float, int], Any]  # -> sage_tfx.adaptive.IterationResult


class RunFailed(SageError):
    """A scheduled run's pipeline raised after its draw (FAILED recorded); the message holds the public part."""


@dataclass
class ScheduledRun:
    """One scheduled run: the epoch, the block count t, its budget, its run grant and what the pipeline said."""

    epoch: int
    t: int
    epsilon: float
    delta: float
    eta: float
    grant_id: str
    blocks: list
    outcome: str | None = None
    bound: float | None = None
    resumed: bool = False
    details: dict = field(default_factory=dict)


Schedule = BBScheduler | BBImprover


def check_pipeline_schedule(schedule: Schedule) -> Schedule:
    """Refuse (GrowthError naming the value) a schedule a TFX pipeline cannot run under (module docstring)."""
    if not isinstance(schedule, (BBScheduler, BBImprover)):
        raise GrowthError(f"schedule {schedule!r} cannot drive a TFX pipeline: give a BBScheduler or a BBImprover")
    if isinstance(schedule, BBScheduler):
        _check_params(schedule.params)
    if schedule.draw_composition is not None:
        return schedule
    raise GrowthError(
        f"{type(schedule).__name__} {schedule.meta} has pure runs: a TFX pipeline run is (epsilon_i, "
        "delta_i)-DP (DP-SGD), so build it with approximate=True (runs of (epsilon_i, delta_i) drawn "
        "under the ledger's 'zcdp' rule)"
    )


def _check_params(params: SchedulerParams) -> SchedulerParams:
    if params.mode is Composition.PURE or params.delta <= 0:
        raise GrowthError(
            f"composition {params.composition!r} with delta {params.delta!r} cannot drive a TFX "
            "pipeline: give delta > 0 and composition 'basic' or 'zcdp' (each run is (epsilon_i, "
            "delta_i)-DP and DP-SGD needs delta_i > 0)"
        )
    return params


class ScheduledPipeline(ScheduleIdentity):
    """``run_iteration`` re-run by ``schedule`` as blocks arrive, each run under a run grant (module docstring).

    ``observe(block)``: charge the block's lifetime grant (again: the same grant back, nothing charged twice) and,
    if the schedule runs at this block count, draw and run. ``advance()``: observe every active block of the
    stream not observed yet, in the ledger's order. Split settings are the Sage iterator's (``BudgetSplit.
    for_epsilon``): each run's epsilon_i is split between the stages, training's delta is delta_i.
    """

    def __init__(
        self,
        ledger,
        stream: str,
        pipeline: str,
        schedule: Schedule,
        run_iteration: RunIteration,
        *,
        name: str = "tfx",
        eta: float = 0.05,
        preprocessing_share: float = 0.2,
        count_share: float = 0.05,
        rejection_share: float = 0.0,
        disjoint_split: bool = True,
        eval_share: float | None = None,
        progress: Callable[[str], None] | None = None,
        request: dict | None = None,
    ):
        self.schedule = check_pipeline_schedule(schedule)
        if not callable(run_iteration):
            raise GrowthError(f"run_iteration {run_iteration!r} must be a callable (grant, split, eta, iteration)")
        eta_for_attempt(eta, 1)  # a bad eta fails here, before anything is charged
        self.ledger, self.stream, self.pipeline, self.name = ledger, stream, pipeline, name
        self.run_iteration, self.eta = run_iteration, eta
        self.shares = dict(
            preprocessing_share=preprocessing_share,
            count_share=count_share,
            rejection_share=rejection_share,
            disjoint_split=disjoint_split,
        )
        first = schedule.run_budget(schedule.epoch_start(0))
        self.split(first[1], first[2])  # bad shares fail here, before anything is charged
        # the record split signed into each run grant (the Sage iterator's rule): None is the platform's default
        self.records = {} if eval_share is None else {RECORDS_KEY: eval_share_split(eval_share).to_dict()}
        self.epsilon, self.delta = schedule.params.epsilon, schedule.params.delta
        self.progress = progress or (lambda line: None)
        self.grants: dict[str, Any] = {}
        self.order: list[str] = []
        self.runs: list[ScheduledRun] = []
        self.request = None if request is None else dict(request)
        self._recover()

    @classmethod
    def for_runner(
        cls,
        ledger,
        definition,
        runner,
        schedule: Schedule,
        *,
        rejection_share: float | None = None,
        progress: Callable[[str], None] | None = None,
        run_iteration: RunIteration | None = None,
    ) -> ScheduledPipeline:
        """The driver of a built pipeline (``definition``: its split defaults and name; ``runner``: a
        ``PipelineRunner``, whose config names the stream and pipeline and whose confidence gives eta), as `sage
        run --schedule` and `sage serve --schedule` run it; ``run_iteration`` replaces ``runner.run_iteration``
        (serve's wrapper that waits for a TFX slot), ``rejection_share`` the pipeline's default when not None.
        The runner's ``request()`` (target, confidence, SLA, model, definition) is signed into every run grant, and
        a pipeline name run for another request is refused (``RequestMismatch``) before anything is charged."""
        shares = {
            k: v
            for k, v in definition.iterator_defaults().items()
            if k in ("preprocessing_share", "count_share", "rejection_share", "disjoint_split", "eval_share")
        }
        if rejection_share is not None:
            shares["rejection_share"] = rejection_share
        return cls(
            ledger,
            runner.config.stream,
            runner.config.name,
            schedule,
            run_iteration or runner.run_iteration,
            name=f"tfx:{definition.name}",
            eta=1 - runner.config.confidence,
            progress=progress,
            request=runner.request(),
            **shares,
        )

    def split(self, epsilon: float, delta: float) -> BudgetSplit:
        return BudgetSplit.for_epsilon(
            epsilon,
            delta,
            self.shares["preprocessing_share"],
            self.shares["count_share"],
            rejection_share=self.shares["rejection_share"],
            disjoint_split=self.shares["disjoint_split"],
        )

    def _recover(self) -> None:
        """The pipeline's lifetime grants of this schedule (charge order) and its run grants' outcomes."""
        self._outcomes = {}
        history = held(self.ledger, self.stream, self.pipeline)
        # before anything is charged or drawn: a name run for another request is refused (the Sage iterator's rule),
        # judged on its runs (run grants, or the Sage iterator's iterations under the same name)
        runs = [e for e in history if DRAW_KEY in e[0].meta or "iteration" in e[0].meta]
        check_request(self.ledger, self.stream, self.pipeline, self.request, runs)
        for grant, outcome, details in history:
            if is_run_grant(grant.body()):
                if grant.meta[DRAW_KEY].get("schedule") == self.fingerprint:
                    self._outcomes[grant.id] = (outcome, details)
            elif grant.meta == self.meta and len(grant.blocks) == 1 and grant.blocks[0] not in self.grants:
                self.grants[grant.blocks[0]] = grant
                self.order.append(grant.blocks[0])

    def observe(self, block: str) -> ScheduledRun | None:
        """Charge ``block``'s lifetime grant if not yet charged; run the pipeline if the schedule says so at this
        block count (or re-run a run that has no outcome yet). Returns the run, or None."""
        if block not in self.grants:
            self.grants[block] = charge_lifetime(
                self.ledger, self.stream, self.pipeline, block, self.epsilon, self.delta, self.meta, self.fingerprint
            )
            self.order.append(block)
            self.progress(
                f"[{self.pipeline}] block {block}: t={len(self.order)} charged its lifetime "
                f"(epsilon {self.epsilon:.6g}, delta {self.delta:.3g}) under {self.schedule.meta['strategy']}"
            )
        t = self.order.index(block) + 1
        plan = self.schedule.run_budget(t)
        if plan is None:
            return None
        return self._run(t, *plan)

    def _run(self, t: int, epoch: int, epsilon: float, delta: float) -> ScheduledRun:
        blocks = self.order[:t]
        split = self.split(epsilon, delta)
        eta = eta_for_attempt(self.eta, epoch + 1)
        grant = self.ledger.draw(
            [self.grants[b] for b in blocks],
            epoch,
            split.charged_epsilon,
            split.total_delta,
            schedule=self.fingerprint,
            split=split,
            meta={
                "t": t,
                "epsilon": epsilon,
                "eta": eta,
                **self.records,
                **({} if self.request is None else {REQUEST_KEY: self.request}),
            },
            composition=self.schedule.draw_composition,
        )
        run = ScheduledRun(epoch, t, grant.epsilon, grant.delta, eta, grant.id, blocks)
        done = self._outcomes.get(grant.id)
        if done is not None and done[0] is not None:  # ran before: its outcome stands, nothing is re-run
            run.outcome, run.resumed = done[0], True
            run.bound = (done[1] or {}).get("bound")
            self.runs.append(run)
            return run
        try:
            result = self.run_iteration(grant, split, eta, epoch + 1)
        except Exception as exc:  # the run grant stays drawn; the error text may hold data values: public part only
            if is_environment_error(exc):  # no outcome: the next advance re-runs it under the same run grant
                raise IterationInterrupted(
                    f"run {epoch} (t={t}) under run grant {grant.id} was interrupted by {environment_error_text(exc)}"
                ) from exc
            error = public_error_text(exc)
            self.ledger.record_outcome(grant.id, Outcome.FAILED, {"error": error})
            self.progress(f"[{self.pipeline}] run {epoch} (t={t}): FAILED ({error}); its run grant stays drawn")
            raise RunFailed(f"run {epoch} (t={t}) under run grant {grant.id} failed: {error}") from exc
        self.ledger.record_outcome(grant.id, result.outcome, {"bound": result.bound, **result.details})
        self._outcomes[grant.id] = (result.outcome, {"bound": result.bound})
        run.outcome, run.bound, run.details = result.outcome, result.bound, result.details
        self.runs.append(run)
        bound = "-" if result.bound is None else f"{result.bound:.6g}"
        self.progress(
            f"[{self.pipeline}] run {epoch}: blocks {blocks[0]}..{blocks[-1]} ({t}), epsilon_i "
            f"{grant.epsilon:.4g}, delta_i {grant.delta:.3g}, eta {eta:.3g}, bound {bound} -> "
            f"{result.outcome}"
        )
        return run

    def advance(self, max_runs: int | None = None) -> list[ScheduledRun]:
        """Observe every active block not observed yet (ledger order), stopping after ``max_runs`` runs made by
        this call (blocks after that stay uncharged). Returns the runs made or resumed."""

        made = []
        pending = [b.id for b in self.ledger.blocks(self.stream) if b.id in self.grants or b.state == BlockState.ACTIVE]
        for block in self.order + [b for b in pending if b not in self.grants]:
            if max_runs is not None and len([r for r in made if not r.resumed]) >= max_runs:
                break
            run = self.observe(block)
            if run is not None:
                made.append(run)
        return made


STRATEGIES = ("bbscheduler", "bbimprover")


def scheduler_from_options(options: dict, source: str = "the schedule", strategy: str = "bbscheduler") -> Schedule:
    """The schedule of a pipeline from a JSON object of options: ``strategy`` "bbscheduler" {"epsilon", "delta",
    "gamma", "t0", "composition"} (the composition defaults to "basic"; "zcdp" gives approximate runs) or
    "bbimprover" {"epsilon", "delta", "a", "t0"} (approximate runs). GrowthError naming the bad value."""
    if strategy not in STRATEGIES:
        raise GrowthError(f"{source}: strategy {strategy!r} is unknown: give one of {', '.join(STRATEGIES)}")
    what = "BBScheduler" if strategy == "bbscheduler" else "BBImprover"
    if not isinstance(options, dict):
        raise GrowthError(f"{source}: {options!r} is not a JSON object of {what} options")
    known = (
        {"epsilon", "delta", "gamma", "t0", "composition"}
        if strategy == "bbscheduler"
        else {"epsilon", "delta", "a", "t0"}
    )
    unknown = sorted(set(options) - known)
    if unknown:
        raise GrowthError(f"{source}: unknown option(s) {unknown}: give {', '.join(sorted(known))}")
    for name, fix in (("epsilon", "the total per-record epsilon"), ("delta", "the total per-record delta > 0")):
        if name not in options and (name == "epsilon" or strategy == "bbimprover"):
            raise GrowthError(f"{source}: {name!r} is missing: give {fix}")
    try:
        if strategy == "bbimprover":
            return BBImprover(ImproverParams(**options), approximate=True)
        # the parameters checked before BBScheduler calibrates anything
        params = _check_params(SchedulerParams(**{"composition": Composition.BASIC.value, **options}))
        return BBScheduler(params, approximate=params.mode is Composition.ZCDP)
    except GrowthError as exc:
        raise GrowthError(f"{source}: {exc}") from None


def describe(schedule: Schedule) -> str:
    """One line naming a pipeline schedule and its options (progress and summary lines)."""
    options = ", ".join(
        f"{k} {v:g}" if isinstance(v, float) else f"{k} {v}"
        for k, v in schedule.meta.items()
        if k not in ("strategy", "approximate") and v is not None
    )
    return f"{schedule.meta['strategy']}: {options}"
