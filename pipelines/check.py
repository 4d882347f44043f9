"""A dry run that spends nothing: one iteration of a pipeline on GENERATED rows of the stream's schema.

``sage run PIPELINE --check`` runs ``dry_run``: it reads the stream's public schema and block layout from
the data root, GENERATES rows of that schema (random values of each column's kind, about one in a hundred
missing, the label 0/1 for accuracy), ingests them into a throwaway ledger and data root, and runs one
iteration of the whole TFX pipeline there: DPTransform traces and runs the preprocessing_fn, DPTrainer
runs run_fn, DPModelValidator validates. A schema mismatch (a feature the stream lacks, a string where a
number is expected) or a bug in a module file shows up here, with its traceback, BEFORE anything is
charged on the real ledger, which is never opened for writing. The outcome itself (ACCEPT, RETRY, ...)
means nothing: the rows are noise.
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
            beam_args=(), progress=print, seed: int = 0) -> CheckResult:
    """One iteration of ``definition`` on GENERATED rows of ``stream``'s schema, in a throwaway ledger."""
    from sage_tfx.adaptive import SageIterator
    from sage_tfx.components.transform_utils import stream_schema
    from sage_tfx.ingest.pipeline import ingest_batches
    from sage_tfx.ingest.store import stream_config
    from sage_tfx.pipelines._runner import PipelineConfig, make_run_iteration
    from sage_tfx.privacy import Ledger

    config = stream_config(data_root, stream)
    if config is None:
        raise ValueError(f"stream {stream!r} has no schema under {os.path.abspath(data_root)}: ingest data first "
                         "(sage ingest ...), so the check knows the stream's columns")
    schema = stream_schema(data_root, stream)
    if definition.sla.label not in schema and definition.sla.label_signature is None:  # else the model derives it
        raise ValueError(f"pipeline {definition.name!r}: its SLA label {definition.sla.label!r} is not a column of "
                         f"stream {stream!r} (columns: {', '.join(sorted(schema))})")
    definition.model_family(model)
    settings = dict(definition.defaults)
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
            ledger.create_stream(stream, 100.0, 1e-3)
            ingest_batches(ledger, stream, data, table.to_batches(), _spec(stream, config["blocks"]), schema)
            pipeline_config = PipelineConfig(name=definition.name, ledger=db, stream=stream, data_root=data,
                                             work_dir=os.path.join(tmp, "work"), target=target, runner=runner,
                                             beam_pipeline_args=list(beam_args), model=model)
            settings["epsilon_start"] = min(1.0, float(settings.get("epsilon_start", 1.0)))
            iterator = SageIterator(ledger, stream, definition.name,
                                    make_run_iteration(definition.build_pipeline, pipeline_config),
                                    max_iterations=1, progress=lambda line: say("[check] " + line), **settings)
            try:
                run = iterator.run()
            except Exception as exc:  # generated rows only: the whole error may be shown
                result.error = describe_failure(exc)
                return result
        result.ok, result.outcome = True, run.outcome
    return result
