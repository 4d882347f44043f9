"""taxi_regression: trip duration from distance, hour of day and the DP mean speed of that hour (paper List. 1).

BlockExampleGen -> DPTransform (dp_group_by_mean of speed per hour of day, distance
scaled with public bounds) -> DPTrainer (DPLinearRegressor by AdaSSP, or
DPDNNRegressor by DP-SGD: ``--model dnn``) -> DPModelValidator (MSE target, in
seconds^2, on the raw eval split) -> Pusher.

The SLA is on the MSE with each squared error clipped at LOSS_BOUND = (30 min)^2:
the validator's DP noise and concentration terms scale with that bound, and
errors past half an hour are outliers (meter glitches) whose exact size no
model should be judged by. Defined with the public API (sage_tfx.pipelines.SagePipeline),
as a user's own pipeline file would be.
"""

import os

from sage_tfx.pipelines.definition import SLA, SagePipeline

MODULES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "modules")
LABEL = "trip_seconds"
MAX_SECONDS = 3600.0  # public bound of the training label and of predictions
LOSS_BOUND = 1800.0**2  # squared errors are clipped here, in seconds^2

PIPELINE = SagePipeline(
    name="taxi_regression",
    sla=SLA(metric="mse", label=LABEL, loss_bound=LOSS_BOUND),
    preprocessing_module=os.path.join(MODULES, "taxi_preprocessing.py"),
    trainer_module=os.path.join(MODULES, "taxi_regression_trainer.py"),
    models=("linear", "dnn"),
    # rejection_share: a tenth of the training side pays for the validator's REJECT test on the training
    # split (BudgetSplit, rule pre + count + max(train + reject, val)), so an unreachable target ends in REJECT.
    defaults={"epsilon_start": 0.25, "min_window": 256, "rejection_share": 0.1},
    trainer_config={"max_seconds": MAX_SECONDS},
)
