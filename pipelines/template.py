"""``sage init-pipeline DIR``: three files to start a pipeline of your own, for a stream's schema and label.

In the spirit of ``tfx template copy``: ``write_template`` writes ``pipeline.py`` (the SLA and the modules),
``preprocessing.py`` (a ``preprocessing_fn`` that clips every numeric feature to a public range and scales
it to [0, 1], one-hot encodes category codes, and marks a missing label NaN) and ``trainer.py`` (a ``run_fn``
training a DP linear model, AdaSSP, over a public prior, for mse / mae, or a DP logistic regression
for accuracy and log_loss; rows whose label is missing are dropped, as the validator skips them). They run as written
(``sage run DIR/pipeline.py --check`` passes on the stream), but the public bounds they hold are placeholders
to edit: every bound must be chosen without looking at the data (docs/your_pipeline.md).

Which columns become features (``plan_features``): the numeric ones, never the label, the time column(s),
nor a column the label is computed from or that is computed from it (``label_sources``, and any column whose
name contains the label's or is contained in it); ``categories`` ({int column: its codes}) are one-hot
encoded instead of used as numbers.
"""

from __future__ import annotations

import keyword
import os
import textwrap

import numpy as np

from sage_tfx.privacy.errors import SageError
from sage_tfx.privacy.vocabulary import Metric

FILES = ("pipeline.py", "preprocessing.py", "trainer.py")
NUMERIC = ("int", "float")
UNIX_SECONDS = (946684800, 4102444800)  # 2000-01-01 .. 2100-01-01: a numeric column of such values is a time
MAX_CODES = 20  # an int column with at most this many distinct values in a file's first rows: category codes


class TemplateError(SageError, ValueError):
    """Bad input to the template (names the value), or files that would be overwritten."""


def _identifier(name):
    return name.isidentifier() and not keyword.iskeyword(name)


DEFAULT_WINDOW = 64  # the first window when nothing is known of the stream's blocks
EPSILON_START = 0.25


def window_defaults(blocks: int | None = None, plan=None) -> tuple:
    """(defaults, comment lines) of the iterator settings the pipeline file gets: the first window is at most
    the stream's ``blocks`` (a window the stream cannot fill ends ``sage run`` at once in TIMEOUT), and the
    comment states ``plan`` (``sage_tfx.adaptive.plan_attempts`` on the stream's budget now: its attempts and
    the RETRYs it allows), or how to get it."""
    window = DEFAULT_WINDOW if not blocks else min(DEFAULT_WINDOW, int(blocks))
    defaults = {"epsilon_start": EPSILON_START, "min_window": window, "rejection_share": 0.1}
    lines = [
        "the first iteration's per-block epsilon and window (blocks); a tenth of the training side pays for",
        "the REJECT test on the training split.",
    ]
    if blocks:
        lines.append(f"The stream had {blocks} block(s) when this was written: the window is at most that.")
    if plan is not None:
        lines += [
            "Epsilon plan on the stream's budget then (no new block; `sage run` does not wait for blocks):",
            plan.describe(),
        ]
    else:
        lines.append("`sage run pipeline.py --check --target T` lists the attempts the stream's budget allows.")
    return defaults, lines


def plan_features(schema: dict, label: str, *, time_columns=(), label_sources=(), categories=None):
    """(numeric features, {category column: codes}, {left-out column: why}) for ``label`` over ``schema``.

    Left out: every bytes column, the ``time_columns``, the ``label_sources`` and every numeric column whose
    name contains the label's name or is contained in it (it may be the label's source or a copy: pass it
    again as a category or rename it to keep it). TemplateError names a category column that is not a
    numeric column of the schema (or is the label), or a label source that is no column.
    """
    categories = dict(categories or {})
    for column in list(categories) + list(label_sources):
        if column not in schema:
            raise TemplateError(f"column {column!r} is not in the schema (columns: {', '.join(sorted(schema))})")
    for column in categories:
        if schema[column] not in NUMERIC or column == label:
            what = "is the label" if column == label else f"holds {schema[column]}"
            raise TemplateError(
                f"category column {column!r} {what}: category codes must be a numeric column other than the label"
            )
    why = {}
    lowered = label.lower()
    for column, kind in sorted(schema.items()):
        if column == label:
            continue
        if kind not in NUMERIC:
            why[column] = "not numeric"
        elif column in time_columns:
            why[column] = "the time column"
        elif column in label_sources:
            why[column] = "the label's source (--label-source)"
        elif (
            column not in categories
            and min(len(column), len(label)) >= 3
            and (lowered in column.lower() or column.lower() in lowered)
        ):
            why[column] = f"its name overlaps the label's {label!r}: it may be the label's source or a copy"
    features = [
        c
        for c, kind in sorted(schema.items())
        if kind in NUMERIC and c != label and c not in why and c not in categories
    ]
    return features, categories, why


def write_template(
    directory: str,
    schema: dict,
    label: str,
    metric: str,
    *,
    name: str | None = None,
    loss_bound: float | None = None,
    time_column: str | None = None,
    time_columns=(),
    label_sources=(),
    categories=None,
    force: bool = False,
    blocks: int | None = None,
    plan=None,
) -> list:
    """Write the three files into ``directory`` (created); return their paths. Refuses to overwrite unless
    ``force``. ``schema``: {column: int|float|bytes}, the stream's public schema; ``time_column`` (or several,
    ``time_columns``), ``label_sources`` and ``categories`` as ``plan_features`` takes them. ``blocks``: the
    stream's active blocks and ``plan`` its ``AttemptPlan`` at the written settings, when known
    (``window_defaults``)."""
    from sage_tfx.pipelines.definition import SLA

    if label not in schema:
        raise TemplateError(f"label {label!r} is not a column of the schema (columns: {', '.join(sorted(schema))})")
    if schema[label] not in NUMERIC:
        raise TemplateError(f"label {label!r} holds {schema[label]}: a label must be numeric")
    name = name or os.path.basename(os.path.abspath(directory)).replace("-", "_")
    sla = SLA(metric=metric, label=label, loss_bound=loss_bound)  # names a bad metric or bound
    times = tuple(time_columns) + ((time_column,) if time_column else ())
    features, categories, why = plan_features(
        schema, label, time_columns=times, label_sources=label_sources, categories=categories
    )
    if not features and not categories:
        raise TemplateError(
            f"the schema has no numeric feature besides the label {label!r} and the columns left "
            f"out ({', '.join(f'{c}: {w}' for c, w in why.items())})"
        )
    paths = [os.path.join(directory, f) for f in FILES]
    existing = [p for p in paths if os.path.exists(p)]
    if existing and not force:
        raise TemplateError(f"{', '.join(existing)} exist(s): choose another directory, or pass --force to overwrite")
    os.makedirs(directory, exist_ok=True)
    keys = _keys(features)
    one_hot = [(column, code, _one_hot_name(column, code)) for column, codes in categories.items() for code in codes]
    texts = {
        "pipeline.py": _pipeline(name, sla, *window_defaults(blocks, plan)),
        "preprocessing.py": _preprocessing(features, label, why, categories),
        "trainer.py": _trainer(keys + [out for _, _, out in one_hot], label, sla),
    }
    for path in paths:
        with open(path, "w") as f:
            f.write(texts[os.path.basename(path)])
    return paths


def _keys(features):
    return [f if _identifier(f) else f"f{i}" for i, f in enumerate(features)]


def _one_hot_name(column, code):
    base = column if _identifier(column) else "category"
    return f"{base}_{str(code).replace('-', 'm')}"


def inspect_input(path: str, schema: dict, label: str, categorical=(), max_codes: int = MAX_CODES) -> tuple:
    """(time-like columns, {int column: its codes}) of a data file's first rows: the columns CSV or Parquet
    types as timestamps or dates or whose values all look like unix seconds (2000-2100), and the int columns (not the
    label) with 3 to ``max_codes`` distinct values,
    which are proposed as category codes (the codes seen, sorted), and the ``categorical`` columns however many
    codes they show. Reads only the user's own file."""
    import pyarrow as pa

    from sage_tfx.ingest.records import input_format, read_batches

    fmt = input_format(path)
    times = []
    if fmt in ("csv", "parquet"):
        if fmt == "csv":
            import pyarrow.csv as pacsv

            with pacsv.open_csv(path) as reader:
                types = {f.name: f.type for f in reader.schema}
        else:
            import pyarrow.parquet as pq

            types = {f.name: f.type for f in pq.read_schema(path)}
        times = [n for n, t in types.items() if pa.types.is_timestamp(t) or pa.types.is_date(t)]
    first = next(iter(read_batches(path, fmt, schema, batch_rows=65536)), None)
    categories = {}
    for column, kind in sorted(schema.items()):
        if first is None or kind not in NUMERIC or column == label or column in times:
            continue
        values = first.column(column).to_numpy(zero_copy_only=False).astype(float)
        seen = values[np.isfinite(values)]
        if column not in categorical and len(seen) and UNIX_SECONDS[0] <= seen.min() and seen.max() < UNIX_SECONDS[1]:
            times.append(column)  # unix seconds
            continue
        if kind != "int" and column not in categorical:
            continue
        codes = np.unique(seen)
        if (column in categorical or 3 <= len(codes) <= max_codes) and np.all(codes == np.round(codes)):
            categories[column] = [int(c) for c in codes]
    return times, categories


def _pipeline(name, sla, defaults, comment):
    bound = "" if sla.metric == Metric.ACCURACY else f", loss_bound={sla.loss_bound!r}"
    comment = "\n".join(
        textwrap.fill(line, 110, initial_indent="    # ", subsequent_indent="    # ") for line in comment
    )
    return f'''"""The {name} pipeline (written by `sage init-pipeline`; edit freely).

    sage run pipeline.py --check --db LEDGER --stream STREAM --data-root DATA    # a free dry run first
    sage run pipeline.py --db LEDGER --stream STREAM --data-root DATA --target TARGET
"""
from sage_tfx.pipelines import SLA, SagePipeline

PIPELINE = SagePipeline(
    name={name!r},
    # EDIT: the metric and, for a loss, the public bound B each example's loss is clipped to
    sla=SLA(metric={sla.metric!r}, label={sla.label!r}{bound}),
    preprocessing_module="preprocessing.py",
    trainer_module="trainer.py",
{comment}
    defaults={defaults!r},
)
'''


def _preprocessing(features, label, why, categories):
    ranges = "\n".join(f"    {f!r}: (0.0, 1.0)," for f in features)
    codes = "\n".join(f"    {c!r}: {list(v)!r}," for c, v in categories.items())
    names = {c: [_one_hot_name(c, code) for code in v] for c, v in categories.items()}
    left_out = "".join(f"\n- {c}: {w}" for c, w in why.items())
    left_out = f"\nNot used as features (edit FEATURES to change it):{left_out}\n" if why else ""
    return f'''"""preprocessing_fn for DPTransform (written by `sage init-pipeline`; edit freely).

Each numeric feature is clipped to a PUBLIC range and scaled to [0, 1], and each category column is one-hot
encoded over its PUBLIC list of codes (a code not in the list, or a missing one, is all zeros): that spends
no privacy budget. EDIT the ranges and codes: choose them from what the columns mean (a codebook), never from
the data. A missing label is NaN: the trainer drops those rows, as the validator skips them. To add a DP
statistic, use Sage's analyzers with the budget DPTransform passes in custom_config, e.g.

    (epsilon,) = PreprocessingBudget.from_custom_config(custom_config).split(1)
    outputs["rate_by_hour"] = dp_group_by_mean(hour, rate_01, 24, epsilon, 1.0)
{left_out}"""
import sage_tfx  # noqa: F401  (before TensorFlow)
import tensorflow as tf

from sage_tfx.components.transform_utils import fill_in_missing

PUBLIC_RANGES = {{  # EDIT: public (low, high) of each feature
{ranges}
}}
FEATURES = {_keys(features)!r}  # output names, in the order of PUBLIC_RANGES
CATEGORIES = {{  # EDIT: the public codes of each category column (the codes in the --input file's first rows)
{codes}
}}
ONE_HOT = {names!r}  # output names, one per code
LABEL = {label!r}


def preprocessing_fn(inputs, custom_config):
    outputs = {{}}
    for out, (column, (low, high)) in zip(FEATURES, PUBLIC_RANGES.items()):
        value = fill_in_missing(tf.cast(inputs[column], tf.float32), low)  # a missing value counts as `low`
        outputs[out] = (tf.clip_by_value(value, low, high) - low) / (high - low)
    for column, codes in CATEGORIES.items():
        value = fill_in_missing(tf.cast(inputs[column], tf.float32), float("nan"))  # missing: no code
        for out, code in zip(ONE_HOT[column], codes):
            outputs[out] = tf.cast(tf.equal(value, float(code)), tf.float32)
    # a missing label stays missing (NaN), never 0: the trainer drops the row
    outputs[LABEL] = fill_in_missing(tf.cast(inputs[LABEL], tf.float32), float("nan"))
    return outputs
'''


def _trainer(keys, label, sla):
    if sla.metric in (Metric.ACCURACY, Metric.LOG_LOSS):  # a probability of the 0/1 label, as both metrics read it
        model = (
            "    model = DPLogisticRegressor(fn_args.privacy_budget, num_examples=fn_args.num_examples,\n"
            "                                batch_size=trainer_utils.batch_size(fn_args, config))\n"
            '    model.fit(x, (y > 0.5).astype("int64"))'
        )
        imports, header = "DPLogisticRegressor", ""
    else:
        model = (
            "    # each feature in [0, 1], centred at 0.5: rows in [-0.5, 0.5]^d, norm <= sqrt(d) / 2 (a quarter of\n"
            '    # AdaSSP\'s noise and ridge against no centre; docs/your_pipeline.md, "A second data set")\n'
            "    model = DPLinearRegressor(fn_args.privacy_budget, feature_bound=len(FEATURES) ** 0.5 / 2,\n"
            "                              label_range=LABEL_RANGE, feature_center=0.5,\n"
            "                              prior_coef=PRIOR_COEF or None, prior_intercept=PRIOR_INTERCEPT,\n"
            "                              residual_range=RESIDUAL_RANGE if PRIOR_COEF or PRIOR_INTERCEPT else None)\n"
            "    model.fit(x, y)"
        )
        imports = "DPLinearRegressor"
        header = (
            "LABEL_RANGE = (0.0, 1.0)  # EDIT: the public range of the label (it is clipped to it)\n"
            "# EDIT: a PUBLIC prior prediction, from what the label means (never from the data). The model fits the\n"
            "# residual label - prior, clipped to RESIDUAL_RANGE, and AdaSSP's ridge shrinks towards the prior\n"
            "# instead of towards 0: on few rows a DP regression is often no better than its prior, so a good prior is\n"
            "# the cheapest accuracy there is. Here a constant guess, the middle of LABEL_RANGE; a prior on a feature\n"
            "# is {feature: coefficient} in PRIOR_COEF, in the units of the [0, 1] features and of the label\n"
            '# (docs/your_pipeline.md, "A second data set", and DPLinearRegressor\'s docstring).\n'
            "PRIOR_INTERCEPT = (LABEL_RANGE[0] + LABEL_RANGE[1]) / 2\n"
            "PRIOR_COEF = {}\n"
            "RESIDUAL_RANGE = (LABEL_RANGE[0] - PRIOR_INTERCEPT, LABEL_RANGE[1] - PRIOR_INTERCEPT)\n"
        )
    return f'''"""run_fn for DPTrainer (written by `sage init-pipeline`; edit freely).

DPTrainer assigns the budget (fn_args.privacy_budget) and the DP size of the training split
(fn_args.num_examples) at run time; the model draws its noise from the grant (pass no seed).
load_examples drops the rows whose label is missing (NaN), each on its own values, as the validator skips
them: they are never trained on as some default value.
"""
import sage_tfx  # noqa: F401  (before TensorFlow)

from sage_tfx.components import trainer_utils
from sage_tfx.models import {imports}

FEATURES = {keys!r}  # the transformed features, each in [0, 1] (one-hot codes too)
LABEL = {label!r}
{header}

def run_fn(fn_args):
    config = fn_args.custom_config or {{}}
    x, y = trainer_utils.load_examples(fn_args, FEATURES, LABEL)
{model}
    trainer_utils.export_model(fn_args, model, label_key=LABEL)
    return trainer_utils.report_spent(fn_args, model)
'''
