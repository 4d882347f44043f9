"""DP-SGD models with an estimator-like surface: DPDNNRegressor, DPDNNClassifier, DPLogisticRegressor.

Each builds its network (``build_mlp``) and trains it through ``make_private`` (sage_tfx.models.private) with
the engine ``implementation`` names (sage_tfx.models.dpsgd_engine.ENGINES; default ``ghost``). Contract: Poisson
sampling at q = batch_size / num_examples, per-record clipping to ``clip_norm`` (sensitivity C under add/remove
one record) and Gaussian noise calibrated so that the run is ``privacy_budget``-DP; ``privacy_spent`` reports
the DpEvent and its (epsilon, delta). ``num_examples`` must be public or a DP count; ``evaluate`` is NOT private;
non-finite inputs map to public defaults, so a fit never fails because of a value.

Training, noise schedules, non-finite inputs and seeds: docs/models.md ("The DP-SGD estimators in detail").
"""

from __future__ import annotations

import sage_tfx  # noqa: F401  # isort: skip
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Self

import numpy as np
import tensorflow as tf  # noqa: TID253

from sage_tfx.models.data import FeatureLayout, class_labels, labels_vector, split_input
from sage_tfx.models.dpsgd_engine import _INVALID, ENGINES
from sage_tfx.models.export import export_saved_model
from sage_tfx.models.private import check_adaptive_clip, check_engine, check_momentum, make_private, refuse_unseeded
from sage_tfx.privacy import adaptive_clip, checks, dpsgd, noise_schedules
from sage_tfx.privacy.dpsgd import DpSgdConfigError

if TYPE_CHECKING:
    import numpy.typing as npt
    import tensorflow_transform as tft

    from sage_tfx.models.data import Features
    from sage_tfx.privacy.adaptive_clip import AdaptiveClip
    from sage_tfx.privacy.noise_schedules import NoiseSchedule

DEFAULT_ENGINE = "ghost"


def build_mlp(
    input_dim: int, hidden_units: Sequence[int], output_units: int, seed: int | None = None
) -> tf.keras.Model:
    """ReLU hidden layers and a linear output (logits or predictions)."""
    init = tf.keras.initializers.GlorotUniform(seed=seed)
    layers = [tf.keras.layers.Dense(u, activation="relu", kernel_initializer=init) for u in hidden_units]
    layers.append(tf.keras.layers.Dense(output_units, kernel_initializer=init))
    model = tf.keras.Sequential(layers)
    model.build((None, input_dim))
    return model


def _mse(y, out):
    return tf.square(tf.reshape(out, [-1]) - tf.reshape(y, [-1]))


def _sigmoid_xent(y, out):
    return tf.nn.sigmoid_cross_entropy_with_logits(labels=tf.reshape(y, [-1]), logits=tf.reshape(out, [-1]))


def _softmax_xent(y, out):
    return tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=out)


class _DPSGDEstimator:
    _label_dtype = np.float32

    def __init__(
        self,
        privacy_budget: tuple[float, float],
        num_examples: int | None = None,
        hidden_units: Sequence[int] = (),
        learning_rate: float = 0.01,
        epochs: float = 3,
        batch_size: int = 1024,
        clip_norm: float | str | AdaptiveClip = 1.0,
        momentum: float = 0.9,
        implementation: str = DEFAULT_ENGINE,
        accountant: str = "rdp",
        seed: int | None = None,
        *,
        noise_schedule: NoiseSchedule | str | Mapping[str, Any] | None = None,
    ) -> None:
        """Check and keep the fit's parameters (refused here, before anything is read or drawn).

        Args:
          privacy_budget: (epsilon, delta) of the whole fit.
          num_examples: A public or DP row count (never the exact private count; module docstring), or None
            to give it to ``fit``.
          hidden_units: Units per hidden ReLU layer (none: a linear model).
          learning_rate: SGD's learning rate.
          epochs: Passes over the data: steps = ceil(epochs * num_examples / batch_size).
          batch_size: The expected batch size (Poisson sampling at q = batch_size / num_examples).
          clip_norm: The per-example clip norm, or "adaptive" / an ``AdaptiveClip``.
          momentum: SGD's momentum.
          implementation: The DP-SGD engine (``dpsgd_engine.ENGINES``; default "ghost").
          accountant: "rdp" or "pld" (dp_accounting), for the calibration and the report.
          seed: A seed for tests; refused under DPTrainer (the grant's private seed is used).
          noise_schedule: A noise schedule, its kind, or its dict (default: constant).

        Raises:
          DpSgdConfigError: A parameter out of its range (named with the fix).
        """
        try:
            epsilon, delta = privacy_budget
        except (TypeError, ValueError):
            raise DpSgdConfigError(f"privacy_budget={privacy_budget!r} is invalid: pass (epsilon, delta)") from None
        self.epsilon, self.delta = dpsgd.check_budget(epsilon, delta)
        try:
            self.hidden_units = tuple(
                checks.integer(u, "hidden_units", low=1, error=DpSgdConfigError) for u in hidden_units
            )
        except (TypeError, DpSgdConfigError):
            raise DpSgdConfigError(
                f"hidden_units={hidden_units!r} is invalid: pass whole numbers, every layer needs >= 1 unit"
            ) from None
        checks.positive(learning_rate, "learning_rate", error=DpSgdConfigError, message=_INVALID)
        clip_norm = adaptive_clip.as_clip_norm(clip_norm)
        check_momentum(momentum)
        dpsgd.check_accountant(accountant)
        self.noise_schedule = noise_schedules.as_schedule(noise_schedule)
        check_engine(implementation, "implementation", ENGINES, clip_norm, self.noise_schedule)
        self.num_examples = num_examples
        # make_private's arguments (clip_norm: a float, or an AdaptiveClip)
        self.sgd = dict(
            clip_norm=clip_norm,
            batch_size=batch_size,
            epochs=epochs,
            optimizer="sgd",
            learning_rate=float(learning_rate),
            momentum=float(momentum),
            accountant=accountant,
            per_example=implementation,
            seed=seed,
            noise_schedule=self.noise_schedule,
        )
        self.model = None
        self.layout = None
        self.privacy_spent = None
        if num_examples is not None:  # refused here, nothing spent
            check_adaptive_clip(
                clip_norm, self.noise_schedule, self.epsilon, self.delta, num_examples, batch_size, epochs, accountant
            )

    # subclasses: output units, per-example loss, label handling, outputs
    def _output_units(self):
        return 1

    def _per_example_loss(self):
        return _mse

    def _labels(self, y, n):
        """The training labels: non-finite ones mapped to the public LABEL_DEFAULT (sage_tfx.models.data)."""
        return labels_vector(y, n, self._label_dtype)

    def fit(
        self,
        x: Features | tf.data.Dataset,
        y: npt.ArrayLike | None = None,
        num_examples: int | None = None,
        verbose: bool | int = False,
    ) -> Self:
        """Train on (x, y) or a tf.data.Dataset of (features, label); return self.

        ``num_examples``: the DP or public row count (see the module docstring);
        defaults to the constructor's. Mechanism: DP-SGD, per-example gradients
        clipped to L2 norm ``clip_norm`` (the sensitivity of each step's sum under
        add/remove-one), Gaussian noise of std ``noise_multiplier * clip_norm``,
        Poisson sampling; (epsilon, delta) = ``privacy_budget``. Non-finite
        features and labels are mapped to public defaults first (module docstring).
        """
        num_examples = self.num_examples if num_examples is None else num_examples
        if num_examples is None:
            raise DpSgdConfigError(
                "num_examples is required: pass the ledger's DP (or a public) row count, never the exact private count"
            )
        refuse_unseeded(self.sgd["per_example"], type(self).__name__, "implementation")
        private = make_private(
            self._network,
            privacy_budget=(self.epsilon, self.delta),
            num_examples=num_examples,
            loss=self._per_example_loss(),
            name=type(self).__name__,
            **self.sgd,
        )
        x, y = split_input(x, y)
        self.layout = FeatureLayout.from_input(x)
        features = self.layout.to_matrix(x)
        private.fit(features, self._labels(y, len(features)), verbose=verbose)
        self.model, self.privacy_spent = private.model, private.privacy_spent
        return self

    def _network(self, init_seed):
        """The MLP on the fitted layout's features, its weights initialised from ``init_seed`` (the fit's)."""
        return build_mlp(self.layout.dim, self.hidden_units, self._output_units(), init_seed)

    def _require_fit(self):
        if self.model is None:
            raise ValueError("the model is not fitted; call fit first")

    def _raw(self, x):
        self._require_fit()
        return self.model(self.layout.to_matrix(x), training=False)

    def export(
        self, path: str, transform_output: str | tft.TFTransformOutput | None = None, label_key: str | None = None
    ) -> str:
        """Write a SavedModel with a ``serving_default`` signature; see sage_tfx.models.export."""
        self._require_fit()
        return export_saved_model(path, self.model, self.layout, self._serving_outputs, transform_output, label_key)


class DPDNNRegressor(_DPSGDEstimator):
    """DNN regressor (ReLU hidden layers, squared loss) trained with DP-SGD.

    Spends ``privacy_budget=(epsilon, delta)`` (add/remove one record); see the
    module docstring for the mechanism, sampling and the ``num_examples`` rule.
    """

    def __init__(self, privacy_budget: tuple[float, float], hidden_units: Sequence[int], **kwargs: Any) -> None:
        """A DNN regressor trained with DP-SGD.

        Args:
          privacy_budget: (epsilon, delta) of the whole fit.
          hidden_units: Units per hidden ReLU layer.
          **kwargs: The DP-SGD estimators' other parameters: num_examples, learning_rate, epochs, batch_size,
            clip_norm, momentum, implementation, accountant, seed, noise_schedule (module docstring).

        Raises:
          DpSgdConfigError: A parameter out of its range (named with the fix).
        """
        super().__init__(privacy_budget, hidden_units=hidden_units, **kwargs)

    def predict(self, x: Features) -> np.ndarray:
        """The predicted values (post-processing of the DP weights: no privacy cost).

        Args:
          x: The features, as ``fit`` takes them (an array or a {feature: column} dict).

        Returns:
          float32 [n].
        """
        return self._raw(x).numpy().reshape(-1)

    def evaluate(self, x: Features, y: npt.ArrayLike | None = None) -> dict[str, float]:
        """Non-private metrics (mse, mae) on the given data: exact values, for public or held-out data only.

        Args:
          x: The features, as ``fit`` takes them (an array or a {feature: column} dict).
          y: The labels, or None when ``x`` is a tf.data.Dataset of (features, label).

        Returns:
          {"mse": ..., "mae": ...}.
        """
        x, y = split_input(x, y)
        pred = self.predict(x)
        y = labels_vector(y, len(pred), np.float64)
        return {"mse": float(np.mean((pred - y) ** 2)), "mae": float(np.mean(np.abs(pred - y)))}

    @staticmethod
    def _serving_outputs(out):
        return {"predictions": tf.reshape(out, [-1])}


class _Classifier(_DPSGDEstimator):
    _label_dtype = np.int32

    def predict_proba(self, x: Features) -> np.ndarray:
        raise NotImplementedError

    def predict(self, x: Features) -> np.ndarray:
        """Predicted class ids (post-processing of the DP weights: no privacy cost).

        Args:
          x: The features, as ``fit`` takes them (an array or a {feature: column} dict).

        Returns:
          int64 [n].
        """
        proba = self.predict_proba(x)
        return np.argmax(proba, axis=1)

    def evaluate(self, x: Features, y: npt.ArrayLike | None = None) -> dict[str, float]:
        """Non-private metrics (accuracy, log loss) on the given data: exact values, for public or held-out data only.

        Args:
          x: The features, as ``fit`` takes them (an array or a {feature: column} dict).
          y: The class ids, or None when ``x`` is a tf.data.Dataset of (features, label).

        Returns:
          {"accuracy": ..., "log_loss": ...}.
        """
        x, y = split_input(x, y)
        proba = self.predict_proba(x)
        y = class_labels(y, len(proba), proba.shape[1], np.int64)
        picked = np.clip(proba[np.arange(len(y)), y], 1e-12, 1.0)
        return {"accuracy": float(np.mean(np.argmax(proba, axis=1) == y)), "log_loss": float(-np.mean(np.log(picked)))}


class DPDNNClassifier(_Classifier):
    """DNN classifier (ReLU hidden layers, softmax cross-entropy) trained with DP-SGD.

    Labels are class ids 0..n_classes-1. Spends ``privacy_budget=(epsilon, delta)``.
    """

    def __init__(
        self, privacy_budget: tuple[float, float], hidden_units: Sequence[int], n_classes: int = 2, **kwargs: Any
    ) -> None:
        """A DNN classifier trained with DP-SGD.

        Args:
          privacy_budget: (epsilon, delta) of the whole fit.
          hidden_units: Units per hidden ReLU layer.
          n_classes: The number of classes (>= 2); labels are class ids 0..n_classes-1.
          **kwargs: The DP-SGD estimators' other parameters: num_examples, learning_rate, epochs, batch_size,
            clip_norm, momentum, implementation, accountant, seed, noise_schedule (module docstring).

        Raises:
          DpSgdConfigError: A parameter out of its range (named with the fix).
        """
        super().__init__(privacy_budget, hidden_units=hidden_units, **kwargs)
        self.n_classes = checks.integer(n_classes, "n_classes", low=2, error=DpSgdConfigError, message=_INVALID)

    def _output_units(self):
        return self.n_classes

    def _per_example_loss(self):
        return _softmax_xent

    def _labels(self, y, n):
        """Class ids: NaN / +-inf -> class 0 (public default); another non-class-id -> RecordError (no value)."""
        return class_labels(y, n, self.n_classes, np.int32)

    def predict_proba(self, x: Features) -> np.ndarray:
        """Class probabilities (post-processing of the DP weights: no privacy cost).

        Args:
          x: The features, as ``fit`` takes them (an array or a {feature: column} dict).

        Returns:
          float32 [n, n_classes].
        """
        return tf.nn.softmax(self._raw(x)).numpy()

    @staticmethod
    def _serving_outputs(out):
        return {"probabilities": tf.nn.softmax(out), "classes": tf.argmax(out, axis=1)}


class DPLogisticRegressor(_Classifier):
    """Binary logistic regression (labels 0/1) trained with DP-SGD.

    Spends ``privacy_budget=(epsilon, delta)``; see the module docstring.
    """

    _label_dtype = np.float32
    DEFAULT_BATCH_SIZE = 512  # the paper's Criteo LG config

    def __init__(self, privacy_budget: tuple[float, float], **kwargs: Any) -> None:
        """A logistic regression trained with DP-SGD (batch size 512 unless given).

        Args:
          privacy_budget: (epsilon, delta) of the whole fit.
          **kwargs: The DP-SGD estimators' other parameters but hidden_units: num_examples, learning_rate,
            epochs, batch_size, clip_norm, momentum, implementation, accountant, seed, noise_schedule.

        Raises:
          DpSgdConfigError: A parameter out of its range (named with the fix).
        """
        kwargs.setdefault("batch_size", self.DEFAULT_BATCH_SIZE)
        super().__init__(privacy_budget, hidden_units=(), **kwargs)

    def _per_example_loss(self):
        return _sigmoid_xent

    def _labels(self, y, n):
        """0/1 labels: NaN / +-inf -> 0 (public default); anything else but 0 or 1 -> RecordError (no value)."""
        return class_labels(y, n, 2, np.float32)

    def predict_proba(self, x: Features) -> np.ndarray:
        """The probabilities of classes 0 and 1 (post-processing of the DP weights: no privacy cost).

        Args:
          x: The features, as ``fit`` takes them (an array or a {feature: column} dict).

        Returns:
          float32 [n, 2].
        """
        p = tf.sigmoid(tf.reshape(self._raw(x), [-1])).numpy()
        return np.stack([1.0 - p, p], axis=1)

    @staticmethod
    def _serving_outputs(out):
        p = tf.sigmoid(tf.reshape(out, [-1]))
        return {"probabilities": p, "classes": tf.cast(p > 0.5, tf.int64)}
