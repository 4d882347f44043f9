"""DPLinearRegressor: linear regression with AdaSSP (sage_tfx.privacy.adassp).

Features are clipped per row to L2 norm ``feature_bound`` (B_x); labels to
``label_range=(low, high)`` and centred at its midpoint, so B_y = (high-low)/2.
With ``fit_intercept`` a constant-1 column is appended AFTER clipping, so the
rows AdaSSP sees have norm <= sqrt(B_x^2 + 1), the bound it is given. Both
bounds must be public (chosen without looking at the private data).

Privacy: exactly AdaSSP's, (epsilon, delta)-DP under add/remove-one adjacency
(three Gaussian releases; the proof is in sage_tfx.privacy.adassp).
``privacy_spent`` reports the DpEvent and (epsilon, delta). AdaSSP does not use
the row count, so no ``num_examples`` is needed.

Non-finite inputs (public defaults, fixed functions of the record: the bounds
above still hold): a NaN / +-inf feature entry becomes 0.0 before row clipping; a
label is clipped to ``label_range`` first (+-inf become its ends), and a NaN
label becomes the range's midpoint (0 after centring: it adds nothing to X'y).

Seeds: ``seed=None`` draws fresh OS entropy; inside
``sage_tfx.models.training_seed`` (DPTrainer) the noise comes from the grant's
private seed and ``seed=`` is refused (sage_tfx.models.seeding).
"""
import math

import sage_tfx  # noqa: F401

import numpy as np
import tensorflow as tf

from sage_tfx.models.data import FeatureLayout, labels_vector, split_input
from sage_tfx.models.export import export_saved_model
from sage_tfx.models.seeding import fit_seeds
from sage_tfx.privacy import adassp


class DPLinearRegressor:
    """Linear regression released by AdaSSP: (epsilon, delta)-DP, ``privacy_budget=(epsilon, delta)``.

    Sensitivities (add/remove one record): B_x^2 for lam_min(X'X) and for X'X, B_x * B_y for X'y, with
    B_x = sqrt(feature_bound^2 + 1) (intercept) or feature_bound, B_y = (high - low) / 2; the proof and
    the noise are in sage_tfx.privacy.adassp.
    """

    def __init__(self, privacy_budget, feature_bound, label_range, fit_intercept=True, rho=0.05,
                 calibration="paper", seed=None):
        try:
            epsilon, delta = privacy_budget
        except (TypeError, ValueError):
            raise ValueError(f"privacy_budget={privacy_budget!r} is invalid: pass (epsilon, delta)") from None
        self.epsilon, self.delta = adassp._check_budget(epsilon, delta)
        self.feature_bound = adassp._check_positive(feature_bound, "feature_bound")
        try:
            low, high = (float(v) for v in label_range)
        except (TypeError, ValueError):
            raise ValueError(f"label_range={label_range!r} is invalid: pass (low, high)") from None
        if not (math.isfinite(low) and math.isfinite(high) and high > low):
            raise ValueError(f"label_range={label_range!r} is invalid: need finite low < high")
        self.label_low, self.label_high = low, high
        self.fit_intercept = bool(fit_intercept)
        self.rho = rho
        self.calibration = calibration
        adassp.noise_scales(self.epsilon, self.delta, 1.0, 1.0, 1, rho, calibration)  # validate early
        self.seed = seed
        self.layout = None
        self.coef_ = None
        self.intercept_ = None
        self.privacy_spent = None
        self._model = None

    def _design(self, matrix):
        clipped = adassp.clip_rows(matrix.astype(np.float64), self.feature_bound)
        if self.fit_intercept:
            clipped = np.concatenate([clipped, np.ones((len(clipped), 1))], axis=1)
        return clipped

    def fit(self, x, y=None, chunk_rows=200_000):
        """Fit on (x, y) or a tf.data.Dataset of (features, label); return self.

        Non-finite features become 0.0 (``to_matrix``); labels keep theirs here and AdaSSP clips them
        (+-inf to the range's ends) and maps NaN to the centre (the midpoint), see the module docstring.
        """
        seeds = fit_seeds(self.seed, type(self).__name__)  # refuses seed= inside training_seed
        x, y = split_input(x, y)
        self.layout = FeatureLayout.from_input(x)
        matrix = self.layout.to_matrix(x)
        labels = labels_vector(y, len(matrix), np.float64, default=None)
        mid, half = (self.label_low + self.label_high) / 2.0, (self.label_high - self.label_low) / 2.0
        bound_x = math.sqrt(self.feature_bound ** 2 + (1.0 if self.fit_intercept else 0.0))
        dim = self.layout.dim + (1 if self.fit_intercept else 0)
        xtx, xty = np.zeros((dim, dim)), np.zeros(dim)
        for start in range(0, len(matrix), chunk_rows):  # bounded memory on large data
            rows = slice(start, start + chunk_rows)
            a, b = adassp.sufficient_statistics(self._design(matrix[rows]), labels[rows] - mid, bound_x, half)
            xtx += a
            xty += b
        result = adassp.release(xtx, xty, self.epsilon, self.delta, bound_x, half, self.rho, self.calibration,
                                np.random.default_rng(seeds.noise))
        theta = result.theta
        self.coef_ = theta[: self.layout.dim]
        self.intercept_ = (theta[-1] if self.fit_intercept else 0.0) + mid
        self.privacy_spent = {
            "epsilon": result.epsilon, "delta": result.delta, "dp_event": result.dp_event,
            "noise_multiplier": result.noise_multiplier, "ridge": result.ridge,
            "calibration": result.calibration, "mechanism": "adassp (Wang 2018, Alg. 2)",
        }
        self._model = None
        return self

    def _require_fit(self):
        if self.coef_ is None:
            raise ValueError("the model is not fitted; call fit first")

    def predict(self, x):
        """Predictions; features are clipped to feature_bound exactly as in training."""
        self._require_fit()
        clipped = adassp.clip_rows(self.layout.to_matrix(x).astype(np.float64), self.feature_bound)
        return clipped @ self.coef_ + self.intercept_

    def evaluate(self, x, y=None):
        """Non-private metrics (mse, mae) on the given data."""
        x, y = split_input(x, y)
        pred = self.predict(x)
        y = labels_vector(y, len(pred), np.float64)
        return {"mse": float(np.mean((pred - y) ** 2)), "mae": float(np.mean(np.abs(pred - y)))}

    def keras_model(self):
        """A Keras model computing the same predictions (row clipping, then the linear map)."""
        self._require_fit()
        if self._model is None:
            bound = self.feature_bound
            inputs = tf.keras.Input((self.layout.dim,))
            clipped = tf.keras.layers.Lambda(
                lambda t: t * tf.minimum(1.0, bound / tf.maximum(tf.norm(t, axis=1, keepdims=True), 1e-30))
            )(inputs)
            dense = tf.keras.layers.Dense(1)
            outputs = dense(clipped)
            self._model = tf.keras.Model(inputs, outputs)
            dense.set_weights([self.coef_.reshape(-1, 1).astype(np.float32),
                               np.array([self.intercept_], np.float32)])
        return self._model

    def export(self, path, transform_output=None, label_key=None):
        """Write a SavedModel with a ``serving_default`` signature; see sage_tfx.models.export."""
        return export_saved_model(path, self.keras_model(), self.layout,
                                  lambda out: {"predictions": tf.reshape(out, [-1])}, transform_output, label_key)
