"""taxi_classification: will the rider tip more than 20% of the fare? (the big-tipper label of TFX's taxi example)

BlockExampleGen -> DPTransform (the taxi features, with the DP mean speed per hour
of day) -> DPTrainer (DPLogisticRegressor, or DPDNNClassifier: ``--model dnn``,
both DP-SGD) -> DPModelValidator (accuracy target on the raw eval split) -> Pusher.
The stream must hold the ``big_tipper`` column (ingest the big_tipper taxi CSV).
"""
import math
import os

from sage_tfx.pipelines import _runner, _taxi

NAME = "taxi_classification"
METRIC = "accuracy"
LABEL = "big_tipper"
MODELS = ("logistic", "dnn")
# rejection_share: a tenth of the training side pays for the validator's REJECT test on the training split
# (BudgetSplit, rule pre + count + max(train + reject, val)), so an unreachable target ends in REJECT.
DEFAULTS = {"epsilon_start": 0.25, "min_window": 256, "rejection_share": 0.1}


def check_target(target):
    """An accuracy target must lie in (0, 1): 0 or less is always met, above 1 never."""
    if not (isinstance(target, (int, float)) and math.isfinite(target) and 0 < target < 1):
        raise ValueError(f"accuracy target {target!r} can never be met meaningfully: it must lie in (0, 1)")


def build_pipeline(config, grant, split, eta, iteration):
    model = _runner.model_family(config, NAME, MODELS)
    return _taxi.build(
        config, grant, eta,
        preprocessing_module=os.path.join(_taxi.MODULES, "taxi_preprocessing.py"),
        trainer_module=os.path.join(_taxi.MODULES, "taxi_classification_trainer.py"),
        metric=METRIC, label_key=LABEL, trainer_config={"model": model})
