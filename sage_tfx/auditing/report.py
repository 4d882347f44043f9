"""``audit_privacy``: audit a registered mechanism by name; ``write_plot``: its two output histograms and the ROC."""
from __future__ import annotations

import numpy as np

from .core import AuditConfig, AuditResult, _rates, audit
from .mechanisms import DEFAULT_EPSILON, mechanism

__all__ = ["audit_privacy", "write_plot"]


def audit_privacy(name: str, *, trials: int = 2000, epsilon: float = DEFAULT_EPSILON, confidence: float = 0.95,
                  seed: int = 0) -> AuditResult:
    """Audit the registered mechanism ``name`` at claimed ``epsilon``: ``trials`` runs on each neighbour, fresh
    seeds from ``seed``; the result's ``epsilon_lower_bound`` exceeds a correct mechanism's epsilon with
    probability at most 1 - ``confidence``. Parameters are checked before any run."""
    config = AuditConfig(trials=trials, confidence=confidence, seed=seed)
    return audit(mechanism(name, epsilon), config)


def _roc(d, d_prime, direction):
    """(FPR, TPR) of every threshold of "say D' iff direction * s > direction * t", on all the outputs."""
    fp, fn = _rates(d, d_prime, np.unique(np.concatenate([d, d_prime])), direction)
    return np.append(1.0, fp / d.size), np.append(1.0, 1.0 - fn / d_prime.size)


def write_plot(result: AuditResult, path: str, title: str | None = None) -> None:
    """A PNG at ``path``: the histograms of the statistic on D and on D' (left) and the ROC of the threshold
    tests with the line of the claimed epsilon, TPR = e^eps FPR + delta (right). Needs matplotlib."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    d, d_prime = result.outputs["d"], result.outputs["d_prime"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    bins = np.histogram_bin_edges(np.concatenate([d, d_prime]), bins=60)
    left.hist(d, bins=bins, alpha=0.5, label="D")
    left.hist(d_prime, bins=bins, alpha=0.5, label="D' (one record added)")
    left.set_xlabel("statistic of the release")
    left.legend()
    fpr, tpr = _roc(d, d_prime, result.test["direction"])
    right.plot(fpr, tpr, label="threshold tests")
    grid = np.linspace(0.0, 1.0, 200)
    right.plot(grid, np.minimum(1.0, np.exp(result.claimed_epsilon) * grid + result.claimed_delta), "--",
               label=f"claimed eps = {result.claimed_epsilon:g}")
    right.set_xlabel("false positive rate")
    right.set_ylabel("true positive rate")
    right.legend()
    fig.suptitle(title or f"{result.mechanism}: empirical eps >= {result.epsilon_lower_bound:.3f} "
                          f"at {result.confidence:.0%} (claimed {result.claimed_epsilon:g})")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
