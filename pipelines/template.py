"""``sage init-pipeline DIR``: three files to start a pipeline of your own, for a stream's schema and label.

In the spirit of ``tfx template copy``: ``write_template`` writes ``pipeline.py`` (the SLA and the modules),
``preprocessing.py`` (a ``preprocessing_fn`` that clips every numeric feature to a public range and scales
it to [0, 1]) and ``trainer.py`` (a ``run_fn`` training a DP linear model, AdaSSP, for mse / mae, or a DP
logistic regression for accuracy and log_loss). They run as written (``sage run DIR/pipeline.py --check`` passes on the
stream), but the public bounds they hold are placeholders to edit: every bound must be chosen without
looking at the data (docs/your_pipeline.md).
"""
from __future__ import annotations

import keyword
import os
import textwrap

from sage_tfx.privacy.errors import SageError

FILES = ("pipeline.py", "preprocessing.py", "trainer.py")
NUMERIC = ("int", "float")


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
    lines = ["the first iteration's per-block epsilon and window (blocks); a tenth of the training side pays for",
             "the REJECT test on the training split."]
    if blocks:
        lines.append(f"The stream had {blocks} block(s) when this was written: the window is at most that.")
    if plan is not None:
        lines += ["Epsilon plan on the stream's budget then (no new block; `sage run` does not wait for blocks):",
                  plan.describe()]
    else:
        lines.append("`sage run pipeline.py --check --target T` lists the attempts the stream's budget allows.")
    return defaults, lines


def write_template(directory: str, schema: dict, label: str, metric: str, *, name: str | None = None,
                   loss_bound: float | None = None, time_column: str | None = None, force: bool = False,
                   blocks: int | None = None, plan=None) -> list:
    """Write the three files into ``directory`` (created); return their paths. Refuses to overwrite unless
    ``force``. ``schema``: {column: int|float|bytes}, the stream's public schema. ``blocks``: the stream's
    active blocks and ``plan`` its ``AttemptPlan`` at the written settings, when known (``window_defaults``)."""
    from sage_tfx.pipelines.definition import SLA

    if label not in schema:
        raise TemplateError(f"label {label!r} is not a column of the schema (columns: {', '.join(sorted(schema))})")
    if schema[label] not in NUMERIC:
        raise TemplateError(f"label {label!r} holds {schema[label]}: a label must be numeric")
    name = name or os.path.basename(os.path.abspath(directory)).replace("-", "_")
    sla = SLA(metric=metric, label=label, loss_bound=loss_bound)  # names a bad metric or bound
    features = [c for c, kind in sorted(schema.items()) if kind in NUMERIC and c not in (label, time_column)]
    if not features:
        raise TemplateError(f"the schema has no numeric feature besides the label {label!r} and the time column")
    skipped = sorted(c for c, kind in schema.items() if kind not in NUMERIC)
    paths = [os.path.join(directory, f) for f in FILES]
    existing = [p for p in paths if os.path.exists(p)]
    if existing and not force:
        raise TemplateError(f"{', '.join(existing)} exist(s): choose another directory, or pass --force to overwrite")
    os.makedirs(directory, exist_ok=True)
    texts = {
        "pipeline.py": _pipeline(name, sla, *window_defaults(blocks, plan)),
        "preprocessing.py": _preprocessing(features, label, skipped),
        "trainer.py": _trainer(features, label, sla),
    }
    for path in paths:
        with open(path, "w") as f:
            f.write(texts[os.path.basename(path)])
    return paths


def _pipeline(name, sla, defaults, comment):
    bound = "" if sla.metric == "accuracy" else f", loss_bound={sla.loss_bound!r}"
    comment = "\n".join(textwrap.fill(line, 110, initial_indent="    # ", subsequent_indent="    # ")
                         for line in comment)
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


def _preprocessing(features, label, skipped):
    ranges = "\n".join(f"    {f!r}: (0.0, 1.0)," for f in features)
    keys = [f if _identifier(f) else f"f{i}" for i, f in enumerate(features)]
    skipped_note = f"\nNot used (not numeric): {', '.join(skipped)}.\n" if skipped else ""
    return f'''"""preprocessing_fn for DPTransform (written by `sage init-pipeline`; edit freely).

Each numeric feature is clipped to a PUBLIC range and scaled to [0, 1]: that spends no privacy budget.
EDIT the ranges: choose them from what the columns mean, never from the data. To add a DP statistic, use
Sage's analyzers with the budget DPTransform passes in custom_config, e.g.

    (epsilon,) = PreprocessingBudget.from_custom_config(custom_config).split(1)
    outputs["rate_by_hour"] = dp_group_by_mean(hour, rate_01, 24, epsilon, 1.0)
{skipped_note}"""
import sage_tfx  # noqa: F401  (before TensorFlow)
import tensorflow as tf

from sage_tfx.components.transform_utils import fill_in_missing

PUBLIC_RANGES = {{  # EDIT: public (low, high) of each feature
{ranges}
}}
FEATURES = {keys!r}  # output names, in the order of PUBLIC_RANGES
LABEL = {label!r}


def preprocessing_fn(inputs, custom_config):
    outputs = {{}}
    for out, (column, (low, high)) in zip(FEATURES, PUBLIC_RANGES.items()):
        value = tf.cast(fill_in_missing(inputs[column], low), tf.float32)  # a missing value counts as `low`
        outputs[out] = (tf.clip_by_value(value, low, high) - low) / (high - low)
    outputs[LABEL] = tf.cast(fill_in_missing(inputs[LABEL], 0), tf.float32)
    return outputs
'''


def _trainer(features, label, sla):
    keys = [f if _identifier(f) else f"f{i}" for i, f in enumerate(features)]
    if sla.metric in ("accuracy", "log_loss"):  # a probability of the 0/1 label, as both metrics read it
        model = ("    model = DPLogisticRegressor(fn_args.privacy_budget, num_examples=fn_args.num_examples,\n"
                 "                                batch_size=trainer_utils.batch_size(fn_args, config))\n"
                 "    model.fit(x, (y > 0.5).astype(\"int64\"))")
        imports, header = "DPLogisticRegressor", ""
    else:
        model = ("    # each feature in [0, 1], centred at 0.5: rows in [-0.5, 0.5]^d, norm <= sqrt(d) / 2 (a quarter of\n"
                 "    # AdaSSP's noise and ridge against no centre; docs/your_pipeline.md, \"A second data set\")\n"
                 "    model = DPLinearRegressor(fn_args.privacy_budget, feature_bound=len(FEATURES) ** 0.5 / 2,\n"
                 "                              label_range=LABEL_RANGE, feature_center=0.5)\n"
                 "    model.fit(x, y)")
        imports = "DPLinearRegressor"
        header = "LABEL_RANGE = (0.0, 1.0)  # EDIT: the public range of the label (it is clipped to it)\n"
    return f'''"""run_fn for DPTrainer (written by `sage init-pipeline`; edit freely).

DPTrainer assigns the budget (fn_args.privacy_budget) and the DP size of the training split
(fn_args.num_examples) at run time; the model draws its noise from the grant (pass no seed).
"""
import sage_tfx  # noqa: F401  (before TensorFlow)

from sage_tfx.components import trainer_utils
from sage_tfx.models import {imports}

FEATURES = {keys!r}  # the transformed features, each in [0, 1]
LABEL = {label!r}
{header}

def run_fn(fn_args):
    config = fn_args.custom_config or {{}}
    x, y = trainer_utils.load_examples(fn_args, FEATURES, LABEL)
{model}
    trainer_utils.export_model(fn_args, model, label_key=LABEL)
    return trainer_utils.report_spent(fn_args, model)
'''
