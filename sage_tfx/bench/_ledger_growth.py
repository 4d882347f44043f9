"""`sage bench ledger`'s block choice and growth figures.

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
"""

import hashlib
import os
import random
import statistics
import sys
import time
import uuid

from sage_tfx.privacy.vocabulary import Accounting, BlockState

# Files a SQLite ledger leaves beside itself: WAL, shared memory, and its key file with the head file and its lock.
LEDGER_FILE_SUFFIXES = ("", "-wal", "-shm", ".key", ".key.head", ".key.head.lock")


def remove_ledger_files(*paths):
    """Delete each ledger file at ``paths`` and its companions (``LEDGER_FILE_SUFFIXES``) that exist."""
    for path in paths:
        for suffix in LEDGER_FILE_SUFFIXES:
            if os.path.exists(path + suffix):
                os.remove(path + suffix)


GOAL_GROWTH_RATIO = 2.0  # cost per added block at --growth-blocks over at 1,000 blocks
YOUNG_BLOCKS = 1000


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
        ledger.add_blocks(
            "s",
            [
                dict(id=ids[i], start=i * day, end=(i + 1) * day, rows=100)
                for i in range(start, min(start + 50, n_blocks))
            ],
        )
    for _ in range(max(10, n_blocks // 25)):
        width = min(rng.choice([1, 8, 32, 64]), n_blocks)
        first = rng.randrange(n_blocks - width + 1)
        try:
            ledger.request(
                rng.choice(["p0", "p1", "p2", "late"]),
                "s",
                blocks=ids[first : first + width],
                epsilon=rng.choice([0.05, 0.1, 0.2, 0.3]),
                delta=1e-8,
            )
        except BudgetRefused:
            pass
    return ledger


def _per_block_loop(ledger, pipeline, delta):
    """The iterator's block choice before available_per_block: one transaction and bisection per block."""
    return {
        b.id: ledger.available_epsilon(pipeline, "s", [b.id], delta)
        for b in reversed(ledger.blocks("s", state=BlockState.ACTIVE))
    }


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
        remove_ledger_files(path)
        loop_s, call_s = statistics.median(loop_times), statistics.median(call_times)
        out[accounting] = {
            "per_block_loop_seconds": round(loop_s, 5),
            "one_call_seconds": round(call_s, 5),
            "speedup": round(loop_s / call_s, 2),
            "same_values": same,
            "active_blocks": len(call),
        }
        print(
            f"[bench ledger] choose_blocks, {accounting}, {len(call)} active blocks: per-block loop "
            f"{loop_s * 1e3:.1f} ms, one call {call_s * 1e3:.1f} ms (x{loop_s / call_s:.1f})",
            file=sys.stderr,
            flush=True,
        )
    return {
        "blocks": n_blocks,
        "repeats": repeats,
        **out,
        "speedup_is": "median per-block-loop time / median available_per_block time, same ledger, same run",
    }


# ------------------------------------------------------------------ add_blocks on a young and an old stream
def _growth_batch(stream, first, count):
    """GENERATED hourly blocks ``first`` .. ``first + count - 1`` of ``stream``, each with a distinct digest."""
    hour = 3600.0
    return [
        dict(
            id=f"b{i:07d}",
            start=i * hour,
            end=(i + 1) * hour,
            rows=100,
            digest=hashlib.sha256(f"{stream}/{i}".encode()).hexdigest(),
        )
        for i in range(first, first + count)
    ]


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
            print(
                f"[bench ledger] add_blocks, {label}, run {r + 1}/{repeats}: {young_costs[-1] * 1e3:.3f} ms per "
                f"block at {YOUNG_BLOCKS:,} blocks, {old_costs[-1] * 1e3:.3f} ms at {n_old + r * batch:,}",
                file=sys.stderr,
                flush=True,
            )
        start = time.perf_counter()
        audit_ok = ledger.audit().ok and len(ledger.blocks(old)) == n_old + repeats * batch
        audit_s = time.perf_counter() - start
    young_ms, old_ms = statistics.median(young_costs) * 1e3, statistics.median(old_costs) * 1e3
    ratio = old_ms / young_ms
    print(
        f"[bench ledger] add_blocks, {label}: {young_ms:.3f} ms per block at {YOUNG_BLOCKS:,} blocks, "
        f"{old_ms:.3f} ms at {n_old:,} (ratio {ratio:.2f}); audit {'ok' if audit_ok else 'FAILED'} "
        f"in {audit_s:.1f} s",
        file=sys.stderr,
        flush=True,
    )
    return {
        "young_blocks": YOUNG_BLOCKS,
        "old_blocks": n_old,
        "batch": batch,
        "repeats": repeats,
        "ms_per_block_young": round(young_ms, 4),
        "ms_per_block_old": round(old_ms, 4),
        "ratio": round(ratio, 3),
        "goal_ratio": GOAL_GROWTH_RATIO,
        "meets_goal": ratio <= GOAL_GROWTH_RATIO,
        "audit_ok": audit_ok,
        "grow_seconds": round(grow_s, 1),
        "audit_seconds": round(audit_s, 1),
        "young_runs_ms": [round(c * 1e3, 4) for c in young_costs],
        "old_runs_ms": [round(c * 1e3, 4) for c in old_costs],
        "ratio_is": "median ms per block of one add_blocks of `batch` blocks (windows, digests, 2 waiting "
        "pipelines) on the old stream / the same on a young stream, alternating, same ledger, same run",
    }
