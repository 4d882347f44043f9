"""The discrete-event loop of the load simulation and its summary statistics.

Time is in hours. Block h (the records of hour [h-1, h)) arrives at time h;
pipelines arrive in between, at their Gamma-process times. A pipeline tries
as soon as it arrives (on the data so far), then after every new block, and
again whenever another pipeline's ACCEPT hands budget back. Attempts take no
simulated time (training is short next to an hour of data).

The measured cohort is the pipelines that arrive in [warmup, hours): the
stream starts empty, so the first ``warmup`` hours are excluded; the
simulation then runs ``drain`` more hours (arrivals continue at the same rate,
so the load does not drop) to let the cohort finish. A pipeline of the cohort
still waiting at the end is *censored*: its release time counts as its wait so
far, so the reported mean is a lower bound whenever ``released`` < 1.
"""

import math
import shutil
import tempfile
import time
from dataclasses import dataclass, field

import numpy as np

from .strategies import ALL_STRATEGIES, PipelineState, make_strategy
from .workload import SimConfig, make_workload


def _tmp_root():
    return "/dev/shm" if __import__("os").path.isdir("/dev/shm") else None


@dataclass
class SimResult:
    """One simulated run: its parameters, every pipeline's state and the run's counters; ``summary()`` reports it.

    Args:
        strategy: the strategy simulated (``ALL_STRATEGIES``).
        rate: the mean pipeline arrivals per hour.
        hours: the hours of arrivals measured (the cohort arrives in [warmup, hours)).
        warmup: the first hours, excluded from the cohort.
        drain: the hours run after ``hours`` for the cohort to finish.
        seed: the workload's seed.
        pipelines: every arrival's ``PipelineState``, in arrival order.
        stats: the run's counters (refusals, waiting_at_end, overloaded_at_h), added to the summary.
        seconds: the wall time the run took.
        stopped: the hour an overloaded run stopped at (None: it ran to the end).
    """

    strategy: str
    rate: float
    hours: int
    warmup: int
    drain: int
    seed: int
    pipelines: list  # PipelineState, all arrivals
    stats: dict = field(default_factory=dict)
    seconds: float = 0.0

    stopped: int | None = None  # the hour an overloaded run stopped at

    @property
    def end(self):
        return self.hours + self.drain if self.stopped is None else self.stopped

    def cohort(self):
        """Pipelines arrived in [warmup, hours), or before the stop of an overloaded run."""
        last = min(self.hours, self.end)
        first = self.warmup if self.warmup < last else 0
        return [p for p in self.pipelines if first <= p.spec.arrival < last]

    def summary(self):
        cohort = self.cohort()
        waits = np.array([(p.released_at if p.released_at is not None else self.end) - p.spec.arrival for p in cohort])
        released = [p for p in cohort if p.released_at is not None]
        out = {
            "strategy": self.strategy,
            "rate": self.rate,
            "pipelines": len(cohort),
            "released": len(released) / len(cohort) if cohort else math.nan,
            "censored": len(cohort) - len(released),
        }
        if len(waits):
            out.update(
                mean_release_h=float(waits.mean()),
                median_release_h=float(np.median(waits)),
                p90_release_h=float(np.percentile(waits, 90)),
            )
        else:
            out.update(mean_release_h=math.nan, median_release_h=math.nan, p90_release_h=math.nan)
        out["mean_is_lower_bound"] = bool(out["censored"])
        attempts = [p.attempts for p in released]
        out["mean_attempts"] = float(np.mean(attempts)) if attempts else math.nan
        out["seconds"] = round(self.seconds, 2)
        out.update(self.stats)
        return out


def _check_run(strategy, hours, warmup, drain):
    """Refuse an unknown strategy or a bad horizon (ValueError naming it) before anything is made."""
    if strategy not in ALL_STRATEGIES:
        raise ValueError(f"strategy {strategy!r} is unknown: use one of {', '.join(ALL_STRATEGIES)}")
    for name, value in (("hours", hours), ("warmup", warmup), ("drain", drain)):
        if not (isinstance(value, int) and value >= 0):
            raise ValueError(f"{name} {value!r} must be an integer >= 0 (hours)")
    if not warmup < hours:
        raise ValueError(f"warmup {warmup!r} must be shorter than hours {hours!r}")


def _serve(sim, order, waiting, now):
    """Advance the waiting pipelines at ``now`` (in ``order``'s order for a queued policy) until none moves; return
    those still waiting, in arrival order."""
    progress = True
    while progress and waiting:  # a release hands budget back: let the others try again
        progress = False
        still = []
        for state in waiting if order is None else order(waiting, now):
            if sim.advance(state, now):
                progress = True
            else:
                still.append(state)
        waiting = still if order is None else [s for s in waiting if s in still]
    return waiting


def simulate(
    strategy,
    rate,
    hours=336,
    seed=0,
    config=SimConfig(),
    warmup=48,
    drain=96,
    workdir=None,
    keep=False,
    inspect=None,
    max_waiting=200,
    policy_params=None,
):
    """Run one strategy at one arrival rate.

    Args:
        strategy: the strategy's name (``ALL_STRATEGIES``).
        rate: the mean pipeline arrivals per hour.
        hours: the hours of arrivals measured; blocks arrive one an hour.
        seed: the workload's seed (the run is deterministic per seed).
        config: the simulation's parameters (``SimConfig``).
        warmup: the first hours, excluded from the measured cohort (shorter than ``hours``).
        drain: the hours run after ``hours`` for the cohort to finish.
        workdir: where the strategy's ledger is written (None: a temporary directory, removed after).
        keep: keep that temporary directory.
        inspect: called with the strategy object before its ledger is closed (tests audit the ledger).
        max_waiting: stop early (``overloaded_at_h``) once more pipelines wait at once: the cohort's unreleased
            pipelines are censored at the stop (the mean is a lower bound).
        policy_params: {queued strategy name: its policy's parameters}.

    Returns:
        The ``SimResult``.

    Raises:
        ValueError: an unknown strategy, or hours, warmup or drain not an integer >= 0, or warmup >= hours.
    """
    _check_run(strategy, hours, warmup, drain)
    started = time.perf_counter()
    end = hours + drain
    specs = make_workload(rate, end, seed, config)
    own_dir = workdir is None
    workdir = workdir or tempfile.mkdtemp(prefix="sage-sim-", dir=_tmp_root())
    sim = make_strategy(strategy, config, workdir, policy_params)
    states = [PipelineState(s, config) for s in specs]
    waiting = []  # arrival order
    order = getattr(sim, "order", None)  # queued policies: who is served first at a scheduling point

    try:
        i = 0
        overloaded = None
        for hour in range(1, end + 1):
            if len(waiting) > max_waiting:
                overloaded = hour - 1
                break
            while i < len(states) and states[i].spec.arrival < hour:
                state = states[i]
                sim.arrive(state)
                if getattr(sim, "reschedule_on_arrival", False):
                    waiting = _serve(sim, order, waiting + [state], state.spec.arrival)
                elif not sim.advance(state, state.spec.arrival):
                    waiting.append(state)
                i += 1
            sim.new_hour(hour)
            waiting = _serve(sim, order, waiting, float(hour))
        stats = {"refusals": sim.refusals, "waiting_at_end": len(waiting), "overloaded_at_h": overloaded}
        if inspect is not None:
            inspect(sim)
    finally:
        sim.close()
        if own_dir and not keep:
            shutil.rmtree(workdir, ignore_errors=True)
    result = SimResult(strategy, rate, hours, warmup, drain, seed, states, stats, time.perf_counter() - started)
    if overloaded is not None:
        result.stopped = overloaded
    return result
