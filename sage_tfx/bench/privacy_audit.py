"""Privacy audit: empirical lower bound / claimed epsilon for every registered mechanism, planted-bug free.

Each mechanism of ``sage_tfx.auditing`` is audited with ``--trials`` runs on each neighbouring data set (fresh
seeds from ``--seed``) at claimed ``--epsilon``; the figures per mechanism are the lower bound at ``--confidence``,
the claim and their ratio (at most 1 for a correct mechanism, except with probability 1 - confidence; the
closer to 1 the tighter the audit). ``--slow`` adds the slow mechanisms (AdaSSP, the continual release) at
``--slow-trials``; ``--dpsgd`` the one-run canary audits of ``make_private`` on each engine (one training run
each, ``--canaries``) and the coordinate audit of one fit (``--coordinates``, claim (``--epsilon``, 1e-2)).
Method and limits: docs/privacy_auditing.md.
"""


def add_arguments(parser):
    parser.add_argument("--trials", type=int, default=10000, help="runs on each data set (default 10000)")
    parser.add_argument("--epsilon", type=float, default=1.0, help="claimed epsilon (default 1)")
    parser.add_argument("--confidence", type=float, default=0.95, help="confidence of the bounds (default 0.95)")
    parser.add_argument("--seed", type=int, default=0, help="master seed (default 0)")
    parser.add_argument("--slow", action="store_true", help="also the slow mechanisms")
    parser.add_argument("--slow-trials", type=int, default=400, help="runs per data set for the slow ones")
    parser.add_argument("--dpsgd", action="store_true", help="also make_private on each engine, one run each")
    parser.add_argument("--canaries", type=int, default=1000, help="canaries of the one-run DP-SGD audits")
    parser.add_argument(
        "--coordinates", type=int, default=100000, help="coordinates of the DP-SGD coordinate audit (default 100000)"
    )


def run(args):
    # lazy: the auditing package imports scipy.stats (about 0.9 s), which every `sage` command would pay through the
    # bench registry otherwise
    from sage_tfx.auditing import (  # noqa: PLC0415
        DPSGD_ENGINES,
        AuditConfig,
        audit,
        audit_privacy,
        mechanism,
        mechanism_names,
    )

    figures = {}
    fast = set(mechanism_names(include_slow=False))
    for name in mechanism_names(include_slow=args.slow):
        trials = args.trials if name in fast else args.slow_trials
        result = audit(
            mechanism(name, args.epsilon), AuditConfig(trials=trials, confidence=args.confidence, seed=args.seed)
        )
        figures[name] = {
            "claimed_epsilon": result.claimed_epsilon,
            "claimed_delta": result.claimed_delta,
            "epsilon_lower_bound": round(result.epsilon_lower_bound, 4),
            "ratio": round(result.ratio, 4),
            "flagged": result.flagged,
            "trials": trials,
        }
    for engine in DPSGD_ENGINES if args.dpsgd else ():
        one_run = audit_privacy(
            f"dpsgd-{engine}", epsilon=args.epsilon, confidence=args.confidence, seed=args.seed, canaries=args.canaries
        )
        figures[one_run.mechanism] = {
            "claimed_epsilon": one_run.claimed_epsilon,
            "claimed_delta": one_run.claimed_delta,
            "epsilon_lower_bound": round(one_run.epsilon_lower_bound, 4),
            "ratio": round(one_run.ratio, 4),
            "flagged": one_run.flagged,
            "canaries": one_run.canaries,
            "correct": one_run.correct,
        }
    if args.dpsgd:
        coordinates = audit_privacy(
            "dpsgd-coordinates",
            trials=args.coordinates // 2,
            epsilon=args.epsilon,
            confidence=args.confidence,
            seed=args.seed,
        )
        figures[coordinates.mechanism] = {
            "claimed_epsilon": coordinates.claimed_epsilon,
            "claimed_delta": coordinates.claimed_delta,
            "epsilon_lower_bound": round(coordinates.epsilon_lower_bound, 4),
            "ratio": round(coordinates.ratio, 4),
            "flagged": coordinates.flagged,
            "coordinates": 2 * coordinates.trials,
        }
    figures["flagged"] = sorted(n for n, f in figures.items() if f["flagged"])
    return figures
