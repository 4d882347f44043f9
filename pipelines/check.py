"""A dry run that spends nothing: one iteration of a pipeline on GENERATED rows of the stream's schema.

``sage run PIPELINE --check`` (``dry_run``) generates rows of the stream's public schema into a throwaway ledger
and data root and runs one whole iteration there, so a schema mismatch or a bug in a module file shows up
before anything is charged; the real ledger is only read. From public numbers only it also estimates the test
rows the ACCEPT test needs (``estimate_accept``) and refuses a target a constant predictor meets
(``check_targets``).

What it generates, estimates and keeps: docs/your_pipeline.md, "Checking it first, for free".
"""

from __future__ import annotations

import datetime as _dt
import glob
import math
import os
import shutil
import tempfile
import traceback
from dataclasses import dataclass, field

import numpy as np

from sage_tfx.pipelines.accept_estimate import (  # noqa: F401 (accept_passes, ...: re-exported)
    EXPECTED_FRACTION,
    MAX_TEST_ROWS,
    AcceptEstimate,
    AcceptRow,
    accept_margin,
    accept_passes,
    estimate_accept,
    iterator_settings,
    least_test_rows,
)
from sage_tfx.privacy import SageError, error_chain
from sage_tfx.privacy.vocabulary import LOG_LOSS_FLOOR, Metric

GENERATED_EPOCH = int(_dt.datetime(2020, 1, 1, tzinfo=_dt.UTC).timestamp())
MISSING_RATE = 0.01
BINARY_METRICS = (Metric.ACCURACY, Metric.LOG_LOSS)  # generated labels are 0/1 for these (the validator refuses others)


@dataclass
class CheckResult:
    ok: bool
    rows: int
    blocks: int
    outcome: str | None = None
    error: str | None = None
    lines: list = field(default_factory=list)
    estimate: AcceptEstimate | None = None  # the first target's (estimates: all of them)
    estimates: list = field(default_factory=list)
    plan: object = None  # the AttemptPlan the stream's budget allows now (None: the ledger was not read)
    model_dir: str | None = None  # where the candidate model was kept (``keep_dir``)


# ---------------------------------------------------------------- what a constant predictor reaches


class TrivialTarget(SageError, ValueError):
    """A target a constant predictor already meets (refused before any charge unless --allow-trivial-target)."""


@dataclass(frozen=True)
class Baseline:
    """The metric a constant predictor reaches, from the user's PUBLIC prior on the label: exactly (``exact``)
    or at most (a loss; the clipped loss of the predictor is at most ``value``)."""

    value: float
    predictor: str
    exact: bool

    def meets(self, metric: str, target: float) -> bool:
        """Whether the constant predictor surely meets ``target`` (an accuracy at least it, a loss at most it)."""
        return self.value >= target if metric == Metric.ACCURACY else self.value <= target

    def describe(self, metric: str) -> str:
        return f"{self.predictor} reaches {metric} {'' if self.exact else 'at most '}{self.value:.4g}"


def trivial_baseline(sla, *, positive_rate: float | None = None, label_std: float | None = None) -> Baseline | None:
    """The metric a constant predictor reaches on labels with the PUBLIC ``positive_rate`` (binary labels:
    accuracy, log_loss) or standard deviation ``label_std`` (mse, mae); None when neither applies (custom).
    Nothing here reads the stream: the prior is the user's public knowledge (a census rate, a published mean
    and spread), and the numbers are its exact consequences: accuracy max(p, 1 - p) (the majority class),
    log loss H(p) = -p ln p - (1 - p) ln(1 - p) (the constant probability p, clipped as the validator clips),
    mse at most std^2 and mae at most std (the mean; losses clipped to the bound only lower them).
    ValueError naming a prior that does not fit the SLA's metric."""

    metric = sla.metric
    if positive_rate is not None:
        if metric not in BINARY_METRICS:
            raise ValueError(
                f"--positive-rate {positive_rate!r} is for binary labels (accuracy, log_loss); the SLA "
                f"metric is {metric}: give --label-std"
            )
        p = float(positive_rate)
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"--positive-rate {positive_rate!r} must be a share of positive labels in [0, 1]")
        if metric == Metric.ACCURACY:
            return Baseline(max(p, 1.0 - p), f"the majority class ({'1' if p >= 0.5 else '0'})", True)
        q = min(max(p, LOG_LOSS_FLOOR), 1.0 - LOG_LOSS_FLOOR)
        loss = -p * math.log(q) - (1.0 - p) * math.log(1.0 - q)
        return Baseline(min(loss, sla.loss_bound), f"the constant probability {p:g}", True)
    if label_std is not None:
        if metric not in (Metric.MSE, Metric.MAE):
            raise ValueError(
                f"--label-std {label_std!r} is for mse and mae SLAs; the SLA metric is {metric}"
                + (": give --positive-rate" if metric in BINARY_METRICS else "")
            )
        std = float(label_std)
        if not (math.isfinite(std) and std >= 0):
            raise ValueError(f"--label-std {label_std!r} must be a finite standard deviation >= 0")
        value = std**2 if metric == Metric.MSE else std
        return Baseline(min(value, sla.loss_bound), "the label's mean", False)
    return None


def check_targets(sla, targets, baseline: Baseline | None, allow_trivial: bool = False) -> list:
    """The targets as floats (``sla.check_target`` names a bad one); ``TrivialTarget`` naming every target the
    constant predictor of ``baseline`` already meets, unless ``allow_trivial``."""
    values = [sla.check_target(t) for t in targets]
    trivial = [t for t in values if baseline is not None and baseline.meets(sla.metric, t)]
    if trivial and not allow_trivial:
        raise TrivialTarget(
            f"target(s) {', '.join(f'{t:g}' for t in trivial)} are met by a constant predictor: "
            f"{baseline.describe(sla.metric)}, so an ACCEPT would certify nothing a model learned. "
            "Choose a stricter target, or pass --allow-trivial-target to run it anyway; nothing was "
            "charged"
        )
    return values


def describe_estimate(
    estimate: AcceptEstimate, min_window: int | None = None, baseline: Baseline | None = None, planned: bool = False
) -> list:
    """The estimate as lines for ``sage run --check``; ``baseline``: what a constant predictor reaches;
    ``planned``: the epsilons are the attempts the stream's budget allows now (``plan_attempts``)."""
    e = estimate
    unit = Metric.ACCURACY.value if e.metric == Metric.ACCURACY else f"{e.metric} (losses clipped to [0, {e.bound:g}])"
    guess = (
        ("the default: half the target's error rate" if e.metric == Metric.ACCURACY else "the default: half the target")
        if e.expected_is_default
        else "--expected-loss"
    )
    lines = [
        f"estimate for target {e.target:g} ({unit}), confidence {e.confidence:g}, if the model's true "
        f"{Metric.ACCURACY if e.metric == Metric.ACCURACY else 'loss'} is {e.expected:g} ({guess}):"
    ]
    if baseline is not None:
        lines.append(
            f"  a constant predictor: {baseline.describe(e.metric)} (from your public prior): the target "
            f"{'is met by it' if baseline.meets(e.metric, e.target) else 'asks more than it'}"
        )
    lines.append(
        "  rows at which the validator's ACCEPT test passes when the released sums equal their expectations "
        "(noise and sampling error at their medians: about even odds; plan for more)"
        + (", at the attempts the stream's budget allows now:" if planned else ":")
    )
    for r in e.rows:
        if r.test_rows is None:
            need = f"out of reach (no test set up to {MAX_TEST_ROWS:.0e} rows)"
        else:
            need = (
                f"{r.test_rows:,} test rows = about {r.rows:,} rows of the window (the eval split is "
                f"{e.eval_share:.0%} of the rows)"
            )
        lines.append(
            f"  epsilon {r.epsilon:g} per block (attempt {r.attempt}: validation epsilon "
            f"{r.validation_epsilon:.4g}, eta {r.eta_accept:.3g}): {need}"
        )
    lines.append(
        "  blocks: not estimated: the stream publishes no rows per block (a block's row count is data); "
        "divide the rows by your own public estimate of rows per block"
        + (f" (the first window is {min_window} block(s))" if min_window else "")
    )
    lines.append(
        "  training: not estimated (the rows DP-SGD needs to reach the target depend on the model and the "
        "data; the validator's bounds say nothing about them)"
    )
    return lines


def stream_plan(ledger, stream: str, pipeline: str, settings: dict, max_iterations: int = 10):
    """``plan_attempts`` for ``pipeline`` on ``stream`` as its budget stands in ``ledger`` now (read only):
    what the pipeline may be granted on each active block, at the iterator's delta, under the stream's policy."""
    from sage_tfx.adaptive import plan_attempts
    from sage_tfx.privacy.vocabulary import Policy

    s, info = iterator_settings(settings), ledger.stream(stream)
    delta = (info.delta / 100.0 if s.get("delta") is None else float(s["delta"])) + float(s["preprocessing_delta"])
    available = ledger.available_per_block(pipeline, stream, delta=delta)
    return plan_attempts(
        available,
        epsilon_start=float(s["epsilon_start"]),
        min_window=int(s["min_window"]),
        max_iterations=max_iterations,
        aggressive=info.policy == Policy.AGGRESSIVE,
        min_epsilon=info.min_epsilon,
    )


def keep_model(work: str, keep_dir: str) -> str | None:
    """Copy the newest SavedModel DPTrainer wrote under ``work`` (its ``Format-Serving`` folder) to ``keep_dir``
    (replacing what was there); its path, or None if the run wrote none."""

    found = sorted(glob.glob(os.path.join(work, "**", "Format-Serving"), recursive=True), key=os.path.getmtime)
    if not found:
        return None
    if os.path.isdir(keep_dir):
        shutil.rmtree(keep_dir)
    shutil.copytree(found[-1], keep_dir)
    return keep_dir


def generated_rows(
    schema: dict, blocks_config: dict, label: str, metric: str, n_blocks: int, rows_per_block: int, seed: int = 0
):
    """A pyarrow Table of GENERATED rows of ``schema`` ({column: int|float|bytes}) filling ``n_blocks`` blocks."""
    import pyarrow as pa

    rng = np.random.default_rng(seed)
    n = n_blocks * rows_per_block
    by, key_column = blocks_config.get("by"), blocks_config.get("column")
    columns = {}
    for name, kind in schema.items():
        if by == "time" and name == key_column:
            window = int(blocks_config["window"])
            block = np.repeat(np.arange(n_blocks), rows_per_block)
            values = GENERATED_EPOCH + block * window + rng.integers(0, window, size=n)
            columns[name] = pa.array(values if kind == "int" else values.astype(float if kind == "float" else str))
            continue
        if name == label and metric in BINARY_METRICS:
            values = rng.integers(0, 2, size=n)
        elif kind == "int":
            values = rng.integers(0, 24, size=n)
        elif kind == "float":
            values = rng.uniform(0.0, 100.0, size=n)
        else:
            values = rng.choice(np.array(["a", "b", "c"]), size=n)
        if kind == "float":
            values = values.astype(float)
        elif kind == "bytes":
            values = values.astype(str)
        mask = None if name in (label, key_column) else rng.random(n) < MISSING_RATE
        columns[name] = pa.array(values, mask=mask)
    return pa.table(columns)


def describe_failure(exc, limit=4000):
    """The first error of ``exc``'s chain with its traceback (TFX's runners may raise a clean-up error while
    handling the module's own), and the last one if it differs; at most ``limit`` characters of traceback."""
    first = error_chain(exc)[-1]
    text = "".join(traceback.format_exception(type(first), first, first.__traceback__)).rstrip()
    if len(text) > limit:
        text = "...\n" + text[-limit:]
    if first is not exc:
        text += f"\n(then, while handling it: {type(exc).__name__}: {exc})"
    return text


def _spec(stream, blocks_config):
    from sage_tfx.ingest.pipeline import make_spec

    if blocks_config.get("by") == "user":
        return make_spec(
            "user",
            stream,
            user_column=blocks_config["column"],
            shards=int(blocks_config["shards"]),
            hash_key="sage-check",
        )
    return make_spec("time", stream, time_column=blocks_config["column"], window=int(blocks_config["window"]))


def check_line(line: str) -> str:
    """An iterator progress line of the dry run, as `sage run --check` prints it: a FAILED iteration's grant is
    spent in the throwaway ledger, not the real one."""
    from sage_tfx.adaptive.iterator import GRANT_STAYS_SPENT

    return "[check] " + line.replace(
        GRANT_STAYS_SPENT, "its grant is spent in the throwaway ledger only (the real ledger is not charged)"
    )


def dry_run(
    definition,
    data_root: str,
    stream: str,
    *,
    model: str | None = None,
    runner: str = "local",
    beam_args=(),
    progress=print,
    seed: int = 0,
    targets=(),
    expected: float | None = None,
    confidence: float = 0.95,
    overrides: dict | None = None,
    ledger=None,
    pipeline_name: str | None = None,
    baseline: Baseline | None = None,
    allow_trivial: bool = False,
    keep_dir: str | None = None,
    max_iterations: int = 10,
    estimate_only: bool = False,
    spec: str | None = None,
    secrets=(),
) -> CheckResult:
    """One iteration of ``definition`` on GENERATED rows of ``stream``'s schema, in a throwaway ledger (skipped
    with ``estimate_only``); then, per target of ``targets``, the rows to ACCEPT (``estimate_accept``;
    ``overrides``: the CLI's iterator settings) beside what a constant predictor reaches (``baseline``).

    ``ledger``: the real ledger, READ only, for the attempts its budget allows now (``stream_plan`` for
    ``pipeline_name``); the estimates are made at those attempts. A bad target or guess, and a target the
    constant predictor meets (``TrivialTarget``, unless ``allow_trivial``), raise ValueError before the dry run.
    ``keep_dir``: where the candidate model (trained on the generated rows) is copied for inspection.
    ``spec`` (``sage run --check``): the iteration runs in a confined child (``pipelines.confined``) served by a
    grant server over the throwaway ledger, which may reach none of ``secrets`` (the real ledger's files)."""
    from sage_tfx.pipelines._runner import check_stream_schema

    schema = check_stream_schema(data_root, stream, definition.sla, definition.name)
    definition.model_family(model)
    settings = {**definition.iterator_defaults(), **(overrides or {})}
    targets = check_targets(definition.sla, targets, baseline, allow_trivial)
    plan = None
    if ledger is not None:
        plan = stream_plan(ledger, stream, pipeline_name or definition.name, settings, max_iterations)
    planned = plan is not None and bool(plan.attempts)  # none can run now: estimate the doublings for later
    # bad --target / --expected-loss fail here, before the dry run
    estimates = [
        estimate_accept(
            definition.sla,
            t,
            expected=expected,
            confidence=confidence,
            settings=settings,
            attempts=plan.attempts if planned else None,
        )
        for t in targets
    ]
    result = CheckResult(ok=True, rows=0, blocks=0)
    if not estimate_only:
        result = _generated_iteration(
            definition, data_root, stream, schema, model, runner, beam_args, progress, seed, keep_dir, spec, secrets
        )
        if not result.ok:
            return result
    _say_plan_and_estimates(
        result, progress, ledger, stream, pipeline_name or definition.name, plan, estimates, settings, baseline
    )
    return result


def _say_plan_and_estimates(result, progress, ledger, stream, pipeline, plan, estimates, settings, baseline):
    """``dry_run``'s report: the attempts the budget allows now (``plan``, read from ``ledger``) and, per target,
    the rows to ACCEPT beside the constant predictor's ``baseline``; each line printed and kept in ``result``."""
    planned = plan is not None and bool(plan.attempts)

    def say(line):
        result.lines.append("[check] " + line)
        progress("[check] " + line)

    if plan is not None:
        say(
            f"attempts the budget allows now on stream {stream!r} (read from the ledger, nothing charged): "
            + plan.describe()
        )
        done = [g for g, _, _ in ledger.history(stream, pipeline) if "iteration" in g.meta]
        if done:
            say(
                f"  pipeline {pipeline!r} has {len(done)} iteration(s) already: a run resumes "
                "after them (at their last epsilon and window), not at this plan's first attempt; a new --name starts "
                "afresh"
            )
    result.estimate = estimates[0] if estimates else None
    result.estimates, result.plan = estimates, plan
    min_window = settings.get("min_window") or iterator_settings({})["min_window"]
    for estimate in estimates:
        for line in describe_estimate(estimate, min_window, baseline, planned=planned):
            say(line)
    if not estimates:
        say(
            "give --target (several: --target A,B,C; optionally --expected-loss) to estimate the rows and epsilon "
            "to ACCEPT"
        )


def _generated_iteration(
    definition, data_root, stream, schema, model, runner, beam_args, progress, seed, keep_dir, spec=None, secrets=()
) -> CheckResult:
    """The dry run itself: one iteration on generated rows in a throwaway ledger and data root."""
    from sage_tfx.adaptive import IteratorSettings, SageIterator
    from sage_tfx.ingest.layout import stream_config
    from sage_tfx.ingest.pipeline import ingest_batches
    from sage_tfx.pipelines._runner import PipelineConfig, make_run_iteration
    from sage_tfx.privacy import Ledger

    config = stream_config(data_root, stream)
    settings = definition.iterator_defaults()
    n_blocks = max(1, int(settings.get("min_window", 1)))
    rows_per_block = max(4, -(-2000 // n_blocks))
    target = 0.5 if definition.sla.metric == Metric.ACCURACY else definition.sla.loss_bound / 2
    table = generated_rows(
        schema, config["blocks"], definition.sla.label, definition.sla.metric, n_blocks, rows_per_block, seed
    )
    result = CheckResult(ok=False, rows=table.num_rows, blocks=n_blocks)

    def say(line):
        result.lines.append(line)
        progress(line)

    with tempfile.TemporaryDirectory(prefix="sage-check-") as tmp:
        db, data = os.path.join(tmp, "ledger.db"), os.path.join(tmp, "data")
        say(
            f"[check] {table.num_rows:,} GENERATED rows of the schema of stream {stream!r} in {n_blocks} block(s), "
            f"in a throwaway ledger ({tmp}); the real ledger is not touched"
        )
        with Ledger.open(db, create=True) as ledger:
            ledger.create_stream(stream, 100.0, 1e-3, max_epsilon=100.0)
            ingest_batches(ledger, stream, data, table.to_batches(), _spec(stream, config["blocks"]), schema)
            work = os.path.join(tmp, "work")
            pipeline_config = PipelineConfig(
                name=definition.name,
                ledger=db,
                stream=stream,
                data_root=data,
                work_dir=work,
                target=target,
                runner=runner,
                beam_pipeline_args=list(beam_args),
                model=model,
            )
            settings["epsilon_start"] = min(1.0, float(settings.get("epsilon_start", 1.0)))
            execute = None
            if spec is not None:
                from sage_tfx.pipelines.confined import confined_execute, ledger_secrets

                execute = confined_execute(
                    spec, definition, pipeline_config, [*secrets, *ledger_secrets(db)], check=True
                )
            iterator = SageIterator(
                ledger,
                stream,
                definition.name,
                make_run_iteration(definition.build_pipeline, pipeline_config, execute),
                settings=IteratorSettings(**settings, max_iterations=1),
                progress=lambda line: say(check_line(line)),
            )
            try:
                run = iterator.run()
            except Exception as exc:  # generated rows only: the whole error may be shown
                result.error = getattr(exc, "detail", None) or describe_failure(exc)
                return result
            if keep_dir is not None:
                result.model_dir = keep_model(work, keep_dir)
        result.ok, result.outcome = True, run.outcome
    if result.model_dir is not None:
        say(
            f"[check] the candidate model (trained on the GENERATED rows) is kept in {result.model_dir}: load it "
            "with tf.saved_model.load and call its serving signature on a hand-made record"
        )
    return result
