"""Floating-point-safe noise vs numpy's float noise: per-cell sampler cost and whole-release cost, same run.

Two kinds of figure, each a ratio (safe / numpy, lower is better) of the median of ``--repeats`` timings:

* ``sampler_*``: one release of N cells, nothing else: ``samplers.grid_laplace`` (exact discrete Laplace
  on a power-of-two grid, ChaCha20 randomness) against ``x + rng.laplace(0, b, N)`` with numpy's PCG64,
  and ``samplers.grid_gaussian`` against ``x + rng.normal(0, sigma, N)``. This is the price per noisy
  number.
* ``release_*``: what a release costs end to end on GENERATED data (numpy only, no TensorFlow): the exact
  table computed from the rows, then its noise; the baseline is the same exact computation followed by
  numpy's float noise, as the library drew it before (docs/noise.md):
    - ``group_by_mean``: counts and clipped sums of ``--rows`` values over ``--keys`` keys
      (``noise.add_laplace``, as ``dp_group_by_mean``'s Beam step draws them);
    - ``vocabulary``: value counts of ``--rows`` rows over ``--values`` distinct values, then the DP
      vocabulary selection (``select_vocabulary``; the baseline thresholds float-noisy counts);
    - ``validation``: a DPLossValidator release on ``--rows`` losses (clipped sum and complement);
    - ``adassp``: DPLinearRegressor's AdaSSP on ``--rows`` rows of ``--features`` features (sufficient
      statistics, lam_min, X'X and X'y releases, the solve).
Goal: within 2x of numpy. Seeds are fixed; timings use ``time.perf_counter``.
"""

import math
import statistics
import time

import numpy as np

from sage_tfx import comma_lists

GOAL_RATIO = 2.0


def add_arguments(parser):
    parser.add_argument(
        "--sizes",
        type=comma_lists.counts,
        default="1,100,10000,1000000",
        help="comma-separated cell counts for the sampler figures",
    )
    parser.add_argument("--rows", type=int, default=1_000_000, help="GENERATED rows per release (default 1e6)")
    parser.add_argument("--keys", type=int, default=100, help="keys of the group-by-mean release")
    parser.add_argument("--values", type=int, default=10_000, help="distinct values of the vocabulary release")
    parser.add_argument("--features", type=int, default=46, help="features of the AdaSSP release")
    parser.add_argument("--repeats", type=int, default=5, help="timings per figure; the median is reported")


def _seconds(fn):
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _pair(name, safe, baseline, repeats, figures):
    """Median seconds of ``safe`` and ``baseline``, alternating (after one untimed warm-up each), and their ratio."""
    safe(), baseline()
    s_times, b_times = [], []
    for _ in range(repeats):
        s_times.append(_seconds(safe))
        b_times.append(_seconds(baseline))
    s, b = statistics.median(s_times), statistics.median(b_times)
    figures[f"{name}_seconds"] = round(s, 6)
    figures[f"{name}_numpy_seconds"] = round(b, 6)
    figures[f"{name}_ratio"] = round(s / b, 2)
    print(f"  {name}: safe {s * 1e3:.3f} ms, numpy {b * 1e3:.3f} ms, ratio {s / b:.2f}", flush=True)


def run(args) -> dict:
    """Time every sampler and release against numpy's float noise (``--repeats`` medians).

    Args:
        args: the parsed options (``add_arguments``).

    Returns:
        The figures: each pair's timings and ratio, and how many releases are within ``GOAL_RATIO``.
    """
    from sage_tfx.privacy import randomness

    repeats = max(1, int(args.repeats))
    figures = {"goal_ratio": GOAL_RATIO, "repeats": repeats, "data": "GENERATED"}
    rngs = (np.random.default_rng(0), randomness.secure_rng(0, "bench"))  # numpy's, and the safe one
    _bench_samplers(args, repeats, figures, *rngs)
    rows = int(args.rows)
    data = np.random.default_rng(1)
    print(f"whole releases on {rows:,} GENERATED rows:", flush=True)
    for bench in (_bench_group_by_mean, _bench_vocabulary, _bench_validation, _bench_adassp):
        bench(args, rows, data, repeats, figures, *rngs)
    releases = [k for k in figures if k.startswith("release_") and k.endswith("_ratio")]
    figures["releases_within_goal"] = sum(figures[k] <= GOAL_RATIO for k in releases)
    figures["releases"] = len(releases)
    return figures


def _bench_samplers(args, repeats: int, figures: dict, np_rng, safe_rng) -> None:
    """The per-cell samplers: one release of N cells, for every N of ``--sizes``."""
    from sage_tfx.privacy import samplers

    print("per-cell samplers (one release of N cells):", flush=True)
    for n in args.sizes:
        x = np.zeros(n)
        _pair(
            f"sampler_laplace_{n}",
            lambda: samplers.grid_laplace(x, 1.0, 1.0, safe_rng, cells=1),  # noqa: B023
            lambda: x + np_rng.laplace(0.0, 1.0, n),  # noqa: B023
            repeats,
            figures,
        )
        _pair(
            f"sampler_gaussian_{n}",
            lambda: samplers.grid_gaussian(x, 1.0, 7.0, safe_rng, cells=n),  # noqa: B023
            lambda: x + np_rng.normal(0.0, 7.0, n),  # noqa: B023
            repeats,
            figures,
        )  # noqa: B023


def _bench_group_by_mean(args, rows: int, data, repeats: int, figures: dict, np_rng, safe_rng) -> None:
    """dp_group_by_mean's tables: counts and clipped sums per key, epsilon 1 (half each), value range 1."""
    from sage_tfx.transform import noise

    keys = data.integers(0, args.keys, rows)
    values = data.random(rows)

    def tables():
        return (
            np.bincount(keys, minlength=args.keys).astype(float),
            np.bincount(keys, weights=np.clip(values, 0, 1), minlength=args.keys),
        )

    _pair(
        "release_group_by_mean",
        lambda: noise.add_laplace(
            tables(), [2.0, 2.0], seed=3, stream="bench/", sensitivities=[1.0, 1.0], cells=[1, 1]
        ),
        lambda: tuple(t + np_rng.laplace(0.0, 2.0, t.shape) for t in tables()),
        repeats,
        figures,
    )


def _bench_vocabulary(args, rows: int, data, repeats: int, figures: dict, np_rng, safe_rng) -> None:
    """The DP vocabulary: value counts, then noisy counts above the threshold."""
    from sage_tfx.transform.vocabulary import select_vocabulary, threshold

    words = data.zipf(1.3, rows) % args.values

    def counts():
        uniq, cnt = np.unique(words, return_counts=True)
        return dict(zip(uniq.tolist(), cnt.tolist()))

    def float_vocabulary():
        c = counts()
        vals = sorted(c)
        noisy = np.array([c[v] for v in vals], float) + np_rng.laplace(0.0, 1.0, len(vals))
        tau = 1.0 + math.log(1.0 / (2 * 1e-6))
        return [v for v, z in sorted(zip(vals, noisy), key=lambda p: -p[1]) if z >= tau]

    _pair(
        "release_vocabulary",
        lambda: select_vocabulary(counts(), epsilon=1.0, delta=1e-6, seed=4),
        float_vocabulary,
        repeats,
        figures,
    )
    figures["vocabulary_threshold"] = round(threshold(1.0, 1e-6), 6)


def _bench_validation(args, rows: int, data, repeats: int, figures: dict, np_rng, safe_rng) -> None:
    """A DPLossValidator release: clipped sum and complement of the losses, epsilon 0.5, B = 1."""
    losses = data.random(rows)

    def validation():
        from sage_tfx.validation.core import Mode
        from sage_tfx.validation.noisy import release_pair

        return release_pair(losses, 1.0, 0.5, safe_rng, Mode.SAGE)

    def validation_float():
        clipped = np.clip(losses, 0.0, 1.0)
        return (clipped.sum() + np_rng.laplace(0.0, 2.0), clipped.size - clipped.sum() + np_rng.laplace(0.0, 2.0))

    _pair("release_validation", validation, validation_float, repeats, figures)


def _bench_adassp(args, rows: int, data, repeats: int, figures: dict, np_rng, safe_rng) -> None:
    """AdaSSP (DPLinearRegressor's release), epsilon 1, delta 1e-6, calibration exact."""
    from sage_tfx.privacy import adassp

    d = int(args.features)
    x = data.random((rows, d)) / math.sqrt(d)
    y = x @ data.normal(size=d) + data.normal(0, 0.1, rows)

    def adassp_float():
        xtx, xty = adassp.sufficient_statistics(x, y, 1.0, 1.0)
        sc = adassp.noise_scales(1.0, 1e-6, 1.0, 1.0, d, calibration="exact")
        lam = max(
            0.0,
            float(np.linalg.eigvalsh(xtx)[0])
            + sc["lambda_min_std"] * np_rng.standard_normal()
            - sc["lambda_min_shift"],
        )
        upper = np.triu(np_rng.standard_normal((d, d)))
        noisy = xtx + sc["xtx_std"] * (upper + np.triu(upper, 1).T)
        ridge = max(0.0, sc["ridge_target"] - lam)
        return np.linalg.lstsq(noisy + ridge * np.eye(d), xty + sc["xty_std"] * np_rng.standard_normal(d), rcond=None)[
            0
        ]

    _pair(
        "release_adassp",
        lambda: adassp.adassp(x, y, 1.0, 1e-6, 1.0, 1.0, calibration="exact", rng=safe_rng),
        adassp_float,
        repeats,
        figures,
    )
