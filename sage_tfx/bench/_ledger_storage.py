"""`sage bench ledger`'s storage figures.

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
"""

import os
import statistics
import sys
import time
import uuid


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
    lazy_ms, lazy_cpu_ms = _timed_head_writes(
        db_dir, samples, "use", lambda h, i: h.advance("bench", i, "0" * 64, until_use=True)
    )
    pair_ms, _ = _timed_head_writes(db_dir, samples, "use", _grant_then_first_use)
    first_use_ms = max(pair_ms - lazy_ms, 0.0)
    page_ms = statistics.median(page_s) * 1e3
    page_range = (min(page_s) * 1e3, max(page_s) * 1e3)
    baseline_ms, grant_ms = 1e3 / headline["baseline_transactions_per_second"], 1e3 / headline["grants_per_second"]
    grant_cpu_ms, baseline_cpu_ms = headline["cpu_ms_per_grant"], headline["baseline_cpu_ms_per_transaction"]
    per_grant_ms = lazy_ms if mode == "use" else head_ms if mode == "commit" else 0.0
    ceiling = baseline_ms / (baseline_ms + per_grant_ms)
    note = (
        f"on {_filesystem(db_dir)} one fsync'd 4 KiB page write takes {page_ms:.3f} ms; a durable head-file "
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
        "figures within one run)"
    )
    print(f"[bench ledger] storage: {note}", file=sys.stderr, flush=True)
    return {
        "fsync_page_ms": round(page_ms, 4),
        "fsync_page_ms_range": [round(x, 4) for x in page_range],
        "head_file_write_ms": round(head_ms, 4),
        "head_file_write_cpu_ms": round(head_cpu_ms, 4),
        "grant_head_file_write_ms": round(lazy_ms, 4),
        "grant_head_file_write_cpu_ms": round(lazy_cpu_ms, 4),
        "first_use_ms": round(first_use_ms, 4),
        "baseline_ms_per_transaction": round(baseline_ms, 4),
        "ms_per_grant": round(grant_ms, 4),
        "baseline_cpu_ms_per_transaction": round(baseline_cpu_ms, 4),
        "cpu_ms_per_grant": round(grant_cpu_ms, 4),
        "head_sync": mode,
        "head_file_share_of_grant": round(min(per_grant_ms / grant_ms, 1.0), 3),
        "ratio_ceiling": round(ceiling, 3),
        "samples": samples,
        "note": note,
        "ratio_ceiling_is": "baseline ms / (baseline ms + the headline mode's head-file write per grant): the "
        "ratio if a grant cost only the baseline transaction and that write (headline writer "
        "count; group mode's writes are off the grant's path)",
        "first_use_ms_is": "a grant's head-file write followed by make_durable (what Ledger.verify does in use "
        "mode), minus the grant's write alone: medians of separate samples",
    }


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
