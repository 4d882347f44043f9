"""`sage run --check`'s progress lines: a FAILED iteration of the dry run says its grant is spent in the throwaway
ledger, not the real one (the iterator's own line says "its grant stays spent")."""

import pytest

from pipelines.check import check_line
from sage_tfx.adaptive import IteratorSettings, SageIterator
from sage_tfx.privacy import Ledger

DAY = 86400.0


def test_a_failed_dry_run_iteration_says_the_throwaway_ledger_paid(tmp_path):
    lines = []
    with Ledger.open(tmp_path / "throwaway.db", create=True) as ledger:
        ledger.create_stream("s", 100.0, 1e-3, max_epsilon=100.0)
        for i in range(2):
            ledger.add_block("s", f"b{i}", start=i * DAY, end=(i + 1) * DAY, rows=100)

        def broken_module(grant, split, eta, iteration):
            raise ValueError("the trainer module named a feature the schema lacks")

        iterator = SageIterator(
            ledger,
            "s",
            "p",
            broken_module,
            settings=IteratorSettings(epsilon_start=1.0, min_window=2, max_iterations=1),
            progress=lambda line: lines.append(check_line(line)),
        )
        with pytest.raises(ValueError):
            iterator.run()
    (failed,) = [line for line in lines if "FAILED" in line]
    assert failed.startswith("[check] [p] iteration 1: FAILED (ValueError")
    assert failed.endswith("its grant is spent in the throwaway ledger only (the real ledger is not charged)")
    assert "stays spent" not in failed
