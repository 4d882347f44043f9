"""The DP analyzers (scalers, quantiles, bucketize, vocabularies) vs tf.Transform's own, time and error.

On GENERATED rows (a fare-like number, log-normal clipped to the public range [0, 100], and a company-like
string, Zipf over 10,000 names; not real trips), each pair of preprocessing_fns runs through
tft_beam.AnalyzeAndTransformDataset on the Beam DirectRunner with the harness group-by-mean uses
(sage_tfx/bench/_tft_harness.py: batches generated inside the pipeline, a tiny sink):

    dp_scale_to_z_score(x, eps, (0, 100))       vs  tft.scale_to_z_score(x)
    dp_scale_to_0_1(x, eps, (0, 100))           vs  tft.scale_to_0_1(x)
    dp_quantiles(x, 10, eps, (0, 100))          vs  tft.quantiles(x, 10, epsilon=0.01)
    dp_bucketize(x, 10, eps, (0, 100))          vs  tft.bucketize(x, 10)
    dp_vocabulary(s, eps, delta, top_k=1000)    vs  tft.vocabulary(s, top_k=1000)
    dp_compute_and_apply_vocabulary(s, ...)     vs  tft.compute_and_apply_vocabulary(s, top_k=1000)

Each pipeline runs --repeats times, the order rotating; ``ratio`` = median DP seconds / median tft
seconds. Errors, at --epsilon (default 1; delta 1e-6 for the vocabularies), against the exact statistics of
the same generated rows (numpy) and against tft's result; one noise draw per repeat (fresh OS entropy),
each error reported as the median over repeats (and ``_all``):

- z-score: |mean - exact mean|, |std - exact std|, read back from the transformed rows (least squares of
  output on input, exact for an affine map);
- 0-1: the (lo, hi) each maps to 0 and 1 (DP: its 1% / 99% quantiles by design; tft: min / max), their
  rank error against 0.01 / 0.99, and the mean |DP output - tft output| over the rows;
- quantiles: the largest rank error max_i |F(b_i) - i/10| (F: the exact CDF of the rows), DP and tft;
- bucketize: the largest deviation of a bucket's share of rows from 1/10, DP and tft;
- vocabularies: size; recall of the exact top 100 and top 1000 (the values in EVERY exact top k, i.e.
  counted more often than the (k+1)-th value, so that ties cannot decide); precision (the share of the
  vocabulary in SOME exact top 1000: counted at least as often as the 1000th value); and the share of
  rows whose value is in the vocabulary. tft's vocabulary scores 1 on all three.
"""

import collections
import functools
import statistics

import numpy as np

from sage_tfx import comma_lists
from sage_tfx.bench import _tft_harness as harness

BENCH = "analyzers"
LOW, HIGH = 0.0, 100.0
NUM_BUCKETS = 10
TOP_K = 1000
NAMES = 10_000
DELTA = 1e-6
ANALYZERS = ("z_score", "scale_0_1", "quantiles", "bucketize", "vocabulary", "compute_and_apply_vocabulary")
GENERATED = (
    "GENERATED rows: x ~ log-normal(2.3, 0.6) clipped to [0, 100] (fare-like); s ~ Zipf(1.2) over "
    f"{NAMES:,} company-like names; not real trips"
)


def add_arguments(parser):
    parser.add_argument("--rows", type=int, default=1_000_000, help="generated rows (default 1,000,000)")
    parser.add_argument("--epsilon", type=float, default=1.0, help="epsilon of each DP analyzer (default 1.0)")
    parser.add_argument("--batch-rows", type=int, default=10_000, help="rows per Arrow record batch fed to Beam")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of each pipeline, rotating (median)")
    parser.add_argument(
        "--analyzers",
        type=comma_lists.names,
        default=",".join(ANALYZERS),
        help=f"comma list of {','.join(ANALYZERS)} (default all)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the generated data (not of the DP noise)")
    parser.add_argument(
        "--no-warmup", action="store_true", help="skip the one-batch warm-up run of each pipeline (quick checks only)"
    )


# ---------------------------------------------------------------- GENERATED data


def generate_batch(index, rows, seed, batch_rows):
    """GENERATED (x float64, s bytes object array) of batch ``index``, from (seed, index) alone."""

    size = min(batch_rows, rows - index * batch_rows)
    rng = np.random.default_rng([seed, index])
    x = np.clip(rng.lognormal(2.3, 0.6, size=size), LOW, HIGH)
    ids = np.minimum(rng.zipf(1.2, size=size), NAMES)
    names = np.array([b"company_%05d" % i for i in range(NAMES + 1)], dtype=object)
    return x, names[ids]


def _record_batch(index, rows, seed, batch_rows):

    x, s = generate_batch(index, rows, seed, batch_rows)
    return harness.arrow_batch({"x": x.astype(np.float32), "s": s})


def _exact(rows, seed, batch_rows):
    """The generated rows (x as float32, as the pipelines see it) and their exact value counts."""

    pieces = [generate_batch(i, rows, seed, batch_rows) for i in range(-(-rows // batch_rows))]
    x = np.sort(np.concatenate([p[0] for p in pieces]).astype(np.float32).astype(np.float64))
    counts = collections.Counter()
    for _, s in pieces:
        counts.update(s.tolist())
    return x, counts


# ---------------------------------------------------------------- preprocessing_fns


def _preprocessing_fns(name, epsilon):
    """(dp_fn, tft_fn) of one analyzer pair."""
    import tensorflow as tf
    import tensorflow_transform as tft

    from sage_tfx.transform import (
        dp_bucketize,
        dp_compute_and_apply_vocabulary,
        dp_quantiles,
        dp_scale_to_0_1,
        dp_scale_to_z_score,
        dp_vocabulary,
    )

    def rows_of(t, inputs):
        return tf.fill(tf.shape(inputs["x"]), t)

    def tiled(boundaries, inputs):
        return tf.tile(tf.reshape(boundaries, [1, -1]), tf.stack([tf.shape(inputs["x"])[0], 1]))

    pairs = {
        "z_score": (
            lambda i: {"x": i["x"], "y": dp_scale_to_z_score(i["x"], epsilon, (LOW, HIGH))},
            lambda i: {"x": i["x"], "y": tft.scale_to_z_score(i["x"])},
        ),
        "scale_0_1": (
            lambda i: {"x": i["x"], "y": dp_scale_to_0_1(i["x"], epsilon, (LOW, HIGH))},
            lambda i: {"x": i["x"], "y": tft.scale_to_0_1(i["x"])},
        ),
        "quantiles": (
            lambda i: {"b": tiled(dp_quantiles(i["x"], NUM_BUCKETS, epsilon, (LOW, HIGH)), i)},
            lambda i: {"b": tiled(tft.quantiles(i["x"], NUM_BUCKETS, epsilon=0.01), i)},
        ),
        "bucketize": (
            lambda i: {"bucket": dp_bucketize(i["x"], NUM_BUCKETS, epsilon, (LOW, HIGH))},
            lambda i: {"bucket": tft.bucketize(i["x"], NUM_BUCKETS)},
        ),
        "vocabulary": (
            lambda i: {"n": rows_of(tf.size(dp_vocabulary(i["s"], epsilon, DELTA, top_k=TOP_K), out_type=tf.int64), i)},
            # tft.vocabulary gives the vocabulary FILE's path: a column depending on it keeps it
            lambda i: {"path": rows_of(tft.vocabulary(i["s"], top_k=TOP_K), i)},
        ),
        "compute_and_apply_vocabulary": (
            lambda i: {
                "s": i["s"],
                "id": dp_compute_and_apply_vocabulary(
                    i["s"], epsilon, DELTA, top_k=TOP_K, num_oov_buckets=0, default_value=-1
                ),
            },
            lambda i: {
                "s": i["s"],
                "id": tft.compute_and_apply_vocabulary(i["s"], top_k=TOP_K, num_oov_buckets=0, default_value=-1),
            },
        ),
    }
    return pairs[name]


# ---------------------------------------------------------------- sinks: small summaries of the outputs


def _column(batch, name):

    return np.asarray(batch.column(name).flatten())


def _summarize(name, outputs):
    """A small, mergeable summary of one output record batch (a list holding one batch)."""

    batch = outputs[0]
    if name in ("z_score", "scale_0_1"):
        x, y = _column(batch, "x").astype(np.float64), _column(batch, "y").astype(np.float64)
        if name == "scale_0_1":  # the affine part only: rows the map did not clip
            keep = (y > 0.0) & (y < 1.0)
            x, y = x[keep], y[keep]
        return {"affine": np.array([len(x), x.sum(), y.sum(), (x * x).sum(), (x * y).sum()])}
    if name == "quantiles":
        return {"boundaries": _column(batch, "b")[: NUM_BUCKETS - 1].astype(np.float64)}
    if name == "bucketize":
        return {"counts": np.bincount(_column(batch, "bucket"), minlength=NUM_BUCKETS).astype(np.float64)}
    if name == "vocabulary":  # DP: the vocabulary's size; tft: its file's path (no size to read back)
        return {"n": int(_column(batch, "n")[0])} if "n" in batch.schema.names else {}
    ids, values = _column(batch, "id"), _column(batch, "s")
    return {"vocab": {bytes(v): int(i) for v, i in zip(values[ids >= 0], ids[ids >= 0])}}


def _merge(summaries):
    merged = {}
    for summary in summaries:
        for key, value in summary.items():
            if key in ("affine", "counts"):
                merged[key] = merged[key] + value if key in merged else value
            elif key == "vocab":
                merged.setdefault(key, {}).update(value)
            else:
                merged.setdefault(key, value)
    return merged


def _run(name, fn, args, n_batches, run_id):
    import tensorflow as tf

    spec = {"x": tf.io.FixedLenFeature([], tf.float32), "s": tf.io.FixedLenFeature([], tf.string)}
    make_batch = functools.partial(_record_batch, rows=args.rows, seed=args.seed, batch_rows=args.batch_rows)
    return harness.run_tft(fn, spec, make_batch, n_batches, functools.partial(_summarize, name), _merge, run_id)


# ---------------------------------------------------------------- errors against the exact statistics


def _affine(stats):
    """(a, b) of y = a x + b by least squares from (n, sum x, sum y, sum x^2, sum xy)."""
    n, sx, sy, sxx, sxy = stats
    a = (n * sxy - sx * sy) / (n * sxx - sx * sx)
    return a, (sy - a * sx) / n


def _rank(sorted_x, value):
    """F(value): the share of rows <= value."""

    return float(np.searchsorted(sorted_x, value, side="right")) / len(sorted_x)


def _errors(name, merged, x, counts):
    """Error figures of one run's output (module docstring)."""

    if name == "z_score":
        a, b = _affine(merged["affine"])  # y = (x - mean) / std
        std, mean = 1.0 / a, -b / a
        return {"mean": mean, "std": std, "mean_abs_error": abs(mean - x.mean()), "std_abs_error": abs(std - x.std())}
    if name == "scale_0_1":
        a, b = _affine(merged["affine"])  # y = (x - lo) / (hi - lo)
        lo, hi = -b / a, (1.0 - b) / a
        return {"lo": lo, "hi": hi, "lo_rank": _rank(x, lo), "hi_rank": _rank(x, hi)}
    if name == "quantiles":
        boundaries = merged["boundaries"]
        levels = np.arange(1, NUM_BUCKETS) / NUM_BUCKETS
        ranks = np.array([_rank(x, v) for v in boundaries])
        return {
            "boundaries": [round(float(v), 4) for v in boundaries],
            "max_rank_error": float(np.max(np.abs(ranks - levels))),
        }
    if name == "bucketize":
        shares = merged["counts"] / merged["counts"].sum()
        return {"max_share_error": float(np.max(np.abs(shares - 1.0 / NUM_BUCKETS)))}
    if name == "vocabulary":
        return {"size": merged["n"]} if "n" in merged else {}
    vocab = set(merged.get("vocab", {}))
    ranked = sorted(counts.values(), reverse=True)
    total = sum(counts.values())

    def surely_top(k):  # in every exact top k (count above the (k+1)-th count): ties cannot push it out
        return {v for v, c in counts.items() if len(ranked) <= k or c > ranked[k]}

    maybe_top1000 = {v for v, c in counts.items() if len(ranked) <= TOP_K or c >= ranked[TOP_K - 1]}
    top100, top1000 = surely_top(100), surely_top(TOP_K)
    return {
        "size": len(vocab),
        "recall_top100": len(vocab & top100) / max(len(top100), 1),
        "recall_top1000": len(vocab & top1000) / max(len(top1000), 1),
        "precision_top1000": len(vocab & maybe_top1000) / max(len(vocab), 1),
        "row_coverage": sum(counts[v] for v in vocab) / total,
    }


def _scaled(x, lo, hi):

    return np.clip((x - lo) / max(hi - lo, 1e-12), 0.0, 1.0)


def _median(values):

    return statistics.median(values)


def _figures(name, results, x, counts):
    """One analyzer's figures from its DP and tft runs."""
    dp = [(s, _errors(name, r, x, counts)) for s, r in results["dp"]]
    base = [(s, _errors(name, r, x, counts)) for s, r in results["tft"]]
    dp_seconds, tft_seconds = harness.median_seconds(dp), harness.median_seconds(base)
    out = {
        "dp_seconds": round(dp_seconds, 3),
        "tft_seconds": round(tft_seconds, 3),
        "ratio": round(dp_seconds / tft_seconds, 3),
        "dp_seconds_all": [round(s, 3) for s, _ in dp],
        "tft_seconds_all": [round(s, 3) for s, _ in base],
    }
    if name == "scale_0_1":  # the mean |DP output - tft output| over the rows, per DP draw
        lo_t, hi_t = base[0][1]["lo"], base[0][1]["hi"]
        for _, e in dp:
            e["mean_abs_output_difference"] = float(abs(_scaled(x, e["lo"], e["hi"]) - _scaled(x, lo_t, hi_t)).mean())
    keys = [k for k, v in dp[0][1].items() if isinstance(v, (int, float))]
    for key in keys:
        values = [e[key] for _, e in dp]
        out[f"dp_{key}"] = _median(values)
        out[f"dp_{key}_all"] = values
    for key, value in base[0][1].items():
        out[f"tft_{key}"] = value
    if name == "quantiles":
        out["dp_boundaries"] = dp[0][1]["boundaries"]
    return out


def run(args):
    for option in ("rows", "batch_rows", "repeats"):
        if getattr(args, option) < 1:
            raise SystemExit(f"--{option.replace('_', '-')} must be >= 1, got {getattr(args, option)}")
    names = args.analyzers
    for name in names:
        if name not in ANALYZERS:
            raise SystemExit(f"--analyzers: {name!r} is not one of {ANALYZERS}")
    from sage_tfx.transform.noise import check_epsilon

    check_epsilon(args.epsilon, "--epsilon")
    harness.log(BENCH, f"generating {args.rows} rows and their exact statistics")
    x, counts = _exact(args.rows, args.seed, args.batch_rows)

    import sage_tfx  # noqa: F401  (before TensorFlow)

    n_batches = -(-args.rows // args.batch_rows)
    figures = {
        "data": GENERATED,
        "rows": args.rows,
        "epsilon": args.epsilon,
        "vocabulary_delta": DELTA,
        "runner": "DirectRunner",
        "repeats": args.repeats,
        "exact": {
            "mean": float(x.mean()),
            "std": float(x.std()),
            "min": float(x[0]),
            "max": float(x[-1]),
            "q01": float(np.quantile(x, 0.01)),
            "q99": float(np.quantile(x, 0.99)),
            "distinct_values": len(counts),
        },
    }
    for name in names:
        dp_fn, tft_fn = _preprocessing_fns(name, args.epsilon)
        if not args.no_warmup:
            harness.log(BENCH, f"{name}: warm-up on one batch")
            _run(name, tft_fn, args, 1, f"warm-tft-{name}")
            _run(name, dp_fn, args, 1, f"warm-dp-{name}")
        runs = [
            (label, functools.partial(_run, name, fn, args, n_batches))
            for label, fn in (("dp", dp_fn), ("tft", tft_fn))
        ]
        harness.log(BENCH, f"{name}: {args.repeats} repeats of each pipeline over {args.rows} rows")
        figures[name] = _figures(name, harness.alternate(runs, args.repeats, f"{BENCH}/{name}"), x, counts)
    ratios = [figures[n]["ratio"] for n in names]
    figures["max_ratio"] = max(ratios)
    figures["median_ratio"] = _median(ratios)
    return figures
