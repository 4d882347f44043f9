"""Every release is bound to the records it reads, and a parallel grant keeps its train and test records apart.

The exploits these tests reproduce (each refused now, before any record is read or any noise drawn):

* the same noise on different data: BlockExampleGen run twice under one grant with other ``splits`` (bucket
  counts, or the same counts in another order) gave two Examples artifacts with the grant's id but other
  train/eval records; the validator, DPTransform or DPTrainer re-opened "the same" release on the second one
  with the grant's seed, so the two outputs differed by data alone (their difference gives exact statistics).
  The record split is now signed into the grant (``meta["records"]``); BlockExampleGen refuses any other,
  and the components refuse Examples of another rule or of other blocks (``data_digest``), naming both;
* the parallel rule assumed: under ``pre+count+max(train+reject,val)`` the validator accepted
  ``eval_split="train"`` (and a REJECT test on "eval"), DPTrainer accepted "eval" among its training splits,
  and ``run_fn`` got ``fn_args.eval_files`` (``trainer_utils.load_examples(..., split="eval")`` read them).

Data: the real Chicago taxi trips (tfx wheel) ingested in 30-day blocks; grants cover the first year.
"""

import json
import os
import re

import numpy as np
import pytest

import sage_tfx  # noqa: F401  (before TensorFlow)
from sage_tfx.privacy import DEFAULT_RECORD_SPLIT, GrantError, Ledger, record_split
from tests.helpers.taxi_world import block_examples, ingest_taxi, module_file, relabelled

pytestmark = pytest.mark.tf

PARALLEL = {
    "preprocessing": 0.1,
    "count": 0.0,
    "training": 0.9,
    "validation": 0.9,
    "rejection": 0.0,
    "delta": 1e-6,
    "rule": "pre+count+max(train+reject,val)",
}
SUM = {
    "preprocessing": 0.1,
    "count": 0.0,
    "training": 0.5,
    "validation": 0.4,
    "delta": 1e-6,
    "rule": "pre+count+train+reject+val",
}
WITH_REJECT = dict(PARALLEL, training=0.8, rejection=0.1)
OTHER_RULE = {"buckets": [["train", 8], ["eval", 2]], "training": ["train"], "test": ["eval"]}
FARE_B = 100.0
VALIDATION = {"metric": "mse", "target": 40.0, "label_key": "fare", "loss_bound": FARE_B}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("binding")
    db, data = str(root / "ledger.db"), str(root / "data")
    ledger = Ledger.open(db, create=True)
    ledger.create_stream("taxi", 1000.0, 1e-3, max_epsilon=1000.0)
    ingest_taxi(ledger, data, "simple")
    blocks = ledger.blocks("taxi")
    year = [b.id for b in blocks if b.end <= blocks[0].start + 365 * 86400]
    yield dict(root=root, db=db, data=data, ledger=ledger, year=year, model=_fare_model(root / "model"))
    ledger.close()


@pytest.fixture(scope="module")
def examples_of(world, tmp_path_factory):
    """``examples_of(grant)``: BlockExampleGen's Examples of ``grant``. Grants with the same blocks and meta (so the
    same split and record split: the same ``data_digest``) read the same records, so BlockExampleGen runs once
    for them and the later ones get its output marked as read under them (``relabelled``)."""
    made = {}

    def get(grant):
        key = (tuple(grant.blocks), repr(grant.meta))
        if key not in made:
            made[key] = block_examples(world["db"], world["data"], grant, tmp_path_factory.mktemp("examples"))
            return made[key]
        return relabelled(made[key], grant)

    return get


def _grant(world, split=PARALLEL, blocks=None, **meta):
    return world["ledger"].request(
        "p", "taxi", blocks=blocks or world["year"], epsilon=1.0, delta=1e-6, meta={"split": split, **meta}
    )


def _fare_model(folder):
    """A fixed SavedModel in TFX's Model layout: fare = 2.5 * trip_miles + 4, features by name."""
    import tensorflow as tf

    from sage_tfx.models.data import FeatureLayout
    from sage_tfx.models.export import export_saved_model

    inputs = tf.keras.Input((1,))
    dense = tf.keras.layers.Dense(1)
    keras_model = tf.keras.Model(inputs, dense(inputs))
    dense.set_weights([np.array([[2.5]], np.float32), np.array([4.0], np.float32)])
    export_saved_model(
        str(folder / "Format-Serving"),
        keras_model,
        FeatureLayout(["trip_miles"], [1]),
        lambda out: {"predictions": tf.reshape(out, [-1])},
    )
    return str(folder)


def _validate(world, tmp_path, grant, examples, **params):
    """Run DPModelValidator's executor; return the result report."""
    from tfx.types import standard_artifacts

    from sage_tfx.components.dp_model_validator import SageValidationResult
    from sage_tfx.components.dp_model_validator_executor import Executor

    model = standard_artifacts.Model()
    model.uri = world["model"]
    blessing, result = standard_artifacts.ModelBlessing(), SageValidationResult()
    blessing.uri, result.uri = str(tmp_path / "blessing"), str(tmp_path / "result")
    os.makedirs(blessing.uri, exist_ok=True)
    os.makedirs(result.uri, exist_ok=True)
    props = {"grant": grant.to_json(), "ledger": world["db"], **VALIDATION, **params}
    Executor().Do(
        {"model": [model], "examples": [examples]}, {"blessing": [blessing], "validation_result": [result]}, props
    )
    with open(os.path.join(result.uri, "result.json")) as f:
        return json.load(f)


def _train(world, tmp_path, grant, examples, module, **params):
    from tfx.types import standard_artifacts

    from sage_tfx.components.dp_trainer_executor import Executor

    model, run = standard_artifacts.Model(), standard_artifacts.ModelRun()
    model.uri, run.uri = str(tmp_path / "model"), str(tmp_path / "model_run")
    os.makedirs(model.uri, exist_ok=True)
    os.makedirs(run.uri, exist_ok=True)
    props = {"grant": grant.to_json(), "ledger": world["db"], "module_file": str(module), **params}
    Executor().Do({"examples": [examples]}, {"model": [model], "model_run": [run]}, props)
    return model


TRAIN_RUN_FN = """
def run_fn(fn_args):
    seen = {"eval_files": list(fn_args.eval_files or [])}
    try:
        trainer_utils.load_examples(fn_args, {"trip_miles": 10.0}, "fare", split="eval")
        seen["eval_read"] = "read"
    except trainer_utils.TrainerDataError as exc:
        seen["eval_read"] = str(exc)
    with open(os.path.join(os.path.dirname(fn_args.model_run_dir), "seen.json"), "w") as f:
        json.dump(seen, f)
    x, y = trainer_utils.load_examples(fn_args, {"trip_miles": 10.0}, "fare")
    model = DPLinearRegressor(fn_args.privacy_budget, feature_bound=3.0, label_range=(0, 100)).fit(x, y)
    trainer_utils.export_model(fn_args, model, {"trip_miles": 10.0})
    return trainer_utils.report_spent(fn_args, model)
"""


# ------------------------------------------------------------------------------------------ the signed rule


def test_a_grant_signs_its_record_split(world):
    """Every grant with a split carries the platform's record split (train 9 / eval 1; train the training
    side, eval the test side) under its signature; a request may sign another one, checked."""
    grant = _grant(world)
    assert grant.meta["records"] == {"buckets": [["train", 9], ["eval", 1]], "training": ["train"], "test": ["eval"]}
    assert record_split(world["ledger"].verify(grant.to_json())) == DEFAULT_RECORD_SPLIT
    other = _grant(world, records=OTHER_RULE)
    assert record_split(other).splits == {"train": 8, "eval": 2}
    from sage_tfx.privacy import LedgerError

    for bad, message in (
        ({"buckets": [["train", 9], ["eval", 1]], "training": ["train"], "test": []}, "exactly one side"),
        ({"buckets": [["train", 0]], "training": ["train"], "test": []}, "need an integer > 0"),
        ({"buckets": [["train", 9]], "training": ["train"]}, "buckets, training and test"),
    ):
        with pytest.raises(LedgerError, match=message):
            _grant(world, records=bad)
    altered = json.loads(grant.to_json())
    altered["meta"]["records"]["buckets"] = [["train", 8], ["eval", 2]]
    with pytest.raises(GrantError, match="forged"):
        world["ledger"].verify(json.dumps(altered))


@pytest.mark.parametrize(
    "splits",
    [{"train": 8, "eval": 2}, {"eval": 1, "train": 9}, {"train": 8, "eval": 1, "holdout": 1}],
    ids=["8:2", "reordered", "three"],
)
def test_block_example_gen_refuses_splits_the_grant_did_not_sign(world, tmp_path, splits):
    """The first step of the exploit: a second BlockExampleGen run under the grant with other bucket counts
    (or the same counts in another order: other records per split) is refused before anything is read,
    naming both rules."""
    from tfx.types import standard_artifacts

    from sage_tfx.components.block_example_gen_executor import Executor

    grant = _grant(world)
    first = block_examples(world["db"], world["data"], grant, tmp_path / "first")
    assert json.loads(first.get_string_custom_property("split_rule")) == {"train": 9, "eval": 1}
    second = standard_artifacts.Examples()
    second.uri = str(tmp_path / "second")
    with pytest.raises(GrantError) as refused:
        Executor().Do(
            {},
            {"examples": [second]},
            {
                "grant": grant.to_json(),
                "ledger": world["db"],
                "data_root": world["data"],
                "stream": "taxi",
                "splits": json.dumps(splits),
            },
        )
    message = str(refused.value)
    assert str(splits) in message and "{'train': 9, 'eval': 1}" in message and grant.id in message
    assert not os.path.exists(second.uri) or not os.listdir(second.uri)
    # the signed rule itself (given explicitly) is what it reads by
    again = block_examples(world["db"], world["data"], grant, tmp_path / "again")
    assert again.get_string_custom_property("data_digest") == first.get_string_custom_property("data_digest")


def test_block_example_gen_splits_by_a_signed_other_rule(world, tmp_path):
    """A grant that signs another record split is read by it (BlockExampleGen without ``splits``)."""
    grant = _grant(world, records=OTHER_RULE)
    examples = block_examples(world["db"], world["data"], grant, tmp_path / "ex")
    assert list(json.loads(examples.get_string_custom_property("split_rule")).items()) == [("train", 8), ("eval", 2)]


# ------------------------------------------------------------------------------ the same noise on other data


def _other_split_examples(world, tmp_path, grant):
    """What the landed BlockExampleGen made under ``grant`` with splits {"train": 8, "eval": 2}: the grant's
    blocks hashed into 8:2 buckets, with the grant's lineage (made here under a sibling grant that signs that
    rule, then marked as the grant's, as a second run under it was)."""
    sibling = _grant(world, records=OTHER_RULE)
    return relabelled(block_examples(world["db"], world["data"], sibling, tmp_path / "other_split"), grant)


def test_validator_reopened_on_other_records_is_refused(world, examples_of, tmp_path):
    """The exploit end to end on the validator: validate under a grant, then validate the same model with the
    same test on the 8:2 Examples of the same grant. The landed code re-opened the release (same seed, same
    noise) and released the loss bound of other records; now refused before a record is read, naming both
    rules; the grant keeps its one release."""
    grant = _grant(world, SUM)
    examples = examples_of(grant)
    first = _validate(world, tmp_path / "a", grant, examples)
    assert first["outcome"] in ("ACCEPT", "RETRY", "REJECT")
    releases = world["ledger"].releases(grant.id)
    assert [r.stage for r in releases] == ["validation"]
    # the same records re-validated: the same release re-opened, the same figures
    assert _validate(world, tmp_path / "b", grant, examples)["bound"] == first["bound"]

    other = _other_split_examples(world, tmp_path, grant)
    with pytest.raises(GrantError) as refused:
        _validate(world, tmp_path / "c", grant, other)
    message = str(refused.value)
    assert '{"train": 8, "eval": 2}' in message and "{'train': 9, 'eval': 1}" in message
    assert os.listdir(tmp_path / "c" / "result") == [] and os.listdir(tmp_path / "c" / "blessing") == []
    assert world["ledger"].releases(grant.id) == releases


@pytest.mark.parametrize("other", ["8:2 split", "other blocks"])
def test_components_refuse_other_records_under_the_grant(world, tmp_path, other):
    """The exploit's second step on each component: Examples of other records under the grant's id (the 8:2
    split of its blocks, as a second BlockExampleGen run made them; or another grant's blocks split by the same
    rule) are refused by the validator, DPTransform and DPTrainer before they read or draw anything, naming
    both rules or both data digests; the grant releases nothing."""
    from tfx.types import standard_artifacts

    from sage_tfx.components import dp_transform_executor
    from sage_tfx.components._grant import data_digest

    grant = _grant(world)
    if other == "8:2 split":
        examples = _other_split_examples(world, tmp_path, grant)
        match = (
            re.escape('split by {"train": 8, "eval": 2}')
            + ".*"
            + re.escape("signs the record split buckets {'train': 9, 'eval': 1}")
        )
    else:
        elsewhere = _grant(world, blocks=world["year"][:3])
        examples = relabelled(block_examples(world["db"], world["data"], elsewhere, tmp_path / "ex"), grant)
        have, want = examples.get_string_custom_property("data_digest"), data_digest(world["ledger"], grant)
        assert have != want
        match = f"hold data {have[:16]}.*are data {want[:16]}"
    module = module_file(tmp_path, TRAIN_RUN_FN)
    runs = {
        "validator": lambda: _validate(world, tmp_path / "v", grant, examples),
        "trainer": lambda: _train(world, tmp_path / "t", grant, examples, module),
        "transform": lambda: dp_transform_executor.Executor().Do(
            {"examples": [examples]},
            {
                "transform_graph": [standard_artifacts.TransformGraph()],
                "transformed_examples": [standard_artifacts.Examples()],
            },
            {"grant": grant.to_json(), "ledger": world["db"], "module_file": str(module), "data_root": world["data"]},
        ),
    }
    for _name, run in runs.items():
        with pytest.raises(GrantError, match=match):
            run()
    assert world["ledger"].releases(grant.id) == []
    assert not (tmp_path / "seen.json").exists()


def test_components_refuse_examples_without_the_lineage(world, examples_of, tmp_path):
    """Examples with the grant's id but no split rule / data digest (not BlockExampleGen's) are refused."""
    grant = _grant(world)
    examples = examples_of(grant)
    bare = relabelled(examples, grant)
    bare.mlmd_artifact.custom_properties.pop("data_digest")
    with pytest.raises(GrantError, match="carries no data_digest"):
        _validate(world, tmp_path / "v", grant, bare)
    assert world["ledger"].releases(grant.id) == []


def test_release_fingerprints_bind_the_records(world, examples_of, tmp_path):
    """``data_digest``: the same for two grants on the same blocks and rule (a regrant or a resumed run keeps its
    fingerprint), another for other blocks or another signed rule; a release's stored fingerprint includes it."""
    from sage_tfx.components._grant import data_digest, release_data

    ledger = world["ledger"]
    a, b = _grant(world), _grant(world)
    assert data_digest(ledger, a) == data_digest(ledger, b)
    fewer = _grant(world, blocks=world["year"][1:])
    assert data_digest(ledger, fewer) != data_digest(ledger, a)
    assert data_digest(ledger, _grant(world, records=OTHER_RULE)) != data_digest(ledger, a)

    # the validation release's stored fingerprint is that of these records: the same test on another
    # grant's records is another computation
    from sage_tfx.components.dp_model_validator_executor import validation_computation, validation_plan

    grant = _grant(world, SUM)
    _validate(world, tmp_path / "v", grant, examples_of(grant))
    (release,) = ledger.releases(grant.id)
    plan = validation_plan(dict(VALIDATION, grant=grant.to_json()), grant)
    model = os.path.join(world["model"], "Format-Serving")
    assert release.computation == validation_computation(
        plan, model, release_data(data_digest(ledger, grant), ["eval"])
    )
    assert release.computation != validation_computation(
        plan, model, release_data(data_digest(ledger, fewer), ["eval"])
    )


# ------------------------------------------------------------------------------------- the parallel rule


@pytest.mark.parametrize(
    "params, side",
    [({"eval_split": "train"}, "test"), ({"train_split": "eval"}, "training")],
    ids=["accept-on-train", "reject-on-eval"],
)
def test_validator_keeps_each_test_on_its_side_under_parallel(world, examples_of, tmp_path, params, side):
    """Under a parallel grant the ACCEPT test reads the test side only and the REJECT test the training side
    only: the landed validator took eval_split="train" (the training records then paid train + val against a
    charge of max(train, val)); refused before anything is read or released."""
    grant = _grant(world, WITH_REJECT)
    with pytest.raises(GrantError, match=f"not put on the {side} side"):
        _validate(world, tmp_path / "v", grant, examples_of(grant), **params)
    assert world["ledger"].releases(grant.id) == []


def test_validator_under_sum_reads_any_split(world, examples_of, tmp_path):
    """Under the sum rule every stage is charged for every record: eval_split="train" is validated as before."""
    grant = _grant(world, SUM)
    assert _validate(world, tmp_path / "v", grant, examples_of(grant), eval_split="train")["eval_split"] == "train"


def test_dp_trainer_refuses_test_splits_among_its_training_splits(world, examples_of, tmp_path):
    """Under a parallel grant DPTrainer refuses "eval" among train_args.splits before run_fn runs."""
    grant = _grant(world)
    examples = examples_of(grant)
    module = module_file(tmp_path, TRAIN_RUN_FN)
    with pytest.raises(GrantError, match=r"split\(s\) \['eval'\].*training side"):
        _train(world, tmp_path, grant, examples, module, train_args=json.dumps({"splits": ["train", "eval"]}))
    assert not (tmp_path / "seen.json").exists() and world["ledger"].releases(grant.id) == []


def test_run_fn_gets_no_eval_files_under_parallel(world, tmp_path):
    """A run_fn that reads the eval split (early stopping, model selection) under a parallel grant: it gets no
    eval files and load_examples(..., split="eval") refuses; it still trains on the train split. Under the sum
    rule it gets them and reads them, as before."""
    module = module_file(tmp_path, TRAIN_RUN_FN)
    for name, split in (("parallel", PARALLEL), ("sum", SUM)):
        grant = _grant(world, split)
        examples = block_examples(world["db"], world["data"], grant, tmp_path / name / "ex")
        model = _train(world, tmp_path / name, grant, examples, module)
        seen = json.loads((tmp_path / name / "seen.json").read_text())
        assert model.get_string_custom_property("grant_id") == grant.id
        if name == "parallel":
            assert seen["eval_files"] == []
            assert "split 'eval' is not given to run_fn" in seen["eval_read"]
        else:
            assert seen["eval_files"] == [os.path.join(examples.uri, "Split-eval", "*")]
            assert seen["eval_read"] == "read"


# ---------------------------------------------------------------------------- grants made before the rule


def test_grants_without_a_signed_record_split(world, tmp_path, monkeypatch):
    """Grants made before record splits were signed keep verifying: a sum grant reads by the default rule; a
    parallel one is refused at every component's door, with the fix."""
    from sage_tfx.components._grant import check_grant
    from sage_tfx.privacy import grants

    monkeypatch.setattr(grants, "sign_records", lambda meta, split: None)  # the request as it was
    old_sum, old_parallel = _grant(world, SUM), _grant(world, PARALLEL)
    monkeypatch.undo()
    assert "records" not in old_sum.meta and "records" not in old_parallel.meta
    assert check_grant(world["db"], old_sum.to_json()).id == old_sum.id
    assert record_split(old_sum) == DEFAULT_RECORD_SPLIT
    examples = block_examples(world["db"], world["data"], old_sum, tmp_path / "ex")
    assert json.loads(examples.get_string_custom_property("split_rule")) == {"train": 9, "eval": 1}
    with pytest.raises(GrantError, match="carries no signed record split.*Request a new grant"):
        check_grant(world["db"], old_parallel.to_json())
    with pytest.raises(GrantError, match="carries no signed record split"):
        block_examples(world["db"], world["data"], old_parallel, tmp_path / "old")
