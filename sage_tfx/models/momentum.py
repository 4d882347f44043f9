"""Debiased momentum for DP-SGD (Hong et al., "Dynamic Policies on Differentially Private Learning", seed 002:
Algorithm 2, Theorem 3.4).

``make_private(..., optimizer="debiased_momentum", momentum=beta)`` moves the weights by the debiased average
v_hat of the noisy gradients. Contract: it reads only the released noisy gradients and public constants, so it
is post-processing: the run's DpEvent and epsilon are the engine's, unchanged. ``debiased_momentum_steps`` is
the numpy reference of Algorithm 2 lines 6-8.

The update and its measured effect: docs/models.md ("Your own Keras model: make_private", debiased momentum).
"""

from __future__ import annotations

from typing import Any

import numpy as np

import sage_tfx  # noqa: F401  # isort: skip (sage_tfx before TensorFlow: tf.keras is Keras 2)
import tensorflow as tf  # noqa: TID253

DEBIASED_MOMENTUM = "debiased_momentum"

__all__ = ["DEBIASED_MOMENTUM", "DebiasedMomentum", "debiased_momentum_steps"]


def debiased_momentum_steps(gradients: np.ndarray, beta: float, learning_rate: float) -> np.ndarray:
    """Algorithm 2's updates eta * v_hat_{t+1}, t = 1..T, of the noisy gradients ``gradients[t - 1]``.

    Args:
        gradients: the privatised gradients g_1..g_T, shape (T, ...).
        beta: the momentum beta in [0, 1).
        learning_rate: eta (constant).

    Returns:
        The T updates (the weights move by minus each), shape of ``gradients``.
    """
    v = np.zeros_like(np.asarray(gradients[0], dtype=np.float64))
    out = []
    for t, g in enumerate(np.asarray(gradients, dtype=np.float64), start=1):
        v = beta * v + (1.0 - beta) * g
        out.append(learning_rate * v / (1.0 - beta**t))
    return np.array(out)


class DebiasedMomentum(tf.keras.optimizers.Optimizer):
    """Algorithm 2 as a Keras optimizer: w <- w - lr * v_{t+1} / (1 - beta^t), v_{t+1} = beta v_t + (1-beta) g_t.

    Args:
        learning_rate: eta > 0 (a number or a Keras schedule).
        beta: the momentum in [0, 1) (0: plain SGD).
        weight_decay: Keras' decoupled weight decay (reads no data), or None.
        name: the optimizer's name.
    """

    def __init__(
        self,
        learning_rate: float = 0.1,
        beta: float = 0.9,
        weight_decay: float | None = None,
        name: str = "DebiasedMomentum",
        **kwargs: Any,
    ) -> None:
        super().__init__(name=name, weight_decay=weight_decay, **kwargs)
        self._learning_rate = self._build_learning_rate(learning_rate)
        self.beta = float(beta)

    def build(self, var_list: list[tf.Variable]) -> None:
        """One velocity slot v per variable, zero (v_1 = 0)."""
        super().build(var_list)
        if getattr(self, "_built", False):
            return
        self.velocities = [self.add_variable_from_reference(model_variable=v, variable_name="v") for v in var_list]
        self._built = True

    def update_step(self, gradient: tf.Tensor | tf.IndexedSlices, variable: tf.Variable) -> None:
        """v <- beta v + (1 - beta) g; w <- w - lr v / (1 - beta^t), t = the 1-based step."""
        if isinstance(gradient, tf.IndexedSlices):
            gradient = tf.convert_to_tensor(gradient)
        lr = tf.cast(self.learning_rate, variable.dtype)
        beta = tf.cast(self.beta, variable.dtype)
        step = tf.cast(self.iterations + 1, variable.dtype)
        v = self.velocities[self._index_dict[self._var_key(variable)]]
        v.assign(beta * v + (1.0 - beta) * gradient)
        variable.assign_sub(lr * v / (1.0 - tf.pow(beta, step)))

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        config.update({"learning_rate": self._serialize_hyperparameter(self._learning_rate), "beta": self.beta})
        return config
