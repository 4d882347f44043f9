"""run_fn of taxi_classification: P(big tipper), trained under the grant's training budget (DP-SGD).

``custom_config["model"]``: "logistic" (DPLogisticRegressor) or "dnn" (DPDNNClassifier). The budget, the
DP record count and the training seed (``training_seed`` around run_fn: no ``seed=`` here) come from DPTrainer
at run time. The exported model takes raw tf.Examples.
"""

import sage_tfx  # noqa: F401  (before TensorFlow)
from sage_tfx.components import trainer_utils
from sage_tfx.models import DPDNNClassifier, DPLogisticRegressor

LABEL = "big_tipper"
FEATURES = ["dist_scaled", "hour_of_day_speed", "fare_scaled", "credit_card"]  # transformed, in [0, 1]


def run_fn(fn_args):
    config = fn_args.custom_config or {}
    x, y = trainer_utils.load_examples(fn_args, FEATURES, LABEL)
    common = dict(
        num_examples=fn_args.num_examples,
        epochs=config.get("epochs", 5),
        batch_size=trainer_utils.batch_size(fn_args, config),
        learning_rate=config.get("learning_rate", 0.5),
        clip_norm=config.get("clip_norm", 1.0),
    )
    if config.get("model", "logistic") == "dnn":
        model = DPDNNClassifier(
            fn_args.privacy_budget, hidden_units=tuple(config.get("hidden_units", (32, 16))), **common
        )
    else:
        model = DPLogisticRegressor(fn_args.privacy_budget, **common)
    model.fit(x, y.astype("int64"))
    trainer_utils.export_model(fn_args, model, label_key=LABEL)
    return trainer_utils.report_spent(fn_args, model)
