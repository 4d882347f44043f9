"""dp_group_by_mean through tf.Transform vs plain tf.Transform analyzers and PipelineDP's per-partition mean.

Runs, on GENERATED taxi-like rows (hour of day -> speed, fitted to the real taxi
trips in the tfx wheel; see sage_tfx/transform/_testdata.py), the same
preprocessing_fn twice through tft_beam.AnalyzeAndTransformDataset on the Beam
DirectRunner: once with sage's dp_group_by_mean, once with the plain non-private
tf.Transform analyzers (tft.sum of one-hot counts and sums: the idiomatic way), and
once with tft.sum fed the same per-batch unsorted_segment_sum reduction the DP
analyzer uses (the "segment" baseline: same graph work, tf.Transform's own combiner).
All read the same Arrow record batches, generated inside the pipeline, and feed the
same tiny sink. The figures:

- dp_seconds, baseline_seconds, ratio = dp / baseline (medians over --repeats,
  rotating the order; goal <= 1.2); segment_baseline_seconds, ratio_vs_segment_baseline;
- dp_mae: mean absolute error over keys of this run's noisy means against the exact
  clipped means; dp_mae_expected: the same averaged over --noise-trials fresh draws
  of the same release (`noise.mean_release` at --mean-form, drawn by `noise.add_laplace`)
  on the exact tables;
- pipelinedp_seconds / pipelinedp_mae (medians over --pipelinedp-repeats runs):
  PipelineDP's MEAN per public partition at the same epsilon and bounds, on Beam's
  DirectRunner by default (--pipelinedp-backend local: its LocalBackend), run by
  benchmarks/pipelinedp_mean.py in the benchmark-only venv benchmarks/.venv-bench
  (create it with benchmarks/setup_bench_venv.sh) as a subprocess; skipped, saying so,
  without that venv. pipelinedp_mae_expected: its mechanism (an equal split of epsilon
  between a count and a sum of v - R/2, Laplace) over the same --noise-trials draws, so
  the two errors compare without one draw's luck; time_ratio_vs_pipelinedp =
  dp_seconds / pipelinedp_seconds (target <= 0.2), mae_ratio_vs_pipelinedp =
  dp_mae_expected / pipelinedp_mae_expected (target <= 1), and the same ratio over
  10 x --noise-trials PAIRED draws (`paired_mae_ratio`: the two mechanisms on the same
  standard Laplace draws), mae_ratio_vs_pipelinedp_paired, the steadier figure;
- sum_mae / variance_mae and their ratios against PipelineDP 0.3.1's SUM and VARIANCE mechanisms
  (`moment_mae_ratios`: per-key, --noise-trials PAIRED draws on the same rows; its SUM is the same Lap(R/eps),
  its VARIANCE an equal split with the squares at sensitivity R^2/2);
- with --partition-delta D, keys not known in advance on both sides: dp_group_by_mean's
  partition_selection=D against PipelineDP's private partitions at total_delta D;
  dp_keys_released / pipelinedp_keys_released and the measured MAEs over the keys each
  released (mae_ratio_vs_pipelinedp_measured).
"""

import functools
import json
import os
import statistics
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from sage_tfx.bench import _tft_harness as harness
from sage_tfx.transform.noise import CENTRED_MEAN, MEAN_FORMS, MeanRelease, add_laplace, guarded_mean, mean_release

REPO = Path(__file__).resolve().parents[2]
DEFAULT_BENCH_PYTHON = REPO / "benchmarks" / ".venv-bench" / "bin" / "python"
PIPELINEDP_SCRIPT = REPO / "benchmarks" / "pipelinedp_mean.py"


def add_arguments(parser):
    parser.add_argument("--rows", type=int, default=1_000_000, help="generated rows (default 1,000,000)")
    parser.add_argument("--keys", type=int, default=24, help="number of keys (24 = hour of day)")
    parser.add_argument("--epsilon", type=float, default=1.0, help="epsilon of dp_group_by_mean (default 1.0)")
    parser.add_argument("--value-range", type=float, default=100.0, help="speeds clipped to [0, R] mph (default 100)")
    parser.add_argument("--batch-rows", type=int, default=10_000, help="rows per Arrow record batch fed to Beam")
    parser.add_argument(
        "--repeats", type=int, default=5, help="timed runs of each pipeline, alternating (median reported)"
    )
    parser.add_argument("--noise-trials", type=int, default=1000, help="noise draws for dp_mae_expected")
    parser.add_argument("--seed", type=int, default=0, help="seed of the generated data (not of the DP noise)")
    parser.add_argument(
        "--bench-python",
        default=str(DEFAULT_BENCH_PYTHON),
        help="python of the venv with pipeline-dp (default benchmarks/.venv-bench/bin/python)",
    )
    parser.add_argument("--no-pipelinedp", action="store_true", help="skip the PipelineDP comparison")
    parser.add_argument(
        "--pipelinedp-backend",
        choices=["beam", "local"],
        default="beam",
        help="PipelineDP's backend: beam (DirectRunner, the default) or local",
    )
    parser.add_argument("--pipelinedp-repeats", type=int, default=1, help="PipelineDP runs (median reported)")
    parser.add_argument(
        "--partition-delta",
        type=float,
        default=0.0,
        help="> 0: keys not known in advance on both sides (dp_group_by_mean's partition_selection, "
        "PipelineDP's private partitions) at this delta; MAE over the keys each released",
    )
    parser.add_argument(
        "--mean-form",
        choices=list(MEAN_FORMS),
        default=CENTRED_MEAN,
        help="dp_group_by_mean's mean_form (default centred; sage: the paper's form)",
    )


def _log(message):
    harness.log("group-by-mean", message)


def generate_keys_and_speeds(rows, nkeys, seed, batch_rows):
    """GENERATED (key, speed) arrays, one pair per batch of `batch_rows` rows (the last may be shorter).

    key = hour of day when nkeys == 24, else the hour spread over nkeys. Each batch is
    drawn from its own seed, so a pipeline can regenerate batch i from (seed, i) alone.
    """
    return [_generate_batch(i, rows, nkeys, seed, batch_rows) for i in range(-(-rows // batch_rows))]


def _generate_batch(index, rows, nkeys, seed, batch_rows):

    from sage_tfx.transform._testdata import generate_taxi_speeds

    size = min(batch_rows, rows - index * batch_rows)
    hours, speeds = generate_taxi_speeds(size, seed=[seed, index])
    spread = np.random.default_rng([seed, index, 1]).integers(0, -(-nkeys // 24), size=size)
    return (hours + 24 * spread) % nkeys, speeds


def _record_batch(index, rows, nkeys, seed, batch_rows):
    """Batch `index` as an Arrow record batch, generated inside the pipeline (nothing big is pickled)."""

    keys, speeds = _generate_batch(index, rows, nkeys, seed, batch_rows)
    return harness.arrow_batch({"key": keys.astype(np.int64), "speed": speeds.astype(np.float32)})


def _key_values(output):
    """{key: set of transformed values} of one output record batch."""

    batch = output[0]
    keys = np.asarray(batch.column("key").flatten())
    values = np.asarray(batch.column("mean").flatten())
    return {int(k): set(values[keys == k].tolist()) for k in np.unique(keys)}


def _merge(dicts):
    merged = {}
    for d in dicts:
        for k, values in d.items():
            merged.setdefault(k, set()).update(values)
    return merged


def _preprocessing_fns(nkeys, epsilon, value_range, mean_form, partition_delta=0.0):
    import tensorflow as tf
    import tensorflow_transform as tft

    from sage_tfx.transform import dp_group_by_mean

    def dp_fn(inputs):
        return {
            "key": inputs["key"],
            "mean": dp_group_by_mean(inputs["key"], inputs["speed"], nkeys, epsilon, value_range, mean_form=mean_form),
        }

    def selected_fn(inputs):  # keys not known in advance: a key not released gets the fallback (NaN-free: -1)
        return {
            "key": inputs["key"],
            "mean": dp_group_by_mean(
                inputs["key"],
                inputs["speed"],
                None,
                epsilon,
                value_range,
                mean_form=mean_form,
                partition_selection=partition_delta,
                fallback=UNRELEASED,
            ),
        }

    if partition_delta:
        dp_fn = selected_fn

    def plain_fn(inputs):
        key = tf.reshape(inputs["key"], [-1])
        speed = tf.reshape(inputs["speed"], [-1])
        speed = tf.clip_by_value(tf.where(tf.math.is_nan(speed), tf.zeros_like(speed), speed), 0.0, value_range)
        one_hot = tf.one_hot(key, nkeys, dtype=tf.float32)
        counts = tft.sum(one_hot, reduce_instance_dims=False)
        sums = tft.sum(one_hot * speed[:, None], reduce_instance_dims=False)
        means = tf.clip_by_value(sums / tf.maximum(counts, 1.0), 0.0, value_range)
        return {"key": inputs["key"], "mean": tf.gather(means, key)}

    def segment_fn(inputs):
        # The plain analyzer fed the same per-batch reduction as the DP one (unsorted_segment_sum).
        key = tf.reshape(inputs["key"], [-1])
        speed = tf.reshape(inputs["speed"], [-1])
        speed = tf.clip_by_value(tf.where(tf.math.is_nan(speed), tf.zeros_like(speed), speed), 0.0, value_range)
        counts = tft.sum(
            tf.math.unsorted_segment_sum(tf.ones_like(speed), key, nkeys)[None, :], reduce_instance_dims=False
        )
        sums = tft.sum(tf.math.unsorted_segment_sum(speed, key, nkeys)[None, :], reduce_instance_dims=False)
        means = tf.clip_by_value(sums / tf.maximum(counts, 1.0), 0.0, value_range)
        return {"key": inputs["key"], "mean": tf.gather(means, key)}

    return dp_fn, plain_fn, segment_fn


def _run_tft(preprocessing_fn, args, n_batches, run_id):
    """Analyze and transform the first n_batches generated batches; return (seconds, {key: set of output values})."""
    import tensorflow as tf

    spec = {"key": tf.io.FixedLenFeature([], tf.int64), "speed": tf.io.FixedLenFeature([], tf.float32)}
    make_batch = functools.partial(
        _record_batch, rows=args.rows, nkeys=args.keys, seed=args.seed, batch_rows=args.batch_rows
    )
    return harness.run_tft(preprocessing_fn, spec, make_batch, n_batches, _key_values, _merge, run_id)


UNRELEASED = -1.0  # the public fallback of a key partition selection did not release (no mean is negative)


def _mae(per_key_values, exact_means):
    """Mean absolute error over the keys released (all of them with public keys)."""
    keys = sorted(per_key_values)
    assert all(len(per_key_values[k]) == 1 for k in keys), "a key got more than one transformed value"
    got = np.array([next(iter(per_key_values[k])) for k in keys])
    released = got != UNRELEASED
    return float(np.mean(np.abs(got[released] - exact_means[keys][released])))


def _released(per_key_values):
    return sum(next(iter(v)) != UNRELEASED for v in per_key_values.values())


def pipelinedp_release(epsilon, value_range) -> MeanRelease:
    """PipelineDP's MEAN (its dp_computations.compute_dp_mean): count and sum of v - R/2 at epsilon / 2 each."""
    half = value_range / 2.0
    return MeanRelease("pipelinedp", half, (2.0 / epsilon, half / (epsilon / 2.0)), (1.0, half))


def expected_mae(counts, sums, exact_means, value_range, release, trials, seed=0):
    """Mean absolute error over the present keys of `release` drawn `trials` times (`noise.add_laplace`) on the
    exact tables, averaged."""
    present = counts > 0
    shifted = sums - release.shift * counts
    errors = []
    for trial in range(trials):
        dp_counts, dp_sums = add_laplace(
            [counts, shifted],
            release.scales,
            seed=seed + trial,
            stream="bench",
            sensitivities=release.sensitivities,
            cells=[1, 1],
        )
        means = guarded_mean(dp_sums, dp_counts, value_range, shift=release.shift)
        errors.append(np.mean(np.abs(means[present] - exact_means[present])))
    return float(np.mean(errors))


def paired_mae_ratio(counts, sums, exact_means, value_range, ours, theirs, trials, seed=0):
    """Expected MAE of release `ours` over that of `theirs`, both on the SAME `trials` standard Laplace draws scaled
    by each release's b (numpy's float Laplace, which the grid release matches to a relative 2^-20): common random
    numbers, so a ratio of 0.99 is the mechanisms' and not the draws' luck."""
    present = counts > 0
    rng = np.random.default_rng(seed)
    totals = np.zeros(2)
    for _ in range(trials):
        unit = rng.laplace(0.0, 1.0, size=(2, counts.size))
        for i, release in enumerate((ours, theirs)):
            noisy_c = counts + release.scales[0] * unit[0]
            noisy_s = sums - release.shift * counts + release.scales[1] * unit[1]
            means = guarded_mean(noisy_s, noisy_c, value_range, shift=release.shift)
            totals[i] += np.mean(np.abs(means[present] - exact_means[present]))
    return float(totals[0] / totals[1])


def pipelinedp_variance_scales(epsilon, value_range):
    """PipelineDP 0.3.1's VARIANCE (dp_computations.compute_dp_var): count, sum of v - R/2 and sum of (v - R/2)^2 at
    epsilon / 3 each, the squares at sensitivity R^2/2 (its interval [0, R^2] for values in [0, R]); no clip."""
    third = epsilon / 3.0
    return (1.0 / third, value_range / 2.0 / third, value_range**2 / 2.0 / third)


def moment_mae_ratios(keys, speeds, nkeys, epsilon, value_range, trials, seed=0):
    """Per-key SUM and VARIANCE, ours over PipelineDP 0.3.1's mechanism: expected mean absolute errors over the
    present keys on the SAME `trials` standard Laplace draws scaled by each side's b (as `paired_mae_ratio`).

    Ours: `moments.sum_release` (Lap(R/eps) on the raw sum) and `moments.variance_release` (the split chosen by the
    expected error, `noise.guarded_variance`); PipelineDP's SUM is Lap(R/eps) too (its L1 sensitivity max(|0|, |R|)),
    its VARIANCE `pipelinedp_variance_scales`."""
    from sage_tfx.transform.moments import sum_release, variance_release

    v = np.clip(np.nan_to_num(speeds, nan=0.0), 0.0, value_range)
    counts = np.bincount(keys, minlength=nkeys).astype(np.float64)
    present = counts > 0
    c = value_range / 2.0
    exact = [counts, np.bincount(keys, v - c, nkeys), np.bincount(keys, (v - c) ** 2, nkeys)]
    raw = np.bincount(keys, v, nkeys)
    n = np.maximum(counts, 1.0)
    exact_var = exact[2] / n - (exact[1] / n) ** 2
    ours, theirs = variance_release(epsilon, value_range).scales, pipelinedp_variance_scales(epsilon, value_range)
    sum_scale = sum_release(epsilon, value_range).scales[0]
    rng = np.random.default_rng(seed)
    totals = np.zeros(3)
    for _ in range(trials):
        unit = rng.laplace(0.0, 1.0, size=(3, nkeys))
        totals[0] += np.mean(np.abs(sum_scale * unit[0][present]))  # the same mechanism on both sides
        mine = _noisy_variance(exact, ours, unit, value_range)
        tables = [t + b * u for t, b, u in zip(exact, theirs, unit)]
        dp_n = np.maximum(tables[0], 1.0)
        totals[1] += np.mean(np.abs(mine[present] - exact_var[present]))
        totals[2] += np.mean(np.abs((tables[2] / dp_n - (tables[1] / dp_n) ** 2)[present] - exact_var[present]))
    return {
        "sum_mae": float(totals[0] / trials),
        "sum_mae_relative": float(totals[0] / trials / np.mean(raw[present])),
        "sum_mae_ratio_vs_pipelinedp_paired": 1.0,
        "variance_mae": float(totals[1] / trials),
        "pipelinedp_variance_mae": float(totals[2] / trials),
        "variance_mae_ratio_vs_pipelinedp_paired": round(float(totals[1] / totals[2]), 4),
    }


def _noisy_variance(exact, scales, unit, value_range):
    """`noise.guarded_variance` of the exact (count, centred sum, centred squares) tables plus scales x unit draws."""
    from sage_tfx.transform.noise import guarded_variance

    return guarded_variance(*(t + b * u for t, b, u in zip(exact, scales, unit)), value_range)


def _run_pipelinedp_once(args, data):
    cmd = [
        str(args.bench_python),
        str(PIPELINEDP_SCRIPT),
        data,
        "--keys",
        str(args.keys),
        "--epsilon",
        repr(args.epsilon),
        "--value-range",
        repr(args.value_range),
        "--backend",
        args.pipelinedp_backend,
        "--partition-delta",
        repr(args.partition_delta),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout)


def _run_pipelinedp(args, keys, speeds, exact_means):
    bench_python = Path(args.bench_python)
    if not bench_python.exists():
        return {"pipelinedp": f"skipped: {bench_python} missing (run benchmarks/setup_bench_venv.sh)"}
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "rows.npz")
        np.savez(data, keys=keys, values=speeds)
        outs = []
        for i in range(args.pipelinedp_repeats):
            _log(f"PipelineDP run {i + 1}/{args.pipelinedp_repeats} ({args.pipelinedp_backend} backend)")
            outs.append(_run_pipelinedp_once(args, data))
    present = ~np.isnan(exact_means)
    means = [np.array(o["means"], dtype=np.float64) for o in outs]  # NaN: a key PipelineDP did not release
    maes = [float(np.nanmean(np.abs(m[present] - exact_means[present]))) for m in means]
    return {
        "pipelinedp_version": outs[0]["version"],
        "pipelinedp_backend": outs[0]["backend"],
        "pipelinedp_seconds": round(statistics.median(o["seconds"] for o in outs), 3),
        "pipelinedp_seconds_all": [round(o["seconds"], 3) for o in outs],
        "pipelinedp_mae": statistics.median(maes),
        "pipelinedp_mae_all": maes,
        "pipelinedp_keys_released": [int(np.sum(~np.isnan(m))) for m in means],
    }


def run(args):
    for name in ("rows", "keys", "batch_rows", "repeats", "noise_trials", "pipelinedp_repeats"):
        if getattr(args, name) < 1:
            raise SystemExit(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    from sage_tfx.transform._testdata import GENERATED_LABEL, exact_clipped_means
    from sage_tfx.transform.noise import check_epsilon, check_value_range

    check_epsilon(args.epsilon, "--epsilon")
    check_value_range(args.value_range, "--value-range")
    _log(f"generating {args.rows} rows with {args.keys} keys")

    pieces = generate_keys_and_speeds(args.rows, args.keys, args.seed, args.batch_rows)
    keys, speeds = np.concatenate([k for k, _ in pieces]), np.concatenate([s for _, s in pieces])
    counts, sums, exact_means = exact_clipped_means(keys, speeds, args.keys, args.value_range)
    _log("importing TensorFlow / tf.Transform")
    import sage_tfx  # noqa: F401

    if not 0.0 <= args.partition_delta < 1.0:
        raise SystemExit(f"--partition-delta must be in [0, 1), got {args.partition_delta}")
    dp_fn, plain_fn, segment_fn = _preprocessing_fns(
        args.keys, args.epsilon, args.value_range, args.mean_form, args.partition_delta
    )
    n_batches = len(pieces)
    _log("warm-up run of both pipelines on one batch")
    _run_tft(plain_fn, args, 1, "warm-plain")
    _run_tft(dp_fn, args, 1, "warm-dp")
    _run_tft(segment_fn, args, 1, "warm-segment")

    runs = [
        (label, functools.partial(_run_tft, fn, args, n_batches))
        for label, fn in (("dp", dp_fn), ("baseline", plain_fn), ("segment", segment_fn))
    ]
    _log(f"{args.repeats} repeats of each pipeline over {args.rows} rows, rotating the order")
    results = harness.alternate(runs, args.repeats, "group-by-mean")
    times = {label: [seconds for seconds, _ in done] for label, done in results.items()}
    maes = {label: [_mae(per_key, exact_means) for _, per_key in done] for label, done in results.items()}
    dp_seconds, baseline_seconds = statistics.median(times["dp"]), statistics.median(times["baseline"])
    segment_seconds = statistics.median(times["segment"])
    figures = {
        "data": GENERATED_LABEL,
        "rows": args.rows,
        "keys": args.keys,
        "epsilon": args.epsilon,
        "mean_form": args.mean_form,
        "partition_delta": args.partition_delta,
        "dp_keys_released": [_released(per_key) for _, per_key in results["dp"]],
        "value_range": args.value_range,
        "runner": "DirectRunner",
        "repeats": args.repeats,
        "dp_seconds": round(dp_seconds, 3),
        "baseline_seconds": round(baseline_seconds, 3),
        "ratio": round(dp_seconds / baseline_seconds, 3),
        "dp_seconds_all": [round(t, 3) for t in times["dp"]],
        "baseline_seconds_all": [round(t, 3) for t in times["baseline"]],
        "segment_baseline_seconds": round(segment_seconds, 3),
        "ratio_vs_segment_baseline": round(dp_seconds / segment_seconds, 3),
        "dp_mae": statistics.mean(maes["dp"]),
        "dp_mae_expected": expected_mae(
            counts,
            sums,
            exact_means,
            args.value_range,
            mean_release(args.epsilon, args.value_range, args.mean_form),
            args.noise_trials,
        ),
        "baseline_mae": max(maes["baseline"] + maes["segment"]),  # float32 rounding only: exact means
    }
    figures.update(moment_mae_ratios(keys, speeds, args.keys, args.epsilon, args.value_range, args.noise_trials))
    if not args.no_pipelinedp:
        _add_pipelinedp(figures, args, keys, speeds, (counts, sums, exact_means), dp_seconds)
    return figures


def _add_pipelinedp(figures, args, keys, speeds, exact, dp_seconds):
    """PipelineDP's per-partition MEAN on the same rows, and its time and error beside ours, into ``figures``;
    ``exact``: the per-key (counts, sums, means) of the clipped values."""
    counts, sums, exact_means = exact
    _log("PipelineDP per-partition MEAN in the benchmark venv")
    figures.update(_run_pipelinedp(args, keys, speeds, exact_means))
    if "pipelinedp_seconds" in figures:
        figures["time_ratio_vs_pipelinedp"] = round(dp_seconds / figures["pipelinedp_seconds"], 4)
        figures["mae_ratio_vs_pipelinedp_measured"] = round(figures["dp_mae"] / figures["pipelinedp_mae"], 4)
    if "pipelinedp_seconds" in figures and not args.partition_delta:
        figures["pipelinedp_mae_expected"] = expected_mae(
            counts,
            sums,
            exact_means,
            args.value_range,
            pipelinedp_release(args.epsilon, args.value_range),
            args.noise_trials,
        )
        figures["mae_ratio_vs_pipelinedp"] = round(figures["dp_mae_expected"] / figures["pipelinedp_mae_expected"], 4)
        figures["mae_ratio_vs_pipelinedp_paired"] = round(
            paired_mae_ratio(
                counts,
                sums,
                exact_means,
                args.value_range,
                mean_release(args.epsilon, args.value_range, args.mean_form),
                pipelinedp_release(args.epsilon, args.value_range),
                10 * args.noise_trials,
            ),
            4,
        )
