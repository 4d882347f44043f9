"""`sage score PIPELINE --held-out FILE`: the ACCEPTed model on rows the stream never held, beside baselines.

Scores the model PIPELINE pushed after its last ACCEPT (the newest under --serving-dir, default
WORK_DIR/serving) on the hold-out FILE (a CSV like the stream's input, TFRecords of tf.Examples, or Parquet),
with the SLA's metric, beside NON-PRIVATE baselines fitted on the training split of the ACCEPTed grant's
blocks: the mean label and least squares (mse, mae), the majority class and logistic regression (accuracy,
log_loss). A hold-out sharing a row with the stream is refused. It writes OUT/score.json and OUT/score.png.
It reads raw rows outside any grant (TRUSTED, no charge): each read is logged in the ledger's audit
(`sage ledger audit` lists it). The library call: sage_tfx.pipelines.scoring.score_model.

Exit codes: 0 scored, 2 bad input, no ACCEPT or pushed model, or a hold-out row in the stream.
"""

import argparse
import os
import sys

from sage_tfx import comma_lists

from ._exits import EXIT_BAD_INPUT, EXIT_OK


def add_parser(subparsers):
    p = subparsers.add_parser(
        "score",
        help="score the ACCEPTed model on a hold-out file beside non-private baselines",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("pipeline", help="what `sage run` ran: a built-in name, a pipeline file or a module path")
    p.add_argument("--held-out", required=True, metavar="FILE", help="the hold-out rows (CSV, TFRecord or Parquet)")
    p.add_argument(
        "--format",
        default=None,
        choices=("csv", "tfrecord", "parquet"),
        help="the hold-out's format when its name does not tell",
    )
    p.add_argument("--db", required=True, help="ledger file or postgresql:// URL")
    p.add_argument("--stream", required=True)
    p.add_argument("--data-root", required=True, help="where `sage ingest` wrote the stream's blocks")
    p.add_argument("--work-dir", default="sage_work", help="the run's --work-dir (default sage_work)")
    p.add_argument("--serving-dir", default=None, help="where the run pushed (default: WORK_DIR/serving)")
    p.add_argument("--name", default=None, help="the pipeline name the run used (sage run --name)")
    p.add_argument(
        "--features",
        type=comma_lists.names,
        default=None,
        metavar="COL,COL",
        help="the baselines' numeric columns (default: all but the label and the time column; leave "
        "out any column computed from the label)",
    )
    p.add_argument("--out", default=None, help="where score.json and score.png go (default: WORK_DIR/score)")
    p.set_defaults(func=_run)


def _run(args):
    from sage_tfx.pipelines.scoring import score_model, write_report
    from sage_tfx.privacy import LedgerError

    serving_dir = args.serving_dir or os.path.join(args.work_dir, "serving")
    features = args.features
    try:
        report = score_model(
            args.db,
            args.stream,
            args.pipeline,
            args.held_out,
            data_root=args.data_root,
            serving_dir=serving_dir,
            name=args.name,
            features=features,
            fmt=args.format,
        )
    except (ValueError, LookupError, LedgerError, OSError) as exc:
        print(f"sage score: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    paths = write_report(report, args.out or os.path.join(args.work_dir, "score"))
    print(describe(report))
    print(f"wrote {', '.join(paths)}")
    return EXIT_OK


def describe(report: dict) -> str:
    """The score as a few lines: the rows compared, then one line per predictor."""
    clipped = "" if report["loss_bound"] is None else f", losses clipped at {report['loss_bound']:g}"
    lines = [
        f"{report['pipeline']} (grant {report['grant']}, {report['grant_blocks']} blocks): {report['metric']} on "
        f"{report['held_out_rows_scored']:,} of {report['held_out_rows']:,} hold-out rows (those with a label"
        f"{clipped}); no hold-out row is a stream row (checked)",
        f"baselines NOT PRIVATE, fitted on the {report['baseline_rows']:,} training-split rows of the ACCEPTed "
        f"grant; features: {', '.join(report['baseline_features']) or 'none'}",
    ]
    target = report.get("target")
    for name, score in report["scores"].items():
        se = "" if score["standard_error"] is None else f" +- {score['standard_error']:.4g}"
        met = "" if target is None else ("  meets the target" if score["meets_target"] else "  misses the target")
        lines.append(f"  {name:<22}{score['value']:>12.6g}{se}{met}")
    if target is not None:
        lines.append(f"  (target {target:g}; +- one standard error over the hold-out rows)")
    return "\n".join(lines)
