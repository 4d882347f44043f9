"""DP vocabularies: DP partition selection on value counts (numpy only).

`select_vocabulary` is the mechanism ``dp_vocabulary`` (in `vocabulary_analyzer`) runs ONCE in its Beam full
pass, on the exact counts of the whole data set: Laplace thresholding (Korolova et al. 2009, Gopi et al. 2020)
of the grid-Laplace noisy counts at threshold `threshold(epsilon, delta, m)`, the kept values ordered by noisy
count. Contract: one row changes at most m = max_contributions counts by 1 (L1 sensitivity m), and the release
is (epsilon, delta)-DP; counts of values absent from the data are never drawn.

Mechanism, threshold and proof: docs/dp_preprocessing.md ("Vocabularies: DP partition selection").
"""

import math
import zlib
from collections.abc import Sequence

import numpy as np

from sage_tfx.privacy.checks import probability
from sage_tfx.privacy.randomness import secure_rng
from sage_tfx.privacy.samplers import grid_laplace, grid_laplace_coupling

from .errors import DPTransformError
from .noise import check_epsilon, check_int


def check_delta(delta, what: str = "delta") -> float:
    """Return delta as a float; raise naming it unless 0 < delta < 1 (partition selection needs delta > 0)."""
    value = probability(
        delta,
        what,
        error=DPTransformError,
        not_number="{what} must be a number {rule}, got {value!r}",
        message="{what} must be {rule}, got {value!r} (a data-dependent vocabulary needs delta > 0; "
        "use e.g. 1e-6, well below 1 / number of rows)",
    )
    return value


def threshold(epsilon: float, delta: float, max_contributions: int = 1) -> float:
    """tau = m + b' * ln(m / (2 delta)) + s: a value held by one row only passes with probability <= delta / m.

    b' and s are the grid release's coupled Laplace scale and slack (`samplers.grid_laplace_coupling(m,
    epsilon, m)`; b' is within a relative 2^-20 of m / epsilon, s = 3 gamma / 2 tiny), so for m = 1 this
    is the brief's tau = 1 + ln(1 / (2 delta)) / epsilon up to ~1e-6 relative, never below it. The
    ln(m / ...) term (a union bound over the <= m values one row can add) keeps the total at <= delta.
    """

    m = max_contributions
    scale, slack = grid_laplace_coupling(m, epsilon, m)
    return m + scale * math.log(m / (2.0 * delta)) + slack


def select_vocabulary(
    counts: dict,
    *,
    epsilon: float,
    delta: float,
    top_k: int | None = None,
    max_contributions: int = 1,
    seed: int | None = None,
    stream: str = "",
) -> list:
    """The DP vocabulary of exact `counts` (value -> number of rows): kept values, by noisy count, descending.

    (epsilon, delta)-DP, proof in docs/dp_preprocessing.md. Values with count <= 0 are ignored (they
    are not in the data). One exact grid-Laplace draw per value present, in a fixed (sorted) order, from
    `randomness.secure_rng(seed, stream)`: seed=None draws a fresh key from `secrets`; a seed (the grant's
    derived seed under DPTransform, or a test seed) makes it reproducible.
    """
    epsilon = check_epsilon(epsilon, "select_vocabulary: epsilon")
    delta = check_delta(delta, "select_vocabulary: delta")
    m = check_int(max_contributions, "select_vocabulary: max_contributions")
    top_k = check_int(top_k, "select_vocabulary: top_k", allow_none=True)
    values = sorted(v for v, c in counts.items() if c > 0)
    if not values:
        return []
    exact = np.array([float(counts[v]) for v in values])

    noisy = grid_laplace(exact, m, epsilon, secure_rng(seed, stream), cells=m)
    tau = threshold(epsilon, delta, m)
    kept = [(-n, v) for n, v in zip(noisy, values) if n >= tau]
    kept.sort()
    vocabulary = [v for _, v in kept]
    return vocabulary if top_k is None else vocabulary[:top_k]


def apply_vocabulary(
    values: Sequence, vocabulary: Sequence, *, num_oov_buckets: int = 1, default_value: int = -1
) -> np.ndarray:
    """Ids as tft.apply_vocabulary: index in `vocabulary`; else len(vocabulary) + hash bucket, or default_value.

    Post-processing of the DP vocabulary and the row's own value: no privacy cost. The OOV
    bucket uses a stable hash (crc32 of the value's bytes), not tft's FarmHash.
    """

    if isinstance(num_oov_buckets, bool) or not isinstance(num_oov_buckets, (int, np.integer)) or num_oov_buckets < 0:
        raise DPTransformError(f"apply_vocabulary: num_oov_buckets must be an integer >= 0, got {num_oov_buckets!r}")
    index = {v: i for i, v in enumerate(vocabulary)}
    out = []
    for v in values:
        if v in index:
            out.append(index[v])
        elif num_oov_buckets == 0:
            out.append(default_value)
        else:
            raw = v if isinstance(v, bytes) else str(v).encode("utf-8")
            out.append(len(vocabulary) + zlib.crc32(raw) % num_oov_buckets)
    return np.array(out, dtype=np.int64)
