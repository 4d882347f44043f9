"""run_fn of the taxi_fare example pipeline (DPTrainer module file, TFX's ``run_fn(fn_args)``).

The budget (``fn_args.privacy_budget``) and the DP training-set size (``fn_args.num_examples``) come from
DPTrainer; the model draws its noise from the grant (no seed here). The served model takes raw tf.Examples
through the transform graph, so the validator and serving see the raw features. It imports its sibling
``preprocessing.py`` for the label's public range, as a module file may (docs/your_pipeline.md).
"""

from preprocessing import MAX_FARE

import sage_tfx  # noqa: F401  (before TensorFlow)
from sage_tfx.components import trainer_utils
from sage_tfx.models import DPDNNRegressor, DPLinearRegressor

FEATURES = ["miles_01", "minutes_01", "hour_rate"]  # each in [0, 1]
LABEL, FARE_RANGE = "fare", (0.0, MAX_FARE)


def run_fn(fn_args):
    config = fn_args.custom_config or {}
    x, y = trainer_utils.load_examples(fn_args, FEATURES, LABEL)
    if config.get("model", "linear") == "linear":
        model = DPLinearRegressor(fn_args.privacy_budget, feature_bound=len(FEATURES) ** 0.5, label_range=FARE_RANGE)
    else:
        model = DPDNNRegressor(
            fn_args.privacy_budget,
            hidden_units=(16,),
            num_examples=fn_args.num_examples,
            epochs=3,
            batch_size=trainer_utils.batch_size(fn_args, config),
            learning_rate=0.1,
        )
    model.fit(x, y)
    trainer_utils.export_model(fn_args, model, label_key=LABEL)
    return trainer_utils.report_spent(fn_args, model)
