"""Growth schedules and PMWG (sage_tfx/release/growth/; the paper seed 001). numpy only.

Data here is GENERATED (fixed-seed uniform values); the ledger is real (SQLite, tmp_path)."""

import math

import numpy as np
import pytest

from sage_tfx.privacy import gaussian
from sage_tfx.privacy.digests import bound_to_data
from sage_tfx.privacy.randomness import secure_rng
from sage_tfx.privacy.samplers import grid_laplace
from sage_tfx.release.growth import (
    PMWG,
    BBImprover,
    BBScheduler,
    GrowthError,
    ImproverParams,
    PMWGParams,
    ScheduledRelease,
    SchedulerParams,
    Universe,
    count_query,
    sum_query,
)
from tests.helpers.ledgers import daily_ledger

ROWS = 100


def generated_block(index, n=ROWS):
    return np.random.default_rng(500 + index).uniform(0, 1, size=(n, 2))


def make_ledger(tmp_path, blocks, epsilon=10.0, delta=1e-4):
    return daily_ledger(tmp_path, blocks, epsilon=epsilon, delta=delta, rows=ROWS)


def spent(ledger):
    return {b["id"]: (b["epsilon_spent"], b["delta_spent"]) for b in ledger.status("s")["blocks"]}


class CheckedReader:
    """Reads a block only under a recorded grant that already charged it."""

    def __init__(self, ledger):
        self.ledger, self.read = ledger, []

    def __call__(self, grant):
        (block,) = self.ledger.verify(grant).blocks
        assert spent(self.ledger)[block][0] > 0  # charged before this read
        self.read.append(block)
        return generated_block(int(block[1:]))


def dp_mean(blocks, epsilon, rng):
    """epsilon-DP mean of column 0 (values in [0, 1]) over the public count: sensitivity 1 / n."""
    n = ROWS * len(blocks)
    return float(grid_laplace(np.array([sum(float(b[:, 0].sum()) for b in blocks) / n]), 1.0 / n, epsilon, rng=rng)[0])


@pytest.mark.parametrize("gamma,t0", [(0.05, 1), (0.5, 3), (2.0, 1)])
def test_scheduler_pure_budget_sums_below_total(gamma, t0):
    s = BBScheduler(SchedulerParams(epsilon=2.0, gamma=gamma, t0=t0))
    total = s.total_loss(20_000)
    assert total <= 2.0 + 1e-12
    # the series converges to epsilon: what is left after 20000 blocks is the geometric tail
    runs = [s.run_at(t) for t in range(1, 20_001)]
    assert total > 2.0 * 0.9 and sum(1 for r in runs if r) >= 5
    epochs = [r[0] for r in runs if r]
    assert epochs == sorted(set(epochs))  # each epoch at most once


def test_scheduler_zcdp_and_improver_rho_below_bound():
    s = BBScheduler(SchedulerParams(epsilon=1.0, delta=1e-6, gamma=0.3, t0=1))
    assert 0.9 * s.rho < s.total_loss(20_000) <= s.rho * (1 + 1e-12)
    for a, t0 in ((0.05, 1), (0.25, 4)):
        b = BBImprover(ImproverParams(epsilon=1.0, delta=1e-6, a=a, t0=t0))
        total = b.total_loss(20_000)
        assert total <= b.rho * (1 + 1e-12) and total > 0.3 * b.rho
        assert b.epsilon_of(1000) * 1000 > b.epsilon_of(10) * 10  # n eps_n grows: accuracy improves


def test_scheduler_holds_n_epsilon():
    s = BBScheduler(SchedulerParams(epsilon=1.0, gamma=1.0, t0=1))
    products = [t * s.run_at(t)[1] for t in (1, 2, 4, 8, 16, 32)]
    assert max(products) / min(products) == pytest.approx(1.0)


@pytest.mark.parametrize(
    "params,match",
    [
        (dict(epsilon=-1.0), "epsilon -1.0"),
        (dict(epsilon=1.0, gamma=0), "gamma 0"),
        (dict(epsilon=1.0, t0=0), "t0 0"),
        (dict(epsilon=1.0, delta=1.5), "delta 1.5"),
    ],
)
def test_scheduler_bad_params_refused(params, match):
    with pytest.raises(GrowthError, match=match):
        SchedulerParams(**params)


def test_improver_needs_delta():
    with pytest.raises(GrowthError, match="delta 0"):
        ImproverParams(epsilon=1.0, delta=0)
    with pytest.raises(GrowthError, match="a 0.7"):
        ImproverParams(epsilon=1.0, delta=1e-6, a=0.7)


@pytest.mark.parametrize("kind", ["scheduler", "improver"])
def test_ledger_charges_bound_per_block_and_audit(tmp_path, kind):
    T = 12
    ledger = make_ledger(tmp_path, T)
    schedule = (
        BBScheduler(SchedulerParams(epsilon=1.0, gamma=0.5))
        if kind == "scheduler"
        else BBImprover(ImproverParams(epsilon=1.0, delta=1e-6))
    )
    reader = CheckedReader(ledger)
    rel = ScheduledRelease(ledger, "s", kind, schedule, dp_mean, reader, name="dp_mean")
    before = spent(ledger)
    assert all(v == (0.0, 0.0) for v in before.values())
    for i in range(T):
        rel.observe(f"b{i:03d}")
    assert reader.read == [f"b{i:03d}" for i in range(T)]
    for _b, (e, d) in spent(ledger).items():
        assert e == pytest.approx(1.0) and d == pytest.approx(schedule.params.delta)
    assert len(rel.runs) == (T if kind == "improver" else sum(1 for t in range(1, T + 1) if schedule.run_at(t)))
    assert abs(rel.current - np.mean([generated_block(i)[:, 0].mean() for i in range(T)])) < 0.5
    assert ledger.audit().ok
    # each lifetime grant's one release is the schedule's computation on its own block (registered content)
    assert {r.grant_id: r.computation for r in ledger.releases()} == {
        g.id: bound_to_data(rel.fingerprint, ledger, g) for g in rel.grants.values()
    }
    assert len({r.computation for r in ledger.releases()}) == T
    with pytest.raises(GrowthError, match="b003"):
        rel.observe("b003")


def test_bad_schedule_refused_before_any_charge(tmp_path):
    ledger = make_ledger(tmp_path, 2)
    with pytest.raises(GrowthError, match="schedule"):
        ScheduledRelease(ledger, "s", "p", object(), dp_mean, CheckedReader(ledger))
    with pytest.raises(GrowthError, match="epsilon 0"):
        BBScheduler(SchedulerParams(epsilon=0))
    with pytest.raises(GrowthError, match="hard_budget 0"):
        PMWGParams(epsilon=1.0, hard_budget=0)
    assert all(v == (0.0, 0.0) for v in spent(ledger).values())


def test_dp_mean_noise_statistics():
    # 4000 draws of the epsilon = 0.5 mean on 1 block (scale b = 1/(100*0.5) = 0.02): |mean| / (sd/sqrt(n))
    # > 6 has probability < 2e-9; the variance ratio to 2 b^2 outside [0.8, 1.2] (> 6 standard errors
    # of ~0.032 for Laplace's kurtosis 6) has probability < 1e-6.
    rng = secure_rng(7)
    block = generated_block(0)
    truth = block[:, 0].mean()
    draws = np.array([dp_mean([block], 0.5, rng) for _ in range(4000)]) - truth
    b = 1.0 / (ROWS * 0.5)
    assert abs(draws.mean()) / (math.sqrt(2) * b / math.sqrt(4000)) < 6
    assert 0.8 < draws.var() / (2 * b * b) < 1.2


class BigBlockReader(CheckedReader):
    """CheckedReader with GENERATED blocks of ``rows`` rows (declared as such)."""

    def __init__(self, ledger, rows):
        super().__init__(ledger)
        self.rows = rows

    def __call__(self, grant):
        block = super().__call__(grant)
        return generated_block(int(self.read[-1][1:]), self.rows) if self.rows != len(block) else block


def observe_and_query(pm, uni, blocks, rows, per_block=10, seed=3):
    """Observe ``blocks`` blocks of ``rows`` declared rows, asking ``per_block`` random count / sum queries after
    each (fixed seed); returns the absolute errors."""
    qrng, errors = np.random.default_rng(seed), []
    for i in range(blocks):
        pm.observe(f"b{i:03d}", rows)
        for _ in range(per_block):
            lo = qrng.uniform(0, 0.7)
            w = (
                count_query(uni, lambda c: (c[:, 0] > lo) & (c[:, 1] < lo + 0.3))  # noqa: B023
                if qrng.random() < 0.5
                else sum_query(uni, 0, 1.0, lambda c: c[:, 1] > lo)  # noqa: B023
            )
            errors.append(abs(pm.query(w).answer - pm.true_answer(w)))
    return errors


def test_pmwg_error_bound_fixed_seed(tmp_path):
    T, rows = 8, 1000
    ledger = make_ledger(tmp_path, T)
    uni = Universe(columns=("x", "y"), edges=(np.linspace(0, 1, 6), np.linspace(0, 1, 6)))
    reader = BigBlockReader(ledger, rows)
    pm = PMWG(ledger, "s", "pmwg", PMWGParams(epsilon=2.0, hard_budget=20, threshold=0.05), uni, reader)
    errors = observe_and_query(pm, uni, T, rows)
    # Error bound: threshold T plus the SVT/Laplace noise tails at n >= 1000 records (a round opened at n has
    # query-noise scale 4 / (n eps_r(n) / 2) with eps_r(n) = c (n0 / n)^(1/2), c = 2 / (20 + 1 / (e^(1/40) - 1))
    # = 0.0336: 0.24 at n0 = 1000, 0.085 at n = 8000); checked on this fixed seed at the late, large-n queries.
    assert max(errors[-20:]) < 0.25
    assert np.mean(errors) < 0.15
    assert pm.hard_used <= pm.hard_limit() and pm.epsilon_spent_bound <= 2.0
    for _b, (e, d) in spent(ledger).items():
        assert e == pytest.approx(2.0) and d == 0.0
    assert ledger.audit().ok
    with pytest.raises(GrowthError, match="shape"):
        pm.query(np.ones(3))


def test_pmwg_public_histogram_arrival_update(tmp_path):
    ledger = make_ledger(tmp_path, 2)
    uni = Universe(columns=("x", "y"), edges=(np.linspace(0, 1, 3), np.array([0.0, 1.0])))
    pm = PMWG(ledger, "s", "p", PMWGParams(epsilon=1.0), uni, CheckedReader(ledger))
    pm.public = np.array([1.0, 0.0])  # as if learned
    pm.observe("b000", ROWS)
    assert pm.public == pytest.approx([0.5, 0.5])  # n_old = 0: all weight on the uniform arrival
    pm.public = np.array([1.0, 0.0])
    pm.observe("b001", ROWS)
    assert pm.public == pytest.approx([0.75, 0.25])  # (100 * [1, 0] + 100 * [.5, .5]) / 200
    pm.query(np.array([1.0, 0.0]))  # re-opens every block's release: each bound to its own block
    assert {r.grant_id: r.computation for r in ledger.releases()} == {
        g.id: bound_to_data(pm.fingerprint, ledger, g) for g in pm.grants.values()
    }
    with pytest.raises(GrowthError, match="edges"):
        Universe(columns=("x",), edges=([1.0, 0.0],))


def test_pmwg_bad_input_refused_before_charge(tmp_path):
    ledger = make_ledger(tmp_path, 2)
    uni = Universe(columns=("x", "y"), edges=(np.linspace(0, 1, 3), np.linspace(0, 1, 3)))
    pm = PMWG(ledger, "s", "p", PMWGParams(epsilon=1.0), uni, CheckedReader(ledger))
    with pytest.raises(GrowthError, match="declared_rows 0"):
        pm.observe("b000", 0)
    with pytest.raises(GrowthError, match="no block observed"):
        pm.query(np.zeros(uni.size))
    assert all(v == (0.0, 0.0) for v in spent(ledger).values())  # nothing charged
    pm.observe("b000", ROWS)
    with pytest.raises(GrowthError, match="in \\[0, 1\\]"):
        pm.query(np.full(uni.size, 2.0))
    assert spent(ledger)["b001"] == (0.0, 0.0)


def test_pmwg_hard_budget_grows_with_n_and_the_rounds_stay_within_epsilon(tmp_path):
    """The hard-query budget h(n) = floor(k (1 + ln(n / n0))) (Corollary 16) grows as the declared size grows,
    PMWG answers more than k hard queries once n has grown, and the epsilons of the AboveThreshold rounds it
    opened sum to at most epsilon (Theorem 18's bound, module docstring), whatever the query stream."""
    T, k, eps = 12, 3, 1.0
    ledger = make_ledger(tmp_path, T)
    uni = Universe(columns=("x", "y"), edges=(np.linspace(0, 1, 4), np.linspace(0, 1, 4)))
    params = PMWGParams(epsilon=eps, hard_budget=k, threshold=1e-6, eta=0.05)  # tiny T: hard queries are frequent
    pm = PMWG(ledger, "s", "budget", params, uni, CheckedReader(ledger))
    c = params.round_scale
    assert c == pytest.approx(eps / (k + 1 / math.expm1(0.5 / k)))
    qrng = np.random.default_rng(11)
    limits = []
    for i in range(T):
        declared = ROWS * 2**i  # a public declared size that doubles: n = 100 (2^(i+1) - 1)
        pm.observe(f"b{i:03d}", declared)
        assert pm.hard_limit() == math.floor(k * (1 + math.log(pm.n / 100)))
        limits.append(pm.hard_limit())
        for _ in range(25):
            lo = qrng.uniform(0, 0.6)
            pm.query(count_query(uni, lambda cells: (cells[:, 0] > lo) & (cells[:, 1] < lo + 0.4)))  # noqa: B023
            assert pm.hard_used <= pm.hard_limit()
            assert pm.epsilon_spent_bound <= eps * (1 + 1e-12)
    assert limits == sorted(limits) and limits[0] == k and limits[-1] > 3 * k  # the budget grew with n
    assert pm.hard_used > k  # and was used: more hard queries than the static budget
    # a round opened at size n cost c min(1, (n0 / n)^(1/2)): the rounds' epsilons never increase
    assert pm.round_epsilons[0] == pytest.approx(c)
    assert all(a >= b - 1e-15 for a, b in zip(pm.round_epsilons, pm.round_epsilons[1:]))
    # every block is charged epsilon once, before it is read; the audit passes
    assert all(e == pytest.approx(eps) and d == 0.0 for e, d in spent(ledger).values()) and ledger.audit().ok
    # the budget used up with no round open: the public histogram answers, nothing more is spent
    pm.hard_used, pm.noisy_threshold = pm.hard_limit(), None
    before = list(pm.round_epsilons)
    ans = pm.query(count_query(uni, lambda cells: cells[:, 0] > 0.5))
    assert not ans.hard and pm.round_epsilons == before


@pytest.mark.parametrize("k,p", [(1, 1.0), (3, 0.5), (20, 0.5), (50, 0.1)])
def test_pmwg_worst_case_rounds_sum_to_epsilon(tmp_path, k, p):
    """Theorem 18's worst case: round i opens at the smallest n with i <= h(n), n_i = n0 exp(i/k - 1) (i > k):
    the rounds' epsilons sum to c (k + 1 / (exp(p/k) - 1)) = epsilon, approached and never exceeded."""
    ledger = make_ledger(tmp_path, 1)
    uni = Universe(columns=("x", "y"), edges=(np.linspace(0, 1, 3), np.linspace(0, 1, 3)))
    pm = PMWG(ledger, "s", "wc", PMWGParams(epsilon=1.5, hard_budget=k, growth_exponent=p), uni, CheckedReader(ledger))
    pm.observe("b000", ROWS)
    total, i = 0.0, 0
    while True:
        i += 1
        n = ROWS if i <= k else ROWS * math.exp(i / k - 1)
        assert pm.hard_limit(math.ceil(n * (1 + 1e-9))) >= i  # the budget allows round i at n (+ float slack)
        total += pm.round_epsilon(n)
        if pm.round_epsilon(n) < 1e-13:
            break
    assert total <= 1.5 * (1 + 1e-9) and total == pytest.approx(1.5, rel=1e-6)


def test_pmwg_growth_exponent_refused():
    for bad in (0, -0.5, 1.5, True):
        with pytest.raises(GrowthError, match=f"growth_exponent {bad!r} is invalid"):
            PMWGParams(epsilon=1.0, growth_exponent=bad)


@pytest.mark.parametrize("composition", ["zcdp", "basic"])
def test_scheduler_with_delta_ledger_spend_equals_the_analysis_bound(tmp_path, composition):
    """BBScheduler with delta > 0 on a real ledger: each block is charged the whole (epsilon, delta) once, before
    it is read, and that is exactly the analysis' bound. zCDP mode: the runs are pure epsilon_i-DP and their
    zCDP sum_i epsilon_i^2 / 2 stays <= rho, which dp-accounting converts back to <= epsilon at delta. Basic
    mode: the runs' own (epsilon_i, delta_i) shrink geometrically and sum to <= (epsilon, delta)."""
    import dp_accounting
    from dp_accounting.rdp import RdpAccountant

    from sage_tfx.release.growth import clipped_mean

    T, eps, delta = 20, 1.0, 1e-6
    ledger = make_ledger(tmp_path, T, epsilon=2.0, delta=1e-5)
    schedule = BBScheduler(SchedulerParams(epsilon=eps, delta=delta, gamma=0.25, composition=composition))
    reader = CheckedReader(ledger)
    rel = ScheduledRelease(
        ledger,
        "s",
        f"sched-{composition}",
        schedule,
        clipped_mean(1.0, ROWS),
        lambda g: reader(g)[:, 0],
        name="clipped_mean(x0)",
    )
    for i in range(T):
        rel.observe(f"b{i:03d}")
        assert reader.read[-1] == f"b{i:03d}"  # read only after its charge (CheckedReader asserts it)
    # the ledger: every block's spend is the whole bound, charged once, and the audit passes
    assert spent(ledger) == {f"b{i:03d}": (pytest.approx(eps), pytest.approx(delta)) for i in range(T)}
    assert len(ledger.grants("s")) == T and ledger.audit().ok
    runs = rel.runs
    assert [r.t for r in runs] == [t for t in range(1, T + 1) if schedule.run_at(t)] and len(runs) >= 6
    if composition == "zcdp":
        assert all(r.delta == 0.0 for r in runs)
        rho_used = sum(r.epsilon**2 / 2 for r in runs)
        assert rho_used <= schedule.rho * (1 + 1e-12)
        z = 1.0 / math.sqrt(2 * rho_used)  # rho-zCDP has the RDP curve of the Gaussian with multiplier z
        eps_used = RdpAccountant().compose(dp_accounting.GaussianDpEvent(z)).get_epsilon(delta)
        assert eps_used <= eps * (1 + 1e-6)
        # the infinite horizon reaches the bound: the geometric tail after T blocks is what is left
        assert schedule.total_loss(10**5) == pytest.approx(schedule.rho, rel=1e-6)
    else:
        eps_i, delta_i = [r.epsilon for r in runs], [r.delta for r in runs]
        # run k covers the epochs after the previous run's up to its own: (eps, delta) g / (1 + g)^(j + 1) each
        first = [0] + [r.epoch + 1 for r in runs[:-1]]
        share = [sum(0.25 / 1.25 ** (j + 1) for j in range(f, r.epoch + 1)) for f, r in zip(first, runs)]
        assert eps_i == [pytest.approx(eps * w) for w in share] and delta_i == [pytest.approx(delta * w) for w in share]
        assert eps_i[-1] < eps_i[-2] < eps_i[-3]  # they shrink as the stream grows
        assert [d / e for d, e in zip(delta_i, eps_i)] == [pytest.approx(delta / eps)] * len(runs)
        assert sum(eps_i) < eps and sum(delta_i) < delta
        assert schedule.total_loss(10**5) == pytest.approx(eps, rel=1e-4)  # tail 1.25^-52 ~ 1e-5 left
        assert schedule.total_delta(10**5) == pytest.approx(delta, rel=1e-4)
    # the last run's output is the true mean plus its stated noise: grid Gaussian of sigma z(eps_i, delta_i) / n
    # in basic mode, grid Laplace of scale 1 / (n eps_i) otherwise; |noise| > 6 sigma has probability < 2e-9 and
    # |noise| > 21 scales < 1e-9 (the grants' seeds are random: these are the false-failure rates)
    last = runs[-1]
    n = ROWS * len(last.blocks)
    limit = (
        6 * gaussian.rdp_multiplier(last.epsilon, last.delta) / n if composition == "basic" else 21 / (n * last.epsilon)
    ) + 1e-6  # + the grid's rounding (<= gamma / 2, far below 1e-6)
    assert abs(rel.current - np.mean([generated_block(i)[:, 0].mean() for i in range(T)])) < limit


def test_scheduler_composition_refused():
    with pytest.raises(GrowthError, match="composition 'advanced' is invalid"):
        SchedulerParams(epsilon=1.0, delta=1e-6, composition="advanced")
    with pytest.raises(GrowthError, match="composition 'zcdp' needs delta > 0"):
        SchedulerParams(epsilon=1.0, composition="zcdp")
