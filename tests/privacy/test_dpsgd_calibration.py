"""DP-SGD noise calibration reproduces the target epsilon (no TensorFlow).

Checked against dp_accounting directly and against tensorflow-privacy's
``compute_dp_sgd_privacy_statement`` (loaded through the compat loader, which
imports that module without TensorFlow).
"""

import math
import re
import subprocess
import sys

import pytest

from sage_tfx.privacy import dpsgd

# (epsilon, delta, num_examples, batch_size, epochs): spans small/large budgets,
# sampling rates from 2.6e-4 to 0.1 and 1 to 5 epochs.
GRID = [
    (0.5, 1e-5, 100_000, 256, 3),
    (1.0, 1e-5, 60_000, 256, 1),
    (1.0, 1e-6, 1_000_000, 1024, 3),
    (2.0, 1e-5, 15_000, 512, 3),
    (3.0, 1e-6, 1_000_000, 1024, 5),
    (8.0, 1e-5, 10_000, 1024, 3),
    (0.3, 1e-7, 4_000_000, 1024, 2),
    (5.0, 1e-3, 2_000, 64, 2),
]


def _rdp_epsilon_direct(sigma, delta, n, batch, epochs):
    import dp_accounting
    from dp_accounting.rdp import rdp_privacy_accountant

    steps = math.ceil(epochs * n / batch)
    event = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(batch / n, dp_accounting.GaussianDpEvent(sigma)), steps
    )
    return rdp_privacy_accountant.RdpAccountant().compose(event).get_epsilon(delta)


@pytest.mark.parametrize("epsilon,delta,n,batch,epochs", GRID)
def test_calibrated_sigma_reproduces_target_epsilon(epsilon, delta, n, batch, epochs):
    sigma = dpsgd.calibrate_noise_multiplier(epsilon, delta, n, batch, epochs)
    realised = _rdp_epsilon_direct(sigma, delta, n, batch, epochs)
    assert realised <= epsilon * (1 + 1e-9)  # never over the budget
    assert realised == pytest.approx(epsilon, rel=0.01)
    # the search is tight: 1% less noise overshoots the target
    assert _rdp_epsilon_direct(sigma * 0.99, delta, n, batch, epochs) > epsilon


def _tf_privacy_statement_epsilon(n, batch, epochs, sigma, delta):
    from sage_tfx.compat.tf_privacy import import_submodule

    lib = import_submodule("privacy.analysis.compute_dp_sgd_privacy_lib")
    text = lib.compute_dp_sgd_privacy_statement(
        number_of_examples=n,
        batch_size=batch,
        num_epochs=epochs,
        noise_multiplier=sigma,
        delta=delta,
        used_microbatching=False,
    )
    match = re.search(r"Epsilon assuming Poisson sampling \(\*\):\s+([0-9.]+)", text)
    assert match, text
    return float(match.group(1))


@pytest.mark.parametrize("epsilon,delta,n,batch,epochs", GRID[:6])
def test_calibration_agrees_with_tensorflow_privacy_statement(epsilon, delta, n, batch, epochs):
    sigma = dpsgd.calibrate_noise_multiplier(epsilon, delta, n, batch, epochs)
    printed = _tf_privacy_statement_epsilon(n, batch, epochs, sigma, delta)  # 3 decimals
    assert printed == pytest.approx(epsilon, rel=0.01)


def test_statement_module_and_calibration_import_without_tensorflow():
    # a fresh interpreter: other test modules in the same run may have imported TensorFlow
    code = (
        "import sys\n"
        "from sage_tfx.compat.tf_privacy import import_submodule\n"
        "from sage_tfx.privacy import dpsgd\n"
        "import_submodule('privacy.analysis.compute_dp_sgd_privacy_lib')\n"
        "dpsgd.epsilon_for(1.0, 1e-5, 1000, 10, 1)\n"
        "assert 'tensorflow' not in sys.modules, 'TensorFlow was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_event_and_steps_match_training_shape():
    event = dpsgd.dpsgd_event(1.1, 60_000, 256, 3)
    assert event.count == math.ceil(3 * 60_000 / 256)
    assert event.event.sampling_probability == pytest.approx(256 / 60_000)
    assert event.event.event.noise_multiplier == 1.1
    assert dpsgd.num_steps(3, 1, 3) == 9


def test_epsilon_for_matches_direct_and_decreases_in_sigma():
    e1 = dpsgd.epsilon_for(0.8, 1e-5, 50_000, 500, 2)
    assert e1 == pytest.approx(_rdp_epsilon_direct(0.8, 1e-5, 50_000, 500, 2), rel=1e-12)
    assert dpsgd.epsilon_for(1.6, 1e-5, 50_000, 500, 2) < e1


def test_pld_calibration_reproduces_pld_epsilon():
    sigma = dpsgd.calibrate_noise_multiplier(1.0, 1e-5, 6_000, 600, 1, accountant="pld", rtol=2e-3)
    realised = dpsgd.epsilon_for(sigma, 1e-5, 6_000, 600, 1, accountant="pld")
    assert realised <= 1.0 + 1e-9 and realised == pytest.approx(1.0, rel=0.01)
    # PLD is tighter than RDP: the same target needs less noise
    assert sigma < dpsgd.calibrate_noise_multiplier(1.0, 1e-5, 6_000, 600, 1)


@pytest.mark.parametrize(
    "kwargs,bad",
    [
        (dict(epsilon=0.0), "epsilon=0.0"),
        (dict(epsilon=-1.0), "epsilon=-1.0"),
        (dict(epsilon=float("nan")), "epsilon=nan"),
        (dict(epsilon=float("inf")), "epsilon=inf"),
        (dict(delta=1.0), "delta=1.0"),
        (dict(delta=0.0), "delta=0.0"),
        (dict(num_examples=0), "num_examples=0"),
        (dict(batch_size=2_000_000), "batch_size=2000000"),
        (dict(epochs=-3), "epochs=-3"),
        (dict(accountant="moments"), "accountant='moments'"),
    ],
)
def test_bad_input_names_the_value(kwargs, bad):
    args = dict(epsilon=1.0, delta=1e-5, num_examples=10_000, batch_size=100, epochs=1)
    args.update(kwargs)
    with pytest.raises(ValueError, match=re.escape(bad)):
        dpsgd.calibrate_noise_multiplier(**args)


def test_unreachable_budget_is_refused():
    with pytest.raises(ValueError, match="noise multiplier above"):
        dpsgd.calibrate_noise_multiplier(1e-6, 1e-5, 100, 100, 100)
