"""SmallDBG (Cummings et al. 2018, Section 3.1.1, Theorem 9, Table 1): the SmallDB synthetic-database generator
(Blum, Ligett, Roth 2008) re-run on a growing database under BBScheduler or BBImprover (docs/release_strategies.md,
"SmallDBG").

SmallDB picks a synthetic database of ``synthetic_size`` m records over the declared universe that answers the
declared counting queries close to the real data, by an exponential-mechanism-type draw over ALL such databases:
there are C(U + m - 1, m) of them for U cells, so the work is exponential in the domain; keep U and m small
(``MAX_CANDIDATES``).
"""

from __future__ import annotations

import hashlib
import itertools
import math

import numpy as np

from sage_tfx.privacy.samplers import bernoulli_exp

from .ermg import noise_mode
from .errors import GrowthError, _int_at_least
from .pmwg import Universe
from .scheduled import Mechanism, Reader, Schedule, ScheduledRelease

MAX_CANDIDATES = 200_000  # synthetic databases enumerated per run: C(U + m - 1, m) <= this
EPSILON_BITS = 30  # epsilon is rounded DOWN to a multiple of 2^-EPSILON_BITS (a smaller epsilon: still epsilon-DP)
_INT64_ROOM = 2**62


def candidate_count(cells: int, synthetic_size: int) -> int:
    """C(U + m - 1, m): the synthetic databases of m records over U cells (multisets).

    Args:
        cells: U, the universe's cell count.
        synthetic_size: m, the synthetic database's record count.
    """
    return math.comb(cells + synthetic_size - 1, synthetic_size)


def candidates(cells: int, synthetic_size: int) -> np.ndarray:
    """Every synthetic database of m records over U cells, as a (K, U) array of cell counts (rows sum to m);
    GrowthError if K > ``MAX_CANDIDATES`` (the enumeration is exponential in the domain).

    Args:
        cells: U, the universe's cell count.
        synthetic_size: m, the synthetic database's record count.
    """
    k = candidate_count(cells, synthetic_size)
    if k > MAX_CANDIDATES:
        raise GrowthError(
            f"universe of {cells} cells with synthetic_size {synthetic_size} has {k} synthetic databases, more "
            f"than {MAX_CANDIDATES}: SmallDB enumerates them all (exponential in the domain); give fewer bins or a "
            "smaller synthetic_size"
        )
    combos = np.array(list(itertools.combinations_with_replacement(range(cells), synthetic_size)), dtype=np.int64)
    out = np.zeros((k, cells), dtype=np.int64)
    np.add.at(out, (np.repeat(np.arange(k), synthetic_size), combos.ravel()), 1)
    return out


def check_queries(queries, cells: int) -> np.ndarray:
    """The declared counting queries as a (|Q|, U) 0/1 int array; GrowthError naming the problem otherwise.

    Args:
        queries: one 0/1 weight per cell per query (e.g. ``count_query`` rows).
        cells: U, the universe's cell count.
    """
    q = np.asarray(queries, dtype=float)
    if q.ndim != 2 or q.shape[0] < 1 or q.shape[1] != cells or not np.isin(q, (0.0, 1.0)).all():
        raise GrowthError(
            f"queries of shape {q.shape} are invalid: give a (queries, {cells}) array of 0/1 weights, one row per "
            "counting query (SmallDB's exact sampler needs counting queries)"
        )
    return q.astype(np.int64)


def scores(counts: np.ndarray, n: int, queries: np.ndarray, table: np.ndarray) -> np.ndarray:
    """E_r = min(n m, max_q |m c_q - n h_rq|) per candidate r: n m times its worst query error against the data
    (c_q the data's count in query q, n the PUBLIC record count; h_rq the candidate's). Integers; one record moves
    every E_r by at most m (the clip keeps that), so the error E_r / (n m) has sensitivity 1 / n.

    Args:
        counts: the data's count per cell.
        n: the public (declared) record count.
        queries: the (|Q|, U) 0/1 queries.
        table: the (K, U) candidates.
    """
    m = int(table[0].sum())
    data = queries @ np.asarray(counts, dtype=np.int64)  # (|Q|,)
    synth = table @ queries.T  # (K, |Q|)
    return np.minimum(np.abs(m * data[None, :] - n * synth).max(axis=1), n * m)


def permute_and_flip(errors: np.ndarray, epsilon: float, scale: int, bound: int, rng) -> int:
    """Permute-and-flip (McKenna, Sheldon 2020) on integer errors E_r of sensitivity ``scale``: visit the candidates
    in a uniform random order and keep the first r accepted with probability exp(-epsilon (E_r - E_min) / (2 scale)),
    drawn exactly (``samplers.bernoulli_exp``, epsilon rounded down to a dyadic whose precision depends on the
    PUBLIC ``bound`` only). epsilon-DP; its expected error is never above the exponential mechanism's. Returns the
    index of the chosen candidate.

    Args:
        errors: the integer errors E_r (lower is better), each in [0, bound].
        epsilon: the run's epsilon.
        scale: the sensitivity of every E_r (m).
        bound: a public upper bound on every E_r (n m).
        rng: a SecureRNG.
    """
    gap = np.asarray(errors, dtype=np.int64) - int(np.min(errors))
    bits = min(EPSILON_BITS, (_INT64_ROOM // (max(1, bound) * max(1, math.ceil(epsilon)))).bit_length() - 1)
    if bits < 1:
        raise GrowthError(f"epsilon {epsilon!r} with n m = {bound} overflows the exact sampler: lower them")
    eps_num = math.floor(epsilon * 2**bits)  # epsilon' = eps_num / 2^bits <= epsilon
    order = np.arange(gap.size)
    swaps = rng.uniform_below(np.arange(gap.size, 1, -1)) if gap.size > 1 else []
    for i, j in zip(range(gap.size - 1, 0, -1), swaps):  # Fisher-Yates: exact uniform permutation
        order[i], order[j] = order[j], order[i]
    accepted = bernoulli_exp(eps_num * gap[order], 2 * scale * 2**bits, rng)
    return int(order[int(np.argmax(accepted))])  # the best candidate accepts with probability 1


def smalldb_mechanism(
    schedule: Schedule, universe: Universe, queries, rows_per_block: int, synthetic_size: int
) -> Mechanism:
    """SmallDBG's black box: SmallDB on all blocks so far, at the run's epsilon; output the synthetic database's
    (U,) cell counts (summing to m), from which every declared query is answered (``synthetic_answers``).

    Privacy: the error of candidate r, max_q |c_q / n - h_rq / m| with n = blocks * ``rows_per_block`` PUBLIC,
    moves by at most 1 / n when one record is added or removed, so permute-and-flip with exp(-epsilon n (err_r -
    err_min) / 2) is epsilon_i-DP exactly; pure epsilon_i-DP is also epsilon_i^2 / 2-zCDP and (epsilon_i,
    delta_i)-DP, so it serves every mode of ``noise_mode`` (BBScheduler pure / zCDP / basic, BBImprover).
    Accuracy: with probability >= 1 - beta the run's error is at most OPT_m + 2 (ln K + ln(1 / beta)) /
    (epsilon_i n), K = C(U + m - 1, m), OPT_m the best synthetic database's error (<= sqrt(ln(2 |Q|) / (2 m)) when
    the data hold n records: the BLR sampling bound). Everything is checked here, before anything is charged.

    Args:
        schedule: the BBScheduler or BBImprover the runs follow (not an approximate one).
        universe: the declared Universe (cells of the rows).
        queries: the declared counting queries, (|Q|, U) 0/1 weights.
        rows_per_block: m0, the declared (public) rows per block.
        synthetic_size: m, the synthetic database's record count.
    """
    noise_mode(schedule)
    if not isinstance(universe, Universe):
        raise GrowthError(f"universe {universe!r} must be a Universe")
    q = check_queries(queries, universe.size)
    m0 = _int_at_least("rows_per_block", rows_per_block, 1, "give the declared (public) rows per block >= 1")
    m = _int_at_least("synthetic_size", synthetic_size, 1, "give the synthetic database's record count m >= 1")
    table = candidates(universe.size, m)

    def mechanism(blocks: list, epsilon: float, rng, delta: float = 0.0) -> np.ndarray:
        counts = sum(np.bincount(universe.cells(b), minlength=universe.size) for b in blocks)
        n = m0 * len(blocks)
        return table[permute_and_flip(scores(counts, n, q, table), epsilon, m, n * m, rng)].copy()

    return mechanism


def synthetic_answers(synthetic: np.ndarray, queries) -> np.ndarray:
    """Every declared query answered on a released synthetic database (fractions; post-processing).

    Args:
        synthetic: the released (U,) cell counts.
        queries: the (|Q|, U) 0/1 weights.
    """
    synthetic = np.asarray(synthetic, dtype=float)
    return np.asarray(queries, dtype=float) @ synthetic / synthetic.sum()


def smalldbg(
    ledger,
    stream: str,
    pipeline: str,
    schedule: Schedule,
    universe: Universe,
    queries,
    reader: Reader,
    *,
    rows_per_block: int,
    synthetic_size: int,
) -> ScheduledRelease:
    """SmallDBG: a ``ScheduledRelease`` of ``smalldb_mechanism`` under ``schedule`` (each block's lifetime grant
    charged before it is read); ``observe(block)`` returns the run made at that arrival (its ``output`` the synthetic
    cell counts) or None, and ``current`` is the newest synthetic database. Privacy: the schedule's (epsilon, delta)
    per record over the infinite horizon (Theorem 9).

    Args:
        ledger: the privacy ledger.
        stream: the stream the blocks belong to (its unit one row).
        pipeline: the pipeline name the grants are charged to.
        schedule: a BBScheduler or BBImprover.
        universe: the declared Universe.
        queries: the declared counting queries, (|Q|, U) 0/1 weights.
        reader: grant -> the (n, columns) rows of its one block.
        rows_per_block: m0, the declared rows per block.
        synthetic_size: m, the synthetic database's record count.
    """
    mechanism = smalldb_mechanism(schedule, universe, queries, rows_per_block, synthetic_size)
    declared = np.asarray(queries, dtype=np.int8).tobytes() + repr(universe).encode()
    digest = hashlib.sha256(declared).hexdigest()  # the universe and the queries are part of the computation
    name = f"smalldbg/m={synthetic_size}/m0={rows_per_block}/declared={digest}"
    return ScheduledRelease(ledger, stream, pipeline, schedule, mechanism, reader, name=name)
