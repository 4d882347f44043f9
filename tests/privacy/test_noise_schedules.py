"""Noise schedules for DP-SGD (sage_tfx.privacy.noise_schedules, seed 002).

Numpy tests: the accounting equals dp_accounting's composition of the per-step events, calibrated
schedules spend the budget, the bound-optimal shape is Lemma 3.1's minimiser, bad schedules are refused
naming the value. TF tests (marked): the engine really adds N(0, (sigma_t C)^2) at step t, the DP models
and make_private record the composed event, refuse bad schedules before training, and the default is
unchanged. All data here is GENERATED (numpy, fixed seeds).
"""

import math
import re

import dp_accounting
import numpy as np
import pytest
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.rdp import rdp_privacy_accountant

from sage_tfx.privacy import dpsgd
from sage_tfx.privacy import noise_schedules as ns
from sage_tfx.privacy.errors import SageError

DELTA = 1e-5


def _per_step_event(sigmas, q):
    """The run as the brief states it: one PoissonSampled Gaussian event per step, composed in order."""
    return dp_accounting.ComposedDpEvent(
        [dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(float(s))) for s in sigmas]
    )


@pytest.mark.slow(weight=20)
def test_accounting_equals_per_step_composition_rdp_and_pld():
    sched = ns.ExponentialSchedule(final_ratio=0.4, stages=4)
    sigmas = sched.noise_multipliers(1.3, 12)
    assert len(set(sigmas.tolist())) == 4 and np.all(np.diff(sigmas) <= 0)
    q = 0.05
    direct = rdp_privacy_accountant.RdpAccountant().compose(_per_step_event(sigmas, q)).get_epsilon(DELTA)
    assert ns.schedule_epsilon(sigmas, q, DELTA) == pytest.approx(direct, rel=1e-12)
    few = sigmas[[0, 3, 4]]  # 3 steps, 2 distinct sigmas (PLD is slow): PLD on the per-step events vs ours
    direct_pld = pld_privacy_accountant.PLDAccountant().compose(_per_step_event(few, q)).get_epsilon(DELTA)
    assert ns.schedule_epsilon(few, q, DELTA, accountant="pld") == pytest.approx(direct_pld, rel=1e-9)
    # a decaying schedule is NOT accounted as its mean sigma: the per-step composition differs
    mean = rdp_privacy_accountant.RdpAccountant().compose(_per_step_event(np.full(12, sigmas.mean()), q))
    assert mean.get_epsilon(DELTA) != pytest.approx(direct, rel=1e-3)


def test_constant_schedule_is_the_dpsgd_event():
    run = ns.scheduled_spend(None, 1.0, DELTA, 5_000, 100, 1)
    sigma, event, eps, steps = dpsgd.dpsgd_spend(1.0, DELTA, 5_000, 100, 1)
    assert run.dp_event == event and run.scale == sigma and run.epsilon == eps and run.steps == steps
    assert np.all(run.noise_multipliers == sigma)
    assert ns.schedule_event(run.noise_multipliers, 100 / 5_000) == event


@pytest.mark.parametrize(
    "schedule",
    [  # one calibration each (5-10 s): one in the edit-test loop, all in `make test`
        ns.StepSchedule(factor=0.5, drops=2),
        pytest.param(ns.ExponentialSchedule(final_ratio=0.3, stages=5), marks=pytest.mark.slow(weight=20)),
        pytest.param(ns.PolynomialSchedule(final_ratio=0.3, power=2.0, stages=5), marks=pytest.mark.slow(weight=20)),
        pytest.param(ns.BoundOptimalSchedule(gamma=0.97, stages=5), marks=pytest.mark.slow(weight=20)),
    ],
    ids=lambda s: s.kind.value,
)
def test_calibrated_schedule_spends_the_budget(schedule):
    epsilon, steps, q = 1.0, 40, 0.05
    scale = ns.calibrate_schedule(schedule, epsilon=epsilon, delta=DELTA, steps=steps, sampling_rate=q)
    sigmas = schedule.noise_multipliers(scale, steps)
    direct = rdp_privacy_accountant.RdpAccountant().compose(_per_step_event(sigmas, q)).get_epsilon(DELTA)
    assert direct <= epsilon * (1 + 1e-9)  # never over the budget
    assert direct == pytest.approx(epsilon, rel=1e-3)  # and spends it
    # tight: 1% less noise on the whole schedule overshoots
    assert ns.schedule_epsilon(sigmas * 0.99, q, DELTA) > epsilon
    assert sigmas[0] > sigmas[-1]  # it decays


def test_factors_shapes():
    assert ns.ExponentialSchedule(final_ratio=0.25, stages=3).factors(6).tolist() == [1, 1, 0.5, 0.5, 0.25, 0.25]
    step = ns.StepSchedule(factor=0.5, drops=1).factors(4)
    assert step.tolist() == [1, 1, 0.5, 0.5]
    poly = ns.PolynomialSchedule(final_ratio=0.5, power=2, stages=3).factors(3)
    assert poly == pytest.approx([1.0, 0.5 + 0.5 * 0.25, 0.5])
    assert ns.ConstantSchedule().factors(7).tolist() == [1.0] * 7
    # more stages than steps: one stage per step
    assert len(set(ns.ExponentialSchedule(final_ratio=0.5, stages=50).factors(5).tolist())) == 5


def test_bound_optimal_is_lemma_3_1_minimiser():
    """Per step (stages = T), f_t = sigma_t / sigma_1 of Lemma 3.1 with q_t = gamma^(T-t) alpha, and it
    attains the minimum (sum_t sqrt(q_t))^2 of R sum q_t sigma_t^2 under sum sigma_t^-2 = R, below the
    constant schedule's value at the same R."""
    gamma, T, alpha, R = 0.9, 30, 0.7, 5.0
    t = np.arange(1, T + 1)
    q = gamma ** (T - t) * alpha
    lemma = np.sqrt(np.array([np.sum(np.sqrt(q / qt)) for qt in q]) / R)
    f = ns.BoundOptimalSchedule(gamma=gamma, stages=T).factors(T)
    assert f == pytest.approx(lemma / lemma[0], rel=1e-12)
    assert np.sum(lemma**-2.0) == pytest.approx(R)
    assert R * np.sum(q * lemma**2) == pytest.approx(np.sum(np.sqrt(q)) ** 2)
    constant = np.full(T, math.sqrt(T / R))  # sum sigma^-2 = R
    assert R * np.sum(q * lemma**2) < R * np.sum(q * constant**2)


@pytest.mark.parametrize(
    "make,bad",
    [
        (lambda: ns.StepSchedule(factor=1.5), "factor=1.5"),
        (lambda: ns.StepSchedule(factor=0.0), "factor=0.0"),
        (lambda: ns.StepSchedule(factor=0.1, drops=3), "factor=0.1 with drops=3"),
        (lambda: ns.StepSchedule(drops=0), "drops=0"),
        (lambda: ns.ExponentialSchedule(final_ratio=0.001), "final_ratio=0.001"),
        (lambda: ns.ExponentialSchedule(final_ratio=-0.5), "final_ratio=-0.5"),
        (lambda: ns.PolynomialSchedule(power=-1), "power=-1"),
        (lambda: ns.PolynomialSchedule(final_ratio=float("nan")), "final_ratio=nan"),
        (lambda: ns.BoundOptimalSchedule(gamma=1.0), "gamma=1.0"),
        (lambda: ns.ConstantSchedule(stages=0), "stages=0"),
        (lambda: ns.make_schedule("linear"), "kind='linear'"),
        (lambda: ns.as_schedule(3), "noise_schedule=3"),
        (lambda: ns.schedule_event([1.0, 0.0, 1.0], 0.1), "noise multiplier 0.0 of step 1"),
        (lambda: ns.schedule_event([1.0, -2.0], 0.1), "noise multiplier -2.0 of step 1"),
        (lambda: ns.schedule_event([1.0], 1.5), "sampling_rate=1.5"),
        # a decay that breaks the budget over this run: gamma^(t/4) falls below 1/100 of the first sigma
        (lambda: ns.BoundOptimalSchedule(gamma=0.9).check_for_run(400), "decays to"),
        (
            lambda: ns.calibrate_schedule(
                ns.BoundOptimalSchedule(gamma=0.9), epsilon=1.0, delta=DELTA, steps=400, sampling_rate=0.01
            ),
            "decays to",
        ),
        (
            lambda: ns.calibrate_schedule(ns.StepSchedule(), epsilon=0.0, delta=DELTA, steps=10, sampling_rate=0.1),
            "epsilon=0.0",
        ),
        # the floor is a parameter; nonsense floors are refused naming the value
        (lambda: ns.BoundOptimalSchedule(gamma=0.9, floor=0.0), "floor=0.0"),
        (lambda: ns.BoundOptimalSchedule(gamma=0.9, floor=1e-9), "floor=1e-09"),
        (lambda: ns.ExponentialSchedule(final_ratio=0.5, floor=1.5), "floor=1.5"),
        (lambda: ns.ExponentialSchedule(floor=float("inf")), "floor=inf"),
        (lambda: ns.StepSchedule(floor="low"), "floor='low'"),
        (lambda: ns.ExponentialSchedule(final_ratio=1e-3, floor=1e-2), "final_ratio=0.001"),
        (lambda: ns.BoundOptimalSchedule(gamma=0.9, floor=1e-4).check_for_run(400), "below floor=0.0001"),
    ],
)
def test_bad_schedules_refused_naming_the_value(make, bad):
    with pytest.raises(dpsgd.DpSgdConfigError, match=re.escape(bad)) as info:
        make()
    assert isinstance(info.value, SageError) and isinstance(info.value, ValueError)


def test_lower_floor_admits_the_bound_optimal_shape_of_a_long_run():
    """T = 400 steps at kappa = 10 (gamma 0.9): Lemma 3.1's per-step shape ends at gamma^(399/4) ~ 3e-5,
    refused at the default floor 1/100 and taken exactly with floor=1e-5; it round-trips with its floor."""
    with pytest.raises(ns.NoiseScheduleError, match="below floor=0.01"):
        ns.BoundOptimalSchedule(gamma=0.9, stages=400).check_for_run(400)
    sched = ns.BoundOptimalSchedule(gamma=0.9, stages=400, floor=1e-5)
    f = sched.factors(400)
    assert f == pytest.approx(0.9 ** (np.arange(400) / 4.0), rel=1e-12) and f[-1] < 1e-4
    assert ns.as_schedule(sched.to_dict()) == sched and sched.to_dict()["floor"] == 1e-5
    assert ns.ExponentialSchedule(final_ratio=1e-3, floor=1e-3).factors(10)[-1] == pytest.approx(1e-3)


def test_schedule_round_trips_through_dict():
    sched = ns.PolynomialSchedule(final_ratio=0.2, power=3.0, stages=7)
    assert ns.as_schedule(sched.to_dict()) == sched
    assert ns.as_schedule("exponential") == ns.ExponentialSchedule()
    assert ns.as_schedule(None).is_constant


# --------------------------------------------------------------------------------------------- TensorFlow


@pytest.mark.tf
def test_engine_adds_the_scheduled_sigma_per_step():
    """make_private with a zero-gradient loss and SGD (lr 1, no momentum): step t moves the d = 1001 weights
    by -noise_t / B, noise_t ~ N(0, (sigma_t C)^2 I). So S_t = ||dw_t||^2 (B / (sigma_t C))^2 ~ chi2(d) iff the
    graph used sigma_t. Each step's two-sided test has level 1e-8; over the steps and the check against the
    constant sigma the false-failure rate is <= 1e-6 (fixed seed: deterministic anyway)."""
    import tensorflow as tf
    from scipy import stats

    import sage_tfx  # noqa: F401
    from sage_tfx.models import make_private

    def _zero_loss(y, out):
        """A per-example loss with zero gradient: every step's update is the noise alone."""
        return 0.0 * tf.reduce_sum(out, axis=1)

    d_in, n, batch, clip = 1000, 200, 20, 0.5
    init = tf.keras.initializers.Zeros()
    model = tf.keras.Sequential([tf.keras.layers.Dense(1, kernel_initializer=init)])
    model.build((None, d_in))
    sched = ns.ExponentialSchedule(final_ratio=0.25, stages=5)
    private = make_private(
        model,
        privacy_budget=(2.0, DELTA),
        num_examples=n,
        clip_norm=clip,
        batch_size=batch,
        epochs=1,
        learning_rate=1.0,
        loss=_zero_loss,
        seed=3,
        noise_schedule=sched,
    )
    weights = []
    x = np.random.default_rng(0).normal(size=(n, d_in)).astype(np.float32)
    y = np.zeros(n, np.float32)

    def record(step):
        weights.append(np.concatenate([w.ravel() for w in private.model.get_weights()]))

    private.fit(x, y, callback=record)
    spent = private.privacy_spent
    sigmas = np.array([s for s, k in spent["noise_schedule"]["stages"] for _ in range(k)])
    assert len(sigmas) == spent["steps"] == 10 and sigmas[0] / sigmas[-1] == pytest.approx(4.0)
    d = weights[0].size
    deltas = np.diff(np.vstack([np.zeros(d)] + weights), axis=0)
    level = 1e-8
    lo, hi = stats.chi2.ppf(level / 2, d), stats.chi2.ppf(1 - level / 2, d)
    for t, (dw, s) in enumerate(zip(deltas, sigmas)):
        stat = np.sum(dw.astype(np.float64) ** 2) * (batch / (s * clip)) ** 2
        assert lo < stat < hi, (t, stat / d, s)
        # the first sigma at the last step would be far off: the schedule really changed the noise
        if s < sigmas[0]:
            stat0 = np.sum(dw.astype(np.float64) ** 2) * (batch / (sigmas[0] * clip)) ** 2
            assert not lo < stat0 < hi
    # the run's event is the per-step composition, and it spends the budget
    direct = (
        rdp_privacy_accountant.RdpAccountant()
        .compose(_per_step_event(sigmas, spent["sampling_rate"]))
        .get_epsilon(DELTA)
    )
    assert dpsgd.event_epsilon(spent["dp_event"], DELTA) == pytest.approx(direct, rel=1e-12)
    assert spent["epsilon"] <= 2.0 and spent["epsilon"] == pytest.approx(2.0, rel=1e-3)


@pytest.mark.tf
def test_models_refuse_bad_schedules_before_training_and_default_is_unchanged():
    import tensorflow as tf

    import sage_tfx  # noqa: F401
    from sage_tfx.models import DPDNNRegressor, make_private

    with pytest.raises(ValueError, match=re.escape("kind='linear'")):
        DPDNNRegressor((1.0, DELTA), hidden_units=(4,), noise_schedule="linear")
    with pytest.raises(ValueError, match="tf_privacy"):
        DPDNNRegressor((1.0, DELTA), hidden_units=(4,), implementation="tf_privacy", noise_schedule=ns.StepSchedule())
    model = tf.keras.Sequential([tf.keras.layers.Dense(1)])
    model.build((None, 3))
    before = [w.copy() for w in model.get_weights()]
    with pytest.raises(ns.NoiseScheduleError, match="decays to"):  # 400 steps: gamma^(t/4) too steep
        make_private(
            model,
            privacy_budget=(1.0, DELTA),
            num_examples=4_000,
            batch_size=10,
            epochs=1,
            loss="mse",
            noise_schedule=ns.BoundOptimalSchedule(gamma=0.9),
        )
    assert all(np.array_equal(a, b) for a, b in zip(before, model.get_weights()))  # nothing trained

    rng = np.random.default_rng(1)
    x = rng.normal(size=(300, 3)).astype(np.float32)
    y = (x @ np.array([1.0, -2.0, 0.5]) + rng.normal(size=300) * 0.1).astype(np.float32)
    fits = []
    for schedule in (None, ns.ConstantSchedule()):
        kwargs = {} if schedule is None else {"noise_schedule": schedule}
        est = DPDNNRegressor(
            (1.0, DELTA), hidden_units=(4,), num_examples=300, batch_size=30, epochs=2, seed=5, **kwargs
        ).fit(x, y)
        fits.append(est)
    a, b = fits
    assert all(np.array_equal(u, v) for u, v in zip(a.model.get_weights(), b.model.get_weights()))
    sigma, event, eps, steps = dpsgd.dpsgd_spend(1.0, DELTA, 300, 30, 2)
    assert a.privacy_spent["dp_event"] == event and a.privacy_spent["noise_multiplier"] == sigma
    assert a.privacy_spent["epsilon"] == eps and "noise_schedule" not in a.privacy_spent
    dec = DPDNNRegressor(
        (1.0, DELTA),
        hidden_units=(4,),
        num_examples=300,
        batch_size=30,
        epochs=2,
        seed=5,
        noise_schedule=ns.StepSchedule(factor=0.5, drops=1),
    ).fit(x, y)
    spent = dec.privacy_spent
    assert isinstance(spent["dp_event"], dp_accounting.ComposedDpEvent)
    assert spent["noise_schedule"]["kind"] == "step" and spent["epsilon"] <= 1.0
    assert spent["noise_schedule"]["first_sigma"] == pytest.approx(2 * spent["noise_schedule"]["last_sigma"])
