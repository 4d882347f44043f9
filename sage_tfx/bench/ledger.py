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

``choose_blocks`` times what the iterator does before each attempt on a stream of
``--choose-blocks`` blocks (several pipelines, reservations, grants; basic and RDP
accounting): every active block's availability for one pipeline, as ONE
``Ledger.available_per_block`` call, against the per-block loop it replaced (one
``available_epsilon`` transaction and bisection per block, newest first), on the same
ledger in the same run; the figure is the loop's time over the call's, and the two
must return the same values.

``add_blocks`` times adding blocks to a young and to an old stream (``--growth-blocks``,
default 100,000): one ``Ledger.add_blocks`` of ``--growth-batch`` (1,000) GENERATED hourly
blocks, with content digests and two pipelines waiting (so each block also gets their
reservations), on a stream of 1,000 blocks and on one of 100,000, alternating, in the same
ledger and the same run; the figure is the cost per added block at each size and their
ratio (goal: at most 2), and the ledger is audited afterwards.

``storage`` says what durability costs on the file system of ``--db-dir`` (``--storage-samples``
of each, median): one fsync'd write of one 4 KiB page (what a WAL commit with ``synchronous=FULL``
waits for); one durable head-file write (``head_file.HeadFile.advance`` in ``commit`` mode: under an flock,
the file's bytes read back and compared with this process's last view, the older of its two durable
4 KiB slots overwritten in place and fdatasync'd), which every committed ledger write does after its
commit in ``commit`` mode, and every write but a grant's in ``use`` mode (docs/security.md); one grant's
head-file write in ``use`` mode (the same, into slot C, without the fdatasync); and what a grant's first
use then pays (``HeadFile.make_durable`` after it: the head copied into a durable slot, fdatasync'd), which
``Ledger.verify`` does before any block of the grant is opened. The baseline does none of these.
``ratio_ceiling`` is the ratio a ledger whose only cost beyond the baseline transaction were the headline
mode's head-file write per grant would reach. The head-file writes' CPU time is given beside their wall
time, and each run's writers report their CPU time per grant and per baseline transaction
(``cpu_ms_per_grant``, ``baseline_cpu_ms_per_transaction``: user and system time of the writer processes,
so the kernel's part of fsync counts): the wall-time ratio moves with the shared storage's fsync latency,
the CPU figures much less.

``--head-sync`` (default ``use,commit,group``) measures the grants in each head-file sync mode of
``head_file.HeadSync`` in the same run, each against its own baseline runs (``by_head_sync``): ``use`` (the
default mode, the headline) makes a grant's head durable before the grant's first use and every other
write's before it returns, ``commit`` every write's before it returns, ``group`` within 50 ms, one write
per interval; each writer makes its last head durable inside its timed span. What ``use`` and ``group``
give up is in docs/security.md.
"""
import hashlib
import json
import multiprocessing
import os
import random
import sqlite3
import statistics
import sys
import tempfile
import time
import urllib.parse
import uuid

from sage_tfx.privacy.head_file import ENV_HEAD_SYNC
from sage_tfx.privacy.store.location import check_location, postgres_password
from sage_tfx.privacy.vocabulary import Accounting, BlockState

# Files a SQLite ledger leaves beside itself: WAL, shared memory, and its key file with the head file and its lock.
LEDGER_FILE_SUFFIXES = ("", "-wal", "-shm", ".key", ".key.head", ".key.head.lock")

GOAL_RATIO = 0.5
GOAL_GROWTH_RATIO = 2.0  # cost per added block at --growth-blocks over at 1,000 blocks
YOUNG_BLOCKS = 1000


def add_arguments(parser):
    parser.add_argument("--grants", type=int, default=400,
                        help="grants (and baseline transactions) per measurement, split among the writers")
    parser.add_argument("--blocks", type=int, default=32, help="blocks per grant (rows per baseline transaction)")
    parser.add_argument("--writers", default="1,4", help="comma-separated writer process counts")
    parser.add_argument("--repeats", type=int, default=3, help="alternating ledger/baseline runs per writer count")
    parser.add_argument("--db-dir", default=None,
                        help="directory for the databases (default: a fresh temporary directory)")
    parser.add_argument("--choose-blocks", type=int, default=1400, metavar="N",
                        help="blocks in the stream for the choose_blocks figure (0: skip it)")
    parser.add_argument("--growth-blocks", type=int, default=100_000, metavar="N",
                        help="blocks in the old stream for the add_blocks figure (0: skip it)")
    parser.add_argument("--growth-batch", type=int, default=1000, metavar="N",
                        help="blocks per timed add_blocks call for the add_blocks figure")
    parser.add_argument("--storage-samples", type=int, default=50, metavar="N",
                        help="fsync'd page writes and head-file writes timed for the storage note (0: skip it)")
    parser.add_argument("--head-sync", default="use,commit,group", metavar="MODES",
                        help="comma-separated head-file sync modes to measure the grants in (head_file.HeadSync: use, "
                             "the default mode, commit and group); the first is the headline")
    parser.add_argument("--postgres", default=None, metavar="URL",
                        help="also measure against a PostgreSQL database (tables are added to it)")


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

    conn = sqlite3.connect(path, timeout=120.0, isolation_level=None)
    for pragma in ("journal_mode=WAL", "synchronous=FULL", "busy_timeout=120000"):  # the ledger's pragmas
        conn.execute(f"PRAGMA {pragma}")
    barrier.wait()
    start, cpu = time.monotonic(), time.process_time()
    for i in range(count):
        value = json.dumps([float(i), 0.0])
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany("UPDATE blocks SET spent = ? WHERE id = ?", [(value, b) for b in blocks])
        conn.execute("COMMIT")
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
    return pg8000.dbapi.connect(user=urllib.parse.unquote(u.username or "postgres"),
                                password=postgres_password(url),  # PGPASSWORD or a libpq password file
                                host=u.hostname or "127.0.0.1", port=u.port or 5432,
                                database=(u.path or "/postgres").lstrip("/") or "postgres")


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
        _prepare_stream(ledger, "bench", blocks)
    grants, grant_cpu = _timed(_ledger_worker, writers, total, (ledger_path, "bench", blocks))
    with Ledger.open(ledger_path) as ledger:
        audit_ok = ledger.audit().ok and len(ledger.grants("bench")) == total

    base_path = os.path.join(db_dir, f"baseline-{run_id}.db")
    conn = sqlite3.connect(base_path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE blocks (id TEXT PRIMARY KEY, spent TEXT NOT NULL)")
    conn.executemany("INSERT INTO blocks VALUES (?, ?)", [(b, "[0.0, 0.0]") for b in blocks])
    conn.close()
    baseline, baseline_cpu = _timed(_sqlite_baseline_worker, writers, total, (base_path, blocks))
    for path in (ledger_path, base_path):
        for suffix in LEDGER_FILE_SUFFIXES:
            if os.path.exists(path + suffix):
                os.remove(path + suffix)
    return grants, baseline, audit_ok, (grant_cpu, baseline_cpu)


def _postgres_pair(url, blocks, total, writers, run_id):
    from sage_tfx.privacy import Ledger

    stream = f"bench-{run_id}"
    with Ledger.open(url, create=True) as ledger:
        _prepare_stream(ledger, stream, blocks)
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


def _prepare_stream(ledger, stream, blocks):
    # A budget no grant of the run can exhaust: every grant is admitted and charged.
    ledger.create_stream(stream, 1e12, 0.5, min_epsilon=1e-9, max_epsilon=1e12)
    for b in blocks:
        ledger.add_block(stream, b)


def _measure(pair, location, args, writer_counts, label):
    blocks = [f"b{i:03d}" for i in range(args.blocks)]
    per_writers = {}
    for writers in writer_counts:
        runs = []
        for r in range(args.repeats):
            run_id = uuid.uuid4().hex[:12]
            grants, baseline, audit_ok, (grant_cpu, baseline_cpu) = pair(location, blocks, args.grants, writers,
                                                                         run_id)
            runs.append({"grants_per_second": round(grants, 2), "baseline_transactions_per_second": round(baseline, 2),
                         "ratio": round(grants / baseline, 3), "audit_ok": audit_ok,
                         "cpu_ms_per_grant": round(grant_cpu, 4),
                         "baseline_cpu_ms_per_transaction": round(baseline_cpu, 4)})
            print(f"[bench ledger] {label}, {writers} writer(s), run {r + 1}/{args.repeats}: "
                  f"{grants:.1f} grants/s vs {baseline:.1f} baseline transactions/s "
                  f"(ratio {grants / baseline:.3f}; CPU {grant_cpu:.3f} ms per grant vs {baseline_cpu:.3f} ms per "
                  "transaction)", file=sys.stderr, flush=True)
        grants = statistics.median(x["grants_per_second"] for x in runs)
        baseline = statistics.median(x["baseline_transactions_per_second"] for x in runs)
        per_writers[str(writers)] = {
            "grants_per_second": grants, "baseline_transactions_per_second": baseline,
            "ratio": round(statistics.median(x["ratio"] for x in runs), 3),
            "cpu_ms_per_grant": statistics.median(x["cpu_ms_per_grant"] for x in runs),
            "baseline_cpu_ms_per_transaction": statistics.median(x["baseline_cpu_ms_per_transaction"] for x in runs),
            "audit_ok": all(x["audit_ok"] for x in runs), "runs": runs,
        }
    return per_writers


# ------------------------------------------------------------------ block choice (available_per_block)
def _choice_ledger(path, accounting, n_blocks, seed=0):
    """A stream of ``n_blocks`` daily blocks split among pipelines that registered at different times, with grants."""

    from sage_tfx.privacy import BudgetRefused, Ledger

    rng, day = random.Random(seed), 86400.0
    ledger = Ledger.open(path, create=True)
    ledger.create_stream("s", 1.0, 1e-6, accounting=accounting)
    ids = [f"b{i:06d}" for i in range(n_blocks)]
    joins = {0: "p0", n_blocks // 5: "p1", n_blocks // 2: "p2"}
    for start in range(0, n_blocks, 50):
        for i in range(start, min(start + 50, n_blocks)):
            if i in joins:
                ledger.register("s", joins[i])
        ledger.add_blocks("s", [dict(id=ids[i], start=i * day, end=(i + 1) * day, rows=100)
                                for i in range(start, min(start + 50, n_blocks))])
    for _ in range(max(10, n_blocks // 25)):
        width = min(rng.choice([1, 8, 32, 64]), n_blocks)
        first = rng.randrange(n_blocks - width + 1)
        try:
            ledger.request(rng.choice(["p0", "p1", "p2", "late"]), "s", blocks=ids[first:first + width],
                           epsilon=rng.choice([0.05, 0.1, 0.2, 0.3]), delta=1e-8)
        except BudgetRefused:
            pass
    return ledger


def _per_block_loop(ledger, pipeline, delta):
    """The iterator's block choice before available_per_block: one transaction and bisection per block."""
    return {b.id: ledger.available_epsilon(pipeline, "s", [b.id], delta)
            for b in reversed(ledger.blocks("s", state=BlockState.ACTIVE))}


def _measure_choice(db_dir, n_blocks, repeats):
    out = {}
    for accounting in Accounting:
        path = os.path.join(db_dir, f"choice-{accounting}-{uuid.uuid4().hex[:12]}.db")
        ledger = _choice_ledger(path, accounting, n_blocks)
        loop_times, call_times, same = [], [], True
        for _ in range(repeats):  # alternate, so load on the machine hits both alike
            start = time.perf_counter()
            loop = _per_block_loop(ledger, "p1", 1e-8)
            loop_times.append(time.perf_counter() - start)
            start = time.perf_counter()
            call = ledger.available_per_block("p1", "s", delta=1e-8)
            call_times.append(time.perf_counter() - start)
            same = same and loop == call
        ledger.close()
        for suffix in LEDGER_FILE_SUFFIXES:
            if os.path.exists(path + suffix):
                os.remove(path + suffix)
        loop_s, call_s = statistics.median(loop_times), statistics.median(call_times)
        out[accounting] = {"per_block_loop_seconds": round(loop_s, 5), "one_call_seconds": round(call_s, 5),
                           "speedup": round(loop_s / call_s, 2), "same_values": same,
                           "active_blocks": len(call)}
        print(f"[bench ledger] choose_blocks, {accounting}, {len(call)} active blocks: per-block loop "
              f"{loop_s * 1e3:.1f} ms, one call {call_s * 1e3:.1f} ms (x{loop_s / call_s:.1f})",
              file=sys.stderr, flush=True)
    return {"blocks": n_blocks, "repeats": repeats, **out,
            "speedup_is": "median per-block-loop time / median available_per_block time, same ledger, same run"}


# ------------------------------------------------------------------ add_blocks on a young and an old stream
def _growth_batch(stream, first, count):
    """GENERATED hourly blocks ``first`` .. ``first + count - 1`` of ``stream``, each with a distinct digest."""
    hour = 3600.0
    return [dict(id=f"b{i:07d}", start=i * hour, end=(i + 1) * hour, rows=100,
                 digest=hashlib.sha256(f"{stream}/{i}".encode()).hexdigest()) for i in range(first, first + count)]


def _growth_stream(ledger, stream, size, batch):
    ledger.create_stream(stream, 10.0, 1e-6)
    for pipeline in ("p1", "p2"):  # waiting: every new block gets their reservations (and a log entry for them)
        ledger.register(stream, pipeline)
    for first in range(0, size, batch):
        ledger.add_blocks(stream, _growth_batch(stream, first, min(batch, size - first)))


def _timed_add(ledger, stream, first, batch):
    start = time.perf_counter()
    ledger.add_blocks(stream, _growth_batch(stream, first, batch))
    return (time.perf_counter() - start) / batch


def _measure_growth(location, n_old, batch, repeats, label):
    """Cost per added block on a YOUNG_BLOCKS-block stream and on an ``n_old``-block one, same ledger, same run."""
    from sage_tfx.privacy import Ledger

    run_id = uuid.uuid4().hex[:12]
    old = f"old-{run_id}"
    with Ledger.open(location, create=True) as ledger:
        start = time.perf_counter()
        _growth_stream(ledger, old, n_old, batch)
        grow_s = time.perf_counter() - start
        young_costs, old_costs = [], []
        for r in range(repeats):  # alternate, so load on the machine hits both alike
            young = f"young-{run_id}-{r}"
            _growth_stream(ledger, young, YOUNG_BLOCKS, batch)
            young_costs.append(_timed_add(ledger, young, YOUNG_BLOCKS, batch))
            old_costs.append(_timed_add(ledger, old, n_old + r * batch, batch))
            print(f"[bench ledger] add_blocks, {label}, run {r + 1}/{repeats}: {young_costs[-1] * 1e3:.3f} ms per "
                  f"block at {YOUNG_BLOCKS:,} blocks, {old_costs[-1] * 1e3:.3f} ms at {n_old + r * batch:,}",
                  file=sys.stderr, flush=True)
        start = time.perf_counter()
        audit_ok = ledger.audit().ok and len(ledger.blocks(old)) == n_old + repeats * batch
        audit_s = time.perf_counter() - start
    young_ms, old_ms = statistics.median(young_costs) * 1e3, statistics.median(old_costs) * 1e3
    ratio = old_ms / young_ms
    print(f"[bench ledger] add_blocks, {label}: {young_ms:.3f} ms per block at {YOUNG_BLOCKS:,} blocks, "
          f"{old_ms:.3f} ms at {n_old:,} (ratio {ratio:.2f}); audit {'ok' if audit_ok else 'FAILED'} "
          f"in {audit_s:.1f} s", file=sys.stderr, flush=True)
    return {"young_blocks": YOUNG_BLOCKS, "old_blocks": n_old, "batch": batch, "repeats": repeats,
            "ms_per_block_young": round(young_ms, 4), "ms_per_block_old": round(old_ms, 4),
            "ratio": round(ratio, 3), "goal_ratio": GOAL_GROWTH_RATIO, "meets_goal": ratio <= GOAL_GROWTH_RATIO,
            "audit_ok": audit_ok, "grow_seconds": round(grow_s, 1), "audit_seconds": round(audit_s, 1),
            "young_runs_ms": [round(c * 1e3, 4) for c in young_costs],
            "old_runs_ms": [round(c * 1e3, 4) for c in old_costs],
            "ratio_is": "median ms per block of one add_blocks of `batch` blocks (windows, digests, 2 waiting "
                        "pipelines) on the old stream / the same on a young stream, alternating, same ledger, same run"}


def _timed_head_writes(db_dir, samples, mode, write):
    """Median wall ms and mean CPU ms of ``samples`` calls of ``write(head, i)`` on a fresh head file in ``mode``
    (created, and given its slots, before the timed calls)."""
    from sage_tfx.privacy.head_file import HeadFile

    head = HeadFile(os.path.join(db_dir, f"head-{uuid.uuid4().hex[:12]}.key.head"), mode)
    head.advance("bench", 1, "0" * 64)  # creates the file (written whole, once)
    head.advance("bench", 2, "0" * 64, until_use=True)  # use mode: gives it slot C (written whole, once)
    wall, cpu = [], []
    try:
        for i in range(samples):
            start, cpu_start = time.perf_counter(), time.process_time()
            write(head, 3 + 2 * i)
            wall.append(time.perf_counter() - start)
            cpu.append(time.process_time() - cpu_start)
    finally:
        head.close()
        for suffix in ("", ".lock"):
            if os.path.exists(head.path + suffix):
                os.remove(head.path + suffix)
    # CPU: a mean, as one sample is below the CPU clock's tick on some kernels
    return statistics.median(wall) * 1e3, statistics.mean(cpu) * 1e3


def _grant_then_first_use(head, seq):
    head.advance("bench", seq, "0" * 64, until_use=True)  # a grant's write, then its first use
    head.make_durable("bench", seq, "0" * 64)


def _measure_storage(db_dir, samples, headline, mode):
    """What fsync costs in ``db_dir``: a bare fsync'd 4 KiB page write and the head-file writes (durable; a grant's
    in ``use`` mode; a grant's first use after it), median ms and CPU ms, beside the ``headline`` writer count's
    grant and baseline figures in the headline head-sync ``mode``."""
    page = os.urandom(4096)
    path = os.path.join(db_dir, f"fsync-{uuid.uuid4().hex[:12]}")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    page_s = []
    try:
        for _ in range(samples):
            start = time.perf_counter()
            os.pwrite(fd, page, 0)
            os.fsync(fd)
            page_s.append(time.perf_counter() - start)
    finally:
        os.close(fd)
        os.remove(path)
    head_ms, head_cpu_ms = _timed_head_writes(db_dir, samples, "commit", lambda h, i: h.advance("bench", i, "0" * 64))
    lazy_ms, lazy_cpu_ms = _timed_head_writes(db_dir, samples, "use",
                                              lambda h, i: h.advance("bench", i, "0" * 64, until_use=True))
    pair_ms, _ = _timed_head_writes(db_dir, samples, "use", _grant_then_first_use)
    first_use_ms = max(pair_ms - lazy_ms, 0.0)
    page_ms = statistics.median(page_s) * 1e3
    page_range = (min(page_s) * 1e3, max(page_s) * 1e3)
    baseline_ms, grant_ms = 1e3 / headline["baseline_transactions_per_second"], 1e3 / headline["grants_per_second"]
    grant_cpu_ms, baseline_cpu_ms = headline["cpu_ms_per_grant"], headline["baseline_cpu_ms_per_transaction"]
    per_grant_ms = lazy_ms if mode == "use" else head_ms if mode == "commit" else 0.0
    ceiling = baseline_ms / (baseline_ms + per_grant_ms)
    note = (f"on {_filesystem(db_dir)} one fsync'd 4 KiB page write takes {page_ms:.3f} ms; a durable head-file "
            f"write (a slot overwritten in place and fdatasync'd, under an flock: after every committed ledger write "
            f"in commit mode, every write but a grant's in use mode) {head_ms:.3f} ms, {head_cpu_ms:.3f} ms of it CPU "
            f"time (user and system: the flock, the read-back, the write and the kernel's part of the fdatasync; the "
            f"rest is waiting for the device); a grant's head-file write in use mode (slot C, no fdatasync) "
            f"{lazy_ms:.3f} ms ({lazy_cpu_ms:.3f} ms CPU), and the grant's first use then {first_use_ms:.3f} ms more "
            f"(the head made durable before any block is opened); a baseline transaction took {baseline_ms:.3f} ms "
            f"({baseline_cpu_ms:.3f} ms CPU) and a grant in {mode} mode {grant_ms:.3f} ms ({grant_cpu_ms:.3f} ms "
            f"CPU); with no cost but the baseline transaction and that mode's head-file write per grant the ratio "
            f"would be {ceiling:.2f} (fsync here ranged {page_range[0]:.3f}-{page_range[1]:.3f} ms within these "
            "samples, timed after the grant runs: on shared storage it varies from second to second, so compare "
            "figures within one run)")
    print(f"[bench ledger] storage: {note}", file=sys.stderr, flush=True)
    return {"fsync_page_ms": round(page_ms, 4), "fsync_page_ms_range": [round(x, 4) for x in page_range],
            "head_file_write_ms": round(head_ms, 4), "head_file_write_cpu_ms": round(head_cpu_ms, 4),
            "grant_head_file_write_ms": round(lazy_ms, 4), "grant_head_file_write_cpu_ms": round(lazy_cpu_ms, 4),
            "first_use_ms": round(first_use_ms, 4),
            "baseline_ms_per_transaction": round(baseline_ms, 4), "ms_per_grant": round(grant_ms, 4),
            "baseline_cpu_ms_per_transaction": round(baseline_cpu_ms, 4), "cpu_ms_per_grant": round(grant_cpu_ms, 4),
            "head_sync": mode, "head_file_share_of_grant": round(min(per_grant_ms / grant_ms, 1.0), 3),
            "ratio_ceiling": round(ceiling, 3), "samples": samples, "note": note,
            "ratio_ceiling_is": "baseline ms / (baseline ms + the headline mode's head-file write per grant): the "
                                "ratio if a grant cost only the baseline transaction and that write (headline writer "
                                "count; group mode's writes are off the grant's path)",
            "first_use_ms_is": "a grant's head-file write followed by make_durable (what Ledger.verify does in use "
                               "mode), minus the grant's write alone: medians of separate samples"}


def _filesystem(path):
    """The mount (device, type) holding ``path``, from /proc/mounts (Linux), for the record."""
    path = os.path.realpath(path)
    best = ("?", "?", "")
    try:
        with open("/proc/mounts") as f:
            for line in f:
                device, mount, fstype = line.split()[:3]
                if (path == mount or path.startswith(mount.rstrip("/") + "/")) and len(mount) >= len(best[2]):
                    best = (device, fstype, mount)
    except OSError:
        pass
    return f"{best[1]} ({best[0]} on {best[2] or '?'})"


def _check_args(args):
    try:
        writer_counts = [int(w) for w in str(args.writers).split(",") if w.strip()]
    except ValueError:
        raise SystemExit(f"sage bench ledger: --writers {args.writers!r} must be comma-separated integers")  # noqa: B904
    if not writer_counts or any(w < 1 for w in writer_counts):
        raise SystemExit(f"sage bench ledger: --writers {args.writers!r} must list writer counts >= 1")
    if args.growth_blocks < 0 or args.growth_batch < 1:
        raise SystemExit(f"sage bench ledger: --growth-blocks {args.growth_blocks} must be >= 0 and --growth-batch "
                         f"{args.growth_batch} >= 1")
    if args.storage_samples < 0:
        raise SystemExit(f"sage bench ledger: --storage-samples {args.storage_samples} must be >= 0")
    if args.choose_blocks < 0:
        raise SystemExit(f"sage bench ledger: --choose-blocks {args.choose_blocks} must be >= 0")
    for name in ("grants", "blocks", "repeats"):
        if getattr(args, name) < 1:
            raise SystemExit(f"sage bench ledger: --{name} {getattr(args, name)} must be >= 1")
    from sage_tfx.privacy.head_file import head_sync_mode
    from sage_tfx.privacy.keys import KeyFileError

    try:
        args.head_sync_modes = [head_sync_mode(m) for m in str(args.head_sync).split(",") if m.strip()]
    except KeyFileError as exc:
        raise SystemExit(f"sage bench ledger: --head-sync: {exc}")  # noqa: B904
    if not args.head_sync_modes:
        raise SystemExit(f"sage bench ledger: --head-sync {args.head_sync!r} names no mode (use, commit, group)")
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
        "by_head_sync": {mode: {"ratio": (v["1"] if "1" in v else v[str(writer_counts[0])])["ratio"],
                                "meets_goal": all(w["ratio"] >= GOAL_RATIO for w in v.values()),
                                "audit_ok": all(w["audit_ok"] for w in v.values()), "writers": v}
                         for mode, v in by_mode.items()},
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
    if args.choose_blocks:
        figures["choose_blocks"] = _measure_choice(db_dir, args.choose_blocks, args.repeats)
    if args.growth_blocks:
        path = os.path.join(db_dir, f"growth-{uuid.uuid4().hex[:12]}.db")
        figures["add_blocks"] = _measure_growth(path, args.growth_blocks, args.growth_batch, args.repeats, "sqlite")
        for suffix in LEDGER_FILE_SUFFIXES:
            if os.path.exists(path + suffix):
                os.remove(path + suffix)
    if args.postgres:
        figures["postgres"] = _measure(_postgres_pair, args.postgres, args, writer_counts, "postgresql")
        if args.growth_blocks:
            figures["postgres_add_blocks"] = _measure_growth(args.postgres, args.growth_blocks, args.growth_batch,
                                                             args.repeats, "postgresql")
    if not args.db_dir:
        try:
            os.rmdir(db_dir)
        except OSError:
            pass
    return figures
