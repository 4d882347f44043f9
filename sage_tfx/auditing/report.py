"""``audit_privacy``: audit a registered mechanism, DP-SGD in one run (``dpsgd-<engine>``) or by its coordinates
(``dpsgd-coordinates``), by name;
``write_plot``: an audit's two distributions (a many-run audit's outputs on D and D', a one-run audit's canary
scores in and out) and the ROC beside the claimed curve."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from sage_tfx.plots import pyplot, save_figure

from .coordinates import CoordinateAudit, audit_dpsgd_coordinates
from .core import AuditConfig, AuditConfigError, AuditResult, _rates, audit
from .dpsgd import DPSGD_ENGINES, CanaryAudit, OneRunResult, audit_dpsgd
from .estimators import ESTIMATOR_LEARNING_RATE, ESTIMATORS, audit_estimator
from .mechanisms import DEFAULT_EPSILON, describe_mechanisms, mechanism, mechanism_names
from .quantiles_beam import QUANTILES_BEAM, audit_quantiles_beam
from .transform_beam import audit_transform_beam
from .vocabulary_beam import VOCABULARY_BEAM, audit_vocabulary_beam
from .z_score_beam import Z_SCORE_BEAM, audit_z_score_beam

__all__ = ["audit_privacy", "audit_names", "describe_audits", "write_plot"]

ONE_RUN = {f"dpsgd-{engine}": engine for engine in DPSGD_ENGINES}
BEAM = "transform-dp-mean-beam"
COORDINATES = "dpsgd-coordinates"


def audit_names() -> list[str]:
    """Every name ``audit_privacy`` takes: the registered mechanisms, the DP-SGD and the estimators' audits."""
    return sorted(
        mechanism_names()
        + list(ONE_RUN)
        + [BEAM, VOCABULARY_BEAM, Z_SCORE_BEAM, QUANTILES_BEAM, COORDINATES]
        + list(ESTIMATORS)
    )


def describe_audits() -> dict[str, str]:
    """``audit_names()`` with one line each."""
    one_run = {
        name: f"make_private (DP-SGD, per_example={engine!r}): one training run with canaries, the "
        "(epsilon, delta) one-run bound (sage_tfx.auditing.dpsgd)"
        for name, engine in ONE_RUN.items()
    }
    beam = {
        BEAM: "dp_mean_per_key through tf.Transform on Beam's DirectRunner, each run seeded by a grant on a "
        "throwaway ledger; --trials keys (sage_tfx.auditing.transform_beam)",
        VOCABULARY_BEAM: "dp_compute_and_apply_vocabulary through tf.Transform on Beam's DirectRunner, each run "
        "seeded by a grant on a throwaway ledger; --trials values (sage_tfx.auditing.vocabulary_beam)",
        Z_SCORE_BEAM: "dp_scale_to_z_score on --trials features through tf.Transform on Beam's DirectRunner, each "
        "run seeded by a grant on a throwaway ledger; each feature's release against (eps, 0) "
        "(sage_tfx.auditing.z_score_beam)",
        QUANTILES_BEAM: "dp_quantiles (the median) on --trials features through tf.Transform on Beam's "
        "DirectRunner, each run seeded by a grant on a throwaway ledger; each feature's release against (eps, 0) "
        "(sage_tfx.auditing.quantiles_beam)",
    }
    coordinates = {
        COORDINATES: "make_private (DP-SGD, ghost, q = 1): ONE fit whose 2 x --trials coordinates are independent "
        "runs, each with a Dirac canary in for half of them; claim (epsilon, 1e-2), pld accountant "
        "(sage_tfx.auditing.coordinates)"
    }
    estimators = {
        name: f"{kind} fitted once through its public API, one training run with canaries, the one-run bound "
        "(sage_tfx.auditing.estimators)"
        for name, kind in ESTIMATORS.items()
    }
    return dict(sorted({**describe_mechanisms(), **one_run, **beam, **coordinates, **estimators}.items()))


def audit_privacy(
    name: str,
    *,
    trials: int = 2000,
    epsilon: float = DEFAULT_EPSILON,
    confidence: float = 0.95,
    seed: int = 0,
    canaries: int = 1000,
) -> AuditResult | OneRunResult:
    """Audit ``name`` at claimed ``epsilon``; the result's ``epsilon_lower_bound`` exceeds a correct mechanism's
    epsilon with probability at most 1 - ``confidence``. A registered mechanism: ``trials`` runs on each
    neighbour, fresh seeds from ``seed`` (``transform-dp-mean-beam``: ``trials`` keys, two Beam runs;
    ``transform-vocabulary-beam``: ``trials`` values; ``transform-z-score-beam``: ``trials`` features, each
    ``dp_scale_to_z_score`` at ``epsilon``; ``transform-quantiles-beam``: the same with ``dp_quantiles``;
    ``dpsgd-coordinates``: one ``make_private`` fit of
    2 x ``trials`` coordinates, ``CoordinateAudit``).
    ``dpsgd-<engine>``: one ``make_private`` training with ``canaries``
    canaries (a fifth of them guessed, at least 2), delta 1e-5 (``CanaryAudit``); ``dp-logistic-regressor``,
    ``dp-dnn-regressor``, ``dp-dnn-classifier``: the same, the estimator's own ``fit`` at learning rate
    ``ESTIMATOR_LEARNING_RATE`` (``audit_estimator``). Parameters are checked before any run.

    Args:
        name: one of ``audit_names()``.
        trials: runs per data set (the Beam audits: keys, values or features; the coordinate audit: coordinates
            per side).
        epsilon: the claim to run it at.
        confidence: in (0, 1).
        seed: the master seed.
        canaries: the one-run audits' canaries (>= 10).
    """
    if name in ONE_RUN or name in ESTIMATORS:
        if isinstance(canaries, bool) or not isinstance(canaries, int) or canaries < 10:
            raise AuditConfigError(f"canaries {canaries!r} must be an integer >= 10, e.g. 1000")
        one_run = CanaryAudit(
            engine=ONE_RUN.get(name, "ghost"),
            canaries=canaries,
            guesses=max(2, canaries // 10 * 2),
            real_rows=max(10, canaries // 2),
            batch_size=max(5, canaries // 2),
            epsilon=epsilon,
            confidence=confidence,
            seed=seed,
        )
        if name in ESTIMATORS:
            return audit_estimator(name, replace(one_run, learning_rate=ESTIMATOR_LEARNING_RATE))
        return audit_dpsgd(one_run)
    if name == COORDINATES:
        if isinstance(trials, bool) or not isinstance(trials, int) or trials < 20:
            raise AuditConfigError(f"trials {trials!r} must be an integer >= 20 (coordinates per side), e.g. 50000")
        return audit_dpsgd_coordinates(
            CoordinateAudit(coordinates=2 * trials, epsilon=epsilon, confidence=confidence, seed=seed)
        )
    config = AuditConfig(trials=trials, confidence=confidence, seed=seed)
    if name == BEAM:
        return audit_transform_beam(epsilon, config)
    if name == VOCABULARY_BEAM:
        return audit_vocabulary_beam(epsilon, config)
    if name == Z_SCORE_BEAM:
        return audit_z_score_beam(epsilon, config)
    if name == QUANTILES_BEAM:
        return audit_quantiles_beam(epsilon, config)
    return audit(mechanism(name, epsilon), config)


def _roc(d, d_prime, direction):
    """(FPR, TPR) of every threshold of "say D' iff direction * s > direction * t", on all the outputs."""
    fp, fn = _rates(d, d_prime, np.unique(np.concatenate([d, d_prime])), direction)
    return np.append(1.0, fp / d.size), np.append(1.0, 1.0 - fn / d_prime.size)


def write_plot(result: AuditResult | OneRunResult, path: str, title: str | None = None) -> None:
    """Write a PNG of an audit's two distributions and the ROC of its tests beside the claimed curve
    TPR = e^eps FPR + delta. Needs matplotlib.

    A many-run audit (``AuditResult``): the histograms of the statistic on D and on D' (left), the ROC of the
    threshold tests (right). A one-run audit (``OneRunResult``): the histograms of the canaries' scores, those
    included in the training run and those left out, with the guess cut-offs (the scores above the upper one
    are guessed in, below the lower one out) (left), and the ROC of "guess in iff score > t" over all canaries
    (right): one point per canary, so it is the run's empirical trade-off, not a bound.

    Args:
        result: what ``audit`` / ``audit_privacy`` / ``audit_dpsgd`` returned (with its outputs or scores).
        path: the PNG file to write.
        title: the figure's title; default names the mechanism, the bound, its confidence and the claim.
    """
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    if isinstance(result, OneRunResult):
        fpr, tpr = _one_run_panels(result, left)
        what = f"one run, {result.correct} of {result.guesses} guesses right"
    else:
        fpr, tpr = _many_run_panels(result, left)
        what = f"{result.test['negatives']} + {result.test['positives']} evaluation runs"
    right.plot(fpr, tpr, label="attack's tests")
    grid = np.linspace(0.0, 1.0, 200)
    right.plot(
        grid,
        np.minimum(1.0, np.exp(result.claimed_epsilon) * grid + result.claimed_delta),
        "--",
        label=f"claimed eps = {result.claimed_epsilon:g}",
    )
    right.set_xlabel("false positive rate")
    right.set_ylabel("true positive rate")
    right.legend()
    fig.suptitle(
        title
        or f"{result.mechanism}: empirical eps >= {result.epsilon_lower_bound:.3f} at "
        f"{result.confidence:.0%} (claimed {result.claimed_epsilon:g}; {what})"
    )
    save_figure(fig, path, dpi="figure")


def _many_run_panels(result: AuditResult, axes) -> tuple[np.ndarray, np.ndarray]:
    d, d_prime = result.outputs["d"], result.outputs["d_prime"]
    bins = np.histogram_bin_edges(np.concatenate([d, d_prime]), bins=60)
    axes.hist(d, bins=bins, alpha=0.5, label="D")
    axes.hist(d_prime, bins=bins, alpha=0.5, label="D' (one record added)")
    axes.set_xlabel("statistic of the release")
    axes.legend()
    return _roc(d, d_prime, result.test["direction"])


def _one_run_panels(result: OneRunResult, axes) -> tuple[np.ndarray, np.ndarray]:
    if result.scores is None or result.included is None:
        raise AuditConfigError(f"{result.mechanism!r}: the result carries no canary scores to plot")
    scores, included = result.scores, result.included.astype(bool)
    bins = np.histogram_bin_edges(scores, bins=60)
    axes.hist(scores[~included], bins=bins, alpha=0.5, label="canaries left out")
    axes.hist(scores[included], bins=bins, alpha=0.5, label="canaries trained on")
    ordered, half = np.sort(scores), result.guesses // 2
    if half:
        axes.axvline(ordered[-half], color="k", linestyle=":", label=f"guess cut-offs ({half} in, {half} out)")
        axes.axvline(ordered[half - 1], color="k", linestyle=":")
    axes.set_xlabel("canary score (minus its loss, or the white-box score)")
    axes.legend()
    return _roc(scores[~included], scores[included], 1)
