"""DPTrainer module file for the Chicago taxi fare: TFX's ``run_fn(fn_args)`` convention, DP models.

The budget (``fn_args.privacy_budget``), the training-set size (``fn_args.num_examples``, a DP count) and
the training seed (``training_seed`` around run_fn: no ``seed=`` here) come from DPTrainer at run time;
nothing here is private or hard-codes a budget.

``custom_config`` (all optional): ``model`` "dnn" (DPDNNRegressor, default) or "linear"
(DPLinearRegressor, AdaSSP); ``hidden_units``, ``epochs``, ``batch_size``, ``learning_rate``,
``clip_norm`` for the DNN.

Raw examples (BlockExampleGen): features are divided by PUBLIC scales (the same in serving), the fare is
clipped to a public range. With a transform graph (DPTransform), ``features`` in custom_config name the
transformed features instead and the serving signature takes raw tf.Examples through the graph.
"""

import numpy as np

import sage_tfx  # noqa: F401  (before TensorFlow)
from sage_tfx.components import trainer_utils
from sage_tfx.models import DPDNNRegressor, DPLinearRegressor

LABEL = "fare"
FARE_RANGE = (0.0, 100.0)  # dollars: a public bound, not read from the data
# raw feature -> public range (miles, seconds, hour of day): clipped into it, then mapped to [0, 1]
FEATURES = {"trip_miles": (0.0, 30.0), "trip_seconds": (0.0, 7200.0), "trip_start_hour": (0.0, 23.0)}


def build_model(fn_args, config):
    if config.get("model", "dnn") == "linear":
        # mapped rows lie in [0, 1]^3: norm <= sqrt(3)
        return DPLinearRegressor(fn_args.privacy_budget, feature_bound=3**0.5, label_range=FARE_RANGE)
    return DPDNNRegressor(
        fn_args.privacy_budget,
        hidden_units=tuple(config.get("hidden_units", (32, 16))),
        num_examples=fn_args.num_examples,
        epochs=config.get("epochs", 3),
        batch_size=config.get("batch_size", 256),
        learning_rate=config.get("learning_rate", 0.1),
        clip_norm=config.get("clip_norm", 1.0),
    )


def run_fn(fn_args):
    config = fn_args.custom_config or {}
    features = config.get("features") or FEATURES
    x, y = trainer_utils.load_examples(fn_args, features, LABEL)
    y = np.clip(y, *FARE_RANGE)
    model = build_model(fn_args, config).fit(x, y)
    trainer_utils.export_model(fn_args, model, features, label_key=LABEL)
    return trainer_utils.report_spent(fn_args, model)
