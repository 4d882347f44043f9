"""Timing harness for tf.Transform benches (group-by-mean, analyzers): one preprocessing_fn through
tft_beam.AnalyzeAndTransformDataset on the Beam DirectRunner, over record batches GENERATED inside the
pipeline, into a tiny in-process sink; and alternating, order-rotating repeats of several such pipelines.

Not a benchmark itself (the leading underscore keeps it out of `sage bench`).
"""

import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

_SINKS: dict[str, list] = {}  # run id -> collected output (the DirectRunner runs in this process)


def log(bench: str, message: str) -> None:
    print(f"[{bench}] {message}", file=sys.stderr, flush=True)


def arrow_batch(columns: dict[str, Any]):
    """An Arrow record batch with one value per row in each column (LargeList, as tfx_bsl's decoders give)."""
    import pyarrow as pa

    rows = len(next(iter(columns.values())))
    offsets = pa.array(np.arange(rows + 1, dtype=np.int64))
    return pa.RecordBatch.from_arrays(
        [pa.LargeListArray.from_arrays(offsets, pa.array(values)) for values in columns.values()], list(columns)
    )


def _collect(value, run_id):
    _SINKS[run_id].append(value)


def run_tft(
    preprocessing_fn: Callable,
    feature_spec: dict[str, Any],
    make_batch: Callable[[int], Any],
    n_batches: int,
    summarize: Callable,
    merge: Callable,
    run_id: str,
) -> tuple[float, Any]:
    """Analyze and transform batches make_batch(0 .. n_batches - 1) (generated inside the pipeline: nothing
    big is pickled); every output record batch goes through ``summarize`` (a small value), all of them
    through ``merge``. Returns (wall seconds of the whole pipeline, the merged summary)."""
    import apache_beam as beam
    import tensorflow_transform as tft
    import tensorflow_transform.beam as tft_beam
    from tfx_bsl.tfxio import tensor_adapter, tensor_representation_util

    schema = tft.DatasetMetadata.from_feature_spec(feature_spec).schema
    config = tensor_adapter.TensorAdapterConfig(
        make_batch(0).schema, tensor_representation_util.InferTensorRepresentationsFromSchema(schema)
    )
    _SINKS[run_id] = []
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        with beam.Pipeline(argv=[]) as pipeline, tft_beam.Context(temp_dir=tmp):
            raw = (
                pipeline
                | "BatchIndices" >> beam.Create(range(n_batches), reshuffle=False)
                | "Generate" >> beam.Map(make_batch)
            )
            (transformed, _), _ = (raw, config) | tft_beam.AnalyzeAndTransformDataset(
                preprocessing_fn, output_record_batches=True
            )
            _ = (
                transformed
                | "Summarize" >> beam.Map(summarize)
                | "Merge" >> beam.CombineGlobally(merge)
                | "Sink" >> beam.Map(_collect, run_id)
            )
    seconds = time.perf_counter() - start
    return seconds, _SINKS.pop(run_id)[0]


def alternate(
    runs: Sequence[tuple[str, Callable[[str], tuple[float, Any]]]], repeats: int, bench: str
) -> dict[str, list[tuple[float, Any]]]:
    """Run each (label, run(run_id) -> (seconds, result)) ``repeats`` times, rotating the order each repeat
    (so no pipeline always runs first or last on a shared machine); {label: [(seconds, result), ...]}."""
    results: dict[str, list[tuple[float, Any]]] = {label: [] for label, _ in runs}
    runs = list(runs)
    for repeat in range(repeats):
        shift = repeat % len(runs)
        for label, fn in runs[shift:] + runs[:shift]:
            seconds, result = fn(f"{label}-{repeat}")
            log(bench, f"repeat {repeat + 1}/{repeats}: {label} {seconds:.2f} s")
            results[label].append((seconds, result))
    return results


def median_seconds(results: list[tuple[float, Any]]) -> float:
    return statistics.median(seconds for seconds, _ in results)
