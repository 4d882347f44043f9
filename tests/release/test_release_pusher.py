"""Continual release through the Pusher convention (sage_tfx/release/continual/: push_model, write_blessing,
is_blessed, push_blessed): every released model is written as a TFX Model artifact with a ModelBlessing blessed
only when its SLA check ACCEPTs, and only blessed models are pushed -- by our push path and by TFX's own Pusher.

Blocks are GENERATED (fixed seeds, 2000 rows, tests/release/test_continual_release.py's generator); the ledger is real."""

import json
import os

import pytest

from sage_tfx.release.blessing import is_blessed, push_blessed
from sage_tfx.release.continual import ContinualRelease, ReleaseParams, check_sla, push_model
from sage_tfx.validation.loss import DPLossValidator
from tests.release.test_continual_release import D, generated_block, make_ledger


def two_models(tmp_path):
    """(model 1 with an ACCEPT, model 2 with a non-ACCEPT): an easy SLA and an impossible one."""
    tmp_path.mkdir(mode=0o700)
    ledger = make_ledger(tmp_path, 2)

    def reader(grant):
        (block,) = ledger.verify(grant).blocks
        return generated_block(int(block[1:]), n=2000)

    rel = ContinualRelease(
        ledger,
        "s",
        "p",
        ReleaseParams(epsilon=2.0, delta=1e-6, records_per_block=2000),
        reader,
        dim=D,
        validation_epsilon=1.0,
    )
    m1 = rel.observe("b000")
    good = check_sla(rel, m1, DPLossValidator(1.0, 1.0, loss_bound=2.0))
    m2 = rel.observe("b001")
    bad = check_sla(rel, m2, DPLossValidator(0.01, 1.0, loss_bound=2.0))
    assert good.outcome == "ACCEPT" and bad.outcome != "ACCEPT"  # fixed seeds (the grants' noise)
    assert ledger.audit().ok
    return (m1, good), (m2, bad)


def test_only_blessed_models_are_pushed(tmp_path):
    (m1, good), (m2, bad) = two_models(tmp_path / "ledger")
    push, serve = str(tmp_path / "push"), str(tmp_path / "serve")
    p1 = push_model(push, m1, good, serve)
    p2 = push_model(push, m2, bad, serve)
    # the artifacts: Model (URI/Format-Serving) and ModelBlessing (BLESSED / NOT_BLESSED + properties)
    assert os.path.exists(os.path.join(p1.model_uri, "Format-Serving", "weights.npy"))
    assert os.path.exists(os.path.join(p1.blessing_uri, "BLESSED")) and is_blessed(p1.blessing_uri)
    assert os.path.exists(os.path.join(p2.blessing_uri, "NOT_BLESSED")) and not is_blessed(p2.blessing_uri)
    props = json.loads(open(os.path.join(p2.blessing_uri, "blessing.json")).read())
    assert props == {
        "blessed": 0,
        "current_model": p2.model_uri,
        "current_model_id": 2,
        "sla_outcome": str(bad.outcome),
    }
    # the push: the blessed model only, as version t
    assert p1.blessed and p1.pushed_to == os.path.join(serve, "1")
    assert not p2.blessed and p2.pushed_to is None and sorted(os.listdir(serve)) == ["1"]
    assert sorted(os.listdir(os.path.join(serve, "1"))) == ["model.json", "weights.npy"]
    # a blessing whose files disagree with its properties is not blessed (CheckBlessing needs both)
    open(os.path.join(p2.blessing_uri, "BLESSED"), "w").close()
    assert not is_blessed(p2.blessing_uri) and push_blessed(p2.model_uri, p2.blessing_uri, serve, 2) is None
    # no SLA check set: blessed (a Pusher without a model_blessing input pushes every model)
    assert push_model(str(tmp_path / "nosla"), m2, None, serve).pushed_to == os.path.join(serve, "2")


@pytest.mark.slow  # 52 s on the shared 2 cores (TensorFlow and TFX import)
@pytest.mark.tf
def test_tfx_pusher_pushes_exactly_the_blessed_models(tmp_path):
    """TFX's own Pusher executor, given our two artifacts (the custom property ``blessed`` as MLMD would hold it,
    from blessing.json), pushes the ACCEPTed model and refuses the other."""
    from tfx.components.pusher import executor as pusher_executor
    from tfx.proto import pusher_pb2
    from tfx.types import standard_artifacts
    from tfx.utils import proto_utils

    (m1, good), (m2, bad) = two_models(tmp_path / "ledger")
    base = tmp_path / "serving"
    outcomes = {}
    for model, result in ((m1, good), (m2, bad)):
        pushed = push_model(str(tmp_path / "push"), model, result)  # no serving dir: TFX's Pusher does the push
        art = standard_artifacts.Model()
        art.uri = pushed.model_uri
        blessing = standard_artifacts.ModelBlessing()
        blessing.uri = pushed.blessing_uri
        props = json.loads(open(os.path.join(pushed.blessing_uri, "blessing.json")).read())
        blessing.set_int_custom_property("blessed", props["blessed"])
        blessing.set_string_custom_property("current_model", props["current_model"])
        out = standard_artifacts.PushedModel()
        out.uri = str(tmp_path / f"pushed-{model.t}")
        destination = pusher_pb2.PushDestination(
            filesystem=pusher_pb2.PushDestination.Filesystem(base_directory=str(base / str(model.t)))
        )
        pusher_executor.Executor().Do(
            {"model": [art], "model_blessing": [blessing]},
            {"pushed_model": [out]},
            {"push_destination": proto_utils.proto_to_json(destination)},
        )
        outcomes[model.t] = out.get_int_custom_property("pushed")
    assert outcomes == {1: 1, 2: 0}
    (version,) = os.listdir(base / "1")  # Pusher's own version (a timestamp)
    assert sorted(os.listdir(base / "1" / version)) == ["model.json", "weights.npy"]
    assert not (base / "2").exists()
