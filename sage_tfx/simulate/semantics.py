"""Pipelines granted under each privacy semantics: event, user-time and user DP (PrivateKube's macrobenchmark shape).

The Fig. 8 workload on a stream whose rows belong to ``UnitConfig.units`` units; each pipeline asks a fixed
``pipeline_epsilon`` of the blocks holding the records it needs, first come first served, and retries after each
new block until ``timeout_h``. Event DP: hourly blocks at epsilon per row; user-time DP: hourly blocks, each unit
bounded to K rows a block, stages at epsilon / K (``split.per_row_budget``); user DP: ``shards`` blocks registered
once whose budget never renews. Contract: the real ledger (a temporary SQLite file) checks every charge.

The semantics table and the cost model: docs/simulation.md ("Privacy semantics").
"""

from __future__ import annotations

import math
import shutil
import tempfile
from dataclasses import asdict, dataclass

from sage_tfx.plots import label_bars, pyplot, save_figure
from sage_tfx.privacy import BudgetRefused, Ledger

from .workload import SimConfig, make_workload

SEMANTICS = ("event", "user-time", "user")
STREAM, SLACK = "s", 1e-9


@dataclass(frozen=True)
class UnitConfig:
    """The units of the stream and what each pipeline asks (docs/simulation.md)."""

    units: int = 200_000  # units (riders, planes) making the stream's rows
    max_rows: int = 3  # K: a unit's rows kept per block (user-time) or for all time (user DP)
    shards: int = 64  # user DP: blocks of units
    pipeline_epsilon: float = 0.1  # what every pipeline asks of each block it reads
    timeout_h: int = 24  # a pipeline not granted within this many hours of its arrival gives up

    def __post_init__(self) -> None:
        for name in ("units", "max_rows", "shards", "timeout_h"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r} must be an integer >= 1")
        if not (isinstance(self.pipeline_epsilon, (int, float)) and 0 < self.pipeline_epsilon < math.inf):
            raise ValueError(f"pipeline_epsilon={self.pipeline_epsilon!r} must be a finite number > 0")


def kept_per_unit(lam: float, k: int) -> float:
    """E[min(X, k)] for X ~ Poisson(``lam``): a unit's rows kept when bounded to ``k`` (exact, k terms)."""
    p, below = math.exp(-lam), 0.0
    for j in range(k):  # sum_{j<k} (k - j) P[X = j]
        below += (k - j) * p
        p *= lam / (j + 1)
    return k - below


def block_rows(semantics: str, config: SimConfig, units: UnitConfig, hours: int) -> tuple[int, int]:
    """(blocks registered at the start, rows of each block) of a semantics; event and user-time add one block of
    that many rows every hour, user DP registers all its shards at the start."""
    lam = config.rows_per_hour / units.units
    if semantics == "event":
        return 0, config.rows_per_hour
    if semantics == "user-time":
        return 0, int(units.units * kept_per_unit(lam, units.max_rows))
    return units.shards, int(units.units * kept_per_unit(lam * hours, units.max_rows) / units.shards)


def run_semantics(
    semantics: str,
    rate: float,
    hours: int,
    seed: int = 0,
    config: SimConfig = SimConfig(),
    units: UnitConfig = UnitConfig(),
) -> dict:
    """One semantics at one arrival rate: the pipelines arrived in [0, hours) and how many the ledger granted."""
    if semantics not in SEMANTICS:
        raise ValueError(f"semantics {semantics!r} is unknown: use one of {', '.join(SEMANTICS)}")
    specs = make_workload(rate, hours, seed, config)
    per_row = units.pipeline_epsilon / (1 if semantics == "event" else units.max_rows)
    start_blocks, rows = block_rows(semantics, config, units, hours)
    folder = tempfile.mkdtemp(prefix="sage-sem-")
    left: dict[str, float] = {}
    try:
        with Ledger.open(f"{folder}/ledger.db", create=True) as ledger:
            ledger.create_stream(STREAM, config.epsilon, config.delta)
            for i in range(start_blocks):
                _add_block(ledger, left, f"shard-{i:04d}", rows, config)
            granted, waiting, i = [], [], 0
            for hour in range(1, hours + units.timeout_h + 1):
                if semantics != "user":
                    _add_block(ledger, left, f"h{hour:05d}", rows, config)
                while i < len(specs) and specs[i].arrival < hour:
                    waiting.append(specs[i])
                    i += 1
                need = {s.index: config.n_required(s.n_np, per_row) for s in waiting}
                waiting = [
                    s
                    for s in waiting
                    if hour - s.arrival <= units.timeout_h
                    and not _try(ledger, left, s, need[s.index], rows, units, granted)
                ]
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    arrived = len(specs)
    return {
        "semantics": semantics,
        "rate": rate,
        "hours": hours,
        "pipelines": arrived,
        "granted": len(granted),
        "granted_fraction": len(granted) / arrived if arrived else math.nan,
        "rows_per_block": rows,
        "per_row_epsilon": per_row,
        "units": asdict(units),
    }


def _add_block(ledger: Ledger, left: dict, block: str, rows: int, config: SimConfig) -> None:
    ledger.add_block(STREAM, block, rows=rows)
    left[block] = config.epsilon


def _try(ledger, left, spec, need, rows, units, granted) -> bool:
    """Grant ``spec`` the fewest blocks with budget left (newest first; user DP: most budget left first) that hold
    ``need`` records; False when there are not enough."""
    eps = units.pipeline_epsilon
    usable = [b for b in reversed(left) if left[b] >= eps - SLACK]
    if len(left) and next(iter(left)).startswith("shard"):
        usable.sort(key=lambda b: -left[b])
    count = math.ceil(need / rows) if rows else math.inf
    if count > len(usable):
        return False
    chosen = usable[:count]
    try:
        ledger.request(spec.name, STREAM, blocks=chosen, epsilon=eps)
    except BudgetRefused:  # the mirror and the ledger disagree: the ledger is right
        return False
    for b in chosen:
        left[b] -= eps
    granted.append(spec.index)
    return True


def compare_semantics(
    rates: list[float], hours: int, seed: int = 0, config: SimConfig = SimConfig(), units: UnitConfig = UnitConfig()
) -> list[dict]:
    """``run_semantics`` for every semantics at every rate."""
    return [run_semantics(s, r, hours, seed, config, units) for r in rates for s in SEMANTICS]


def plot_semantics(rows: list[dict], path: str) -> str:
    """Pipelines granted per semantics (bars, one group per rate), the arrivals as a dashed line."""
    plt = pyplot()
    rates = sorted({r["rate"] for r in rows})
    fig, ax = plt.subplots(figsize=(7, 4.2))
    width = 0.8 / len(SEMANTICS)
    for j, semantics in enumerate(SEMANTICS):
        values = [
            next(r["granted"] for r in rows if r["rate"] == rate and r["semantics"] == semantics) for rate in rates
        ]
        bars = ax.bar([i + j * width for i in range(len(rates))], values, width, label=f"{semantics} DP")
        label_bars(ax, bars, [str(value) for value in values], fontsize=8)
    for i, rate in enumerate(rates):
        total = next(r["pipelines"] for r in rows if r["rate"] == rate)
        ax.hlines(total, i - width / 2, i + (len(SEMANTICS) - 0.5) * width, colors="grey", linestyles="--")
    unit = rows[0]["units"]
    ax.set_xticks([i + width for i in range(len(rates))], [f"{r:g}/h" for r in rates])
    ax.set_xlabel("pipeline arrivals per hour (dashed: pipelines arrived)")
    ax.set_ylabel("pipelines granted")
    ax.set_title(
        f"Pipelines granted per privacy semantics ({unit['units']} units, K = {unit['max_rows']}, "
        f"eps {unit['pipeline_epsilon']:g} per pipeline)",
        fontsize=9,
    )
    ax.legend(fontsize=8)
    save_figure(fig, path, dpi=120)
    return path
