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
      --queries FILE --rows-per-block M --epsilon E [--hard-budget K] [--threshold T] [--eta ETA]
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

Exit codes (sage_tfx.cli._exits): 0 success; 1 a release failed after its charge; 2 bad input (nothing
charged); 3 the budget refused a block's charge (that block and later ones are not released; earlier ones are).
"""
import argparse
import hashlib
import json
import math
import sys

import numpy as np

from sage_tfx.privacy.split import RECORDS_KEY, SPLIT_KEY

from ._exits import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK, EXIT_REFUSED
from ._keys import add_key_file, ledger_location

NUMERIC_TYPES = ("float", "int")


class _BadInput(Exception):
    """A bad command-line value, found before anything was charged (exit 2)."""


def add_parser(subparsers):
    parser = subparsers.add_parser("release", help="continual / sliding-window / incremental-regression release "
                                   "of a model at every block of a stream", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="strategy", metavar="STRATEGY")
    sub.required = True
    cont = sub.add_parser("continual", help="a regularised ERM model (logistic / least squares) at every block, "
                          "all history or a sliding window (Watson et al.)",
                          description="Continual (all history) or, with --window, sliding-window release of a "
                                      "regularised ERM model at every new block; each block is charged its whole "
                                      "per-record bound (--epsilon, --delta) once, before it is read.")
    _common(cont)
    cont.add_argument("--loss", choices=("logistic", "squared"), default="logistic")
    cont.add_argument("--rows-per-block", type=int, required=True, metavar="M",
                      help="the DECLARED records per block m0 that normalises the objective (public; the "
                           "sensitivity is 1/(lam * blocks * M), whatever the data holds)")
    cont.add_argument("--window", type=int, default=None, metavar="W",
                      help="sliding window in blocks (default: all history, the cumulative release)")
    cont.add_argument("--lam", type=float, default=0.05, help="ridge weight lam (default 0.05)")
    cont.add_argument("--radius", type=float, default=10.0, help="parameter-ball radius R (default 10)")
    cont.add_argument("--positive-above", type=float, default=0.0, metavar="VALUE",
                      help="logistic: a label is +1 iff its value > VALUE (default 0), else -1")
    cont.add_argument("--push-dir", default=None, metavar="DIR",
                      help="write every model as a TFX Model artifact DIR/model-<t>/Format-Serving/ and its "
                           "ModelBlessing DIR/blessing-<t>/ (BLESSED iff its SLA check ACCEPTed or none is set; "
                           "what a TFX Pusher reads)")
    cont.add_argument("--serving-dir", default=None, metavar="DIR",
                      help="push the BLESSED models to DIR/<t>/ as TFX's Pusher does (needs --push-dir)")
    cont.add_argument("--sla-target", type=float, default=None, metavar="LOSS",
                      help="SLA: ACCEPT a model iff its expected (clipped) loss is <= LOSS (DPLossValidator), "
                           "checked on the newest block's test part; needs --sla-epsilon")
    cont.add_argument("--sla-epsilon", type=float, default=None, metavar="E",
                      help="the SLA check's epsilon (<= --epsilon: a parallel train/test split of each block)")
    cont.add_argument("--sla-confidence", type=float, default=0.95, help="SLA confidence 1 - eta (default 0.95)")
    cont.add_argument("--sla-loss-bound", type=float, default=5.0, metavar="B",
                      help="losses are clipped to [0, B] for the SLA check (default 5)")
    cont.set_defaults(func=run_continual)

    inc = sub.add_parser("incremental-regression", help="a least-squares regressor at every block by the Tree "
                         "Mechanism over a declared horizon (Kasiviswanathan et al.)",
                         description="PrivIncReg1: a linear regressor released at every new block, up to "
                                     "--horizon blocks; each block is charged the whole-horizon bound "
                                     "(--epsilon, --delta) once, before it is read.")
    _common(inc)
    inc.add_argument("--horizon", type=int, required=True, metavar="T", help="the blocks this pipeline will "
                     "ever take (the charge covers T; more blocks need a new --pipeline)")
    inc.add_argument("--bound-x", type=float, default=1.0, help="feature clipping ||x|| <= BX (default 1)")
    inc.add_argument("--bound-y", type=float, default=1.0, help="label clipping |y| <= BY (default 1)")
    inc.add_argument("--radius", type=float, default=10.0, help="the regressor's L2 ball R (default 10)")
    inc.add_argument("--iterations", type=int, default=200, help="projected-gradient steps per release")
    inc.set_defaults(func=run_incremental)

    grow = sub.add_parser("growth", help="BBScheduler / BBImprover: when to re-run a DP statistic and with which "
                          "epsilon as the stream grows (Cummings et al.)",
                          description="A growth schedule for a pipeline: at each new block, say whether the "
                                      "schedule re-runs and with which epsilon_i, and run its black box (the "
                                      "epsilon_i-DP mean of --column clipped to [0, --bound] over the DECLARED "
                                      "records, --rows-per-block per block). Each block is charged the whole "
                                      "per-record (--epsilon, --delta) once, before it is read.")
    _base(grow)
    grow.add_argument("--schedule", choices=("scheduler", "improver"), default="scheduler",
                      help="scheduler: BBScheduler, re-run when the stream grew by 1 + gamma (accuracy held); "
                           "improver: BBImprover, re-run at every block (accuracy improves; needs --delta > 0)")
    grow.add_argument("--column", required=True, metavar="COL", help="the numeric column whose mean is released")
    grow.add_argument("--bound", type=float, required=True, metavar="B",
                      help="public bound: values are clipped to [0, B] (the sensitivity is B / n)")
    grow.add_argument("--rows-per-block", type=int, required=True, metavar="M",
                      help="the DECLARED records per block (public; n = blocks * M normalises the mean)")
    grow.add_argument("--epsilon", type=float, required=True, help="each record's whole-lifetime epsilon")
    grow.add_argument("--delta", type=float, default=0.0,
                      help="each record's whole-lifetime delta (default 0: pure DP, scheduler only)")
    grow.add_argument("--composition", choices=("zcdp", "basic"), default=None,
                      help="scheduler with --delta > 0: zcdp (default; pure runs composed in zCDP) or basic "
                           "(each run (epsilon_i, delta_i)-DP with Gaussian noise, both shrinking geometrically)")
    grow.add_argument("--gamma", type=float, default=0.5, help="scheduler: growth factor 1 + gamma (default 0.5)")
    grow.add_argument("--a", type=float, default=0.1, help="improver: epsilon_t ~ t^-(1/2 + a), 0 < a < 1/2")
    grow.add_argument("--t0", type=int, default=1, help="the first run's block count (default 1)")
    grow.set_defaults(func=run_growth)

    pm = sub.add_parser("pmwg", help="PMWG: a declared stream of linear queries (counts, sums over predicates) "
                        "answered on the growing stream (Cummings et al.)",
                        description="Private multiplicative weights for a growing database over the declared "
                                    "universe --bins. The queries of --queries (JSON lines) are answered as the "
                                    "blocks arrive; each block is charged --epsilon once, before it is read. "
                                    "A query line: {\"count\": {COL: [LO, HI], ...}} or {\"sum\": COL, "
                                    "\"bound\": B, \"where\": {COL: [LO, HI]}}, with \"at\": T to ask it "
                                    "once when the stream has T blocks (default: after every block). A cell "
                                    "is in [LO, HI) when its centre is.")
    _base(pm)
    pm.add_argument("--bins", required=True, metavar="COL=LO:HI:K,...",
                    help="the declared universe: K equal bins on [LO, HI] per column (values outside are clipped "
                         "into the outer bins)")
    pm.add_argument("--queries", required=True, metavar="FILE", help="the declared query stream (JSON lines); it "
                    "is part of the computation: a pipeline that answered it refuses another file")
    pm.add_argument("--rows-per-block", type=int, required=True, metavar="M",
                    help="the DECLARED records per block (public; answers are fractions of n = blocks * M)")
    pm.add_argument("--epsilon", type=float, required=True, help="each record's whole-lifetime epsilon (pure)")
    pm.add_argument("--hard-budget", type=int, default=20, help="hard queries k at the first block (default 20)")
    pm.add_argument("--threshold", type=float, default=0.05, help="hardness threshold (fraction; default 0.05)")
    pm.add_argument("--eta", type=float, default=0.5, help="multiplicative-weights rate (default 0.5)")
    pm.add_argument("--growth-exponent", type=float, default=0.5, metavar="P",
                    help="a hardness round opened at n records costs c (n0 / n)^P, 0 < P <= 1 (default 0.5); the "
                         "hard-query budget grows as K (1 + ln(n / n0)) and the rounds sum to --epsilon")
    pm.set_defaults(func=run_pmwg)


def _base(p):
    p.add_argument("--db", required=True, type=ledger_location, help="ledger file or postgresql:// URL")
    p.add_argument("--stream", required=True)
    p.add_argument("--data-root", required=True, help="where `sage ingest` wrote the stream's blocks")
    p.add_argument("--pipeline", required=True, help="the name charged in the ledger; its grants are the state")
    p.add_argument("--json", action="store_true", help="print the release's summary as JSON on stdout "
                   "(progress lines go to stderr)")
    add_key_file(p)


def _common(p):
    _base(p)
    p.add_argument("--label", required=True, metavar="COL", help="the label column (numeric)")
    p.add_argument("--features", required=True, metavar="C1,C2,...", help="numeric feature columns")
    p.add_argument("--scales", default=None, metavar="S1,S2,...",
                   help="public divisors of the features, one per column (default 1 each)")
    p.add_argument("--label-scale", type=float, default=1.0, help="public divisor of the label (default 1)")
    p.add_argument("--intercept", action="store_true", help="append a constant feature 1 (after scaling)")
    p.add_argument("--epsilon", type=float, required=True, help="each block's whole-lifetime epsilon")
    p.add_argument("--delta", type=float, required=True, help="each block's whole-lifetime delta (> 0)")


# ------------------------------------------------------------------ shared checks and reading
def _features(args, schema):
    cols = [c.strip() for c in args.features.split(",") if c.strip()]
    if not cols:
        raise _BadInput(f"--features {args.features!r} names no column: give C1,C2,... of the stream's schema")
    if len(set(cols)) != len(cols):
        raise _BadInput(f"--features {args.features!r} names a column twice: give each once")
    _numeric(args, schema, cols + [args.label])
    if args.scales is None:
        scales = [1.0] * len(cols)
    else:
        try:
            scales = [float(s) for s in args.scales.split(",")]
        except ValueError:
            raise _BadInput(f"--scales {args.scales!r} is not a list of numbers: give S1,S2,... (> 0)") from None
        if len(scales) != len(cols):
            raise _BadInput(f"--scales {args.scales!r} has {len(scales)} value(s) for {len(cols)} feature(s): "
                            "give one divisor per column")
    for name, s in [("--scales", s) for s in scales] + [("--label-scale", args.label_scale)]:
        if not (math.isfinite(s) and s > 0):
            raise _BadInput(f"{name} value {s!r} is invalid: give a finite divisor > 0")
    return cols, scales


def _numeric(args, schema, cols):
    """Refuse a column that is not a numeric column of the stream's schema (naming it and the choices)."""
    for c in cols:
        if c not in schema:
            raise _BadInput(f"column {c!r} is not in stream {args.stream!r}'s schema: use one of "
                            f"{', '.join(sorted(n for n, t in schema.items() if t in NUMERIC_TYPES))}")
        if schema[c] not in NUMERIC_TYPES:
            raise _BadInput(f"column {c!r} is {schema[c]}, not numeric: give a float or int column")


def _column_reader(schema, cols):
    """records -> (n, len(cols)) array of the columns (missing / non-finite -> 0, a public default)."""

    from sage_tfx.ingest.records import decode

    def read(records):
        batch = decode(records, schema)
        out = np.zeros((batch.num_rows, len(cols)))
        for k, name in enumerate(cols):
            v = np.array([(float(x[0]) if x else 0.0) for x in batch.column(name).to_pylist()], dtype=np.float64)
            out[:, k] = np.where(np.isfinite(v), v, 0.0)
        return out

    return read


def _featurizer(schema, cols, scales, label, label_scale, intercept):
    """records -> (X, y): the scaled columns (missing / non-finite -> 0, a public default), label / label_scale."""

    read = _column_reader(schema, list(cols) + [label])

    def featurize(records):
        values = read(records)
        x = values[:, :-1] / np.asarray(scales, dtype=np.float64)
        if intercept:
            x = np.concatenate([x, np.ones((len(values), 1))], 1)
        return x, values[:, -1] / label_scale

    return featurize


def _open(args, schema=None):
    """The ledger and the stream's schema (``schema`` when the data root holds none yet); a _BadInput if either is
    missing (nothing charged)."""
    from sage_tfx.ingest.store import stream_config
    from sage_tfx.privacy import Ledger
    from sage_tfx.privacy.errors import SageError

    try:
        ledger = Ledger.open(args.db)
    except (SageError, OSError, ValueError) as exc:
        raise _BadInput(f"--db {args.db!r}: {exc}") from None
    try:
        ledger.stream(args.stream)
    except SageError as exc:
        ledger.close()
        raise _BadInput(f"--stream {args.stream!r}: {exc}") from None
    config = stream_config(args.data_root, args.stream)
    if config is None and schema is not None:
        return ledger, dict(schema)
    if config is None:
        ledger.close()
        raise _BadInput(f"--data-root {args.data_root!r} holds no stream {args.stream!r}: give the directory "
                        "`sage ingest` wrote it to")
    return ledger, dict(config["schema"])


def _previous(ledger, args, strategies, meta):
    """The grants of this pipeline on this stream, in charge order, {block: grant}; refused unless every one is a
    one-block grant of this strategy with exactly these parameters."""
    previous = {}
    for g in ledger.grants(args.stream):
        if g.pipeline != args.pipeline:
            continue
        mismatch = None
        if len(g.blocks) != 1 or g.meta.get("strategy") not in strategies:
            mismatch = f"grant {g.id} is not a {'/'.join(strategies)} grant (strategy {g.meta.get('strategy')!r})"
        else:
            diff = _meta_diff(g.meta, meta)
            if diff:
                mismatch = ("its grants were charged with " + ", ".join(f"{k}={g.meta.get(k)!r}" for k in diff)
                            + ", this run asks for " + ", ".join(f"{k}={meta.get(k)!r}" for k in diff))
        if mismatch:
            raise _BadInput(f"--pipeline {args.pipeline!r} already released on stream {args.stream!r} with other "
                            f"parameters: {mismatch}; rerun with the same parameters to resume, or give a new "
                            "--pipeline (its blocks are charged again)")
        previous[g.blocks[0]] = g
    return previous


def _meta_diff(signed, ours):
    """The keys where a grant's signed meta and this run's meta differ; ``split`` and ``records`` are the
    ledger's own additions (the split derived from epsilon and validation_epsilon, which are compared; the record
    split signed with it)."""
    keys = sorted((set(signed) | set(ours)) - {SPLIT_KEY, RECORDS_KEY})
    return [k for k in keys if signed.get(k) != ours.get(k)]


class _ResumingLedger:
    """The ledger, except that ``request`` for a block this pipeline already holds a grant for returns that
    grant (no new charge) -- how a restart replays the blocks it observed before. Everything else is the
    ledger's own (``release`` re-opens the same computation; ``private_seed`` gives the same noise)."""

    def __init__(self, ledger, previous):
        self._ledger, self._previous, self.replayed = ledger, dict(previous), set()

    def request(self, pipeline, stream, blocks=None, **kwargs):
        if blocks and len(blocks) == 1 and blocks[0] in self._previous:
            grant = self._previous[blocks[0]]
            if _meta_diff(grant.meta, kwargs.get("meta") or {}) or grant.pipeline != pipeline or grant.stream != stream:
                raise RuntimeError(f"grant {grant.id} does not match the resumed strategy")  # checked up front
            self.replayed.add(blocks[0])
            return self._ledger.verify(grant)
        return self._ledger.request(pipeline, stream, blocks=blocks, **kwargs)

    def __getattr__(self, name):
        return getattr(self._ledger, name)


def _step(observe, block, args=None):
    """``(observe(block), None)``, or ``(None, exit code)`` after saying why: EXIT_REFUSED when the budget
    refused the block (nothing charged), EXIT_FAILED for any other sage-tfx error (a charge already made
    stays spent: the ledger's rule)."""
    from sage_tfx.privacy.errors import BudgetRefused, SageError

    try:
        return observe(block), None
    except BudgetRefused as exc:
        _error(args, f"error: {exc}")
        return None, EXIT_REFUSED
    except SageError as exc:
        _error(args, f"error: block {block}: {exc}")
        return None, EXIT_FAILED


def _say(args, line):
    """A progress line: to ``args.progress`` when a `sage serve` worker set one, else stdout (stderr with --json)."""
    progress = getattr(args, "progress", None)
    if progress is not None:
        progress(line)
    else:
        print(line, file=sys.stderr if args.json else sys.stdout, flush=True)


def _error(args, line):
    """An error line: to ``args.progress`` when a `sage serve` worker set one, else stderr."""
    progress = getattr(args, "progress", None) if args is not None else None
    if progress is not None:
        progress(line)
    else:
        print(line, file=sys.stderr, flush=True)


def _spent_line(grant, replayed):
    if replayed:
        return f"resumed (grant {grant.id}, nothing charged)"
    return f"charged eps {grant.epsilon:g} delta {grant.delta:g}"


def _finish(args, ledger, summary, code):
    report = ledger.audit()
    summary["audit_ok"] = bool(report.ok)
    ledger.close()
    if args.json:
        print(json.dumps(summary, indent=1, sort_keys=True))
    else:
        n_new, n_old = summary["charged_blocks"], summary["resumed_blocks"]
        print(f"[{summary['command']}] {n_new} block(s) charged and released, {n_old} resumed without a charge; "
              f"audit {'OK' if report.ok else 'FAILED'}")
    return code if report.ok or code != EXIT_OK else EXIT_FAILED


# ------------------------------------------------------------------ the shared preamble and block walk
class _Plan:
    """What a strategy's ``_prepare_*`` returns, every check done and nothing charged: the summary it fills,
    ``observe(block)`` (the strategy's step: charge, then read), ``emit(block, output, replayed)`` (the block's
    line and summary entry; an exit code if it failed after the charge, else None), the resuming ledger and the
    previous grants {block: grant} (``_resume``); ``limit``: the most blocks the charge covers (a horizon), or
    None; ``finalize()``: the summary's last fields."""

    def __init__(self, summary, observe, emit, resuming, previous, *, limit=None, finalize=None):
        self.summary, self.observe, self.emit = summary, observe, emit
        self.resuming, self.previous, self.limit, self.finalize = resuming, dict(previous), limit, finalize


class ReleaseSession:
    """One release strategy on one ledger and stream: ``advance()`` releases every block not yet observed, as
    often as blocks arrive; ``close()`` ends it. `sage release` advances once; a `sage serve --release` worker
    (sage_tfx/adaptive/workers.py) advances after every replay step -- one code path.

    The first ``advance()`` replays the pipeline's previous grants (no charge, the same noise: a restart), then
    every later block of the stream in the ledger's block order is charged its whole bound in ONE grant before it
    is read (the strategy's ``observe``). After a block is refused (exit 3) or fails after its charge (exit 1),
    the session stops: a later block cannot be released without it (the strategy's state is the whole history).
    Build one with ``open_release``.
    """

    def __init__(self, args, ledger, plan):
        self.args, self.ledger, self.plan = args, ledger, plan
        self.summary = plan.summary
        self.code = EXIT_OK
        self._seen = set()  # blocks observed in this session (released or replayed)

    @property
    def observed(self) -> int:
        return len(self._seen)

    def pending(self) -> list:
        """The blocks the next ``advance`` walks: the previous grants' blocks not yet replayed (in charge order),
        then the stream's blocks without a grant of this pipeline (in the ledger's block order)."""
        previous = self.plan.previous
        return ([b for b in previous if b not in self._seen]
                + [b.id for b in self.ledger.blocks(self.args.stream)
                   if b.id not in previous and b.id not in self._seen])

    def advance(self) -> int:
        """Release every pending block; the session's exit code (EXIT_OK while it can go on)."""
        if self.code != EXIT_OK:
            return self.code
        blocks = self.pending()
        limit = self.plan.limit
        if limit is not None:
            room = max(0, limit - len(self._seen))
            left = [b for b in blocks[room:] if b not in self.summary["unobserved"]]
            blocks = blocks[:room]
            if left:
                self.summary["unobserved"].extend(left)
                _error(self.args, f"warning: horizon {limit} reached: {len(left)} block(s) left unobserved "
                                  "(the charge covers the horizon only); give a new --pipeline with a new --horizon")
        walk = _Walk(blocks, self.plan.observe, self.plan.resuming, self.summary, self.args)
        for block, out, replayed in walk:
            self._seen.add(block)
            failed = self.plan.emit(block, out, replayed)
            if failed is not None:
                self.code = failed
                return failed
        self.code = walk.code
        return self.code

    def close(self, *, audit=True) -> int:
        """Fill the summary's last fields and close the ledger; with ``audit`` (`sage release`) audit it, print
        the summary (JSON or one line) and return the exit code."""
        if self.plan.finalize is not None:
            self.plan.finalize()
        if audit:
            return _finish(self.args, self.ledger, self.summary, self.code)
        self.ledger.close()
        return self.code


_PREPARE = {}  # strategy subcommand -> its _prepare_* (filled below each definition)


def open_release(args: argparse.Namespace, *, schema: dict | None = None,
                 claim: bool = True) -> "tuple[ReleaseSession | None, str | None]":
    """``(ReleaseSession, None)`` for a parsed `sage release STRATEGY` command line, every check done and nothing
    charged; or ``(None, message)`` for bad input (the ledger closed and unchanged). ``schema``: the stream's
    schema when its data root holds none yet (`sage serve` before its first replay step: the replay's schema).
    ``claim``: hold the pipeline name for this process (``Ledger.claim``: a name another `sage release`,
    `sage serve` or `sage run` runs is refused); `sage serve` claims its names itself, in the parent."""
    from sage_tfx.privacy.errors import SageError

    try:
        ledger, schema = _open(args, schema)
    except _BadInput as exc:
        return None, str(exc)
    try:
        if claim:
            ledger.claim(args.stream, [args.pipeline])
        plan = _PREPARE[args.strategy](args, ledger, schema)
    except (_BadInput, SageError, ValueError) as exc:
        ledger.close()
        return None, str(exc)
    except BaseException:
        ledger.close()
        raise
    return ReleaseSession(args, ledger, plan), None


STRATEGIES = ("continual", "incremental-regression", "growth", "pmwg")  # the `sage release` subcommands
_FROM_SERVE = ("db", "stream", "data-root", "pipeline", "json", "key-file")  # options `sage serve` gives itself


class _RaisingParser(argparse.ArgumentParser):
    """argparse, raising _BadInput instead of printing and exiting (a `sage serve --release` options file)."""

    def error(self, message):
        raise _BadInput(message)


def release_argv(strategy: str, options: dict, *, db: str, stream: str, data_root: str, pipeline: str,
                 source: str = "the options") -> "tuple[list[str] | None, str | None]":
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
            raise _BadInput(f"{source} must be a JSON object of `sage release {strategy}` options, not "
                            f"{type(options).__name__}")
        argv = ["release", strategy, "--db", str(db), "--stream", stream, "--data-root", str(data_root),
                "--pipeline", pipeline]
        for key, value in options.items():
            flag = str(key).replace("_", "-").lstrip("-")
            if flag in _FROM_SERVE:
                raise _BadInput(f"{source}: option {key!r} is given by `sage serve` itself (--db, --stream, "
                                "--data-root, the --release NAME; no --json, --key-file): leave it out")
            if value is True:
                argv.append("--" + flag)
            elif value is False or value is None:
                continue
            elif isinstance(value, list) and value and all(isinstance(v, (str, int, float)) and
                                                           not isinstance(v, bool) for v in value):
                argv += ["--" + flag, ",".join(str(v) for v in value)]
            elif isinstance(value, (str, int, float)):
                argv += ["--" + flag, str(value)]
            else:
                raise _BadInput(f"{source}: option {key!r} has value {value!r}: give a string, a number, true/false "
                                "or a list of strings/numbers")
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


def _run(args):
    """`sage release STRATEGY`: ``open_release`` (every check before any charge; bad input exits 2 with the ledger
    closed and unchanged), one ``advance`` over the stream's blocks, then the audit (``_finish``)."""
    session, error = open_release(args)
    if session is None:
        return _bad(error)
    try:
        session.advance()
    except BaseException:
        session.ledger.close()
        raise
    return session.close()


def _resume(ledger, args, strategies, build, meta=None):
    """``build(ledger)`` -> the strategy instance, resumed: (instance on a _ResumingLedger, previous grants
    {block: grant}, the resuming ledger). ``_previous`` refuses (before any charge) a pipeline whose grants were
    signed with other parameters than the probe's ``meta``."""
    probe_meta = build(ledger).meta if meta is None else meta
    previous = _previous(ledger, args, strategies, probe_meta)
    resuming = _ResumingLedger(ledger, previous)
    return build(resuming), previous, resuming


def _summary(command, strategy, args, params, fingerprint, delta, **lists):
    return {"command": command, "strategy": strategy, "stream": args.stream, "pipeline": args.pipeline,
            "epsilon": args.epsilon, "delta": delta, "params": params, "fingerprint": fingerprint,
            "charged_blocks": 0, "resumed_blocks": 0, **lists}


class _Walk:
    """The blocks in order, each through ``observe`` (``_step``): yields (block, output, replayed) and counts it
    charged or resumed in ``summary``; stops at the first refused / failed block with ``code`` set."""

    def __init__(self, blocks, observe, resuming, summary, args=None):
        self.blocks, self.observe, self.resuming, self.summary, self.args = blocks, observe, resuming, summary, args
        self.code = EXIT_OK

    def __iter__(self):
        for block in self.blocks:
            out, failed = _step(self.observe, block, self.args)
            if failed is not None:
                self.code = failed
                return
            replayed = block in self.resuming.replayed
            self.summary["resumed_blocks" if replayed else "charged_blocks"] += 1
            yield block, out, replayed


# ------------------------------------------------------------------ continual / sliding window
def run_continual(args):
    return _run(args)


def _prepare_continual(args, ledger, schema):
    """Every check, before any charge: the columns, the parameters, the SLA validator, the pipeline's past."""
    from sage_tfx.privacy.errors import SageError
    from sage_tfx.release.continual import (
        ContinualRelease,
        ReleaseParams,
        SlidingWindowRelease,
        Strategy,
        check_sla,
        grant_reader,
        push_model,
    )

    cols, scales = _features(args, schema)
    dim = len(cols) + (1 if args.intercept else 0)
    if args.sla_target is None and args.sla_epsilon is not None or args.sla_target is not None \
            and args.sla_epsilon is None:
        raise _BadInput("--sla-target and --sla-epsilon go together: give both for an SLA check, or neither")
    if args.serving_dir is not None and args.push_dir is None:
        raise _BadInput(f"--serving-dir {args.serving_dir!r} needs --push-dir: the models and their blessings are "
                        "written there first (the artifacts a Pusher reads)")
    for flag, folder in (("--push-dir", args.push_dir), ("--serving-dir", args.serving_dir)):
        if folder is not None:  # made now: an unwritable folder must fail before any charge
            import os

            try:
                os.makedirs(folder, exist_ok=True)
            except OSError as exc:
                raise _BadInput(f"{flag} {folder!r} cannot be created ({exc.strerror}): give a writable "
                                "directory") from None
    params = ReleaseParams(epsilon=args.epsilon, delta=args.delta, records_per_block=args.rows_per_block,
                           lam=args.lam, radius=args.radius, loss=args.loss, window=args.window)
    validator = None
    if args.sla_target is not None:
        from sage_tfx.validation.loss import DPLossValidator

        validator = DPLossValidator(args.sla_target, args.sla_epsilon, args.sla_confidence,
                                    loss_bound=args.sla_loss_bound)
    label_pos = args.positive_above
    featurize = _featurizer(schema, cols, scales, args.label, args.label_scale, args.intercept)
    if args.loss == "logistic":  # the label is +1 iff its value > --positive-above (clip_features: y > 0 -> +1)
        base = featurize

        def featurize(records):
            x, y = base(records)
            return x, (y > label_pos / args.label_scale).astype(float) * 2 - 1

    cls = ContinualRelease if args.window is None else SlidingWindowRelease
    v_eps = None if validator is None else float(validator.epsilon)
    reader = grant_reader(ledger, args.data_root, featurize)
    release, previous, resuming = _resume(
        ledger, args, {s.value for s in Strategy},
        lambda led: cls(led, args.stream, args.pipeline, params, reader, dim=dim, validation_epsilon=v_eps))

    summary = _summary("continual", release.strategy.value, args, release.meta, release.fingerprint,
                       args.delta, models=[])
    tag = "continual" if args.window is None else "sliding-window"

    def emit(block, model, replayed):
        grant = release.grants[block]
        try:
            result = check_sla(release, model, validator) if validator is not None else None
            pushed = push_model(args.push_dir, model, result, args.serving_dir) if args.push_dir else None
        except SageError as exc:  # e.g. a replay whose SLA computation differs: the ledger refuses it
            _error(args, f"error: block {block}: {exc}")
            return EXIT_FAILED
        sla = None if result is None else str(result.outcome)
        wrote = "" if pushed is None else (f" wrote {pushed.model_uri} "
                                           f"{'BLESSED' if pushed.blessed else 'NOT_BLESSED'}")
        if pushed is not None and args.serving_dir:
            wrote += f" pushed {pushed.pushed_to}" if pushed.pushed_to else " not pushed"
        _say(args, f"[{tag}] block {block}: t={model.t} kind={model.kind} {_spent_line(grant, replayed)}"
                   + (f" SLA {sla}" if sla else "") + wrote)
        summary["models"].append({"t": model.t, "block": block, "kind": model.kind, "grant": grant.id,
                                  "charged": not replayed, "window_blocks": list(model.blocks),
                                  "weights": [float(w) for w in model.weights], "sla": sla,
                                  "model": pushed and pushed.model_uri,
                                  "blessing": pushed and pushed.blessing_uri,
                                  "blessed": pushed and pushed.blessed, "pushed": pushed and pushed.pushed_to})
        return None

    return _Plan(summary, release.observe, emit, resuming, previous)


_PREPARE["continual"] = _prepare_continual


# ------------------------------------------------------------------ incremental regression
def run_incremental(args):
    return _run(args)


def _prepare_incremental(args, ledger, schema):
    from sage_tfx.release.continual import grant_reader
    from sage_tfx.release.incremental_regression import STRATEGY, IncrementalRegression, IncrementalRegressionParams

    cols, scales = _features(args, schema)
    dim = len(cols) + (1 if args.intercept else 0)
    params = IncrementalRegressionParams(horizon=args.horizon, epsilon=args.epsilon, delta=args.delta,
                                         bound_x=args.bound_x, bound_y=args.bound_y, radius=args.radius,
                                         iterations=args.iterations)
    reader = grant_reader(ledger, args.data_root,
                          _featurizer(schema, cols, scales, args.label, args.label_scale, args.intercept))
    inc, previous, resuming = _resume(
        ledger, args, {STRATEGY}, lambda led: IncrementalRegression(led, args.stream, args.pipeline, params,
                                                                    dim=dim, reader=reader), meta=params.meta())
    if len(previous) > params.horizon:  # cannot happen with one instance; a guard
        raise _BadInput(f"--pipeline {args.pipeline!r} holds {len(previous)} grants, more than --horizon "
                        f"{params.horizon}")

    summary = _summary("incremental-regression", "incremental_regression", args, params.meta(), inc.fingerprint,
                       args.delta, models=[], unobserved=[])

    def emit(block, out, replayed):
        grant = ledger.get_grant(out.grant_id)
        _say(args, f"[incremental-regression] block {block}: t={out.t} kind=tree-prefix "
                   f"{_spent_line(grant, replayed)} nodes={inc.tree.stored_nodes}")
        summary["models"].append({"t": out.t, "block": block, "grant": out.grant_id, "charged": not replayed,
                                  "weights": [float(w) for w in out.theta]})
        return None

    # the horizon: blocks past it are left unobserved (ReleaseSession.advance warns), never charged
    return _Plan(summary, inc.arrive, emit, resuming, previous, limit=params.horizon)


_PREPARE["incremental-regression"] = _prepare_incremental


# ------------------------------------------------------------------ growth schedules (BBScheduler / BBImprover)
def run_growth(args):
    return _run(args)


def _prepare_growth(args, ledger, schema):
    from sage_tfx.release.continual import grant_reader
    from sage_tfx.release.growth import (
        BBImprover,
        BBScheduler,
        ImproverParams,
        ScheduledRelease,
        SchedulerParams,
        clipped_mean,
    )

    _numeric(args, schema, [args.column])
    if args.schedule == "scheduler":
        schedule = BBScheduler(SchedulerParams(epsilon=args.epsilon, delta=args.delta, gamma=args.gamma,
                                               t0=args.t0, composition=args.composition))
    else:
        if args.composition is not None:
            raise _BadInput(f"--composition {args.composition!r} is for --schedule scheduler: BBImprover always "
                            "composes in zCDP")
        schedule = BBImprover(ImproverParams(epsilon=args.epsilon, delta=args.delta, a=args.a, t0=args.t0))
    mechanism = clipped_mean(args.bound, args.rows_per_block)
    name = f"clipped_mean(column={args.column},bound={args.bound!r},rows_per_block={args.rows_per_block})"
    read_column = _column_reader(schema, [args.column])
    reader = grant_reader(ledger, args.data_root, lambda records: read_column(records)[:, 0])
    rel, previous, resuming = _resume(
        ledger, args, {"bbscheduler", "bbimprover"},
        lambda led: ScheduledRelease(led, args.stream, args.pipeline, schedule, mechanism, reader, name=name))

    summary = _summary("growth", schedule.meta["strategy"], args, rel.meta, rel.fingerprint, args.delta,
                       blocks=[], runs=[])

    def emit(block, run, replayed):
        grant, t = rel.grants[block], len(rel.order)
        entry = {"t": t, "block": block, "grant": grant.id, "charged": not replayed, "run": run is not None}
        if run is None:
            what = "no run (the schedule keeps the last output)"
        else:
            what = (f"run epoch {run.epoch} eps_i {run.epsilon:.6g}" + (f" delta_i {run.delta:.3g}" if run.delta
                                                                         else "") + f" mean {run.output:.6g}")
            summary["runs"].append({"t": t, "epoch": run.epoch, "epsilon_i": run.epsilon, "delta_i": run.delta,
                                    "mean": run.output, "blocks": len(run.blocks)})
            entry.update(epoch=run.epoch, epsilon_i=run.epsilon, delta_i=run.delta, mean=run.output)
        summary["blocks"].append(entry)
        _say(args, f"[growth:{args.schedule}] block {block}: t={t} {_spent_line(grant, replayed)} {what}")
        return None

    return _Plan(summary, rel.observe, emit, resuming, previous,
                 finalize=lambda: summary.update(current=rel.current))


_PREPARE["growth"] = _prepare_growth


# ------------------------------------------------------------------ PMWG
def run_pmwg(args):
    return _run(args)


def _parse_bins(text):
    """COL=LO:HI:K,... -> (columns, edges): K equal bins on [LO, HI] per column."""

    cols, edges = [], []
    for part in [p.strip() for p in text.split(",") if p.strip()]:
        try:
            name, spec = part.split("=", 1)
            lo, hi, k = spec.split(":")
            lo, hi, k = float(lo), float(hi), int(k)
        except ValueError:
            raise _BadInput(f"--bins part {part!r} is invalid: give COL=LO:HI:K (K equal bins on [LO, HI])") from None
        if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi and k >= 1):
            raise _BadInput(f"--bins part {part!r} is invalid: give finite LO < HI and K >= 1 bins")
        name = name.strip()
        if name in cols:
            raise _BadInput(f"--bins names column {name!r} twice: give each column once")
        cols.append(name)
        edges.append(np.linspace(lo, hi, k + 1))
    if not cols:
        raise _BadInput(f"--bins {text!r} names no column: give COL=LO:HI:K,...")
    return cols, edges


def _parse_queries(path, cols, universe):
    """The declared query stream: [(at or None, weights, text)]; every line checked before any charge."""

    from sage_tfx.release.growth import count_query, sum_query

    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError as exc:
        raise _BadInput(f"--queries {path!r} cannot be read ({exc.strerror}): give a JSON-lines file") from None
    index = {c: k for k, c in enumerate(cols)}

    def predicate(where, where_name, lineno):
        if not isinstance(where, dict):
            raise _BadInput(f"--queries line {lineno}: {where_name} {where!r} must be {{COL: [LO, HI], ...}}")
        checks = []
        for c, rng in where.items():
            if c not in index:
                raise _BadInput(f"--queries line {lineno}: column {c!r} is not in --bins ({', '.join(cols)})")
            if not (isinstance(rng, list) and len(rng) == 2 and all(isinstance(v, (int, float)) and
                                                                    not isinstance(v, bool) for v in rng)
                    and rng[0] < rng[1]):
                raise _BadInput(f"--queries line {lineno}: range {rng!r} of {c!r} is invalid: give [LO, HI], LO < HI")
            checks.append((index[c], float(rng[0]), float(rng[1])))

        def pred(centres):
            ok = np.ones(len(centres), dtype=bool)
            for k, lo, hi in checks:
                ok &= (centres[:, k] >= lo) & (centres[:, k] < hi)
            return ok

        return pred

    out = []
    for lineno, line in enumerate(lines, 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            q = json.loads(line)
        except ValueError:
            raise _BadInput(f"--queries line {lineno} is not JSON: {line[:60]!r}") from None
        if not isinstance(q, dict) or ("count" in q) == ("sum" in q):
            raise _BadInput(f"--queries line {lineno}: give exactly one of \"count\" or \"sum\"")
        unknown = set(q) - {"count", "sum", "bound", "where", "at"}
        if unknown:
            raise _BadInput(f"--queries line {lineno}: unknown key(s) {sorted(unknown)}: use count, sum, bound, "
                            "where, at")
        at = q.get("at")
        if at is not None and (isinstance(at, bool) or not isinstance(at, int) or at < 1):
            raise _BadInput(f"--queries line {lineno}: at {at!r} is invalid: give a block count >= 1")
        if "count" in q:
            weights = count_query(universe, predicate(q["count"], "count", lineno))
        else:
            if q["sum"] not in index:
                raise _BadInput(f"--queries line {lineno}: sum column {q['sum']!r} is not in --bins "
                                f"({', '.join(cols)})")
            bound = q.get("bound")
            if isinstance(bound, bool) or not isinstance(bound, (int, float)) or not bound > 0:
                raise _BadInput(f"--queries line {lineno}: bound {bound!r} is invalid: give the column's public "
                                "upper bound B > 0")
            where = predicate(q.get("where", {}), "where", lineno)
            weights = sum_query(universe, index[q["sum"]], float(bound), where)
        out.append((at, weights, q))
    if not out:
        raise _BadInput(f"--queries {path!r} holds no query: give one JSON object per line")
    return out, hashlib.sha256("\n".join(lines).encode()).hexdigest()


def _prepare_pmwg(args, ledger, schema):
    from sage_tfx.release.continual import grant_reader
    from sage_tfx.release.growth import PMWG, GrowthError, PMWGParams, Universe

    cols, edges = _parse_bins(args.bins)
    _numeric(args, schema, cols)
    universe = Universe(columns=tuple(cols), edges=tuple(tuple(float(v) for v in e) for e in edges))
    params = PMWGParams(epsilon=args.epsilon, hard_budget=args.hard_budget, threshold=args.threshold, eta=args.eta,
                        growth_exponent=args.growth_exponent)
    if args.rows_per_block < 1:
        raise GrowthError(f"--rows-per-block {args.rows_per_block!r} is invalid: give the declared (public) rows "
                          "per block >= 1")
    queries, digest = _parse_queries(args.queries, cols, universe)
    computation = json.dumps({"bins": args.bins, "queries_sha256": digest, "rows_per_block": args.rows_per_block},
                             sort_keys=True)
    read = _column_reader(schema, cols)
    reader = grant_reader(ledger, args.data_root, read)
    pm, previous, resuming = _resume(
        ledger, args, {"pmwg"},
        lambda led: PMWG(led, args.stream, args.pipeline, params, universe, reader, computation=computation))

    from sage_tfx.privacy.errors import SageError

    summary = _summary("pmwg", "pmwg", args, pm.meta, pm.fingerprint, 0.0, answers=[])

    def emit(block, _, replayed):
        grant, t = pm.grants[block], len(pm.order)
        asked = hard = 0
        for k, (at, weights, q) in enumerate(queries):
            if at is not None and at != t:
                continue
            try:
                ans = pm.query(weights)
            except SageError as exc:
                _error(args, f"error: block {block}: query {k + 1}: {exc}")
                return EXIT_FAILED
            asked, hard = asked + 1, hard + ans.hard
            scale = pm.n * (float(q["bound"]) if "sum" in q else 1.0)
            summary["answers"].append({"t": t, "block": block, "query": k + 1, "fraction": ans.answer,
                                       "estimate": ans.answer * scale, "hard": ans.hard})
        _say(args, f"[pmwg] block {block}: t={t} {_spent_line(grant, replayed)} n={pm.n} {asked} "
                   f"quer{'y' if asked == 1 else 'ies'} answered ({hard} hard; "
                   f"{pm.hard_used}/{pm.hard_limit()} hard used)")
        return None

    return _Plan(summary, lambda b: pm.observe(b, args.rows_per_block), emit, resuming, previous)


_PREPARE["pmwg"] = _prepare_pmwg


def _bad(exc):
    print(f"error: {exc}", file=sys.stderr)
    return EXIT_BAD_INPUT
