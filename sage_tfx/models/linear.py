"""DPLinearRegressor: linear regression with AdaSSP (sage_tfx.privacy.adassp).

Features are shifted by the public ``feature_center`` (default 0: none) and then
clipped per row to L2 norm ``feature_bound`` (B_x); labels to
``label_range=(low, high)`` and centred at its midpoint, so B_y = (high-low)/2.
With ``fit_intercept`` a constant-1 column is appended AFTER clipping, so the
rows AdaSSP sees have norm <= sqrt(B_x^2 + 1), the bound it is given. The bounds
and the centre must be public (chosen without looking at the private data).

Why a centre: AdaSSP's noise on X'X and its ridge both scale with B_x^2, so a
bound that fits the rows tightly is worth rows of data. Features scaled to
[0, 1] need B_x = sqrt(d); centred at 0.5 (``feature_center=0.5``) they lie in
[-0.5, 0.5]^d and B_x = sqrt(d)/2, a quarter of the noise and of the ridge on
the features (the intercept absorbs the shift). On the real NYC flights of 2013
(docs/your_pipeline.md, "A second data set") this took the DP model's held-out
MSE at 32 daily blocks from 648 to 451 min^2 (non-private: 339).

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


def _check_center(value):
    """The public feature centre as a 1-D float64 array (one value, or one per feature); finite."""
    try:
        center = np.asarray(value, dtype=np.float64).reshape(-1)
    except (TypeError, ValueError):
        raise ValueError(f"feature_center={value!r} is invalid: pass a number or one number per feature") from None
    if center.size == 0 or not np.all(np.isfinite(center)):
        raise ValueError(f"feature_center={value!r} is invalid: pass finite numbers (a public centre, e.g. 0.5 "
                         "for features scaled to [0, 1])")
    return center


class DPLinearRegressor:
    """Linear regression released by AdaSSP: (epsilon, delta)-DP, ``privacy_budget=(epsilon, delta)``.

    Sensitivities (add/remove one record): B_x^2 for lam_min(X'X) and for X'X, B_x * B_y for X'y, with
    B_x = sqrt(feature_bound^2 + 1) (intercept) or feature_bound, B_y = (high - low) / 2; the proof and
    the noise are in sage_tfx.privacy.adassp.

    ``feature_center``: a public number, or one per feature (in the layout's order), subtracted from each
    row before the row is clipped to ``feature_bound`` (a fixed function of the record and public
    constants, so the sensitivities above hold). ``calibration``: "exact" (default; the smallest Gaussian
    noise that makes the three releases (epsilon, delta)-DP, sage_tfx.privacy.adassp) or "paper" (Wang
    2018's constants, more noise for typical budgets: 1.6x at epsilon 0.34, delta 1e-8).
    """

    def __init__(self, privacy_budget, feature_bound, label_range, fit_intercept=True, rho=0.05,
                 calibration="exact", seed=None, feature_center=0.0):
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
        self.feature_center = _check_center(feature_center)
        self.layout = None
        self.coef_ = None
        self.intercept_ = None
        self.privacy_spent = None
        self._model = None

    def _center(self, matrix):
        """``matrix`` minus the public centre (one per column, or one for all), as float64."""
        center = self.feature_center
        if center.size not in (1, matrix.shape[1]):
            raise ValueError(f"feature_center has {center.size} values for {matrix.shape[1]} features: pass one "
                             f"number, or one per feature in the order of {self.layout.keys}")
        return matrix.astype(np.float64) - center.reshape(1, -1)

    def _design(self, matrix):
        clipped = adassp.clip_rows(self._center(matrix), self.feature_bound)
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
        clipped = adassp.clip_rows(self._center(self.layout.to_matrix(x)), self.feature_bound)
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
            center = np.broadcast_to(self.feature_center, (self.layout.dim,)).astype(np.float32).tolist()
            inputs = tf.keras.Input((self.layout.dim,))

            def clip(t):
                t = tf.where(tf.math.is_finite(t), t, tf.zeros_like(t)) - tf.constant(center)
                return t * tf.minimum(1.0, bound / tf.maximum(tf.norm(t, axis=1, keepdims=True), 1e-30))

            clipped = tf.keras.layers.Lambda(clip)(inputs)
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
