"""sage bench block-composition (Sage Fig. 7): the k-block validation test and a small run on the real flights."""

import argparse

import numpy as np
import pytest
from scipy.stats import binom

from sage_tfx.bench import block_composition as bench
from sage_tfx.validation import DPLossValidator, noisy


@pytest.mark.parametrize("target", [0.3, 0.45, 0.6])
def test_one_block_is_exactly_the_validators_test(target):
    """k = 1: the partitioned test draws the same pair and takes the same decision as DPLossValidator."""
    values = np.random.default_rng(7).uniform(0, 1, 3000) ** 2 * 1.4  # a mean near 0.47, clipped at B = 1
    for seed in range(20):
        ours = bench.partitioned_accept([values], target, 1.0, 0.05, 1.0, np.random.default_rng(seed))
        theirs = (
            DPLossValidator(target, 1.0, 0.95, loss_bound=1.0)
            .validate(values, rng=np.random.default_rng(seed))
            .accepted
        )
        assert ours == theirs


def test_the_k_block_test_keeps_its_false_accept_rate():
    """Values whose mean IS the target (the worst case), split in k = 8 blocks with their own noise at epsilon
    0.1 (the noise dominates the sampling error): ACCEPT (a false accept) must come at rate <= eta = 0.2. The
    threshold is the 1 - 1e-3 quantile of Bin(300, 0.2), the test's false-failure bound."""
    rng = np.random.default_rng(11)
    target, eta, accepts, runs = 0.5, 0.2, 0, 300
    for _ in range(runs):
        values = (rng.random(1600) < target).astype(float)
        accepts += bench.partitioned_accept(np.array_split(values, 8), target, 0.1, eta, 1.0, rng)
    assert accepts <= binom.isf(1e-3, runs, eta)


def test_the_count_noise_quantile_covers_the_sum_of_laplace_draws():
    rng = np.random.default_rng(3)
    for copies in (1, 4, 16):
        u = noisy.laplace_sum_quantile(0.01, copies)
        draws = rng.laplace(size=(200_000, 2 * copies)).sum(axis=1)
        assert np.mean(draws > u) <= 0.01 + 0.002  # 200k draws: the binomial sd at 0.01 is 2.2e-4
        assert u < 2 * copies * np.log(2 * copies / 0.01)  # and tighter than a union bound over the draws


def test_a_small_run_on_the_real_flights(tmp_path):
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    args = parser.parse_args(
        [
            "--trials",
            "2",
            "--max-rows",
            "32000",
            "--block-rows",
            "2000",
            "--fractions",
            "0.5,0.7",
            "--plot",
            str(tmp_path / "fig.png"),
        ]
    )
    figures = bench.run(args)
    rows = figures["lr"]["targets"]
    for r in rows:  # block composition never needs more rows than the per-block queries
        block, part = r["samples_needed"]["block"], r["samples_needed"]["partitioned:2000"]
        assert block is not None and (part is None or part > block)
    assert "REAL" in figures["data"] and (tmp_path / "fig.png").stat().st_size > 1000
    held = figures["lr"]["held_out_mse_median"]["block"]
    assert all(v is not None and v > 0 for v in held)
