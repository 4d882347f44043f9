"""A dry run that spends nothing: one iteration of a pipeline on GENERATED rows of the stream's schema.

``sage run PIPELINE --check`` runs ``dry_run``: it reads the stream's public schema and block layout from
the data root, GENERATES rows of that schema (random values of each column's kind, about one in a hundred
missing, the label 0/1 for accuracy), ingests them into a throwaway ledger and data root, and runs one
iteration of the whole TFX pipeline there: DPTransform traces and runs the preprocessing_fn, DPTrainer
runs run_fn, DPModelValidator validates. A schema mismatch (a feature the stream lacks, a string where a
number is expected) or a bug in a module file shows up here, with its traceback, BEFORE anything is
charged on the real ledger, which is never opened for writing. The outcome itself (ACCEPT, RETRY, ...)
means nothing: the rows are noise.

Given the target, it then estimates, from public numbers only, how many rows the validator's ACCEPT test
needs (``estimate_accept``): at each of a few iteration epsilons, the least number of test rows at which
the ACCEPT test at the SLA's target passes when the model's true loss is a public guess (``expected``) and
the released sums equal their expectations. The test is the validator's own (``noisy_sum_test``, the
function ``joint_decision`` decides with), so the estimate cannot drift from it.
"""
from __future__ import annotations

import datetime as _dt
import os
import tempfile
import traceback
from dataclasses import dataclass, field

GENERATED_EPOCH = int(_dt.datetime(2020, 1, 1, tzinfo=_dt.timezone.utc).timestamp())
MISSING_RATE = 0.01


@dataclass
class CheckResult:
    ok: bool
    rows: int
    blocks: int
    outcome: str | None = None
    error: str | None = None
    lines: list = field(default_factory=list)
    estimate: "AcceptEstimate | None" = None


# ---------------------------------------------------------------- rows and epsilon to ACCEPT

EXPECTED_FRACTION = 0.5  # default public guess of the true loss: half the target (accuracy: half the target's error)
ESTIMATE_DOUBLINGS = 4  # epsilons estimated: epsilon_start, 2x, 4x, 8x (the iterator doubles after a RETRY)
MAX_TEST_ROWS = 1e8  # beyond this the target is treated as out of reach (and the exact binomial tail gets costly)


@dataclass(frozen=True)
class AcceptRow:
    """At one iteration epsilon (attempt ``attempt``): what the ACCEPT test gets and the test rows it needs."""

    epsilon: float
    attempt: int
    validation_epsilon: float
    eta_accept: float
    test_rows: int | None  # None: out of reach (no n up to MAX_TEST_ROWS passes)
    rows: int | None  # test_rows / the eval split's share of the rows


@dataclass(frozen=True)
class AcceptEstimate:
    metric: str
    target: float
    expected: float  # in the SLA's unit (a loss, or an accuracy)
    expected_is_default: bool
    bound: float  # B: losses clipped to [0, B] (1 for accuracy's 0/1 errors)
    confidence: float
    eval_share: float
    rows: list


def _accept_test(metric, target, expected, bound):
    """(B, tau, mean, binomial) of the validator's ACCEPT test on values in [0, B]: a loss tested at the target,
    or the 0/1 error tested at 1 - target (DPAccuracyValidator's "exact" bound), as make_validator builds them."""
    if metric == "accuracy":
        return 1.0, 1.0 - target, 1.0 - expected, True
    return float(bound), target, expected, False


def accept_passes(n, *, metric, target, expected, bound, epsilon, eta_accept) -> bool:
    """Whether the validator's ACCEPT test passes on ``n`` test rows whose released sums equal their expectations:
    S~ = n mean and S'~ = n (B - mean), Lap(B/epsilon) each (the noise at its median, 0). The same call
    ``joint_decision`` decides with: ``noisy_sum_test`` at the target, ACCEPT iff p-value <= eta's sampling share."""
    return accept_margin(n, metric=metric, target=target, expected=expected, bound=bound, epsilon=epsilon,
                         eta_accept=eta_accept) <= 0.0


def accept_margin(n, *, metric, target, expected, bound, epsilon, eta_accept) -> float:
    """log(p-value) - log(sampling share of eta) of the ACCEPT test at ``n`` (real n allowed): <= 0 iff it passes."""
    import math

    from sage_tfx.validation.core import Mode, NoisyTotal
    from sage_tfx.validation.noisy import noisy_sum_test

    b, tau, mean, binomial = _accept_test(metric, target, expected, bound)
    scale = b / epsilon  # release_pair: Lap(B/eps) on each sum
    total, complement = NoisyTotal(n * mean, scale), NoisyTotal(n * (b - mean), scale)
    p_value, eta_s, _ = noisy_sum_test(total, complement, b, min(tau, b * (1.0 - 1e-9)), eta_accept, Mode.SAGE, -1,
                                       binomial)
    return math.log(max(p_value, 1e-300)) - math.log(eta_s)


def least_test_rows(*, metric, target, expected, bound, epsilon, eta_accept) -> int | None:
    """The least integer n at which ``accept_passes``; None if none up to MAX_TEST_ROWS does.

    Brent's method (scipy.optimize.brentq) on the margin over log n, evaluated at whole rows (a step
    function), then the integer neighbours checked: the result passes and n - 1 does not. The margin decreases in n when the expected value meets the target with room (more rows
    shrink both the sampling and the noise terms), which the check of the neighbours confirms at the answer.
    """
    import math

    from scipy.optimize import brentq

    args = dict(metric=metric, target=target, expected=expected, bound=bound, epsilon=epsilon, eta_accept=eta_accept)

    def margin(log_n):  # at whole rows: the exact binomial test sums over the integer counts near n
        return accept_margin(max(1, round(math.exp(log_n))), **args)

    lo, hi = 0.0, math.log(MAX_TEST_ROWS)
    if margin(hi) > 0:
        return None
    if margin(lo) <= 0:
        return 1
    n = max(1, math.ceil(math.exp(brentq(margin, lo, hi, xtol=1e-12, rtol=1e-12))))
    for _ in range(1000):  # at most a few steps: brentq stops within 1e-12 of the crossing in log n
        if not accept_passes(n, **args):
            n += 1
        elif n > 1 and accept_passes(n - 1, **args):
            n -= 1
        else:
            return n
    raise RuntimeError(f"the ACCEPT test is not monotone in n near {n} rows ({args})")


def iterator_settings(settings: dict) -> dict:
    """SageIterator's settings that shape the split and the first epsilon: its own defaults, then ``settings``."""
    import inspect

    from sage_tfx.adaptive import SageIterator

    defaults = {name: p.default for name, p in inspect.signature(SageIterator.__init__).parameters.items()
                if p.default is not inspect.Parameter.empty}
    return {**defaults, **{k: v for k, v in settings.items() if v is not None}}


def estimate_accept(sla, target: float, *, expected: float | None = None, confidence: float = 0.95,
                    settings: dict | None = None) -> AcceptEstimate:
    """Test rows (and rows) at which the ACCEPT test at ``target`` passes, at each of a few iteration epsilons.

    ``expected``: a PUBLIC guess of the model's true metric (a loss, or an accuracy); default: half the target
    (accuracy: half the target's error rate). ``settings``: the iterator's (the pipeline's defaults and the CLI's
    overrides: epsilon_start, preprocessing_share, count_share, rejection_share, disjoint_split). For epsilon
    e = epsilon_start * 2^k (k = 0..3, attempt k + 1: the iterator doubles epsilon after each RETRY when the
    budget allows), the split is ``BudgetSplit.for_epsilon`` as the iterator makes it; the ACCEPT test gets the
    split's validation epsilon and eta_{k+1} = eta / ((k+1)(k+2)), halved when a REJECT test runs (split_eta).
    Rows = test rows / the eval split's share of BlockExampleGen's hash split. Spends nothing: public numbers only.
    """
    from sage_tfx.privacy import BudgetSplit
    from sage_tfx.validation.core import eta_for_attempt, split_eta

    metric = sla.metric
    target = sla.check_target(target)
    bound = 1.0 if metric == "accuracy" else float(sla.loss_bound)
    if not 0 < confidence < 1:
        raise ValueError(f"confidence {confidence!r} must be in (0, 1)")
    is_default = expected is None
    if metric == "accuracy":
        expected = 1.0 - EXPECTED_FRACTION * (1.0 - target) if is_default else float(expected)
        if not target < expected <= 1.0:
            raise ValueError(f"expected accuracy {expected!r} must be above the target {target:g} and at most 1: "
                             "the ACCEPT test cannot pass for a model whose accuracy misses the target")
    else:
        expected = EXPECTED_FRACTION * target if is_default else float(expected)
        if not 0.0 <= expected < target:
            raise ValueError(f"expected loss {expected!r} must be in [0, target {target:g}): the ACCEPT test cannot "
                             "pass for a model whose loss misses the target")
    from sage_tfx.components.block_example_gen_executor import DEFAULT_SPLITS  # (imports TFX: after the checks)

    s = iterator_settings(settings or {})
    eval_share = DEFAULT_SPLITS["eval"] / sum(DEFAULT_SPLITS.values())
    rows = []
    for k in range(ESTIMATE_DOUBLINGS):
        epsilon, attempt = float(s["epsilon_start"]) * 2 ** k, k + 1
        split = BudgetSplit.for_epsilon(epsilon, 0.0, s["preprocessing_share"], s["count_share"],
                                        rejection_share=s["rejection_share"], disjoint_split=s["disjoint_split"])
        eta_accept, _ = split_eta(eta_for_attempt(1.0 - confidence, attempt), split.rejection > 0)
        n = least_test_rows(metric=metric, target=target, expected=expected, bound=bound,
                            epsilon=split.validation, eta_accept=eta_accept)
        total = None if n is None else -(-n * sum(DEFAULT_SPLITS.values()) // DEFAULT_SPLITS["eval"])
        rows.append(AcceptRow(epsilon, attempt, split.validation, eta_accept, n, total))
    return AcceptEstimate(metric, target, expected, is_default, bound, confidence, eval_share, rows)


def describe_estimate(estimate: AcceptEstimate, min_window: int | None = None) -> list:
    """The estimate as lines for ``sage run --check``."""
    e = estimate
    unit = "accuracy" if e.metric == "accuracy" else f"{e.metric} (losses clipped to [0, {e.bound:g}])"
    guess = ("the default: half the target's error rate" if e.metric == "accuracy" else
             "the default: half the target") if e.expected_is_default else "--expected-loss"
    lines = [f"estimate for target {e.target:g} ({unit}), confidence {e.confidence:g}, if the model's true "
             f"{'accuracy' if e.metric == 'accuracy' else 'loss'} is {e.expected:g} ({guess}):",
             "  rows at which the validator's ACCEPT test passes when the released sums equal their expectations "
             "(noise and sampling error at their medians: about even odds; plan for more):"]
    for r in e.rows:
        if r.test_rows is None:
            need = f"out of reach (no test set up to {MAX_TEST_ROWS:.0e} rows)"
        else:
            need = (f"{r.test_rows:,} test rows = about {r.rows:,} rows of the window (the eval split is "
                    f"{e.eval_share:.0%} of the rows)")
        lines.append(f"  epsilon {r.epsilon:g} per block (attempt {r.attempt}: validation epsilon "
                     f"{r.validation_epsilon:.4g}, eta {r.eta_accept:.3g}): {need}")
    lines.append("  blocks: not estimated: the stream publishes no rows per block (a block's row count is data); "
                 "divide the rows by your own public estimate of rows per block"
                 + (f" (the first window is {min_window} block(s))" if min_window else ""))
    lines.append("  training: not estimated (the rows DP-SGD needs to reach the target depend on the model and the "
                 "data; the validator's bounds say nothing about them)")
    return lines


def generated_rows(schema: dict, blocks_config: dict, label: str, metric: str, n_blocks: int, rows_per_block: int,
                   seed: int = 0):
    """A pyarrow Table of GENERATED rows of ``schema`` ({column: int|float|bytes}) filling ``n_blocks`` blocks."""
    import numpy as np
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
        if name == label and metric == "accuracy":
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
    chain, seen = [exc], {id(exc)}
    while True:
        nxt = chain[-1].__cause__ or chain[-1].__context__
        if nxt is None or id(nxt) in seen:
            break
        chain.append(nxt)
        seen.add(id(nxt))
    first = chain[-1]
    text = "".join(traceback.format_exception(type(first), first, first.__traceback__)).rstrip()
    if len(text) > limit:
        text = "...\n" + text[-limit:]
    if first is not exc:
        text += f"\n(then, while handling it: {type(exc).__name__}: {exc})"
    return text


def _spec(stream, blocks_config):
    from sage_tfx.ingest.pipeline import make_spec

    if blocks_config.get("by") == "user":
        return make_spec("user", stream, user_column=blocks_config["column"], shards=int(blocks_config["shards"]),
                         hash_key="sage-check")
    return make_spec("time", stream, time_column=blocks_config["column"], window=int(blocks_config["window"]))


def dry_run(definition, data_root: str, stream: str, *, model: str | None = None, runner: str = "local",
            beam_args=(), progress=print, seed: int = 0, target: float | None = None, expected: float | None = None,
            confidence: float = 0.95, overrides: dict | None = None, spec: str | None = None,
            secrets=()) -> CheckResult:
    """One iteration of ``definition`` on GENERATED rows of ``stream``'s schema, in a throwaway ledger; then, given
    ``target``, the rows and epsilon to ACCEPT (``estimate_accept``; ``overrides``: the CLI's iterator settings).
    ``spec`` (``sage run --check``): the iteration runs in a confined child (``pipelines.confined``) served by a
    grant server over the throwaway ledger, which may reach none of ``secrets`` (the real ledger's files)."""
    from sage_tfx.adaptive import SageIterator
    from sage_tfx.ingest.pipeline import ingest_batches
    from sage_tfx.ingest.store import stream_config
    from sage_tfx.pipelines._runner import PipelineConfig, check_stream_schema, make_run_iteration
    from sage_tfx.privacy import Ledger

    schema = check_stream_schema(data_root, stream, definition.sla, definition.name)
    config = stream_config(data_root, stream)
    definition.model_family(model)
    settings = dict(definition.defaults)
    estimate = None
    if target is not None:  # bad --target / --expected-loss fail here, before the dry run
        estimate = estimate_accept(definition.sla, target, expected=expected, confidence=confidence,
                                   settings={**settings, **(overrides or {})})
    n_blocks = max(1, int(settings.get("min_window", 1)))
    rows_per_block = max(4, -(-2000 // n_blocks))
    target = 0.5 if definition.sla.metric == "accuracy" else definition.sla.loss_bound / 2
    table = generated_rows(schema, config["blocks"], definition.sla.label, definition.sla.metric, n_blocks,
                           rows_per_block, seed)
    result = CheckResult(ok=False, rows=table.num_rows, blocks=n_blocks)

    def say(line):
        result.lines.append(line)
        progress(line)

    with tempfile.TemporaryDirectory(prefix="sage-check-") as tmp:
        db, data = os.path.join(tmp, "ledger.db"), os.path.join(tmp, "data")
        say(f"[check] {table.num_rows:,} GENERATED rows of the schema of stream {stream!r} in {n_blocks} block(s), "
            f"in a throwaway ledger ({tmp}); the real ledger is not touched")
        with Ledger.open(db, create=True) as ledger:
            ledger.create_stream(stream, 100.0, 1e-3, max_epsilon=100.0)
            ingest_batches(ledger, stream, data, table.to_batches(), _spec(stream, config["blocks"]), schema)
            pipeline_config = PipelineConfig(name=definition.name, ledger=db, stream=stream, data_root=data,
                                             work_dir=os.path.join(tmp, "work"), target=target, runner=runner,
                                             beam_pipeline_args=list(beam_args), model=model)
            settings["epsilon_start"] = min(1.0, float(settings.get("epsilon_start", 1.0)))
            execute = None
            if spec is not None:
                from sage_tfx.pipelines.confined import confined_execute, ledger_secrets

                execute = confined_execute(spec, definition, pipeline_config, [*secrets, *ledger_secrets(db)],
                                           check=True)
            iterator = SageIterator(ledger, stream, definition.name,
                                    make_run_iteration(definition.build_pipeline, pipeline_config, execute),
                                    max_iterations=1, progress=lambda line: say("[check] " + line), **settings)
            try:
                run = iterator.run()
            except Exception as exc:  # generated rows only: the whole error may be shown
                result.error = getattr(exc, "detail", None) or describe_failure(exc)
                return result
        result.ok, result.outcome = True, run.outcome
    if estimate is not None:
        result.estimate = estimate
        min_window = {**settings, **(overrides or {})}.get("min_window") or iterator_settings({})["min_window"]
        for line in describe_estimate(estimate, min_window):
            say("[check] " + line)
    else:
        say("[check] give --target (and optionally --expected-loss) to estimate the rows and epsilon to ACCEPT")
    return result
