"""Privacy audit: empirical lower bound / claimed epsilon for every registered mechanism, planted-bug free.

Each mechanism of ``sage_tfx.auditing`` is audited with ``--trials`` runs on each neighbouring data set (fresh
seeds from ``--seed``) at claimed ``--epsilon``; the figures per mechanism are the lower bound at ``--confidence``,
the claim and their ratio (at most 1 for a correct mechanism, except with probability 1 - confidence; the
closer to 1 the tighter the audit). ``--slow`` adds the slow mechanisms (AdaSSP, the continual release) at
``--slow-trials``. Method and limits: docs/privacy_auditing.md.
"""
from sage_tfx.auditing import AuditConfig, audit, mechanism, mechanism_names


def add_arguments(parser):
    parser.add_argument("--trials", type=int, default=10000, help="runs on each data set (default 10000)")
    parser.add_argument("--epsilon", type=float, default=1.0, help="claimed epsilon (default 1)")
    parser.add_argument("--confidence", type=float, default=0.95, help="confidence of the bounds (default 0.95)")
    parser.add_argument("--seed", type=int, default=0, help="master seed (default 0)")
    parser.add_argument("--slow", action="store_true", help="also the slow mechanisms")
    parser.add_argument("--slow-trials", type=int, default=400, help="runs per data set for the slow ones")


def run(args):
    figures = {}
    fast = set(mechanism_names(include_slow=False))
    for name in mechanism_names(include_slow=args.slow):
        trials = args.trials if name in fast else args.slow_trials
        result = audit(mechanism(name, args.epsilon),
                       AuditConfig(trials=trials, confidence=args.confidence, seed=args.seed))
        figures[name] = {"claimed_epsilon": result.claimed_epsilon, "claimed_delta": result.claimed_delta,
                         "epsilon_lower_bound": round(result.epsilon_lower_bound, 4),
                         "ratio": round(result.ratio, 4), "flagged": result.flagged, "trials": trials}
    figures["flagged"] = sorted(n for n, f in figures.items() if f["flagged"])
    return figures
