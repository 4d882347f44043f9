"""The multi-pipeline platform behind `sage serve` (paper §3.3, Fig. 3).

Several pipelines wait on one stream. A replay adds blocks one step at a time;
each new block's budget is split evenly among the pipelines waiting at that
moment (the ledger does this in ``add_block``). Each pipeline runs its own
``SageIterator`` in a thread with its own ledger connection; an iterator that
needs more blocks waits until the replay adds some. The platform prints a live
status line per event and ends when every pipeline is done or the stream ends.
"""

import threading
import time
from dataclasses import dataclass, field

from sage_tfx.privacy import Ledger, public_error_text
from sage_tfx.privacy.vocabulary import PipelineState

from .iterator import SageIterator
from .settings import IteratorSettings


def register_unfinished(ledger, stream, names) -> None:
    """Register ``names`` as waiting on ``stream``, except those already finished: their iterators report the
    stored outcome (for the request they were run for; ``SageIterator.check_request``) and take no share."""
    done = {p["name"] for p in ledger.pipelines(stream) if p["state"] == PipelineState.DONE}
    for name in names:
        if name not in done:
            ledger.register(stream, name)


@dataclass
class PipelineSpec:
    """A pipeline to serve: its name, ``run_iteration`` callable, its ``SageIterator``'s settings and the request
    its grants sign (None: none)."""

    name: str
    run_iteration: object
    settings: IteratorSettings = field(default_factory=IteratorSettings)
    request: dict | None = None


class _Stream:
    """The replay clock shared by the iterators: a condition they wait on for new blocks."""

    def __init__(self):
        self.cond = threading.Condition()
        self.generation = 0
        self.ended = False

    def advanced(self, ended=False):
        with self.cond:
            self.generation += 1
            self.ended = self.ended or ended
            self.cond.notify_all()

    def wait_for_more(self, seen, timeout):
        with self.cond:
            self.cond.wait_for(lambda: self.generation > seen or self.ended, timeout=timeout)
            return self.generation > seen


class Platform:
    """Run ``pipelines`` (PipelineSpec) on ``stream`` while ``replay_step()`` adds blocks.

    ``replay_step()`` adds the next step's blocks to the ledger and returns their
    ids, or None when the historical data is exhausted. ``step_seconds`` paces
    the replay in real time (0: as fast as the pipelines consume it: the replay
    advances whenever every unfinished pipeline is waiting for data).
    """

    def __init__(
        self, ledger_location, stream, pipelines, replay_step, step_seconds=0.0, progress=print, idle_timeout=3600.0
    ):
        self.location, self.stream, self.pipelines = ledger_location, stream, list(pipelines)
        names = [p.name for p in self.pipelines]
        if len(set(names)) != len(names):
            raise ValueError(f"pipeline names must be unique: {names}")
        self.replay_step, self.step_seconds = replay_step, step_seconds
        self.progress, self.idle_timeout = progress, idle_timeout
        self._clock = _Stream()
        self._lock = threading.Lock()
        self._waiting = set()
        self.results, self.errors = {}, {}

    def _say(self, line):
        with self._lock:
            self.progress(line)

    def _run_one(self, spec):
        ledger = Ledger.open(self.location)
        try:

            def wait_for_blocks(_timeout):
                seen = self._clock.generation
                with self._lock:
                    self._waiting.add(spec.name)
                try:
                    return self._clock.wait_for_more(seen, self.idle_timeout)
                finally:
                    with self._lock:
                        self._waiting.discard(spec.name)

            iterator = SageIterator(
                ledger,
                self.stream,
                spec.name,
                spec.run_iteration,
                settings=spec.settings,
                wait_for_blocks=wait_for_blocks,
                progress=self._say,
                request=spec.request,
            )
            result = iterator.run()
            self.results[spec.name] = result
            self._say(f"[{spec.name}] done: {result.describe()}")
        except Exception as exc:  # reported, and the others go on
            self.errors[spec.name] = exc
            self._say(f"[{spec.name}] failed: {public_error_text(exc)}")  # a data path: no value in the text
        finally:
            ledger.close()

    def run(self):
        # Register everyone before the first block arrives, so each gets a share of it.
        with Ledger.open(self.location) as ledger:
            register_unfinished(ledger, self.stream, [spec.name for spec in self.pipelines])
        threads = [
            threading.Thread(target=self._run_one, args=(spec,), name=spec.name, daemon=True) for spec in self.pipelines
        ]
        for t in threads:
            t.start()
        step = 0
        while any(t.is_alive() for t in threads):
            if self.step_seconds > 0:
                time.sleep(self.step_seconds)
            else:  # simulated clock: advance once every live pipeline waits for data
                alive = {t.name for t in threads if t.is_alive()}
                with self._lock:
                    idle = alive <= self._waiting
                if not idle:
                    time.sleep(0.05)
                    continue
            added = self.replay_step()
            step += 1
            if added is None:
                self._say(f"[replay] step {step}: the stream has ended")
                self._clock.advanced(ended=True)
                break
            self._say(
                f"[replay] step {step}: {len(added)} new block(s) {', '.join(added[:3])}"
                f"{'...' if len(added) > 3 else ''}; waiting: {', '.join(sorted(self._waiting)) or '-'}"
            )
            self._clock.advanced()
        for t in threads:
            t.join()
        return self.results
