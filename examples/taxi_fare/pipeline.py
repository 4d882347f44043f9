"""A user's own privacy-adaptive pipeline, with the public API alone: the taxi fare from distance and time.

    sage run examples/taxi_fare/pipeline.py --db ledger.db --stream taxi --data-root data --target 120

Three files, as a TFX user writes them: this one (the SLA and the modules), ``preprocessing.py``
(``preprocessing_fn`` with a DP analyzer) and ``trainer.py`` (``run_fn`` with a DP model).
docs/your_pipeline.md walks through them.
"""

from sage_tfx.pipelines import SLA, SagePipeline

PIPELINE = SagePipeline(
    name="taxi_fare",
    # MSE in dollars^2, each squared error clipped at $30^2: a public bound chosen before seeing data
    sla=SLA(metric="mse", label="fare", loss_bound=30.0**2),
    preprocessing_module="preprocessing.py",  # beside this file
    trainer_module="trainer.py",
    models=("linear", "dnn"),
    # the first iteration's per-block epsilon and window; a tenth of the training side pays for the REJECT
    # test on the training split, so an out-of-reach target ends in REJECT (exit 4)
    defaults={"epsilon_start": 0.5, "min_window": 128, "rejection_share": 0.1},
)
