"""`sage release ...`: the stream release strategies from the command line (docs/release_strategies.md).

  sage release continual --db LEDGER --stream S --data-root DIR --pipeline NAME --label COL --features C1,C2
      --loss logistic|squared --epsilon E --delta D --rows-per-block M [--window W] [--push-dir DIR
      [--serving-dir DIR2]]
      [--sla-target LOSS --sla-epsilon E2 [--sla-confidence C] [--sla-loss-bound B]] [--json]
  sage release incremental-regression ... the same feature options ... --horizon T [--bound-x BX --bound-y BY]
  sage release growth --db LEDGER --stream S --data-root DIR --pipeline NAME --column COL --bound B
      --rows-per-block M --epsilon E [--delta D [--composition zcdp|basic]] [--schedule scheduler|improver]
      [--gamma G] [--a A] [--t0 T0]
  sage release pmwg --db LEDGER --stream S --data-root DIR --pipeline NAME --bins COL=LO:HI:K,...
      --queries FILE --rows-per-block M --epsilon E [--delta D] [--hard-budget K] [--threshold T] [--eta ETA]
      [--growth-exponent P]

Each command releases one model for every block of the stream this pipeline has not yet observed, in the
ledger's block order, through ``sage_tfx.release.continual`` (ContinualRelease / SlidingWindowRelease),
``sage_tfx.release.incremental_regression`` (IncrementalRegression) or ``sage_tfx.release.growth``
(ScheduledRelease under BBScheduler / BBImprover: a DP mean of a column re-run when the schedule says, with the
schedule's epsilon; PMWG: the declared linear queries of --queries answered as blocks arrive): each new block is
charged its whole
per-record bound in ONE grant (meta naming the strategy and its parameters) BEFORE it is read through
``sage_tfx.ingest.access.grant_blocks``.

Restart: nothing is kept outside the ledger. The state is re-derived from the ledger's grants of this
pipeline on this stream: the blocks already granted are REPLAYED under their existing grants (no new charge;
each grant's release is re-opened with the same computation fingerprint, which the ledger allows; the noise
is keyed by the grant's private seed, so the replayed models are the models released before), then every
block without a grant is charged and released. A run with parameters other than those signed into the
pipeline's grants is refused (exit 2) before anything is charged: a second strategy instance on the same
blocks would be a second charge the analysis did not count -- use another --pipeline.

Features: the named numeric columns of the stream's schema, each divided by its public --scales divisor
(default 1); a missing or non-finite value becomes 0 (a public default, never an error naming a record); then
clipped as the strategy declares (continual: ||x|| <= 1, logistic labels {-1, +1} by value > --positive-above,
squared labels / --label-scale clipped to [-1, 1]; incremental regression: ||x|| <= --bound-x, |y| <= --bound-y).

From `sage serve` (docs/release_strategies.md, "From sage serve / sage run"): ``sage serve ... --release
NAME=STRATEGY:FILE`` runs one of these commands as a serve participant in its own worker, FILE a JSON object of
its options (``release_argv``: {"column": "fare", "bound": 100, "rows_per_block": 100, "epsilon": 0.3} for
``growth``), checked by this parser and ``open_release`` before serve registers anything; after every replay step
the worker calls ``ReleaseSession.advance`` -- the code this command runs once. This command, too, claims
--pipeline for its run (``Ledger.claim``): a name a running `sage serve` or `sage run` holds is refused (exit 2).

This module is the command line only: it builds the strategy's settings (``sage_tfx.release.settings``) and runs
``sage_tfx.release.session.open_release``; the session's status maps to the exit code.

Exit codes (sage_tfx.cli._exits): 0 success; 1 a release failed after its charge; 2 bad input (nothing
charged); 3 the budget refused a block's charge (that block and later ones are not released; earlier ones are).
"""

import argparse
import dataclasses
import json
import sys

from sage_tfx.privacy.vocabulary import Composition
from sage_tfx.release.settings import (
    SETTINGS,
    ContinualSettings,
    GrowthSettings,
    IncrementalSettings,
    PMWGSettings,
    ReleaseInputError,
    ReleaseSettings,
)

from ._exits import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK, EXIT_REFUSED
from ._keys import add_key_file, ledger_location


class _BadInput(Exception):
    """A bad command-line value, found before anything was charged (exit 2)."""


def add_parser(subparsers):
    parser = subparsers.add_parser(
        "release",
        help="continual / sliding-window / incremental-regression release of a model at every block of a stream",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="strategy", metavar="STRATEGY")
    sub.required = True
    cont = sub.add_parser(
        "continual",
        help="a regularised ERM model (logistic / least squares / softmax) at every block, "
        "all history or a sliding window (Watson et al.)",
        description="Continual (all history) or, with --window, sliding-window release of a "
        "regularised ERM model at every new block; each block is charged its whole "
        "per-record bound (--epsilon, --delta) once, before it is read.",
    )
    _common(cont)
    cont.add_argument(
        "--loss",
        choices=("logistic", "squared", "softmax"),
        help="the ERM loss (default %(default)s); softmax: multiclass, needs --classes",
    )
    cont.add_argument(
        "--classes",
        type=int,
        metavar="K",
        help="softmax: the number of classes K >= 2 (the label / --label-scale rounded to a class 0..K-1)",
    )
    cont.add_argument(
        "--sampling",
        choices=("none", "poisson"),
        help="poisson: each release on 2^j blocks reads a Poisson sample of its records with the noise of its "
        "full size (amplification by sampling; the same per-record bound) (default %(default)s)",
    )
    cont.add_argument(
        "--rows-per-block",
        type=int,
        required=True,
        metavar="M",
        help="the DECLARED records per block m0 that normalises the objective (public; the "
        "sensitivity is 1/(lam * blocks * M), whatever the data holds)",
    )
    cont.add_argument(
        "--window",
        type=int,
        metavar="W",
        help="sliding window in blocks (default: all history, the cumulative release)",
    )
    cont.add_argument("--lam", type=float, help="ridge weight lam (default %(default)s)")
    cont.add_argument("--radius", type=float, help="parameter-ball radius R (default %(default)s)")
    cont.add_argument(
        "--positive-above",
        type=float,
        metavar="VALUE",
        help="logistic: a label is +1 iff its value > VALUE (default %(default)s), else -1",
    )
    cont.add_argument(
        "--push-dir",
        metavar="DIR",
        help="write every model as a TFX Model artifact DIR/model-<t>/Format-Serving/ and its "
        "ModelBlessing DIR/blessing-<t>/ (BLESSED iff its SLA check ACCEPTed or none is set; "
        "what a TFX Pusher reads)",
    )
    cont.add_argument(
        "--serving-dir",
        metavar="DIR",
        help="push the BLESSED models to DIR/<t>/ as TFX's Pusher does (needs --push-dir)",
    )
    cont.add_argument(
        "--sla-target",
        type=float,
        metavar="LOSS",
        help="SLA: ACCEPT a model iff its expected (clipped) loss is <= LOSS (DPLossValidator), "
        "checked on the newest block's test part; needs --sla-epsilon",
    )
    cont.add_argument(
        "--sla-epsilon",
        type=float,
        metavar="E",
        help="the SLA check's epsilon (<= --epsilon: a parallel train/test split of each block)",
    )
    cont.add_argument("--sla-confidence", type=float, help="SLA confidence 1 - eta (default %(default)s)")
    cont.add_argument(
        "--sla-loss-bound",
        type=float,
        metavar="B",
        help="losses are clipped to [0, B] for the SLA check (default %(default)s)",
    )
    cont.set_defaults(func=_run, **_defaults(ContinualSettings))

    inc = sub.add_parser(
        "incremental-regression",
        help="a least-squares regressor at every block by the Tree "
        "Mechanism over a declared horizon (Kasiviswanathan et al.)",
        description="PrivIncReg1: a linear regressor released at every new block, up to "
        "--horizon blocks; each block is charged the whole-horizon bound "
        "(--epsilon, --delta) once, before it is read.",
    )
    _common(inc)
    inc.add_argument(
        "--horizon",
        type=int,
        required=True,
        metavar="T",
        help="the blocks this pipeline will ever take (the charge covers T; more blocks need a new --pipeline)",
    )
    inc.add_argument("--bound-x", type=float, help="feature clipping ||x|| <= BX (default %(default)s)")
    inc.add_argument("--bound-y", type=float, help="label clipping |y| <= BY (default %(default)s)")
    inc.add_argument("--radius", type=float, help="the regressor's L2 ball R (default %(default)s)")
    inc.add_argument("--iterations", type=int, help="projected-gradient steps per release (default %(default)s)")
    inc.set_defaults(func=_run, **_defaults(IncrementalSettings))

    grow = sub.add_parser(
        "growth",
        help="BBScheduler / BBImprover: when to re-run a DP statistic and with which "
        "epsilon as the stream grows (Cummings et al.)",
        description="A growth schedule for a pipeline: at each new block, say whether the "
        "schedule re-runs and with which epsilon_i, and run its black box (the "
        "epsilon_i-DP mean of --column clipped to [0, --bound] over the DECLARED "
        "records, --rows-per-block per block). Each block is charged the whole "
        "per-record (--epsilon, --delta) once, before it is read.",
    )
    _base(grow)
    grow.add_argument(
        "--schedule",
        choices=("scheduler", "improver"),
        help="scheduler: BBScheduler, re-run when the stream grew by 1 + gamma (accuracy held); "
        "improver: BBImprover, re-run at every block (accuracy improves; needs --delta > 0)",
    )
    grow.add_argument("--column", required=True, metavar="COL", help="the numeric column whose mean is released")
    grow.add_argument(
        "--bound",
        type=float,
        required=True,
        metavar="B",
        help="public bound: values are clipped to [0, B] (the sensitivity is B / n)",
    )
    grow.add_argument(
        "--rows-per-block",
        type=int,
        required=True,
        metavar="M",
        help="the DECLARED records per block (public; n = blocks * M normalises the mean)",
    )
    grow.add_argument("--epsilon", type=float, required=True, help="each record's whole-lifetime epsilon")
    grow.add_argument(
        "--delta", type=float, help="each record's whole-lifetime delta (default %(default)s: pure DP, scheduler only)"
    )
    grow.add_argument(
        "--composition",
        choices=(Composition.ZCDP, Composition.BASIC),
        help="scheduler with --delta > 0: zcdp (default; pure runs composed in zCDP) or basic "
        "(each run (epsilon_i, delta_i)-DP with Gaussian noise, both shrinking geometrically)",
    )
    grow.add_argument("--gamma", type=float, help="scheduler: growth factor 1 + gamma (default %(default)s)")
    grow.add_argument("--a", type=float, help="improver: epsilon_t ~ t^-(1/2 + a), 0 < a < 1/2 (default %(default)s)")
    grow.add_argument("--t0", type=int, help="the first run's block count (default %(default)s)")
    grow.set_defaults(func=_run, **_defaults(GrowthSettings))

    pm = sub.add_parser(
        "pmwg",
        help="PMWG: a declared stream of linear queries (counts, sums over predicates) "
        "answered on the growing stream (Cummings et al.)",
        description="Private multiplicative weights for a growing database over the declared "
        "universe --bins. The queries of --queries (JSON lines) are answered as the "
        "blocks arrive; each block is charged --epsilon (and --delta) once, before it is read. "
        'A query line: {"count": {COL: [LO, HI], ...}} or {"sum": COL, '
        '"bound": B, "where": {COL: [LO, HI]}}, with "at": T to ask it '
        "once when the stream has T blocks (default: after every block). A cell "
        "is in [LO, HI) when its centre is.",
    )
    _base(pm)
    pm.add_argument(
        "--bins",
        required=True,
        metavar="COL=LO:HI:K,...",
        help="the declared universe: K equal bins on [LO, HI] per column (values outside are clipped "
        "into the outer bins)",
    )
    pm.add_argument(
        "--queries",
        required=True,
        metavar="FILE",
        help="the declared query stream (JSON lines); it "
        "is part of the computation: a pipeline that answered it refuses another file",
    )
    pm.add_argument(
        "--rows-per-block",
        type=int,
        required=True,
        metavar="M",
        help="the DECLARED records per block (public; answers are fractions of n = blocks * M)",
    )
    pm.add_argument("--epsilon", type=float, required=True, help="each record's whole-lifetime epsilon")
    pm.add_argument(
        "--delta",
        type=float,
        help="each record's whole-lifetime delta (default %(default)s: pure DP); > 0: the rounds compose in zCDP "
        "(Theorem 17), each round's epsilon larger, so less noise per round, and every block is charged "
        "(--epsilon, --delta)",
    )
    pm.add_argument("--hard-budget", type=int, help="hard queries k at the first block (default %(default)s)")
    pm.add_argument("--threshold", type=float, help="hardness threshold (fraction; default %(default)s)")
    pm.add_argument("--eta", type=float, help="multiplicative-weights rate (default %(default)s)")
    pm.add_argument(
        "--growth-exponent",
        type=float,
        metavar="P",
        help="a hardness round opened at n records costs c (n0 / n)^P, 0 < P <= 1 (default %(default)s); the "
        "hard-query budget grows as K (1 + ln(n / n0)) and the rounds sum to --epsilon",
    )
    pm.set_defaults(func=_run, **_defaults(PMWGSettings))


def _defaults(cls: type[ReleaseSettings]) -> dict:
    """The settings class's field defaults, the parser's defaults: one home for each (``%(default)s`` in help)."""
    return {
        f.name: f.default
        for f in dataclasses.fields(cls)
        if f.default is not dataclasses.MISSING and f.name != "progress"
    }


def _base(p):
    p.add_argument("--db", required=True, type=ledger_location, help="ledger file or postgresql:// URL")
    p.add_argument("--stream", required=True)
    p.add_argument("--data-root", required=True, help="where `sage ingest` wrote the stream's blocks")
    p.add_argument("--pipeline", required=True, help="the name charged in the ledger; its grants are the state")
    p.add_argument(
        "--json",
        action="store_true",
        help="print the release's summary as JSON on stdout (progress lines go to stderr)",
    )
    add_key_file(p)


def _common(p):
    _base(p)
    p.add_argument("--label", required=True, metavar="COL", help="the label column (numeric)")
    p.add_argument("--features", required=True, metavar="C1,C2,...", help="numeric feature columns")
    p.add_argument(
        "--scales", metavar="S1,S2,...", help="public divisors of the features, one per column (default 1 each)"
    )
    p.add_argument("--label-scale", type=float, help="public divisor of the label (default %(default)s)")
    p.add_argument("--intercept", action="store_true", help="append a constant feature 1 (after scaling)")
    p.add_argument("--epsilon", type=float, required=True, help="each block's whole-lifetime epsilon")
    p.add_argument("--delta", type=float, required=True, help="each block's whole-lifetime delta (> 0)")


STRATEGIES = ("continual", "incremental-regression", "growth", "pmwg")  # the `sage release` subcommands
_FROM_SERVE = ("db", "stream", "data-root", "pipeline", "json", "key-file")  # options `sage serve` gives itself


class _RaisingParser(argparse.ArgumentParser):
    """argparse, raising _BadInput instead of printing and exiting (a `sage serve --release` options file)."""

    def error(self, message):
        raise _BadInput(message)


def release_argv(
    strategy: str, options: dict, *, db: str, stream: str, data_root: str, pipeline: str, source: str = "the options"
) -> "tuple[list[str] | None, str | None]":
    """``(argv, None)``: the `sage release STRATEGY` command line that ``options`` (a JSON object's dict: an option
    name without its dashes -> its value) spells, with ``--db``, ``--stream``, ``--data-root`` and ``--pipeline``
    given, checked by the command's own parser (``parse_release_argv``); or ``(None, message)`` naming the bad
    value.

    A key is the option's name, ``-`` or ``_`` alike ("rows_per_block" or "rows-per-block"); a value is a string
    or number (``--epsilon 0.5``), ``true`` for a flag (``--intercept``; ``false`` leaves it out) or a list for a
    comma list (``"features": ["fare", "trip_miles"]``). The options `sage serve` gives itself are refused."""
    try:
        if strategy not in STRATEGIES:
            raise _BadInput(f"strategy {strategy!r} is unknown: use one of {', '.join(STRATEGIES)}")
        if not isinstance(options, dict):
            raise _BadInput(
                f"{source} must be a JSON object of `sage release {strategy}` options, not {type(options).__name__}"
            )
        argv = [
            "release",
            strategy,
            "--db",
            str(db),
            "--stream",
            stream,
            "--data-root",
            str(data_root),
            "--pipeline",
            pipeline,
        ]
        for key, value in options.items():
            flag = str(key).replace("_", "-").lstrip("-")
            if flag in _FROM_SERVE:
                raise _BadInput(
                    f"{source}: option {key!r} is given by `sage serve` itself (--db, --stream, "
                    "--data-root, the --release NAME; no --json, --key-file): leave it out"
                )
            if value is True:
                argv.append("--" + flag)
            elif value is False or value is None:
                continue
            elif (
                isinstance(value, list)
                and value
                and all(isinstance(v, (str, int, float)) and not isinstance(v, bool) for v in value)
            ):
                argv += ["--" + flag, ",".join(str(v) for v in value)]
            elif isinstance(value, (str, int, float)):
                argv += ["--" + flag, str(value)]
            else:
                raise _BadInput(
                    f"{source}: option {key!r} has value {value!r}: give a string, a number, true/false "
                    "or a list of strings/numbers"
                )
    except _BadInput as exc:
        return None, str(exc)
    args, error = parse_release_argv(argv)
    return (argv, None) if args is not None else (None, f"{source}: {error}")


def parse_release_argv(argv: list) -> "tuple[argparse.Namespace | None, str | None]":
    """``(args, None)``: ``argv`` (``["release", STRATEGY, ...]``) parsed by `sage release`'s own parser, without
    --json; or ``(None, argparse's message)``."""
    root = _RaisingParser(prog="sage", add_help=False)
    add_parser(root.add_subparsers(dest="command"))
    try:
        args = root.parse_args(list(argv))
    except _BadInput as exc:
        return None, str(exc)
    args.json = False
    return args, None


def settings_from_args(args: argparse.Namespace):
    """The strategy's settings (``sage_tfx.release.settings.SETTINGS[args.strategy]``) of a parsed `sage release
    STRATEGY` command line; ReleaseInputError naming the bad value."""
    cls = SETTINGS[args.strategy]
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in vars(args).items() if k in names})


def release_settings(argv: list, source: str):
    """The settings of a checked `sage release STRATEGY` command line (``release_argv``); ValueError naming
    ``source`` and the bad value."""

    args, error = parse_release_argv(argv)
    if args is None:
        raise ValueError(f"{source}: {error}")
    try:
        return settings_from_args(args)
    except ReleaseInputError as exc:
        raise ValueError(f"{source}: {exc}") from None


# a session's status (sage_tfx.release.SessionStatus, a StrEnum) -> exit code
EXIT_CODES = {"ok": EXIT_OK, "refused": EXIT_REFUSED, "failed": EXIT_FAILED}


def _bad(message):
    print(f"error: {message}", file=sys.stderr)
    return EXIT_BAD_INPUT


def _run(args):
    """`sage release STRATEGY`: ``open_release`` (every check before any charge; bad input exits 2 with the ledger
    closed and unchanged), one ``advance`` over the stream's blocks, then the audit and the summary."""
    from sage_tfx.privacy.errors import SageError
    from sage_tfx.release.session import open_release

    try:
        session = open_release(settings_from_args(args))
    except (SageError, ValueError) as exc:
        return _bad(exc)
    try:
        code = EXIT_CODES[session.advance()]
        ok = session.audit()
    finally:
        session.close()
    summary = session.summary
    if args.json:
        print(json.dumps(summary, indent=1, sort_keys=True))
    else:
        print(
            f"[{summary['command']}] {summary['charged_blocks']} block(s) charged and released, "
            f"{summary['resumed_blocks']} resumed without a charge; audit {'OK' if ok else 'FAILED'}"
        )
    return code if ok or code != EXIT_OK else EXIT_FAILED
