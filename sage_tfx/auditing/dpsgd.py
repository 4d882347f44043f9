"""One-run canary auditing of DP-SGD: ``make_private`` trained ONCE with m canaries, each included with
probability 1/2, its membership guesses turned into a lower bound on epsilon (Steinke, Nasr, Jagielski 2023).

``audit_dpsgd`` builds ordinary records and Dirac-gradient input-space canaries, trains once through
``make_private`` inside ``training_seed(seed, share=(epsilon, delta))`` as DPTrainer runs ``run_fn``, scores
each canary (minus its loss, or a caller's ``score``) and turns the fixed guesses into
``one_run_epsilon_lower_bound``. Contract: above the true epsilon of an (epsilon, delta)-DP training with
probability at most 1 - confidence; loose by design for a correct training, lifted above the claim by a planted
bug that removes the noise or lets a canary move more than one clipped gradient.

The experiment and why it is loose: docs/privacy_auditing.md ("One-run auditing").
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from .core import AuditConfigError, Verdict
from .one_run import guesses_from_scores, one_run_epsilon_lower_bound

__all__ = [
    "CanaryAudit",
    "OneRunResult",
    "audit_dpsgd",
    "canary_data",
    "linear_model",
    "loss_scores",
    "fit_once",
    "DPSGD_ENGINES",
]

DPSGD_ENGINES = ("ghost", "vmap", "loop")
CANARY_LABEL = 100.0  # far above every prediction: the canary's gradient stays clipped and one-signed
REAL_INTERCEPT = 5.0  # the ordinary records' labels sit above the bias-free model's predictions too


@dataclass(frozen=True)
class CanaryAudit:
    """The parameters of one one-run DP-SGD audit (module docstring).

    Args:
        engine: ``make_private``'s ``per_example`` engine, one of ``DPSGD_ENGINES``.
        canaries: m, the canaries (each in with probability 1/2).
        guesses: r, the guesses made (half "in", half "out"), at most m.
        real_rows: the ordinary records besides the canaries.
        features: their features (the canaries' own features come after).
        batch_size: ``make_private``'s expected batch size.
        epochs: ``make_private``'s epochs.
        clip_norm: ``make_private``'s C.
        learning_rate: ``make_private``'s SGD rate.
        epsilon: the claimed epsilon (``make_private``'s ``privacy_budget``).
        delta: the claimed delta.
        confidence: in (0, 1): the bound exceeds a correct training's epsilon with probability <= 1 - confidence.
        seed: draws the canaries' membership, the ordinary records and the training seed.
    """

    engine: str = "ghost"
    canaries: int = 1000
    guesses: int = 200
    real_rows: int = 500
    features: int = 4
    batch_size: int = 500
    epochs: float = 5.0
    clip_norm: float = 1.0
    learning_rate: float = 1.0
    epsilon: float = 1.0
    delta: float = 1e-5
    confidence: float = 0.95
    seed: int = 0

    def __post_init__(self):
        if self.engine not in DPSGD_ENGINES:
            raise AuditConfigError(f"engine {self.engine!r} must be one of {DPSGD_ENGINES}")
        for name in ("canaries", "guesses", "real_rows", "features", "batch_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise AuditConfigError(f"{name} {value!r} must be an integer >= 1")
        if self.guesses > self.canaries or self.guesses % 2:
            raise AuditConfigError(
                f"guesses {self.guesses!r} must be even and at most the {self.canaries} "
                "canaries (half are guessed in, half out)"
            )
        if not 0.0 < self.confidence < 1.0:
            raise AuditConfigError(f"confidence {self.confidence!r} must be a number in (0, 1), e.g. 0.95")
        if not (0.0 < self.epsilon <= 20.0 and 0.0 < self.delta < 1.0):
            raise AuditConfigError(
                f"(epsilon, delta) = ({self.epsilon!r}, {self.delta!r}): epsilon must be in "
                "(0, 20] and delta in (0, 1), e.g. (1.0, 1e-5)"
            )
        if isinstance(self.seed, bool) or not isinstance(self.seed, (int, np.integer)) or self.seed < 0:
            raise AuditConfigError(f"seed {self.seed!r} must be an integer >= 0")

    @property
    def num_examples(self) -> int:
        """The public row count the fit is calibrated for: the expected number of records."""
        return self.real_rows + self.canaries // 2

    @property
    def dimension(self) -> int:
        return self.features + self.canaries


@dataclass
class OneRunResult(Verdict):
    """One one-run audit's outcome. ``flagged``: the bound exceeds the claimed epsilon (a violation at
    ``confidence``).

    Args:
        mechanism: ``dpsgd-<engine>``.
        claimed_epsilon: the claimed epsilon.
        claimed_delta: the claimed delta.
        epsilon_lower_bound: the one-run bound at ``confidence``.
        confidence: the bound's confidence.
        canaries: m.
        guesses: r.
        correct: W, the correct guesses.
        seed: the audit's seed.
        fit: what the fit reported (engine, noise multiplier, steps, sampling rate) and the configuration.
        scores: each canary's score.
        included: each canary's membership.
    """

    mechanism: str
    claimed_epsilon: float
    claimed_delta: float
    epsilon_lower_bound: float
    confidence: float
    canaries: int
    guesses: int
    correct: int
    seed: int
    fit: dict[str, Any]
    scores: np.ndarray | None = field(default=None, repr=False)
    included: np.ndarray | None = field(default=None, repr=False)

    def describe(self) -> str:
        return f"one training run, {self.canaries} canaries, {self.correct} of {self.guesses} guesses right"

    def to_dict(self) -> dict[str, Any]:
        return {
            **self._verdict_dict(),
            "method": "one-run",
            "canaries": self.canaries,
            "guesses": self.guesses,
            "correct": self.correct,
            "fit": dict(self.fit),
        }


def canary_data(audit: CanaryAudit) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(x, y, included, canary_x, canary_y): the training rows (ordinary records and the included canaries,
    shuffled), which canaries are in, and every canary's row (docs/privacy_auditing.md, the DP-SGD driver)."""
    rng = np.random.default_rng(np.random.SeedSequence([audit.seed, 1]))
    included = rng.random(audit.canaries) < 0.5
    real_x = np.zeros((audit.real_rows, audit.dimension), np.float32)
    real_x[:, : audit.features] = rng.normal(size=(audit.real_rows, audit.features))
    real_y = (
        REAL_INTERCEPT
        + real_x[:, : audit.features] @ np.linspace(-1.0, 1.0, audit.features)
        + 0.1 * rng.normal(size=audit.real_rows)
    )
    canary_x = np.zeros((audit.canaries, audit.dimension), np.float32)
    canary_x[np.arange(audit.canaries), audit.features + np.arange(audit.canaries)] = 1.0
    canary_y = np.full(audit.canaries, CANARY_LABEL, np.float32)
    x = np.concatenate([real_x, canary_x[included]])
    y = np.concatenate([real_y.astype(np.float32), canary_y[included]])
    order = rng.permutation(len(x))
    return x[order], y[order, None], included, canary_x, canary_y[:, None]


def linear_model(audit: CanaryAudit):
    """One Dense unit without bias, zero initial weights, on ``audit.dimension`` inputs (a Keras graph network:
    every engine applies)."""
    import sage_tfx  # noqa: F401  (before TensorFlow: tf.keras is Keras 2)  # isort: skip
    import tensorflow as tf  # noqa: TID253

    return tf.keras.Sequential(
        [tf.keras.Input((audit.dimension,)), tf.keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros")]
    )


def loss_scores(model, canary_x: np.ndarray, canary_y: np.ndarray) -> np.ndarray:
    """Minus each canary's squared error under ``model`` (inference mode): the black-box membership score."""
    predictions = np.asarray(model(canary_x, training=False), np.float64)
    return -np.sum((predictions - canary_y) ** 2, axis=1)


def fit_once(audit: CanaryAudit, model, x: np.ndarray, y: np.ndarray):
    """Train ``model`` once through ``make_private`` inside a training block with the claim as its share (module
    docstring, step 2); return the PrivateModel."""
    from sage_tfx.models.seeding import derive_seed, training_seed

    private_seed = derive_seed("one-run audit", audit.seed, bits=63)
    with training_seed(private_seed, share=(audit.epsilon, audit.delta)):
        private = audit_fit(model, audit, audit.batch_size)
        private.fit(x, y)
    return private


def audit_fit(model, audit, batch_size: int, **options):
    """``make_private(model)`` at the audit's claim (its ``privacy_budget``), public count, C, epochs, SGD rate
    and engine, MSE, batch size ``batch_size``; ``options``: further ``make_private`` arguments."""
    from sage_tfx.models import make_private

    return make_private(
        model,
        privacy_budget=(audit.epsilon, audit.delta),
        num_examples=audit.num_examples,
        loss="mse",
        clip_norm=audit.clip_norm,
        batch_size=batch_size,
        epochs=audit.epochs,
        learning_rate=audit.learning_rate,
        per_example=audit.engine,
        **options,
    )


def training_report(private) -> dict[str, Any]:
    spent = getattr(private, "privacy_spent", None) or {}
    keys = ("implementation", "noise_multiplier", "steps", "sampling_rate", "epsilon", "delta")
    return {
        k: (float(spent[k]) if isinstance(spent[k], (float, np.floating)) else spent[k]) for k in keys if k in spent
    }


def audit_dpsgd(
    audit: CanaryAudit | None = None,
    *,
    model: Callable[[CanaryAudit], Any] = linear_model,
    train: Callable[..., Any] = fit_once,
    score: Callable[[Any, np.ndarray, np.ndarray], np.ndarray] = loss_scores,
) -> OneRunResult:
    """Run the one-run canary audit of ``make_private`` (module docstring): ONE training of ``model(audit)``
    by ``train(audit, model, x, y)`` (returns a PrivateModel or a Keras model), canaries scored by
    ``score(keras_model, canary_x, canary_y)``. Parameters are checked before anything is trained.

    Args:
        audit: the parameters (default ``CanaryAudit()``).
        model: builds the Keras model from the parameters.
        train: trains it once.
        score: scores the canaries (higher: more likely in).
    """
    audit = audit or CanaryAudit()
    x, y, included, canary_x, canary_y = canary_data(audit)
    trained = train(audit, model(audit), x, y)
    keras_model = getattr(trained, "model", trained)
    scores = np.asarray(score(keras_model, canary_x, canary_y), np.float64)
    if scores.shape != (audit.canaries,) or not np.all(np.isfinite(scores)):
        raise AuditConfigError(f"score must return {audit.canaries} finite numbers, one per canary")
    half = audit.guesses // 2
    correct, guesses = guesses_from_scores(scores, included, half, half)
    bound = one_run_epsilon_lower_bound(correct, guesses, audit.confidence, delta=audit.delta, canaries=audit.canaries)
    fit = {
        "engine": audit.engine,
        **training_report(trained),
        "config": {k: v for k, v in asdict(audit).items() if k not in ("confidence", "seed")},
    }
    return OneRunResult(
        f"dpsgd-{audit.engine}",
        float(audit.epsilon),
        float(audit.delta),
        float(bound) if math.isfinite(bound) else float("inf"),
        float(audit.confidence),
        int(audit.canaries),
        int(guesses),
        int(correct),
        int(audit.seed),
        fit,
        scores,
        included,
    )
