"""The Beam side of the DP analyzers (docs/dp_preprocessing.md): the exact grid sums of every row's contribution
(``_GridSumsFn``, keyed ``_KeyedGridSumsFn``) and the ONE noise draw per analysis (``_NoiseOnce``, with private
partition selection ``_SelectOnce``), and the post-processing of the noisy tables. ``analyzers`` builds the graph
side and hands its rows to these transforms; the proof is in its module docstring."""

import sage_tfx  # noqa: F401  (Keras 2 before TensorFlow)  # isort: skip
import operator

import apache_beam as beam  # noqa: TID253
import numpy as np

from sage_tfx.privacy.samplers import grid_sums

from . import beam_memo
from .noise import (
    add_laplace,
    guarded_mean,
    guarded_variance,
    table_grid,
)
from .partitions import MEAN, output_count, select_tables, selection_grid

beam_memo.install()  # Beam re-inspects each DoFn's methods several times per transform: once per object


class _GridSumsFn(beam.CombineFn):
    """Sums the records of the whole data set into exact per-key integer tables on the releases' grids.

    Input: one element per batch, (keys, values_0, ..., values_{T-1}): each row's key in [0, num_cells) (or
    OUT_OF_RANGE: the row counts nowhere) and its contribution to each table. Each contribution is put on its
    table's public grid gamma_i on its own and the integers are added exactly (`samplers.grid_sums`, Python
    ints: no rounding, no overflow), whatever the batching and the order of the rows. Output: each table as
    float64, gamma_i times its integer sums, which `noise.add_laplace` puts back on the same grid unchanged.
    """

    def __init__(self, num_cells, gammas):
        self._num_cells = int(num_cells)
        self._gammas = tuple(float(g) for g in gammas)

    def create_accumulator(self):
        return [np.zeros(self._num_cells, dtype=object) for _ in self._gammas]

    def add_input(self, accumulator, batch):
        keys, values = np.asarray(batch[0]).reshape(-1), batch[1:]
        counted = keys >= 0
        for i, (part, gamma) in enumerate(zip(values, self._gammas)):
            sums = grid_sums(
                np.asarray(part, dtype=np.float64).reshape(-1)[counted], gamma, keys[counted], self._num_cells
            )
            accumulator[i] = accumulator[i] + np.array(sums, dtype=object)
        return accumulator

    def merge_accumulators(self, accumulators):
        accumulators = iter(accumulators)
        merged = next(accumulators)
        for other in accumulators:
            merged = [total + part for total, part in zip(merged, other)]
        return merged

    def extract_output(self, accumulator):
        # gamma times an integer is exact in float64 below 2^53 units; larger sums are refused by the release
        return [
            np.array([float(v) for v in total], dtype=np.float64) * gamma
            for total, gamma in zip(accumulator, self._gammas)
        ]


def _noise_and_finish(exact_tables, scales, finish, seed, stream, sensitivities):
    # one record touches at most one cell of each table (one key, one bucket, or a one-cell total)
    noisy = add_laplace(
        exact_tables, scales, seed=seed, stream=stream, sensitivities=sensitivities, cells=[1] * len(scales)
    )
    return tuple(np.asarray(t, dtype=np.float64) for t in finish(*noisy))


class _NoiseOnce(beam.PTransform):
    """Exact grid sums of the whole data set (`_GridSumsFn`) + one exact grid-Laplace draw per cell
    (`noise.add_laplace`), then post-processing.

    Input: one element per batch, (keys, values per table) of that batch's rows (see `_GridSumsFn`).
    Output: one PCollection per output of `finish`, each holding ONE array.
    """

    def __init__(self, num_cells, scales, finish, n_outputs, seed, stream, sensitivities):
        super().__init__()
        self._num_cells = num_cells
        self._scales = tuple(float(s) for s in scales)
        self._sensitivities = tuple(float(s) for s in sensitivities)
        self._finish = finish
        self._n_outputs = n_outputs
        self._seed = seed
        self._stream = stream

    def expand(self, pcoll):
        # each table's grid is add_laplace's (one record touches one cell): the records are summed on it exactly
        gammas = [table_grid(b, d) for b, d in zip(self._scales, self._sensitivities)]
        outputs = (
            pcoll
            | "SumAllBatches" >> beam.CombineGlobally(_GridSumsFn(self._num_cells, gammas))
            | "AddNoiseOnce"
            >> beam.Map(_noise_and_finish, self._scales, self._finish, self._seed, self._stream, self._sensitivities)
        )
        return tuple(outputs | f"Output{i}" >> beam.Map(operator.itemgetter(i)) for i in range(self._n_outputs))


class _KeyedGridSumsFn(beam.CombineFn):
    """Exact per-key (row count, integer grid sum of the values) over the whole data set, for keys not known in
    advance: a dict key -> [count, grid units], each row put on the public grid gamma alone (`samplers.grid_sums`)."""

    def __init__(self, gamma):
        self._gamma = float(gamma)

    def create_accumulator(self):
        return {}

    def add_input(self, accumulator, batch):
        keys = np.asarray(batch[0]).reshape(-1)
        if not keys.size:
            return accumulator
        distinct, cell = np.unique(keys, return_inverse=True)
        sums = grid_sums(
            np.asarray(batch[1], dtype=np.float64).reshape(-1), self._gamma, cell.reshape(-1), distinct.size
        )
        for key, count, units in zip(distinct.tolist(), np.bincount(cell.reshape(-1)).tolist(), sums):
            total = accumulator.setdefault(key, [0, 0])
            total[0] += count
            total[1] += units
        return accumulator

    def merge_accumulators(self, accumulators):
        accumulators = iter(accumulators)
        merged = next(accumulators)
        for other in accumulators:
            for key, (count, units) in other.items():
                total = merged.setdefault(key, [0, 0])
                total[0] += count
                total[1] += units
        return merged

    def extract_output(self, accumulator):
        return accumulator


class _SelectOnce(_NoiseOnce):
    """Exact keyed grid sums of the whole data set, then ONE `partitions.select_tables`: its 1-D arrays (the kept
    keys first)."""

    def __init__(self, key_dtype, selection, seed, stream):
        selection = dict(selection)
        selection.setdefault("kind", MEAN)
        super().__init__(0, [], None, output_count(selection["kind"]), seed, stream, sensitivities=[])
        self._key_dtype = key_dtype
        self._selection = selection

    def expand(self, pcoll):
        selection, seed, stream, key_dtype = self._selection, self._seed, self._stream, self._key_dtype
        gamma = selection_grid(
            selection["kind"],
            selection["epsilon"],
            selection["value_range"],
            selection["mean_form"],
            selection["max_partitions_contributed"],
        )

        def release(tables):
            keys = list(tables)
            counts = [float(tables[k][0]) for k in keys]
            sums = [float(tables[k][1]) * gamma for k in keys]  # exact below 2^53 grid units
            kept, *out = select_tables(keys, counts, sums, seed=seed, stream=stream, **selection)
            return (np.array(kept, dtype=key_dtype), *out)

        released = (
            pcoll | "SumByKey" >> beam.CombineGlobally(_KeyedGridSumsFn(gamma)) | "SelectOnce" >> beam.Map(release)
        )
        return tuple(released | f"Output{i}" >> beam.Map(operator.itemgetter(i)) for i in range(self._n_outputs))


def _as_is(*tables):
    return tables


def _mean_tables(counts, shifted_sums, value_range, shift=0.0, min_count=None, fallback=None):
    """(noisy counts, noisy sums of v - shift) -> (counts, sums of v estimated as S~ + shift * n~, means)."""
    means = guarded_mean(shifted_sums, counts, value_range, shift=shift)
    if min_count is not None:  # the choice reads only the noisy count: post-processing
        means = np.where(np.asarray(counts) < min_count, fallback, means)
    return counts, np.asarray(shifted_sums) + shift * np.asarray(counts), means


def _variance_table(counts, centred_sums, centred_squares, value_range):
    return (guarded_variance(counts, centred_sums, centred_squares, value_range),)
