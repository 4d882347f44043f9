"""Sweeps over arrival rates, the highest sustainable rate per strategy, and the Fig. 8 plot."""

import math
import sys

from sage_tfx.plots import pyplot, save_figure

from .engine import simulate
from .strategies import LABELS

SLA_HOURS = 24.0


def _log(line):
    print(line, file=sys.stderr, flush=True)


def holds(summary, within=SLA_HOURS, released=0.95):
    """A rate is sustained when the run did not overload, at least 95% of the cohort was released, and the
    cohort's mean release (unreleased ones counted at their wait so far) is under ``within`` hours."""
    return (
        summary.get("overloaded_at_h") is None
        and summary["released"] >= released
        and summary["mean_release_h"] < within
    )


def run_one(strategy, rate, hours, seed, config, warmup, drain):
    summary = simulate(strategy, rate, hours=hours, seed=seed, config=config, warmup=warmup, drain=drain).summary()
    flag = "" if summary.get("overloaded_at_h") is None else f" OVERLOADED at h{summary['overloaded_at_h']}"
    bound = ">=" if summary["mean_is_lower_bound"] else ""
    _log(
        f"  {strategy:20s} rate {rate:<6g} mean {bound}{summary['mean_release_h']:.1f} h, median "
        f"{summary['median_release_h']:.1f} h, p90 {summary['p90_release_h']:.1f} h, released "
        f"{summary['released']:.0%} of {summary['pipelines']}{flag} ({summary['seconds']:.0f} s)"
    )
    return summary


def sweep(strategies, rates, hours, seed, config, warmup, drain):
    rows = []
    for rate in rates:
        _log(f"rate {rate}/h:")
        for strategy in strategies:
            rows.append(run_one(strategy, rate, hours, seed, config, warmup, drain))
    return rows


def max_sustainable_rate(strategy, rows, hours, seed, config, warmup, drain, steps=3, ceiling=4.0):
    """Highest rate with mean release under 24 h: bracket from the sweep's rows, then bisect ``steps`` times.

    Returns (rate or None, bracket, runs). None: not even the lowest rate tried holds.
    """
    mine = sorted((r for r in rows if r["strategy"] == strategy), key=lambda r: r["rate"])
    good = [r["rate"] for r in mine if holds(r)]
    runs = []
    if not good:
        return None, (0.0, mine[0]["rate"] if mine else None), runs
    lo = max(good)
    above = [r["rate"] for r in mine if r["rate"] > lo and not holds(r)]
    hi = min(above) if above else None
    while hi is None:  # every rate tried holds: double until one does not
        rate = lo * 2
        if rate > ceiling:
            return lo, (lo, None), runs
        summary = run_one(strategy, rate, hours, seed, config, warmup, drain)
        runs.append(summary)
        lo, hi = (rate, None) if holds(summary) else (lo, rate)
    for _ in range(steps):
        rate = round((lo + hi) / 2, 4)
        summary = run_one(strategy, rate, hours, seed, config, warmup, drain)
        runs.append(summary)
        lo, hi = (rate, hi) if holds(summary) else (lo, rate)
    return lo, (lo, hi), runs


def plot(rows, path, title, ceiling_hours=168.0):
    """Mean release time vs arrival rate per strategy (log y), overloaded runs drawn at the ceiling."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    strategies = list(dict.fromkeys(r["strategy"] for r in rows))
    markers = dict(zip(LABELS, "vsoD^"))
    for strategy in strategies:
        mine = sorted((r for r in rows if r["strategy"] == strategy), key=lambda r: r["rate"])
        xs = [r["rate"] for r in mine]
        ys = [
            min(ceiling_hours, max(0.1, r["mean_release_h"])) if r.get("overloaded_at_h") is None else ceiling_hours
            for r in mine
        ]
        ax.plot(xs, ys, marker=markers.get(strategy, "o"), label=LABELS.get(strategy, strategy))
    ax.text(min(r["rate"] for r in rows), SLA_HOURS * 1.08, "one day", color="grey", fontsize=8)
    return _save(fig, ax, path, title, "mean model release time (hours)", ceiling_hours)


def _save(fig, ax, path, title, ylabel, ceiling_hours):
    """The release-time axes (log hours up to the ceiling, the one-day line), saved to ``path``."""
    ax.axhline(SLA_HOURS, color="grey", linestyle="--", linewidth=1)
    ax.set_yscale("log")
    ax.set_ylim(0.1, ceiling_hours * 1.3)
    ax.set_xlabel("pipeline arrivals per hour")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(True, which="both", alpha=0.3)
    save_figure(fig, path, dpi=120)
    return path


def release_hours(summary, ceiling_hours=168.0):
    """A run's mean release time for the spread: an overloaded run counts at the plot's ceiling."""
    if summary.get("overloaded_at_h") is not None:
        return ceiling_hours
    return min(ceiling_hours, summary["mean_release_h"])


def spread(rows_by_seed, ceiling_hours=168.0):
    """Per (strategy, rate), over the seeds: each seed's mean release time (``release_hours``), their median,
    min and max, and how many seeds overloaded or left pipelines unreleased (the mean is then a lower bound)."""
    cells = {}
    for seed, rows in rows_by_seed.items():
        for r in rows:
            cell = cells.setdefault(
                (r["strategy"], r["rate"]),
                {
                    "strategy": r["strategy"],
                    "rate": r["rate"],
                    "seeds": [],
                    "mean_release_h": [],
                    "overloaded": 0,
                    "lower_bound": 0,
                },
            )
            cell["seeds"].append(seed)
            cell["mean_release_h"].append(release_hours(r, ceiling_hours))
            cell["overloaded"] += r.get("overloaded_at_h") is not None
            cell["lower_bound"] += bool(r["mean_is_lower_bound"])
    for cell in cells.values():
        values = sorted(cell["mean_release_h"])
        cell.update(
            median_h=values[len(values) // 2]
            if len(values) % 2
            else (values[len(values) // 2 - 1] + values[len(values) // 2]) / 2,
            min_h=values[0],
            max_h=values[-1],
        )
    return list(cells.values())


def plot_spread(cells, path, title, ceiling_hours=168.0):
    """Fig. 8 with its spread: the median over seeds of the mean release time per strategy and rate, with a bar
    from the seeds' min to max (overloaded runs at the ceiling)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    strategies = list(dict.fromkeys(c["strategy"] for c in cells))
    markers = dict(zip(LABELS, "vsoD^"))
    for i, strategy in enumerate(strategies):
        mine = sorted((c for c in cells if c["strategy"] == strategy), key=lambda c: c["rate"])
        xs = [c["rate"] * (1 + 0.015 * (i - len(strategies) / 2)) for c in mine]  # dodge the bars
        ys = [max(0.1, c["median_h"]) for c in mine]
        low = [y - max(0.1, c["min_h"]) for y, c in zip(ys, mine)]
        high = [max(0.1, c["max_h"]) - y for y, c in zip(ys, mine)]
        ax.errorbar(
            xs, ys, yerr=[low, high], marker=markers.get(strategy, "o"), capsize=3, label=LABELS.get(strategy, strategy)
        )
    return _save(fig, ax, path, title, "mean release time (h): median, min-max over seeds", ceiling_hours)


def finite_or_none(value):
    return value if isinstance(value, (int, float)) and math.isfinite(value) else None
