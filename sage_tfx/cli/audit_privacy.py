"""`sage audit-privacy MECHANISM`: an empirical lower bound on a shipped mechanism's epsilon, beside its claim.

Thin: the work is ``sage_tfx.auditing.audit_privacy`` (method, confidence and limits: docs/privacy_auditing.md).
Exit codes: 0 the lower bound stays at or below the claim; 1 (EXIT_VIOLATION) it exceeds the claim, a privacy
violation at the stated confidence; 2 bad input (nothing run).
"""

import json
import sys

from ._exits import EXIT_BAD_INPUT, EXIT_OK, EXIT_VIOLATION


def add_parser(subparsers):
    p = subparsers.add_parser(
        "audit-privacy",
        help="run a mechanism on neighbouring inputs many times and report "
        "an empirical lower bound on its epsilon beside the claim",
    )
    p.add_argument("mechanism", nargs="?", help="a registered mechanism (--list names them)")
    p.add_argument("--list", action="store_true", help="name the mechanisms and stop")
    p.add_argument("--trials", type=int, default=2000, help="runs on each of the two data sets (default 2000)")
    p.add_argument("--epsilon", type=float, default=None, help="the claimed epsilon to run it at (default 1.0)")
    p.add_argument(
        "--confidence",
        type=float,
        default=0.95,
        help="the probability that the bound is below a correct mechanism's epsilon (default 0.95)",
    )
    p.add_argument("--seed", type=int, default=0, help="master seed of the trials' fresh seeds (default 0)")
    p.add_argument(
        "--canaries",
        type=int,
        default=1000,
        help="dpsgd-<engine> only: canaries in its one training run (default 1000)",
    )
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")
    p.add_argument(
        "--plot",
        metavar="PNG",
        help="write the two output histograms and the ROC to this PNG "
        "(dpsgd-<engine>: the canaries' scores, in and out, and their ROC)",
    )
    p.set_defaults(func=_run)


def _run(args):
    from sage_tfx.auditing import (
        DEFAULT_EPSILON,
        AuditConfigError,
        audit_privacy,
        describe_audits,
        write_plot,
    )

    if args.list:
        for name, about in describe_audits().items():
            print(f"{name}: {about}")
        return EXIT_OK
    if not args.mechanism:
        print("sage audit-privacy: name a MECHANISM (sage audit-privacy --list names them)", file=sys.stderr)
        return EXIT_BAD_INPUT
    epsilon = DEFAULT_EPSILON if args.epsilon is None else args.epsilon
    try:
        result = audit_privacy(
            args.mechanism,
            trials=args.trials,
            epsilon=epsilon,
            confidence=args.confidence,
            seed=args.seed,
            canaries=args.canaries,
        )
    except AuditConfigError as exc:
        print(f"sage audit-privacy: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.plot:
        write_plot(result, args.plot)
    if args.json:
        print(json.dumps(result.to_dict(), indent=2, sort_keys=True))
    else:
        verdict = "VIOLATION: the lower bound exceeds the claim" if result.flagged else "no violation found"
        print(
            f"{result.mechanism}: claimed epsilon {result.claimed_epsilon:g} (delta {result.claimed_delta:g}); "
            f"empirical lower bound {result.epsilon_lower_bound:.4f} at confidence {result.confidence:g} "
            f"({result.describe()}): {verdict}"
        )
    return EXIT_VIOLATION if result.flagged else EXIT_OK
