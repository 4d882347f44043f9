"""The paper's Algorithm 5 as written (sage_tfx/release/continual/alg5.py, sliding_as_written.py): its dependency
chain against the paper's Example 1, its exact per-block accounting, the charge on a real ledger.

Data here is GENERATED (a fixed-seed logistic model); the ledger is real (SQLite, tmp_path)."""

import numpy as np
import pytest

from sage_tfx.release.continual import ContinualReleaseError, ReleaseParams, participation_sum
from sage_tfx.release.continual.alg5 import chain_at, chain_keys, participation
from sage_tfx.release.continual.sliding_as_written import SlidingWindowAsWritten
from tests.helpers.ledgers import daily_ledger
from tests.release.test_continual_release import CheckedReader, D, make_ledger


def test_chain_follows_the_papers_example():
    # Example 1 (w = 7), the paper's indices + 1 (our first refresh is at t = 8, the paper's at 7): f[0] <- f[1:2]
    # <- f[3:6]; then f[7] <- f[1:2] <- f[3:6]; f[2] <- f[7:8] <- f[3:6]; f[9] <- f[7:8] <- f[3:6]; refresh.
    shift = [
        [(a + 1, b + 1) for a, b in chain]
        for chain in (
            [(3, 7), (1, 3), (0, 1)],
            [(3, 7), (1, 3), (7, 8)],
            [(3, 7), (7, 9), (2, 3)],
            [(3, 7), (7, 9), (9, 10)],
            [(7, 11), (5, 7), (4, 5)],
        )
    ]
    assert [chain_at(t, 7) for t in range(8, 13)] == shift
    # f[1:2] is reused at the next arrival (same bucket, same chain above); f[2] is new (a shifted bucket)
    assert chain_keys(8, 7)[1] == chain_keys(9, 7)[1] and chain_keys(10, 7)[2] not in chain_keys(9, 7)


@pytest.mark.parametrize("window", [1, 3, 7, 15])
def test_every_block_is_in_one_model_per_bucket_size(window):
    # measured from the structure: the worst block's sum of 4^-j equals the dyadic variant's
    assert participation(window) == pytest.approx(participation_sum("continual-sliding-window", window))


@pytest.mark.parametrize("window", [0, 2, 8, 12])
def test_other_windows_refused_before_anything_is_charged(tmp_path, window):
    ledger = make_ledger(tmp_path, 2)
    with pytest.raises(ContinualReleaseError, match="invalid"):
        params = ReleaseParams(epsilon=2.0, delta=1e-5, records_per_block=200, window=window)
        SlidingWindowAsWritten(ledger, "s", "alg5", params, CheckedReader(ledger), dim=D)
    assert all(b["epsilon_spent"] == 0 for b in ledger.status("s")["blocks"])


def test_as_written_charges_the_bound_once_and_stays_under_it(tmp_path):
    blocks = 20
    ledger = daily_ledger(tmp_path, blocks, epsilon=10.0, delta=1e-4, rows=200)
    reader = CheckedReader(ledger)
    rel = SlidingWindowAsWritten(
        ledger, "s", "alg5", ReleaseParams(epsilon=2.0, delta=1e-5, records_per_block=200, window=7), reader, dim=D
    )
    for i in range(blocks):
        out = rel.observe(f"b{i:03d}")
        assert out.weights.shape == (D,) and np.all(np.isfinite(out.weights))
    assert reader.read == [f"b{i:03d}" for i in range(blocks)]  # each block read once, at arrival
    spent = [(b["epsilon_spent"], b["delta_spent"]) for b in ledger.status("s")["blocks"]]
    assert spent == [(pytest.approx(2.0), pytest.approx(1e-5))] * blocks
    assert max(rel.per_record_rho().values()) <= rel.rho_bound() * (1 + 1e-9)
    assert max(rel.per_record_rho().values()) == pytest.approx(rel.rho_bound())  # the bound is attained
    assert ledger.audit().ok
