"""A GENERATED multi-block workload of small and large pipelines, after PrivateKube's microbenchmark.

PrivateKube (Luo et al., OSDI'21 "Privacy Budget Scheduling" §6.2): blocks arrive one per hour; *mice* (75%)
demand the newest block, *elephants* the newest 10, each at epsilon 0.01 (75%) or 0.1; arrivals are Poisson at
``rate`` per hour; each pipeline has ONE demand, fixed at arrival and granted all-or-nothing, or leaves at its
timeout (no RETRY). It runs every registered policy of ``privacy/allocation.py`` and PrivateKube's FCFS
baseline (``Fcfs``). Contract: a workload generator for comparing policies (the demand per block is several
times its capacity), not a privacy mechanism.

Parameters, PrivateKube's values and results: docs/simulation.md ("Policies compared", "Workload 2: mice and
elephants").
"""

from __future__ import annotations

import heapq
import math
import time
from dataclasses import asdict, dataclass, fields

import numpy as np

from sage_tfx.privacy import curves, filters
from sage_tfx.privacy.allocation import BlockAllocation, QueuedAllocation, QueuedPolicy, get_policy, policy_names
from sage_tfx.privacy.vocabulary import Accounting

HOUR = 3600.0


@dataclass(frozen=True)
class MicroConfig:
    """The microbenchmark's parameters (docs/simulation.md: PrivateKube's values and ours)."""

    rate: float = 32.0  # pipeline arrivals per hour (one block per hour)
    hours: int = 30  # hours of arrivals (PrivateKube: 30 block intervals)
    initial_blocks: int = 11  # blocks present at time 0 (PrivateKube: 11)
    epsilon: float = 1.0  # per-block global epsilon (PrivateKube: 1, normalised)
    delta: float = 1e-6  # per-block global delta
    mice_blocks: int = 1
    elephant_blocks: int = 10
    mice_epsilon: float = 0.01
    elephant_epsilon: float = 0.1
    mice_blocks_share: float = 0.75  # P(a pipeline demands mice_blocks blocks)
    mice_epsilon_share: float = 0.75  # P(a pipeline demands mice_epsilon), independent of the above
    timeout: float = 12.0  # hours a pipeline waits before it leaves ungranted
    min_epsilon: float = 0.001  # a block that cannot admit this much more is retired
    accounting: str = Accounting.BASIC  # rdp: Rényi filters, each demand a curve (``demand_curves``)

    def __post_init__(self):
        if self.accounting not in tuple(Accounting):
            raise ValueError(f"microbenchmark accounting={self.accounting!r} must be 'basic' or 'rdp'")
        for f in fields(self):
            if f.name == "accounting":
                continue
            value = getattr(self, f.name)
            if isinstance(value, bool) or not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"microbenchmark parameter {f.name}={value!r} must be a finite number > 0")
        for name in ("hours", "initial_blocks", "mice_blocks", "elephant_blocks"):
            if not isinstance(getattr(self, name), int):
                raise ValueError(f"microbenchmark parameter {name}={getattr(self, name)!r} must be an integer")
        for name in ("mice_blocks_share", "mice_epsilon_share"):
            if getattr(self, name) > 1:
                raise ValueError(f"microbenchmark parameter {name}={getattr(self, name)!r} must be <= 1")
        if max(self.mice_epsilon, self.elephant_epsilon) > self.epsilon:
            raise ValueError(
                f"a demand's epsilon ({self.mice_epsilon}, {self.elephant_epsilon}) must be <= epsilon {self.epsilon}"
            )

    def to_dict(self):
        return asdict(self)


class Fcfs(QueuedPolicy):
    """PrivateKube's FCFS baseline: everything unlocked at once, demands served in arrival order. Simulator only."""

    name = "fcfs"

    def unlocked_fraction(self, *, arrivals, age):
        return 1.0

    def demand_key(self, filt, cost, spents, orders_index=None):
        return 0.0  # ties: arrival order


@dataclass(frozen=True)
class Pipeline:
    index: int
    arrival: float  # hours
    n_blocks: int
    epsilon: float


def make_pipelines(config: MicroConfig, seed: int) -> list[Pipeline]:
    """GENERATED: Poisson arrivals over [0, hours); blocks and epsilon drawn independently (mice or elephant)."""
    rng = np.random.default_rng(seed)
    n = int(config.rate * config.hours * 1.5 + 50)
    times = np.cumsum(rng.exponential(1.0 / config.rate, size=n))
    times = times[times < config.hours]
    mice_b = rng.random(len(times)) < config.mice_blocks_share
    mice_e = rng.random(len(times)) < config.mice_epsilon_share
    return [
        Pipeline(
            i,
            float(t),
            config.mice_blocks if mb else config.elephant_blocks,
            config.mice_epsilon if me else config.elephant_epsilon,
        )
        for i, (t, mb, me) in enumerate(zip(times, mice_b, mice_e))
    ]


RDP_MECHANISMS = ("gaussian", "laplace", "dpsgd")


def demand_curves(filt, epsilons):
    """RDP mode (GENERATED): {(mechanism, eps): cost}. Three mechanism shapes whose best orders differ (a
    Gaussian, a Laplace, and a subsampled Gaussian of 100 steps at rate 0.01), each scaled so that its
    best-order share of a fresh block, min over alpha of curve(alpha) / capacity(alpha), equals ``eps``: the
    same size as the basic demand by DPF's measure, with heterogeneous curves (DPack's setting, §6)."""

    base = {
        "gaussian": curves.gaussian_curve(1.0, filt.orders),
        "laplace": curves.laplace_curve(1.0, filt.orders),
        "dpsgd": curves.dpsgd_curve(1.0, 0.01, 100, filt.orders),
    }
    out = {}
    for mech, curve in base.items():
        share = min(c / k for c, k in zip(curve, filt.capacity[1:]) if k > 0)
        for eps in epsilons:
            out[(mech, eps)] = filt.cost(curve=tuple(c * eps / share for c in curve))
    return out


def _name(i):
    return f"p{i:06d}"


def run(
    policy, config: MicroConfig = MicroConfig(), seed: int = 0, params: dict | None = None, full_scan: bool = False
) -> dict:
    """One policy on the workload: pipelines granted, their mean and median delay (arrival to grant, hours).

    Args:
        policy: a registered policy name or "fcfs".
        config: the workload.
        seed: the workload's seed (deterministic per (policy, config, seed, params)).
        params: the policy's parameters.
        full_scan: a queued policy's scheduler scans every pending demand (the reference behaviour).

    Returns:
        The policy's figures (JSON-ready).
    """
    started = time.perf_counter()
    sim = _Simulation(policy, config, seed, params, full_scan)
    end = config.hours + config.timeout
    while sim.events:
        now, _, _, kind, payload = heapq.heappop(sim.events)
        if now > end:
            break
        if kind == "block":
            sim.on_block(now, payload)
        elif kind == "arrive":
            sim.on_arrive(now, payload)
        else:  # timeout
            sim.on_timeout(now, payload)
    return _summary(sim, policy, config, started)


class _Simulation:
    """One run's state: the allocation model, the event queue, the blocks and who was granted when."""

    def __init__(self, policy, config: MicroConfig, seed: int, params: dict | None, full_scan: bool) -> None:
        self.config = config
        self.filt = filt = filters.make_filter(config.accounting, config.epsilon, config.delta)
        min_cost = filt.cost(epsilon=config.min_epsilon)
        self.rdp_costs = (
            demand_curves(filt, (config.mice_epsilon, config.elephant_epsilon))
            if config.accounting == Accounting.RDP
            else None
        )
        self.pol = pol = Fcfs() if str(policy) == "fcfs" else get_policy(policy, params)
        self.queued = pol.queued
        self.model = QueuedAllocation(filt, min_cost, pol) if self.queued else BlockAllocation(filt, min_cost, pol)
        if self.queued:
            self.model.full_scan = full_scan
        self.pipelines = make_pipelines(config, seed)
        self.blocks: list = []
        self.granted_at: dict = {}
        # events: (time h, kind order, seq, kind, payload); blocks before arrivals before timeouts at equal times
        events = [(0.0, 0, i, "block", i) for i in range(config.initial_blocks)]
        events += [
            (float(h), 0, config.initial_blocks + h, "block", config.initial_blocks + h)
            for h in range(1, config.hours + int(math.ceil(config.timeout)) + 1)
        ]
        events += [(p.arrival, 1, p.index, "arrive", p) for p in self.pipelines]
        heapq.heapify(events)
        self.events = events
        self.waiting: dict = {}  # name -> (blocks, cost), arrival order (reservation policies)

    def grant(self, name, now) -> None:
        self.granted_at[name] = now

    def try_waiting(self, now) -> None:
        """Reservation policies: FCFS over the waiting pipelines."""
        for name in list(self.waiting):
            _try_one(self.model, self.waiting, name, now, self.grant)

    def schedule(self, now) -> None:
        """A queued policy's scheduling point: grant what it admits."""
        for gname, _gbl, _gcost in self.model.schedule(now * HOUR):
            self.grant(gname, now)

    def on_block(self, now, index) -> None:
        block = f"b{index:05d}"
        self.blocks.append(block)
        if self.queued:
            self.model.add_block(block, now * HOUR)
            self.schedule(now)
        else:
            self.model.add_block(block, list(self.waiting))
            self.try_waiting(now)

    def on_arrive(self, now, p) -> None:
        name = _name(p.index)
        bl = self.blocks[-p.n_blocks :]
        cost = (
            self.filt.cost(epsilon=p.epsilon)
            if self.rdp_costs is None
            else self.rdp_costs[(RDP_MECHANISMS[p.index % len(RDP_MECHANISMS)], p.epsilon)]
        )
        if self.queued:
            self.model.arrive(now * HOUR)
            self.model.demand(name, bl, cost)
            self.schedule(now)
        else:
            self.waiting[name] = (bl, cost)
            _try_one(self.model, self.waiting, name, now, self.grant)
        heapq.heappush(self.events, (p.arrival + self.config.timeout, 2, p.index, "timeout", name))

    def on_timeout(self, now, name) -> None:
        if name in self.granted_at:
            return
        if self.queued:
            if name in self.model.pending:
                self.model.withdraw(name)
                self.schedule(now)
        elif name in self.waiting:
            del self.waiting[name]
            self.model.finish(name, self.waiting)
            self.try_waiting(now)


def _summary(sim: _Simulation, policy, config: MicroConfig, started: float) -> dict:
    """The figures of a finished simulation."""
    pipelines, granted_at, blocks = sim.pipelines, sim.granted_at, sim.blocks
    arrival = {_name(p.index): p.arrival for p in pipelines}
    delays = np.array([granted_at[n] - arrival[n] for n in granted_at]) if granted_at else np.array([])
    spent = [sim.filt.summary(sim.model.spent[b])[0] for b in blocks]  # epsilon spent (RDP: at the best order)
    kinds: dict = {}
    for p in pipelines:
        kind = ("mice" if p.n_blocks == config.mice_blocks else "elephant") + "-blocks"
        kinds.setdefault(kind, [0, 0])
        kinds[kind][0] += 1
        kinds[kind][1] += _name(p.index) in granted_at
    return {
        "policy": str(policy),
        "params": sim.pol.params(),
        "pipelines": len(pipelines),
        "granted": len(granted_at),
        "granted_share": len(granted_at) / len(pipelines) if pipelines else math.nan,
        "granted_by_kind": {k: {"pipelines": v[0], "granted": v[1]} for k, v in sorted(kinds.items())},
        "mean_delay_h": float(delays.mean()) if len(delays) else math.nan,
        "median_delay_h": float(np.median(delays)) if len(delays) else math.nan,
        "max_block_spent": max(spent) if spent else 0.0,
        "blocks": len(blocks),
        "seconds": round(time.perf_counter() - started, 2),
    }


def _try_one(model, waiting, name, now, grant):
    """A new arrival under a reservation policy: only its own demand can have become grantable."""
    bl, cost = waiting[name]
    if all(model.source(b, name, cost) is not None for b in bl):
        model.charge(bl, name, cost)
        del waiting[name]
        model.finish(name, waiting)
        grant(name, now)


def policies() -> tuple[str, ...]:
    """Every registered policy, then the FCFS baseline."""
    return tuple(policy_names()) + ("fcfs",)
