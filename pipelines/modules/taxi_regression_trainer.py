"""run_fn of taxi_regression: trip duration in seconds, trained under the grant's training budget.

``custom_config["model"]``: "linear" (DPLinearRegressor, AdaSSP: (epsilon, delta)-DP sufficient
statistics) or "dnn" (DPDNNRegressor, DP-SGD; trained on hours, served in seconds). The budget
(fn_args.privacy_budget), the DP record count (fn_args.num_examples) and the training seed
(``training_seed`` around run_fn: no ``seed=`` here) come from DPTrainer at run time. The exported model takes raw tf.Examples and predicts seconds.
"""

import numpy as np

import sage_tfx  # noqa: F401  (before TensorFlow)
from sage_tfx.components import trainer_utils
from sage_tfx.models import DPDNNRegressor, DPLinearRegressor

LABEL = "trip_seconds"
MAX_SECONDS = 3600.0
FEATURES = ["dist_scaled", "hour_of_day_speed", "expected_hours"]  # transformed, each in [0, 1]


def run_fn(fn_args):
    config = fn_args.custom_config or {}
    x, y = trainer_utils.load_examples(fn_args, FEATURES, LABEL)
    y = np.clip(y, 0.0, MAX_SECONDS)
    if config.get("model", "linear") == "dnn":
        model = DPDNNRegressor(
            fn_args.privacy_budget,
            hidden_units=tuple(config.get("hidden_units", (32, 16))),
            num_examples=fn_args.num_examples,
            epochs=config.get("epochs", 5),
            batch_size=trainer_utils.batch_size(fn_args, config),
            learning_rate=config.get("learning_rate", 0.1),
            clip_norm=config.get("clip_norm", 1.0),
        ).fit(x, y / MAX_SECONDS)
        trainer_utils.export_model(fn_args, model, label_key=LABEL, output_scale=MAX_SECONDS)  # hours -> seconds
    else:
        model = DPLinearRegressor(
            fn_args.privacy_budget, feature_bound=len(FEATURES) ** 0.5, label_range=(0.0, MAX_SECONDS)
        ).fit(x, y)
        trainer_utils.export_model(fn_args, model, label_key=LABEL)
    return trainer_utils.report_spent(fn_args, model)
