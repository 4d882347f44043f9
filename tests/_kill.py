"""Shared by the kill -9 tests of the ledger (tests/test_ledger_crash.py, tests/test_ledger_queued.py)."""
import os
import time


def kill_after_first_ack(procs, ack_paths, rng, settle=(0.2, 1.0), spacing=0.25, ready=None, wait_s=60.0):
    """Start ``procs``; once one of them has acknowledged a grant (a non-empty file among ``ack_paths``) and
    ``ready()`` (if given) holds, wait a random ``settle`` span, then SIGKILL each at a random moment (random
    order, up to ``spacing`` s apart) and assert each died of SIGKILL."""
    for p in procs:
        p.start()
    deadline = time.time() + wait_s
    while time.time() < deadline and not any(os.path.exists(x) and os.path.getsize(x) for x in ack_paths):
        time.sleep(0.02)
    if ready is not None:
        while time.time() < deadline and not ready():
            time.sleep(0.05)
    time.sleep(rng.uniform(*settle))
    for p in rng.sample(procs, len(procs)):
        time.sleep(rng.uniform(0.0, spacing))
        p.kill()  # SIGKILL
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == -9, p.exitcode
