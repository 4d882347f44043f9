"""taxi_regression: trip duration from distance, hour of day and the DP mean speed of that hour (paper List. 1).

BlockExampleGen -> DPTransform (dp_group_by_mean of speed per hour of day, distance
scaled with public bounds) -> DPTrainer (DPLinearRegressor by AdaSSP, or
DPDNNRegressor by DP-SGD: ``--model dnn``) -> DPModelValidator (MSE target, in
seconds^2, on the raw eval split) -> Pusher.

The SLA is on the MSE with each squared error clipped at LOSS_BOUND = (30 min)^2:
the validator's DP noise and concentration terms scale with that bound, and
errors past half an hour are outliers (meter glitches) whose exact size no
model should be judged by.
"""
import math
import os

from sage_tfx.pipelines import _runner, _taxi

NAME = "taxi_regression"
METRIC = "mse"
LABEL = "trip_seconds"
MAX_SECONDS = 3600.0  # public bound of the training label and of predictions
LOSS_BOUND = 1800.0 ** 2  # squared errors are clipped here, in seconds^2
MODELS = ("linear", "dnn")
# rejection_share: a tenth of the training side pays for the validator's REJECT test on the training split
# (BudgetSplit, rule pre + count + max(train + reject, val)), so an unreachable target ends in REJECT.
DEFAULTS = {"epsilon_start": 0.25, "min_window": 256, "rejection_share": 0.1}


def check_target(target):
    """An MSE target (seconds^2) must be a positive number below the loss bound, or it can never be met."""
    if not (isinstance(target, (int, float)) and math.isfinite(target) and 0 < target):
        raise ValueError(f"MSE target {target!r} can never be met: it must be a positive number of seconds^2")
    if target >= LOSS_BOUND:
        raise ValueError(f"MSE target {target!r} is at least the loss bound {LOSS_BOUND:g} seconds^2: every model "
                         "meets it, so there is nothing to validate")


def build_pipeline(config, grant, split, eta, iteration):
    model = _runner.model_family(config, NAME, MODELS)
    return _taxi.build(
        config, grant, eta,
        preprocessing_module=os.path.join(_taxi.MODULES, "taxi_preprocessing.py"),
        trainer_module=os.path.join(_taxi.MODULES, "taxi_regression_trainer.py"),
        metric=METRIC, label_key=LABEL, loss_bound=LOSS_BOUND,
        trainer_config={"model": model, "max_seconds": MAX_SECONDS})
