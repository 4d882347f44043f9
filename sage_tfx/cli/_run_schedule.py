"""`sage run --schedule bbscheduler:FILE | bbimprover:FILE`: the pipeline re-run under a growth schedule (the
option read and checked, then ``ScheduledPipeline.advance``); the contract is `sage run --help` and
docs/release_strategies.md ("A TFX pipeline under a growth schedule").
"""

import json
import sys

from ._exits import EXIT_FAILED, EXIT_OK


def schedule_option(args):
    """The schedule of ``--schedule bbscheduler:FILE`` or ``bbimprover:FILE`` (the FILE's JSON options), refused with
    ValueError naming the bad value before anything is opened or charged; --epsilon-start and --min-window have no
    meaning under it."""
    from sage_tfx.release.scheduled_pipeline import STRATEGIES, scheduler_from_options

    strategy, sep, path = args.schedule.partition(":")
    if not sep or strategy not in STRATEGIES or not path:
        raise ValueError(
            f"--schedule {args.schedule!r} must look like bbscheduler:FILE (FILE: a JSON object of "
            "its options epsilon, delta, gamma, t0, composition) or bbimprover:FILE (epsilon, delta, a, "
            "t0)"
        )
    for flag, value in (("--epsilon-start", args.epsilon_start), ("--min-window", args.min_window)):
        if value is not None:
            raise ValueError(
                f"{flag} {value!r} has no meaning under --schedule: the schedule sets each run's epsilon "
                "and window (all blocks so far); leave it out"
            )
    source = f"--schedule {args.schedule}"
    options = read_json_options(path, source, f"{strategy} options")
    return scheduler_from_options(options, source, strategy)


def read_json_options(path, source, what):
    """The JSON object of an options FILE (``sage run --schedule``, ``sage serve --release``); ValueError naming
    ``source`` (the command-line value) when it cannot be read or is not JSON."""

    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except OSError as exc:
        raise ValueError(f"{source}: the file cannot be read ({exc.strerror}): give a JSON file of {what}") from None
    except ValueError as exc:
        raise ValueError(f"{source}: the file is not JSON ({exc}): give one JSON object of {what}") from None


def _run_scheduled(definition, ledger, runner, schedule, args):
    """`sage run --schedule`: ``ScheduledPipeline.advance`` over the stream's blocks; one progress line per charge
    and per run. Exit 0 when the runs ended, 1 if one failed after its draw (details withheld, as `sage run`)."""
    from sage_tfx.privacy.errors import IterationInterrupted
    from sage_tfx.release.scheduled_pipeline import RunFailed, ScheduledPipeline

    driver = ScheduledPipeline.for_runner(
        ledger,
        definition,
        runner,
        schedule,
        rejection_share=args.rejection_share,
        progress=lambda line: print(line, flush=True),
    )
    try:
        runs = driver.advance(max_runs=args.max_iterations)
    except IterationInterrupted as exc:  # an environment error after the draw: resumable, as after a kill
        ledger.close()
        print(
            f"sage run: a scheduled {exc}. No outcome is recorded: fix the cause and run the same command "
            "again; it re-runs under the same run grant, with no new charge or draw",
            file=sys.stderr,
        )
        return EXIT_FAILED
    except RunFailed as exc:  # its message holds the public part of the error only
        ledger.close()
        print(
            f"sage run: a scheduled {exc}. Its run grant stays "
            "drawn (the ledger records FAILED). The details are withheld: they may hold data values; reproduce "
            "the failure for free on generated rows with `sage run PIPELINE --check ...`",
            file=sys.stderr,
        )
        return EXIT_FAILED
    ledger.close()
    made = [r for r in runs if not r.resumed]
    print(
        f"{runner.config.name}: {len(made)} scheduled run(s) made, {len(runs) - len(made)} resumed; "
        f"{len(driver.order)} block(s) charged their lifetime (epsilon {schedule.params.epsilon:g}, delta "
        f"{schedule.params.delta:g}) under {schedule.meta['strategy']}",
        flush=True,
    )
    return EXIT_OK
