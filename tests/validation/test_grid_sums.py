"""Sums released with grid noise are summed exactly on the grid, never in float64 first.

The grid releases' proofs (``samplers.grid_laplace``, ``grid_gaussian``) bound how far one record moves the grid
integers of the value released; a float64 sum of the records rounds by an amount that depends on the other records
and their order, so the integer sensitivity the proof uses does not hold for it. ``samplers.grid_sums`` puts every
record on the grid on its own and adds the integers exactly; ``grid_laplace_sum`` / ``grid_gaussian_sum`` /
``grid_laplace_pair`` release those sums, and the validators pass their records to them.

The case below: 2^20 records of 1.0, then 2^14 records of 1.5 * 2^-33. Summed in order in float64 (as
``np.bincount`` and any running total do), each small record adds a whole ulp of 2^20 (0.75 ulp, rounded up), so
the float sum is 2^20 + 2^-18 where the exact sum is 2^20 + 1.5 * 2^-19: on the validators' grid (2^-20 at R = 1,
epsilon 1) that is 4 grid units against 3. Each small record alone is 0 on the grid, so the exact grid sum is
2^40 units, and that is what the release adds its noise to.
"""

import math

import numpy as np
import pytest

from sage_tfx.privacy import adassp, randomness, samplers
from sage_tfx.validation.core import Mode
from sage_tfx.validation.loss import release_count_and_sum
from sage_tfx.validation.noisy import release_pair

GAMMA = 2.0**-20
RECORDS = np.concatenate([np.ones(2**20), np.full(2**14, 1.5 * 2.0**-33)])


def test_float64_running_sums_round_away_from_the_exact_sum():
    running = float(np.bincount(np.zeros(RECORDS.size, dtype=np.int64), weights=RECORDS)[0])
    exact = math.fsum(RECORDS.tolist())
    assert running == 2.0**20 + 2.0**-18 and exact == 2.0**20 + 1.5 * 2.0**-19
    assert (round(running / GAMMA) - 2**40, round(exact / GAMMA) - 2**40) == (4, 3)
    assert samplers.grid_sums(RECORDS, GAMMA) == [2**40]  # every record on the grid alone, added exactly
    assert samplers.grid_laplace_params(1.0, 0.5)[0] == GAMMA  # the statistic validator's grid at R = 1, epsilon 1


@pytest.mark.parametrize("keyed", [False, True])
def test_the_grid_release_adds_its_noise_to_the_exact_grid_sum(keyed):
    keys = dict(keys=np.zeros(RECORDS.size, dtype=np.int64), num_cells=1) if keyed else {}
    zeros = np.zeros_like(RECORDS)
    released = samplers.grid_laplace_sum(RECORDS, 1.0, 0.5, rng=7, **keys)[0]
    noise_only = samplers.grid_laplace_sum(zeros, 1.0, 0.5, rng=7, **keys)[0]  # the same seed: the same noise
    assert released - noise_only == 2.0**20  # 2^40 grid units of 2^-20, exactly
    floated = samplers.grid_laplace(
        np.array([np.bincount(np.zeros(RECORDS.size, dtype=np.int64), weights=RECORDS)[0]]), 1.0, 0.5, rng=7
    )[0]
    assert floated - noise_only == 2.0**20 + 4 * GAMMA  # what a float64 running sum released before


def test_the_grid_gaussian_adds_its_noise_to_the_exact_grid_sum():
    rows = np.stack([RECORDS, 2 * RECORDS], axis=1)  # two cells per record
    gamma, _ = samplers.grid_gaussian_params(2.0, 4.0, 2)
    released = samplers.grid_gaussian_sum(rows, 2.0, 4.0, rng=9, cells=2)
    noise_only = samplers.grid_gaussian_sum(np.zeros_like(rows), 2.0, 4.0, rng=9, cells=2)
    expected = [samplers.grid_sums(rows[:, j], gamma)[0] * gamma for j in range(2)]
    assert (released - noise_only).tolist() == expected == [2.0**20, 2.0**21]


def test_the_validators_release_the_exact_grid_sums():
    rng = np.random.default_rng  # a seeded Generator keys the release's SecureRNG: the same seed, the same noise
    _, total = release_count_and_sum(RECORDS, 1.0, 2.0, rng(3), Mode.SAGE)  # the loss validator: eps/2 = 1
    _, noise_only = release_count_and_sum(np.zeros_like(RECORDS), 1.0, 2.0, rng(3), Mode.SAGE)
    assert total.value - noise_only.value == 2.0**20  # the small records are 0 on the grid, the sum exact
    pair = release_pair(RECORDS, 1.0, 1.0, rng(5), Mode.SAGE)  # the noisy-pair validators: (sum, n R - sum)
    zero_pair = release_pair(np.zeros_like(RECORDS), 1.0, 1.0, rng(5), Mode.SAGE)
    assert (pair[0].value - zero_pair[0].value, pair[1].value - zero_pair[1].value) == (2.0**20, -(2.0**20))


def test_a_grid_sum_too_large_for_float64_is_refused():
    with pytest.raises(randomness.SamplerError, match="too large for its grid"):
        samplers.grid_laplace_sum(np.full(4, 2.0**31), 1.0, 1.0, rng=1)  # 2^51 units each


def _adassp_records():
    """One feature: 2^20 rows of 1.0, then m rows whose square is 0.75 ulp(2^20): each small row is 0 on AdaSSP's X'X
    grid, but a float64 running sum adds a whole ulp for each, m ulps = one grid unit."""
    epsilon, delta = 48.0, 1e-6
    grids = adassp.statistic_grids(epsilon, delta, 1.0, 1.0, 1)
    ulp = 2.0**-32  # of 2^20
    m = int(grids[0] / ulp)
    assert m <= 2**17  # a small test: gamma is 2^-16 here
    x = np.concatenate([np.ones(2**20), np.full(m, math.sqrt(0.75) * 2.0**-16)]).reshape(-1, 1)
    return x, np.concatenate([np.ones(2**20), np.zeros(m)]), epsilon, delta, grids


def test_adassp_sums_its_statistics_exactly_on_the_release_grid():
    x, y, epsilon, delta, grids = _adassp_records()
    floated, _ = adassp.sufficient_statistics(x, y, 1.0, 1.0)
    assert round(floated[0, 0] / grids[0]) == 2**20 / grids[0] + 1  # the float sum is one grid unit off
    upper, vector = adassp.grid_statistics(x, y, 1.0, 1.0, grids)
    assert (upper, vector) == ([int(2**20 / grids[0])], [int(2**20 / grids[1])])
    xtx, xty = adassp.statistics_on_grid(upper, vector, grids)
    assert (xtx.tolist(), xty.tolist()) == ([[2.0**20]], [2.0**20])
    with pytest.raises(adassp.AdaSSPConfigError, match="too large for its grid"):
        adassp.statistics_on_grid([2**52], [0], grids)


def test_adassp_adds_its_noise_to_the_exact_grid_sums():
    x, y, epsilon, delta, _ = _adassp_records()
    released = adassp.adassp(x, y, epsilon, delta, 1.0, 1.0, rng=11)
    noise_only = adassp.release(np.zeros((1, 1)), np.zeros(1), epsilon, delta, 1.0, 1.0, rng=11)  # the same noise
    assert released.xtx_noisy[0, 0] - noise_only.xtx_noisy[0, 0] == 2.0**20  # not 2^20 + gamma
    assert released.xty_noisy[0] - noise_only.xty_noisy[0] == 2.0**20
