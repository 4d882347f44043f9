"""SmallDBG: SmallDB re-run on a growing database under BBScheduler / BBImprover (sage_tfx/release/growth/smalldbg.py;
the paper seed 001, Theorem 9, Table 1). The sampler's distribution is the exact permute-and-flip one, neighbouring
databases move it by at most e^epsilon, each block is charged once before it is read, and the error falls as the
database grows under BBImprover.

Data here is GENERATED (fixed-seed draws from a fixed 8-cell distribution); the ledger is real (SQLite, tmp_path)."""

import math

import numpy as np
import pytest

from sage_tfx.privacy.digests import bound_to_data
from sage_tfx.privacy.randomness import secure_rng
from sage_tfx.release.growth import (
    BBImprover,
    BBScheduler,
    GrowthError,
    ImproverParams,
    SchedulerParams,
    Universe,
    smalldb_mechanism,
    smalldbg,
    synthetic_answers,
)
from sage_tfx.release.growth.smalldbg import candidates, permute_and_flip, scores
from tests.helpers.ledgers import daily_ledger

CELLS, M, M0 = 8, 6, 200
UNIVERSE = Universe(columns=("x",), edges=(np.linspace(0, 1, CELLS + 1),))
RANGES = np.array([[int(a <= c < b) for c in range(CELLS)] for a in range(CELLS) for b in range(a + 1, CELLS + 1)])
P = np.array([0.3, 0.2, 0.1, 0.1, 0.1, 0.1, 0.05, 0.05])


def generated_block(index, n=M0):
    return UNIVERSE.centres()[np.random.default_rng(900 + index).choice(CELLS, size=n, p=P)]


def pf_distribution(errors, epsilon, scale):
    """Permute-and-flip's exact output distribution: P(r) = p_r int_0^1 prod_{j != r} (1 - p_j u) du, p_j the
    acceptance probabilities (a uniform order is uniform arrival times u_j); the integral by Gauss-Legendre, exact
    for these polynomials."""
    p = np.exp(-epsilon * (np.asarray(errors) - np.min(errors)) / (2 * scale))
    nodes, weights = np.polynomial.legendre.leggauss(len(p) + 2)
    u, w = (nodes + 1) / 2, weights / 2
    out = np.array(
        [p[r] * (w * np.prod(1 - np.delete(p, r)[:, None] * u[None, :], axis=0)).sum() for r in range(len(p))]
    )
    return out


def test_permute_and_flip_draws_its_exact_distribution():
    # 6,000 draws: each frequency within 5 binomial standard errors of the exact probability (false failure < 2e-6)
    errors, eps, scale = np.array([0, 3, 6, 3]), 1.0, 3
    exact = pf_distribution(errors, eps, scale)
    assert exact.sum() == pytest.approx(1.0)
    rng, n = secure_rng(7), 6000
    freq = np.bincount([permute_and_flip(errors, eps, scale, 100, rng) for _ in range(n)], minlength=4) / n
    assert np.all(np.abs(freq - exact) <= 5 * np.sqrt(exact * (1 - exact) / n))


@pytest.mark.parametrize("extra_rows", [0, 7])  # 7: the data hold more rows than the declared n (the clip holds)
def test_neighbouring_databases_move_every_output_by_at_most_e_epsilon(extra_rows):
    # The privacy claim itself, computed exactly: one record added to a database changes the probability of every
    # synthetic database by a factor within e^(+-epsilon), with the scores the mechanism uses (n public).
    universe_cells, m, n, eps = 3, 3, 5, 0.7
    table = candidates(universe_cells, m)
    queries = np.array([[1, 0, 0], [0, 1, 0], [1, 1, 0], [0, 1, 1]])
    worst = 0.0
    for base in ([2, 1, 2], [0, 0, 5], [5, 0, 0], [1, 3, 1]):
        counts = np.array(base) + np.array([extra_rows, 0, 0])
        for cell in range(universe_cells):
            plus = counts.copy()
            plus[cell] += 1
            a = pf_distribution(scores(counts, n, queries, table), eps, m)
            b = pf_distribution(scores(plus, n, queries, table), eps, m)
            worst = max(worst, float(np.max(np.abs(np.log(a / b)))))
    assert 0 < worst <= eps + 1e-9


def test_the_run_error_meets_its_accuracy_bound_and_falls_with_epsilon_n():
    # Accuracy: error <= OPT_m + 2 (ln K + ln(1 / beta)) / (epsilon n) with probability >= 1 - beta (beta = 1e-6,
    # 240 runs: false failure < 3e-4); the mean excess over OPT_m falls as epsilon n grows (the BBImprover trend:
    # epsilon_t n_t ~ t^(1/2 - a)); measured 0.19 at t = 1 against 0.06 at t = 16, each a mean of 120 draws.
    improver = BBImprover(ImproverParams(epsilon=1.0, delta=1e-6, a=0.1))
    mech = smalldb_mechanism(improver, UNIVERSE, RANGES, M0, M)
    table, blocks, rng = candidates(CELLS, M), [generated_block(i) for i in range(16)], secure_rng(11)
    excess = {}
    for t in (1, 16):
        counts = sum(np.bincount(UNIVERSE.cells(b), minlength=CELLS) for b in blocks[:t])
        n, eps = M0 * t, improver.epsilon_of(t)
        truth, opt = RANGES @ counts / n, scores(counts, n, RANGES, table).min() / (n * M)
        errs = np.array(
            [np.abs(synthetic_answers(mech(blocks[:t], eps, rng), RANGES) - truth).max() for _ in range(120)]
        )
        assert np.all(errs <= opt + 2 * (math.log(len(table)) + math.log(1e6)) / (eps * n) + 1e-12)
        excess[t] = float(np.mean(errs - opt))
    assert excess[16] < 0.6 * excess[1]


class CheckedReader:
    """Reads a block only under a recorded grant that already charged it."""

    def __init__(self, ledger):
        self.ledger, self.read = ledger, []

    def __call__(self, grant):
        (block,) = self.ledger.verify(grant).blocks
        assert {b["id"]: b["epsilon_spent"] for b in self.ledger.status("s")["blocks"]}[block] > 0
        self.read.append(block)
        return generated_block(int(block[1:]))


@pytest.mark.parametrize(
    "schedule,charge",
    [
        (BBScheduler(SchedulerParams(epsilon=1.0, gamma=0.5)), (1.0, 0.0)),
        (BBImprover(ImproverParams(epsilon=1.0, delta=1e-6, a=0.1)), (1.0, 1e-6)),
    ],
)
def test_smalldbg_charges_each_block_once_before_reading_and_runs_on_schedule(tmp_path, schedule, charge):
    ledger = daily_ledger(tmp_path, 6, epsilon=2.0, delta=1e-5, rows=M0)
    reader = CheckedReader(ledger)
    rel = smalldbg(ledger, "s", "sdb", schedule, UNIVERSE, RANGES, reader, rows_per_block=M0, synthetic_size=M)
    runs = [rel.observe(f"b{i:03d}") for i in range(6)]
    assert [r.t for r in runs if r] == [t for t in range(1, 7) if schedule.run_at(t)]
    assert reader.read == [f"b{i:03d}" for i in range(6)]
    for r in filter(None, runs):  # a synthetic database of M records, answered from until the next run
        assert r.output.sum() == M and r.output.shape == (CELLS,)
    assert rel.current is [r for r in runs if r][-1].output
    spent = {b["id"]: (b["epsilon_spent"], b["delta_spent"]) for b in ledger.status("s")["blocks"]}
    assert spent == {f"b{i:03d}": (pytest.approx(charge[0]), pytest.approx(charge[1])) for i in range(6)}
    assert schedule.total_loss(10**4) <= (1.0 if isinstance(schedule, BBScheduler) else schedule.rho) + 1e-9
    grants = {g.id: g for g in ledger.grants("s")}
    assert {r.computation for r in ledger.releases()} == {
        bound_to_data(rel.fingerprint, ledger, g) for g in grants.values()
    }
    assert "smalldbg/m=6/m0=200/declared=" in rel.meta["mechanism"] and ledger.audit().ok
    ledger.close()


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"queries": RANGES * 0.5}, "0/1 weights"),
        ({"queries": RANGES[:, :3]}, "queries of shape"),
        ({"synthetic_size": 40}, "exponential in the domain"),
        ({"synthetic_size": 0}, "synthetic_size 0 is invalid"),
        ({"rows_per_block": 0}, "rows_per_block 0 is invalid"),
        ({"schedule": BBImprover(ImproverParams(1.0, 1e-6), approximate=True)}, "approximate=False"),
    ],
)
def test_bad_input_refused_before_any_charge(tmp_path, kwargs, match):
    ledger = daily_ledger(tmp_path, 2, epsilon=2.0, delta=1e-5, rows=M0)
    args = {
        "schedule": BBScheduler(SchedulerParams(epsilon=1.0)),
        "queries": RANGES,
        "rows_per_block": M0,
        "synthetic_size": M,
    }
    args.update(kwargs)
    with pytest.raises(GrowthError, match=match):
        smalldbg(
            ledger,
            "s",
            "sdb",
            args["schedule"],
            UNIVERSE,
            args["queries"],
            CheckedReader(ledger),
            rows_per_block=args["rows_per_block"],
            synthetic_size=args["synthetic_size"],
        )
    assert ledger.grants("s") == [] and ledger.releases() == []
    ledger.close()
