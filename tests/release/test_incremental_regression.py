"""PrivIncReg1 (sage_tfx.release.incremental_regression): the tree's noise statistics, its O(log T) memory, the
ledger charge (== the whole-horizon bound per block, before the read; audit OK), refusals before any charge, a
utility sanity check with fixed seeds, and a tiny run of `sage bench incremental-regression`."""

import argparse
import json
import math
import pickle

import numpy as np
import pytest

from sage_tfx.privacy.digests import bound_to_data
from sage_tfx.privacy.errors import SageError
from sage_tfx.release.incremental_regression import (
    HorizonExhausted,
    IncrementalRegression,
    IncrementalRegressionError,
    IncrementalRegressionParams,
    TreeRegressor,
    projected_gradient,
    tree_levels,
)
from tests.helpers.ledgers import daily_ledger

DIM = 3
THETA = np.array([0.5, -0.3, 0.2])


def params(**kw):
    base = dict(horizon=8, epsilon=1.0, delta=1e-6, bound_x=1.0, bound_y=1.0, radius=2.0, iterations=100)
    return IncrementalRegressionParams(**{**base, **kw})


def block_rows(i, rows=50):
    rng = np.random.default_rng(1000 + i)
    x = rng.normal(size=(rows, DIM)) / 2.0
    return x, x @ THETA + 0.05 * rng.normal(size=rows)


def make_ledger(tmp_path, blocks=8, accounting="basic"):
    return daily_ledger(tmp_path, blocks, epsilon=5.0, delta=1e-4, rows=50, ids="b{}", accounting=accounting)


def snapshot(ledger):
    return (
        {b.id: b.spent for b in ledger.blocks("s")},
        [g.id for g in ledger.grants()],
        [r.grant_id for r in ledger.releases()],
    )


def test_levels_are_floor_log2_plus_one():
    assert [tree_levels(t) for t in (1, 2, 3, 4, 7, 8, 255, 256)] == [1, 2, 2, 3, 3, 4, 8, 9]
    assert all(tree_levels(t) == math.floor(math.log2(t)) + 1 for t in range(1, 1000))


def test_memory_is_popcount_and_at_most_log_levels():
    tree = TreeRegressor(params(horizon=100), DIM)
    for t in range(1, 101):
        tree.add_leaf(np.zeros(tree.cells), rng=t)
        assert tree.stored_nodes == bin(t).count("1") <= tree_levels(100)
    assert max(tree._nodes) < tree_levels(100)


def test_tree_noise_statistics():
    """All-zero leaves: every released node is pure noise of std c (B_x = B_y = 1). 256 nodes x 9 cells = 2304
    draws; the sample variance's relative error has sd ~ sqrt(2/2304) = 0.029, so the 0.2 band is ~7 sd and the
    mean's 6/sqrt(n) band 6 sd: false-failure rate over seeds <= 1e-6 (normal tails). The prefix sums at t carry
    popcount(t) nodes: their pooled variance per node checks the same c."""
    p = params(horizon=256)
    tree = TreeRegressor(p, 2)
    c = p.noise_multiplier
    draws, prefix_sq, prefix_nodes = [], 0.0, 0
    for t in range(1, 257):
        tree.add_leaf(np.zeros(tree.cells), rng=77_000 + t)
        level = (t & -t).bit_length() - 1
        draws.append(tree._nodes[level].noisy / c)
        q_matrix, q_vector = tree.noisy_prefix()
        prefix_sq += float(np.sum(np.triu(q_matrix) ** 2) + np.sum(q_vector**2)) / c**2
        prefix_nodes += bin(t).count("1") * tree.cells
    z = np.concatenate(draws)
    assert z.size == 256 * tree.cells
    assert abs(z.mean()) < 6 / math.sqrt(z.size)
    assert abs(z.var() - 1.0) < 0.2
    assert abs(prefix_sq / prefix_nodes - 1.0) < 0.25  # correlated across t: a looser band, still ~5 sd


def test_noise_multiplier_meets_the_budget_by_rdp():
    import dp_accounting
    from dp_accounting import rdp

    p = params(horizon=64)
    acc = rdp.RdpAccountant()
    acc.compose(p.dp_event)
    assert acc.get_epsilon(p.delta) <= p.epsilon + 1e-6
    loose = rdp.RdpAccountant()
    loose.compose(
        dp_accounting.ComposedDpEvent(
            [dp_accounting.GaussianDpEvent(noise_multiplier=0.98 * p.noise_multiplier)] * (2 * p.levels)
        )
    )
    assert loose.get_epsilon(p.delta) > p.epsilon  # the smallest c, not just a feasible one
    assert params(horizon=256).noise_multiplier > params(horizon=8).noise_multiplier  # more levels, more noise


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(horizon=0), "horizon=0"),
        (dict(horizon=2.5), "horizon=2.5"),
        (dict(horizon=True), "horizon=True"),
        (dict(epsilon=-1.0), "epsilon=-1.0"),
        (dict(epsilon=float("nan")), "epsilon=nan"),
        (dict(delta=0.0), "delta=0.0"),
        (dict(delta=1.0), "delta=1.0"),
        (dict(bound_x=0), "bound_x=0"),
        (dict(bound_y="a"), "bound_y='a'"),
        (dict(radius=float("inf")), "radius=inf"),
        (dict(iterations=0), "iterations=0"),
    ],
)
def test_bad_parameters_name_the_value(kw, message):
    with pytest.raises(IncrementalRegressionError, match=message) as info:
        params(**kw)
    assert isinstance(info.value, SageError) and isinstance(info.value, ValueError)
    again = pickle.loads(pickle.dumps(info.value))
    assert type(again) is IncrementalRegressionError and str(again) == str(info.value)


def test_bad_parameters_refused_before_any_charge(tmp_path):
    ledger = make_ledger(tmp_path)
    before = snapshot(ledger)
    with pytest.raises(IncrementalRegressionError, match="reader=None"):
        IncrementalRegression(ledger, "s", "p", params(), dim=DIM, reader=None)
    with pytest.raises(IncrementalRegressionError, match="dim=0"):
        IncrementalRegression(ledger, "s", "p", params(), dim=0, reader=lambda g: None)
    with pytest.raises(IncrementalRegressionError, match="params="):
        IncrementalRegression(ledger, "s", "p", {"horizon": 8}, dim=DIM, reader=lambda g: None)
    strategy = IncrementalRegression(ledger, "s", "p", params(), dim=DIM, reader=lambda g: block_rows(0))
    with pytest.raises(IncrementalRegressionError, match="block=3"):
        strategy.arrive(3)
    assert snapshot(ledger) == before


def test_charge_equals_bound_before_read_and_audit_passes(tmp_path):
    ledger = make_ledger(tmp_path, blocks=5)
    p = params(horizon=4)
    reads = []

    def reader(grant):
        grant = ledger.verify(grant)  # a signed grant the ledger recorded
        (block,) = grant.blocks  # only the arriving block
        assert ledger.block("s", block).spent == (p.epsilon, p.delta)  # charged BEFORE the read
        assert [(r.grant_id, r.stage) for r in ledger.releases(grant.id)] == [(grant.id, "training")]  # opened first
        reads.append(block)
        return block_rows(int(block[1:]))

    strategy = IncrementalRegression(ledger, "s", "p", p, dim=DIM, reader=reader)
    out = [strategy.arrive(f"b{i}") for i in range(4)]
    assert reads == ["b0", "b1", "b2", "b3"] and [r.t for r in out] == [1, 2, 3, 4]
    spent = {b.id: b.spent for b in ledger.blocks("s")}
    assert spent == {"b0": (1.0, 1e-6), "b1": (1.0, 1e-6), "b2": (1.0, 1e-6), "b3": (1.0, 1e-6), "b4": (0.0, 0.0)}
    grants = ledger.grants("s")
    assert [g.blocks for g in grants] == [("b0",), ("b1",), ("b2",), ("b3",)]
    assert all(
        g.meta["strategy"] == "incremental_regression" and g.meta["horizon"] == 4 and g.meta["levels"] == 3
        for g in grants
    )
    releases = ledger.releases()
    assert len(releases) == 4 and [r.computation for r in releases] == [
        bound_to_data(strategy.fingerprint, ledger, g) for g in grants
    ]  # each its own block's data
    assert len({r.computation for r in releases}) == 4
    assert [r.grant_id for r in releases] == [g.id for g in grants] and all(r.epsilon == 1.0 for r in releases)
    assert ledger.audit().ok
    # horizon exhausted: refused before anything is charged or read
    before = snapshot(ledger)
    with pytest.raises(HorizonExhausted, match="horizon=4"):
        strategy.arrive("b4")
    assert snapshot(ledger) == before and reads == ["b0", "b1", "b2", "b3"]


def test_rdp_stream_is_charged_the_tree_event(tmp_path):
    ledger = make_ledger(tmp_path, blocks=2, accounting="rdp")
    p = params(horizon=2)
    strategy = IncrementalRegression(ledger, "s", "p", p, dim=DIM, reader=lambda g: block_rows(0))
    strategy.arrive("b0")
    orders = ledger.stream("s").orders
    want = [p.levels * a / p.noise_multiplier**2 for a in orders]  # 2L Gaussians: alpha * 2L / (2 c^2)
    spent = ledger.block("s", "b0").spent  # (delta, then the RDP curve at the stream's orders)
    assert spent[0] == 0.0 and np.allclose(spent[1:], want, rtol=1e-9)
    assert all(v == 0 for v in ledger.block("s", "b1").spent)
    assert ledger.audit().ok


def test_same_grant_seed_gives_same_noise_and_release_is_deterministic(tmp_path):
    a, b = TreeRegressor(params(), DIM), TreeRegressor(params(), DIM)
    for i in range(3):
        x, y = block_rows(i)
        assert np.array_equal(a.add(x, y, 5 + i), b.add(x, y, 5 + i))
    c = TreeRegressor(params(), DIM)
    x, y = block_rows(0)
    c.add(x, y, 999)
    assert not np.array_equal(c._nodes[0].noisy, TreeRegressor(params(), DIM)._release_node(c._nodes[0].exact, 5))


def test_rows_are_clipped_and_bad_shapes_refused():
    tree = TreeRegressor(params(bound_x=1.0, bound_y=0.5), 2)
    leaf = tree.leaf([[30.0, 40.0], [np.nan, 0.0]], [7.0, np.nan])
    # row 1 scaled to norm 1: (0.6, 0.8); row 2 becomes 0; labels 0.5 and 0
    (gamma_m, _), (gamma_v, _) = tree._grids()  # each row's part on its release's grid, summed exactly
    assert np.allclose(leaf, [0.36, 0.48, 0.64, 0.3, 0.4], rtol=0, atol=max(gamma_m, gamma_v) / 2)
    assert all(float(v / g).is_integer() for v, g in zip(leaf, [gamma_m] * 3 + [gamma_v] * 2))
    with pytest.raises(IncrementalRegressionError, match=r"need \(rows, 2\)"):
        tree.leaf(np.zeros((3, 3)), np.zeros(3))


def test_projected_gradient_stays_in_ball_and_solves_the_quadratic():
    q = np.array([[2.0, 0.3], [0.3, 1.0]])
    target = np.array([0.2, -0.1])
    theta = projected_gradient(q, q @ target, radius=5.0, iterations=2000)
    assert np.allclose(theta, target, atol=1e-8)
    far = projected_gradient(q, q @ np.array([30.0, 0.0]), radius=1.0, iterations=500)
    assert np.linalg.norm(far) <= 1.0 + 1e-12 and far[0] > 0.9
    assert np.allclose(projected_gradient(np.zeros((2, 2)), np.array([3.0, 4.0]), 2.0, 10), [1.2, 1.6])


def test_utility_sanity_fixed_seeds():
    """16 blocks of 400 rows, eps = 1: the last regressor is close to least squares, far better than theta = 0."""
    p = params(horizon=16, iterations=300)
    tree = TreeRegressor(p, DIM)
    xs, ys = [], []
    for i in range(16):
        x, y = block_rows(i, rows=400)
        xs.append(x)
        ys.append(y)
        theta = tree.add(x, y, 4242 + i)
    x, y = np.vstack(xs), np.concatenate(ys)
    ols = np.linalg.lstsq(x, y, rcond=None)[0]
    risk = lambda th: float(np.mean((y - x @ th) ** 2))  # noqa: E731
    assert risk(theta) - risk(ols) < 0.05 * (risk(np.zeros(DIM)) - risk(ols))
    assert np.linalg.norm(theta - THETA) < 0.1


# ---------------------------------------------------------------------------------------------- the bench
def _bench_args(tmp_path, **kw):
    from sage_tfx.bench import incremental_regression as bench

    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    argv = [
        "--data",
        "generated",
        "--rows",
        "400",
        "--horizons",
        "2,4",
        "--seeds",
        "1",
        "--iterations",
        "50",
        "--plot",
        str(tmp_path / "plot.png"),
    ]
    for k, v in kw.items():
        argv += [f"--{k}", str(v)]
    return bench, parser.parse_args(argv)


def test_bench_tiny_run(tmp_path):
    bench, args = _bench_args(tmp_path)
    figures = bench.run(args)
    json.dumps(figures)
    assert figures["data"].startswith("GENERATED") and figures["rows"] == 400
    assert [r["horizon"] for r in figures["horizons"]] == [2, 4]
    for r in figures["horizons"]:
        for key in ("tree_excess_mean", "rerun_excess_mean", "tree_excess_final", "rerun_excess_final"):
            assert r[key] >= -1e-9 and math.isfinite(r[key])
        assert r["ratio_mean_rerun_over_tree"] > 0 and 0 <= r["tree_better_fraction"] <= 1
        assert len(r["tree_excess_by_t"]) == len(r["rerun_excess_by_t"]) == r["horizon"]
        assert r["tree_excess_second_half"] == pytest.approx(np.mean(r["tree_excess_by_t"][r["horizon"] // 2 :]))
        assert r["tree_excess_final"] == pytest.approx(r["tree_excess_by_t"][-1])
        assert 0 < r["rerun_epsilon_per_run"] < args.epsilon
    assert (tmp_path / "plot.png").stat().st_size > 1000


def test_bench_ridge_cuts_the_trees_excess_on_real_taxi_rows(tmp_path):
    """The first 2,000 REAL taxi rows in 8 blocks, one seed: the noise ridge lowers the tree's mean excess risk
    (the plain descent follows the noisy X'X's negative directions to the ball's edge); the re-run baseline is
    the same run either way."""
    from sage_tfx.bench import incremental_regression as bench

    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    argv = ["--data", "taxi", "--rows", "2000", "--horizons", "8", "--seeds", "1", "--plot", ""]
    plain, ridged = (bench.run(parser.parse_args(argv + extra))["horizons"][0] for extra in ([], ["--ridge"]))
    assert plain["rerun_excess_mean"] == ridged["rerun_excess_mean"]
    assert ridged["tree_excess_mean"] < 0.5 * plain["tree_excess_mean"], (ridged, plain)


def test_bench_rerun_budget_composes_to_the_target():
    import dp_accounting
    from dp_accounting import rdp

    from sage_tfx.bench.incremental_regression import rerun_budget
    from sage_tfx.privacy.adassp import exact_multiplier

    eps_run, delta_run = rerun_budget(1.0, 1e-6, 16)
    c = exact_multiplier(eps_run, delta_run)
    acc = rdp.RdpAccountant()
    acc.compose(dp_accounting.GaussianDpEvent(noise_multiplier=c), 3 * 16)
    assert acc.get_epsilon(1e-6) <= 1.0 + 1e-4


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(epsilon=0), "--epsilon"),
        (dict(delta=1), "--delta"),
        (dict(seeds=0), "--seeds"),
        (dict(horizons="1000"), "only 400 rows"),
    ],
)
def test_bench_bad_arguments_name_the_value(tmp_path, kw, message):
    bench, args = _bench_args(tmp_path, **kw)
    with pytest.raises(SystemExit, match=message):
        bench.run(args)


@pytest.mark.parametrize("horizons, message", [("2,x", "'x' is not a whole number >= 1"), ("0,2", "'0' is not")])
def test_bench_bad_horizons_are_a_usage_error(tmp_path, capsys, horizons, message):
    with pytest.raises(SystemExit) as exc:
        _bench_args(tmp_path, horizons=horizons)
    assert exc.value.code == 2 and f"argument --horizons: {horizons!r}: {message}" in capsys.readouterr().err


def test_ridge_is_post_processing_and_fixes_ill_conditioned_rows():
    """Nearly collinear GENERATED rows (the taxi features' shape: an intercept and two correlated columns): the
    noisy X'X is indefinite early, the plain descent runs to the edge of the ball, and the ridge (lambda_t a
    public bound on the noise's norm) cuts the mean excess risk over the arrivals. Same noise seeds, same
    charge: the ridge changes neither the noise multiplier nor the DpEvent nor the released tree nodes."""
    from sage_tfx.release.incremental_regression import noise_ridge

    plain, ridged = (
        params(horizon=16, radius=4.0, iterations=200),
        params(horizon=16, radius=4.0, iterations=200, ridge=True),
    )
    assert plain.noise_multiplier == ridged.noise_multiplier and plain.dp_event == ridged.dp_event
    assert noise_ridge(ridged, 1, DIM) == pytest.approx(2 * math.sqrt(DIM) * ridged.noise_multiplier)
    rng = np.random.default_rng(9)
    a = rng.uniform(0, 0.5, size=16 * 200)
    x = np.column_stack([np.full(a.size, 0.5), a, a + 0.02 * rng.normal(size=a.size)])
    y = x @ np.array([0.1, 0.4, 0.3]) + 0.05 * rng.normal(size=a.size)
    trees = TreeRegressor(plain, DIM), TreeRegressor(ridged, DIM)
    excess = [[], []]
    for t in range(16):
        rows = slice(200 * t, 200 * (t + 1))
        seen_x, seen_y = x[: 200 * (t + 1)], y[: 200 * (t + 1)]
        best = np.linalg.lstsq(seen_x, seen_y, rcond=None)[0]
        for k, tree in enumerate(trees):
            theta = tree.add(x[rows], y[rows], 77 + t)
            excess[k].append(np.mean((seen_y - seen_x @ theta) ** 2) - np.mean((seen_y - seen_x @ best) ** 2))
    np.testing.assert_array_equal(trees[0].noisy_prefix()[0], trees[1].noisy_prefix()[0])  # same releases
    assert np.mean(excess[1]) < 0.5 * np.mean(excess[0]), (np.mean(excess[1]), np.mean(excess[0]))


@pytest.mark.parametrize("constraint", ["l1_ball", "simplex"])
def test_bench_high_dim_tiny_run(tmp_path, constraint):
    # PrivIncReg1 (L2 ball and the small-width set) and PrivIncReg2 (m <= d only) on GENERATED sparse rows
    bench, args = _bench_args(tmp_path, **{"dims": "12,30", "sketch-dims": "8,20", "set": constraint})
    args.blocks, args.rows_per_block, args.high_dim = 2, 60, True
    figures = bench.run(args)
    json.dumps(figures)
    assert figures["set"] == constraint and [r["dim"] for r in figures["by_dim"]] == [12, 30]
    small, large = figures["by_dim"]
    assert set(small["final"]) == {"reg1_l2", f"reg1_{constraint}", f"reg2_{constraint}_m8", "zero"}
    assert set(large["final"]) == {
        "reg1_l2",
        f"reg1_{constraint}",
        f"reg2_{constraint}_m8",
        f"reg2_{constraint}_m20",
        "zero",
    }
    for r in figures["by_dim"]:
        assert all(math.isfinite(v) for v in r["final"].values())
        assert r["final"][f"reg1_{constraint}"] >= -1e-6  # the set's own non-private optimum is the floor
