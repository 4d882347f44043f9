"""DPLinearRegressor: linear regression with AdaSSP (sage_tfx.privacy.adassp).

Features are shifted by a public ``feature_center`` and clipped per row to ``feature_bound``; labels (or the
residual against a public prior) are clipped to a public range. Contract: exactly AdaSSP's guarantee,
(epsilon, delta)-DP under add/remove-one adjacency (three Gaussian releases, proof in sage_tfx.privacy.adassp);
``privacy_spent`` reports the DpEvent and (epsilon, delta); no row count is needed. Non-finite inputs map to
public defaults.

Bounds, centre, prior, non-finite inputs and seeds: docs/models.md ("DPLinearRegressor in detail").
"""

from __future__ import annotations

import math

import sage_tfx  # noqa: F401  # isort: skip
from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np
import tensorflow as tf  # noqa: TID253

from sage_tfx.models.data import FeatureLayout, labels_vector, split_input
from sage_tfx.models.export import export_saved_model
from sage_tfx.models.seeding import fit_seeds
from sage_tfx.privacy import adassp
from sage_tfx.privacy.adassp import INVALID, AdaSSPConfigError
from sage_tfx.privacy.checks import interval

if TYPE_CHECKING:
    import numpy.typing as npt
    import tensorflow_transform as tft

    from sage_tfx.models.data import Features


def _check_center(value):
    """The public feature centre as a 1-D float64 array (one value, or one per feature); finite."""
    return _finite_vector(
        value,
        "feature_center",
        " (a public centre: one number, or one per feature, e.g. 0.5 for features scaled to [0, 1])",
    )


def _finite_vector(value, what, fix=""):
    """``value`` as a non-empty 1-D float64 array of finite numbers, else an AdaSSPConfigError naming it."""
    try:
        vector = np.asarray(value, dtype=np.float64).reshape(-1)
    except (TypeError, ValueError):
        raise AdaSSPConfigError(f"{what}={value!r} is invalid: pass numbers{fix}") from None
    if vector.size == 0 or not np.all(np.isfinite(vector)):
        raise AdaSSPConfigError(f"{what}={value!r} is invalid: pass finite numbers{fix}")
    return vector


def _check_prior(prior_coef, prior_intercept, residual_range):
    """(prior_coef as an array or {name: array} or None, prior_intercept as float, residual_range or None)."""
    intercept = _finite_vector(prior_intercept, "prior_intercept")
    if intercept.size != 1:
        raise AdaSSPConfigError(f"prior_intercept={prior_intercept!r} is invalid: pass one number")
    has_prior = prior_coef is not None or float(intercept[0]) != 0.0
    if residual_range is None:
        if has_prior:
            raise AdaSSPConfigError(
                "a prior (prior_coef / prior_intercept) needs residual_range=(low, high): the "
                "public range each residual label - prior is clipped to"
            )
        return None, 0.0, None
    if not has_prior:
        raise AdaSSPConfigError(
            f"residual_range={residual_range!r} without a prior: pass prior_coef (and "
            "prior_intercept), or bound the label with label_range alone"
        )
    low, high = interval(residual_range, "residual_range", error=AdaSSPConfigError, message=INVALID)
    if isinstance(prior_coef, dict):
        coef = {str(k): _finite_vector(v, f"prior_coef[{k!r}]") for k, v in prior_coef.items()}
    elif prior_coef is None:
        coef = None
    else:
        coef = _finite_vector(prior_coef, "prior_coef")
    return coef, float(intercept[0]), (low, high)


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

    ``prior_coef`` ({feature name: coefficient}, or one number per column in the layout's order) and
    ``prior_intercept``, in the units of the features as given (before the centre) and of the label: a PUBLIC
    prior prediction. With a prior, ``residual_range=(low, high)`` (public, required) bounds the residual
    label - prior, each clipped to it (sage_tfx.privacy.adassp.prior_residuals: a fixed function of the
    record, so the sensitivities hold with B_y = (high - low) / 2); the released coefficients are the prior
    plus AdaSSP's fit of the residual (post-processing).
    """

    def __init__(
        self,
        privacy_budget: tuple[float, float],
        feature_bound: float,
        label_range: tuple[float, float],
        fit_intercept: bool = True,
        rho: float = 0.05,
        calibration: str = "exact",
        seed: int | None = None,
        feature_center: float | npt.ArrayLike = 0.0,
        *,
        prior_coef: Mapping[str, float] | npt.ArrayLike | None = None,
        prior_intercept: float = 0.0,
        residual_range: tuple[float, float] | None = None,
    ) -> None:
        """Check and keep the release's parameters (nothing is read or drawn before ``fit``).

        Args:
          privacy_budget: (epsilon, delta) of the whole release.
          feature_bound: B_x: each (centred) row is clipped to this L2 norm (public).
          label_range: (low, high): labels are clipped to it (public).
          fit_intercept: Add an intercept column (B_x becomes sqrt(feature_bound^2 + 1)).
          rho: AdaSSP's failure probability for its lambda_min bound.
          calibration: "exact" (default) or "paper" (the class docstring).
          seed: A seed for the noise, for tests; refused under DPTrainer (the grant's seed is used).
          feature_center: A public centre (one number, or one per feature) subtracted before clipping.
          prior_coef: A public prior's coefficients ({feature: coefficient}, or one per column).
          prior_intercept: The public prior's intercept.
          residual_range: (low, high) of the residual label - prior; required with a prior.

        Raises:
          AdaSSPConfigError: A parameter out of its range (named with the fix).
        """
        try:
            epsilon, delta = privacy_budget
        except (TypeError, ValueError):
            raise AdaSSPConfigError(f"privacy_budget={privacy_budget!r} is invalid: pass (epsilon, delta)") from None
        self.epsilon, self.delta = adassp._check_budget(epsilon, delta)
        self.feature_bound = adassp._check_positive(feature_bound, "feature_bound")
        self.label_low, self.label_high = interval(label_range, "label_range", error=AdaSSPConfigError, message=INVALID)
        self.fit_intercept = bool(fit_intercept)
        self.rho = rho
        self.calibration = calibration
        adassp.noise_scales(self.epsilon, self.delta, 1.0, 1.0, 1, rho, calibration)  # validate early
        self.seed = seed
        self.feature_center = _check_center(feature_center)
        self.prior_coef, self.prior_intercept, self.residual_range = _check_prior(
            prior_coef, prior_intercept, residual_range
        )
        self.layout = None
        self.coef_ = None
        self.intercept_ = None
        self.privacy_spent = None
        self._model = None

    def _center_vector(self, dim):
        """The public centre as one number per column (``dim`` columns)."""
        center = self.feature_center
        if center.size not in (1, dim):
            raise AdaSSPConfigError(
                f"feature_center has {center.size} values for {dim} features: pass one "
                f"number, or one per feature in the order of {self.layout.keys}"
            )
        return np.broadcast_to(center, (dim,))

    def _center(self, matrix):
        """``matrix`` minus the public centre (one per column, or one for all), as float64."""
        return matrix.astype(np.float64) - self._center_vector(matrix.shape[1]).reshape(1, -1)

    def _design(self, matrix):
        clipped = adassp.clip_rows(self._center(matrix), self.feature_bound)
        if self.fit_intercept:
            clipped = np.concatenate([clipped, np.ones((len(clipped), 1))], axis=1)
        return clipped

    def fit(
        self, x: Features | tf.data.Dataset, y: npt.ArrayLike | None = None, chunk_rows: int = 200_000
    ) -> DPLinearRegressor:
        """Fit on (x, y) or a tf.data.Dataset of (features, label); return self.

        Non-finite features become 0.0 (``to_matrix``); labels keep theirs here and AdaSSP clips them
        (+-inf to the range's ends) and maps NaN to the centre (the midpoint), see docs/models.md.

        Args:
          x: The features: a matrix, {feature name: column}, or a tf.data.Dataset of (features, label).
          y: The labels (None when ``x`` holds them).
          chunk_rows: Rows summed per chunk into X'X and X'y (memory only; the release is the same).

        Returns:
          This regressor, fitted: ``coef_``, ``intercept_`` and ``privacy_spent`` set.

        Raises:
          TrainingSeedError: ``seed`` given inside a training seed block (DPTrainer), or the fit's budget
            is not the grant's share.
        """
        seeds = fit_seeds(self.seed, type(self).__name__, (self.epsilon, self.delta))  # seed=, share: refused
        x, y = split_input(x, y)
        self.layout = FeatureLayout.from_input(x)
        matrix = self.layout.to_matrix(x)
        labels = labels_vector(y, len(matrix), np.float64, default=None)
        label_mid = (self.label_low + self.label_high) / 2.0
        # the prior in the centred coordinates the design uses: rows @ w0 + (centre . w0 + b0)
        w0 = self._prior_vector()
        b0 = float(self._center_vector(self.layout.dim) @ w0) + self.prior_intercept
        low, high = self.residual_range or (self.label_low, self.label_high)  # no prior: the residual IS the label
        mid, half = (low + high) / 2.0, (high - low) / 2.0
        bound_x = math.sqrt(self.feature_bound**2 + (1.0 if self.fit_intercept else 0.0))
        dim = self.layout.dim + (1 if self.fit_intercept else 0)
        # X'X and X'y summed exactly on the release's grids: each row on the grid alone, the integers added
        grids = adassp.statistic_grids(self.epsilon, self.delta, bound_x, half, dim, self.rho, self.calibration)
        upper, vector = [0] * (dim * (dim + 1) // 2), [0] * dim
        for start in range(0, len(matrix), chunk_rows):  # bounded memory on large data
            rows = slice(start, start + chunk_rows)
            design = self._design(matrix[rows])
            label = np.clip(labels[rows], self.label_low, self.label_high)  # +-inf to the ends
            label = np.where(np.isnan(label), label_mid, label)  # NaN to the range's midpoint
            residual = adassp.prior_residuals(design[:, : self.layout.dim], label, w0, b0, low, high)
            a, b = adassp.grid_statistics(design, residual - mid, bound_x, half, grids)
            upper = [u + v for u, v in zip(upper, a)]
            vector = [u + v for u, v in zip(vector, b)]
        xtx, xty = adassp.statistics_on_grid(upper, vector, grids)
        # seeds.noise (None: a fresh key) keys the ChaCha20 generator of the exact discrete Gaussian draws
        result = adassp.release(
            xtx, xty, self.epsilon, self.delta, bound_x, half, self.rho, self.calibration, seeds.noise
        )
        theta = result.theta
        self.coef_ = w0 + theta[: self.layout.dim]
        self.intercept_ = (theta[-1] if self.fit_intercept else 0.0) + mid + b0
        self.privacy_spent = {
            "epsilon": result.epsilon,
            "delta": result.delta,
            "dp_event": result.dp_event,
            "noise_multiplier": result.noise_multiplier,
            "ridge": result.ridge,
            "calibration": result.calibration,
            "mechanism": "adassp (Wang 2018, Alg. 2)",
        }
        seeds.report_spent(self.privacy_spent)
        self._model = None
        return self

    def _prior_vector(self):
        """The prior coefficients as one number per column of the layout (zeros without a prior)."""
        dim, prior = self.layout.dim, self.prior_coef
        if prior is None:
            return np.zeros(dim)
        if not isinstance(prior, dict):
            if prior.size != dim:
                raise AdaSSPConfigError(
                    f"prior_coef has {prior.size} values for {dim} feature columns: pass one "
                    f"per column in the order of {self.layout.keys}, or a dict by feature name"
                )
            return prior
        unknown = sorted(set(prior) - set(self.layout.keys))
        if unknown:
            raise AdaSSPConfigError(f"prior_coef names {unknown}, not features of the model ({self.layout.keys})")
        parts = []
        for key, width in zip(self.layout.keys, self.layout.widths):
            value = prior.get(key, np.zeros(width))
            if value.size not in (1, width):
                raise AdaSSPConfigError(f"prior_coef[{key!r}] has {value.size} values for a feature of width {width}")
            parts.append(np.broadcast_to(value, (width,)))
        return np.concatenate(parts).astype(np.float64)

    def _require_fit(self):
        if self.coef_ is None:
            raise ValueError("the model is not fitted; call fit first")

    def predict(self, x: Features) -> np.ndarray:
        """Predictions; features are clipped to feature_bound exactly as in training (no privacy cost).

        Args:
          x: The features, as ``fit`` takes them (an array or a {feature: column} dict).

        Returns:
          float64 [n].

        Raises:
          ValueError: the model is not fitted.
        """
        self._require_fit()
        clipped = adassp.clip_rows(self._center(self.layout.to_matrix(x)), self.feature_bound)
        return clipped @ self.coef_ + self.intercept_

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

    def keras_model(self) -> tf.keras.Model:
        """A Keras model computing the same predictions (row clipping, then the linear map)."""
        self._require_fit()
        if self._model is None:
            bound = self.feature_bound
            center = self._center_vector(self.layout.dim).astype(np.float32).tolist()
            inputs = tf.keras.Input((self.layout.dim,))

            def clip(t):
                t = tf.where(tf.math.is_finite(t), t, tf.zeros_like(t)) - tf.constant(center)
                return t * tf.minimum(1.0, bound / tf.maximum(tf.norm(t, axis=1, keepdims=True), 1e-30))

            clipped = tf.keras.layers.Lambda(clip)(inputs)
            dense = tf.keras.layers.Dense(1)
            outputs = dense(clipped)
            self._model = tf.keras.Model(inputs, outputs)
            dense.set_weights([self.coef_.reshape(-1, 1).astype(np.float32), np.array([self.intercept_], np.float32)])
        return self._model

    def export(
        self, path: str, transform_output: str | tft.TFTransformOutput | None = None, label_key: str | None = None
    ) -> str:
        """Write a SavedModel with a ``serving_default`` signature (sage_tfx.models.export); no privacy cost.

        Args:
          path: The SavedModel directory to write.
          transform_output: None (the signature takes the features by name), or a tf.Transform output (it takes
            serialized tf.Examples through the transform graph).
          label_key: The raw label feature, left out of the parsed tf.Examples.

        Returns:
          ``path``.
        """
        return export_saved_model(
            path,
            self.keras_model(),
            self.layout,
            lambda out: {"predictions": tf.reshape(out, [-1])},
            transform_output,
            label_key,
        )
