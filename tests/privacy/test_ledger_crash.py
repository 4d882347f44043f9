"""Crash safety: processes charging in a loop are killed with SIGKILL at random moments, several rounds.

Each worker appends every grant it was handed to its own file (flush + fsync) only
AFTER ``request`` returned, so a line in a file is an acknowledged grant. Afterwards
the ledger must pass ``audit`` (hash chain, log replay, and SQLite's integrity_check),
hold every acknowledged grant exactly as handed, overspend no block, and still work.
"""

import json
import multiprocessing
import os
import random
import time

from sage_tfx.privacy import BlockRetired, BudgetRefused, Ledger
from tests.helpers.kill import kill_after_first_ack
from tests.privacy.test_ledger_concurrency import assert_ledger_consistent

WORKERS, ROUNDS, FIRST_BLOCKS, NEW_BLOCKS_PER_ROUND = 4, 3, 12, 4


def crash_worker(location, ack_path, seed):
    """Charge random block sets forever; record each acknowledged grant durably. Killed from outside."""
    rng = random.Random(seed)
    ledger = Ledger.open(location)
    with open(ack_path, "a") as ack:
        active = []
        while True:
            if not active:
                active = [b.id for b in ledger.blocks("s", state="active")]
                if not active:
                    time.sleep(0.02)
                    continue
            chosen = rng.sample(active, min(len(active), rng.randint(1, 5)))
            try:
                grant = ledger.request(
                    f"w{seed}",
                    "s",
                    blocks=chosen,
                    epsilon=round(rng.uniform(0.005, 0.05), 5),
                    delta=rng.choice((0.0, 2e-9)),
                )
            except (BudgetRefused, BlockRetired):
                active = []
                continue
            ack.write(grant.to_json() + "\n")
            ack.flush()
            os.fsync(ack.fileno())


def acknowledged_grants(directory):
    """Every complete line of every worker's file (a torn last line was never acknowledged)."""
    out = {}
    for name in sorted(os.listdir(directory)):
        if name.startswith("ack-"):
            with open(os.path.join(directory, name)) as f:
                for line in f.read().split("\n")[:-1]:
                    out[json.loads(line)["id"]] = line
    return out


def any_retired(location):
    with Ledger.open(location) as ledger:
        return bool(ledger.blocks("s", state="retired"))


def run_crash_rounds(location, ack_dir, seed=7):
    rng = random.Random(seed)
    with Ledger.open(location, create=True) as ledger:
        ledger.create_stream("s", 1.0, 1e-5, min_epsilon=0.005)
        for i in range(FIRST_BLOCKS):
            ledger.add_block("s", f"b{i:03d}", start=i * 3600.0, end=(i + 1) * 3600.0)
    next_block = FIRST_BLOCKS
    ctx = multiprocessing.get_context("spawn")
    for round_no in range(ROUNDS):
        paths = [os.path.join(ack_dir, f"ack-{round_no}-{w}.txt") for w in range(WORKERS)]
        procs = [
            ctx.Process(target=crash_worker, args=(location, path, 100 * round_no + w)) for w, path in enumerate(paths)
        ]
        # Let the workers get going (at least one acknowledged grant), then kill each at a random moment; on a
        # loaded machine, let a block run out before the last round's kills (the test needs one).
        ready = (lambda: any_retired(location)) if round_no == ROUNDS - 1 else None
        kill_after_first_ack(procs, paths, rng, settle=(0.2, 1.0), spacing=0.25, ready=ready)
        # New data arrives between rounds, while old blocks run out.
        with Ledger.open(location) as ledger:
            for _ in range(NEW_BLOCKS_PER_ROUND):
                ledger.add_block("s", f"b{next_block:03d}", start=next_block * 3600.0, end=(next_block + 1) * 3600.0)
                next_block += 1


def test_sigkill_during_charges_leaves_an_auditable_ledger(ledger_url, tmp_path):
    ack_dir = tmp_path / "acks"
    ack_dir.mkdir()
    run_crash_rounds(ledger_url, str(ack_dir))
    acknowledged = acknowledged_grants(str(ack_dir))
    assert len(acknowledged) >= ROUNDS * 5, len(acknowledged)
    blocks, grants = assert_ledger_consistent(ledger_url, "s", acknowledged)
    assert any(b.state == "retired" for b in blocks.values()), "no block ran out: the budget check went untested"
    # The ledger still works after the kills (no lock left behind, WAL recovered).
    with Ledger.open(ledger_url) as ledger:
        fresh = ledger.add_block("s", "after-crash")
        grant = ledger.request("p", "s", blocks=[fresh.id], epsilon=1.0)
        assert ledger.verify(grant) == grant
        assert ledger.audit().ok
    if not ledger_url.startswith("postgresql://"):
        from sage_tfx.privacy.store import SqliteStore

        store = SqliteStore(ledger_url)
        try:
            assert store.integrity_problems() == []
        finally:
            store.close()
