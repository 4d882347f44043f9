"""ERMG: private ERM re-run on a growing database under BBScheduler / BBImprover (sage_tfx/release/growth/ermg.py;
the paper seed 001, Theorem 12). The per-run noise matches what each schedule's proof counts, the whole run sequence
is accounted by dp-accounting, each block is charged once, and the error falls as the database grows.

Data here is GENERATED (a fixed-seed logistic model); the ledger is real (SQLite, tmp_path)."""

import math

import dp_accounting
import numpy as np
import pytest

from sage_tfx.privacy import gaussian
from sage_tfx.privacy.randomness import secure_rng
from sage_tfx.release.continual import ReleaseParams, clip_features, sensitivity, solve_erm
from sage_tfx.release.growth import BBImprover, BBScheduler, GrowthError, ImproverParams, SchedulerParams
from sage_tfx.release.growth.ermg import erm_mechanism, ermg
from tests.helpers.ledgers import daily_ledger

D, M0 = 3, 100
W_TRUE = np.array([2.0, -1.5, 0.5])


def generated_block(index, n=M0):
    rng = np.random.default_rng(700 + index)
    x = rng.normal(size=(n, D)) / 2
    return x, np.sign(x @ W_TRUE + 0.3 * rng.normal(size=n))


def improver(epsilon=1.0, delta=1e-6):
    return BBImprover(ImproverParams(epsilon=epsilon, delta=delta, a=0.1))


def exact_fit(blocks):
    x, y = clip_features(np.concatenate([b[0] for b in blocks]), np.concatenate([b[1] for b in blocks]), "logistic")
    return solve_erm(x, y, normaliser=len(blocks) * M0, lam=0.05, radius=10.0, loss="logistic")


SPEC = ReleaseParams(epsilon=1.0, delta=0.5, records_per_block=M0, lam=0.05)


@pytest.mark.parametrize(
    "schedule,scale",
    [
        (improver(), lambda d2, eps: d2 / eps),  # zCDP: sigma = Delta_2 / epsilon_i (rho_i = epsilon_i^2 / 2)
        (BBScheduler(SchedulerParams(epsilon=1.0, delta=1e-6)), lambda d2, eps: d2 / eps),
        (
            BBScheduler(SchedulerParams(epsilon=1.0)),  # pure: Laplace of scale sqrt(D) Delta_2 / eps, sd sqrt(2) b
            lambda d2, eps: math.sqrt(2) * math.sqrt(D) * d2 / eps,
        ),
        (
            BBScheduler(SchedulerParams(epsilon=1.0, delta=1e-6, composition="basic")),
            lambda d2, eps: gaussian.rdp_multiplier(eps, 1e-7) * d2,
        ),
    ],
)
def test_each_mode_adds_the_noise_its_proof_counts(schedule, scale):
    # 600 draws x 3 cells = 1800 samples: |mean z| > 6 or a variance ratio outside [0.75, 1.25] (7.5 standard
    # errors for the Gaussian, 4.7 for the Laplace's kurtosis-6 variance) each have probability < 2e-6.
    blocks = [generated_block(i) for i in range(4)]
    mech, w = erm_mechanism(schedule, M0), exact_fit(blocks)
    eps, rng = 0.5, secure_rng(99)
    basic = schedule.params.mode.value == "basic" if isinstance(schedule, BBScheduler) else False
    draws = np.array(
        [(mech(blocks, eps, rng, delta=1e-7) if basic else mech(blocks, eps, rng)) - w for _ in range(600)]
    ).ravel()
    sd = scale(sensitivity(SPEC, 4), eps)
    assert abs(draws.mean()) < 6 * sd / math.sqrt(draws.size)
    assert 0.75 < draws.var() / sd**2 < 1.25


def test_the_run_sequence_is_accounted_by_dp_accounting():
    # Every ERMG run under BBImprover is a Gaussian of multiplier 1 / epsilon_t (sigma = Delta_2 / epsilon_t):
    # dp-accounting's RDP accountant composes the first 5,000 runs to at most the schedule's (epsilon, delta).
    sched = improver(epsilon=1.0, delta=1e-6)
    events = [dp_accounting.GaussianDpEvent(1.0 / sched.run_at(t)[1]) for t in range(1, 5001)]
    assert gaussian.rdp_event_epsilon(dp_accounting.ComposedDpEvent(events), 1e-6) <= 1.0 + 1e-6


def test_ermg_charges_each_block_once_and_improves_as_the_data_grows(tmp_path):
    blocks = 24
    ledger = daily_ledger(tmp_path, blocks, epsilon=10.0, delta=1e-4, rows=M0)

    def reader(grant):
        (block,) = ledger.verify(grant).blocks  # only a recorded (charged) grant opens a block
        return generated_block(int(block[1:]))

    rel = ermg(ledger, "s", "ermg", improver(epsilon=4.0, delta=1e-5), reader, rows_per_block=M0)
    distance = []
    for i in range(blocks):
        run = rel.observe(f"b{i:03d}")
        distance.append(float(np.linalg.norm(run.output - exact_fit([generated_block(j) for j in range(i + 1)]))))
    spent = {b["id"]: (b["epsilon_spent"], b["delta_spent"]) for b in ledger.status("s")["blocks"]}
    assert list(spent.values()) == [(pytest.approx(4.0), pytest.approx(1e-5))] * blocks
    assert ledger.audit().ok
    # BBImprover: epsilon_t n_t grows like t^(1/2 - a), so the output's distance to the exact minimiser falls.
    assert np.mean(distance[-6:]) < 0.6 * np.mean(distance[:6])


def test_bad_erm_parameters_refused_before_anything_is_charged(tmp_path):
    ledger = daily_ledger(tmp_path, 1, epsilon=10.0, delta=1e-4, rows=M0)
    with pytest.raises(GrowthError, match="lam"):
        ermg(ledger, "s", "ermg", improver(), lambda g: generated_block(0), rows_per_block=M0, lam=0.0)
    with pytest.raises(GrowthError, match="classes"):
        ermg(ledger, "s", "ermg", improver(), lambda g: generated_block(0), rows_per_block=M0, loss="softmax")
    with pytest.raises(GrowthError, match="approximate"):
        erm_mechanism(BBImprover(ImproverParams(epsilon=1.0, delta=1e-6), approximate=True), M0)
    assert all(b["epsilon_spent"] == 0 for b in ledger.status("s")["blocks"])
