"""A stream's privacy unit: contribution bounding at ingest and group privacy for every mechanism.

The attack: on the real taxi trips one company has hundreds of rows in a block, and every mechanism is calibrated
to ONE row (a count's sensitivity 1), so a count at epsilon costs that company hundreds of times epsilon. On a
stream declared with ``--privacy-unit company --max-rows-per-unit K``, ingest keeps at most K rows of a company per
block and every stage's mechanisms get the per-row budget epsilon/K: the company's loss is at most the charge.
"""

import collections
import math
import os
import sqlite3

import numpy as np
import pyarrow.compute as pc
import pytest

from components._grant import laplace_count
from sage_tfx.data.taxi import TIME_COLUMN, load_taxi
from sage_tfx.ingest import access
from sage_tfx.ingest.pipeline import ingest_batches, make_spec
from sage_tfx.ingest.records import InputError, decode, schema_of
from sage_tfx.ingest.units import UnitBound
from sage_tfx.privacy import BudgetSplit, ChargeRule, GrantError, Ledger, LedgerError, stage_budget
from sage_tfx.privacy.randomness import secure_rng
from sage_tfx.privacy.split import per_row_budget
from tests.cli.test_cli_limits import _listing
from tests.helpers.cli import sage

K = 5
UNIT = "company"


@pytest.fixture(scope="module")
def trips():
    """The first 3,000 real taxi trips that name a company (every record of a unit stream needs its unit)."""
    table = load_taxi("simple")
    return table.filter(pc.is_valid(table.column(UNIT))).slice(0, 3000)


def _ingest(ledger, data, stream, rows, spec):
    return ingest_batches(ledger, stream, data, rows.to_batches(), spec, schema_of(rows.schema))


def _units_per_block(ledger, data, stream, schema):
    """{block id: Counter of company -> rows stored}, read back from the sealed blocks (trusted code)."""
    out = {}
    for b in ledger.blocks(stream):
        records = list(access.read_block_records(ledger, data, stream, [b.id], purpose="test"))
        out[b.id] = collections.Counter(v[0] for v in decode(records, schema).column(UNIT).to_pylist())
    return out


def test_a_heavy_unit_keeps_at_most_k_rows_per_block(tmp_path, trips):
    data, schema = str(tmp_path / "data"), schema_of(trips.schema)
    with Ledger.open(str(tmp_path / "l.db"), create=True) as ledger:
        ledger.create_stream("rows", 10.0, 1e-5)
        ledger.create_stream("people", 10.0, 1e-5, privacy_unit=UNIT, max_rows_per_unit=K)
        _ingest(ledger, data, "rows", trips, make_spec("time", "rows", TIME_COLUMN, "30d"))
        # the same records in a second stream: allowed here, to compare what each stream stores
        ingest_batches(
            ledger,
            "people",
            data,
            trips.to_batches(),
            make_spec("time", "people", TIME_COLUMN, "30d"),
            schema,
            allow_duplicate_of=["rows"],
        )
        as_rows = _units_per_block(ledger, data, "rows", schema)
        as_people = _units_per_block(ledger, data, "people", schema)
        # the attack as it was: on a row stream one company has far more than K rows in a block
        assert max(max(c.values()) for c in as_rows.values()) > 10 * K  # 70 of one company in a month
        # now: at most K rows per company and block, and every company of a block still there
        assert max(max(c.values()) for c in as_people.values()) == K
        for block, counts in as_people.items():
            assert set(counts) == set(as_rows[block])
            assert all(counts[u] == min(K, n) for u, n in as_rows[block].items())
        assert ledger.status("people")["privacy_unit"] == UNIT and ledger.status("people")["max_rows_per_unit"] == K
        assert ledger.status("rows")["privacy_unit"] == "row" and ledger.status("rows")["max_rows_per_unit"] == 1


def _column(batches, name):
    return [v for b in batches for v in b.column(name).to_pylist()]


def test_the_rows_kept_depend_on_the_unit_column_alone_and_a_key(trips):
    spec = make_spec("time", "s", TIME_COLUMN, "30d")
    batches = trips.to_batches(max_chunksize=700)
    bound = UnitBound(UNIT, K, b"k" * 32)
    kept = bound.keep(batches, spec)
    # reproducible: the same input and key keep the same rows
    assert _column(bound.keep(trips.to_batches(max_chunksize=700), spec), "tips") == _column(kept, "tips")
    # data-independent: other values in another column keep the same rows
    fares = [
        b.set_column(b.schema.get_field_index("fare"), "fare", pc.multiply(b.column("fare"), 3.0)) for b in batches
    ]
    assert _column(bound.keep(fares, spec), "tips") == _column(kept, "tips")
    # another key keeps as many rows, other ones of a heavy unit (the choice is the key's, not the input order's)
    other = UnitBound(UNIT, K, b"x" * 32).keep(batches, spec)
    assert len(_column(other, "tips")) == len(_column(kept, "tips"))
    assert _column(other, "trip_start_timestamp") != _column(kept, "trip_start_timestamp")


def test_a_units_rows_never_fall_in_two_shards(tmp_path, trips):
    data, schema = str(tmp_path / "data"), schema_of(trips.schema)
    with Ledger.open(str(tmp_path / "l.db"), create=True) as ledger:
        ledger.create_stream("people", 10.0, 1e-5, privacy_unit=UNIT, max_rows_per_unit=K)
        # sharding by another column would split a company's rows over shards: refused, nothing registered
        with pytest.raises(InputError, match="differs from the stream's privacy unit 'company'"):
            _ingest(ledger, data, "people", trips, make_spec("user", "people", user_column="taxi_id", shards=8))
        assert ledger.blocks("people") == []
        _ingest(ledger, data, "people", trips, make_spec("user", "people", user_column=UNIT, shards=8))
        shards = _units_per_block(ledger, data, "people", schema)
    seen = collections.Counter(u for counts in shards.values() for u in counts)
    assert len(shards) > 1 and seen and max(seen.values()) == 1
    assert max(max(c.values()) for c in shards.values()) == K  # a unit's rows, for all time, at most K


@pytest.fixture
def unit_ledger(tmp_path):
    with Ledger.open(str(tmp_path / "l.db"), create=True) as ledger:
        ledger.create_stream("people", 10.0, 1e-5, privacy_unit=UNIT, max_rows_per_unit=K)
        ledger.create_stream("rows", 10.0, 1e-5)
        for stream in ("people", "rows"):
            ledger.add_block(stream, "b0", start=0.0, end=86400.0, rows=100)
        yield ledger


def test_every_stage_hands_its_mechanisms_the_per_row_budget(unit_ledger):
    split = BudgetSplit(
        preprocessing=0.2,
        count=0.1,
        training=0.5,
        validation=0.2,
        delta=1e-6,
        rule=ChargeRule.SUM.value,
        preprocessing_delta=1e-7,
    )
    grant = unit_ledger.request("p", "people", blocks=["b0"], epsilon=1.0, delta=1.1e-6, split=split)
    assert grant.meta["unit"] == {"column": UNIT, "max_rows": K}  # signed with the grant
    assert unit_ledger.blocks("people")[0].spent[0] == pytest.approx(1.0)  # the blocks pay the charge per unit
    for stage, eps in (("preprocessing", 0.2), ("count", 0.1), ("training", 0.5), ("validation", 0.2)):
        assert stage_budget(grant, stage)[0] == pytest.approx(eps / K)
    assert stage_budget(grant, "training")[1] == pytest.approx(1e-6 / (K * math.exp((K - 1) * 0.5 / K)))
    assert stage_budget(grant, "preprocessing")[1] == pytest.approx(1e-7 / (K * math.exp((K - 1) * 0.2 / K)))
    # the exploit: a mechanism asking its stage's whole share (calibrated to one row) is refused before any draw
    with pytest.raises(GrantError, match="covers only"):
        unit_ledger.release(grant, "training", "c" * 64, 0.5, 1e-6)
    unit_ledger.release(grant, "training", "c" * 64, 0.5 / K, stage_budget(grant, "training")[1])
    # a single-stage grant too; a row stream's grants are as before
    single = unit_ledger.request("q", "people", blocks=["b0"], epsilon=0.5)
    assert stage_budget(single, "validation") == (pytest.approx(0.1), 0.0)
    with pytest.raises(GrantError, match="covers only"):
        unit_ledger.release(single, "validation", "d" * 64, 0.5)
    row = unit_ledger.request("p", "rows", blocks=["b0"], epsilon=1.0, delta=1.1e-6, split=split)
    assert "unit" not in row.meta and stage_budget(row, "training") == (0.5, 1e-6)
    assert unit_ledger.audit().ok


@pytest.mark.tf
def test_the_trainer_gets_the_per_row_budget_and_cannot_ask_the_whole_share(unit_ledger):
    from components.dp_trainer_executor import asked_budget

    split = BudgetSplit(
        preprocessing=0.0, count=0.1, training=0.5, validation=0.2, delta=1e-6, rule=ChargeRule.SUM.value
    )
    grant = unit_ledger.request("p", "people", blocks=["b0"], epsilon=0.8, delta=1e-6, split=split)
    assert asked_budget({}, grant) == (pytest.approx(0.1), pytest.approx(per_row_budget(0.5, 1e-6, K)[1]))
    with pytest.raises(GrantError, match="covers only"):
        asked_budget({"epsilon": 0.5}, grant)


def test_an_rdp_curve_charge_on_a_unit_stream_is_refused_before_any_charge(tmp_path):
    with Ledger.open(str(tmp_path / "l.db"), create=True) as ledger:
        ledger.create_stream("people", 10.0, 1e-5, accounting="rdp", privacy_unit=UNIT, max_rows_per_unit=K)
        ledger.add_block("people", "b0", start=0.0, end=86400.0, rows=10)
        orders = ledger.stream("people").orders
        with pytest.raises(LedgerError, match="RDP curve cannot be scaled to a unit"):
            ledger.request("p", "people", blocks=["b0"], curve=[0.01 * a for a in orders])
        assert all(x == 0 for x in ledger.blocks("people")[0].spent)
        ledger.request("p", "people", blocks=["b0"], epsilon=0.5, delta=1e-7)  # (epsilon, delta): scaled, granted


def _dp_counts(exact, epsilon, draws, seed):
    """``draws`` DP counts of ``exact``: the platform's count mechanism (``laplace_count``), fixed seed."""
    rng = secure_rng(seed, "unit-neighbours")
    return np.array([laplace_count(exact, epsilon, rng) for _ in range(draws)])


@pytest.mark.slow
def test_neighbours_differing_by_a_whole_unit_give_counts_within_e_to_the_epsilon(unit_ledger):
    """D holds one unit's K rows more than D'. The count stage's mechanism, with the budget the platform hands it on
    the unit stream, must satisfy P[M(D) in S] <= e^eps P[M(D') in S] (and the reverse) for every event S.

    Checked on the events {out >= c} and {out <= c} for cuts between the two counts, from 15,000 draws each (fixed
    seeds). Each comparison allows 4.5 standard errors of the difference (the binomial variance of both rates), so
    a correct mechanism fails one with probability below 3.4e-6, and the 8 of them below 3e-5 (union bound). The
    mechanism calibrated to one row (epsilon itself) breaks the bound by a factor ~e^4 at the far cut: the test can
    fail.
    """
    split = BudgetSplit(
        preprocessing=0.0, count=1.0, training=0.0, validation=0.0, delta=0.0, rule=ChargeRule.SUM.value
    )
    grant = unit_ledger.request("p", "people", blocks=["b0"], epsilon=1.0, split=split)
    eps = stage_budget(grant, "count")[0]
    assert eps == pytest.approx(1.0 / K)
    n, draws, bound = 100, 15000, math.e**1.0

    def violations(epsilon):
        d, d_prime = _dp_counts(n + K, epsilon, draws, 1), _dp_counts(n, epsilon, draws, 2)
        bad = []
        for cut in (n, n + K / 2, n + K, n + 1.5 * K):
            for p, q in (
                ((d >= cut).mean(), (d_prime >= cut).mean()),
                ((d_prime <= cut - K).mean(), (d <= cut - K).mean()),
            ):
                se = math.sqrt(p * (1 - p) / draws + bound**2 * q * (1 - q) / draws)
                if p > bound * q + 4.5 * max(se, 1.0 / draws):
                    bad.append((cut, p, q))
        return bad

    assert violations(eps) == []
    assert violations(1.0)  # the row-calibrated count: a unit of K rows moves it far beyond e^epsilon


def test_the_audit_catches_a_changed_unit_or_bound(tmp_path):
    db = str(tmp_path / "l.db")
    with Ledger.open(db, create=True) as ledger:
        ledger.create_stream("people", 10.0, 1e-5, privacy_unit=UNIT, max_rows_per_unit=K)
        ledger.create_stream("rows", 10.0, 1e-5)
        assert ledger.audit().ok
    for change in (
        "UPDATE streams SET max_rows_per_unit = 1 WHERE name = 'people'",
        "UPDATE streams SET privacy_unit = 'taxi_id' WHERE name = 'people'",
        "UPDATE streams SET privacy_unit = 'company', max_rows_per_unit = 2 WHERE name = 'rows'",
    ):
        backup = str(tmp_path / "copy.db")
        with sqlite3.connect(db) as src, sqlite3.connect(backup) as dst:
            src.backup(dst)
        with sqlite3.connect(backup) as conn:
            conn.execute(change)
        for suffix in (".key", ".key.head"):
            if os.path.exists(db + suffix) and not os.path.exists(backup + suffix):
                os.link(db + suffix, backup + suffix)
        with Ledger.open(backup, read_only=True) as ledger:
            report = ledger.audit()
        assert not report.ok and any("privacy_unit" in p or "max_rows_per_unit" in p for p in report.problems)
        for suffix in ("", ".key", ".key.head"):
            if os.path.exists(backup + suffix):
                os.unlink(backup + suffix)


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["--privacy-unit", UNIT, "--max-rows-per-unit", "0"],
            "max_rows_per_unit 0 is invalid: give an integer K >= 1",
        ),
        (["--privacy-unit", UNIT], "needs a bound: give --max-rows-per-unit K"),
        (["--max-rows-per-unit", "3"], "needs a privacy unit: give --privacy-unit COLUMN"),
        (["--privacy-unit", "", "--max-rows-per-unit", "3"], "privacy unit column '' is invalid"),
    ],
)
def test_a_bad_unit_is_refused_before_a_ledger_exists(tmp_path, args, message):
    db = str(tmp_path / "l.db")
    result = sage("ledger", "init", "--db", db, "--stream", "s", "--epsilon", "1", "--delta", "1e-6", *args)
    assert result.returncode == 2 and message in result.stderr
    assert _listing(str(tmp_path)) == []


def test_input_without_the_unit_column_is_refused_with_nothing_registered(tmp_path, trips):
    data = str(tmp_path / "data")
    with Ledger.open(str(tmp_path / "l.db"), create=True) as ledger:
        ledger.create_stream("people", 10.0, 1e-5, privacy_unit="rider_id", max_rows_per_unit=K)
        with pytest.raises(InputError, match="privacy unit column 'rider_id' is not in the input"):
            _ingest(ledger, data, "people", trips, make_spec("time", "people", TIME_COLUMN, "30d"))
        assert ledger.blocks("people") == []
    assert not os.path.exists(data) or _listing(data) == []


def test_a_stream_made_before_privacy_units_reads_as_unit_row(tmp_path):
    db = str(tmp_path / "l.db")
    with Ledger.open(db, create=True) as ledger:
        ledger.create_stream("old", 1.0, 1e-6)
        ledger.add_block("old", "b0", start=0.0, end=86400.0, rows=10)
    with sqlite3.connect(db) as conn:  # the ledger as schema 8 stored it
        for column in ("privacy_unit", "max_rows_per_unit"):
            conn.execute(f"ALTER TABLE streams DROP COLUMN {column}")
        conn.execute("UPDATE meta SET value = '8' WHERE key = 'schema_version'")
    Ledger.upgrade(db, progress=lambda line: None)  # sage ledger upgrade: schema 8 -> 10
    with Ledger.open(db) as ledger:
        s = ledger.stream("old")
        assert (s.privacy_unit, s.max_rows_per_unit, s.unit_rows) == (None, None, 1)
        grant = ledger.request("p", "old", blocks=["b0"], epsilon=0.5)
        assert stage_budget(grant, "count") == (0.5, 0.0) and "unit" not in grant.meta
        assert ledger.audit().ok


def test_a_run_grant_drawn_on_a_unit_stream_is_per_row_and_drawn_again_the_same(tmp_path):
    from sage_tfx.release.growth import charge_lifetime, schedule_fingerprint

    meta = {"strategy": "bbscheduler"}
    fingerprint = schedule_fingerprint("p", "people", meta)
    with Ledger.open(str(tmp_path / "l.db"), create=True) as ledger:
        ledger.create_stream("people", 1.0, 1e-6, privacy_unit=UNIT, max_rows_per_unit=K)
        for i in range(2):
            ledger.add_block("people", f"b{i}")
        lifetimes = [charge_lifetime(ledger, "people", "p", f"b{i}", 0.5, 1e-7, meta, fingerprint) for i in range(2)]
        run = ledger.draw(lifetimes, 0, 0.2, 4e-8, schedule=fingerprint)
        assert run.meta["unit"] == {"column": UNIT, "max_rows": K}
        assert stage_budget(run, "training") == pytest.approx(per_row_budget(0.2, 4e-8, K))
        assert ledger.draw(lifetimes, 0, 0.2, 4e-8, schedule=fingerprint).id == run.id  # the same draw: its grant
        assert ledger.audit().ok


def test_a_release_strategy_calibrated_to_one_row_is_refused_before_any_charge(tmp_path):
    from sage_tfx.release.continual import ContinualRelease, ReleaseParams

    with Ledger.open(str(tmp_path / "l.db"), create=True) as ledger:
        ledger.create_stream("people", 1.0, 1e-6, privacy_unit=UNIT, max_rows_per_unit=K)
        ledger.add_block("people", "b0")
        with pytest.raises(LedgerError, match="ContinualRelease calibrates its mechanisms to one row"):
            ContinualRelease(
                ledger,
                "people",
                "p",
                ReleaseParams(epsilon=0.1, delta=1e-7, records_per_block=100),
                lambda grant: None,
                dim=2,
            )
        assert ledger.grants("people") == [] and ledger.blocks("people")[0].spent[0] == 0


def test_the_audit_catches_a_grant_made_while_the_bound_was_changed(tmp_path):
    db = str(tmp_path / "l.db")
    with Ledger.open(db, create=True) as ledger:
        ledger.create_stream("people", 10.0, 1e-5, privacy_unit=UNIT, max_rows_per_unit=K)
        ledger.add_block("people", "b0")
    with sqlite3.connect(db) as conn:  # K lowered behind the ledger's back, a grant taken, K put back
        conn.execute("UPDATE streams SET max_rows_per_unit = 1 WHERE name = 'people'")
    with Ledger.open(db) as ledger:
        grant = ledger.request("p", "people", blocks=["b0"], epsilon=1.0)
        assert stage_budget(grant, "count") == (1.0, 0.0)  # the whole epsilon, for one row
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE streams SET max_rows_per_unit = ? WHERE name = 'people'", (K,))
    with Ledger.open(db, read_only=True) as ledger:
        report = ledger.audit()
    assert not report.ok
    assert any(f"grant {grant.id!r} signs privacy unit" in p for p in report.problems), report.problems


def test_the_beam_ingest_bounds_a_unit_over_all_its_input_files(tmp_path, trips):
    """Two input files hold rows of one company in the same blocks: the bound holds over both (one writer)."""
    import pyarrow.csv as pacsv

    from sage_tfx.ingest.pipeline import ingest
    from sage_tfx.ingest.records import infer_schema

    half = trips.num_rows // 2
    files = [str(tmp_path / "a.csv"), str(tmp_path / "b.csv")]
    pacsv.write_csv(trips.slice(0, half), files[0])
    pacsv.write_csv(trips.slice(half), files[1])
    db, data = str(tmp_path / "l.db"), str(tmp_path / "data")
    with Ledger.open(db, create=True) as ledger:
        ledger.create_stream("people", 10.0, 1e-5, privacy_unit=UNIT, max_rows_per_unit=K)
    ingest(db, "people", files, data, block_by="user", shards=4, progress=False)  # shards by the unit itself
    with Ledger.open(db) as ledger:
        shards = _units_per_block(ledger, data, "people", infer_schema(files[0], "csv"))  # as ingest typed them
    assert max(max(c.values()) for c in shards.values()) == K
    assert max(collections.Counter(u for c in shards.values() for u in c).values()) == 1
