"""Private partition selection for the per-key mean: keys not known in advance (numpy only).

`select_and_release` is what ``dp_mean_per_key(..., partition_selection=...)``'s Beam step runs ONCE on the
exact per-key tables of the whole data set (like `noise.add_laplace`); docs/dp_preprocessing.md, "Keys not
known in advance", states the mechanism and its proof.

Mechanism, with the mean's release `noise.mean_release` (count at eps_n, sum of v - c at eps_s), m =
max_partitions_contributed (a row holds one key, so m = 1 is exact; a larger m only adds noise) and, over the
keys PRESENT in the data (count >= 1; absent keys are never drawn):
    noisy counts n~ = the grid-Laplace release of the counts at eps_n, sensitivity m, m cells
    noisy sums   S~ = the grid-Laplace release of the sums of v - c at eps_s, sensitivity m * Delta_s, m cells
    keep k  iff  n~_k >= tau = `vocabulary.threshold(eps_n, delta, m)` (Laplace thresholding: Korolova et al.
             2009, Gopi et al. 2020; the rule PipelineDP's LAPLACE_THRESHOLDING applies)
    release the kept keys (sorted) with their n~, S~ + c n~ and clip(c + S~ / max(n~, 1), 0, R).
Guarantee: (epsilon, delta)-DP, epsilon = eps_n + eps_s. Proof sketch: let D' = D plus one row of key k. If k
is present in D, the two tables move by one row in one cell each: the counts are eps_n-DP and the sums eps_s-DP
(`samplers.grid_laplace`), and the selection, the order and the means read only the noisy tables. If k is
absent from D, every other key's cells are identically distributed, and k is released only if its noisy count
(true count 1 <= m) passes tau, probability <= delta / m per key (`vocabulary.threshold`); the row adds at most
m such keys: a union bound gives delta. Outside that event the outputs have the same law.
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
