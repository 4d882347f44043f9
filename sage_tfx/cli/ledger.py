"""`sage ledger ...`: create streams, add blocks, charge grants, report and audit.

Exit codes: 0 success; 1 audit found a violation; 2 bad input (nothing
changed); 3 the budget refused a charge (nothing changed).
"""

import argparse
import datetime as _dt
import json
import os
import sys

from sage_tfx.privacy.vocabulary import PIPELINE_OUTCOMES, Accounting, Policy

from ._exits import EXIT_BAD_INPUT, EXIT_OK, EXIT_REFUSED, EXIT_VIOLATION
from ._keys import add_key_file, ledger_location


def parse_time(text):
    """Unix seconds, or an ISO 8601 date/time (UTC unless it names a zone)."""
    try:
        return float(text)
    except ValueError:
        pass
    try:
        value = _dt.datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"time {text!r} is neither unix seconds nor ISO 8601") from None
    if value.tzinfo is None:
        value = value.replace(tzinfo=_dt.UTC)
    return value.timestamp()


def _number(text):
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None


def add_parser(subparsers):
    parser = subparsers.add_parser(
        "ledger",
        help="the privacy ledger: streams, blocks, grants, audit",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="ledger_command", metavar="ACTION")
    sub.required = True

    def action(name, func, help_text):
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.add_argument(
            "--db", required=True, type=ledger_location, help="ledger file path (SQLite) or postgresql:// URL"
        )
        add_key_file(p)
        p.set_defaults(func=lambda args: _guarded(func, args))
        return p

    p = action("init", _init, "create a stream with a global (epsilon, delta) guarantee (creates the ledger)")
    p.add_argument("--stream", required=True)
    p.add_argument("--epsilon", required=True, type=_number)
    p.add_argument("--delta", required=True, type=_number)
    p.add_argument(
        "--accounting",
        choices=tuple(Accounting),
        default=Accounting.BASIC.value,
        help="basic: per-block basic composition (the paper); rdp: per-block Renyi filter",
    )
    p.add_argument(
        "--policy",
        choices=tuple(Policy),
        default=Policy.CONSERVE.value,
        help="who may spend a block's budget, and when (docs/scheduling_policies.md): conserve, "
        "aggressive (the paper's reservations), or the queued dpf-n, dpf-t (PrivateKube's DPF) and "
        "dpack (efficiency-ordered), under which a refused request waits as a demand and is granted "
        "in the policy's order; repeat the request to collect it",
    )
    p.add_argument(
        "--policy-param",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a queued policy's parameter, repeatable: n=INT (dpf-n, dpack: the budget unlocks in n "
        "shares, one per pipeline arrival; default 100), lifetime=SECONDS (dpf-t: it unlocks "
        "linearly over that time after a block's created time; default 86400)",
    )
    p.add_argument(
        "--min-epsilon",
        type=_number,
        default=None,
        help="retire a block once a query of this epsilon no longer fits (default: epsilon/100)",
    )
    p.add_argument(
        "--query-delta-share",
        type=_number,
        default=None,
        metavar="Q",
        help="--accounting rdp: the part of --delta its (epsilon, delta) charges may spend, fixed now "
        "(default 0.5; 0: a stream charged RDP curves only); the rest converts the Renyi sum "
        "(docs/block_composition.md)",
    )
    p.add_argument(
        "--min-grant-epsilon",
        type=_number,
        default=None,
        help="refuse grants below this epsilon (default 0.001, or --min-epsilon if smaller): a tinier "
        "grant buys a data read for nothing",
    )
    p.add_argument(
        "--max-epsilon",
        type=_number,
        default=None,
        help="refuse a stream --epsilon above this (default 10: beyond it the guarantee says little); "
        "raise it only knowingly",
    )
    p.add_argument(
        "--privacy-unit",
        default=None,
        metavar="COLUMN",
        help="whom the guarantee protects: the column naming each record's person or device (rider_id, "
        "company); default: row (event-level DP). Needs --max-rows-per-unit "
        '(docs/block_composition.md, "Privacy units")',
    )
    p.add_argument(
        "--max-rows-per-unit",
        type=int,
        default=None,
        metavar="K",
        help="with --privacy-unit: ingest keeps at most K rows of a unit per block (a keyed-hash choice), "
        "and every mechanism gets the per-row budget epsilon/K that makes it epsilon-DP on K rows",
    )

    p = action("add-block", _add_block, "add a fresh block (a time window or a user shard)")
    p.add_argument("--stream", required=True)
    p.add_argument("--block", required=True, help="block id")
    p.add_argument("--start", type=parse_time, help="window start (unix seconds or ISO 8601)")
    p.add_argument("--end", type=parse_time, help="window end, exclusive")
    p.add_argument("--shard", type=int, help="user shard number")
    p.add_argument("--rows", type=int, help="exact row count (kept private inside the ledger)")

    p = action("charge", _charge, "check and charge blocks atomically; prints the grant id (exit 3 if refused)")
    p.add_argument("--stream", required=True)
    p.add_argument("--pipeline", required=True)
    p.add_argument("--blocks", required=True, help="comma-separated block ids")
    p.add_argument("--epsilon", required=True, type=_number)
    p.add_argument("--delta", type=_number, default=0.0)
    p.add_argument(
        "--split",
        default=None,
        metavar="STAGE=EPS,...",
        help="what each pipeline stage may spend, e.g. preprocessing=0.1,count=0.05,training=0.3,"
        "validation=0.05 (stages: preprocessing, count, training, rejection, validation; add "
        "rule=parallel for a per-record train/test split, default rule=sum); the stages must "
        "compose to at most --epsilon; training gets --delta (less preprocessing_delta=D, "
        "which a DP vocabulary needs, if given). Without --split the grant is "
        "single-stage: ONE component may spend it",
    )
    p.add_argument("--json", action="store_true", help="print the whole signed grant as JSON")

    p = action("status", _status, "per-block budget table (or --json)")
    p.add_argument("--stream", required=True)
    p.add_argument("--json", action="store_true")

    p = action("audit", _audit, "recompute every block's loss from the hash-chained log (exit 1 on violation)")
    p.add_argument("--json", action="store_true")

    p = action(
        "anchor",
        _anchor,
        "re-anchor this host's head file on the ledger as it is now, ON PURPOSE: after restoring a known-good "
        "copy deliberately, or on a host joining a PostgreSQL ledger without a copy of a head file (logged "
        "in the ledger with the reason and host; the audit lists it; docs/security.md)",
    )
    p.add_argument("--reason", required=True, help="why (recorded in the ledger's keyed log)")
    p.add_argument("--json", action="store_true")

    action(
        "upgrade",
        _upgrade,
        "bring a ledger written by an older sage-tfx to this version, once (every other command refuses such a "
        "ledger with exit 2): the key moved out of the database, the ledger id bound, a JSON head file "
        "rewritten in slots, the schema's new tables and columns, the rows' display times bound by a keyed "
        "entry; prints a line per step; a ledger "
        "already up to date is left untouched (docs/security.md, 'Upgrading a ledger')",
    )

    p = action("plot", _plot, "heat-map PNG of budget spent per block over time")
    p.add_argument("--stream", required=True)
    p.add_argument("--out", required=True, help="output .png path")

    p = action("register", _register, "register a pipeline as waiting for budget on a stream")
    p.add_argument("--stream", required=True)
    p.add_argument("--pipeline", required=True)

    p = action("finish", _finish, "end a pipeline; its unused reservation goes to those still waiting")
    p.add_argument("--stream", required=True)
    p.add_argument("--pipeline", required=True)
    p.add_argument("--outcome", required=True, choices=PIPELINE_OUTCOMES)


def _guarded(func, args):
    from sage_tfx.privacy import BudgetRefused, LedgerError

    try:
        return func(args) or EXIT_OK
    except BudgetRefused as exc:
        print(f"sage ledger: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    except LedgerError as exc:
        print(f"sage ledger: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT


def _open(args, create=False, read_only=False):
    from sage_tfx.privacy import Ledger

    return Ledger.open(args.db, create=create, read_only=read_only)


def _init(args):
    from sage_tfx.privacy import Ledger
    from sage_tfx.privacy.ledger import DEFAULT_MAX_STREAM_EPSILON

    limits = dict(
        accounting=args.accounting,
        policy=args.policy,
        min_epsilon=args.min_epsilon,
        max_epsilon=DEFAULT_MAX_STREAM_EPSILON if args.max_epsilon is None else args.max_epsilon,
        min_grant_epsilon=args.min_grant_epsilon,
        policy_params=_policy_params(args.policy_param),
        query_delta_share=args.query_delta_share,
        privacy_unit=args.privacy_unit,
        max_rows_per_unit=args.max_rows_per_unit,
    )
    # Every check that needs no ledger runs before the ledger is created: a refused init leaves nothing.
    Ledger.check_stream_args(args.stream, args.epsilon, args.delta, **limits)
    with _open(args, create=True) as ledger:
        s = ledger.create_stream(args.stream, args.epsilon, args.delta, **limits)
    params = "".join(f" {k}={v:g}" for k, v in sorted((s.policy_params or {}).items()))
    share = "" if s.query_delta_share is None else f", query_delta_share={s.query_delta_share:g}"
    unit = "" if s.privacy_unit is None else f", privacy unit {s.privacy_unit} (at most {s.unit_rows} rows a block)"
    print(
        f"stream {s.name}: global (epsilon={s.epsilon:g}, delta={s.delta:g}), accounting={s.accounting}{share}, "
        f"policy={s.policy}{params}{unit}"
    )


def _policy_params(items):
    """``--policy-param NAME=VALUE`` options as a dict (None if none): integers as int, else numbers as float."""
    from sage_tfx.privacy.errors import LedgerError

    params = {}
    for item in items:
        name, sep, text = item.partition("=")
        if not sep or not name:
            raise LedgerError(f"--policy-param {item!r} is invalid: give NAME=VALUE, e.g. --policy-param n=50")
        try:
            value = int(text)
        except ValueError:
            try:
                value = float(text)
            except ValueError:
                raise LedgerError(f"--policy-param {item!r}: value {text!r} is not a number") from None
        if name in params:
            raise LedgerError(f"--policy-param {name} is given twice: give each parameter once")
        params[name] = value
    return params or None


def _add_block(args):
    with _open(args) as ledger:
        b = ledger.add_block(args.stream, args.block, start=args.start, end=args.end, shard=args.shard, rows=args.rows)
    from sage_tfx.privacy.report import block_key_text

    print(f"block {b.id} added to {b.stream}: {block_key_text(b.key)}, fresh budget")


def _charge(args):
    from sage_tfx.privacy import BudgetSplit

    split = None if args.split is None else BudgetSplit.parse(args.split, delta=args.delta)
    with _open(args) as ledger:
        grant = ledger.request(
            args.pipeline, args.stream, blocks=args.blocks, epsilon=args.epsilon, delta=args.delta, split=split
        )
    print(grant.to_json() if args.json else grant.id)


def _status(args):
    with _open(args) as ledger:
        status = ledger.status(args.stream)
        if args.json:  # decryptions outside a grant (uncharged): `sage ledger audit` lists them
            status["trusted_reads"] = len(ledger.trusted_reads(args.stream))
    if args.json:
        print(json.dumps(status, indent=2))
    else:
        from sage_tfx.privacy.report import status_table

        print(status_table(status))


def _audit(args):
    # Read-only (a copy on a read-only mount, a full disk): writes no byte; a mismatched head is reported, not refused
    with _open(args, read_only=True) as ledger:
        report = ledger.audit()
    return _print_audit(args, report)


def _upgrade(args):
    from sage_tfx.privacy import Ledger

    Ledger.upgrade(args.db, progress=lambda line: print(f"upgrade: {line}", file=sys.stderr))
    return EXIT_OK


def _anchor(args):
    from sage_tfx.privacy import Ledger

    with Ledger.reanchor(args.db, args.reason) as ledger:
        seq = ledger.head_file.get(ledger.ledger_id)["seq"]
        print(
            f"re-anchored: this host's head file now records log entry {seq} of ledger {ledger.ledger_id} "
            "(logged with the reason)",
            file=sys.stderr,
        )
        report = ledger.audit()
    return _print_audit(args, report)


def _print_audit(args, report):
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
        return EXIT_OK if report.ok else EXIT_VIOLATION
    if report.ok:
        print(
            f"audit OK: {report.entries} log entries, {report.streams} stream(s), {report.blocks} blocks, "
            f"{report.grants} grants; every block within its global budget; every grant's stages within its "
            "charge; hash chain intact"
        )
    else:
        print(f"audit FAILED: {len(report.problems)} problem(s)")
        for problem in report.problems:
            print(f"  - {problem}")
    print(_trusted_reads_text(report.trusted_reads))
    return EXIT_OK if report.ok else EXIT_VIOLATION


def _trusted_reads_text(reads):
    """The audit's list of decryptions outside a grant (uncharged): one line each, with its blocks and purpose."""
    lines = [f"{len(reads)} trusted read(s) outside a grant (decrypted, not charged)" + (":" if reads else "")]
    for read in reads:
        when = _dt.datetime.fromtimestamp(read["time"], _dt.UTC).isoformat(timespec="seconds")
        blocks = read["blocks"]
        shown = ", ".join(blocks[:5]) + (f" and {len(blocks) - 5} more" if len(blocks) > 5 else "")
        lines.append(
            f"  - log entry {read['seq']} at {when}: stream {read['stream']!r}, {len(blocks)} block(s) "
            f"{shown}; purpose: {read['purpose']}"
        )
    return "\n".join(lines)


def _plot(args):

    from sage_tfx.privacy import LedgerError
    from sage_tfx.privacy.report import heatmap_png

    folder = os.path.dirname(os.path.abspath(args.out))
    if not os.path.isdir(folder):
        raise LedgerError(f"--out {args.out!r}: folder {folder} does not exist: create it first or write elsewhere")
    if os.path.isdir(args.out):
        raise LedgerError(f"--out {args.out!r} is a folder: give the path of a .png file")
    with _open(args) as ledger:
        ledger.stream(args.stream)
        try:
            path = heatmap_png(ledger, args.stream, args.out)
        except OSError as exc:
            raise LedgerError(f"--out {args.out!r}: cannot write the plot ({exc.strerror or exc})") from None
    print(f"wrote {path}")


def _register(args):
    with _open(args) as ledger:
        ledger.register(args.stream, args.pipeline)
    print(f"pipeline {args.pipeline} waiting on {args.stream}")


def _finish(args):
    with _open(args) as ledger:
        ledger.finish(args.stream, args.pipeline, args.outcome)
    print(f"pipeline {args.pipeline} finished with {args.outcome}")
