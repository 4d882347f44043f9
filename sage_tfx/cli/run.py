"""`sage run PIPELINE`: privacy-adaptive training of a ready pipeline until ACCEPT, REJECT or TIMEOUT.

Each iteration is one TFX run under a fresh grant (charged before any read); one progress line per iteration gives
its blocks, epsilon, the validator's bound and the outcome. Killed and run again with the same arguments, it
resumes: the interrupted iteration re-runs under its grant, without a new charge. Run again once finished, with the
same request, it reports the stored outcome and charges nothing. The last line names the target and the bound.

Beam pipeline options go after a bare --, e.g. `sage run ... -- --direct_num_workers=2`. On a Beam job service with
an external SDK worker pool (docs/scale_out.md, "PortableRunner with an external worker pool"): `sage run ...
--runner beam -- --runner=PortableRunner --job_endpoint=HOST:PORT --environment_type=EXTERNAL
--environment_config=HOST:POOL_PORT --sdk_worker_parallelism=2`; module files are then staged with each Beam job as
a wheel (--extra_package), and the workers need --work-dir at the same path, and the data root too unless
--staging-location URL_OR_DIR is given (BlockExampleGen then stages the granted sealed files there for them).

--check runs one iteration on GENERATED rows of the stream's schema in a throwaway ledger first: schema and module
errors show there, before anything is charged; the candidate model is kept in WORK_DIR/check/NAME/model. It lists
the attempts (and RETRYs) the stream's remaining budget allows, read from the ledger without writing it. With
--target A[,B,...] it then estimates the rows the validator's ACCEPT test needs at those attempts, for a public
guess of the model's loss (--expected-loss); --estimate-only skips the dry run. --positive-rate or --label-std (a
PUBLIC prior on the label) say what a constant predictor reaches: a target it meets is refused, here and in a real
run, before any charge, unless --allow-trivial-target.

--schedule bbscheduler:FILE re-runs the pipeline under a growth schedule instead (BBScheduler, Cummings et al. 2018,
Section 3.1; docs/release_strategies.md, "A TFX pipeline under a growth schedule"): FILE is a JSON object {"epsilon":
E, "delta": D, "gamma": G, "t0": T0, "composition": "basic" (default) or "zcdp"}. Each block of the stream is charged
ONCE its lifetime (E, D) before anything reads it, and at block counts ceil(T0 (1 + G)^i) the pipeline runs on ALL
blocks so far under a run grant of (epsilon_i, delta_i) drawn from those charges (Ledger.draw: nothing more is
charged): (E, D) G / (1 + G)^(i + 1) under "basic"; under "zcdp" epsilon_i = c / (1 + G)^i, c calibrated to the
ledger's RDP filter of (E, D), and delta_i = (D / 2) G / (1 + G)^(i + 1) (composed as approximate zCDP; for
BBScheduler's few, geometrically shrinking runs this gives slightly SMALLER epsilon_i than "basic",
docs/release_strategies.md). --schedule bbimprover:FILE (Section 3.2), FILE {"epsilon": E, "delta": D, "a": A, "t0":
T0}: a run at EVERY block count t >= T0, epsilon_t = c t^-(1/2 + A), delta_t = (D / 2) (6 / pi^2) / (t - T0 + 1)^2,
composed as approximate zCDP likewise. --max-iterations bounds the runs made by one invocation (blocks after the last
run stay uncharged); run again as blocks arrive: it resumes (a run without an outcome re-runs under its same run
grant). Exit 0 when this invocation's runs ended, whatever their outcomes (a progress line each); 1 if one failed.

Exit codes: 0 ACCEPT (the model was pushed, or --check ran end to end), 4 REJECT (the REJECT test on the training
split showed the target is out of reach), 5 TIMEOUT, 2 bad input (or a --name another process runs: one process runs
a pipeline name at a time, on any host of the ledger; or a name already run for another --target, --confidence,
--model, SLA or pipeline/module file: its outcome certifies only what it was run for, so a new request needs a new
--name; or a --data-root, --work-dir, SLA label or block folder that cannot be used: checked before each charge), 1
an iteration failed after its charge (the message withholds details that may hold data values: run --check to see
them on generated rows; FAILED is recorded and its grant is spent) or was interrupted by an error of the environment
(an OSError such as a full disk, a block file missing or altered, TensorFlow's filesystem errors: no outcome is
recorded, and the same command run again after fixing the cause resumes it under its grant, with no new charge).
"""

import argparse
import math
import os
import sys

from sage_tfx import comma_lists
from sage_tfx.privacy.vocabulary import Outcome

from ._exits import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK
from ._exits import OUTCOME_EXIT_CODES as EXIT_CODES
from ._keys import add_key_file, ledger_location
from ._run_schedule import _run_scheduled, read_json_options, schedule_option  # noqa: F401 (read_json_options: serve)


def add_parser(subparsers):
    p = subparsers.add_parser(
        "run",
        help="privacy-adaptive training of a ready pipeline (taxi_regression, ...)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "pipeline",
        help="a built-in pipeline (taxi_regression, taxi_classification), the path of a "
        "pipeline file defining a SagePipeline, or a dotted module path",
    )
    p.add_argument("--db", required=True, type=ledger_location, help="ledger file or postgresql:// URL")
    add_key_file(p)
    p.add_argument("--stream", required=True)
    p.add_argument("--data-root", required=True, help="where `sage ingest` wrote the stream's blocks")
    p.add_argument(
        "--target",
        type=comma_lists.numbers,  # one number, or several A,B,C for --check
        default=None,
        help="quality target (required unless --check): MSE in seconds^2 (taxi_regression), accuracy "
        "(taxi_classification), in the unit of the pipeline's SLA. With --check, several "
        "candidates A,B,C are estimated from one dry run",
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="a dry run that spends nothing: one iteration on GENERATED rows of the stream's schema in a "
        "throwaway ledger, to find schema and module errors before any charge (exit 0 if it ran "
        "end to end, 2 with the error otherwise)",
    )
    p.add_argument(
        "--expected-loss",
        type=float,
        default=None,
        metavar="VALUE",
        help="with --check and --target: a PUBLIC guess of the model's true metric in the SLA's unit (a "
        "loss; for accuracy pipelines, the accuracy) for the estimate of the rows to ACCEPT (default: "
        "half the target loss; accuracy: half the target's error rate)",
    )
    p.add_argument(
        "--positive-rate",
        type=float,
        default=None,
        metavar="P",
        help="a PUBLIC prior on a binary label (accuracy, log_loss): its share of positives; a target "
        "the constant predictor then meets (majority class, constant probability P) is refused",
    )
    p.add_argument(
        "--label-std",
        type=float,
        default=None,
        metavar="S",
        help="a PUBLIC prior on the label (mse, mae): its standard deviation; a target the mean "
        "predictor then meets (mse S^2, mae S) is refused",
    )
    p.add_argument(
        "--allow-trivial-target",
        action="store_true",
        help="run (or estimate) a target the constant predictor of --positive-rate/--label-std meets",
    )
    p.add_argument(
        "--estimate-only",
        action="store_true",
        help="with --check: the attempts and estimates only, without the dry run (seconds)",
    )
    p.add_argument("--confidence", type=float, default=0.95, help="SLA confidence 1 - eta (default 0.95)")
    add_beam_options(p)
    p.add_argument("--max-iterations", type=int, default=10)
    p.add_argument(
        "--max-seconds", type=float, default=None, help="TIMEOUT after this wall time, in seconds > 0 (default: none)"
    )
    p.add_argument("--epsilon-start", type=float, default=None, help="first iteration's epsilon")
    p.add_argument("--min-window", type=int, default=None, help="first iteration's window, in blocks")
    add_rejection_share(p)
    p.add_argument(
        "--schedule",
        default=None,
        metavar="{bbscheduler,bbimprover}:FILE",
        help="re-run the pipeline under a growth schedule (BBScheduler or BBImprover) as blocks arrive "
        "instead of the Sage iterator: FILE is a JSON object of its options (see above)",
    )
    p.add_argument("--model", default=None, help="model family (pipeline-specific, e.g. linear or dnn)")
    p.add_argument(
        "--name",
        default=None,
        help="pipeline name in the ledger and MLMD (default: PIPELINE): 1-128 letters, digits and "
        "._:@+-, starting with a letter or digit",
    )
    p.add_argument(
        "--work-dir",
        default="sage_work",
        help="local work folder: the TFX pipeline root (unless --pipeline-root) and MLMD metadata",
    )
    p.add_argument("--serving-dir", default=None, help="push destination (default: WORK_DIR/serving)")
    p.set_defaults(func=_run)


def add_beam_options(parser):
    """``--runner`` (the TFX orchestrator) and ``--staging-location``: the Beam side of `sage run` and `sage serve`
    (the Beam pipeline options themselves go after a bare --; ``beam_options`` reads them all)."""
    parser.add_argument("--runner", choices=("local", "beam"), default="local", help="TFX orchestrator")
    parser.add_argument(
        "--staging-location",
        default=None,
        metavar="URL_OR_DIR",
        help="where BlockExampleGen stages the granted sealed block files for the Beam workers (a "
        "local folder or a Beam FileSystems URL every worker can read; BlockExampleGen's "
        "staging_location, and Beam's --temp_location). Needed when the workers do not see "
        "--data-root (docs/scale_out.md)",
    )
    parser.add_argument(
        "--pipeline-root",
        default=None,
        metavar="URL_OR_DIR",
        help="where the TFX artifacts go (Examples, Transform graph, Model, blessings), under "
        "PIPELINE_ROOT/NAME: a local folder or a URL every Beam worker can read (gs://, s3://, "
        "hdfs://; ram:// for in-process runs). Default: WORK_DIR/tfx. The MLMD store stays "
        "local (--metadata-path); docs/scale_out.md",
    )
    parser.add_argument(
        "--metadata-path",
        default=None,
        metavar="FILE",
        help="the MLMD SQLite file, a LOCAL path (never on an object store; with several `sage "
        "serve` pipelines it must contain {name}). Default: WORK_DIR/tfx/NAME/metadata.sqlite",
    )


def beam_options(args):
    """``(beam_args, staging_location)`` of a `sage run`/`sage serve` command line: the Beam pipeline options after
    the bare -- with ``--temp_location`` from ``--staging-location`` (``staging_beam_args``), and the staging
    location (absolute if a local folder). ValueError naming the value, before anything is opened or charged,
    for a staging location Beam has no filesystem for or one the Beam options contradict."""
    location = getattr(args, "staging_location", None)
    if location:
        from apache_beam.io.filesystems import FileSystems

        if FileSystems.get_scheme(location) is None:
            location = os.path.abspath(location)
        else:
            try:
                FileSystems.get_filesystem(location)
            except ValueError:
                raise ValueError(
                    f"--staging-location {location!r} has no Beam filesystem: give a local folder or a "
                    "URL of a filesystem Beam has (gs://, s3://, hdfs://...)"
                ) from None
    return staging_beam_args(list(getattr(args, "extra_args", [])), location), location or None


def root_options(args, names=None):
    """``(pipeline_root, metadata_path)`` of a `sage run`/`sage serve` command line, checked before anything is
    opened or charged (ValueError naming the value and the fix): a --pipeline-root URL must have a filesystem both
    TensorFlow's file layer and Beam have, and be reachable and writable from here (a folder is created); a local
    one comes back absolute. --metadata-path must be local, and hold ``{name}`` when ``names`` (the pipelines of a
    `sage serve`) are several, so each pipeline has its own SQLite file."""
    root, metadata = getattr(args, "pipeline_root", None), getattr(args, "metadata_path", None)
    if root is not None:
        from sage_tfx.pipelines._runner import check_pipeline_root

        if not root.strip():
            raise ValueError("--pipeline-root '' is empty: give a local folder or a URL (gs://bucket/path)")
        root = check_pipeline_root(root)
    if metadata is not None:
        from sage_tfx.pipelines._runner import is_url

        if is_url(metadata) or not metadata.strip():
            raise ValueError(
                f"--metadata-path {metadata!r} must be a local file path: MLMD's SQLite store does not "
                "work on an object store (the artifacts go to --pipeline-root)"
            )
        if names is not None and len(names) > 1 and "{name}" not in metadata:
            raise ValueError(
                f"--metadata-path {metadata!r} would be shared by the pipelines {', '.join(names)}: put "
                "{name} in it (e.g. mlmd/{name}.sqlite), one SQLite file per pipeline"
            )
        metadata = os.path.abspath(metadata)
    return root, metadata


def staging_beam_args(beam_args, staging_location):
    """``beam_args`` with ``--temp_location=STAGING_LOCATION`` (BlockExampleGen stages the granted sealed files
    there); ValueError if the Beam args already name another --temp_location."""
    if not staging_location:
        return beam_args
    for arg in beam_args:
        if arg.startswith("--temp_location") and arg != f"--temp_location={staging_location}":
            raise ValueError(
                f"--staging-location {staging_location!r} and the Beam option {arg!r} disagree: give one of them"
            )
    return [*beam_args, f"--temp_location={staging_location}"]


def add_rejection_share(parser):
    parser.add_argument(
        "--rejection-share",
        type=float,
        default=None,
        metavar="FRACTION",
        help="share of each iteration's training side paid to the validator's REJECT test on the "
        "training split (default: the pipeline's, 0.1); 0 turns the REJECT test off",
    )


def _fail(message):
    print(f"sage run: error: {message}", file=sys.stderr)
    return EXIT_BAD_INPUT


def _run(args):
    from sage_tfx.pipelines.confined import describe, ledger_secrets
    from sage_tfx.pipelines.runner import build_runner, make_iterator
    from sage_tfx.privacy import Ledger, LedgerError

    try:
        secrets = ledger_secrets(args.db, args.key_file)
        definition = describe(args.pipeline, secrets)  # a user's file is loaded in a confined child only
        if args.estimate_only and not args.check:
            raise ValueError("--estimate-only is for --check (the estimates without the dry run)")
        if args.check:
            return _check(definition, args, secrets)
        schedule, beam_args, staging, pipeline_root, metadata_path = _run_options(definition, args)
    except ValueError as exc:
        return _fail(str(exc))
    try:
        ledger = Ledger.open(args.db)
        if not ledger.blocks(args.stream):
            return _fail(f"stream {args.stream!r} has no blocks: ingest data first (sage ingest ...)")
        ledger.claim(args.stream, [args.name or definition.name])  # one process runs a pipeline name at a time
        runner = build_runner(
            definition,
            args.db,
            args.stream,
            args.data_root,
            args.work_dir,
            args.target,
            confidence=args.confidence,
            serving_dir=args.serving_dir,
            runner=args.runner,
            beam_args=beam_args,
            model=args.model,
            name=args.name,
            staging_location=staging,
            pipeline_root=pipeline_root,
            metadata_path=metadata_path,
            spec=args.pipeline,
            secrets=secrets,
        )
        runner.check_stream()  # a misspelled --data-root, an SLA label not in the schema
        runner.check_blocks(ledger)  # a block folder missing or altered: before anything is registered or charged
        if schedule is not None:
            return _run_scheduled(definition, ledger, runner, schedule, args)
        iterator = make_iterator(
            definition, ledger, runner, run_settings(args), progress=lambda line: print(line, flush=True)
        )
        iterator.check_first_window()  # a first window larger than the stream: before the name is registered
    except (LedgerError, ValueError) as exc:
        return _fail(str(exc))
    return _iterate(ledger, iterator, runner)


def _run_options(definition, args):
    """(schedule, beam_args, staging, pipeline_root, metadata_path) of a run (not --check), every option checked
    (ValueError naming it) before the ledger is opened; ``args.target`` becomes the one target."""
    from sage_tfx.pipelines.check import check_targets

    if args.target is None:
        raise ValueError("--target is required (the quality the SLA must certify), unless --check")
    if len(args.target) != 1:
        raise ValueError(
            f"--target {','.join(f'{t:g}' for t in args.target)}: a run certifies one target; "
            "several are for --check (estimates only)"
        )
    args.target = args.target[0]
    check_targets(definition.sla, [args.target], prior_baseline(definition, args), args.allow_trivial_target)
    if not 0 < args.confidence < 1:
        raise ValueError(f"confidence {args.confidence!r} must be in (0, 1)")
    check_run_limits(args)
    schedule = schedule_option(args) if args.schedule is not None else None
    beam_args, staging = beam_options(args)
    pipeline_root, metadata_path = root_options(args)  # a bad or unreachable --pipeline-root: before any charge
    return schedule, beam_args, staging, pipeline_root, metadata_path


def _iterate(ledger, iterator, runner):
    """Run the iterator to its outcome and print it; the exit code. An error after a charge is reported without
    its details (they may hold data values); the ledger is closed either way."""
    from sage_tfx.privacy.errors import IterationInterrupted, RefusedBeforeCharge

    try:
        result = iterator.run()
    except RefusedBeforeCharge as exc:  # a block the iteration would read is missing or altered
        ledger.close()
        return _fail(str(exc))
    except IterationInterrupted as exc:  # an environment error after the charge: resumable, as after a kill
        ledger.close()
        print(
            f"sage run: {exc}. Its grant stays in use (no outcome recorded): fix the cause (free disk space, "
            "restore the folder or block file) and run the same command again; it resumes that iteration "
            "under the same grant, with no new charge",
            file=sys.stderr,
        )
        return EXIT_FAILED
    except Exception as exc:  # a run failed after its charge: its message may hold data values
        from sage_tfx.privacy import public_error_text

        ledger.close()
        print(
            f"sage run: an iteration failed after its charge: {public_error_text(exc)}. Its grant stays spent "
            "(the ledger records FAILED) and a new run resumes after it. The details are withheld: they may hold "
            "data values; reproduce the failure for free on generated rows with `sage run PIPELINE --check "
            "--db ... --stream ... --data-root ...`",
            file=sys.stderr,
        )
        return EXIT_FAILED
    ledger.close()
    pushed = (
        f"; model pushed to {pushed_model_path(runner.config.serving_dir)}" if result.outcome == Outcome.ACCEPT else ""
    )
    print(f"{iterator.pipeline}: {result.describe()}{pushed}", flush=True)
    return EXIT_CODES[result.outcome]


def pushed_model_path(serving_dir: str) -> str:
    """The SavedModel folder TFX's Pusher wrote under ``serving_dir`` (its newest version, ``SERVING_DIR/VERSION``:
    what ``tf.saved_model.load`` takes), or ``serving_dir`` itself when it holds no version folder (a URL)."""
    from sage_tfx.pipelines import pushed_models

    models = pushed_models(str(serving_dir))
    return models[-1] if models else str(serving_dir)


def check_run_limits(args):
    """Refuse bad --name, --max-seconds and --max-iterations (ValueError naming the value) before anything is
    opened, registered or charged."""

    from sage_tfx.privacy.checks import check_name

    if args.name is not None:
        check_name(args.name, "--name")
    if args.max_seconds is not None and not (math.isfinite(args.max_seconds) and args.max_seconds > 0):
        raise ValueError(
            f"--max-seconds {args.max_seconds!r} is invalid: give a number of seconds > 0 "
            "(or leave it out for no time limit)"
        )
    if args.max_iterations is not None and args.max_iterations < 1:
        raise ValueError(f"--max-iterations {args.max_iterations!r} is invalid: give an integer >= 1")


def prior_baseline(definition, args):
    """What a constant predictor reaches under the user's public prior (--positive-rate / --label-std), or None."""
    from sage_tfx.pipelines.check import trivial_baseline

    return trivial_baseline(definition.sla, positive_rate=args.positive_rate, label_std=args.label_std)


def _check(definition, args, secrets=()):
    from sage_tfx.pipelines.check import dry_run
    from sage_tfx.privacy import Ledger, LedgerError

    if args.expected_loss is not None and args.target is None:
        raise ValueError("--expected-loss needs --target (the estimate is of the rows to ACCEPT at that target)")
    overrides = {
        "epsilon_start": args.epsilon_start,
        "min_window": args.min_window,
        "rejection_share": args.rejection_share,
    }
    baseline = prior_baseline(definition, args)
    check_run_limits(args)  # a bad --name (it names the kept model's folder), before anything
    name = args.name or definition.name
    try:  # the real ledger, read only (never written): the attempts its budget allows now
        ledger = Ledger.open(args.db, check_head=False)
    except (LedgerError, OSError) as exc:
        print(f"[check] attempts not planned: the ledger {args.db} cannot be read ({exc})", flush=True)
        ledger = None
    try:
        result = dry_run(
            definition,
            args.data_root,
            args.stream,
            model=args.model,
            runner=args.runner,
            beam_args=list(getattr(args, "extra_args", [])),
            progress=lambda line: print(line, flush=True),
            targets=args.target or (),
            expected=args.expected_loss,
            confidence=args.confidence,
            overrides={k: v for k, v in overrides.items() if v is not None},
            ledger=ledger,
            pipeline_name=name,
            baseline=baseline,
            allow_trivial=args.allow_trivial_target,
            keep_dir=os.path.join(args.work_dir, "check", name, "model"),
            max_iterations=args.max_iterations,
            estimate_only=args.estimate_only,
            spec=args.pipeline,
            secrets=secrets,
        )
    finally:
        if ledger is not None:
            ledger.close()
    if args.estimate_only:
        print(f"check: estimates only (no dry run); nothing was charged on {args.db}", flush=True)
        return EXIT_OK
    if not result.ok:
        print(
            f"sage run --check: {definition.name} FAILED on generated rows, before any charge:\n{result.error}",
            file=sys.stderr,
        )
        return EXIT_BAD_INPUT
    print(
        f"check OK: {definition.name} ran end to end on {result.rows:,} GENERATED rows (outcome {result.outcome}, "
        f"meaningless on noise); nothing was charged on {args.db}",
        flush=True,
    )
    return EXIT_OK


def run_settings(args):
    """The ``RunSettings`` of a parsed `sage run`/`sage serve` command line (checked by ``check_run_limits``
    first where the command has them)."""
    from sage_tfx.pipelines.runner import RunSettings

    return RunSettings(
        max_iterations=args.max_iterations,
        max_seconds=getattr(args, "max_seconds", None),
        epsilon_start=getattr(args, "epsilon_start", None),
        min_window=getattr(args, "min_window", None),
        rejection_share=getattr(args, "rejection_share", None),
    )
