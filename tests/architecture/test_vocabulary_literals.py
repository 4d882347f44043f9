"""The vocabularies have one home: sage_tfx/privacy/vocabulary.py.

No value of one of its enums (stages, sides, compositions, outcomes, policies, accountings, block, pipeline and
demand states, charge rules, metrics) appears as a bare string literal in the package's code (sage_tfx/,
components/, pipelines/) outside that module: code names the member (``Stage.TRAINING``), so a renamed or
misspelt value cannot hide. Docstrings are prose and are not read; argparse choices are built from the enum.

``OTHER_MEANINGS`` lists the literals that spell the same word for another thing, each with what it is.
"""

import ast
import enum
import pathlib

import pytest

from sage_tfx.privacy import vocabulary

ROOT = pathlib.Path(__file__).resolve().parents[2]
TREES = ("sage_tfx", "components", "pipelines")
HOME = "sage_tfx/privacy/vocabulary.py"

_ACCOUNTANT = "dp_accounting's accountant name (rdp / pld) of a DP-SGD run, not a stream's filter"
_AUDIT_WORD = "the audit verdict printed (OK / FAILED), not a grant outcome"
_DEMO = "a walkthrough of the public API as a user calls it, with the strings a user types"
_REPORT = "a benchmark or model report's column / a Keras loss name, not the validator's metric"
_USER_FILE = "an example pipeline file: user code passes the SLA's metric as a string"
OTHER_MEANINGS = {
    ("components/dp_trainer_executor.py", "rdp"): _ACCOUNTANT,
    ("sage_tfx/privacy/dpsgd.py", "rdp"): _ACCOUNTANT,
    ("sage_tfx/privacy/noise_schedules.py", "rdp"): _ACCOUNTANT,
    ("sage_tfx/models/dpsgd_models.py", "rdp"): _ACCOUNTANT,
    ("sage_tfx/models/private.py", "rdp"): _ACCOUNTANT,
    ("sage_tfx/simulate/strategies.py", "rdp"): "the suffix of a simulated strategy's name (conserve-rdp)",
    ("pipelines/_runner.py", "validation"): "the key of the validator's report in an iteration's details",
    ("sage_tfx/adaptive/request.py", "validation"): "the key of the validator's report in an iteration's details",
    ("sage_tfx/adaptive/workers.py", "done"): "the tag of a worker's last message to its parent",
    ("pipelines/workers.py", "done"): "the tag of a worker's last message to its parent",
    ("sage_tfx/release/worker.py", "done"): "the tag of a worker's last message to its parent",
    ("sage_tfx/auditing/core.py", "test"): "the audit report's threshold test (a dict key), not a record split",
    ("sage_tfx/cli/serve.py", "done"): "the tag of a worker's last message to its parent",
    ("sage_tfx/cli/serve.py", "FAILED"): _AUDIT_WORD,
    ("sage_tfx/cli/release.py", "FAILED"): _AUDIT_WORD,
    ("sage_tfx/bench/_ledger_growth.py", "FAILED"): _AUDIT_WORD,
    ("sage_tfx/release/queries.py", "count"): "PMWG's count query (a linear query's kind)",
    ("sage_tfx/transform/partitions.py", "count"): "the kind of table a private partition selection releases",
    ("sage_tfx/cli/_exits.py", "ACCEPT"): "the exit-code table every `sage` command imports first: it imports "
    "nothing of the core, so each command starts fast",
    ("sage_tfx/cli/_exits.py", "REJECT"): "as ACCEPT",
    ("sage_tfx/cli/_exits.py", "TIMEOUT"): "as ACCEPT",
    ("sage_tfx/privacy/head_slots.py", "count"): "an attribute name in __slots__",
    ("sage_tfx/privacy/streams.py", "retired"): "the key of a block's retirement time in a stream report",
    ("sage_tfx/models/ghost_plans.py", "count"): "a Keras preprocessing layer's output_mode",
    ("sage_tfx/models/dpsgd_engine.py", "training"): "Keras' `training` call argument",
    ("sage_tfx/models/ghost_plans_attention.py", "training"): "Keras' `training` call argument",
    ("sage_tfx/models/dpsgd_models.py", "accuracy"): _REPORT,
    ("sage_tfx/models/dpsgd_models.py", "log_loss"): _REPORT,
    ("sage_tfx/models/dpsgd_models.py", "mae"): _REPORT,
    ("sage_tfx/models/dpsgd_models.py", "mse"): _REPORT,
    ("sage_tfx/models/linear.py", "mae"): _REPORT,
    ("sage_tfx/models/linear.py", "mse"): _REPORT,
    ("sage_tfx/models/losses.py", "mse"): _REPORT,
    ("sage_tfx/auditing/dpsgd.py", "mse"): _REPORT,
    ("sage_tfx/auditing/transform_beam.py", "count"): "a transformed column's name (its key's noisy count)",
    ("sage_tfx/bench/adaptive_clipping.py", "accuracy"): _REPORT,
    ("sage_tfx/bench/adaptive_clipping.py", "log_loss"): _REPORT,
    ("sage_tfx/bench/dp_quality.py", "accuracy"): _REPORT,
    ("sage_tfx/bench/dp_quality.py", "mse"): _REPORT,
    ("sage_tfx/bench/noise_schedule.py", "accuracy"): _REPORT,
    ("sage_tfx/bench/noise_schedule.py", "mse"): _REPORT,
    ("sage_tfx/validation/__init__.py", "accuracy"): "a validator's name (VALIDATORS), not a metric",
    ("sage_tfx/validation/accuracy.py", "accuracy"): "a validator's name (VALIDATORS), not a metric",
    ("pipelines/taxi_classification.py", "accuracy"): _USER_FILE,
    ("pipelines/taxi_regression.py", "mse"): _USER_FILE,
    ("sage_tfx/demos/end_to_end.py", "ACCEPT"): _DEMO,
    ("sage_tfx/demos/end_to_end.py", "FAILED"): _AUDIT_WORD,
    ("sage_tfx/demos/end_to_end.py", "accuracy"): _REPORT,
    ("sage_tfx/demos/end_to_end.py", "basic"): _DEMO,
    ("sage_tfx/demos/end_to_end.py", "conserve"): _DEMO,
    ("sage_tfx/demos/ledger.py", "ACCEPT"): _DEMO,
    ("sage_tfx/demos/ledger.py", "FAILED"): _AUDIT_WORD,
    ("sage_tfx/demos/ledger.py", "basic"): _DEMO,
    ("sage_tfx/demos/ledger.py", "conserve"): _DEMO,
    ("sage_tfx/demos/ledger.py", "retired"): _DEMO,
}


def vocabulary_values() -> dict:
    """{value: [enum names]} of every enum the vocabulary module defines."""
    out = {}
    for obj in vars(vocabulary).values():
        if isinstance(obj, type) and issubclass(obj, enum.Enum) and obj.__module__ == vocabulary.__name__:
            for member in obj:
                out.setdefault(member.value, []).append(obj.__name__)
    return out


def _docstring_nodes(tree) -> set:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            for statement in node.body:
                if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant):
                    found.add(id(statement.value))
    return found


def bare_literals(source: str, values) -> list:
    """(line, value) of each string literal of ``source`` equal to one of ``values``, docstrings left out."""
    tree = ast.parse(source)
    docstrings = _docstring_nodes(tree)
    return sorted(
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and node.value in values
        and id(node) not in docstrings
    )


def _product_files():
    for tree in TREES:
        for path in sorted((ROOT / tree).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel != HOME:
                yield rel, path


def test_no_vocabulary_value_is_a_bare_string_outside_its_home():
    values = vocabulary_values()
    found = []
    for rel, path in _product_files():
        for line, value in bare_literals(path.read_text(), values):
            if (rel, value) not in OTHER_MEANINGS:
                found.append(f"{rel}:{line}: {value!r} is {'/'.join(values[value])}'s value: name the member")
    assert not found, "\n".join(found)


def test_every_other_meaning_is_still_there():
    """An entry whose literal is gone is removed, so the list stays the exact set of exceptions."""
    values = vocabulary_values()
    present = {(rel, value) for rel, path in _product_files() for _, value in bare_literals(path.read_text(), values)}
    assert not set(OTHER_MEANINGS) - present, sorted(set(OTHER_MEANINGS) - present)


@pytest.mark.parametrize(
    "source,expected",
    [
        ('STAGE = "training"\n', [(1, "training")]),
        ('def f():\n    """training"""\n    return Stage.TRAINING\n', []),
        ('x = {"preprocessing": 1}  # "count"\n', [(1, "preprocessing")]),
        ("p.add_argument('--outcome', choices=tuple(Outcome))\n", []),
    ],
)
def test_the_finder_sees_literals_and_skips_docstrings_comments_and_enum_choices(source, expected):
    assert bare_literals(source, vocabulary_values()) == expected


def test_one_outcome_one_mode_one_home_for_the_shared_constants():
    from sage_tfx.components import transform_utils
    from sage_tfx.components import validation_steps as validator
    from sage_tfx.ingest import records
    from sage_tfx.pipelines import definition
    from sage_tfx.release import blessing, growth
    from sage_tfx.validation import core

    assert core.Outcome is vocabulary.Outcome and not hasattr(vocabulary, "GrantOutcome")
    assert not hasattr(growth, "Mode") and growth.SchedulerParams(1.0).mode is vocabulary.Composition.PURE
    assert definition.Metric is vocabulary.Metric and validator.METRICS == tuple(m.value for m in vocabulary.Metric)
    assert transform_utils.KINDS is records.KINDS
    assert not hasattr(definition, "LOG_LOSS_FLOOR") or definition.LOG_LOSS_FLOOR is vocabulary.LOG_LOSS_FLOOR
    assert not hasattr(validator, "BLESSED_FILE") and blessing.BLESSED_FILE == "BLESSED"
