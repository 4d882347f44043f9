"""`sage serve`: the multi-pipeline platform on one stream.

Several pipelines wait on one stream; a replay of a historical data set adds its blocks step by step, and each new
block's budget is split evenly among the pipelines waiting at that moment. Each pipeline runs its privacy-adaptive
iterator (one TFX run per iteration) in its own worker process, so the pipelines progress at once (--parallel bounds
how many TFX runs go at once). A live status line is printed per event; it ends when every pipeline is done or the
stream ends.

A worker that dies (killed, or an error outside an iteration) is reported with its pipeline's name and exit status
and started again: it resumes its unfinished iteration under the grant already charged (no new charge). After
--max-restarts restarts the pipeline is reported FAILED; the others go on.

A pipeline name is served by one process at a time: a name another `sage serve` or `sage run` is running (on this
host, or on any host sharing a PostgreSQL ledger) is refused (exit 2) before anything is registered. Several hosts
on one stream: give each its own pipeline names and work dir (docs/scale_out.md, "Several hosts on one PostgreSQL
ledger").

Beam: --runner, --staging-location, --pipeline-root (a URL the Beam workers can read; MLMD stays local, per
pipeline: --metadata-path with {name}) and the Beam pipeline options after a bare -- are `sage run`'s (the same
code, sage_tfx/cli/run.py ``beam_options``) and reach every worker's TFX runs, e.g. `sage serve ... --staging-location
gs://bucket/staging -- --runner=PortableRunner --job_endpoint=HOST:PORT --environment_type=EXTERNAL
--environment_config=HOST:POOL_PORT` for Beam workers that do not see --data-root (docs/scale_out.md).

Release strategies (docs/release_strategies.md, "From sage serve / sage run"): --release NAME=STRATEGY:FILE,
repeatable, runs `sage release STRATEGY` (continual, incremental-regression, growth, pmwg) as a participant named
NAME, in its own worker beside the pipelines: FILE is a JSON object holding that command's options (without --db,
--stream, --data-root and --pipeline, which serve gives; NAME is the ledger's pipeline name), e.g. {"label": "tips",
"features": ["fare", "trip_miles"], "scales": [100, 30], "intercept": true, "loss": "logistic", "positive_above": 2,
"epsilon": 0.3, "delta": 1e-7, "rows_per_block": 100}. Every file is checked by `sage release`'s own parser and
checks before anything is registered (a bad value exits 2 naming it). After each replay step the strategy charges
every new block its whole bound in ONE grant, before reading it, and releases (the `sage release` code, not a copy);
a killed strategy worker is restarted and resumes under its grants with no second charge. Like a pipeline it is
registered, so it gets an even share of every block that arrives (its bound must fit in that share, or the block is
refused and the strategy FAILS: it cannot skip a block), and it stays registered afterwards: a later `sage serve
--release` or `sage release --pipeline NAME` resumes it. Its name is claimed like a pipeline's. --pipeline is
optional when a --release is given.

Growth schedules (docs/release_strategies.md, "A TFX pipeline under a growth schedule"): --schedule
NAME=bbscheduler:FILE or NAME=bbimprover:FILE, at most one per --pipeline NAME, runs that pipeline under a
BBScheduler or BBImprover instead of the Sage iterator, through `sage run --schedule`'s code (``ScheduledPipeline``),
in its own worker: after each replay step it charges each new block the schedule's lifetime (epsilon, delta) in one
grant, before anything reads it, and runs the pipeline when the schedule says (a run grant drawn from the lifetime
grants of every block so far; --max-iterations bounds the runs). FILE is `sage run --schedule`'s JSON object and is
refused as that command refuses it. A killed worker restarts and resumes from the ledger: no block charged twice, no
run drawn twice, a run with an outcome not re-run. The lifetime must fit in the pipeline's share of every block (or
the block is refused and the pipeline FAILS). The other pipelines of the same serve keep the Sage iterator.

Exit codes: 0 every pipeline reached an outcome, every strategy released every block and the audit passed; 1 a
pipeline or strategy failed or the audit did not pass; 2 bad input, or a name another process runs.

Example:
  sage serve --db ledger.db --stream taxi --data-root data --input trips.csv \\
      --time-column trip_start_timestamp --window 1d --initial-blocks 256 --blocks-per-step 64 \\
      --pipeline fast=taxi_regression:600000 --pipeline tight=taxi_regression:300000
  sage serve --db ledger.db --stream taxi --data-root data --input trips.csv \\
      --time-column trip_start_timestamp --window 1d --release tips=continual:tips_release.json
  sage serve --db ledger.db --stream taxi --data-root data --input trips.csv \\
      --time-column trip_start_timestamp --window 1d --pipeline grow=taxi_regression:300000 \\
      --schedule grow=bbscheduler:schedule.json
"""

import argparse
import os
import sys
from dataclasses import dataclass

from ._exits import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK
from ._keys import add_key_file, ledger_location


@dataclass
class ScheduleSpec:
    """A --pipeline run under a growth schedule (--schedule NAME=bbscheduler:FILE or NAME=bbimprover:FILE): the
    pipeline's ``WorkerSpec`` (``worker``) and its checked schedule; ``schedule_worker_main`` runs it (picklable)."""

    name: str
    worker: object
    schedule: object

    def entry(self):
        """The function this participant's worker process runs."""
        return schedule_worker_main


def _pipeline_arg(text):
    try:
        name, rest = text.split("=", 1)
        parts = rest.split(":")
        pipeline, target = parts[0], float(parts[1])
        model = parts[2] if len(parts) > 2 else None
    except (ValueError, IndexError):
        raise argparse.ArgumentTypeError(f"--pipeline {text!r} must look like NAME=PIPELINE:TARGET[:MODEL]") from None
    return name, pipeline, target, model


def _release_arg(text):
    try:
        name, rest = text.split("=", 1)
        strategy, path = rest.split(":", 1)
        if not (name and strategy and path):
            raise ValueError
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--release {text!r} must look like NAME=STRATEGY:FILE (STRATEGY one of "
            "continual, incremental-regression, growth, pmwg; FILE a JSON object of "
            "its `sage release STRATEGY` options)"
        ) from None
    return name, strategy, path


def _schedule_arg(text):
    name, sep, value = text.partition("=")
    if not (sep and name and value):
        raise argparse.ArgumentTypeError(
            f"--schedule {text!r} must look like NAME=bbscheduler:FILE or "
            "NAME=bbimprover:FILE (NAME a --pipeline name; FILE a JSON object of the "
            "schedule's options, as `sage run --schedule`)"
        )
    return name, value


def add_parser(subparsers):
    from sage_tfx.cli.run import add_beam_options, add_rejection_share

    p = subparsers.add_parser(
        "serve",
        help="serve several pipelines on one replayed stream",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--db", required=True, type=ledger_location, help="ledger (the stream must exist: sage ledger init)")
    add_key_file(p)
    p.add_argument("--stream", required=True)
    p.add_argument("--data-root", required=True)
    p.add_argument("--input", required=True, help="historical data to replay (CSV, TFRecord or Parquet)")
    p.add_argument("--time-column", required=True)
    p.add_argument("--window", default="1d", help="block window, e.g. 1h or 1d")
    p.add_argument("--initial-blocks", type=int, default=0, help="blocks added before the pipelines start")
    p.add_argument("--blocks-per-step", type=int, default=1, help="blocks added per replay step")
    p.add_argument(
        "--step-seconds",
        type=float,
        default=0.0,
        help="real-time pacing of replay steps (0: a simulated clock that advances when all wait)",
    )
    p.add_argument(
        "--pipeline",
        action="append",
        type=_pipeline_arg,
        default=[],
        dest="pipelines",
        help="NAME=PIPELINE:TARGET[:MODEL], repeatable (at least one --pipeline or --release)",
    )
    p.add_argument(
        "--release",
        action="append",
        type=_release_arg,
        default=[],
        dest="releases",
        metavar="NAME=STRATEGY:FILE",
        help="a release strategy as a participant NAME: `sage release STRATEGY` (continual, "
        "incremental-regression, growth, pmwg) with the options of the JSON object in FILE, "
        "releasing for every new block after each replay step; repeatable (see above)",
    )
    p.add_argument(
        "--schedule",
        action="append",
        type=_schedule_arg,
        default=[],
        dest="schedules",
        metavar="NAME={bbscheduler,bbimprover}:FILE",
        help="run --pipeline NAME under a growth schedule (BBScheduler or BBImprover) instead of the Sage "
        "iterator, as `sage run --schedule STRATEGY:FILE` does; repeatable, one per pipeline (see "
        "above)",
    )
    p.add_argument("--confidence", type=float, default=0.95)
    p.add_argument("--max-iterations", type=int, default=10)
    add_rejection_share(p)
    add_beam_options(p)  # --runner, --staging-location; Beam pipeline options after a bare --, as for `sage run`
    p.add_argument("--work-dir", default="sage_work")
    p.add_argument(
        "--parallel",
        type=int,
        default=0,
        metavar="N",
        help="at most N TFX runs at once (default 0: every pipeline at once; 1: one at a time). Each "
        "pipeline has its own worker process either way",
    )
    p.add_argument(
        "--max-restarts",
        type=int,
        default=3,
        metavar="N",
        help="restarts of a pipeline's worker that died before the pipeline is reported FAILED (default 3)",
    )
    p.set_defaults(func=_run)


def worker_specs(args, beam_args=(), staging_location=None, key_file=None, roots=(None, None), schedules=None):
    """One ``WorkerSpec`` (in a ``ScheduleSpec`` for a --schedule'd name) per --pipeline of a parsed `sage serve`
    command line, carrying the Beam options (``beam_options``: the args after a bare --, --temp_location from
    --staging-location) and BlockExampleGen's staging location to each worker's TFX runs, as `sage run` passes them
    to its own; ``roots`` is the checked ``(pipeline_root, metadata_path)`` of ``root_options``; ``schedules`` those
    of ``schedule_options`` (None: read them from ``args``)."""
    from sage_tfx.pipelines.workers import WorkerSpec

    if schedules is None:
        schedules = schedule_options(args) if getattr(args, "schedules", None) else {}
    specs = [
        WorkerSpec(
            name,
            pipeline,
            target,
            model,
            args.db,
            args.stream,
            args.data_root,
            args.work_dir,
            confidence=args.confidence,
            runner=args.runner,
            max_iterations=args.max_iterations,
            rejection_share=args.rejection_share,
            key_file=key_file,
            beam_args=list(beam_args),
            staging_location=staging_location,
            pipeline_root=roots[0],
            metadata_path=roots[1],
        )
        for name, pipeline, target, model in args.pipelines
    ]
    return [ScheduleSpec(s.name, s, schedules[s.name]) if s.name in schedules else s for s in specs]


def schedule_options(args: argparse.Namespace) -> dict:
    """{pipeline name: its schedule} of the --schedule NAME=STRATEGY:FILE values, each FILE read and checked
    by `sage run --schedule`'s own code (``schedule_option``). ValueError naming the bad value: NAME not a
    --pipeline (a --release name included), a second schedule for a name, a FILE `sage run` refuses."""
    from sage_tfx.cli.run import schedule_option
    from sage_tfx.release.growth import GrowthError

    pipelines = [name for name, *_ in args.pipelines]
    releases = [name for name, *_ in args.releases]
    schedules = {}
    for name, value in args.schedules:
        source = f"--schedule {name}={value}"
        if name in releases:
            raise ValueError(
                f"{source}: {name!r} is a --release strategy, which runs its own `sage release` "
                "schedule: give a --pipeline name (or use --release NAME=growth:FILE)"
            )
        if name not in pipelines:
            raise ValueError(f"{source}: no --pipeline is named {name!r}: give one of {pipelines}")
        if name in schedules:
            raise ValueError(f"{source}: pipeline {name!r} has a schedule already: give one --schedule per pipeline")
        try:
            schedules[name] = schedule_option(argparse.Namespace(schedule=value, epsilon_start=None, min_window=None))
        except (GrowthError, ValueError) as exc:
            raise ValueError(f"pipeline {name!r}: {exc}") from None
    return schedules


def schedule_worker_main(spec: ScheduleSpec, conn) -> None:
    """A --schedule'd pipeline's worker process: ``ScheduledPipeline.for_runner`` (`sage run --schedule`'s driver)
    advanced after every replay step until the stream ends or --max-iterations runs were made; each run waits for a
    TFX slot (--parallel) as the Sage iterator's do. Restarted after a death, the driver resumes from the ledger
    (no second charge or draw). Module level (spawn)."""
    from sage_tfx.adaptive.workers import BlockWaiter, WorkerResult, die
    from sage_tfx.pipelines.workers import build_worker_runner
    from sage_tfx.privacy import Ledger, public_error_text
    from sage_tfx.privacy.keys import ENV_KEY_FILE
    from sage_tfx.release.scheduled_pipeline import RunFailed, ScheduledPipeline, describe

    worker = spec.worker
    if worker.key_file:
        os.environ[ENV_KEY_FILE] = worker.key_file
    waiter = BlockWaiter(conn)

    def say(line):
        conn.send(("progress", line))

    try:
        say(f"[{spec.name}] runs under its growth schedule ({describe(spec.schedule)})")
        definition, runner = build_worker_runner(worker)

        def run_in_slot(grant, split, eta, iteration):
            conn.send(("acquire", None))
            conn.recv()  # ("slot",): at most --parallel TFX runs at once
            try:
                return runner.run_iteration(grant, split, eta, iteration)
            finally:
                conn.send(("release", None))

        made, resumed = set(), set()
        with Ledger.open(worker.ledger) as ledger:
            driver = ScheduledPipeline.for_runner(
                ledger,
                definition,
                runner,
                spec.schedule,
                rejection_share=worker.rejection_share,
                progress=say,
                run_iteration=run_in_slot,
            )
            while True:  # --max-iterations bounds the runs made or resumed (a restarted worker makes no more)
                for run in driver.advance(max_runs=max(0, worker.max_iterations - len(made | resumed))):
                    (resumed if run.resumed else made).add(run.grant_id)
                if len(made | resumed) >= worker.max_iterations or not waiter.wait(3600.0):
                    break
            charged = len(driver.order)
    except RunFailed as exc:  # FAILED recorded on its run grant: the pipeline's outcome, not a death
        conn.send(("failed", f"a scheduled {exc}; its run grant stays drawn"))
        conn.close()
        return
    except Exception as exc:
        die(conn, spec.name, public_error_text(exc))
    conn.send(
        (
            "done",
            WorkerResult(
                "SCHEDULED",
                len(made | resumed),
                f"{spec.schedule.meta['strategy']}: {len(made)} scheduled run(s) made, {len(resumed - made)} "
                f"resumed; {charged} block(s) charged their lifetime (epsilon "
                f"{spec.schedule.params.epsilon:g}, delta {spec.schedule.params.delta:g})",
            ),
        )
    )
    conn.close()


def release_specs(args: argparse.Namespace, key_file: str | None = None) -> list:
    """One ``ReleaseSpec`` per --release: its FILE read and turned into the `sage release STRATEGY` command line
    (``release_argv``, checked by that command's parser) and into its settings. ValueError
    naming the bad value."""
    from sage_tfx.cli.release import release_argv, release_settings
    from sage_tfx.cli.run import read_json_options
    from sage_tfx.release.worker import ReleaseSpec

    specs = []
    for name, strategy, path in args.releases:
        source = f"--release {name}={strategy}:{path}"
        options = read_json_options(path, source, f"`sage release {strategy}` options")
        argv, error = release_argv(
            strategy, options, db=args.db, stream=args.stream, data_root=args.data_root, pipeline=name, source=source
        )
        if argv is None:
            raise ValueError(error)
        specs.append(ReleaseSpec(name, strategy, release_settings(argv, source), key_file=key_file, source=source))
    return specs


def _run(args):
    from sage_tfx.adaptive.platform import register_unfinished
    from sage_tfx.adaptive.workers import ProcessPlatform
    from sage_tfx.privacy import LedgerError

    try:
        ledger, replay, names, releases, specs = _prepare(args)
    except (LedgerError, ValueError) as exc:
        print(f"sage serve: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT

    register_unfinished(ledger, args.stream, names)  # waiting before the first block arrives: a share of each
    if args.initial_blocks:
        steps = replay.run(steps=args.initial_blocks)
        print(f"[replay] {len(steps)} initial block(s) up to {steps[-1].block if steps else '-'}", flush=True)
    platform = ProcessPlatform(
        args.db,
        args.stream,
        specs + releases,
        _replay_steps(args, replay),
        step_seconds=args.step_seconds,
        progress=lambda line: print(line, flush=True),
        parallel=args.parallel,
        max_restarts=args.max_restarts,
    )
    results = platform.run()
    return _report(ledger, args.stream, names, platform, results)


def _check_args(args) -> None:
    """ValueError for options that do not fit together, before anything is opened."""
    if args.blocks_per_step < 1 or args.initial_blocks < 0:
        raise ValueError("--blocks-per-step must be >= 1 and --initial-blocks >= 0")
    if args.parallel < 0 or args.max_restarts < 0:
        raise ValueError("--parallel and --max-restarts must be >= 0")
    if not args.pipelines and not args.releases:
        raise ValueError("give at least one --pipeline NAME=PIPELINE:TARGET or --release NAME=STRATEGY:FILE")
    names = [name for name, *_ in args.pipelines] + [name for name, *_ in args.releases]
    if len(set(names)) != len(names):
        raise ValueError(f"pipeline and release names must be unique: {names}")


def _prepare(args) -> tuple:
    """Check every option, open the ledger, claim the names and build every worker's spec, before any budget is
    spent: ``(ledger, replay, names, release specs, worker specs)``; LedgerError / ValueError otherwise."""
    from sage_tfx.cli.run import beam_options, root_options
    from sage_tfx.ingest.replay import Replay
    from sage_tfx.privacy import Ledger
    from sage_tfx.privacy.keys import ENV_KEY_FILE
    from sage_tfx.release.worker import check_release

    _check_args(args)
    names = [name for name, *_ in args.pipelines] + [name for name, *_ in args.releases]
    beam_args, staging = beam_options(args)  # ValueError before anything is opened
    schedules = schedule_options(args)  # likewise: a --schedule naming no --pipeline, a FILE sage run refuses
    # a bad or unreachable --pipeline-root, a shared --metadata-path (the TFX pipelines' only)
    roots = root_options(args, [name for name, *_ in args.pipelines])
    key_file = os.environ.get(ENV_KEY_FILE)  # --key-file, exported by the CLI; the workers get the path
    ledger = Ledger.open(args.db)
    ledger.stream(args.stream)
    # This process runs these names until it exits; another serve or run (here or on another host sharing
    # the ledger) holding one of them is refused before anything is registered or charged.
    ledger.claim(args.stream, names)
    replay = Replay.from_file(ledger, args.stream, args.data_root, args.input, args.time_column, args.window)
    releases = release_specs(args, key_file=key_file)
    schema = _stream_schema(args, replay)
    for spec in releases:
        spec.schema = schema
        check_release(spec, schema)
    specs = worker_specs(args, beam_args, staging, key_file=key_file, roots=roots, schedules=schedules)
    _check_workers(args, ledger, specs, schema)
    return ledger, replay, names, releases, specs


def _check_workers(args, ledger, specs: list, schema) -> None:
    """Validate each pipeline and its iterator (or schedule driver) settings now, before any budget is spent (the
    worker builds its own, from the same spec), and the registered blocks under --data-root."""
    from sage_tfx.cli.run import run_settings
    from sage_tfx.pipelines.runner import make_iterator
    from sage_tfx.pipelines.workers import build_worker_runner
    from sage_tfx.release.scheduled_pipeline import ScheduledPipeline

    for spec in specs:
        if isinstance(spec, ScheduleSpec):
            definition, runner = build_worker_runner(spec.worker)
            ScheduledPipeline.for_runner(
                ledger, definition, runner, spec.schedule, rejection_share=args.rejection_share
            )
        else:
            definition, runner = build_worker_runner(spec)
            make_iterator(definition, ledger, runner, run_settings(args))
        runner.check_stream(schema)  # its SLA label a column of the stream
    if specs:
        runner.check_blocks(ledger)  # a registered block missing or altered under --data-root


def _replay_steps(args, replay):
    """The platform's step: ``--blocks-per-step`` blocks of the replay at a time."""

    def replay_step():
        """The blocks this step added; [] if another replay of the stream (another host) had added them all;
        None once the input is exhausted."""
        added, steps = [], 0
        for _ in range(args.blocks_per_step):
            step = replay.step()
            if step is None:
                break
            steps += 1
            if step.added:
                added.append(step.block)
        if steps and len(added) < steps:
            print(
                f"[replay] {steps - len(added)} of this step's {steps} block(s) were already registered by "
                "another replay of the stream",
                flush=True,
            )
        return added if steps else None

    return replay_step


def _report(ledger, stream: str, names: list, platform, results: dict) -> int:
    """Print each name's result, the stream's status and the audit; the exit code."""
    from sage_tfx.privacy.report import status_table

    print("")
    for name in names:
        if name in platform.errors:
            print(f"{name}: FAILED ({platform.errors[name]})")
        elif name not in results:
            print(f"{name}: no result")
        elif r := results[name]:
            if r.outcome in ("RELEASED", "SCHEDULED"):  # a --release strategy; a --schedule'd pipeline
                print(f"{name}: {r.outcome} {r.description}")
            else:
                print(f"{name}: {r.outcome} after {r.iterations} iteration(s)")
    print("")
    print(status_table(ledger.status(stream)).split("\n\n")[0])
    report = ledger.audit()
    print(f"audit: {'OK' if report.ok else 'FAILED'}")
    return EXIT_OK if report.ok and not platform.errors and set(results) == set(names) else EXIT_FAILED


def _stream_schema(args, replay):
    """The stream's schema: its data root's, else (nothing replayed there yet) the replay's."""
    from sage_tfx.ingest.layout import stream_config

    config = stream_config(args.data_root, args.stream)
    return dict(config["schema"]) if config is not None else dict(replay.schema)
