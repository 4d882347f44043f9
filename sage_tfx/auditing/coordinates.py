"""A many-run white-box audit of DP-SGD inside ONE ``make_private`` fit: its coordinates are the runs.

The model is one bias-free linear unit on one-hot inputs (an ``Embedding(coordinates, 1)`` lookup: the same
function without the dense one-hot matrix), weights zero. Coordinate i owns exactly one possible record, its
Dirac canary (input i, label 100: its gradient stays clipped to exactly C and one-signed); a random half of the
canaries is in the data. With no bias, per-example clipping, a full batch (q = 1, so every canary is in every
step), noise drawn independently per coordinate, the noisy sum divided by the public expected batch size and
plain SGD (elementwise), weight i after the fit is a function of canary i's membership and coordinate i's noise
only: the coordinates are independent runs of the same one-dimensional DP-SGD mechanism, on D (canary out) and
on D' (canary in). ``core.audit_outputs`` turns them into the many-run bound (threshold chosen on one half,
Clopper-Pearson on the other). Contract: for an (epsilon, delta)-DP fit, P(bound > epsilon) <= 1 - confidence.

Unlike the one-run canary audit (``dpsgd``) this one is tight for the Gaussian mechanism: weight i is the
sufficient statistic of coordinate i's T Gaussian steps, so k fits of one share (their weights summed) are seen
as the sqrt(k)-fold signal-to-noise ratio they are. Why, and its limits: docs/privacy_auditing.md ("Coordinate
auditing").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from sage_tfx.privacy.dpsgd import ACCOUNTANTS

from .core import AuditConfig, AuditConfigError, AuditResult, audit_outputs
from .dpsgd import CANARY_LABEL, DPSGD_ENGINES, audit_fit, training_report

__all__ = ["CoordinateAudit", "CoordinateResult", "audit_dpsgd_coordinates", "coordinate_data", "fit_coordinates"]

DENSE_GRADIENT_CAP = 10_000_000  # vmap / loop make each example's gradient dense: batch x coordinates floats


@dataclass(frozen=True)
class CoordinateAudit:
    """The parameters of one coordinate audit (module docstring).

    Args:
        engine: ``make_private``'s ``per_example`` engine, one of ``DPSGD_ENGINES`` (vmap and loop hold every
            example's dense gradient: at most about 4,400 coordinates).
        coordinates: N, the runs (even, >= 40): N / 2 on D, N / 2 on D'.
        epsilon: the claimed epsilon (``make_private``'s ``privacy_budget`` and the training share).
        delta: the claimed delta.
        accountant: ``make_private``'s accountant calibrating sigma, ``"rdp"`` or ``"pld"``.
        epochs: ``make_private``'s epochs: the steps T, at q = 1.
        clip_norm: ``make_private``'s C.
        learning_rate: ``make_private``'s SGD rate.
        confidence: in (0, 1): the bound exceeds a correct fit's epsilon with probability <= 1 - confidence.
        seed: draws the membership and the training seed.
    """

    engine: str = "ghost"
    coordinates: int = 100_000
    epsilon: float = 1.0
    delta: float = 1e-2
    accountant: str = "pld"
    epochs: int = 1
    clip_norm: float = 1.0
    learning_rate: float = 1.0
    confidence: float = 0.95
    seed: int = 0

    def __post_init__(self):
        if self.engine not in DPSGD_ENGINES:
            raise AuditConfigError(f"engine {self.engine!r} must be one of {DPSGD_ENGINES}")
        if self.accountant not in ACCOUNTANTS:
            raise AuditConfigError(f"accountant {self.accountant!r} must be one of {ACCOUNTANTS}")
        n = self.coordinates
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 40 or n % 2:
            raise AuditConfigError(f"coordinates {n!r} must be an even integer >= 40 (half in, half out), e.g. 100000")
        if self.engine != "ghost" and n * (n // 2) > DENSE_GRADIENT_CAP:
            raise AuditConfigError(
                f"coordinates {n!r}: engine {self.engine!r} holds a dense gradient per example ({n // 2} x {n} "
                "floats); pass at most 4400 coordinates, or engine='ghost'"
            )
        if isinstance(self.epochs, bool) or not isinstance(self.epochs, (int, np.integer)) or self.epochs < 1:
            raise AuditConfigError(f"epochs {self.epochs!r} must be an integer >= 1 (one step each at q = 1)")
        AuditConfig(trials=n // 2, confidence=self.confidence, seed=self.seed)  # their checks
        if not (0.0 < self.epsilon <= 20.0 and 0.0 < self.delta < 1.0):
            raise AuditConfigError(
                f"(epsilon, delta) = ({self.epsilon!r}, {self.delta!r}): epsilon must be in (0, 20] and delta in "
                "(0, 1), e.g. (1.0, 1e-2)"
            )

    @property
    def num_examples(self) -> int:
        """The public row count and the batch size (q = 1): N / 2, the canaries in."""
        return self.coordinates // 2


@dataclass
class CoordinateResult(AuditResult):
    """One coordinate audit's outcome (``AuditResult``, each coordinate one trial), with the fits' report.

    Args:
        mechanism: ``dpsgd-coordinates``.
        claimed_epsilon: the claimed epsilon.
        claimed_delta: the claimed delta (subtracted in the bound).
        epsilon_lower_bound: the bound at ``confidence``.
        confidence: the bound's confidence.
        trials: the coordinates on each side (N / 2).
        seed: the audit's seed.
        test: the threshold test and its evaluation counts (``AuditResult``).
        outputs: the statistics, ``d`` (the coordinates out) and ``d_prime`` (in), in coordinate order.
        fit: what the fits reported (engine, noise multiplier, steps, sampling rate), how many releases were
            summed, and the configuration.
    """

    fit: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        return f"{2 * self.trials} coordinates of {self.fit.get('releases', 1)} fit(s), {self.trials} per side"

    def to_dict(self) -> dict[str, Any]:
        return {**super().to_dict(), "method": "coordinates", "coordinates": 2 * self.trials, "fit": dict(self.fit)}


def coordinate_data(audit: CoordinateAudit) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ids, y, included): the included canaries' coordinates (int32, one per row, in coordinate order), their
    labels, and which coordinates are in (exactly N / 2, a uniformly random half)."""
    rng = np.random.default_rng(np.random.SeedSequence([audit.seed, 2]))
    included = np.zeros(audit.coordinates, bool)
    included[rng.permutation(audit.coordinates)[: audit.num_examples]] = True
    ids = np.flatnonzero(included).astype(np.int32)[:, None]
    return ids, np.full((len(ids), 1), CANARY_LABEL, np.float32), included


def coordinate_model(audit: CoordinateAudit):
    """A bias-free linear unit on one-hot inputs, as an ``Embedding(coordinates, 1)`` lookup, zero weights."""
    import sage_tfx  # noqa: F401  (before TensorFlow: tf.keras is Keras 2)  # isort: skip
    import tensorflow as tf  # noqa: TID253

    return tf.keras.Sequential(
        [
            tf.keras.Input((1,), dtype="int32"),
            tf.keras.layers.Embedding(audit.coordinates, 1, embeddings_initializer="zeros"),
            tf.keras.layers.Flatten(),
        ]
    )


def make_coordinate_fit(audit: CoordinateAudit):
    """``make_private`` of a fresh ``coordinate_model`` at the claim, q = 1 (module docstring); call it inside
    the training block."""
    return audit_fit(coordinate_model(audit), audit, audit.num_examples, accountant=audit.accountant)


def fit_coordinates(audit: CoordinateAudit, ids: np.ndarray, y: np.ndarray) -> list:
    """The shipped release: ONE fit inside ``training_seed(seed, share=(epsilon, delta))`` as DPTrainer runs
    ``run_fn``; returns [its PrivateModel]."""
    from sage_tfx.models.seeding import derive_seed, training_seed

    with training_seed(derive_seed("coordinate audit", audit.seed, bits=63), share=(audit.epsilon, audit.delta)):
        private = make_coordinate_fit(audit)
        private.fit(ids, y)
    return [private]


def coordinate_weights(private) -> np.ndarray:
    """The fitted model's weight per coordinate (float64)."""
    model = getattr(private, "model", private)
    return np.asarray(model.layers[0].embeddings.numpy(), np.float64)[:, 0]


def coordinate_bound(audit: CoordinateAudit, releases: Sequence[Any], included: np.ndarray) -> CoordinateResult:
    """The bound from the released fits (PrivateModels or Keras models of ``coordinate_model``): statistic of
    coordinate i the sum of its weights over ``releases``; the coordinates out are the runs on D, those in on D'.

    Args:
        audit: the parameters.
        releases: the fits observed (one for the shipped path).
        included: which coordinates' canaries were in.
    """
    if not releases:
        raise AuditConfigError("releases must hold at least one fitted model")
    statistic = sum(coordinate_weights(r) for r in releases)
    if statistic.shape != (audit.coordinates,):
        raise AuditConfigError(f"the fits have {statistic.size} weights, not the {audit.coordinates} coordinates")
    config = AuditConfig(trials=audit.num_examples, confidence=audit.confidence, seed=audit.seed)
    base = audit_outputs(
        "dpsgd-coordinates", statistic[~included], statistic[included], audit.epsilon, audit.delta, config
    )
    fit = {
        "engine": audit.engine,
        "releases": len(releases),
        **training_report(releases[0]),
        "config": {k: v for k, v in asdict(audit).items() if k not in ("confidence", "seed")},
    }
    return CoordinateResult(**{**base.__dict__, "fit": fit})


def audit_dpsgd_coordinates(
    audit: CoordinateAudit | None = None,
    *,
    train: Callable[[CoordinateAudit, np.ndarray, np.ndarray], Sequence[Any]] = fit_coordinates,
) -> CoordinateResult:
    """Run the coordinate audit of ``make_private`` (module docstring): ``train(audit, ids, y)`` fits (default
    ONE fit under the claim's share, ``fit_coordinates``) and returns the releases observed; their weights,
    summed per coordinate, give the many-run bound. Parameters are checked before anything is trained.

    Args:
        audit: the parameters (default ``CoordinateAudit()``).
        train: fits and returns the releases (a planted bug's variant is passed here).
    """
    audit = audit or CoordinateAudit()
    ids, y, included = coordinate_data(audit)
    return coordinate_bound(audit, list(train(audit, ids, y)), included)
