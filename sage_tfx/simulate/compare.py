"""Every registered allocation policy on two workloads, in one run (`sage simulate --compare-policies`).

* **fig8**: the paper's Fig. 8 workload (``workload.py``, GENERATED) at one arrival rate, through the
  engine of ``engine.py``: Conserve and Aggressive as the strategies ``block-conserve`` and
  ``block-aggressive`` (the real ledger), DPF-N, DPF-T and DPack as ``block-dpf-n``/``-dpf-t``/``-dpack``
  (``QueuedAllocation`` in memory). Reported: pipelines of the measured cohort released (ACCEPTed) and
  their mean release time (engine's definition: the unreleased counted at their wait so far).
* **microbenchmark**: the GENERATED mice/elephants workload of ``microbench.py`` (after PrivateKube's),
  every registered policy plus PrivateKube's FCFS baseline. Reported: pipelines granted, mean delay of
  the granted ones.

One unlocking parameter per workload, ``n`` (arrivals that unlock a block for DPF-N and DPack); DPF-T's
lifetime is the time ``n`` arrivals take on average, ``n / rate`` hours (PrivateKube's T = N x mean
inter-arrival time), so the three queued policies unlock at the same average pace.
"""

from __future__ import annotations

import math
import sys
import time

from sage_tfx.plots import label_bars, pyplot, save_figure
from sage_tfx.privacy.allocation import get_policy, policy_names
from sage_tfx.privacy.vocabulary import Policy

from . import microbench
from .engine import simulate
from .strategies import POLICY_STRATEGIES
from .workload import SimConfig

HOUR = 3600.0


def queued_params(n: int, rate: float) -> dict:
    """{policy: params} for the queued policies: n arrivals (DPF-N, DPack), n / rate hours (DPF-T), in seconds."""
    return {Policy.DPF_N: {"n": n}, Policy.DPF_T: {"lifetime": n / rate * HOUR}, Policy.DPACK: {"n": n}}


def _log(line):
    print(line, file=sys.stderr, flush=True)


def fig8(rate: float, n: int, *, hours=240, warmup=48, drain=96, seed=0, config=SimConfig()) -> dict:
    params = queued_params(n, rate)
    for policy, p in params.items():
        get_policy(policy, p)  # bad n refused before anything runs
    rows = []
    for policy in policy_names():
        strategy = POLICY_STRATEGIES.get(policy)
        if strategy is None:
            continue
        policy_params = {strategy: params[policy]} if policy in params else None
        s = simulate(
            strategy,
            rate,
            hours=hours,
            seed=seed,
            config=config,
            warmup=warmup,
            drain=drain,
            policy_params=policy_params,
        ).summary()
        row = {
            "policy": str(policy),
            "strategy": strategy,
            "params": params.get(policy, {}),
            "pipelines": s["pipelines"],
            "released": int(round(s["released"] * s["pipelines"])),
            "released_share": s["released"],
            "mean_release_h": s["mean_release_h"],
            "median_release_h": s["median_release_h"],
            "mean_is_lower_bound": s["mean_is_lower_bound"],
            "overloaded_at_h": s.get("overloaded_at_h"),
            "seconds": s["seconds"],
        }
        _log(
            f"  fig8 {policy:10s} released {row['released']}/{row['pipelines']}, mean release "
            f"{'>=' if row['mean_is_lower_bound'] else ''}{row['mean_release_h']:.2f} h ({row['seconds']:.0f} s)"
        )
        rows.append(row)
    return {
        "rate": rate,
        "n": n,
        "hours": hours,
        "warmup": warmup,
        "drain": drain,
        "seed": seed,
        "config": config.to_dict(),
        "results": rows,
    }


def micro(n: int, *, config=microbench.MicroConfig(), seed=0) -> dict:
    params = queued_params(n, config.rate)
    for policy, p in params.items():
        get_policy(policy, p)
    rows = []
    for policy in microbench.policies():
        if policy == Policy.AGGRESSIVE and rows and rows[0]["policy"] == Policy.CONSERVE:
            # Conserve and Aggressive differ only in plan_epsilon, which a fixed demand never asks: the same
            # grants by construction (tests/simulate/test_allocation_policies.py runs both on a small workload).
            r = dict(rows[0], policy=str(policy), note="same as conserve: demands are fixed (not re-run)")
            rows.append(r)
            _log(f"  microbenchmark {policy:10s} = conserve (fixed demands)")
            continue
        r = microbench.run(policy, config, seed, params.get(policy))
        _log(
            f"  microbenchmark {policy:10s} granted {r['granted']}/{r['pipelines']}, mean delay "
            f"{r['mean_delay_h']:.2f} h ({r['seconds']:.0f} s)"
        )
        rows.append(r)
    return {"n": n, "seed": seed, "config": config.to_dict(), "results": rows}


def compare(
    *,
    fig8_rate=1.5,
    fig8_n=16,
    micro_n=400,
    hours=240,
    warmup=48,
    drain=96,
    seed=0,
    config=SimConfig(),
    micro_config=microbench.MicroConfig(),
) -> dict:
    started = time.perf_counter()
    _log(f"fig8 workload at {fig8_rate}/h (n = {fig8_n}):")
    a = fig8(fig8_rate, fig8_n, hours=hours, warmup=warmup, drain=drain, seed=seed, config=config)
    _log(f"microbenchmark at {micro_config.rate}/h (n = {micro_n}):")
    b = micro(micro_n, config=micro_config, seed=seed)
    return {"fig8": a, "microbenchmark": b, "seconds": round(time.perf_counter() - started, 1)}


def _mean_label(r: dict, mean: str) -> str:
    """Policy row ``r``'s bar label: its mean release/delay ``r[mean]`` (">=" if a lower bound; overload noted)."""
    m = r[mean]
    text = "n/a" if not (isinstance(m, float) and math.isfinite(m)) else f"{m:.2g} h"
    if r.get("mean_is_lower_bound"):
        text = ">=" + text
    if r.get("overloaded_at_h") is not None:
        text += f"\n(overloaded,\n{r['pipelines']} measured)"
    return text


def plot(result: dict, path: str) -> str:
    """Two panels (one per workload): pipelines granted per policy (bars), mean release/delay written above."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.2))
    panels = [
        (
            axes[0],
            result["fig8"]["results"],
            "released",
            "mean_release_h",
            "pipelines released (cohort)",
            f"Fig. 8 workload, {result['fig8']['rate']:g} pipelines/h (n = {result['fig8']['n']})",
        ),
        (
            axes[1],
            result["microbenchmark"]["results"],
            "granted",
            "mean_delay_h",
            "pipelines granted",
            f"mice/elephants (GENERATED), {result['microbenchmark']['config']['rate']:g}/h "
            f"(n = {result['microbenchmark']['n']})",
        ),
    ]
    for ax, rows, count, mean, ylabel, title in panels:
        names = [r["policy"] for r in rows]
        values = [r[count] for r in rows]
        bars = ax.bar(names, values, color=["#888888" if n == "fcfs" else "#4477aa" for n in names])
        label_bars(ax, bars, [_mean_label(r, mean) for r in rows], fontsize=8)
        total = max((r["pipelines"] for r in rows), default=0)
        ax.axhline(total, color="grey", linestyle="--", linewidth=1)
        ax.set_ylabel(ylabel)
        ax.set_title(title, fontsize=9)
        ax.tick_params(axis="x", labelsize=8)
    fig.suptitle(
        "Allocation policies: pipelines granted (bars; dashed: all pipelines) and mean release time (labels)",
        fontsize=9,
    )
    save_figure(fig, path, dpi=120)
    return path
