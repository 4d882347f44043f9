"""Private incremental linear regression by the Tree Mechanism (PrivIncReg1), one regressor per arriving block.

Kasiviswanathan, Nissim, Jin, "Private Incremental Regression" (PODS 2017), Algorithm 2 with the Tree Mechanism
of Algorithm 4. Numpy only. Over a declared horizon of T blocks, each block's clipped rows (||x|| <= B_x,
|y| <= B_y) enter at most L = floor(log2 T) + 1 tree nodes of noisy sums of (X'X, X'y), and theta_t is projected
gradient descent on the noisy prefix over the declared ball C. Contract: per record (add/remove), 2L Gaussian
releases of multiplier c (sensitivities B_x^2 and B_x B_y), calibrated by RDP so the whole horizon is
(epsilon, delta)-DP; each block is charged that bound once, at arrival, before it is read, and never re-read.

Mechanism, sensitivity, proof, ledger order and the deviation from the paper's descent: docs/release_strategies.md
("Incremental regression: the proofs").
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import cached_property

import numpy as np

from sage_tfx.privacy import checks
from sage_tfx.privacy.adassp import grid_statistics
from sage_tfx.privacy.curves import calibration_accountant
from sage_tfx.privacy.digests import bound_to_data
from sage_tfx.privacy.errors import SageError
from sage_tfx.privacy.randomness import as_secure_rng
from sage_tfx.privacy.samplers import grid_gaussian, grid_gaussian_params
from sage_tfx.privacy.vocabulary import Accounting, Stage
from sage_tfx.release.incremental_constraints import CONSTRAINTS, L2_BALL, project, project_ball

__all__ = [
    "IncrementalRegressionError",
    "HorizonExhausted",
    "IncrementalRegressionParams",
    "TreeRegressor",
    "IncrementalRegression",
    "ArrivalRelease",
    "tree_levels",
    "project_ball",
    "projected_gradient",
    "noise_ridge",
]

STRATEGY = "incremental_regression"
STAGE = Stage.TRAINING
_NODE_PURPOSE = "incremental-regression/tree-node"


class IncrementalRegressionError(SageError, ValueError):
    """A bad parameter or input of the incremental regression (raised before anything is charged)."""


class HorizonExhausted(SageError, ValueError):
    """All ``horizon`` blocks have arrived: the charge covered no more; start a new instance (a new horizon)."""


def tree_levels(horizon: int) -> int:
    """L = floor(log2 T) + 1: the most tree nodes one leaf (block) ever enters over a horizon of T blocks."""
    return int(horizon).bit_length()


def _positive(name: str, value) -> float:
    return checks.positive(
        value, name, error=IncrementalRegressionError, message="{what}={value!r} is invalid: give a finite number > 0"
    )


@dataclass(frozen=True)
class IncrementalRegressionParams:
    """The declared public parameters of one PrivIncReg1 instance (checked before anything is charged).

    Args:
        horizon: T, how many blocks it will ever take.
        epsilon: with ``delta``, the (epsilon, delta)-DP guarantee of each block over the whole horizon (the
            per-block charge).
        delta: see ``epsilon``; in (0, 1).
        bound_x: B_x, rows are clipped to L2 norm <= B_x (public).
        bound_y: B_y, labels are clipped to [-B_y, B_y] (public).
        radius: R, the size of the constraint set the regressor is confined to.
        iterations: projected-gradient steps per release.
        constraint: the set C: "l2_ball" ({||theta||_2 <= R}, the default), "l1_ball" ({||theta||_1 <= R}) or
            "simplex" ({theta >= 0, sum theta <= R}); sage_tfx.release.incremental_constraints. Post-processing: the charge does not depend on it.
        ridge: descend on Q_t + lambda_t I instead of Q_t, lambda_t = ``noise_ridge`` (a public bound on the
            tree noise's operator norm): keeps the noisy quadratic convex when X'X is ill-conditioned (the taxi
            rows: docs/BENCHMARKS.md). Post-processing (lambda_t is a function of public values only).
    Raises:
        IncrementalRegressionError: a bad value (named) or a budget no noise multiplier meets.
    """

    horizon: int
    epsilon: float
    delta: float
    bound_x: float
    bound_y: float
    radius: float
    iterations: int = 200
    constraint: str = L2_BALL
    ridge: bool = False

    def __post_init__(self):
        if self.constraint not in CONSTRAINTS:
            raise IncrementalRegressionError(f"constraint={self.constraint!r} is invalid: choose one of {CONSTRAINTS}")
        if isinstance(self.horizon, bool) or not isinstance(self.horizon, (int, np.integer)) or self.horizon < 1:
            raise IncrementalRegressionError(f"horizon={self.horizon!r} is invalid: give an integer >= 1 (blocks)")
        if (
            isinstance(self.iterations, bool)
            or not isinstance(self.iterations, (int, np.integer))
            or self.iterations < 1
        ):
            raise IncrementalRegressionError(f"iterations={self.iterations!r} is invalid: give an integer >= 1")
        for name in ("epsilon", "bound_x", "bound_y", "radius"):
            object.__setattr__(self, name, _positive(name, getattr(self, name)))
        delta = _positive("delta", self.delta)
        if not delta < 1:
            raise IncrementalRegressionError(f"delta={self.delta!r} is invalid: need 0 < delta < 1 (e.g. 1e-6)")
        object.__setattr__(self, "delta", delta)
        object.__setattr__(self, "horizon", int(self.horizon))
        object.__setattr__(self, "iterations", int(self.iterations))
        self.noise_multiplier  # noqa: B018 -- calibrate now: an infeasible budget is refused before any charge

    @property
    def levels(self) -> int:
        return tree_levels(self.horizon)

    @cached_property
    def noise_multiplier(self) -> float:
        """Smallest c making 2L Gaussian releases of multiplier c (epsilon, delta)-DP (RDP accountant)."""
        import dp_accounting
        from dp_accounting import mechanism_calibration

        releases = 2 * self.levels
        guess = math.sqrt(2.0 * releases * math.log(1.25 / self.delta)) / self.epsilon

        def event(c):
            return dp_accounting.ComposedDpEvent([dp_accounting.GaussianDpEvent(noise_multiplier=c)] * releases)

        try:
            return float(
                mechanism_calibration.calibrate_dp_mechanism(
                    calibration_accountant,
                    event,
                    self.epsilon,
                    self.delta,
                    bracket_interval=mechanism_calibration.LowerEndpointAndGuess(guess * 1e-3, guess),
                    tol=guess * 1e-7,
                )
            )
        except (ValueError, RuntimeError) as exc:
            raise IncrementalRegressionError(
                f"epsilon={self.epsilon!r}, delta={self.delta!r}: no noise multiplier found ({exc}); "
                "give a larger budget"
            ) from None

    @property
    def dp_event(self):
        """What one block is charged on an RDP stream: 2L Gaussian releases of multiplier c."""
        import dp_accounting

        g = dp_accounting.GaussianDpEvent(noise_multiplier=self.noise_multiplier)
        return dp_accounting.ComposedDpEvent([g] * (2 * self.levels))

    def meta(self) -> dict:
        """The grant's ``meta``: the strategy and its parameters (signed into the grant by the ledger)."""
        return {
            "strategy": STRATEGY,
            "mechanism": "PrivIncReg1 (Tree Mechanism)",
            **asdict(self),
            "levels": self.levels,
            "noise_multiplier": self.noise_multiplier,
        }

    def fingerprint(self, stream: str, pipeline: str) -> str:
        """The instance's release fingerprint (bound to each block's content by the grant's release).

        Args:
            stream: the ledger stream's name.
            pipeline: the pipeline charged.
        """
        text = json.dumps({"stream": stream, "pipeline": pipeline, **self.meta()}, sort_keys=True)
        return f"{STRATEGY}:" + hashlib.sha256(text.encode()).hexdigest()


def projected_gradient(
    q_matrix: np.ndarray, q_vector: np.ndarray, radius: float, iterations: int, constraint: str = L2_BALL
) -> np.ndarray:
    """Projected gradient descent on g(theta) = 2 (Q theta - q) over C (``constraint`` of ``radius``), from 0.

    Step 1 / (2 ||Q||_2) (the noisy quadratic's smoothness constant; Q is symmetrised first), last iterate.
    Uses only its arguments: post-processing of released values.
    """
    q_matrix = 0.5 * (q_matrix + q_matrix.T)
    scale = float(np.linalg.norm(q_matrix, 2))
    theta = np.zeros(q_vector.shape[0])
    if scale <= 0.0:  # g = -2q: the ball's minimiser is R q / ||q|| (0 if q = 0)
        norm = float(np.linalg.norm(q_vector))
        return theta if norm == 0.0 else project(q_vector * (radius / norm), constraint, radius)
    step = 1.0 / (2.0 * scale)
    for _ in range(iterations):
        theta = project(theta - step * 2.0 * (q_matrix @ theta - q_vector), constraint, radius)
    return theta


def noise_ridge(params: IncrementalRegressionParams, nodes: int, dim: int) -> float:
    """lambda = 2 sqrt(d) c sqrt(nodes) B_x^2: about the operator norm of the symmetric noise of a prefix of
    ``nodes`` tree nodes (each cell std c B_x^2 per node; a d x d Wigner matrix of cell std s has norm ~ 2 s
    sqrt(d)). Public: c, B_x, d and the node count (popcount of t) only.

    Args:
        params: the instance's parameters (c, B_x).
        nodes: the noisy nodes summed in the prefix.
        dim: d.
    """
    return 2.0 * math.sqrt(dim) * params.noise_multiplier * math.sqrt(nodes) * params.bound_x**2


@dataclass
class _Node:
    exact: np.ndarray  # the exact range sum a_j (never released)
    noisy: np.ndarray  # its released noisy value b_j


@dataclass
class TreeRegressor:
    """The Tree Mechanism over (upper(x x^T), x y) leaves plus the projected-gradient release (no ledger).

    ``add(x, y, rng)`` takes block t's rows, releases the node ending at t with noise from ``rng`` (anything
    ``randomness.as_secure_rng`` takes; in production the grant's private seed) and returns theta_t.

    Args:
        params: the instance's declared parameters.
        dim: the number of features d.
        t: blocks taken so far (0 for a new tree).
        _nodes: the stored nodes by level (internal; empty for a new tree).
    """

    params: IncrementalRegressionParams
    dim: int
    t: int = 0
    _nodes: dict = field(default_factory=dict)  # level -> _Node, levels of t's binary expansion only

    def __post_init__(self):
        if isinstance(self.dim, bool) or not isinstance(self.dim, (int, np.integer)) or self.dim < 1:
            raise IncrementalRegressionError(f"dim={self.dim!r} is invalid: give the number of features (>= 1)")
        self._upper = np.triu_indices(self.dim)

    @property
    def stored_nodes(self) -> int:
        """Noisy nodes held now (each with its exact partial sum): popcount(t) <= floor(log2 T) + 1."""
        return len(self._nodes)

    @property
    def cells(self) -> int:
        return self._upper[0].size + self.dim

    def leaf(self, x, y) -> np.ndarray:
        """Block sum of the clipped rows: (upper triangle of X'X, X'y) as one vector, summed exactly on the node
        releases' grids (each row rounded to the grid alone: within gamma / 2 per row and cell of the float sum).

        Args:
            x: the block's rows, shape (rows, dim).
            y: one label per row.
        """

        x = np.asarray(x, dtype=float)
        y = np.asarray(y, dtype=float).reshape(-1)
        if x.ndim != 2 or x.shape[1] != self.dim or x.shape[0] != y.shape[0]:
            raise IncrementalRegressionError(
                f"block rows have shape {x.shape} with {y.shape[0]} labels: need (rows, {self.dim}) and one label "
                "per row"
            )
        # each row's (upper(x x'), x y), clipped, put on its release's grid alone and the integers summed exactly
        # (adassp.grid_statistics): gamma times an integer below 2^53, so every node's sum of leaves is exact in
        # float64 and its release adds the noise to those exact integers (never to a float64 sum of the rows)
        (gamma_m, _), (gamma_v, _) = self._grids()
        upper, vector = grid_statistics(x, y, self.params.bound_x, self.params.bound_y, (gamma_m, gamma_v))
        matrix = np.array(upper, dtype=np.float64) * gamma_m
        vector = np.array(vector, dtype=np.float64) * gamma_v
        return np.concatenate([matrix, vector])

    def _grids(self):
        """The (gamma, S) of the node releases' two parts (``samplers.grid_gaussian_params``): X'X's upper triangle
        (L2 sensitivity B_x^2, sigma c B_x^2) and X'y (B_x B_y, c B_x B_y)."""
        p, c, k = self.params, self.params.noise_multiplier, self._upper[0].size
        return (
            grid_gaussian_params(p.bound_x**2, c * p.bound_x**2, k),
            grid_gaussian_params(p.bound_x * p.bound_y, c * p.bound_x * p.bound_y, self.dim),
        )

    def check_room(self) -> None:
        if self.t >= self.params.horizon:
            raise HorizonExhausted(
                f"horizon={self.params.horizon} blocks exhausted: all {self.t} have arrived and each block's charge "
                "covered this horizon only; start a new IncrementalRegression with a new horizon"
            )

    def _release_node(self, value: np.ndarray, rng) -> np.ndarray:

        p, c, k = self.params, self.params.noise_multiplier, self._upper[0].size
        rng = as_secure_rng(rng, _NODE_PURPOSE)
        matrix = grid_gaussian(value[:k], p.bound_x**2, c * p.bound_x**2, rng, cells=k)
        vector = grid_gaussian(value[k:], p.bound_x * p.bound_y, c * p.bound_x * p.bound_y, rng, cells=self.dim)
        return np.concatenate([matrix, vector])

    def add_leaf(self, leaf: np.ndarray, rng) -> None:
        """Algorithm 4, steps 2-8 at t + 1: merge the levels below the lowest set bit, release that node.

        Args:
            leaf: block t + 1's summary (``leaf(x, y)``).
            rng: the node's noise source (``randomness.as_secure_rng``).
        """
        self.check_room()
        t = self.t + 1
        level = (t & -t).bit_length() - 1
        exact = leaf.copy()
        for j in range(level):
            exact += self._nodes.pop(j).exact
        self._nodes[level] = _Node(exact=exact, noisy=self._release_node(exact, rng))
        self.t = t

    def noisy_prefix(self) -> tuple[np.ndarray, np.ndarray]:
        """(Q_t, q_t): the sum of the noisy nodes of t's binary expansion, Q_t as a symmetric matrix."""
        total = np.zeros(self.cells)
        for node in self._nodes.values():
            total += node.noisy
        k = self._upper[0].size
        matrix = np.zeros((self.dim, self.dim))
        matrix[self._upper] = total[:k]
        matrix = matrix + np.triu(matrix, 1).T
        return matrix, total[k:]

    def regressor(self) -> np.ndarray:
        """theta_t: projected gradient descent on the noisy prefix (plus the ridge when ``params.ridge``)."""
        q_matrix, q_vector = self.noisy_prefix()
        if self.params.ridge:
            q_matrix = q_matrix + noise_ridge(self.params, self.stored_nodes, self.dim) * np.eye(self.dim)
        return projected_gradient(
            q_matrix, q_vector, self.params.radius, self.params.iterations, self.params.constraint
        )

    def add(self, x, y, rng) -> np.ndarray:
        """Take block t + 1's rows, release its tree node, return theta_{t+1}.

        Args:
            x: the block's rows, shape (rows, dim).
            y: one label per row.
            rng: the node's noise source (``randomness.as_secure_rng``).
        """
        self.check_room()
        self.add_leaf(self.leaf(x, y), rng)
        return self.regressor()


@dataclass(frozen=True)
class ArrivalRelease:
    """What one arrival released: theta_t after t blocks, under ``grant_id`` (block ``block``)."""

    t: int
    block: str
    grant_id: str
    theta: np.ndarray


Reader = Callable[[object], tuple]


class IncrementalRegression:
    """PrivIncReg1 on a ledger stream: one grant per arriving block, charged the whole-horizon bound first.

    ``reader(grant)`` returns the (x, y) rows of the grant's one block; it is called only after the grant is
    charged and its release opened (e.g. ``sage_tfx.ingest.access.grant_blocks(ledger, data_root, grant)``
    and a feature function). See the module docstring for what is charged and why.

    Args:
        ledger: the privacy ledger charged.
        stream: the stream whose blocks arrive.
        pipeline: the pipeline charged.
        params: the declared parameters.
        dim: the number of features d.
        reader: ``reader(grant) -> (x, y)``, called once per block after its charge.
    """

    def __init__(
        self, ledger, stream: str, pipeline: str, params: IncrementalRegressionParams, *, dim: int, reader: Reader
    ):
        if not isinstance(params, IncrementalRegressionParams):
            raise IncrementalRegressionError(f"params={params!r} is invalid: give an IncrementalRegressionParams")
        if not callable(reader):
            raise IncrementalRegressionError(f"reader={reader!r} is invalid: give a callable reader(grant) -> (x, y)")
        self.ledger, self.stream, self.pipeline, self.params = ledger, stream, pipeline, params
        self.accounting = str(ledger.stream(stream).accounting)
        self.tree = TreeRegressor(params, dim)
        self.reader = reader
        self.fingerprint = params.fingerprint(stream, pipeline)

    def meta(self) -> dict:
        """The grants' ``meta``: the mechanism and its parameters (signed into each grant by the ledger)."""
        return self.params.meta()

    def _charge(self, block: str):
        meta = self.meta()
        if self.accounting == Accounting.RDP:
            return self.ledger.request(
                self.pipeline, self.stream, blocks=[block], curve=self.params.dp_event, meta=meta
            )
        return self.ledger.request(
            self.pipeline, self.stream, blocks=[block], epsilon=self.params.epsilon, delta=self.params.delta, meta=meta
        )

    def arrive(self, block: str) -> ArrivalRelease:
        """Charge ``block`` the whole-horizon bound, open its release, read it, release theta_t.

        Args:
            block: the arriving block's id.
        Raises:
            HorizonExhausted: all ``horizon`` blocks have arrived (nothing charged).
        """
        self.tree.check_room()  # before any charge
        if not isinstance(block, str) or not block:
            raise IncrementalRegressionError(f"block={block!r} is invalid: give the block id (a string)")
        grant = self._charge(block)
        self.ledger.release(
            grant, STAGE, bound_to_data(self.fingerprint, self.ledger, grant), grant.epsilon, grant.delta
        )
        x, y = self.reader(grant)
        seed = self.ledger.private_seed(grant.id, _NODE_PURPOSE)
        theta = self.tree.add(x, y, seed)
        return ArrivalRelease(t=self.tree.t, block=block, grant_id=grant.id, theta=theta)
