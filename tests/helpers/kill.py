"""Shared by the kill -9 tests: the ledger's (tests/privacy/test_ledger_crash.py, test_ledger_queued.py,
test_scheduled_pipeline.py) and sage serve's workers' (test_serve_release.py, test_serve_schedule.py)."""

import os
import re
import signal
import subprocess
import threading
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


def kill_serve_worker(cmd, name, ready, what, before_kill=lambda lines: None, wait_s=300.0, poll=0.1):
    """Start `sage serve` (``cmd``), wait until worker ``name`` has said its pid and ``ready(lines)`` holds (else
    fail with ``what`` and the output), call ``before_kill(lines)``, SIGKILL that worker and wait for serve to end.
    Returns (serve's exit code, its stdout lines, the killed pid, what ``before_kill`` returned)."""

    import pytest

    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    lines = []
    reader = threading.Thread(target=lambda: lines.extend(line.rstrip("\n") for line in proc.stdout), daemon=True)
    reader.start()
    try:
        pid, deadline = None, time.monotonic() + wait_s
        while time.monotonic() < deadline:
            for line in list(lines):
                m = re.match(rf"\[{re.escape(name)}\] worker started \(pid (\d+)\)", line)
                pid = int(m.group(1)) if m else pid
            if pid is not None and ready(list(lines)):
                break
            time.sleep(poll)
        else:
            pytest.fail(f"{what}: " + "\n".join(lines))
        found = before_kill(list(lines))
        os.kill(pid, signal.SIGKILL)
        code = proc.wait(timeout=600)
        reader.join(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    return code, lines, pid, found
