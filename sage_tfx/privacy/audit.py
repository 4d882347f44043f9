"""Audit a ledger from its append-only, hash-chained log alone.

The log is the ledger's source of truth: every stream, block, grant and
retirement was appended in the same transaction that made it. ``audit_ledger``

1. checks the hash chain (each entry hashes its predecessor's hash, its
   sequence number, kind and body): editing, reordering or deleting an entry
   in the middle breaks it;
2. replays the grants in log order, re-adding each grant's cost to each of its
   blocks with exactly the ledger's float operations, and checks that every
   grant was admissible by the block's filter when it was made, that no grant
   touched a retired block, and that every grant's signature is valid;
3. compares each stream's configuration, the replayed loss and state of
   every block, and the set of grants, with the ledger's tables (equality, not approximation): a table edited
   behind the ledger's back, or a log truncated at its tail, shows up here;
4. recomputes what the stages of every grant released (the log's ``release`` entries, one per grant and
   stage) and checks it against the grant's charge with the rule of ``privacy/split.py``: every split
   composes to at most its grant's charge, each stage stayed within its share, the stages together
   within the charge, and a single-stage grant (no split) was spent by one stage only.
"""
import hmac
import json
from dataclasses import dataclass, field

from . import filters
from .errors import LedgerError
from .split import SLACK, BudgetSplit
from .ledger import GENESIS, _canonical, chain_hash


@dataclass
class AuditReport:
    entries: int = 0
    streams: int = 0
    blocks: int = 0
    grants: int = 0
    problems: list = field(default_factory=list)

    @property
    def ok(self):
        return not self.problems

    def to_dict(self):
        return {"ok": self.ok, "entries": self.entries, "streams": self.streams, "blocks": self.blocks,
                "grants": self.grants, "problems": list(self.problems)}


def audit_ledger(ledger):
    report = AuditReport()
    problems = report.problems
    store = ledger._store
    problems.extend(f"database integrity: {p}" for p in store.integrity_problems())

    entries = ledger.log_entries()
    report.entries = len(entries)
    keys = ledger.keyring
    legacy_until = ledger._migration_entry().get("legacy_chain_until", 0) if keys.legacy_secret is not None else 0
    prev_hash, expected_seq = GENESIS, 1
    streams, stream_configs, blocks, grants, releases = {}, {}, {}, {}, {}
    for seq, _ts, kind, body_text, prev, digest in entries:
        if seq != expected_seq:
            problems.append(f"log entry {seq}: expected sequence number {expected_seq} (entries missing)")
        # Entries before a key migration keep the old unkeyed chain; the keyed entry after them covers its value.
        value = (chain_hash(prev, seq, kind, body_text) if seq <= legacy_until
                 else keys.chain_value(prev, seq, kind, body_text))
        if prev != prev_hash or not hmac.compare_digest(digest, value):
            problems.append(f"log entry {seq} ({kind}): keyed hash chain broken (the log was altered, or "
                            "rewritten without the ledger's key)")
        prev_hash, expected_seq = digest, seq + 1
        try:
            body = json.loads(body_text)
        except ValueError:
            problems.append(f"log entry {seq}: body is not JSON")
            continue
        if kind == "stream":
            stream_configs[body["name"]] = dict({"min_grant_epsilon": None}, **body)  # absent before schema 3
            streams[body["name"]] = filters.make_filter(body["accounting"], body["epsilon"], body["delta"],
                                                        body["orders"] or None)
        elif kind == "block":
            filt = streams.get(body["stream"])
            if filt is None:
                problems.append(f"log entry {seq}: block {body['id']!r} of unknown stream {body['stream']!r}")
                continue
            blocks[(body["stream"], body["id"])] = {"spent": filt.zero(), "state": "active"}
        elif kind == "grant":
            _replay_grant(ledger, seq, body, streams, blocks, grants, problems)
        elif kind == "release":
            _replay_release(seq, body, grants, releases, problems)
        elif kind == "retire":
            for b in body["blocks"]:
                if (body["stream"], b) in blocks:
                    blocks[(body["stream"], b)]["state"] = "retired"

    report.streams, report.blocks, report.grants = len(streams), len(blocks), len(grants)
    for (stream, block_id), replayed in blocks.items():
        filt = streams[stream]
        if not filt.admits(replayed["spent"], filt.zero()):
            problems.append(f"block {block_id!r} of stream {stream!r} exceeds the global budget: "
                            f"{filt.shortfall(replayed['spent'], filt.zero()) or replayed['spent']}")

    with store.transaction(write=False) as tx:
        table_streams = {r[0]: {"name": r[0], "accounting": r[1], "epsilon": r[2], "delta": r[3],
                                "orders": json.loads(r[4]), "policy": r[5], "min_epsilon": r[6],
                                "min_grant_epsilon": r[7]}
                         for r in tx.all("SELECT name, accounting, epsilon, delta, orders, policy, min_epsilon,"
                                         " min_grant_epsilon FROM streams")}
        table_blocks = {(r[0], r[1]): (tuple(json.loads(r[2])), r[3])
                        for r in tx.all("SELECT stream, id, spent, state FROM blocks")}
        table_grants = {r[0]: (r[1], r[2]) for r in tx.all("SELECT id, body, signature FROM grants")}
        table_releases = {(r[0], r[1]): (r[2], r[3], r[4]) for r in tx.all(
            "SELECT grant_id, stage, computation, epsilon, delta FROM releases")}
    _reconcile(problems, table_streams, stream_configs, lambda name: f"stream {name!r}", _stream_difference)
    _reconcile(problems, table_blocks, {k: (tuple(v["spent"]), v["state"]) for k, v in blocks.items()},
               lambda key: f"block {key[1]!r} of stream {key[0]!r}",
               lambda table, log: f"table says spent={table[0]} state={table[1]}, "
                                  f"log replay says spent={log[0]} state={log[1]}")
    _reconcile(problems, table_grants, grants, lambda gid: f"grant {gid!r}",
               lambda table, log: "the table's record differs from the log's", missing_note=" (never charged)")
    _reconcile(problems, table_releases, releases, lambda key: f"release of stage {key[1]!r} under grant {key[0]!r}",
               lambda table, log: f"table says {table}, log says {log}")
    _check_release_totals(grants, releases, problems)
    return report


def _grant_split(grant_body_text):
    """(grant body, its BudgetSplit or None, or an error text)."""
    body = json.loads(grant_body_text)
    try:
        return body, BudgetSplit.from_meta(body.get("meta")), None
    except LedgerError as exc:
        return body, None, str(exc)


def _replay_release(seq, body, grants, releases, problems):
    key = (body.get("grant"), body.get("stage"))
    if key[0] not in grants:
        problems.append(f"log entry {seq}: release of stage {key[1]!r} under grant {key[0]!r}, which was never "
                        "charged before it")
        return
    if key in releases:
        problems.append(f"log entry {seq}: a second release of stage {key[1]!r} under grant {key[0]!r}")
        return
    releases[key] = (body.get("computation"), float(body.get("epsilon")), float(body.get("delta")))


def _check_release_totals(grants, releases, problems):
    """Every grant's released stages, recomposed by its split's rule, within what the grant charged."""
    by_grant = {}
    for (gid, stage), (_, eps, delta) in releases.items():
        by_grant.setdefault(gid, {})[stage] = (eps, delta)
    for gid, (body_text, _sig) in grants.items():
        body, split, error = _grant_split(body_text)
        if error:
            problems.append(f"grant {gid!r}: its split is invalid ({error})")
            continue
        epsilon, delta = float(body["epsilon"]), float(body["delta"])
        if split is not None and split.charged_epsilon > epsilon * (1 + SLACK):
            problems.append(f"grant {gid!r}: its split composes to epsilon {split.charged_epsilon:.6g} under "
                            f"{split.rule!r}, more than its charge {epsilon:.6g}")
        if split is not None and split.total_delta > delta * (1 + SLACK):
            problems.append(f"grant {gid!r}: its split's deltas add to {split.total_delta:.3g}, more than its "
                            f"charge {delta:.3g}")
        spent = by_grant.get(gid, {})
        if not spent:
            continue
        if split is None:
            if len(spent) > 1:
                problems.append(f"grant {gid!r} is single-stage but stages {sorted(spent)} each released under it")
            for stage, (eps, dlt) in spent.items():
                if eps > epsilon * (1 + SLACK) or dlt > delta * (1 + SLACK):
                    problems.append(f"grant {gid!r}: stage {stage!r} released (epsilon={eps:.6g}, delta={dlt:.3g}), "
                                    f"more than the charge (epsilon={epsilon:.6g}, delta={delta:.3g})")
            continue
        for stage, (eps, dlt) in spent.items():
            share = split.stage_budget(stage)
            if eps > share[0] * (1 + SLACK) or dlt > share[1] * (1 + SLACK):
                problems.append(f"grant {gid!r}: stage {stage!r} released (epsilon={eps:.6g}, delta={dlt:.3g}), "
                                f"more than its share (epsilon={share[0]:.6g}, delta={share[1]:.3g})")
        total = split.composed({s: e for s, (e, _) in spent.items()})
        if total > epsilon * (1 + SLACK):
            problems.append(f"grant {gid!r}: its stages released epsilon {total:.6g} under {split.rule!r}, more "
                            f"than its charge {epsilon:.6g}")
        total_delta = sum(d for _, d in spent.values())
        if total_delta > delta * (1 + SLACK):
            problems.append(f"grant {gid!r}: its stages released delta {total_delta:.3g}, more than its charge "
                            f"{delta:.3g}")


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
    return (f"the table's {', '.join(changed)} differ from the log's "
            f"(table {[table[k] for k in changed]}, log {[log.get(k) for k in changed]})")


def _replay_grant(ledger, seq, body, streams, blocks, grants, problems):
    signature = body.pop("signature", "")
    body.pop("sources", None)
    gid = body.get("id")
    if not ledger._signature_ok(body, signature):
        problems.append(f"log entry {seq}: grant {gid!r} has an invalid signature")
    filt = streams.get(body["stream"])
    if filt is None:
        problems.append(f"log entry {seq}: grant {gid!r} on unknown stream {body['stream']!r}")
        return
    cost = tuple(body["cost"])
    for b in body["blocks"]:
        block = blocks.get((body["stream"], b))
        if block is None:
            problems.append(f"log entry {seq}: grant {gid!r} charged unknown block {b!r}")
            continue
        if block["state"] != "active":
            problems.append(f"log entry {seq}: grant {gid!r} charged retired block {b!r}")
        if not filt.admits(block["spent"], cost):
            problems.append(f"log entry {seq}: grant {gid!r} overspent block {b!r} "
                            f"({filt.shortfall(block['spent'], cost)})")
        block["spent"] = filters.add(block["spent"], cost)
    grants[gid] = (_canonical(body), signature)
