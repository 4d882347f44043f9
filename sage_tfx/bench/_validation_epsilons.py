"""The Sage paper's §5.1 over epsilon (``sage bench validation --by-epsilon``): how often a plain TFX evaluator
ACCEPTs DP models that miss their target, against Sage SLA, at each fixed epsilon and per third of the target
range.

No SLA is what TFX's Evaluator does with a DP model: it compares the model's DP metric on the test rows with
the target, with no correction for the noise and no confidence. Sage SLA is the default joint test
(sage_tfx.validation.noisy). Both face the same models (same rows, same training noise); the iterations,
windows and held-out re-evaluation are Tab. 2's (``sage_tfx.bench.validation``).
"""

import numpy as np

from sage_tfx.plots import pyplot, save_figure
from sage_tfx.validation import clopper_pearson_upper

MODES = ("no_sla", "sage")
LABELS = {"no_sla": "No SLA (TFX evaluator on the DP metric)", "sage": "Sage SLA"}
BIN_NAMES = ("easy", "middle", "hard")  # thirds of the target range, from the naive metric to the best one


def settings(args, etas, epsilons):
    return {
        "trials": args.trials,
        "etas": etas,
        "epsilons": epsilons,
        "epsilon_use": "each iteration: the fixed epsilon for training and the same for validation",
        "schedule": "the window doubles at every iteration (train:test 90:10 per record)",
        "start_rows": args.start_rows,
        "max_iterations": args.max_iterations,
        "held_out_rows": args.holdout,
        "reference_rows": args.reference_rows,
        "seed": args.seed,
        "eta_schedule": "eta/(i(i+1)) at iteration i",
        "target_bins": "thirds of the way from the naive metric to the best: " + ", ".join(BIN_NAMES),
    }


def _rate(accepted, violations):
    return {
        "violation_rate": violations / accepted if accepted else None,
        "violations": violations,
        "accepted": accepted,
        "violation_rate_upper95": clopper_pearson_upper(violations, accepted, 0.05) if accepted else None,
    }


def summarize(counts, trials):
    """{eta: {mode: rate}} from ``run_task``'s counts, each with its accept rate and its rates per target third."""
    table = {}
    for (mode, eta), c in counts.items():
        row = _rate(c["accepted"], c["violations"])
        row["accept_rate"] = c["accepted"] / trials
        row["by_target"] = {name: _rate(*pair) for name, pair in zip(BIN_NAMES, c["by_target"])}
        table.setdefault(str(eta), {})[mode] = row
    return table


def plot(figures, tasks, etas, epsilons, path):
    """Per task: the false-ACCEPT rate against epsilon (log x) of No SLA and Sage SLA at each eta, with the 95%
    Clopper-Pearson upper limit as the bar above each point, and the eta lines."""
    plt = pyplot()
    fig, axes = plt.subplots(1, len(tasks), figsize=(6 * len(tasks), 4.2), squeeze=False)
    for ax, name in zip(axes[0], tasks):
        rows = figures[name]["by_epsilon"]
        for j, eta in enumerate(etas):
            for mode, marker in zip(MODES, "os"):
                cells = [rows[str(e)][str(eta)][mode] for e in epsilons]
                rates = np.array([c["violation_rate"] or 0.0 for c in cells])
                uppers = np.array([c["violation_rate_upper95"] or 0.0 for c in cells])
                ax.errorbar(
                    np.array(epsilons) * (1 + 0.03 * (j - (len(etas) - 1) / 2)),
                    rates,
                    yerr=[np.zeros_like(rates), np.maximum(0.0, uppers - rates)],
                    marker=marker,
                    capsize=3,
                    color=f"C{2 * j + MODES.index(mode)}",
                    label=f"{LABELS[mode]}, eta = {eta:g}",
                )
            ax.axhline(eta, color="grey", linestyle=":", linewidth=1)
        ax.set_xscale("log")
        ax.set(
            xlabel="epsilon (training and validation each)",
            ylabel="false-ACCEPT rate (among ACCEPTed)",
            title=f"{name} (GENERATED taxi rows)",
        )
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    save_figure(fig, path)
