"""taxi_classification: will the rider tip more than 20% of the fare? (the big-tipper label of TFX's taxi example)

BlockExampleGen -> DPTransform (the taxi features, with the DP mean speed per hour
of day) -> DPTrainer (DPLogisticRegressor, or DPDNNClassifier: ``--model dnn``,
both DP-SGD) -> DPModelValidator (accuracy target on the raw eval split) -> Pusher.
The stream must hold the ``big_tipper`` column (ingest the big_tipper taxi CSV).
Defined with the public API (sage_tfx.pipelines.SagePipeline).
"""

import os

from sage_tfx.pipelines.definition import SLA, SagePipeline

MODULES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "modules")

PIPELINE = SagePipeline(
    name="taxi_classification",
    sla=SLA(metric="accuracy", label="big_tipper"),
    preprocessing_module=os.path.join(MODULES, "taxi_preprocessing.py"),
    trainer_module=os.path.join(MODULES, "taxi_classification_trainer.py"),
    models=("logistic", "dnn"),
    # a tenth of the training side pays for the REJECT test on the training split (see taxi_regression)
    defaults={"epsilon_start": 0.25, "min_window": 256, "rejection_share": 0.1},
)
