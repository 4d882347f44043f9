"""PipelineDP's per-partition MEAN on rows saved by `sage bench group-by-mean` (runs in benchmarks/.venv-bench).

Usage: .venv-bench/bin/python pipelinedp_mean.py ROWS.npz --keys K --epsilon E --value-range R
       [--backend beam|local] [--partition-delta D]
Prints JSON: {"version", "backend", "seconds", "means"} (means indexed by key, NaN where PipelineDP gave none).

Same privacy unit as sage's dp_group_by_mean: one row (event level), so each row
bounds its own contribution (contribution_bounds_already_enforced: one partition,
one value); values bounded to [0, R]; Laplace noise. The keys 0..K-1 are public
partitions (total_delta 0: pure epsilon-DP), or, with --partition-delta D, PipelineDP
selects the partitions privately (its Laplace thresholding, total_delta D).
backend beam (the default): a Beam pipeline on the DirectRunner, the rows read in
chunks from the saved arrays inside the pipeline (as sage's side generates its
batches inside its pipeline); local: PipelineDP's LocalBackend on an in-memory list.
Only the DP aggregation (pipeline construction and run) is timed.
"""

import argparse
import glob
import json
import math
import os
import tempfile
import time
from importlib import metadata

import numpy as np
import pipeline_dp

CHUNK = 10_000


def _params(args):
    return pipeline_dp.AggregateParams(
        metrics=[pipeline_dp.Metrics.MEAN],
        noise_kind=pipeline_dp.NoiseKind.LAPLACE,
        max_partitions_contributed=1,
        max_contributions_per_partition=1,
        min_value=0.0,
        max_value=args.value_range,
        contribution_bounds_already_enforced=True,
        partition_selection_strategy=pipeline_dp.PartitionSelectionStrategy.LAPLACE_THRESHOLDING,
    )


def _extractors():
    return pipeline_dp.DataExtractors(partition_extractor=lambda r: r[0], value_extractor=lambda r: r[1])


def _public(args):
    return None if args.partition_delta else list(range(args.keys))


def _accountant(args):
    return pipeline_dp.NaiveBudgetAccountant(total_epsilon=args.epsilon, total_delta=args.partition_delta or 0)


def _run_local(args, keys, values):
    rows = list(zip(keys.tolist(), values.tolist()))
    accountant = _accountant(args)
    engine = pipeline_dp.DPEngine(accountant, pipeline_dp.LocalBackend())
    result = engine.aggregate(rows, _params(args), _extractors(), public_partitions=_public(args))
    accountant.compute_budgets()
    return [(int(k), float(m.mean)) for k, m in result]


def _run_beam(args, keys, values):
    import apache_beam as beam

    chunks = range(-(-keys.size // CHUNK))

    def rows_of(i):
        part = slice(i * CHUNK, (i + 1) * CHUNK)
        return zip(keys[part].tolist(), values[part].tolist())

    accountant = _accountant(args)
    engine = pipeline_dp.DPEngine(accountant, pipeline_dp.BeamBackend())
    with tempfile.TemporaryDirectory() as tmp:
        sink = os.path.join(tmp, "means")
        with beam.Pipeline(runner="DirectRunner") as pipeline:
            rows = pipeline | "Chunks" >> beam.Create(list(chunks)) | "Rows" >> beam.FlatMap(rows_of)
            result = engine.aggregate(rows, _params(args), _extractors(), public_partitions=_public(args))
            accountant.compute_budgets()
            _ = (
                result
                | "Means" >> beam.Map(lambda kv: json.dumps([int(kv[0]), float(kv[1].mean)]))
                | "Write" >> beam.io.WriteToText(sink)
            )
        return [tuple(json.loads(line)) for path in glob.glob(sink + "*") for line in open(path)]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("rows")
    parser.add_argument("--keys", type=int, required=True)
    parser.add_argument("--epsilon", type=float, required=True)
    parser.add_argument("--value-range", type=float, required=True)
    parser.add_argument("--backend", choices=["beam", "local"], default="beam")
    parser.add_argument(
        "--partition-delta",
        type=float,
        default=0.0,
        help="> 0: private partition selection at this delta instead of public partitions",
    )
    args = parser.parse_args()
    data = np.load(args.rows)
    keys, values = data["keys"].astype(np.int64), np.nan_to_num(data["values"], nan=0.0).astype(np.float64)

    start = time.perf_counter()
    result = (_run_beam if args.backend == "beam" else _run_local)(args, keys, values)
    seconds = time.perf_counter() - start

    means = [math.nan] * args.keys
    for key, mean in result:
        means[key] = mean
    print(
        json.dumps(
            {
                "version": metadata.version("pipeline-dp"),
                "backend": args.backend,
                "seconds": seconds,
                "means": [None if math.isnan(m) else m for m in means],
            }
        )
    )


if __name__ == "__main__":
    main()
