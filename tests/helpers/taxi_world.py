"""Shared test helpers: real taxi trips ingested into a ledger, and BlockExampleGen output for a grant."""

import os
import textwrap

from sage_tfx.data.taxi import TIME_COLUMN, taxi_csv_path
from sage_tfx.ingest.pipeline import ingest_batches, make_spec
from sage_tfx.ingest.records import infer_schema, read_batches


def ingest_taxi(ledger, data_root, source="simple", window="30d", stream="taxi"):
    """Ingest the real taxi CSV ``source`` of the tfx wheel into ``stream`` (blocks of ``window``)."""
    path = taxi_csv_path(source)
    schema = infer_schema(path, "csv")
    return ingest_batches(
        ledger,
        stream,
        data_root,
        read_batches(path, "csv", schema),
        make_spec("time", stream, TIME_COLUMN, window),
        schema,
    )


def block_examples(db, data, grant, uri, stream="taxi"):
    """Run BlockExampleGen's executor for ``grant``; return the Examples artifact written at ``uri``."""
    from tfx.types import standard_artifacts

    from sage_tfx.components.block_example_gen_executor import Executor

    examples = standard_artifacts.Examples()
    examples.uri = str(uri)
    os.makedirs(examples.uri, exist_ok=True)
    Executor().Do(
        {},
        {"examples": [examples]},
        {"grant": grant.to_json(), "ledger": db, "data_root": data, "stream": stream, "splits": None},
    )
    return examples


def regrant(ledger, grant, examples):
    """A fresh grant on ``grant``'s blocks (same charge, split and meta), and ``examples`` marked as read under it.

    A grant pays for ONE release per stage and computation (``Ledger.release``), so every test that releases
    something (trains, validates, preprocesses) runs under its own grant. The records are the same blocks'
    records, so the examples artifact is reused: a copy whose ``grant_id`` names the new grant.
    """
    fresh = ledger.request(
        grant.pipeline,
        grant.stream,
        blocks=list(grant.blocks),
        epsilon=grant.epsilon,
        delta=grant.delta,
        meta=dict(grant.meta),
    )
    return fresh, relabelled(examples, fresh)


def relabelled(examples, grant):
    """A copy of the Examples artifact ``examples`` (same files, same custom properties) marked as read under
    ``grant`` (its ``grant_id``)."""
    from tfx.types import standard_artifacts

    copy = standard_artifacts.Examples()
    copy.uri = examples.uri
    copy.split_names = examples.split_names
    for key, value in examples.mlmd_artifact.custom_properties.items():
        copy.mlmd_artifact.custom_properties[key].CopyFrom(value)
    copy.set_string_custom_property("grant_id", grant.id)
    return copy


def module_file(tmp_path, body):
    """A trainer module file ``tmp_path/module.py``: the imports a run_fn of these tests uses, then ``body``."""
    path = tmp_path / "module.py"
    path.write_text(
        "import sage_tfx\nimport json, os\nfrom sage_tfx.components import trainer_utils\n"
        "from sage_tfx.models import DPDNNRegressor, DPLinearRegressor\n" + textwrap.dedent(body)
    )
    return path
