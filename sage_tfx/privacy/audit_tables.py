"""The audit's table comparison: every table of the ledger against the log replay, equality not approximation.

What each table is compared on: docs/security.md, "What the audit replays".
"""

import json
from typing import NamedTuple

from .anchor import changed_id_text
from .audit_budgets import _check_release_totals, _note_converted_rule
from .audit_replay import _UNLOGGED, _Replay
from .store import sql


class _Tables(NamedTuple):
    """The ledger's tables as ``_read_tables`` reads them, keyed as the replay keys its own."""

    streams: dict
    blocks: dict
    grants: dict
    releases: dict
    block_rows: dict
    grant_cols: dict
    pipelines: dict
    reservations: dict
    outcomes: dict
    meta: dict
    demands: dict
    arrivals: dict
    draws: dict
    release_owners: dict


def _compare_tables(r: _Replay, tables: _Tables, entry_count: int) -> None:
    """Every table (``_read_tables``) against the replay ``r``: equality, not approximation."""
    t = tables
    _check_meta(r.ledger, t.meta, r.problems)
    _check_binding(t.meta, r.bindings, entry_count, r.problems)
    _compare_row_tables(r, t.block_rows, t.grant_cols, t.pipelines, t.reservations, t.outcomes)
    _compare_budget_tables(r, t.streams, t.blocks, t.grants, t.releases)
    _check_release_owners(t.release_owners, t.grant_cols, r.problems)
    _check_release_totals(r.grants, r.releases, r.streams, r.problems, r.per_unit)
    _note_converted_rule(r.grants, r.report.notes)
    _compare_queue_tables(r, t.draws, t.demands, t.arrivals)


def _compare_row_tables(
    r: _Replay,
    table_block_rows: dict,
    table_grant_cols: dict,
    table_pipelines: dict,
    table_reservations: dict,
    table_outcomes: dict,
) -> None:
    """The blocks' and grants' columns, the pipelines, the reservations and the outcomes against the replay."""
    problems, block_rows, grants = r.problems, r.block_rows, r.grants
    for key, logged in block_rows.items():  # columns a block's log entry did not hold (before keys) are not compared
        if key in table_block_rows:
            block_rows[key] = tuple(t if v is _UNLOGGED else v for v, t in zip(logged, table_block_rows[key]))
    _reconcile(
        problems,
        table_block_rows,
        block_rows,
        lambda key: f"block {key[1]!r} of stream {key[0]!r}",
        lambda table, log: (
            f"table says (start, end, shard, created, rows, digest)={_brief(table)}, the log says {_brief(log)}"
        ),
    )
    log_grant_cols = {
        gid: (json.loads(b)["stream"], json.loads(b)["pipeline"], json.loads(b)["created"])
        for gid, (b, _sig) in grants.items()
    }
    _reconcile(
        problems,
        table_grant_cols,
        log_grant_cols,
        lambda gid: f"grant {gid!r}'s columns",
        lambda table, log: f"table says (stream, pipeline, created)={table}, the log says {log}",
    )
    _reconcile(
        problems,
        table_pipelines,
        r.pipelines,
        lambda key: f"pipeline {key[1]!r} of stream {key[0]!r}",
        lambda table, log: f"table says (state, outcome)={table}, the log replay says {log}",
    )
    _reconcile(
        problems,
        table_reservations,
        r.reservations,
        lambda key: f"reservation of block {key[1]!r} of stream {key[0]!r} for pipeline {key[2]!r}",
        lambda table, log: f"table says (reserved, used)={table}, the log replay says {log}",
    )
    _reconcile(
        problems,
        table_outcomes,
        r.outcomes,
        lambda gid: f"outcome of grant {gid!r}",
        lambda table, log: f"table says {table}, the log says {log}",
    )


def _compare_budget_tables(
    r: _Replay, table_streams: dict, table_blocks: dict, table_grants: dict, table_releases: dict
) -> None:
    """The streams, the blocks' spending, the grants and the releases against the replay."""
    problems, grants = r.problems, r.grants
    _reconcile(problems, table_streams, r.stream_configs, lambda name: f"stream {name!r}", _stream_difference)
    _reconcile(
        problems,
        table_blocks,
        {k: (tuple(v["spent"]), v["state"]) for k, v in r.blocks.items()},
        lambda key: f"block {key[1]!r} of stream {key[0]!r}",
        lambda table, log: (
            f"table says spent={table[0]} state={table[1]}, log replay says spent={log[0]} state={log[1]}"
        ),
    )
    _reconcile(
        problems,
        table_grants,
        grants,
        lambda gid: f"grant {gid!r}",
        lambda table, log: "the table's record differs from the log's",
        missing_note=" (never charged)",
    )
    _reconcile(
        problems,
        table_releases,
        r.releases,
        lambda key: f"release of stage {key[1]!r} under grant {key[0]!r}",
        lambda table, log: f"table says {table}, log says {log}",
    )


def _compare_queue_tables(r: _Replay, table_draws: dict, table_demands: dict, table_arrivals: dict) -> None:
    """The draws, the queued policies' demands and each block's arrival count against the replay."""
    problems = r.problems
    _reconcile(
        problems,
        table_draws,
        r.draws.rows,
        lambda key: f"draw of run {key[1]!r} from lifetime grant {key[0]!r}",
        lambda table, log: f"table says (run grant, stream, epsilon, delta)={table}, the log replay says {log}",
    )
    r.queued.finish_checks()
    _reconcile(
        problems,
        table_demands,
        {k: tuple(v) for k, v in r.queued.demands.items()},
        lambda key: f"demand of pipeline {key[1]!r} on stream {key[0]!r}",
        lambda table, log: (
            f"table says (blocks, cost, rule, meta, seq, state, grant)={table}, the log replay says {log}"
        ),
    )
    _reconcile(
        problems,
        table_arrivals,
        r.queued.arrivals,
        lambda key: f"block {key[1]!r} of stream {key[0]!r}",
        lambda table, log: f"table says {table} pipeline arrivals since it arrived, the log replay says {log}",
    )


def _read_tables(tx) -> _Tables:
    """Every table the audit compares with the log replay, read in the caller's transaction."""
    release_rows = tx.all(sql.AUDIT_RELEASES)
    return _Tables(
        streams={
            r[0]: {
                "name": r[0],
                "accounting": r[1],
                "epsilon": r[2],
                "delta": r[3],
                "orders": json.loads(r[4]),
                "policy": r[5],
                "min_epsilon": r[6],
                "min_grant_epsilon": r[7],
                "policy_params": json.loads(r[8]) if r[8] else None,
                "query_delta_share": r[9],
                "split_orders": r[10],
                "privacy_unit": r[11],
                "max_rows_per_unit": r[12],
            }
            for r in tx.all(sql.AUDIT_STREAMS)
        },
        blocks={(r[0], r[1]): (tuple(json.loads(r[2])), r[3]) for r in tx.all(sql.AUDIT_BLOCK_SPENT)},
        grants={r[0]: (r[1], r[2]) for r in tx.all(sql.AUDIT_GRANTS)},
        releases={(r[0], r[1]): (r[2], r[3], r[4]) for r in release_rows},
        block_rows={(r[0], r[1]): tuple(r[2:]) for r in tx.all(sql.AUDIT_BLOCK_ROWS)},
        grant_cols={r[0]: (r[1], r[2], r[3]) for r in tx.all(sql.AUDIT_GRANT_COLUMNS)},
        pipelines={(r[0], r[1]): (r[2], r[3]) for r in tx.all(sql.AUDIT_PIPELINES)},
        reservations={
            (r[0], r[1], r[2]): (tuple(json.loads(r[3])), tuple(json.loads(r[4])))
            for r in tx.all(sql.AUDIT_RESERVATIONS)
        },
        outcomes={r[0]: (r[1], r[2], r[3], r[4]) for r in tx.all(sql.AUDIT_OUTCOMES)},
        meta=dict(tx.all(sql.AUDIT_META)),
        demands={
            (r[0], r[1]): (tuple(json.loads(r[2])), tuple(json.loads(r[3])), r[4], r[5], r[6], r[7], r[8])
            for r in tx.all(sql.AUDIT_DEMANDS)
        },
        arrivals={(r[0], r[1]): r[2] for r in tx.all(sql.AUDIT_BLOCK_ARRIVALS)},
        draws={(r[0], r[1]): (r[2], r[3], float(r[4]), float(r[5])) for r in tx.all(sql.AUDIT_DRAWS)},
        release_owners={(r[0], r[1]): (r[5], r[6]) for r in release_rows},
    )


def _brief(values):
    return tuple("<not logged>" if v is _UNLOGGED else v for v in values)


_META_KEYS = {"schema_version", "key_id", "ledger_id", "lock"}  # every key a ledger's meta holds (store/sql.py)


_META_LOCK_VALUE = "0"  # sql.META_INSERT_LOCK's value, never changed


def _check_meta(ledger, meta, problems):
    """meta: the schema version this code writes, this key's id, and never a key or secret."""
    if "secret" in meta:
        problems.append(
            "meta holds a 'secret': the ledger's key must never be in the database (a key in the data "
            "it protects); it was put back by a writer of the database"
        )
    if meta.get("schema_version") != str(sql.SCHEMA_VERSION):
        problems.append(f"meta's schema_version is {meta.get('schema_version')!r}, not {str(sql.SCHEMA_VERSION)!r}")
    if meta.get("key_id") != ledger.keyring.key_id:
        problems.append(f"meta's key_id {meta.get('key_id')!r} is not the key file's {ledger.keyring.key_id!r}")
    unknown = sorted(set(meta) - _META_KEYS - {"secret"})
    if unknown:
        problems.append(f"meta holds key(s) {unknown} this ledger never writes: added by a writer of the database")
    if meta.get("lock") != _META_LOCK_VALUE:
        problems.append(
            f"meta's write-lock row is {meta.get('lock')!r}, not {_META_LOCK_VALUE!r}: writers on "
            "PostgreSQL take turns on it (deleted or altered by a writer of the database)"
        )
    forms = ledger.keyring.secret_forms()
    if any(form in str(v).encode() for v in meta.values() for form in forms):
        problems.append("meta holds the ledger's key bytes")


def _check_binding(meta, bindings, entry_count, problems):
    """The ledger's id as its keyed ``ledger`` entry binds it (anchor.py): exactly one such entry in a used log, naming
    the id in meta (the head file's record is looked up by that id)."""
    if entry_count and not bindings:
        problems.append(
            "the log has no keyed ledger entry binding the ledger's id (a ledger of an older version "
            "is bound when first opened; a log without it was replaced or cut)"
        )
    if len(bindings) > 1:
        problems.append(
            f"the log binds the ledger's id {len(bindings)} times (entries "
            f"{', '.join(str(seq) for seq, _ in bindings)}): only one is ever written"
        )
    if bindings and bindings[0][1] != meta.get("ledger_id"):
        problems.append(changed_id_text(meta.get("ledger_id"), bindings[0][0], bindings[0][1]))


def _check_release_owners(owners, grant_cols, problems):
    """Each release row's stream and pipeline are its grant's (the log's release entry names the grant only)."""
    for (gid, stage), owner in sorted(owners.items()):
        if gid in grant_cols and owner != grant_cols[gid][:2]:
            problems.append(
                f"release of stage {stage!r} under grant {gid!r}: table says (stream, pipeline)={owner}, "
                f"its grant's are {grant_cols[gid][:2]}"
            )


def _reconcile(problems, table, log, name, difference, missing_note=""):
    """Report every key the table and the log disagree on: present in one only, or with other values."""
    for key in sorted(set(table) | set(log)):
        if key not in log:
            problems.append(f"{name(key)} is in the table but not in the log{missing_note}")
        elif key not in table:
            problems.append(f"{name(key)} is in the log but missing from the table")
        elif table[key] != log[key]:
            problems.append(f"{name(key)}: {difference(table[key], log[key])}")


def _stream_difference(table, log):
    changed = sorted(k for k in table if table[k] != log.get(k))
    return (
        f"the table's {', '.join(changed)} differ from the log's "
        f"(table {[table[k] for k in changed]}, log {[log.get(k) for k in changed]})"
    )
