"""Private partition selection for the per-key mean: keys not known in advance (numpy only).

`select_and_release` is what ``dp_mean_per_key(..., partition_selection=...)``'s Beam step runs ONCE on the
exact per-key tables of the whole data set: the mean's grid-Laplace count (eps_n) and centred sum (eps_s) over
the keys present, a key kept iff its noisy count reaches `vocabulary.threshold(eps_n, delta, m)`. Contract:
(epsilon, delta)-DP with epsilon = eps_n + eps_s, under add/remove one row.

Mechanism and proof: docs/dp_preprocessing.md ("Keys not known in advance: private partition selection").
"""

import numpy as np

from .noise import _table_epsilon, add_laplace, check_int, guarded_mean, mean_release, table_grid
from .vocabulary import check_delta, threshold

DEFAULT_MAX_PARTITIONS = 1


def check_selection(delta, max_partitions_contributed, label: str) -> tuple[float, int]:
    """(delta, m) checked before anything is charged; raise naming the bad one."""
    delta = check_delta(delta, f"{label}: partition_selection delta")
    m = check_int(
        max_partitions_contributed,
        f"{label}: max_partitions_contributed",
        fix="the keys one privacy unit (a row) adds to: 1 for these row-level analyzers",
    )
    return delta, m


def select_and_release(
    keys,
    counts,
    shifted_sums,
    *,
    epsilon: float,
    delta: float,
    value_range: float,
    mean_form: str,
    max_partitions_contributed: int = DEFAULT_MAX_PARTITIONS,
    seed=None,
    stream: str = "",
):
    """The kept keys and their noisy (counts, sums, means), from the exact per-key tables of the present keys.

    ``keys``: the distinct keys present (any sortable values); ``counts``: their exact row counts (>= 1);
    ``shifted_sums``: their exact sums of v - c on the release's grid (`noise.table_grid` of the sum table at
    m x its sensitivity, m cells). Returns (kept keys as a list, counts, sums S~ + c n~, means) as float64 arrays.
    """
    release = mean_release(epsilon, value_range, mean_form)
    m = max_partitions_contributed
    order = np.argsort(np.asarray(keys, dtype=object), kind="stable") if len(keys) else np.array([], dtype=int)
    keys = [keys[i] for i in order]
    counts = np.asarray(counts, dtype=np.float64)[order]
    shifted_sums = np.asarray(shifted_sums, dtype=np.float64)[order]
    sensitivities = [m * release.sensitivities[0], m * release.sensitivities[1]]
    scales = [m * b for b in release.scales]
    noisy_c, noisy_s = add_laplace(
        [counts, shifted_sums], scales, seed=seed, stream=stream, sensitivities=sensitivities, cells=[m, m]
    )
    # the threshold at the count table's epsilon exactly as add_laplace draws it (one float step below m / b)
    kept = noisy_c >= threshold(_table_epsilon(scales[0], sensitivities[0]), delta, m)
    noisy_c, noisy_s = noisy_c[kept], noisy_s[kept]
    means = guarded_mean(noisy_s, noisy_c, value_range, shift=release.shift)
    return ([k for k, keep in zip(keys, kept) if keep], noisy_c, noisy_s + release.shift * noisy_c, means)


def sum_grid(epsilon: float, value_range: float, mean_form: str, max_partitions_contributed: int) -> float:
    """The public grid the sums of v - c are summed on before `select_and_release` (a function of the release)."""
    release = mean_release(epsilon, value_range, mean_form)
    m = max_partitions_contributed
    return table_grid(m * release.scales[1], m * release.sensitivities[1], cells=m)
