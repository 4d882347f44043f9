"""`sage demo`: the README's main job (`make demo`)."""

import sys

from ._exits import EXIT_BAD_INPUT


def add_parser(subparsers):
    p = subparsers.add_parser(
        "demo", help="the main job: privacy-adaptive training on the real taxi data (the README's `make demo`)"
    )
    p.add_argument("--out", default="demo_out", help="output directory (ledger, data, TFX work, heat-map)")
    p.add_argument("--serving-dir", default="serving", help="where the ACCEPTed model is pushed")
    p.add_argument(
        "--target",
        type=float,
        default=None,
        help="accuracy target on the big-tipper label (default 0.8; the majority class reaches 0.735-0.78)",
    )
    p.add_argument("--runner", choices=("local", "beam"), default="local")
    p.add_argument(
        "--ledger-only",
        action="store_true",
        help="only the ledger demo (block composition on monthly blocks; seconds, no TensorFlow)",
    )
    p.set_defaults(func=_run)


def _run(args):
    if args.ledger_only:
        from sage_tfx.demos import ledger

        return ledger.run(args.out)
    from sage_tfx.demos import end_to_end

    target = end_to_end.DEFAULT_TARGET if args.target is None else args.target
    try:
        end_to_end.check_target(target)
    except ValueError as exc:
        print(
            f"sage demo: {exc}; the demo's SLA is accuracy on the big-tipper label: pass --target in (0, 1), "
            f"e.g. {end_to_end.DEFAULT_TARGET}",
            file=sys.stderr,
        )
        return EXIT_BAD_INPUT
    return end_to_end.run(args.out, args.serving_dir, target=target, runner=args.runner)
