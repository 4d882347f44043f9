"""PrivIncReg2: private incremental regression in a random projection (Kasiviswanathan, Nissim, Jin, PODS 2017,
Section 5, Algorithm 3). Numpy only (scipy for the L1 lifting).

Rows are mapped to R^m (m << d) by a Gaussian Phi drawn from a public seed and rescaled to keep their clipped
norm, then go through PrivIncReg1's Tree Mechanism and descent; theta_t is lifted back to C. Contract: the
sensitivities, the charge and the (epsilon, delta) of PrivIncReg1 (``IncrementalRegressionParams``), with the
noise in dimension m; the lifting is post-processing.

Steps, privacy and utility: docs/release_strategies.md ("Incremental regression: the proofs", PrivIncReg2).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

import numpy as np

from sage_tfx.privacy.adassp import clip_rows
from sage_tfx.release.incremental_constraints import lift
from sage_tfx.release.incremental_regression import (
    STRATEGY,
    IncrementalRegression,
    IncrementalRegressionError,
    IncrementalRegressionParams,
    Reader,
    TreeRegressor,
    projected_gradient,
)

__all__ = ["ProjectedTreeRegressor", "ProjectedIncrementalRegression", "projection_matrix"]


def projection_matrix(sketch_dim: int, dim: int, seed: int) -> np.ndarray:
    """Phi: ``sketch_dim`` x ``dim``, i.i.d. N(0, 1 / sketch_dim), from the public ``seed`` alone.

    Args:
        sketch_dim: m, the projected dimension.
        dim: d, the number of features.
        seed: the public seed (it reads no data).
    """
    return np.random.default_rng(seed).normal(0.0, 1.0 / np.sqrt(sketch_dim), size=(sketch_dim, dim))


@dataclass
class ProjectedTreeRegressor:
    """PrivIncReg2 over the Tree Mechanism (no ledger): ``add(x, y, rng)`` takes block t's rows and returns theta_t.

    Args:
        params: the declared parameters (the charge is PrivIncReg1's: module docstring).
        dim: d, the number of features.
        sketch_dim: m in [1, d], the projected dimension.
        projection_seed: the public seed of Phi.
        tree: the m-dimensional tree (internal; built from the above).
    """

    params: IncrementalRegressionParams
    dim: int
    sketch_dim: int
    projection_seed: int = 0
    tree: TreeRegressor = field(init=False)

    def __post_init__(self):
        for name in ("dim", "sketch_dim", "projection_seed"):
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, np.integer))
                or value < (name != "projection_seed")
            ):
                raise IncrementalRegressionError(f"{name}={value!r} is invalid: give a whole number >= 1 (seed >= 0)")
        if self.sketch_dim > self.dim:
            raise IncrementalRegressionError(
                f"sketch_dim={self.sketch_dim!r} is invalid: at most dim={self.dim} (use PrivIncReg1 otherwise)"
            )
        self.phi = projection_matrix(self.sketch_dim, self.dim, self.projection_seed)
        self.tree = TreeRegressor(self.params, int(self.sketch_dim))

    @property
    def t(self) -> int:
        return self.tree.t

    def project_rows(self, x) -> np.ndarray:
        """z_i = (||x_i|| / ||Phi x_i||) Phi x_i of the rows clipped to B_x (||z_i|| = ||x_i||).

        Args:
            x: the block's rows, shape (rows, dim).
        """
        x = np.asarray(x, dtype=float)
        if x.ndim != 2 or x.shape[1] != self.dim:
            raise IncrementalRegressionError(f"block rows have shape {x.shape}: need (rows, {self.dim})")
        x = clip_rows(x, self.params.bound_x)
        z = x @ self.phi.T
        sketched = np.linalg.norm(z, axis=1)
        scale = np.where(sketched > 0, np.linalg.norm(x, axis=1) / np.where(sketched > 0, sketched, 1.0), 0.0)
        return z * scale[:, None]

    def check_room(self) -> None:
        """Refuse (HorizonExhausted) when all ``horizon`` blocks have arrived."""
        self.tree.check_room()

    def add(self, x, y, rng) -> np.ndarray:
        """Take block t + 1's rows, release its tree node (in R^m), return theta_{t+1} in C.

        Args:
            x: the block's rows, shape (rows, dim).
            y: one label per row.
            rng: the node's noise source (``randomness.as_secure_rng``).
        """
        self.tree.check_room()
        self.tree.add_leaf(self.tree.leaf(self.project_rows(x), y), rng)
        return self.regressor()

    def regressor(self) -> np.ndarray:
        """theta_t: the descent over Phi C on the noisy (Q_t, q_t), lifted to C (post-processing only)."""
        q_matrix, q_vector = self.tree.noisy_prefix()
        p = self.params
        theta = projected_gradient(
            self.phi.T @ q_matrix @ self.phi, self.phi.T @ q_vector, p.radius, p.iterations, p.constraint
        )
        return lift(self.phi, self.phi @ theta, p.constraint)


class ProjectedIncrementalRegression(IncrementalRegression):
    """PrivIncReg2 on a ledger stream: ``IncrementalRegression``'s charge-open-read-release order and charge (the
    same params: module docstring), the m-dimensional tree of ``ProjectedTreeRegressor``, grants' ``meta``
    naming PrivIncReg2 with ``sketch_dim`` and ``projection_seed``.

    Args:
        ledger: the privacy ledger charged.
        stream: the stream whose blocks arrive.
        pipeline: the pipeline charged.
        params: the declared parameters.
        dim: d, the number of features.
        reader: ``reader(grant) -> (x, y)``, called once per block after its charge.
        sketch_dim: m in [1, d].
        projection_seed: the public seed of Phi.
    """

    def __init__(
        self,
        ledger,
        stream: str,
        pipeline: str,
        params: IncrementalRegressionParams,
        *,
        dim: int,
        reader: Reader,
        sketch_dim: int,
        projection_seed: int = 0,
    ):
        super().__init__(ledger, stream, pipeline, params, dim=dim, reader=reader)
        projected = ProjectedTreeRegressor(params, dim, sketch_dim, projection_seed)
        self.sketch = {"sketch_dim": projected.sketch_dim, "projection_seed": projected.projection_seed}
        self.tree = projected  # type: ignore[assignment]  (the same add / t / check_room)
        text = json.dumps({"stream": stream, "pipeline": pipeline, **self.meta()}, sort_keys=True)
        self.fingerprint = f"{STRATEGY}:" + hashlib.sha256(text.encode()).hexdigest()

    def meta(self) -> dict:
        """PrivIncReg1's meta with the mechanism renamed and the projection's public parameters."""
        return {**self.params.meta(), "mechanism": "PrivIncReg2 (random projection, Tree Mechanism)", **self.sketch}
