"""Ledger grants per second (32-block grants, 1 and 4 writers) vs bare SQLite transactions updating the same rows.

A grant is one ``Ledger.request`` charging every block of a 32-block set. The
baseline is the least any correct ledger must do per grant: one transaction
(``BEGIN IMMEDIATE``, WAL, ``synchronous=FULL``, the ledger's pragmas) that
updates the same 32 rows, in a database in the same directory (so on the same
file system), by the same number of writer processes, in the same run. The
figure is the ratio; ledger and baseline runs alternate and each is repeated,
and the median of the repeats is reported. ``--postgres URL`` adds the same
comparison on a PostgreSQL server (baseline: bare transactions updating 32 rows
there).

``choose_blocks`` and ``add_blocks``: ``_ledger_growth.py``; ``storage``: ``_ledger_storage.py``; ``grant_floor`` (one
grant's statements, WAL pages and CPU by part against the bare transaction's): ``_ledger_floor.py``.

``--head-sync`` (default ``use,commit,group``) measures the grants in each head-file sync mode of
``head_file.HeadSync`` in the same run, each against its own baseline runs (``by_head_sync``): ``use`` (the
default mode, the headline) makes a grant's head durable before the grant's first use and every other
write's before it returns, ``commit`` every write's before it returns, ``group`` within 50 ms, one write
per interval; each writer makes its last head durable inside its timed span. What ``use`` and ``group``
give up is in docs/security.md.
"""

import json
import multiprocessing
import os
import sqlite3
import statistics
import sys
import tempfile
import time
import urllib.parse
import uuid

from sage_tfx import comma_lists
from sage_tfx.bench._ledger_baseline import bare_transaction, connect_bare, create_bare_blocks, prepare_stream
from sage_tfx.bench._ledger_floor import _measure_floor
from sage_tfx.bench._ledger_growth import _measure_choice, _measure_growth, remove_ledger_files
from sage_tfx.bench._ledger_storage import _filesystem, _measure_storage
from sage_tfx.privacy.head_file import ENV_HEAD_SYNC
from sage_tfx.privacy.store.location import check_location, postgres_password

GOAL_RATIO = 0.5


def add_arguments(parser):
    parser.add_argument(
        "--grants",
        type=int,
        default=400,
        help="grants (and baseline transactions) per measurement, split among the writers",
    )
    parser.add_argument("--blocks", type=int, default=32, help="blocks per grant (rows per baseline transaction)")
    parser.add_argument(
        "--writers", type=comma_lists.counts, default="1,4", help="comma-separated writer process counts"
    )
    parser.add_argument("--repeats", type=int, default=3, help="alternating ledger/baseline runs per writer count")
    parser.add_argument(
        "--db-dir", default=None, help="directory for the databases (default: a fresh temporary directory)"
    )
    parser.add_argument(
        "--choose-blocks",
        type=int,
        default=1400,
        metavar="N",
        help="blocks in the stream for the choose_blocks figure (0: skip it)",
    )
    parser.add_argument(
        "--growth-blocks",
        type=int,
        default=100_000,
        metavar="N",
        help="blocks in the old stream for the add_blocks figure (0: skip it)",
    )
    parser.add_argument(
        "--growth-batch",
        type=int,
        default=1000,
        metavar="N",
        help="blocks per timed add_blocks call for the add_blocks figure",
    )
    parser.add_argument(
        "--storage-samples",
        type=int,
        default=50,
        metavar="N",
        help="fsync'd page writes and head-file writes timed for the storage note (0: skip it)",
    )
    parser.add_argument(
        "--floor-grants",
        type=int,
        default=300,
        metavar="N",
        help="grants per round for the grant_floor figure: one grant's statements, WAL pages and CPU by part "
        "against the bare transaction's (0: skip it)",
    )
    parser.add_argument(
        "--head-sync",
        type=comma_lists.names,
        default="use,commit,group",
        metavar="MODES",
        help="comma-separated head-file sync modes to measure the grants in (head_file.HeadSync: use, "
        "the default mode, commit and group); the first is the headline",
    )
    parser.add_argument(
        "--postgres",
        default=None,
        metavar="URL",
        help="also measure against a PostgreSQL database (tables are added to it)",
    )


# ------------------------------------------------------------------ workers (run in spawned processes)
def _ledger_worker(location, stream, blocks, count, barrier, results):
    from sage_tfx.privacy import Ledger

    ledger = Ledger.open(location)
    pipeline = f"bench-{os.getpid()}"
    barrier.wait()
    start, cpu = time.monotonic(), time.process_time()
    for _ in range(count):
        ledger.request(pipeline, stream, blocks=blocks, epsilon=1.0)
    ledger.head_file.flush()  # GROUP and USE: the last head made durable inside the timed span (commit: no-op)
    results.put((start, time.monotonic(), time.process_time() - cpu))
    ledger.close()


def _sqlite_baseline_worker(path, blocks, count, barrier, results):
    conn = connect_bare(path)
    barrier.wait()
    start, cpu = time.monotonic(), time.process_time()
    for i in range(count):
        bare_transaction(conn, blocks, i)
    results.put((start, time.monotonic(), time.process_time() - cpu))
    conn.close()


def _postgres_baseline_worker(url, table, blocks, count, barrier, results):
    conn = _pg_connect(url)
    cur = conn.cursor()
    barrier.wait()
    start, cpu = time.monotonic(), time.process_time()
    for i in range(count):
        value = json.dumps([float(i), 0.0])
        cur.executemany(f"UPDATE {table} SET spent = %s WHERE id = %s", [(value, b) for b in blocks])
        conn.commit()
    results.put((start, time.monotonic(), time.process_time() - cpu))
    conn.close()


def _pg_connect(url):

    import pg8000.dbapi

    u = urllib.parse.urlparse(check_location(url))
    return pg8000.dbapi.connect(
        user=urllib.parse.unquote(u.username or "postgres"),
        password=postgres_password(url),  # PGPASSWORD or a libpq password file
        host=u.hostname or "127.0.0.1",
        port=u.port or 5432,
        database=(u.path or "/postgres").lstrip("/") or "postgres",
    )


def _timed(target, writers, total, args):
    """Run ``writers`` spawned processes doing ``total`` operations between them: (operations per second, CPU ms
    per operation).

    Timing starts when the last process passes the start barrier (process start-up excluded)
    and ends when the last one finishes. The CPU time is the writers' own (user and system, so the kernel's work
    in fsync counts; a PostgreSQL server's does not), summed over the writers, per operation: on a machine shared
    with other work it moves much less than the wall time.
    """
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(writers), ctx.Queue()
    counts = [total // writers + (1 if i < total % writers else 0) for i in range(writers)]
    procs = [ctx.Process(target=target, args=(*args, n, barrier, results)) for n in counts]
    for p in procs:
        p.start()
    spans = [results.get(timeout=3600) for _ in procs]
    for p in procs:
        p.join()
        if p.exitcode != 0:
            raise RuntimeError(f"a benchmark writer process failed (exit code {p.exitcode})")
    elapsed = max(end for _, end, _ in spans) - min(start for start, _, _ in spans)
    return total / elapsed, 1e3 * sum(cpu for _, _, cpu in spans) / total


# ------------------------------------------------------------------ one backend
def _sqlite_pair(db_dir, blocks, total, writers, run_id):
    """(ledger grants/s, baseline transactions/s, audit ok, (ledger, baseline) CPU ms per operation) on fresh SQLite
    files in ``db_dir``."""

    from sage_tfx.privacy import Ledger

    ledger_path = os.path.join(db_dir, f"ledger-{run_id}.db")
    with Ledger.open(ledger_path, create=True) as ledger:
        prepare_stream(ledger, "bench", blocks)
    grants, grant_cpu = _timed(_ledger_worker, writers, total, (ledger_path, "bench", blocks))
    with Ledger.open(ledger_path) as ledger:
        audit_ok = ledger.audit().ok and len(ledger.grants("bench")) == total

    base_path = os.path.join(db_dir, f"baseline-{run_id}.db")
    conn = sqlite3.connect(base_path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    create_bare_blocks(conn, blocks)
    conn.close()
    baseline, baseline_cpu = _timed(_sqlite_baseline_worker, writers, total, (base_path, blocks))
    remove_ledger_files(ledger_path, base_path)
    return grants, baseline, audit_ok, (grant_cpu, baseline_cpu)


def _postgres_pair(url, blocks, total, writers, run_id):
    from sage_tfx.privacy import Ledger

    stream = f"bench-{run_id}"
    with Ledger.open(url, create=True) as ledger:
        prepare_stream(ledger, stream, blocks)
    grants, grant_cpu = _timed(_ledger_worker, writers, total, (url, stream, blocks))
    with Ledger.open(url) as ledger:
        audit_ok = ledger.audit().ok and len(ledger.grants(stream)) == total

    table = f"bench_baseline_{run_id.replace('-', '_')}"
    conn = _pg_connect(url)
    conn.autocommit = True
    cur = conn.cursor()
    cur.execute(f"CREATE TABLE {table} (id TEXT PRIMARY KEY, spent TEXT NOT NULL)")
    cur.executemany(f"INSERT INTO {table} VALUES (%s, %s)", [(b, "[0.0, 0.0]") for b in blocks])
    try:
        baseline, baseline_cpu = _timed(_postgres_baseline_worker, writers, total, (url, table, blocks))
    finally:
        cur.execute(f"DROP TABLE {table}")
        conn.close()
    return grants, baseline, audit_ok, (grant_cpu, baseline_cpu)


def _measure(pair, location, args, writer_counts, label):
    blocks = [f"b{i:03d}" for i in range(args.blocks)]
    per_writers = {}
    for writers in writer_counts:
        runs = []
        for r in range(args.repeats):
            run_id = uuid.uuid4().hex[:12]
            grants, baseline, audit_ok, (grant_cpu, baseline_cpu) = pair(location, blocks, args.grants, writers, run_id)
            runs.append(
                {
                    "grants_per_second": round(grants, 2),
                    "baseline_transactions_per_second": round(baseline, 2),
                    "ratio": round(grants / baseline, 3),
                    "audit_ok": audit_ok,
                    "cpu_ms_per_grant": round(grant_cpu, 4),
                    "baseline_cpu_ms_per_transaction": round(baseline_cpu, 4),
                    "cpu_ratio": round(baseline_cpu / grant_cpu, 3),
                }
            )
            print(
                f"[bench ledger] {label}, {writers} writer(s), run {r + 1}/{args.repeats}: "
                f"{grants:.1f} grants/s vs {baseline:.1f} baseline transactions/s "
                f"(ratio {grants / baseline:.3f}; CPU {grant_cpu:.3f} ms per grant vs {baseline_cpu:.3f} ms per "
                "transaction)",
                file=sys.stderr,
                flush=True,
            )
        grants = statistics.median(x["grants_per_second"] for x in runs)
        baseline = statistics.median(x["baseline_transactions_per_second"] for x in runs)
        per_writers[str(writers)] = {
            "grants_per_second": grants,
            "baseline_transactions_per_second": baseline,
            "ratio": round(statistics.median(x["ratio"] for x in runs), 3),
            "cpu_ms_per_grant": statistics.median(x["cpu_ms_per_grant"] for x in runs),
            "baseline_cpu_ms_per_transaction": statistics.median(x["baseline_cpu_ms_per_transaction"] for x in runs),
            "cpu_ratio": statistics.median(x["cpu_ratio"] for x in runs),  # bare transaction CPU / grant CPU
            "cpu_ratio_min_max": [min(x["cpu_ratio"] for x in runs), max(x["cpu_ratio"] for x in runs)],
            "audit_ok": all(x["audit_ok"] for x in runs),
            "runs": runs,
        }
    return per_writers


def _check_args(args):
    writer_counts = args.writers
    if args.growth_blocks < 0 or args.growth_batch < 1:
        raise SystemExit(
            f"sage bench ledger: --growth-blocks {args.growth_blocks} must be >= 0 and --growth-batch "
            f"{args.growth_batch} >= 1"
        )
    if args.storage_samples < 0:
        raise SystemExit(f"sage bench ledger: --storage-samples {args.storage_samples} must be >= 0")
    if args.floor_grants < 0:
        raise SystemExit(f"sage bench ledger: --floor-grants {args.floor_grants} must be >= 0")
    if args.choose_blocks < 0:
        raise SystemExit(f"sage bench ledger: --choose-blocks {args.choose_blocks} must be >= 0")
    for name in ("grants", "blocks", "repeats"):
        if getattr(args, name) < 1:
            raise SystemExit(f"sage bench ledger: --{name} {getattr(args, name)} must be >= 1")
    from sage_tfx.privacy.head_file import head_sync_mode
    from sage_tfx.privacy.keys import KeyFileError

    try:
        args.head_sync_modes = [head_sync_mode(m) for m in args.head_sync]
    except KeyFileError as exc:
        raise SystemExit(f"sage bench ledger: --head-sync: {exc}")  # noqa: B904
    if args.grants < max(writer_counts):
        raise SystemExit(f"sage bench ledger: --grants {args.grants} must be at least the writer count")
    return writer_counts


def run(args):
    writer_counts = _check_args(args)
    db_dir = args.db_dir or tempfile.mkdtemp(prefix="sage-bench-ledger-")
    os.makedirs(db_dir, exist_ok=True)
    by_mode = {}
    saved = os.environ.get(ENV_HEAD_SYNC)
    try:
        for mode in args.head_sync_modes:  # spawned writers inherit the mode through the environment
            os.environ[ENV_HEAD_SYNC] = mode.value
            by_mode[mode.value] = _measure(_sqlite_pair, db_dir, args, writer_counts, f"sqlite, head sync {mode}")
    finally:
        if saved is None:
            os.environ.pop(ENV_HEAD_SYNC, None)
        else:
            os.environ[ENV_HEAD_SYNC] = saved
    sqlite = by_mode[args.head_sync_modes[0].value]
    headline = sqlite["1"] if "1" in sqlite else sqlite[str(writer_counts[0])]
    figures = {
        "grants_per_second": headline["grants_per_second"],
        "baseline_transactions_per_second": headline["baseline_transactions_per_second"],
        "ratio": headline["ratio"],
        "headline_writers": 1 if "1" in sqlite else writer_counts[0],
        "ratio_is": "median over the repeats of grants_per_second / baseline_transactions_per_second, each repeat "
        "a ledger run and a baseline run back to back (the medians above are taken separately)",
        "goal_ratio": GOAL_RATIO,
        "meets_goal": all(v["ratio"] >= GOAL_RATIO for v in sqlite.values()),
        "audit_ok": all(v["audit_ok"] for v in sqlite.values()),
        "backend": "sqlite",
        "blocks_per_grant": args.blocks,
        "grants_per_run": args.grants,
        "repeats": args.repeats,
        "writers": sqlite,
        "head_sync": args.head_sync_modes[0].value,
        "by_head_sync": {
            mode: {
                "ratio": (v["1"] if "1" in v else v[str(writer_counts[0])])["ratio"],
                "meets_goal": all(w["ratio"] >= GOAL_RATIO for w in v.values()),
                "audit_ok": all(w["audit_ok"] for w in v.values()),
                "writers": v,
            }
            for mode, v in by_mode.items()
        },
        "head_sync_is": "head_file.HeadSync: use (the default) makes a grant's head durable before the grant's first use "
        "(Ledger.verify) and every other write's before it returns; commit every write's before it "
        "returns; group within 50 ms, one write per interval (docs/security.md, what each gives up)",
        "db_dir": os.path.abspath(db_dir),
        "filesystem": _filesystem(db_dir),
        "cpus": os.cpu_count(),
        "baseline": "bare SQLite transactions (BEGIN IMMEDIATE, WAL, synchronous=FULL) updating the same "
        f"{args.blocks} rows, same directory, same writer count, same run",
    }
    if args.storage_samples:
        figures["storage"] = _measure_storage(db_dir, args.storage_samples, headline, args.head_sync_modes[0].value)
    if args.floor_grants:
        figures["grant_floor"] = _measure_floor(db_dir, args.blocks, args.floor_grants, args.repeats)
    if args.choose_blocks:
        figures["choose_blocks"] = _measure_choice(db_dir, args.choose_blocks, args.repeats)
    if args.growth_blocks:
        path = os.path.join(db_dir, f"growth-{uuid.uuid4().hex[:12]}.db")
        figures["add_blocks"] = _measure_growth(path, args.growth_blocks, args.growth_batch, args.repeats, "sqlite")
        remove_ledger_files(path)
    if args.postgres:
        figures["postgres"] = _measure(_postgres_pair, args.postgres, args, writer_counts, "postgresql")
        if args.growth_blocks:
            figures["postgres_add_blocks"] = _measure_growth(
                args.postgres, args.growth_blocks, args.growth_batch, args.repeats, "postgresql"
            )
    if not args.db_dir:
        try:
            os.rmdir(db_dir)
        except OSError:
            pass
    return figures
