"""The queued allocation policies (DPF-N, DPF-T, DPack; privacy/allocation.py) and the simulator's comparison.

Randomized (fixed seeds: deterministic, no false failures): a random sequence of block arrivals, pipeline
arrivals, demands, withdrawals and scheduling points drives ``QueuedAllocation``; after each scheduling
point the grants are checked against an independent reference written here (its own unlock schedule,
dominant share and efficiency): no overspend, all-or-nothing, the policy's order, maximality, and the
skip-what-cannot-have-changed shortcut equal to a full scan.
"""

import math
import random

import pytest

from sage_tfx.privacy import filters
from sage_tfx.privacy.allocation import AllocationPolicy, DPack, DpfN, DpfT, QueuedAllocation, get_policy, policy_names
from sage_tfx.privacy.errors import LedgerError
from sage_tfx.privacy.vocabulary import Policy

QUEUED = [(Policy.DPF_N, {"n": 7}), (Policy.DPF_T, {"lifetime": 5 * 3600.0}), (Policy.DPACK, {"n": 7})]


def _ref_fraction(policy, arrivals, age):
    if policy.name == Policy.DPF_T:
        return min(1.0, max(0.0, age) / policy.lifetime)
    return min(1.0, arrivals / policy.n)


def _ref_key(filt, policy, cost, spents):
    """Independent: DPF's dominant share / DPack's sum of demand over remaining (best order for RDP)."""
    if filt.accounting == "rdp":

        def share(cap):
            return min((c / k if k > 0 else math.inf) for c, k in zip(cost[1:], cap[1:]))
    else:

        def share(cap):
            return max(((c / k if k > 0 else math.inf) if c > 0 else 0.0) for c, k in zip(cost, cap))

    if policy.name == Policy.DPACK:
        return sum(share([max(0.0, k - s) for k, s in zip(filt.capacity, sp)]) for sp in spents)
    return share(filt.capacity)


def _drive(seed, filt, name, params, steps=400):
    rng = random.Random(seed)
    policy = get_policy(name, params)
    min_cost = filt.cost(epsilon=filt.epsilon / 50)
    fast = QueuedAllocation(filt, min_cost, policy)
    full = QueuedAllocation(filt, min_cost, policy)
    full.full_scan = True
    shadow, arrivals, born = {}, {}, {}
    now, blocks, pipes, grants, pending_max = 0.0, 0, 0, 0, 0
    for _step in range(steps):
        op = rng.random()
        now += rng.uniform(0, 1200)
        if op < 0.15 or not shadow:
            block = f"b{blocks:03d}"
            blocks += 1
            for m in (fast, full):
                m.add_block(block, now)
            shadow[block], arrivals[block], born[block] = filt.zero(), 0, now
        elif op < 0.75:
            pipes += 1
            pipeline = f"p{pipes:03d}"
            for m in (fast, full):
                m.arrive(now)
            for b in fast.active:
                arrivals[b] += 1
            window = rng.randint(1, 4)
            chosen = rng.sample(sorted(shadow), min(window, len(shadow)))
            eps = filt.epsilon * rng.choice([0.01, 0.03, 0.1, 0.3]) * rng.uniform(0.5, 1.5)
            cost = filt.cost(epsilon=eps, delta=rng.choice([0.0, filt.delta / 100]))
            for m in (fast, full):
                m.demand(pipeline, chosen, cost)
        elif op < 0.8 and fast.pending:
            victim = rng.choice(sorted(fast.pending))
            for m in (fast, full):
                m.withdraw(victim)
        pending_before = {p: (e[0], e[1], e[2]) for p, e in fast.pending.items()}
        pending_max = max(pending_max, len(pending_before))
        spent_before = dict(shadow)
        got = fast.schedule(now)
        assert got == full.schedule(now)  # the shortcut grants exactly what a full scan grants
        keys = []
        for pipeline, gblocks, cost in got:
            assert pipeline in pending_before and pending_before[pipeline][:2] == (gblocks, cost)
            keys.append((_ref_key(filt, policy, cost, [shadow[b] for b in gblocks]), pending_before[pipeline][2]))
            for b in gblocks:
                unlocked = tuple(c * _ref_fraction(policy, arrivals[b], now - born[b]) for c in filt.capacity)
                assert filt.admits(shadow[b], cost), "overspend"
                assert filt.fits_share(shadow[b], cost, unlocked), "granted beyond the unlocked budget"
                shadow[b] = filters.add(shadow[b], cost)
            grants += 1
        # all-or-nothing: the model's spend is exactly the granted demands' costs, on all of their blocks
        assert fast.spent == shadow == full.spent
        if policy.name != Policy.DPACK:  # DPF: granted in increasing dominant share (static keys)
            assert keys == sorted(keys)
        # maximality: nothing still pending fits now
        for pipeline, e in fast.pending.items():
            assert not all(fast.fits(b, e[1], now) for b in e[0]), pipeline
        assert set(fast.pending) == set(pending_before) - {p for p, _, _ in got}
        del spent_before
    return grants, pending_max, len(fast.retired)


@pytest.mark.parametrize("name,params", QUEUED)
@pytest.mark.parametrize("accounting", ["basic", "rdp"])
@pytest.mark.parametrize("seed", [1, 2])
def test_queued_policy_invariants_on_random_workloads(seed, accounting, name, params):
    filt = filters.make_filter(accounting, 1.0, 1e-6)
    grants, pending_max, retired = _drive(seed, filt, name, params)
    # The workload exercised the queue: grants, demands left waiting, exhausted blocks.
    assert grants > 40 and pending_max >= 5 and retired >= 1


def test_dpf_serves_the_smallest_dominant_share_first():
    filt = filters.BasicFilter(1.0, 1e-6)
    m = QueuedAllocation(filt, filt.cost(epsilon=0.01), DpfN(n=2))
    m.add_block("a", 0)
    m.add_block("b", 0)
    m.demand("big", ["a", "b"], filt.cost(epsilon=0.3))
    m.demand("small", ["a"], filt.cost(epsilon=0.2))
    assert m.schedule(0) == []  # nothing unlocked before any arrival
    m.arrive(0)  # half of each block unlocks: 0.5
    m.demand("mid", ["b"], filt.cost(epsilon=0.25))
    got = [p for p, _, _ in m.schedule(0)]
    assert got == ["small", "mid"]  # 0.2 then 0.25; 0.3 would not fit on a after 0.2
    m.arrive(0)  # fully unlocked
    assert [p for p, _, _ in m.schedule(0)] == ["big"]
    assert m.spent["a"] == (0.5, 0.0) and m.spent["b"] == (0.55, 0.0)


def test_dpack_prefers_the_efficient_demand_where_dpf_prefers_the_fair_one():
    filt = filters.BasicFilter(1.0, 0.0)
    for policy, first in ((DpfN(n=1), "wide"), (DPack(n=1), "narrow")):
        m = QueuedAllocation(filt, filt.cost(epsilon=0.01), policy)
        for b in "abcd":
            m.add_block(b, 0)
        m.arrive(0)
        m.demand("wide", list("abcd"), filt.cost(epsilon=0.3))  # dominant share 0.3, DPack cost 1.2
        m.demand("narrow", ["a"], filt.cost(epsilon=0.4))  # dominant share 0.4, DPack cost 0.4
        order = sorted(m.pending, key=m.key)
        assert order[0] == first, policy.name


def test_unlock_schedules():
    filt = filters.BasicFilter(1.0, 1e-6)
    n = QueuedAllocation(filt, filt.cost(epsilon=0.01), DpfN(n=4))
    n.add_block("a", 0)
    for k in range(6):
        assert n.unlocked("a", 1e9) == (min(1.0, k / 4), min(1.0, k / 4) * 1e-6)
        n.arrive()
    n.add_block("late", 0)
    assert n.unlocked("late", 0) == (0.0, 0.0)  # arrivals before a block unlock nothing of it
    t = QueuedAllocation(filt, filt.cost(epsilon=0.01), DpfT(lifetime=100.0))
    t.add_block("a", 1000.0)
    assert [t.unlocked("a", 1000.0 + s)[0] for s in (-5, 0, 25, 100, 400)] == [0.0, 0.0, 0.25, 1.0, 1.0]


def test_registry_and_bad_parameters_named():
    assert set(policy_names()) >= {"conserve", "aggressive", "dpf-n", "dpf-t", "dpack"}
    assert {p.value for p in Policy} == {"conserve", "aggressive", "dpf-n", "dpf-t", "dpack"}
    assert get_policy("dpf-n").params() == {"n": DpfN.DEFAULT_N}
    assert get_policy("dpf-t", {"lifetime": 60}).params() == {"lifetime": 60.0}
    for name, params, needle in [
        ("dpf-n", {"n": 0}, "n=0"),
        ("dpf-n", {"n": 2.5}, "n=2.5"),
        ("dpf-n", {"n": True}, "n=True"),
        ("dpack", {"n": -3}, "n=-3"),
        ("dpf-t", {"lifetime": 0}, "lifetime=0"),
        ("dpf-t", {"lifetime": float("nan")}, "lifetime=nan"),
        ("dpf-t", {"lifetime": float("inf")}, "lifetime=inf"),
        ("dpf-n", {"lifetime": 5}, "it takes n"),
        ("conserve", {"n": 3}, "takes no"),
    ]:
        with pytest.raises(LedgerError, match=needle):
            get_policy(name, params)
    with pytest.raises(LedgerError, match="not a queued policy"):
        QueuedAllocation(filters.BasicFilter(1.0, 0.0), (0.01, 0.0), "conserve")
    assert issubclass(DpfN, AllocationPolicy) and DpfN.queued and not get_policy("conserve").queued


def test_a_demand_must_name_distinct_known_blocks():
    filt = filters.BasicFilter(1.0, 0.0)
    m = QueuedAllocation(filt, (0.01, 0.0), "dpf-n")
    m.add_block("a", 0)
    for blocks, needle in [([], "distinct"), (["a", "a"], "distinct"), (["zz"], "unknown")]:
        with pytest.raises(LedgerError, match=needle):
            m.demand("p", blocks, (0.1, 0.0))
    assert m.pending == {}


@pytest.mark.parametrize(
    "policy,bad,good,stored",
    [
        ("dpf-n", ["n=0"], ["n=50"], {"n": 50}),
        ("dpf-t", ["lifetime=-1"], ["lifetime=3600"], {"lifetime": 3600.0}),
        ("dpack", ["n=2.5"], [], {"n": 100}),
    ],
)
def test_the_ledger_runs_a_queued_policy_and_refuses_bad_parameters_before_writing(
    ledger_url, policy, bad, good, stored
):
    from sage_tfx.cli import main
    from sage_tfx.privacy import Ledger

    def init(params):
        return main(
            [
                "ledger",
                "init",
                "--db",
                ledger_url,
                "--stream",
                "s",
                "--epsilon",
                "1",
                "--delta",
                "1e-6",
                "--policy",
                policy,
                *[a for p in params for a in ("--policy-param", p)],
            ]
        )

    for params in (bad, ["bogus=1"], ["n"]):
        assert init(params) == 2, params
        if ledger_url.startswith("postgresql://"):
            from tests.conftest import raw_connection

            conn = raw_connection(ledger_url)
            cur = conn.cursor()
            cur.execute("SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'")
            assert cur.fetchall() in ([], ())
            conn.close()
        else:
            import os

            assert not os.path.exists(ledger_url)
    with pytest.raises(LedgerError, match=f"policy '{policy}' parameter"):
        Ledger.check_stream_args(
            "s",
            1.0,
            1e-6,
            policy=policy,
            policy_params=dict(
                [(bad[0].split("=")[0], float(bad[0].split("=")[1]) if "." in bad[0] else int(bad[0].split("=")[1]))]
            ),
        )
    with pytest.raises(LedgerError, match="takes no parameters"):
        Ledger.check_stream_args("s", 1.0, 1e-6, policy="conserve", policy_params={"n": 5})
    # the queued policy is accepted and its parameters (defaults written down) stored with the stream
    assert init(good) == 0
    with Ledger.open(ledger_url) as ledger:
        s = ledger.stream("s")
        assert (s.policy, s.policy_params, s.rules().params()) == (policy, stored, stored)
        assert ledger.audit().ok


# ----------------------------------------------------------------------------------------- the simulator
def test_fig8_queued_strategies_stay_within_budget():
    from sage_tfx.simulate.engine import simulate

    for strategy in ("block-dpf-n", "block-dpf-t", "block-dpack"):
        seen = {}
        result = simulate(
            strategy,
            1.0,
            hours=40,
            warmup=8,
            drain=16,
            seed=3,
            inspect=lambda sim: seen.update(spent=dict(sim.model.spent), filt=sim.filt),  # noqa: B023
            policy_params={"block-dpf-t": {"lifetime": 4 * 3600.0}, "block-dpf-n": {"n": 4}, "block-dpack": {"n": 4}},
        )
        s = result.summary()
        assert s["pipelines"] > 20 and s["released"] > 0.5, (strategy, s)
        assert all(seen["filt"].admits(sp, seen["filt"].zero()) for sp in seen["spent"].values())
        assert max(sp[0] for sp in seen["spent"].values()) <= 1.0


def test_compare_policies_on_a_tiny_run(tmp_path):
    from sage_tfx.simulate import compare, microbench
    from sage_tfx.simulate.workload import SimConfig

    micro = microbench.MicroConfig(rate=16.0, hours=6, timeout=4.0)
    result = compare.compare(
        fig8_rate=1.0,
        fig8_n=4,
        micro_n=20,
        hours=30,
        warmup=6,
        drain=12,
        seed=1,
        config=SimConfig(),
        micro_config=micro,
    )
    assert [r["policy"] for r in result["fig8"]["results"]] == list(policy_names())
    assert [r["policy"] for r in result["microbenchmark"]["results"]] == list(policy_names()) + ["fcfs"]
    for r in result["microbenchmark"]["results"]:
        assert 0 <= r["granted"] <= r["pipelines"] and r["max_block_spent"] <= 1.0 + 1e-12
    for r in result["fig8"]["results"]:
        assert 0 <= r["released"] <= r["pipelines"]
    path = compare.plot(result, str(tmp_path / "p.png"))
    assert open(path, "rb").read(8) == b"\x89PNG\r\n\x1a\n"


def test_dpf_grants_more_than_fcfs_under_contention():
    """PrivateKube's finding (OSDI'21 §6.2) at its contention point (128 arrivals per block), shortened to 8 h."""
    from sage_tfx.simulate import microbench

    config = microbench.MicroConfig(rate=128.0, hours=8, timeout=12.0)
    fcfs = microbench.run("fcfs", config, seed=0)
    dpf = microbench.run("dpf-n", config, seed=0, params={"n": 400})
    assert dpf["granted"] > 1.3 * fcfs["granted"], (dpf["granted"], fcfs["granted"])


def test_microbench_conserve_and_aggressive_grant_the_same_fixed_demands():
    from sage_tfx.simulate import microbench

    config = microbench.MicroConfig(rate=16.0, hours=6, timeout=4.0)
    a, b = microbench.run("conserve", config, seed=4), microbench.run("aggressive", config, seed=4)
    assert a["granted"] > 0 and {k: v for k, v in a.items() if k not in ("policy", "seconds")} == {
        k: v for k, v in b.items() if k not in ("policy", "seconds")
    }


def test_microbench_rdp_demands_stay_within_the_filters():
    from sage_tfx.privacy import filters as f
    from sage_tfx.simulate import microbench

    config = microbench.MicroConfig(rate=32.0, hours=4, timeout=3.0, accounting="rdp")
    filt = f.RdpFilter(1.0, 1e-6)
    costs = microbench.demand_curves(filt, (0.01, 0.1))
    best = {
        k: min((i for i in range(1, len(c)) if filt.capacity[i] > 0), key=lambda i: c[i] / filt.capacity[i])
        for k, c in costs.items()
    }
    assert len({best[(m, 0.1)] for m in microbench.RDP_MECHANISMS}) > 1  # heterogeneous best orders
    for policy in ("fcfs", "dpf-n", "dpack"):
        r = microbench.run(policy, config, seed=1, params=None if policy == "fcfs" else {"n": 50})
        assert r["granted"] > 10 and r["max_block_spent"] <= 1.0


def test_microbench_shortcut_equals_full_scan():
    from sage_tfx.simulate import microbench

    config = microbench.MicroConfig(rate=32.0, hours=5, timeout=3.0)
    for policy, params in (("dpf-n", {"n": 50}), ("dpf-t", {"lifetime": 3000.0}), ("dpack", {"n": 50})):
        a = microbench.run(policy, config, seed=2, params=params)
        b = microbench.run(policy, config, seed=2, params=params, full_scan=True)
        assert (a["granted"], a["mean_delay_h"]) == (b["granted"], b["mean_delay_h"])


def test_cli_compare_refuses_bad_n_before_running(capsys):
    from sage_tfx.cli import main

    assert main(["simulate", "--compare-policies", "--fig8-n", "0"]) == 2
    assert "n=0" in capsys.readouterr().err
    assert main(["simulate", "--compare-policies", "--micro-rate", "-1"]) == 2
    assert "--micro-rate -1" in capsys.readouterr().err


def test_dpsgd_calibration_is_private_and_tight():
    """strategies.dpsgd_curve_for_epsilon (dp_accounting's calibrate_dp_mechanism): the curve charged is
    (eps, delta_g)-DP at the stream's orders plus the calibration orders, and within 1% of eps (tight)."""
    from dp_accounting.rdp import rdp_privacy_accountant as rdp

    from sage_tfx.privacy import curves
    from sage_tfx.simulate.strategies import _CALIBRATION_ORDERS, dpsgd_curve_for_epsilon
    from sage_tfx.simulate.workload import SimConfig

    config = SimConfig()
    for eps in (0.25, 0.8):
        curve = dpsgd_curve_for_epsilon(eps, 16000, config, curves.DEFAULT_ORDERS)
        got = rdp.compute_epsilon(list(curves.DEFAULT_ORDERS), list(curve), config.delta)[0]
        assert got >= 0.9 * eps  # at the stream's orders alone (the high orders certify small eps)
        assert len(curve) == len(curves.DEFAULT_ORDERS) and all(v > 0 for v in curve)
        assert _CALIBRATION_ORDERS[0] > max(curves.DEFAULT_ORDERS)
