"""The public pipeline API (sage_tfx.pipelines.SagePipeline / SLA) and its loader: built-in names, files, modules.

Bad pipeline files are refused naming the file (and the line), and `sage run` exits 2 before any budget is
spent. The end-to-end run of a user's pipeline file is in tests/pipelines/test_sage_run.py.
"""

import importlib.util
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from sage_tfx.pipelines import BUILTIN, SLA, PipelineDefinitionError, SagePipeline, load_pipeline
from sage_tfx.privacy import Ledger

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(ROOT, "examples", "taxi_fare", "pipeline.py")


def test_builtins_are_plain_users_of_the_public_api():
    for name in BUILTIN:
        pipeline = load_pipeline(name)
        assert isinstance(pipeline, SagePipeline) and pipeline.name == name
        assert os.path.isfile(pipeline.module_path("trainer_module"))
    regression = load_pipeline("taxi_regression")
    assert (regression.sla.metric, regression.sla.label, regression.sla.loss_bound) == (
        "mse",
        "trip_seconds",
        1800.0**2,
    )
    assert regression.model_family() == "linear" and regression.model_family("dnn") == "dnn"
    with pytest.raises(ValueError, match="'svm'"):
        regression.model_family("svm")


def test_a_user_file_resolves_its_modules_beside_it():
    pipeline = load_pipeline(EXAMPLE)
    assert pipeline.name == "taxi_fare" and pipeline.base_dir == os.path.dirname(EXAMPLE)
    assert pipeline.module_path("preprocessing_module") == os.path.join(os.path.dirname(EXAMPLE), "preprocessing.py")
    assert pipeline.check_target(120) == 120.0
    with pytest.raises(ValueError, match="900"):
        pipeline.check_target(900)  # the loss bound: every model meets it


def test_a_dotted_module_path(tmp_path, monkeypatch):
    (tmp_path / "mypkg").mkdir()
    (tmp_path / "mypkg" / "__init__.py").write_text("")
    (tmp_path / "mypkg" / "trainer.py").write_text("def run_fn(fn_args): pass\n")
    (tmp_path / "mypkg" / "pipe.py").write_text(
        textwrap.dedent("""
        from sage_tfx.pipelines import SLA, SagePipeline
        PIPELINE = SagePipeline(name="mine", sla=SLA(metric="accuracy", label="y"), trainer_module="trainer.py")
    """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    pipeline = load_pipeline("mypkg.pipe")
    assert pipeline.name == "mine" and pipeline.module_path("trainer_module") == str(tmp_path / "mypkg" / "trainer.py")
    assert pipeline.model_family() is None


@pytest.mark.parametrize(
    "bad, named",
    [
        (dict(sla=SLA("mse", "y", 4.0), name="bad name!"), "'bad name!'"),
        (dict(sla="mse"), "sla 'mse'"),
        (dict(sla=SLA("accuracy", "y"), defaults={"epsilon_strat": 0.5}), "epsilon_strat"),
        (dict(sla=SLA("accuracy", "y"), components="all"), "components 'all'"),
        (dict(sla=SLA("accuracy", "y"), models=(1,)), "models"),
    ],
)
def test_bad_definitions_name_the_value(bad, named):
    with pytest.raises(PipelineDefinitionError, match=named.replace("(", r"\(")):
        SagePipeline(**{"name": "p", "trainer_module": "t.py", **bad})


@pytest.mark.parametrize(
    "args, named",
    [
        (("auc", "y"), "'auc'"),
        (("mse", "y"), "needs loss_bound"),
        (("mse", "y", -1.0), "-1.0"),
        (("accuracy", "y", 1.0), "does not apply"),
        (("mse", ""), "label ''"),
        (("custom", "y", 4.0), "metric 'custom' needs one"),
        (("mse", "y", 4.0, "x"), "label_threshold 'x'"),
        (("mse", "y", 4.0, None, "loss.py"), "loss_module 'loss.py'"),
    ],
)
def test_bad_slas_name_the_value(args, named):
    with pytest.raises(PipelineDefinitionError, match=named):
        SLA(*args)
    assert SLA("log_loss", "y").loss_bound == pytest.approx(16.118, abs=1e-3)


PIPE = """
from sage_tfx.pipelines import SLA, SagePipeline
PIPELINE = SagePipeline(name="p", sla=SLA(metric="accuracy", label="y"), trainer_module="trainer.py")
"""


@pytest.mark.parametrize(
    "case, files, named",
    [
        ("missing file", {}, "does not exist"),
        ("no pipeline", {"pipe.py": "x = 1\n"}, "defines no SagePipeline"),
        ("raises on import", {"pipe.py": "import os\n\nraise RuntimeError('boom')\n"}, "at line 3: RuntimeError: boom"),
        ("syntax error", {"pipe.py": "def f(:\n"}, "at line 1: SyntaxError"),
        (
            "two pipelines",
            {"pipe.py": PIPE.replace("PIPELINE =", "A =") + PIPE.replace("PIPELINE =", "B =")},
            r"several SagePipelines \(A, B\)",
        ),
        ("missing trainer module", {"pipe.py": PIPE}, "trainer_module .*trainer.py' does not exist"),
    ],
)
def test_bad_pipeline_files_exit_2_naming_the_file_before_any_spend(tmp_path, case, files, named):
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    path = str(tmp_path / "pipe.py")
    with pytest.raises(PipelineDefinitionError, match=named):
        load_pipeline(path)
    db = str(tmp_path / "ledger.db")
    with Ledger.open(db, create=True) as ledger:
        ledger.create_stream("s", 1.0, 1e-6)
        ledger.add_block("s", "b0", start=0, end=86400, rows=10)
        before = [ledger.log_entries(), [g.to_json() for g in ledger.grants()]]
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "sage_tfx",
            "run",
            path,
            "--db",
            db,
            "--stream",
            "s",
            "--data-root",
            str(tmp_path / "data"),
            "--target",
            "0.5",
            "--work-dir",
            str(tmp_path / "work"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 2, out.stdout + out.stderr
    assert path in out.stderr and "Traceback" not in out.stderr, out.stderr
    with Ledger.open(db) as ledger:
        assert [ledger.log_entries(), [g.to_json() for g in ledger.grants()]] == before  # nothing spent
    assert not os.path.exists(tmp_path / "work")


def test_a_custom_loss_module_is_resolved_beside_the_pipeline_and_checked(tmp_path):
    (tmp_path / "trainer.py").write_text("def run_fn(fn_args): pass\n")
    (tmp_path / "pipe.py").write_text(
        PIPE.replace(
            'SLA(metric="accuracy", label="y")',
            'SLA(metric="custom", label="y", loss_bound=9.0, loss_module="loss.py")',
        )
    )
    with pytest.raises(PipelineDefinitionError, match="loss_module .*loss.py' does not exist"):
        load_pipeline(str(tmp_path / "pipe.py"))
    (tmp_path / "loss.py").write_text("def per_example_loss(labels, outputs): return labels\n")
    pipeline = load_pipeline(str(tmp_path / "pipe.py"))
    assert pipeline.module_path("loss_module") == str(tmp_path / "loss.py") and pipeline.check_target(5) == 5.0


def test_unknown_name_lists_the_builtins():
    with pytest.raises(PipelineDefinitionError, match="taxi_classification, taxi_regression"):
        load_pipeline("no_such_pipeline")


def test_init_pipeline_writes_three_files_that_load(tmp_path):
    """`sage init-pipeline`: the files load as a pipeline (its --check run is in tests/pipelines/test_sage_run.py), name
    the stream's numeric features, never overwrite without --force, and bad input exits 2 writing nothing."""
    from sage_tfx.data.taxi import taxi_csv_path

    target = tmp_path / "mine"
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "sage_tfx",
            "init-pipeline",
            str(target),
            "--label",
            "fare",
            "--metric",
            "mse",
            "--loss-bound",
            "900",
            "--input",
            taxi_csv_path("simple"),
            "--time-column",
            "trip_start_timestamp",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    files = ["pipeline.py", "preprocessing.py", "trainer.py"]
    assert sorted(os.listdir(target)) == files
    pipeline = load_pipeline(str(target / "pipeline.py"))
    assert (pipeline.name, pipeline.sla.metric, pipeline.sla.label, pipeline.sla.loss_bound) == (
        "mine",
        "mse",
        "fare",
        900.0,
    )
    text = (target / "preprocessing.py").read_text()
    assert "'trip_miles': (0.0, 1.0)" in text and "'trip_start_timestamp'" not in text and "company" in text
    # the three files (loading them may add Python's __pycache__ beside them: not ours, and not a file to compare)
    before = {f: (target / f).read_text() for f in files}
    for args, named in [
        ([], "exist"),
        (["--label", "company"], "holds bytes"),
        (["--label", "nope"], "'nope'"),
        (["--metric", "mae"], "needs loss_bound"),
    ]:
        argv = ["--label", "fare", "--metric", "mse", "--loss-bound", "900", *args]
        if args and args[0] == "--metric":
            argv = ["--label", "fare", *args]
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "sage_tfx",
                "init-pipeline",
                str(target),
                *argv,
                "--input",
                taxi_csv_path("simple"),
                *(["--force"] if args else []),
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert out.returncode == 2 and named in out.stderr, (args, out.stderr)
    assert sorted(set(os.listdir(target)) - {"__pycache__"}) == files
    assert {f: (target / f).read_text() for f in files} == before


def _init(target, *args):
    from sage_tfx.data.taxi import taxi_csv_path

    return subprocess.run(
        [sys.executable, "-m", "sage_tfx", "init-pipeline", str(target), "--input", taxi_csv_path("simple"), *args],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_init_pipeline_leaves_out_the_time_and_the_labels_source_and_one_hot_encodes_codes(tmp_path):
    """The template used to take the unix-seconds time column (no --time-column given), every column whose name
    is the label's (e.g. trip_total for a label trip_total_usd) and category codes as numbers. Now the time
    column (unix seconds, found in the file's first rows), a --label-source and a name overlapping the label's
    are never features, each said so; day and month codes are one-hot encoded; a regression gets a public prior."""
    out = _init(
        tmp_path / "mine",
        "--label",
        "fare",
        "--metric",
        "mse",
        "--loss-bound",
        "900",
        "--label-source",
        "tips",
        "--categorical",
        "trip_start_hour",
    )
    assert out.returncode == 0, out.stderr
    assert "not a feature: trip_start_timestamp (the time column)" in out.stdout
    assert "not a feature: tips (the label's source (--label-source))" in out.stdout
    assert "one-hot: trip_start_day, codes [1, 2, 3, 4, 5, 6, 7]" in out.stdout
    assert "missing are dropped (never filled)" in out.stdout
    pre, trainer = ((tmp_path / "mine" / f).read_text() for f in ("preprocessing.py", "trainer.py"))
    ranges = pre[pre.index("PUBLIC_RANGES") : pre.index("FEATURES =")]
    for left_out in ("trip_start_timestamp", "tips", "trip_start_day", "trip_start_month", "trip_start_hour"):
        assert repr(left_out) not in ranges, left_out
    assert (
        "'trip_start_hour': [0, 1, 2," in pre
        and "'trip_start_hour': [0, 1, 2]" not in pre
        and "'trip_start_hour_23'" in trainer
    )
    assert "'trip_start_month_12'" in trainer and "'trip_miles'" in trainer and "'tips'" not in trainer
    assert "fill_in_missing(inputs[LABEL], 0)" not in pre and 'float("nan")' in pre
    assert "PRIOR_INTERCEPT = " in trainer and "prior_intercept=PRIOR_INTERCEPT" in trainer
    # a column named after the label is left out unless declared a category; an unknown column is named
    out = _init(tmp_path / "other", "--label", "trip_seconds", "--metric", "mae", "--loss-bound", "600")
    assert out.returncode == 0, out.stderr
    assert "not a feature: trip_start_timestamp" in out.stdout
    for args, named in (
        (["--label-source", "nope"], "'nope'"),
        (["--categorical", "fare"], "'fare' is the label"),
        (["--categorical", "company"], "'company' holds bytes"),
    ):
        out = _init(tmp_path / "bad", "--label", "fare", "--metric", "mse", "--loss-bound", "900", *args)
        assert out.returncode == 2 and named in out.stderr, (args, out.stderr)
    assert not (tmp_path / "bad").exists()


@pytest.mark.tf
def test_the_templates_preprocessing_keeps_a_missing_label_missing(tmp_path):
    """The template filled a missing label with 0, so training saw those rows as label 0 while the validator
    skipped them. Now the label is NaN (load_examples drops the row); a category code one-hot encodes."""

    import tensorflow as tf

    import sage_tfx  # noqa: F401  (before TensorFlow)

    out = _init(tmp_path / "mine", "--label", "fare", "--metric", "mse", "--loss-bound", "900")
    assert out.returncode == 0, out.stderr
    spec = importlib.util.spec_from_file_location("template_pre", tmp_path / "mine" / "preprocessing.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    def column(values, dtype):  # one value per row, None: missing
        present = [(i, v) for i, v in enumerate(values) if v is not None]
        return tf.SparseTensor(
            [[i, 0] for i, _ in present], tf.constant([v for _, v in present], dtype), [len(values), 1]
        )

    names = list(module.PUBLIC_RANGES) + list(module.CATEGORIES)
    inputs = {n: column([1, 2, 3], tf.int64) for n in names}
    inputs["trip_start_day"] = column([2, None, 9], tf.int64)
    inputs["fare"] = column([4.5, None, 0.0], tf.float32)
    outputs = module.preprocessing_fn(inputs, {})
    fare = outputs["fare"].numpy()
    assert fare[0] == 4.5 and np.isnan(fare[1]) and fare[2] == 0.0
    assert [outputs[f"trip_start_day_{d}"].numpy().tolist() for d in (2, 7)] == [[1, 0, 0], [0, 0, 0]]


def test_init_pipeline_writes_a_classifier_for_a_log_loss_sla(tmp_path):
    """`--metric log_loss` wrote a DPLinearRegressor (the `else` of accuracy): its unbounded outputs are no
    probabilities, so every validated loss sat near the bound and no target below the constant's could ACCEPT.
    It now writes the DP logistic regression, as for accuracy."""
    target = tmp_path / "rain"
    csv = tmp_path / "weather.csv"
    csv.write_text("time_hour,humid,rain\n2013-01-01T06:00:00Z,59.4,0\n2013-01-01T07:00:00Z,97.1,1\n")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "sage_tfx",
            "init-pipeline",
            str(target),
            "--label",
            "rain",
            "--metric",
            "log_loss",
            "--input",
            str(csv),
            "--time-column",
            "time_hour",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    trainer = (target / "trainer.py").read_text()
    assert "DPLogisticRegressor(" in trainer and "DPLinearRegressor" not in trainer
    assert load_pipeline(str(target / "pipeline.py")).sla.metric == "log_loss"
