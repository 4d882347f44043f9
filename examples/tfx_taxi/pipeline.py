"""TFX's own Chicago taxi example (taxi_utils_native_keras.py), made private, as a sage-tfx pipeline.

    sage run examples/tfx_taxi/pipeline.py --db ledger.db --stream taxi --data-root data --target 0.8

One module file serves DPTransform (``preprocessing_fn``) and DPTrainer (``run_fn``), as the original serves
TFX's Transform and Trainer. The SLA is TFX's own task: is the trip's tip more than 20% of its fare (the
label ``tips_xf`` the preprocessing_fn derives)? The validator reads that label through the model's
``transform_features`` signature, as TFMA's ``preprocessing_function_names`` does for the original.
docs/your_pipeline.md shows the diff against the original and a run on the taxi stream.
"""

from sage_tfx.pipelines import SLA, SagePipeline

PIPELINE = SagePipeline(
    name="tfx_taxi",
    sla=SLA(metric="accuracy", label="tips_xf", label_signature="transform_features"),
    preprocessing_module="taxi_utils_native_keras.py",
    trainer_module="taxi_utils_native_keras.py",
    # preprocessing_delta: the two DP vocabularies (payment_type, company) select their keys with a delta;
    # it is charged on top of training's
    defaults={"epsilon_start": 1.0, "min_window": 256, "rejection_share": 0.1, "preprocessing_delta": 1e-8},
)
