"""Debiased momentum for DP-SGD (Hong et al., "Dynamic Policies on Differentially Private Learning", seed 002:
Algorithm 2, Theorem 3.4).

The update. Given the privatised gradient g_t of step t = 1, 2, ... (the engine's clipped sum plus
N(0, (sigma_t C)^2 I), divided by the expected batch size), Algorithm 2 keeps
    v_1 = 0,  v_{t+1} = beta v_t + (1 - beta) g_t,  v_hat_{t+1} = v_{t+1} / (1 - beta^t),
and moves the weights by -eta_t v_hat_{t+1}. v_hat_{t+1} = sum_{i<=t} w_i g_i with
w_i = (1 - beta) beta^(t-i) / (1 - beta^t), weights that sum to 1: an average of the noisy gradients (its
noise variance shrinks by about (1 - beta) / (1 + beta) once t >> 1 / (1 - beta)), debiased at the start
where plain heavy-ball momentum would take only (1 - beta) of the first gradient.

Privacy. The optimizer reads nothing but the released noisy gradients g_1..g_t and public constants (beta,
eta, t): it is post-processing of the DP-SGD releases, so the run's DpEvent and epsilon are those of the
engine (any noise schedule or adaptive clip included), unchanged. ``make_private(..., optimizer=
"debiased_momentum", momentum=beta)`` selects it (``DEBIASED_MOMENTUM``); weight decay applies as for SGD.

``debiased_momentum_steps`` is the numpy reference of Algorithm 2 lines 6-8 (tests check the TF optimizer
against it).
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
