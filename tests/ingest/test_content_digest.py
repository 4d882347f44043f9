"""A block's content digest is keyed: read access to the data root tells nothing about its records.

The digest in each ``_BLOCK.json`` (and in the ledger) was the plain 64-bit sum of public row hashes: with read
access to the data root, an outsider who knew a block's other records hashed each of 1,000 candidates for the
hidden one and picked the true trip. Now it is an HMAC under a key derived from the ledger's key
(``KeyRing.content_digest``), the same in every stream of the ledger, so the cross-stream duplicate check and the
grants' ``data_digest`` still work; blocks of the previous format (the unkeyed 16-hex-digit digest) keep opening.
"""

import json
import os

import numpy as np
import pyarrow as pa
import pytest

from sage_tfx.ingest import access, layout, store
from sage_tfx.ingest.pipeline import ingest_batches, make_spec
from sage_tfx.ingest.records import InputError, row_hashes, schema_of, to_example_batch
from sage_tfx.ingest.replay import Replay
from sage_tfx.privacy import Ledger
from sage_tfx.privacy.digests import data_digest

T0 = 1600000000  # 2020-09-13T12:26:40Z; every record below is in the block 2020-09-13.1d
BLOCK = "2020-09-13.1d"


def _trips(fares):
    n = len(fares)
    return pa.table(
        {
            "t": pa.array([T0 + 60 * i for i in range(n)], pa.int64()),
            "fare_cents": pa.array(fares, pa.int64()),
            "company": pa.array(["Flash Cab"] * n),
        }
    )


KNOWN = [1250, 700, 3025]  # the block's other trips, which the attacker knows
HIDDEN = 4410  # the trip the attacker wants
CANDIDATES = list(range(4000, 5000))  # 1,000 guesses, the hidden fare among them


def _ingest(ledger, data, stream, table):
    return ingest_batches(
        ledger, stream, data, table.to_batches(), make_spec("time", stream, "t", "1d"), schema_of(table.schema)
    )


def _attack(data, stream):
    """What an outsider with read access to the data root does: the digest and schema on disk, every candidate
    hashed with the public row hash, the candidates whose block digest matches."""
    manifest = json.load(open(os.path.join(layout.block_dir(data, stream, BLOCK), layout.BLOCK_FILE)))
    schema = json.load(open(os.path.join(layout.stream_dir(data, stream), layout.STREAM_FILE)))["schema"]
    known = int(row_hashes(to_example_batch(_trips(KNOWN).to_batches()[0], schema)).sum())
    table = pa.table(
        {
            "t": pa.array([T0 + 60 * len(KNOWN)] * len(CANDIDATES), pa.int64()),
            "fare_cents": pa.array(CANDIDATES, pa.int64()),
            "company": pa.array(["Flash Cab"] * len(CANDIDATES)),
        }
    )
    guesses = row_hashes(to_example_batch(table.to_batches()[0], schema))
    with np.errstate(over="ignore"):
        totals = guesses + np.uint64(known)
    return [
        fare
        for fare, total in zip(CANDIDATES, totals.tolist())
        if f"{total:016x}" == manifest["digest"] or f"{total:064x}" == manifest["digest"]
    ], manifest["digest"]


def _previous_format(monkeypatch):
    """Blocks as the previous version wrote them: the unkeyed row-hash sum, 16 hex digits, as the digest."""
    monkeypatch.setattr(store, "keyed_digest", lambda ledger, total: f"{total:016x}")


@pytest.fixture
def world(tmp_path):
    with Ledger.open(str(tmp_path / "ledger.db"), create=True) as ledger:
        for name in ("s", "other"):
            ledger.create_stream(name, 1.0, 1e-6)
        yield dict(ledger=ledger, data=str(tmp_path / "data"), db=str(tmp_path / "ledger.db"))


def test_a_hidden_trip_cannot_be_picked_out_of_1000_candidates_by_its_digest(world, monkeypatch, tmp_path):
    ledger, data = world["ledger"], world["data"]
    table = _trips(KNOWN + [HIDDEN])
    # The attack as the previous format allowed it: exactly the hidden trip matches.
    with Ledger.open(str(tmp_path / "old.db"), create=True) as old, monkeypatch.context() as m:
        old.create_stream("s", 1.0, 1e-6)
        _previous_format(m)
        _ingest(old, str(tmp_path / "old-data"), "s", table)
        assert _attack(str(tmp_path / "old-data"), "s")[0] == [HIDDEN]
    # Now: no candidate matches, and the digest is 64 hex digits that neither disk nor ledger holds the sum of.
    _ingest(ledger, data, "s", table)
    matched, digest = _attack(data, "s")
    assert matched == [] and len(digest) == 64
    assert ledger.block_digest("s", BLOCK) == digest
    total = int(row_hashes(to_example_batch(table.to_batches()[0], layout.stream_config(data, "s")["schema"])).sum())
    assert digest == ledger.keyring.content_digest(total)
    raw = f"{total:016x}".encode()
    for folder, _, files in os.walk(data):
        for name in files:
            assert raw not in open(os.path.join(folder, name), "rb").read(), name
    assert raw not in open(world["db"], "rb").read()


def test_the_keyed_digest_still_refuses_the_same_records_in_a_second_stream_and_binds_grants(world):
    ledger, data = world["ledger"], world["data"]
    table = _trips(KNOWN + [HIDDEN])
    _ingest(ledger, data, "s", table)
    with pytest.raises(InputError, match=f"already registered as block '{BLOCK}' of stream 's'"):
        _ingest(ledger, data, "other", table)
    assert _ingest(ledger, data, "s", table)["unchanged"] == [BLOCK]  # idempotent in its own stream
    grant = ledger.request("p", "s", blocks=[BLOCK], epsilon=0.5)
    before = data_digest(ledger, grant)
    assert len(list(access.grant_blocks(ledger, data, grant.to_json())[1][0].records())) == 4
    assert data_digest(ledger, grant) == before


def test_blocks_of_the_previous_format_keep_opening(world, monkeypatch):
    """Read as they are: their 16-hex-digit digest stays in the manifest and the ledger (the ledger's log
    records it, and grants' data_digest bind it); reads, re-ingests, replays and the duplicate check accept it;
    new blocks get the keyed digest."""
    ledger, data = world["ledger"], world["data"]
    table = _trips(KNOWN + [HIDDEN])
    with monkeypatch.context() as m:
        _previous_format(m)
        _ingest(ledger, data, "s", table)
    old = ledger.block_digest("s", BLOCK)
    assert len(old) == 16
    grant = ledger.request("p", "s", blocks=[BLOCK], epsilon=0.5)
    assert len(list(access.grant_blocks(ledger, data, grant.to_json())[1][0].records())) == 4
    assert _ingest(ledger, data, "s", table)["unchanged"] == [BLOCK]
    assert Replay(ledger, "s", data, table, "t", "1d").remaining == 0  # resumes past it: the same records
    with pytest.raises(InputError, match=f"already registered as block '{BLOCK}' of stream 's'"):
        _ingest(ledger, data, "other", table)
    with pytest.raises(InputError, match=f"already registered as block '{BLOCK}' of stream 's'"):
        Replay(ledger, "other", data, table, "t", "1d")
    with pytest.raises(InputError, match="already registered with different records"):
        _ingest(ledger, data, "s", _trips(KNOWN + [HIDDEN + 1]))
    later = _trips([500]).set_column(0, "t", pa.array([T0 + 86400], pa.int64()))
    added = _ingest(ledger, data, "s", later)["added"]
    assert added == ["2020-09-14.1d"] and len(ledger.block_digest("s", added[0])) == 64
    assert ledger.block_digest("s", BLOCK) == old and ledger.audit().ok
