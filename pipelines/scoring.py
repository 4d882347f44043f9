"""Score an ACCEPTed model on hold-out rows beside NON-PRIVATE baselines fitted on the rows it trained on.

``score_model`` (``sage score``) refuses a hold-out that shares a row with the stream and reports the SLA's
metric for the pushed DP model and, for comparison only, for baselines fitted without privacy on the training
side of the ACCEPTed grant's records. It is TRUSTED code: each block read leaves a ``trusted_read`` entry in
the ledger's audit log, nothing is charged, and user code (the pushed model) runs only in a confined child.

What is reported and how: docs/your_pipeline.md, "Scoring the ACCEPTed model on a hold-out: `sage score`".
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence

import numpy as np

from sage_tfx.privacy import DEFAULT_RECORD_SPLIT, Ledger, record_split
from sage_tfx.privacy.errors import SageError
from sage_tfx.privacy.vocabulary import Metric, Outcome

REGRESSION_METRICS = (Metric.MSE, Metric.MAE)
CLASSIFICATION_METRICS = (Metric.ACCURACY, Metric.LOG_LOSS)
TRUSTED_PURPOSE = "sage score"  # every audit entry of a score starts with it


class ScoreError(SageError, ValueError):
    """Bad input to a score (names the value and the fix), or a hold-out that is not held out."""


# ------------------------------------------------------------------ the model and the rows to compare on


def pushed_models(serving_dir: str) -> list:
    """The model versions Pusher wrote under ``serving_dir`` (each a SavedModel directory), oldest first.

    Args:
        serving_dir: The directory Pusher pushes to (``sage run --work-dir W`` pushes to W/serving).

    Returns:
        The paths of its numbered version directories, oldest first; empty if ``serving_dir`` does not exist.
    """
    if not os.path.isdir(serving_dir):
        return []
    return sorted(os.path.join(serving_dir, d) for d in os.listdir(serving_dir) if d.isdigit())


def accepted_model(ledger_location, stream: str, pipeline: str, serving_dir: str):
    """The pipeline's last ACCEPTed grant and the newest model pushed under ``serving_dir``.

    E.g. to score that model on held-out rows.

    Args:
        ledger_location: A Ledger or its location (file or postgresql:// URL).
        stream: The stream the pipeline ran on.
        pipeline: The pipeline's name in the ledger.
        serving_dir: The directory the run pushed to (W/serving).

    Returns:
        (the last ACCEPTed ``Grant``, the path of the newest pushed model).

    Raises:
        LookupError: no ACCEPTed grant of the pipeline on the stream, or no model pushed under ``serving_dir``.
    """
    if isinstance(ledger_location, Ledger):
        history = ledger_location.history(stream, pipeline)
    else:
        with Ledger.open(ledger_location) as ledger:
            history = ledger.history(stream, pipeline)
    accepted = [g for g, outcome, _ in history if outcome == Outcome.ACCEPT]
    if not accepted:
        raise LookupError(
            f"no ACCEPTed {pipeline!r} grant on stream {stream!r} in {ledger_location}: run the "
            "pipeline first (sage run)"
        )
    models = pushed_models(serving_dir)
    if not models:
        raise LookupError(
            f"no pushed model under {serving_dir}: give the run's serving directory (sage run "
            "--work-dir W pushes to W/serving)"
        )
    return accepted[-1], models[-1]


def block_rows(
    data_root: str, stream: str, blocks: Sequence[str], split: str | None = None, *, ledger, purpose: str, records=None
):
    """The rows of committed blocks as one RecordBatch of list columns, in the stream's schema.

    Read the way trusted code reads them: the blocks' encrypted files under the data root, with their keys from
    ``ledger`` (a Ledger or its location; ``access.read_block_records``, TRUSTED CODE ONLY: for the non-private
    baselines), after a ``trusted_read`` entry naming the blocks and ``purpose`` is in the ledger's audit log.
    With ``split`` (a split name, e.g. "train"), only the records BlockExampleGen assigns to that split under
    the record split ``records`` (a ``RecordSplit``; default the platform's, train 9 : eval 1).
    """
    from sage_tfx.ingest.access import read_block_records
    from sage_tfx.ingest.records import decode

    schema = _schema(data_root, stream)
    if isinstance(ledger, Ledger):
        rows = list(read_block_records(ledger, data_root, stream, blocks, purpose=purpose))
    else:
        with Ledger.open(ledger) as opened:
            rows = list(read_block_records(opened, data_root, stream, blocks, purpose=purpose))
    if split is not None:
        rows = _of_splits(rows, records or DEFAULT_RECORD_SPLIT, [split])
    return decode(rows, schema)


def training_rows(data_root: str, stream: str, grant, *, ledger, purpose: str):
    """The rows of ``grant``'s blocks on the training side of its signed record split (what its training read),
    as ``block_rows`` gives them (a trusted read of an open ``ledger``, logged with ``purpose``)."""
    from sage_tfx.ingest.access import read_block_records
    from sage_tfx.ingest.records import decode

    rule = record_split(grant)
    rows = list(read_block_records(ledger, data_root, stream, grant.blocks, purpose=purpose))
    return decode(_of_splits(rows, rule, rule.training), _schema(data_root, stream))


def _of_splits(rows, rule, names):
    """The serialized records of ``rows`` that BlockExampleGen puts in one of the splits ``names`` of ``rule``."""
    from sage_tfx.components.granted_reads import split_index

    order, bounds, total = list(rule.splits), [], 0
    for name in order:
        total += rule.splits[name]
        bounds.append(total)
    wanted = {order.index(n) for n in names}
    return [r for r in rows if split_index(r, bounds) in wanted]


def example_rows(table, schema: dict):
    """``table``'s rows (a pyarrow Table of raw columns) as list columns of the stream's schema, as they are
    ingested and served."""
    import pyarrow as pa

    from sage_tfx.ingest.records import to_example_batch

    batches = table.to_batches() or [pa.RecordBatch.from_pylist([], schema=table.schema)]
    return pa.Table.from_batches([to_example_batch(b, schema) for b in batches]).combine_chunks().to_batches()[0]


def row_key_set(example_batch) -> set:
    """Full-row keys of list-column rows: the value hash that block digests sum (every column, every value)."""
    from sage_tfx.ingest.records import row_hashes

    return set(row_hashes(example_batch).tolist())


def overlap_count(stream_rows, held_out_rows) -> int:
    """How many rows of ``held_out_rows`` are also rows of ``stream_rows`` (both list-column batches of one
    schema; full-row keys, every column)."""
    ingested = row_key_set(stream_rows)
    return sum(key in ingested for key in row_key_set(held_out_rows))


def held_out_overlap(data_root: str, stream: str, blocks: Sequence[str], held_out, *, ledger) -> int:
    """How many held-out rows (a pyarrow Table of raw columns) are also rows of ``blocks`` (full-row keys); a
    held-out set must give 0. A trusted read of ``blocks``, logged."""
    ingested = block_rows(
        data_root, stream, blocks, ledger=ledger, purpose="held-out check: no held-out row is a stream row"
    )
    return overlap_count(ingested, example_rows(held_out, _schema(data_root, stream)))


def read_held_out(path: str, schema: dict, fmt: str | None = None):
    """The rows of a hold-out file (CSV, TFRecord of tf.Examples, or Parquet) as one list-column RecordBatch of
    the stream's ``schema`` (extra columns dropped; a missing column is an InputError naming it)."""
    import pyarrow as pa

    from sage_tfx.ingest.records import input_format, read_batches, to_example_batch

    if not os.path.exists(path):
        raise ScoreError(f"hold-out file {path!r} does not exist")
    batches = [to_example_batch(b, schema) for b in read_batches(path, input_format(path, fmt), schema)]
    if not batches:
        raise ScoreError(f"hold-out file {path!r} holds no row")
    return pa.Table.from_batches(batches).combine_chunks().to_batches()[0]


def _schema(data_root, stream):
    from sage_tfx.ingest.layout import stream_config

    config = stream_config(data_root, stream)
    if config is None:
        raise ScoreError(
            f"stream {stream!r} has no data under {data_root!r}: give the --data-root `sage ingest` wrote it to"
        )
    return config["schema"]


def scalar_column(example_batch, name: str) -> np.ndarray:
    """A list column as floats: a row's one value, NaN where it has none or several."""
    return np.array(
        [float(v[0]) if v is not None and len(v) == 1 else np.nan for v in example_batch.column(name).to_pylist()],
        dtype=float,
    )


# ------------------------------------------------------------------ the non-private baselines


def design_matrix(example_batch, features: Sequence[str], center=None, scale=None):
    """(x, center, scale): the scalar ``features`` of the rows, standardized by ``center`` / ``scale`` (fitted
    here, on these rows, when None); a missing value is the centre (0 after standardizing)."""
    columns = (
        np.column_stack([scalar_column(example_batch, f) for f in features])
        if features
        else np.zeros((example_batch.num_rows, 0))
    )
    finite = np.isfinite(columns)
    if center is None:
        center = np.where(finite, columns, 0.0).sum(axis=0) / np.maximum(finite.sum(axis=0), 1)
        filled = np.where(finite, columns, center)
        scale = filled.std(axis=0)
        scale = np.where(scale > 0, scale, 1.0)
    x = (np.where(finite, columns, center) - center) / scale
    return x, center, scale


def least_squares(x: np.ndarray, y: np.ndarray):
    """Ordinary least squares with an intercept; returns predict(x)."""
    design = np.column_stack([x, np.ones(len(x))])
    coef = np.linalg.lstsq(design, y, rcond=None)[0]
    return lambda z: np.column_stack([z, np.ones(len(z))]) @ coef


def logistic_regression(x: np.ndarray, y: np.ndarray, l2: float = 1e-6, iterations: int = 100):
    """Logistic regression with an intercept (Newton's method, a tiny ridge ``l2`` per row so that separable
    rows converge); returns predict(x) -> P(label = 1). ``y`` must hold 0 and 1 only (ScoreError)."""
    y = np.asarray(y, dtype=float)
    other = y[~np.isin(y, (0.0, 1.0))]
    if len(other):
        raise ScoreError(
            f"logistic regression needs labels 0 and 1, not {other[0]!r}: give the SLA a "
            "label_threshold (1 where the label exceeds it) for another label"
        )
    design = np.column_stack([x, np.ones(len(x))])
    w = np.zeros(design.shape[1])
    ridge = l2 * len(y) * np.eye(len(w))
    ridge[-1, -1] = 0.0
    for _ in range(iterations):
        p = 1.0 / (1.0 + np.exp(-np.clip(design @ w, -30, 30)))
        gradient = design.T @ (p - y) + ridge @ w
        hessian = (design * (p * (1 - p))[:, None]).T @ design + ridge + 1e-9 * np.eye(len(w))
        step = np.linalg.solve(hessian, gradient)
        w -= step
        if np.max(np.abs(step)) < 1e-9:
            break
    return lambda z: 1.0 / (1.0 + np.exp(-np.clip(np.column_stack([z, np.ones(len(z))]) @ w, -30, 30)))


def fit_baselines(metric: str, x: np.ndarray, y: np.ndarray) -> dict:
    """{name: (description, predict(x))} of the NON-PRIVATE baselines for ``metric`` fitted on (x, y): the mean
    label and least squares (mse, mae), or the majority class (its rate: the best constant under log_loss) and
    logistic regression for a binary label (accuracy, log_loss). ScoreError for no row or another metric."""
    if not len(y):
        raise ScoreError("the ACCEPTed grant's training split holds no labelled row to fit a baseline on")
    if metric in REGRESSION_METRICS:
        mean = float(np.mean(y))
        return {
            "mean_label": ("the mean training label, NOT private", lambda z: np.full(len(z), mean)),
            "least_squares": ("least squares on the baseline features, NOT private", least_squares(x, y)),
        }
    if metric in CLASSIFICATION_METRICS:
        rate = float(np.mean(y))
        constant = float(rate >= 0.5) if metric == Metric.ACCURACY else rate
        return {
            "majority_class": (
                "the majority training class (its rate for log_loss), NOT private",
                lambda z: np.full(len(z), constant),
            ),
            "logistic_regression": (
                "logistic regression on the baseline features, NOT private",
                logistic_regression(x, y),
            ),
        }
    raise ScoreError(f"metric {metric!r} has no built-in baseline (mse, mae, accuracy, log_loss have)")


def summary(values: np.ndarray, metric: str, loss_bound: float | None, target: float | None) -> dict:
    """The mean per-example value (losses clipped to [0, B], as the SLA measures them), its standard error, the
    unclipped mean for a loss, and whether it meets ``target``."""
    values = np.asarray(values, dtype=float)
    clipped = values if loss_bound is None else np.clip(values, 0.0, loss_bound)
    out = {
        "value": float(clipped.mean()),
        "standard_error": float(clipped.std(ddof=1) / math.sqrt(len(clipped))) if len(clipped) > 1 else None,
    }
    if loss_bound is not None:
        out["unclipped"] = float(values.mean())
    if target is not None:
        out["meets_target"] = bool(out["value"] >= target if metric == Metric.ACCURACY else out["value"] <= target)
    return out


# ------------------------------------------------------------------ the score


def default_features(schema: dict, label: str, exclude: Sequence[str] = ()) -> list:
    """The baselines' default features: the stream's numeric columns but the label and ``exclude``."""
    return [c for c, kind in sorted(schema.items()) if kind in ("int", "float") and c != label and c not in exclude]


def score_model(
    ledger,
    stream: str,
    pipeline,
    held_out: str,
    *,
    data_root: str,
    serving_dir: str,
    name: str | None = None,
    features: Sequence[str] | None = None,
    fmt: str | None = None,
) -> dict:
    """Score the model ``pipeline`` pushed after its last ACCEPT on the rows of the file ``held_out``.

    Two trusted reads are logged in the ledger: every block (the overlap check) and the grant's blocks (the
    baselines' rows).

    Args:
        ledger: a Ledger or its location (file or postgresql:// URL).
        stream: the stream the pipeline ran on.
        pipeline: a SagePipeline, or what ``sage run`` takes (built-in name, pipeline file, module path).
        held_out: a CSV (like the stream's input), TFRecord of tf.Examples or Parquet file, read in the stream's
            schema; rows without the label (or with several values) are left out and counted.
        data_root: the data root the stream's blocks are under.
        serving_dir: the directory the run pushed to (W/serving).
        name: the pipeline name the run used (``sage run --name``); default the pipeline's.
        features: the baselines' raw columns (default: every numeric column but the label and the stream's
            time column). Leave out columns computed from the label: the baselines are only as fair as them.
        fmt: the hold-out's format when its name does not tell.

    Returns:
        The report (JSON-ready).

    Raises:
        ScoreError: a bad value (a ValueError naming it), or a hold-out row that is a row of the stream (nothing
            is scored).
        LookupError: no ACCEPT, or no pushed model.
    """
    from sage_tfx.ingest.layout import stream_config
    from sage_tfx.pipelines import SagePipeline
    from sage_tfx.pipelines.confined import describe, ledger_secrets

    if isinstance(pipeline, SagePipeline):
        definition = pipeline
    else:  # a user's pipeline file is loaded in a confined child, never beside the key
        definition = describe(pipeline, [] if isinstance(ledger, Ledger) else ledger_secrets(ledger))
    sla, name = definition.sla, name or definition.name
    if sla.metric not in REGRESSION_METRICS + CLASSIFICATION_METRICS:
        raise ScoreError(f"SLA metric {sla.metric!r}: sage score reports mse, mae, accuracy and log_loss")
    schema = _schema(data_root, stream)
    blocks_rule = (stream_config(data_root, stream) or {}).get("blocks") or {}
    time_column = blocks_rule.get("column") if blocks_rule.get("by") == "time" else None
    features = list(features) if features else default_features(schema, sla.label, [time_column])
    unknown = [f for f in features if schema.get(f) not in ("int", "float")]
    if unknown:
        raise ScoreError(
            f"baseline feature(s) {unknown} are not numeric columns of stream {stream!r} (numeric: "
            f"{default_features(schema, '')})"
        )
    if sla.label_signature is None and sla.label not in schema:
        raise ScoreError(f"label {sla.label!r} is not a column of stream {stream!r}")
    held = read_held_out(held_out, schema, fmt)
    if isinstance(ledger, Ledger):
        return _score(ledger, stream, definition, name, held, held_out, data_root, serving_dir, features)
    with Ledger.open(ledger) as opened:
        return _score(opened, stream, definition, name, held, held_out, data_root, serving_dir, features)


def _score(ledger, stream, definition, name, held, held_path, data_root, serving_dir, features):
    from sage_tfx.components.validation_steps import per_example_values
    from sage_tfx.pipelines.confined import score_outputs

    sla = definition.sla
    grant, model_dir = accepted_model(ledger, stream, name, serving_dir)
    _check_disjoint(ledger, stream, data_root, held, held_path)
    train = training_rows(
        data_root,
        stream,
        grant,
        ledger=ledger,
        purpose=f"{TRUSTED_PURPOSE}: non-private baselines on the training split of ACCEPTed grant {grant.id}",
    )
    schema = _schema(data_root, stream)
    held_encoded = _encoded(held, schema)
    if sla.label_signature:  # the model derives the labels: it sees the held-out and the training rows
        served = score_outputs(
            model_dir, held_encoded, _encoded(train, schema), label=sla.label, label_signature=sla.label_signature
        )
    else:
        served = {"held_labels": scalar_column(held, sla.label), "train_labels": scalar_column(train, sla.label)}
    y_held, keep, held_rows = _labelled(served, sla, "held", held)
    held_records = [r for r, k in zip(held_encoded, keep) if k]
    if not len(y_held):
        raise ScoreError(f"no row of the hold-out {held_path} has the label {sla.label!r}")
    if not sla.label_signature:  # only the labelled hold-out rows go to the model: none of the stream's
        served.update(score_outputs(model_dir, held_records, [], label=sla.label))
    raw_labels = np.asarray(served["raw_labels"], dtype=float)
    outputs = {key: np.asarray(values, dtype=float) for key, values in served["outputs"].items()}
    if len(raw_labels) != len(y_held):
        raise ScoreError(
            f"the pushed model skipped {len(y_held) - len(raw_labels)} hold-out row(s) lacking a "
            "feature its signature reads: drop them from the hold-out"
        )
    target = (grant.meta or {}).get("request", {}).get("target")
    scores = {
        "dp_model": summary(
            per_example_values(sla.metric, y_held, outputs, None, sla.loss_bound), sla.metric, sla.loss_bound, target
        )
    }
    y_train, _, train_rows = _labelled(served, sla, "train", train)
    described = _score_baselines(scores, sla, train_rows, y_train, held_rows, y_held, features, target)
    return {
        "stream": stream,
        "pipeline": name,
        "grant": grant.id,
        "grant_blocks": len(grant.blocks),
        "model": model_dir,
        "held_out": held_path,
        "held_out_rows": int(held.num_rows),
        "held_out_rows_scored": int(len(y_held)),
        "held_out_rows_in_stream": 0,
        "metric": sla.metric,
        "loss_bound": sla.loss_bound,
        "label": sla.label,
        "label_threshold": sla.label_threshold,
        "target": target,
        "baseline_rows": int(len(y_train)),
        "baseline_features": list(features),
        "baselines_not_private": described,
        "scores": scores,
    }


def _check_disjoint(ledger, stream, data_root, held, held_path):
    """Refuse a hold-out that shares a row with the stream (``ScoreError``): it must hold rows never ingested."""
    everything = block_rows(
        data_root,
        stream,
        [b.id for b in ledger.blocks(stream)],
        ledger=ledger,
        purpose=f"{TRUSTED_PURPOSE}: no row of the hold-out {held_path} is a row of the stream",
    )
    overlap = overlap_count(everything, held)
    if overlap:
        raise ScoreError(
            f"{overlap} row(s) of the hold-out {held_path} are rows of stream {stream!r}: a hold-out "
            "must hold rows the stream never held (cut it by time before ingesting)"
        )


def _labelled(served, sla, name, batch):
    """(the labels as the SLA derives them, which rows have one, those rows)."""
    import pyarrow as pa

    labels = np.asarray(served[f"{name}_labels"], dtype=float)
    keep = np.isfinite(labels)
    labels = labels[keep]
    if sla.label_threshold is not None:
        labels = (labels > sla.label_threshold).astype(float)
    return labels, keep, batch.filter(pa.array(keep))


def _score_baselines(scores, sla, train_rows, y_train, held_rows, y_held, features, target) -> dict:
    """Fit the NON-PRIVATE baselines on the training rows, add their hold-out scores to ``scores``; return
    {baseline: its description}."""
    from sage_tfx.components.validation_steps import per_example_values

    x_train, center, scale = design_matrix(train_rows, features)
    x_held, _, _ = design_matrix(held_rows, features, center, scale)
    described = {}
    for key, (description, predict) in fit_baselines(sla.metric, x_train, y_train).items():
        values = per_example_values(sla.metric, y_held, {"predictions": predict(x_held)}, "predictions", sla.loss_bound)
        scores[key] = summary(values, sla.metric, sla.loss_bound, target)
        described[key] = description
    return described


def _encoded(batch, schema: dict) -> list:
    """A list-column batch's rows as serialized tf.Examples, as the stream's blocks hold them."""
    from sage_tfx.ingest.records import encode

    return list(encode(batch, schema)) if batch.num_rows else []


def write_report(report: dict, out_dir: str) -> list:
    """Write ``score.json`` and, when matplotlib is installed, ``score.png`` (each predictor's value with one
    standard error, the target as a line) into ``out_dir`` (created); return the paths written."""
    os.makedirs(out_dir, exist_ok=True)
    paths = [os.path.join(out_dir, "score.json")]
    with open(paths[0], "w") as f:
        json.dump(report, f, indent=1, sort_keys=True)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return paths
    names = list(report["scores"])
    values = [report["scores"][n]["value"] for n in names]
    errors = [report["scores"][n]["standard_error"] or 0.0 for n in names]
    fig, ax = plt.subplots(figsize=(6, 3))
    ax.barh(names, values, xerr=errors, color=["tab:blue"] + ["tab:gray"] * (len(names) - 1))
    if report.get("target") is not None:
        ax.axvline(report["target"], color="tab:red", linestyle="--", label=f"target {report['target']:g}")
        ax.legend(loc="lower right")
    clipped = "" if report.get("loss_bound") is None else f" (losses clipped at {report['loss_bound']:g})"
    ax.set_xlabel(f"{report['metric']} on {report['held_out_rows_scored']:,} hold-out rows{clipped}")
    ax.set_title(f"{report['pipeline']}: the DP model vs NON-PRIVATE baselines", fontsize=10)
    fig.tight_layout()
    paths.append(os.path.join(out_dir, "score.png"))
    fig.savefig(paths[1], dpi=100)
    plt.close(fig)
    return paths
