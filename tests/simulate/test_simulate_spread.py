"""`sage simulate --seeds N`: each cell's spread over the seeds, overloaded runs at the ceiling, and its plot."""

from sage_tfx.simulate import sweep


def _row(strategy, rate, mean, overloaded=None, lower=False):
    return {
        "strategy": strategy,
        "rate": rate,
        "mean_release_h": mean,
        "overloaded_at_h": overloaded,
        "mean_is_lower_bound": lower,
    }


def test_the_spread_takes_median_min_and_max_over_the_seeds(tmp_path):
    by_seed = {
        0: [_row("block-conserve", 1.0, 2.0), _row("block-aggressive", 1.0, 9.0)],
        1: [_row("block-conserve", 1.0, 4.0), _row("block-aggressive", 1.0, 30.0, lower=True)],
        2: [_row("block-conserve", 1.0, 3.0), _row("block-aggressive", 1.0, 1.0, overloaded=50)],
    }
    cells = {c["strategy"]: c for c in sweep.spread(by_seed)}
    conserve, aggressive = cells["block-conserve"], cells["block-aggressive"]
    assert (conserve["median_h"], conserve["min_h"], conserve["max_h"]) == (3.0, 2.0, 4.0)
    assert conserve["seeds"] == [0, 1, 2] and conserve["overloaded"] == 0
    assert aggressive["mean_release_h"] == [9.0, 30.0, 168.0]  # the overloaded run counts at the ceiling
    assert (aggressive["median_h"], aggressive["overloaded"], aggressive["lower_bound"]) == (30.0, 1, 1)
    path = sweep.plot_spread(list(cells.values()), tmp_path / "fig8.png", "spread")
    assert path.stat().st_size > 1000
