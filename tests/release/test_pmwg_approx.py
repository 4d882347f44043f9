"""(epsilon, delta) PMWG (the paper's Theorem 17): the rounds composed under zCDP, c calibrated by dp-accounting,
the worst-case rounds accounted back to (epsilon, delta), the charge on a real ledger, and the error it buys.

Data here is GENERATED (fixed-seed uniform values); the ledger is real (SQLite, tmp_path)."""

import math

import numpy as np
import pytest

from sage_tfx.privacy import gaussian
from sage_tfx.release.growth import PMWG, GrowthError, PMWGParams, Universe
from sage_tfx.release.growth.calibration import pmwg_round_scale
from tests.helpers.ledgers import daily_ledger
from tests.release.test_growth import observe_and_query

ROWS = 1000


def generated_block(index, n=ROWS):
    return np.random.default_rng(500 + index).uniform(0, 1, size=(n, 2))


def worst_case_rounds(pm, k):
    """Round i opens at the smallest n with i <= h(n) (n_i = n0 exp(i/k - 1) for i > k): the most rounds, earliest."""
    out, i = [], 0
    while True:
        i += 1
        n = pm.n0 if i <= k else pm.n0 * math.exp(i / k - 1)
        assert pm.hard_limit(math.ceil(n * (1 + 1e-9))) >= i
        out.append(pm.round_epsilon(n))
        if out[-1] < 1e-9:
            return out


@pytest.mark.parametrize("k,p", [(3, 0.5), (20, 0.5), (20, 1.0)])
def test_worst_case_rounds_compose_to_the_budget_by_dp_accounting(tmp_path, k, p):
    eps, delta = 1.0, 1e-6
    ledger = daily_ledger(tmp_path, 1, epsilon=10.0, delta=1e-4, rows=ROWS)
    uni = Universe(columns=("x",), edges=(np.linspace(0, 1, 3),))
    pm = PMWG(
        ledger,
        "s",
        "wc",
        PMWGParams(epsilon=eps, hard_budget=k, growth_exponent=p, delta=delta),
        uni,
        lambda g: generated_block(0)[:, :1],
    )
    pm.observe("b000", ROWS)
    rounds = worst_case_rounds(pm, k)
    pure = pmwg_round_scale(eps, 0.0, k, p)
    if pm.params.round_scale == pure:  # few rounds: basic composition is the tighter of the two, pure epsilon-DP
        assert k == 3 and sum(rounds) <= eps * (1 + 1e-9)
        return
    assert pm.params.round_scale > pure
    rho = sum(e * e / 2 for e in rounds)  # each round is eps_r-DP, hence eps_r^2 / 2-zCDP
    assert rho <= gaussian.zcdp_rho(eps, delta) * (1 + 1e-9) and rho == pytest.approx(
        gaussian.zcdp_rho(eps, delta), rel=1e-6
    )
    # dp-accounting: rho-zCDP has the RDP curve of a Gaussian of multiplier 1 / sqrt(2 rho)
    assert gaussian.rdp_epsilon(1.0 / math.sqrt(2 * rho), delta) <= eps * (1 + 1e-6)


def test_approx_pmwg_charges_epsilon_delta_with_a_larger_round_epsilon(tmp_path):
    """Same blocks, same queries: the (epsilon, delta) run's rounds get a larger epsilon (c 2.09x at k 20, epsilon
    1, delta 1e-6) within its zCDP bound; every block is charged (epsilon, delta) and both runs answer. Their errors
    are not compared: the noise comes from each fresh ledger's private seeds, and at this size the error is the
    threshold's and the histogram's (docs/BENCHMARKS.md, "(epsilon, delta) PMWG")."""
    T, eps, delta = 8, 1.0, 1e-6
    errors, pms = {}, {}
    for d in (0.0, delta):
        (tmp_path / str(d)).mkdir()
        ledger = daily_ledger(tmp_path / str(d), T, epsilon=10.0, delta=1e-4, rows=ROWS)
        uni = Universe(columns=("x", "y"), edges=(np.linspace(0, 1, 6), np.linspace(0, 1, 6)))
        pm = PMWG(
            ledger,
            "s",
            "pmwg",
            PMWGParams(epsilon=eps, hard_budget=20, threshold=0.05, delta=d),
            uni,
            lambda g, led=ledger: generated_block(int(led.verify(g).blocks[0][1:])),
        )
        errs = observe_and_query(pm, uni, T, ROWS)
        spent = [(b["epsilon_spent"], b["delta_spent"]) for b in ledger.status("s")["blocks"]]
        assert spent == [(pytest.approx(eps), pytest.approx(d))] * T and ledger.audit().ok
        errors[d], pms[d] = float(np.mean(errs)), pm
    assert pms[delta].params.round_scale / pms[0.0].params.round_scale == pytest.approx(2.09, abs=0.01)
    assert pms[delta].rho_spent_bound <= gaussian.zcdp_rho(eps, delta)
    assert all(np.isfinite(e) and e < 0.2 for e in errors.values()), errors  # both answer (threshold 0.05)
    assert "delta" not in pms[0.0].meta and pms[delta].meta["delta"] == delta  # pure runs keep their fingerprints


@pytest.mark.parametrize("bad", [-1e-6, 1.0, True, "0"])
def test_bad_delta_refused(bad):
    with pytest.raises(GrowthError, match="delta .* is invalid"):
        PMWGParams(epsilon=1.0, delta=bad)
