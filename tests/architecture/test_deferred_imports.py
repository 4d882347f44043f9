"""Deferred package __init__s (sage_tfx/compat/deferred_imports.py): submodules import without the package's
__init__, which runs once, on the first use of a name it defines; TFX's components stay usable."""

import builtins
import json
import os
import subprocess
import sys
import textwrap

import pytest

from sage_tfx.compat.deferred_imports import defer


def _package(root, name):
    pkg = root / name
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text(
        "import builtins\nbuiltins.INITS = getattr(builtins, 'INITS', 0) + 1\n"
        "from .sub.leaf import VALUE\nNAME = 'init ran'\n"
    )
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "leaf.py").write_text("VALUE = 42\n")


def test_a_submodule_imports_without_the_init_which_runs_once_on_first_use(tmp_path, monkeypatch):

    _package(tmp_path, "deferred_pkg_a")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("SAGE_EAGER_IMPORTS", raising=False)
    monkeypatch.setattr(builtins, "INITS", 0, raising=False)
    defer("deferred_pkg_a")
    try:
        import deferred_pkg_a.sub.leaf as leaf

        assert leaf.VALUE == 42 and builtins.INITS == 0  # the package's __init__ has not run
        from deferred_pkg_a import sub

        assert sub.leaf is leaf and builtins.INITS == 0  # a submodule by `from`: still not run
        import deferred_pkg_a

        assert deferred_pkg_a.NAME == "init ran" and builtins.INITS == 1
        from deferred_pkg_a import VALUE

        assert VALUE == 42 and builtins.INITS == 1  # once
        with pytest.raises(AttributeError, match="no attribute 'missing'"):
            deferred_pkg_a.missing  # noqa: B018
    finally:
        sys.meta_path[:] = [f for f in sys.meta_path if "deferred_pkg_a" not in getattr(f, "names", ())]
        for name in [m for m in sys.modules if m.startswith("deferred_pkg_a")]:
            del sys.modules[name]


def test_eager_imports_turn_it_off(tmp_path, monkeypatch):

    _package(tmp_path, "deferred_pkg_b")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("SAGE_EAGER_IMPORTS", "1")
    monkeypatch.setattr(builtins, "INITS", 0, raising=False)
    defer("deferred_pkg_b")
    try:
        import deferred_pkg_b.sub.leaf  # noqa: F401

        assert builtins.INITS == 1
    finally:
        for name in [m for m in sys.modules if m.startswith("deferred_pkg_b")]:
            del sys.modules[name]


def _probe(source: str, *args: str):
    """Run ``source`` in a fresh interpreter with the deferred imports on; the JSON of its last line."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    env.pop("SAGE_EAGER_IMPORTS", None)
    out = subprocess.run([sys.executable, "-c", source, *args], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


PROBE = textwrap.dedent("""
    import json, sys
    import sage_tfx, tensorflow
    import tfx.orchestration.local.local_dag_runner, tfx.components.pusher.component
    import sage_tfx.components.dp_trainer, sage_tfx.components.dp_model_validator
    heavy = ("keras.src", "kubernetes", "tensorflow_model_analysis.evaluators", "nltk", "sklearn")
    before = sorted(m for m in heavy if m in sys.modules)
    from tfx.components import Pusher
    import tfx.components as components
    same = Pusher is tfx.components.pusher.component.Pusher is components.Pusher
    import tensorflow_model_analysis as tfma
    from tensorflow_model_analysis.proto import config_pb2
    from tfx.types import standard_component_specs as specs
    tfma_usable = (tfma.EvalConfig is config_pb2.EvalConfig is specs.EvaluatorSpec.PARAMETERS["eval_config"].type
                   and callable(tfma.default_evaluators))
    print(json.dumps({"before": before, "same": same, "tfma_usable": tfma_usable,
                      "after": sorted(m for m in heavy if m in sys.modules)}))
""")


@pytest.mark.tf
def test_a_tfx_run_imports_no_unused_component_nor_tfma_and_both_stay_usable():
    """Neither TFX's unused components (Keras 3, Kubernetes) nor TFMA's __init__ (NLTK, scikit-learn), which TFX's
    component specs reach for one proto class; both load on first use, and are the same objects."""
    seen = _probe(PROBE)
    assert seen == {
        "before": [],
        "same": True,
        "tfma_usable": True,
        "after": ["keras.src", "kubernetes", "nltk", "sklearn", "tensorflow_model_analysis.evaluators"],
    }, seen


LAUNCHER_PROBE = textwrap.dedent("""
    import json, os, sys, types
    from ml_metadata.metadata_store import metadata_store
    from ml_metadata.proto import metadata_store_pb2
    from sage_tfx.pipelines._runner import PipelineConfig, keep_declared_outputs, make_run_iteration, metadata_config

    config = PipelineConfig(name="p", ledger="ledger.db", stream="s", data_root="data", work_dir=sys.argv[1],
                            target=1.0)

    def execute(grant, split, eta, iteration):  # what a confined child leaves: MLMD, a result, raw Examples
        store = metadata_store.MetadataStore(metadata_config(config.metadata_path))
        for name, key in (("SageValidationResult", "result"), ("Examples", "examples")):
            folder = os.path.join(config.pipeline_root, "C", key, "1")
            os.makedirs(folder)
            if key == "result":
                with open(os.path.join(folder, "result.json"), "w") as f:
                    json.dump({"outcome": "RETRY", "bound": 2.0}, f)
            kind = store.put_artifact_type(metadata_store_pb2.ArtifactType(name=name))
            artifact = metadata_store_pb2.Artifact(type_id=kind, uri=folder, state=metadata_store_pb2.Artifact.LIVE)
            artifact.custom_properties["grant_id"].string_value = grant.id
            store.put_artifacts([artifact])
        keep_declared_outputs(config)  # as confined_execute does after its child (its MLMD folder is the root)

    result = make_run_iteration(None, config, execute)(types.SimpleNamespace(id="g1"), None, 0.05, 1)
    examples = os.path.join(config.pipeline_root, "C", "examples", "1")
    print(json.dumps({"outcome": result.outcome, "bound": result.bound, "scrubbed": not os.path.exists(examples),
                      "imported": sorted(m for m in ("tensorflow", "tfx", "apache_beam") if m in sys.modules)}))
""")


def test_the_launcher_reads_an_iterations_outcome_without_importing_tensorflow(tmp_path):
    """`sage run`'s launcher runs each iteration in a confined child, then keeps only its declared outputs, scrubs
    the raw Examples and reads the outcome from the child's MLMD store: on a local pipeline root that needs neither
    TFX nor TensorFlow, whose import cost every `sage run` 16-20 s of CPU at its first iteration (measured with a
    per-process count on `sage run taxi_regression`; 1.8 s and 648 modules without)."""
    seen = _probe(LAUNCHER_PROBE, str(tmp_path / "work"))
    assert seen == {"outcome": "RETRY", "bound": 2.0, "scrubbed": True, "imported": []}, seen


VALIDATOR_PROBE = textwrap.dedent("""
    import json, sys
    import sage_tfx.pipelines.confined  # what pipelines/confined.py's _validate imports:
    from sage_tfx.components._grant import GrantedExecutor
    from sage_tfx.components._grant_channel import ADDRESS
    from sage_tfx.components.granted_reads import granted_records
    from sage_tfx.components.validation_steps import validate_model, validation_plan, validation_report
    import tensorflow
    print(json.dumps(sorted(m for m in ("tfx", "apache_beam", "tensorflow_transform") if m in sys.modules)))
""")


def test_the_validation_child_imports_neither_tfx_nor_beam():
    """The confined child that validates a model again reads the grant's records and runs the model: it needs
    TensorFlow, not TFX's executors nor Beam, whose imports cost it about 5 s of CPU of its ~16 (measured with
    `sage bench iteration`)."""
    assert _probe(VALIDATOR_PROBE) == []


HELP_PROBE = textwrap.dedent("""
    import contextlib, io, json, sys
    import sage_tfx.cli
    with contextlib.redirect_stdout(io.StringIO()):
        try:
            sage_tfx.cli.main(["--help"])
        except SystemExit:
            pass
    print(json.dumps(sorted(m for m in ("sage_tfx.auditing", "scipy.stats", "tensorflow") if m in sys.modules)))
""")


def test_sage_help_imports_neither_the_auditing_package_nor_scipy_stats():
    """Every `sage` command builds the whole parser, benches included: the privacy-audit bench imports the auditing
    package (and scipy.stats, about 0.9 s of CPU) when it runs, not when the parser is built."""
    assert _probe(HELP_PROBE) == []


ACCOUNTING_PROBE = textwrap.dedent("""
    import json, sys
    import sage_tfx
    from sage_tfx.privacy import gaussian  # AdaSSP's calibration in an iteration's confined child
    multiplier = gaussian.rdp_multiplier(1.0, 1e-6, releases=3)
    epsilon = gaussian.rdp_epsilon(multiplier, 1e-6, releases=3)
    heavy = ("dp_accounting.pld.pld_privacy_accountant", "scipy.signal", "scipy.stats")
    before = sorted(m for m in heavy if m in sys.modules)
    import dp_accounting
    pld = dp_accounting.pld.PLDAccountant().compose(gaussian.releases_event(multiplier, 3)).get_epsilon(1e-6)
    print(json.dumps({"before": before, "usable": 0 < pld <= epsilon <= 1.0,
                      "after": sorted(m for m in heavy if m in sys.modules)}))
""")


def test_the_rdp_calibration_imports_no_pld_accountant_which_stays_usable():
    """dp_accounting's ``__init__`` imports its PLD accountant, and with it scipy.signal and scipy.stats (194
    modules, about 0.8 s of CPU in an iteration's confined child, measured with ``-X importtime``), where AdaSSP's
    release uses the events and the RDP accountant alone; ``dp_accounting.pld`` loads on first use."""
    seen = _probe(ACCOUNTING_PROBE)
    assert seen == {
        "before": [],
        "usable": True,
        "after": ["dp_accounting.pld.pld_privacy_accountant", "scipy.signal", "scipy.stats"],
    }, seen
