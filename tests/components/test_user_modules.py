"""Module files as users write them: a trainer module may import the module files beside it.

TFX loads a ``module_file`` by path without its folder on ``sys.path``, so ``from helpers import X`` in a
trainer failed with ModuleNotFoundError (DPTrainer and DPTransform load through ``udf_utils.get_fn``). Now
``components.user_modules.load_user_fn`` makes the folder importable, a sibling of another pipeline's folder
with the same name is not reused, an edited sibling is imported afresh, and both the training release's
computation digest and the pipeline's definition digest change with a sibling. (A real run whose trainer imports
its sibling: tests/pipelines/test_sage_run.py
::test_a_users_pipeline_file_runs_to_accept_pushes_and_certifies_only_its_request, examples/taxi_fare.)
"""

import sys
import textwrap

import pytest

import sage_tfx  # noqa: F401  (before TensorFlow)

pytestmark = pytest.mark.tf  # TFX's udf_utils loads the module

TRAINER = textwrap.dedent("""
    from helpers import SCALE


    def run_fn(fn_args):
        return SCALE
""")


def _pipeline(folder, scale):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "trainer.py").write_text(TRAINER)
    (folder / "helpers.py").write_text(f"SCALE = {scale}\n")
    return str(folder / "trainer.py")


def test_a_trainer_imports_its_sibling_where_tfx_alone_fails(tmp_path, monkeypatch):
    from tfx.components.util import udf_utils

    from sage_tfx.components.user_modules import load_user_fn

    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setattr(sys, "modules", dict(sys.modules))
    trainer = _pipeline(tmp_path / "one", 3)
    with pytest.raises(ModuleNotFoundError, match="helpers"):  # how the executors loaded it before
        udf_utils.get_fn({"module_file": trainer}, "run_fn")
    assert load_user_fn({"module_file": trainer}, "run_fn")(None) == 3

    other = _pipeline(tmp_path / "two", 5)  # another pipeline's helpers.py: its own, not the first one's
    assert load_user_fn({"module_file": other}, "run_fn")(None) == 5
    assert str(tmp_path / "one") not in sys.path and sys.path[0] == str(tmp_path / "two")
    (tmp_path / "two" / "helpers.py").write_text("SCALE = 70\n")  # edited between two loads: read afresh
    assert load_user_fn({"module_file": other}, "run_fn")(None) == 70


def test_the_training_digest_and_the_definition_digest_cover_the_siblings(tmp_path, monkeypatch):
    from sage_tfx.components.dp_trainer_executor import public_numbers, training_computation
    from sage_tfx.components.user_modules import load_user_fn, sibling_sources
    from sage_tfx.pipelines import SLA, SagePipeline

    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setattr(sys, "modules", dict(sys.modules))
    trainer = _pipeline(tmp_path / "p", 3)
    pipeline = SagePipeline(name="p", sla=SLA(metric="mse", label="y", loss_bound=1.0), trainer_module=trainer)

    def digests():
        run_fn = load_user_fn({"module_file": trainer}, "run_fn")
        return training_computation({}, run_fn, {}, (1.0, 0.0)), pipeline.definition_digest()

    before = digests()
    assert [name for name, _ in sibling_sources(load_user_fn({"module_file": trainer}, "run_fn"))] == ["helpers.py"]
    assert digests() == before
    (tmp_path / "p" / "helpers.py").write_text("SCALE = 4\n")
    after = digests()
    assert after[0] != before[0] and after[1] != before[1]
    # a batch size the sibling names is one of the run's public numbers (it is part of the computation)
    (tmp_path / "p" / "helpers.py").write_text("SCALE = 4\nBATCH = 173\n")
    run_fn = load_user_fn({"module_file": trainer}, "run_fn")
    with open(trainer, "rb") as f:
        source = f.read()
    assert 173.0 in public_numbers([source, *(t for _, t in sibling_sources(run_fn))], {}, None)
    assert 173.0 not in public_numbers(source, {}, None)
