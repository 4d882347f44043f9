"""Private partition selection for the per-key mean, count and sum: keys not known in advance (numpy only).

`select_tables` is what ``dp_mean_per_key`` / ``dp_count_per_key`` / ``dp_sum_per_key(..., partition_selection=...)``'s
Beam step runs ONCE on the exact per-key tables of the whole data set: a grid-Laplace count (eps_n) and, for the mean
and the sum, a sum table (eps_s) over the keys present, a key kept iff its noisy count reaches
`vocabulary.threshold(eps_n, delta, m)` (`select_and_release`: the mean's). Contract: (epsilon, delta)-DP with
epsilon = eps_n + eps_s, under add/remove one row.

Mechanism and proof: docs/dp_preprocessing.md ("Keys not known in advance: private partition selection").
"""

import numpy as np

from .moments import MomentRelease
from .noise import _table_epsilon, add_laplace, check_int, guarded_mean, mean_release, table_grid
from .vocabulary import check_delta, threshold

DEFAULT_MAX_PARTITIONS = 1
MEAN, COUNT, SUM = "mean", "count", "sum"  # what a selection releases per kept key
# The selected sum's count table selects only (it is not part of the sum's estimate): no error rule splits a
# threshold's budget against the sum's noise, so it is PipelineDP's even split of the two.
SUM_SELECTION_SHARE = 0.5


def check_selection(delta, max_partitions_contributed, label: str) -> tuple[float, int]:
    """(delta, m) checked before anything is charged; raise naming the bad one."""
    delta = check_delta(delta, f"{label}: partition_selection delta")
    m = check_int(
        max_partitions_contributed,
        f"{label}: max_partitions_contributed",
        fix="the keys one privacy unit (a row) adds to: 1 for these row-level analyzers",
    )
    return delta, m


def selection_release(kind: str, epsilon: float, value_range: float, mean_form: str) -> MomentRelease:
    """The tables a selection of ``kind`` draws for m = 1, the count first (it selects): the mean's two
    (`noise.mean_release`), the count alone at epsilon (sensitivity 1), or for the sum a count at
    SUM_SELECTION_SHARE * epsilon and the raw sum of v in [0, R] (sensitivity R) at the rest."""
    if kind == MEAN:
        release = mean_release(epsilon, value_range, mean_form)
        return MomentRelease(release.shift, release.scales, release.sensitivities)
    if kind == COUNT:
        return MomentRelease(0.0, (1.0 / epsilon,), (1.0,))
    count_epsilon = SUM_SELECTION_SHARE * epsilon
    return MomentRelease(0.0, (1.0 / count_epsilon, value_range / (epsilon - count_epsilon)), (1.0, value_range))


def select_tables(
    keys,
    counts,
    shifted_sums,
    *,
    kind: str = MEAN,
    epsilon: float,
    delta: float,
    value_range: float,
    mean_form: str,
    max_partitions_contributed: int = DEFAULT_MAX_PARTITIONS,
    seed=None,
    stream: str = "",
):
    """The kept keys and their noisy tables, from the exact per-key tables of the present keys.

    ``keys``: the distinct keys present (any sortable values); ``counts``: their exact row counts (>= 1);
    ``shifted_sums``: their exact sums of v - c on the release's grid (`selection_grid`; ignored for a count).
    Returns, the kept keys as a sorted list first: for MEAN (counts, sums S~ + c n~, means), for COUNT (counts,),
    for SUM (sums,), each a float64 array aligned with the keys.
    """
    release = selection_release(kind, epsilon, value_range, mean_form)
    m = max_partitions_contributed
    order = np.argsort(np.asarray(keys, dtype=object), kind="stable") if len(keys) else np.array([], dtype=int)
    keys = [keys[i] for i in order]
    tables = [np.asarray(counts, dtype=np.float64)[order], np.asarray(shifted_sums, dtype=np.float64)[order]]
    sensitivities = [m * d for d in release.sensitivities]
    scales = [m * b for b in release.scales]
    noisy = add_laplace(
        tables[: len(scales)], scales, seed=seed, stream=stream, sensitivities=sensitivities, cells=[m] * len(scales)
    )
    # the threshold at the count table's epsilon exactly as add_laplace draws it (one float step below m / b)
    kept = noisy[0] >= threshold(_table_epsilon(scales[0], sensitivities[0]), delta, m)
    noisy = [t[kept] for t in noisy]
    kept_keys = [k for k, keep in zip(keys, kept) if keep]
    if kind == COUNT:
        return (kept_keys, noisy[0])
    if kind == SUM:
        return (kept_keys, noisy[1])
    means = guarded_mean(noisy[1], noisy[0], value_range, shift=release.shift)
    return (kept_keys, noisy[0], noisy[1] + release.shift * noisy[0], means)


def select_and_release(keys, counts, shifted_sums, **selection):
    """The mean's selection (`select_tables` with kind MEAN): (kept keys as a list, counts, sums S~ + c n~, means)."""
    return select_tables(keys, counts, shifted_sums, kind=MEAN, **selection)


def selection_grid(
    kind: str, epsilon: float, value_range: float, mean_form: str, max_partitions_contributed: int
) -> float:
    """The public grid the sums of v - c are summed on before `select_tables` (a function of the release; any grid
    for a count, whose sum table is not drawn)."""
    release = selection_release(kind, epsilon, value_range, mean_form)
    if len(release.scales) == 1:
        return 1.0
    m = max_partitions_contributed
    return table_grid(m * release.scales[1], m * release.sensitivities[1], cells=m)


def sum_grid(epsilon: float, value_range: float, mean_form: str, max_partitions_contributed: int) -> float:
    """The mean's `selection_grid`."""
    return selection_grid(MEAN, epsilon, value_range, mean_form, max_partitions_contributed)


def output_count(kind: str) -> int:
    """How many arrays `select_tables` returns for ``kind`` (the kept keys included)."""
    return 4 if kind == MEAN else 2
