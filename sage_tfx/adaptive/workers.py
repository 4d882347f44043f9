"""`sage serve`'s pipelines in parallel: one worker PROCESS per pipeline.

``ProcessPlatform`` runs each pipeline's ``SageIterator`` in its own "spawn" process (TFX's orchestrators
are not safe to run concurrently in one process); each worker opens the ledger itself and gets the key
file's path, never the key. The parent keeps the replay clock and bounds the TFX runs at once
(``parallel``). Contract: a worker that dies is restarted (up to ``max_restarts``) and resumes its attempt
under its grant with no new charge; an iteration that raises after its charge records FAILED. This module is
the platform only: it imports neither the participants' code nor the CLI. Details: docs/scale_out.md,
"Pipelines in parallel".
"""

import multiprocessing
import os
import signal
import sys
import time
from dataclasses import dataclass
from multiprocessing.connection import wait as wait_any

from sage_tfx.privacy import Ledger

from .platform import register_unfinished


@dataclass
class WorkerResult:
    """A finished worker's report: the RunResult's outcome, iteration count and one-line description."""

    outcome: str
    iterations: int
    description: str


def _signal_name(number):
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def describe_exit(exitcode):
    """'exit status 1' or 'killed by SIGKILL (signal 9)' for a multiprocessing exit code."""
    if exitcode is None:
        return "still running"
    if exitcode < 0:
        return f"killed by {_signal_name(-exitcode)} (signal {-exitcode})"
    return f"exit status {exitcode}"


class BlockWaiter:
    """A worker's side of the replay clock: ``wait(timeout)`` says "waiting" and returns True once the parent's
    replay advanced past what this worker last heard of, False once the stream ended (or on the timeout)."""

    def __init__(self, conn):
        self.conn, self.known = conn, 0

    def wait(self, timeout):
        seen = self.known
        self.conn.send(("wait", seen))
        while True:
            if not self.conn.poll(timeout):
                return False
            kind, generation, ended = self.conn.recv()
            self.known = max(self.known, generation)
            if generation > seen or ended:
                return generation > seen


def die(conn, name: str, text: str) -> None:
    """A worker's death: tell the platform (``("crash", text)``: it restarts the worker up to its limit), say it
    on stderr and exit at once (no clean-up that could block). ``text`` is the error's public part only."""
    conn.send(("crash", text))
    conn.close()
    print(f"sage serve: worker {name}: {text}", file=sys.stderr, flush=True)
    os._exit(1)


class _Worker:
    def __init__(self, spec):
        self.spec, self.process, self.conn = spec, None, None
        self.restarts, self.finished, self.waiting, self.wants_slot, self.in_slot = 0, False, None, False, False
        self.crash_text = None


class ProcessPlatform:
    """Run ``specs`` (each with a ``name`` and a ``entry()``: the module-level function its worker runs with
    ``(spec, conn)``; ``WorkerSpec`` or ``ReleaseSpec``), one worker process each, while
    ``replay_step()`` adds blocks.

    ``replay_step``, ``step_seconds`` and ``progress`` as ``Platform``'s. ``parallel``: at most this many
    iterations (TFX runs) at once, 0 for no bound. ``max_restarts``: restarts of a dead worker before its
    pipeline is reported as failed. After ``run()``: ``results`` {name: WorkerResult}, ``errors`` {name: text}.
    """

    def __init__(
        self, ledger_location, stream, specs, replay_step, step_seconds=0.0, progress=print, parallel=0, max_restarts=3
    ):
        self.location, self.stream, self.specs = ledger_location, stream, list(specs)
        names = [s.name for s in self.specs]
        if len(set(names)) != len(names):
            raise ValueError(f"pipeline names must be unique: {names}")
        if parallel < 0 or max_restarts < 0:
            raise ValueError("parallel and max_restarts must be >= 0")
        self.replay_step, self.step_seconds, self.progress = replay_step, step_seconds, progress
        self.parallel, self.max_restarts = parallel, max_restarts
        self.results, self.errors = {}, {}
        self._ctx = multiprocessing.get_context("spawn")
        self._generation, self._ended = 0, False

    # ------------------------------------------------------------ workers
    def worker_target(self, spec):
        """The module-level function a participant's worker process runs: the spec's ``entry()``
        (``sage_tfx.pipelines.workers.WorkerSpec``: a pipeline's Sage iterator; ``sage_tfx.release.worker.ReleaseSpec``:
        a release strategy's session)."""
        return spec.entry()

    def _start(self, w):
        parent, child = self._ctx.Pipe(duplex=True)
        target = self.worker_target(w.spec)
        w.process = self._ctx.Process(target=target, args=(w.spec, child), name=f"sage-serve-{w.spec.name}")
        w.process.start()
        child.close()
        w.conn, w.waiting, w.wants_slot, w.in_slot, w.crash_text = parent, None, False, False, None
        self.progress(f"[{w.spec.name}] worker started (pid {w.process.pid})")

    def _handle(self, w, message):
        kind, value = message
        if kind == "progress":
            self.progress(value)
        elif kind == "wait":
            w.waiting = value
        elif kind == "acquire":
            w.wants_slot = True
        elif kind == "release":
            w.in_slot = False
        elif kind == "done":
            w.finished = True
            self.results[w.spec.name] = value
            self.progress(f"[{w.spec.name}] done: {value.description}")
        elif kind == "failed":
            w.finished = True
            self.errors[w.spec.name] = value
            self.progress(f"[{w.spec.name}] failed: {value}")
        elif kind == "crash":
            w.crash_text = value

    def _drain(self, w):
        """Handle every message the worker sent; False once its end of the pipe is closed."""
        try:
            while w.conn.poll():
                self._handle(w, w.conn.recv())
        except (EOFError, OSError):
            return False
        return True

    def _reap(self, w):
        """The worker's process ended: a finished pipeline, or a death (reported; restarted or failed)."""
        self._drain(w)
        w.process.join()
        w.conn.close()
        if w.finished:
            return
        status = describe_exit(w.process.exitcode)
        why = f"{status}{'; ' + w.crash_text if w.crash_text else ''}"
        if w.restarts >= self.max_restarts:
            w.finished = True
            self.errors[w.spec.name] = f"the worker died {w.restarts + 1} time(s); last: {why}"
            self.progress(
                f"[{w.spec.name}] failed: worker (pid {w.process.pid}) died ({why}); "
                f"{w.restarts} restart(s) already, giving up"
            )
            return
        w.restarts += 1
        self.progress(
            f"[{w.spec.name}] worker (pid {w.process.pid}) died ({why}); restarting "
            f"({w.restarts}/{self.max_restarts}): it resumes under its grant"
        )
        self._start(w)

    def _grant_slots(self, workers):
        busy = sum(w.in_slot for w in workers)
        for w in workers:
            if w.wants_slot and (self.parallel == 0 or busy < self.parallel):
                w.wants_slot, w.in_slot = False, True
                busy += 1
                try:
                    w.conn.send(("slot",))
                except OSError:
                    pass  # it died; reaped next turn

    def _wake(self, workers):
        """Answer every worker waiting for blocks that the replay has advanced past (or ended)."""
        for w in workers:
            if w.waiting is not None and (self._generation > w.waiting or self._ended):
                try:
                    w.conn.send(("advanced", self._generation, self._ended))
                except OSError:
                    pass
                w.waiting = None

    # ---------------------------------------------------------------- run
    def run(self):
        with Ledger.open(self.location) as ledger:  # everyone registered before the first block arrives
            register_unfinished(ledger, self.stream, [spec.name for spec in self.specs])
        workers = [_Worker(spec) for spec in self.specs]
        for w in workers:
            self._start(w)
        step, last_step = 0, time.monotonic()
        try:
            while True:
                live = [w for w in workers if not w.finished]
                if not live:
                    break
                ready = wait_any([w.conn for w in live] + [w.process.sentinel for w in live], timeout=0.05)
                for w in live:
                    if w.conn in ready and not self._drain(w):
                        self._reap(w)
                    elif w.process.sentinel in ready:
                        self._reap(w)
                live = [w for w in workers if not w.finished]
                self._grant_slots(live)
                self._wake(live)
                if not live or self._ended:
                    continue
                if self.step_seconds > 0:
                    if time.monotonic() - last_step < self.step_seconds:
                        continue
                elif not all(w.waiting is not None for w in live):
                    continue  # simulated clock: advance once every live pipeline waits for data
                waiting = sorted(w.spec.name for w in live if w.waiting is not None)
                added = self.replay_step()
                step, last_step = step + 1, time.monotonic()
                if added is None:
                    self.progress(f"[replay] step {step}: the stream has ended")
                    self._ended = True
                else:
                    self._generation += 1
                    self.progress(
                        f"[replay] step {step}: {len(added)} new block(s) {', '.join(added[:3])}"
                        f"{'...' if len(added) > 3 else ''}; waiting: {', '.join(waiting) or '-'}"
                    )
                self._wake(live)
        finally:
            for w in workers:
                if w.process is not None and w.process.is_alive():
                    w.process.kill()
                    w.process.join()
        return self.results
