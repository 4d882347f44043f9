"""Trusted reads leave a trace: every decryption of blocks outside a grant (no charge) first writes a keyed
``trusted_read`` entry naming the blocks and the caller's purpose, which `sage ledger audit` lists."""

import ast
import json
import os
import subprocess
import sys

import pytest

from sage_tfx.data.taxi import TIME_COLUMN, load_taxi
from sage_tfx.ingest import access, sealed
from sage_tfx.ingest.pipeline import ingest_batches, make_spec
from sage_tfx.ingest.records import schema_of
from sage_tfx.pipelines import scoring
from sage_tfx.privacy import Ledger, LedgerError, UnknownBlock

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture()
def world(tmp_path):
    """Stream a: the first 600 real taxi trips in daily blocks."""
    db, data = str(tmp_path / "ledger.db"), str(tmp_path / "data")
    rows = load_taxi("simple").slice(0, 600)
    ledger = Ledger.open(db, create=True)
    ledger.create_stream("a", 1.0, 1e-5)
    ingest_batches(
        ledger, "a", data, rows.to_batches(), make_spec("time", "a", TIME_COLUMN, "1d"), schema_of(rows.schema)
    )
    yield dict(db=db, data=data, ledger=ledger)
    ledger.close()


def _kinds(ledger):
    return [entry[2] for entry in ledger.log_entries()]


def test_a_trusted_read_of_spent_blocks_is_in_the_audit_with_its_blocks_and_purpose(world):
    """The baseline helpers decrypted every block, spent ones included, with no charge and no entry: the log was
    the same after as before. Now the read is a keyed log entry, and `sage ledger audit` lists it."""
    ledger, data, db = world["ledger"], world["data"], world["db"]
    blocks = [b.id for b in ledger.blocks("a")][:3]
    ledger.request("p", "a", blocks=blocks, epsilon=1.0)  # spends them whole: retired, never granted again
    assert all(b.state == "retired" for b in ledger.blocks("a") if b.id in blocks)
    before = ledger.log_entries()
    rows = scoring.block_rows(data, "a", blocks, ledger=ledger, purpose="non-private baseline")
    assert rows.num_rows == sum(ledger.private_row_count("a", b) for b in blocks) > 0
    after = ledger.log_entries()
    assert after[: len(before)] == before and [e[2] for e in after[len(before) :]] == ["trusted_read"]
    assert json.loads(after[-1][3]) == {"stream": "a", "blocks": blocks, "purpose": "non-private baseline"}
    report = ledger.audit()
    assert report.ok, report.problems
    assert [(r["stream"], r["blocks"], r["purpose"]) for r in report.trusted_reads] == [
        ("a", blocks, "non-private baseline")
    ]

    text = subprocess.run(
        [sys.executable, "-m", "sage_tfx", "ledger", "audit", "--db", db], capture_output=True, text=True
    )
    assert text.returncode == 0, text.stdout + text.stderr
    assert "1 trusted read(s) outside a grant" in text.stdout, text.stdout
    assert f"3 block(s) {', '.join(blocks)}; purpose: non-private baseline" in text.stdout, text.stdout
    as_json = subprocess.run(
        [sys.executable, "-m", "sage_tfx", "ledger", "audit", "--db", db, "--json"], capture_output=True, text=True
    )
    report = json.loads(as_json.stdout)
    assert report["ok"] and report["trusted_read_count"] == 1 and report["trusted_reads"][0]["blocks"] == blocks
    status = subprocess.run(
        [sys.executable, "-m", "sage_tfx", "ledger", "status", "--db", db, "--stream", "a", "--json"],
        capture_output=True,
        text=True,
    )
    assert json.loads(status.stdout)["trusted_reads"] == 1, status.stdout + status.stderr


def test_the_entry_is_committed_before_any_block_is_opened(world, monkeypatch):
    ledger, data = world["ledger"], world["data"]
    block = ledger.blocks("a")[0].id
    real_open, seen = sealed.open_block, []

    def open_block(*args, **kwargs):
        with Ledger.open(world["db"]) as other:  # another connection: only what was committed
            seen.append(_kinds(other)[-1])
        return real_open(*args, **kwargs)

    monkeypatch.setattr(sealed, "open_block", open_block)
    assert list(access.read_block_records(ledger, data, "a", [block], purpose="check the ingest"))
    assert seen == ["trusted_read"]


@pytest.mark.parametrize(
    "purpose, error", [(None, LedgerError), ("", LedgerError), ("   ", LedgerError), (3, LedgerError)]
)
def test_every_door_outside_a_grant_needs_a_purpose_and_gives_no_key_without_its_entry(world, purpose, error):
    ledger, data = world["ledger"], world["data"]
    block = ledger.blocks("a")[0].id
    before = ledger.log_entries()
    with pytest.raises(TypeError, match="purpose"):
        access.trusted_block_keys(ledger, "a", [block])
    with pytest.raises(TypeError, match="purpose"):
        access.read_block_records(ledger, data, "a", [block])
    with pytest.raises(TypeError, match="purpose"):
        scoring.block_rows(data, "a", [block], ledger=ledger)
    with pytest.raises(error, match="purpose"):
        access.trusted_block_keys(ledger, "a", [block], purpose=purpose)
    with pytest.raises(error, match="purpose"):
        access.read_block_records(ledger, data, "a", [block], purpose=purpose)
    with pytest.raises(UnknownBlock, match="'nope'"):
        access.read_block_records(ledger, data, "a", [block, "nope"], purpose="a block that is not there")
    assert ledger.log_entries() == before


def _calls(names):
    """(file, enclosing function, callee) of every call of a function or method named in ``names`` in the package's
    code (sage_tfx, components, pipelines), outside the module that defines it."""
    found = []
    for top in ("sage_tfx", "components", "pipelines"):
        for folder, _dirs, files in os.walk(os.path.join(ROOT, top)):
            for name in files:
                if not name.endswith(".py"):
                    continue
                path = os.path.join(folder, name)
                tree = ast.parse(open(path).read())
                for func in ast.walk(tree):
                    if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        continue
                    for node in ast.walk(func):
                        if isinstance(node, ast.Call):
                            callee = getattr(node.func, "attr", getattr(node.func, "id", None))
                            if callee in names:
                                found.append((os.path.relpath(path, ROOT), func.name, callee))
    return sorted(set(found))


def test_no_decryption_path_bypasses_the_two_doors():
    """A block's key is derived in the grant door, the trusted door (which logs first), ingest's sealing of a
    block it writes and the pre-charge check (``access.check_blocks``: it authenticates each manifest and reads no
    record); a block is opened (its data key unwrapped) only by ``access.open_blocks``, which is handed keys from
    those doors, and by that check."""
    assert _calls({"block_key"}) == [
        ("sage_tfx/ingest/access.py", "check_blocks", "block_key"),  # a manifest authenticated, no record read
        ("sage_tfx/ingest/access.py", "grant_block_keys", "block_key"),
        ("sage_tfx/ingest/access.py", "trusted_block_keys", "block_key"),
        ("sage_tfx/ingest/store.py", "_commit_plan", "block_key"),  # sealing a new block's manifest: a write
    ]
    assert [c for c in _calls({"open_block", "unwrap"}) if c[0] != "sage_tfx/ingest/sealed.py"] == [
        ("sage_tfx/ingest/access.py", "check_blocks", "open_block"),
        ("sage_tfx/ingest/access.py", "open_blocks", "open_block"),
    ]
    assert sorted({c[:2] for c in _calls({"open_blocks"})}) == [
        ("sage_tfx/ingest/access.py", "grant_blocks"),
        ("sage_tfx/ingest/access.py", "read_block_records"),
    ]
