"""Continual and sliding-window release of regularised ERM models (Watson et al., "Continual and Sliding Window
Release for Private Empirical Risk Minimization"; the paper seed 000).

A model is released at EVERY block arrival, forever, and every record's total privacy loss stays under a
constant. Time is counted in Sage blocks: the paper's unit b0 (= w0) is one block, and the objectives are
normalised by a DECLARED number of records per block ``m0`` (not by the data's own count, so the sensitivity
never depends on the data).

Base learner (the paper's Algorithms 1 and 3, output perturbation; ``private_erm``)
-------------------------------------------------------------------------------------
``w_hat = argmin_{||w|| <= R} (1/N) sum_i loss(w; x_i, y_i) + (lam/2) ||w - w_ref||^2``, N = (blocks used) * m0,
``w_ref`` an already released model (biased regularisation, PBERM) or 0; released as ``w_hat + Z`` with Z the
exact discrete Gaussian on a grid (``sage_tfx.privacy.samplers.grid_gaussian``), sigma fixed for the strategy.
Features are clipped to ||x||_2 <= 1 and labels to [-1, 1] ({-1, +1} for logistic regression), so on the ball
||w|| <= R:
  - logistic loss log(1 + exp(-y w.x)): Lipschitz L = 1, smooth beta = 1/4;
  - squared loss (w.x - y)^2 / 2: Lipschitz L = R + 1, smooth beta = 1.
Sensitivity (L2, add/remove one record): Delta = (1 + 4 xi) L / (lam N).
Proof sketch: the objective is lam-strongly convex; adding a record adds loss/N whose gradient has norm <= L/N,
so the exact minimisers move by <= L/(lam N) (Chaudhuri, Monteleoni and Sarwate 2011, Lemma 7; the paper's
Lemma A.1, with our lam/2 convention). The solver (projected gradient, step 1/beta_J) stops only when its
gradient mapping G satisfies ||G|| <= xi L / N; for a lam-strongly convex, beta_J-smooth objective
<G(w), w - w*> >= ||G||^2/(2 beta_J) + (lam/2)||w - w*||^2 (Nesterov, Thm 2.2.7), so ||w - w*|| <= 2||G||/lam
<= 2 xi L/(lam N) for each of the two neighbours: Delta <= L/(lam N) + 4 xi L/(lam N). ``w_ref`` is a released
(private) model, so it is a public input: post-processing. Guarantee of one release: rho-zCDP with
rho = Delta^2 / (2 sigma^2) (samplers.grid_gaussian: the grid keeps the continuous Gaussian's rho).

Cumulative release (the paper's Algorithm 4 with Algorithm 2 as its base; ``ContinualRelease``)
------------------------------------------------------------------------------------------------
At arrival t (1-based count of blocks seen): if t = 2^k, a base model on ALL t blocks (regularised to 0);
else, with t_g the last power of two and i = t - t_g: if i = 2^j, a model on the blocks since t_g regularised
toward the base model (it becomes the chain's f_c); otherwise a model on the newest block regularised toward
f_c. sigma = z (1 + 4 xi) L / (lam m0) for every release, so a release on 2^j blocks has noise multiplier
z 2^j. Per-record total (Theorem 4 and Theorem 1's geometric series, in zCDP; in units of 1/(2 z^2)):
block 0 is in the bases of sizes 1, 2, 4, ...: sum_k 4^-k < 4/3. A block b = 2^K - 1 > 0 arrives at a base
and is only in bases of sizes >= 2^K: <= (4/3) 4^-K <= 1/3. A block in epoch t_g = 2^K at offset
i = b - t_g + 1 is in the doubling updates of sizes 2^j >= i (2^j < t_g), in one block update iff i is not a
power of two, and in the later bases of sizes >= 2 t_g (sum (1/3) 4^-K); for i = 2^j0 the total is
(4/3)(4^-j0 - 4^-K) + (1/3) 4^-K <= 4/3 - 4^-K, for other i (>= 3) at most 1 + 1/12. So every record's
rho <= (4/3) / (2 z^2): the loss of ONE Gaussian mechanism with noise multiplier z_eff = z sqrt(3/4). (The
paper runs Algorithms 2 and 4 as two epsilon-DP mechanisms, 2 epsilon in all; the joint count here is
tighter.) This holds for every t: an infinite horizon.

Sliding window (a dyadic variant of the paper's Algorithm 5; ``SlidingWindowRelease``)
------------------------------------------------------------------------------------
Window w blocks, J = floor(log2 w). Every aligned dyadic bucket [a 2^j, (a+1) 2^j), j <= J, gets ONE model
when its last block arrives, trained on exactly its blocks with noise multiplier z 2^j, regularised toward the
most recent released model of the next larger level (post-processing). The window [t - w, t) is the disjoint
union of at most 2 J + 2 complete aligned buckets (the segment-tree cover); as the window slides, buckets
that leave are removed and completed ones added (Fig. 3's hierarchy of updates added and removed). The model
released at t is the fine-tuning chain over the cover, largest bucket first: each bucket's model is
re-centred on the chain so far by post-processing, ``chain = chain + (n_b/(n_b + n_chain)) (w_b - chain)``
(a size-weighted average of released models). A record lies in one bucket per level, so its loss is
sum_{j=0}^{J} 1/(z 2^j)^2 <= 4/(3 z^2) (the proof of Theorem 7's geometric series), i.e. one Gaussian with
1/z_eff^2 = sum_{j<=J} 4^-j / z^2. Old blocks are never read again once their buckets are complete.
This differs from Algorithm 5's refresh chain (which re-trains shifted buckets) and is stated as ours.

Charging (docs/release_strategies.md)
------------------------------------------------------
Each arriving block gets ONE grant, charged the whole per-record bound (epsilon, delta) BEFORE it is read,
``meta`` naming the strategy and its parameters. z_eff is calibrated to (epsilon, delta) with
``dp_accounting.mechanism_calibration.calibrate_dp_mechanism`` on an RDP accountant (valid for the zCDP
discrete Gaussian). Every release that reads a block opens that block's grant's ``training`` release with the
strategy's fingerprint bound to the block's registered content (``privacy.digests.bound_to_data``: the same
computation every time, which the ledger re-opens and never counts twice; other data is another computation,
refused).
"""
from __future__ import annotations

import enum
import hashlib
import json
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from sage_tfx.ingest.access import grant_blocks
from sage_tfx.privacy import checks, gaussian
from sage_tfx.privacy.digests import bound_to_data
from sage_tfx.privacy.errors import SageError
from sage_tfx.privacy.randomness import as_secure_rng
from sage_tfx.privacy.samplers import grid_gaussian
from sage_tfx.privacy.split import BudgetSplit
from sage_tfx.privacy.streams import require_row_unit
from sage_tfx.privacy.vocabulary import ChargeRule, Outcome, Stage
from sage_tfx.release.blessing import SERVING_MODEL_DIR, push_blessed, write_blessing

XI = 1e-6  # solver tolerance, relative to L/N (see the module docstring)
STAGE = Stage.TRAINING
MAX_ITERATIONS = 200_000


class ContinualReleaseError(SageError, ValueError):
    """Bad parameters or input for a continual release; raised before anything is charged or read."""


class Loss(enum.StrEnum):
    LOGISTIC = "logistic"
    SQUARED = "squared"


class Strategy(enum.StrEnum):
    CUMULATIVE = "continual-cumulative"
    SLIDING = "continual-sliding-window"


def lipschitz(loss: Loss, radius: float) -> float:
    """L of the loss on ||w|| <= radius with ||x|| <= 1, |y| <= 1."""
    return 1.0 if Loss(loss) is Loss.LOGISTIC else radius + 1.0


def smoothness(loss: Loss) -> float:
    """beta of the loss with ||x|| <= 1."""
    return 0.25 if Loss(loss) is Loss.LOGISTIC else 1.0


def _positive(name: str, value, fix: str) -> float:
    fix = fix.replace("{", "{{").replace("}", "}}")  # a literal in the message template
    return checks.positive(value, name, error=ContinualReleaseError, message="{what} {value!r} is invalid: " + fix,
                           not_number="{what} {value!r} is not a number: " + fix)


@dataclass(frozen=True)
class ReleaseParams:
    """What a continual release needs; every field is checked here, before anything is charged.

    ``epsilon``, ``delta``: the per-record bound charged on each block (its whole lifetime's loss).
    ``records_per_block`` m0: the declared normaliser (public). ``lam``: the ridge weight (lam/2 ||w - w_ref||^2).
    ``radius`` R: the parameter ball. ``loss``: logistic or squared. ``window``: blocks, for the sliding window.
    """

    epsilon: float
    delta: float
    records_per_block: int
    lam: float = 0.05
    radius: float = 10.0
    loss: Loss = Loss.LOGISTIC
    window: int | None = None

    def __post_init__(self):
        _positive("epsilon", self.epsilon, "give a finite epsilon > 0")
        d = self.delta
        if not isinstance(d, (int, float)) or not 0 < float(d) < 1:
            raise ContinualReleaseError(f"delta {d!r} is invalid: give 0 < delta < 1 (the Gaussian needs delta > 0)")
        m0 = self.records_per_block
        if isinstance(m0, bool) or not isinstance(m0, (int, np.integer)) or m0 < 1:
            raise ContinualReleaseError(f"records_per_block {m0!r} is invalid: give an integer >= 1 (the declared "
                                        "number of records per block)")
        _positive("lam", self.lam, "give a ridge weight lam > 0 (the strong convexity the sensitivity needs)")
        _positive("radius", self.radius, "give a parameter-ball radius R > 0")
        try:
            object.__setattr__(self, "loss", Loss(self.loss))
        except ValueError:
            raise ContinualReleaseError(f"loss {self.loss!r} is unknown: use one of "
                                        f"{', '.join(l.value for l in Loss)}") from None
        if self.window is not None:
            w = self.window
            if isinstance(w, bool) or not isinstance(w, (int, np.integer)) or w < 1:
                raise ContinualReleaseError(f"window {w!r} is invalid: give a window of >= 1 blocks")

    @property
    def lipschitz(self) -> float:
        return lipschitz(self.loss, self.radius)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["loss"] = self.loss.value
        return d


# ------------------------------------------------------------------ the base learner
def clip_features(x: np.ndarray, y: np.ndarray, loss: Loss) -> tuple[np.ndarray, np.ndarray]:
    """Rows clipped to ||x||_2 <= 1; labels to {-1, +1} (logistic: y > 0 is +1) or [-1, 1] (squared)."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64).reshape(-1)
    if x.ndim != 2 or x.shape[0] != y.shape[0]:
        raise ContinualReleaseError(f"features of shape {x.shape} and labels of shape {y.shape} do not match: "
                                    "give a 2-D (n, d) array and n labels")
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(y))):
        raise ContinualReleaseError("features or labels hold NaN or infinity: clean the block's records first")
    norms = np.linalg.norm(x, axis=1)
    x = x / np.maximum(norms, 1.0)[:, None]
    y = np.where(y > 0, 1.0, -1.0) if Loss(loss) is Loss.LOGISTIC else np.clip(y, -1.0, 1.0)
    return x, y


def _loss_grad(w, x, y, loss):
    z = x @ w
    if loss is Loss.LOGISTIC:
        m = y * z
        value = np.logaddexp(0.0, -m)
        g = -y * np.exp(-np.logaddexp(0.0, m))  # d/dz log(1 + e^{-yz}) = -y sigmoid(-yz)
    else:
        r = z - y
        value = 0.5 * r * r
        g = r
    return value, x.T @ g


def empirical_loss(w: np.ndarray, x: np.ndarray, y: np.ndarray, loss: Loss) -> float:
    """Mean loss (unregularised) of w on clipped (x, y)."""
    x, y = clip_features(x, y, loss)
    return float(np.mean(_loss_grad(np.asarray(w, dtype=np.float64), x, y, Loss(loss))[0])) if len(y) else math.nan


def _project(w, radius):
    n = np.linalg.norm(w)
    return w if n <= radius else w * (radius / n)


def solve_erm(x: np.ndarray, y: np.ndarray, *, normaliser: float, lam: float, radius: float, loss: Loss,
              reference: np.ndarray | None = None, tolerance: float | None = None) -> np.ndarray:
    """argmin_{||w|| <= R} (1/N) sum loss + (lam/2)||w - ref||^2, to gradient-mapping norm <= ``tolerance``.

    Non-private. Inputs must already be clipped (``clip_features``). The default tolerance is XI L / N, the
    one the sensitivity of ``private_erm`` assumes.
    """
    loss = Loss(loss)
    d = x.shape[1]
    ref = np.zeros(d) if reference is None else np.asarray(reference, dtype=np.float64)
    L = lipschitz(loss, radius)
    tol = XI * L / normaliser if tolerance is None else tolerance
    beta = smoothness(loss) * len(y) / normaliser + lam
    step = 1.0 / beta
    w = _project(ref.copy(), radius)
    # Accelerated projected gradient with constant momentum (strongly convex case); the stopping test is on
    # the gradient mapping at the iterate w itself, which is what the sensitivity proof needs.
    kappa = beta / lam
    momentum = (math.sqrt(kappa) - 1) / (math.sqrt(kappa) + 1)

    def grad(u):
        return _loss_grad(u, x, y, loss)[1] / normaliser + lam * (u - ref)

    v = w.copy()
    for _ in range(MAX_ITERATIONS):
        if np.linalg.norm(w - _project(w - step * grad(w), radius)) / step <= tol:
            return w
        w_next = _project(v - step * grad(v), radius)
        v = w_next + momentum * (w_next - w)
        w = w_next
    raise ContinualReleaseError(f"the ERM solver did not reach tolerance {tol:.3g} in {MAX_ITERATIONS} steps "
                                f"(condition number {kappa:.3g}): raise lam")


def sensitivity(params: ReleaseParams, blocks: int) -> float:
    """L2 sensitivity (1 + 4 xi) L / (lam N) of ``solve_erm`` on ``blocks`` blocks (N = blocks * m0)."""
    return (1 + 4 * XI) * params.lipschitz / (params.lam * blocks * params.records_per_block)


def private_erm(x: np.ndarray, y: np.ndarray, *, params: ReleaseParams, blocks: int, sigma: float, rng,
                reference: np.ndarray | None = None) -> np.ndarray:
    """The base learner (Algorithms 1/3, output perturbation): solve_erm + grid discrete Gaussian N(0, sigma^2).

    Sensitivity ``sensitivity(params, blocks)`` (module docstring); guarantee rho-zCDP with
    rho = Delta^2 / (2 sigma^2) on the records of the ``blocks`` blocks given (Bun and Steinke 2016 to (eps, delta)).
    """
    x, y = clip_features(x, y, params.loss)
    n_norm = blocks * params.records_per_block
    w = solve_erm(x, y, normaliser=n_norm, lam=params.lam, radius=params.radius, loss=params.loss,
                  reference=reference)
    return grid_gaussian(w, sensitivity(params, blocks), sigma, rng=rng, cells=w.size)  # a record moves every cell


# ------------------------------------------------------------------ accounting
def participation_sum(strategy: Strategy, window: int | None = None) -> float:
    """c with 1/z_eff^2 = c / z^2: a record's worst-case sum over its releases of 1/(z 2^j)^2, times z^2."""
    if Strategy(strategy) is Strategy.CUMULATIVE:
        return 4.0 / 3.0
    levels = int(math.floor(math.log2(window)))
    return sum(4.0 ** -j for j in range(levels + 1))


# ------------------------------------------------------------------ the strategies
Reader = Callable[[object], tuple[np.ndarray, np.ndarray]]  # grant -> (X, y) of its (single) block


@dataclass
class Released:
    """One released model: the arrival index t (1-based), the blocks it read, its kind and weights."""

    t: int
    blocks: list[str]
    kind: str
    weights: np.ndarray
    noise_blocks: int  # the release's data size in blocks (its noise multiplier is z * noise_blocks)


class _Base:
    strategy: Strategy

    def __init__(self, ledger, stream: str, pipeline: str, params: ReleaseParams, reader: Reader, *,
                 dim: int, validation_epsilon: float | None = None, test_fraction: float = 0.1):
        require_row_unit(ledger, stream, type(self).__name__)
        if validation_epsilon is not None:
            v = _positive("validation_epsilon", validation_epsilon, "give 0 < validation_epsilon <= epsilon")
            if v > params.epsilon:
                raise ContinualReleaseError(f"validation_epsilon {validation_epsilon!r} is larger than epsilon "
                                            f"{params.epsilon!r}: the parallel split charges max(training, "
                                            "validation); give validation_epsilon <= epsilon")
            if not 0 < float(test_fraction) < 1:
                raise ContinualReleaseError(f"test_fraction {test_fraction!r} is invalid: give 0 < fraction < 1")
        self.validation_epsilon, self.test_fraction = validation_epsilon, float(test_fraction)
        self.tests: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        if not isinstance(params, ReleaseParams):
            raise ContinualReleaseError(f"params {params!r} must be a ReleaseParams")
        if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)) or dim < 1:
            raise ContinualReleaseError(f"dim {dim!r} is invalid: give the number of features (>= 1)")
        self._check_window(params)
        self.ledger, self.stream, self.pipeline, self.params = ledger, stream, pipeline, params
        self.reader, self.dim = reader, int(dim)
        self.z_eff = gaussian.rdp_multiplier(params.epsilon, params.delta)
        self.z = self.z_eff * math.sqrt(participation_sum(self.strategy, params.window))
        self.sigma = self.z * sensitivity(params, 1)  # the same sigma for every release
        self.grants: dict[str, object] = {}
        self.data: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self.order: list[str] = []
        self.released: list[Released] = []
        self.reads: list[tuple[str, str]] = []  # (block, grant id) in read order (tests check the charge came first)

    def _check_window(self, params):
        pass

    @property
    def meta(self) -> dict:
        out = {"strategy": self.strategy.value, **self.params.to_dict(), "dim": self.dim}
        if self.validation_epsilon is not None:
            out.update(validation_epsilon=self.validation_epsilon, test_fraction=self.test_fraction)
        return out

    def _split(self):

        if self.validation_epsilon is None:
            return None
        return BudgetSplit(preprocessing=0.0, count=0.0, training=self.params.epsilon,
                           validation=self.validation_epsilon, delta=self.params.delta, rule=ChargeRule.PARALLEL.value)

    @property
    def fingerprint(self) -> str:
        text = json.dumps({"pipeline": self.pipeline, "stream": self.stream, **self.meta}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()

    def observe(self, block: str) -> Released:
        """Charge ``block``'s grant (the whole per-record bound), read it under that grant, release a model."""
        if block in self.grants:
            raise ContinualReleaseError(f"block {block!r} was already observed: give each block once, in order")
        grant = self.ledger.request(self.pipeline, self.stream, blocks=[block], epsilon=self.params.epsilon,
                                    delta=self.params.delta, meta=self.meta, split=self._split())
        self.grants[block] = grant
        self.order.append(block)
        self._open(block)  # before reading: the read is under this release
        x, y = self.reader(grant)
        self.reads.append((block, grant.id))
        x = np.asarray(x, dtype=np.float64)
        if x.ndim != 2 or x.shape[1] != self.dim:
            raise ContinualReleaseError(f"block {block!r} gave features of shape {x.shape}; expected (n, {self.dim})")
        x, y = clip_features(x, y, self.params.loss)
        if self.validation_epsilon is not None:  # a public per-record hash: a record is in one part only
            test = record_hash_fraction(x, y) < self.test_fraction
            self.tests[block] = (x[test], y[test])
            x, y = x[~test], y[~test]
        self.data[block] = (x, y)
        rel = self._step()
        self.released.append(rel)
        return rel

    def _open(self, block):
        grant = self.grants[block]
        self.ledger.release(grant, STAGE, bound_to_data(self.fingerprint, self.ledger, grant), self.params.epsilon,
                            self.params.delta)

    def _rng(self, t, purpose):
        first = self.grants[self.order[t - 1]]
        return as_secure_rng(self.ledger.private_seed(first.id, f"{self.strategy.value}/{purpose}/{t}"))

    def _train(self, t, blocks, reference, kind):
        for b in blocks:
            self._open(b)  # re-opens the block's grant's release (same computation): nothing counted twice
        x = np.concatenate([self.data[b][0] for b in blocks])
        y = np.concatenate([self.data[b][1] for b in blocks])
        w = private_erm(x, y, params=self.params, blocks=len(blocks), sigma=self.sigma,
                        rng=self._rng(t, kind), reference=reference)
        return Released(t, list(blocks), kind, w, len(blocks))

    def per_record_rho(self) -> dict[str, float]:
        """Each observed block's zCDP rho so far: the sum over releases that read it of Delta_j^2/(2 sigma^2)."""
        rho = {b: 0.0 for b in self.order}
        for rel in self._trained:
            for b in rel.blocks:
                rho[b] += sensitivity(self.params, rel.noise_blocks) ** 2 / (2 * self.sigma ** 2)
        return rho

    def rho_bound(self) -> float:
        """The rho of one Gaussian with multiplier z_eff: what each block was charged for (as (epsilon, delta))."""
        return 1.0 / (2 * self.z_eff ** 2)  # c Delta_1^2 / (2 sigma^2) with sigma = z Delta_1, z^2 = c z_eff^2


class ContinualRelease(_Base):
    """Cumulative continual release (the paper's Algorithm 4 over Algorithm 2's bases); see the module docstring.

    ``ContinualRelease(ledger, stream, pipeline, params, reader, dim=d)``; ``observe(block)`` per arrival returns
    the released model. Privacy: every record is (epsilon, delta)-DP over the infinite sequence of releases
    (per-record rho <= 1/(2 z_eff^2) * (1 + 4 xi)^2 with z_eff calibrated to (epsilon, delta); proof in the
    module docstring, the paper's Theorems 1 and 4).
    """

    strategy = Strategy.CUMULATIVE

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._trained: list[Released] = []
        self.base: np.ndarray | None = None
        self.chain: np.ndarray | None = None
        self.t_g = 0

    def _check_window(self, params):
        if params.window is not None:
            raise ContinualReleaseError(f"window {params.window!r} is for SlidingWindowRelease: the cumulative "
                                        "release uses all history (give window=None)")

    def _step(self) -> Released:
        t = len(self.order)
        if t & (t - 1) == 0:  # t = 2^k: a new base on all data
            rel = self._train(t, self.order, None, "base")
            self.base, self.chain, self.t_g = rel.weights, rel.weights, t
        else:
            i = t - self.t_g
            if i & (i - 1) == 0:  # i = 2^j: the blocks since t_g, regularised toward the base
                rel = self._train(t, self.order[self.t_g:], self.base, "doubling-update")
                self.chain = rel.weights
            else:  # the newest block, regularised toward the chain's model
                rel = self._train(t, self.order[-1:], self.chain, "block-update")
        self._trained.append(rel)
        return rel


def dyadic_cover(start: int, end: int, max_level: int) -> list[tuple[int, int]]:
    """[start, end) as disjoint aligned dyadic intervals [a 2^j, (a+1) 2^j), j <= max_level, largest first."""
    out, s = [], start
    while s < end:
        j = 0
        while j < max_level and s % (2 ** (j + 1)) == 0 and s + 2 ** (j + 1) <= end:
            j += 1
        out.append((s, s + 2 ** j))
        s += 2 ** j
    return sorted(out, key=lambda iv: -(iv[1] - iv[0]))


class SlidingWindowRelease(_Base):
    """Sliding-window release over the last ``params.window`` blocks (a dyadic variant of Algorithm 5).

    Each aligned dyadic bucket of <= 2^J blocks (J = floor(log2 w)) is trained once, when complete, regularised
    toward the newest model of the level above; the release at t combines the buckets covering [t - w, t).
    Privacy: every record is (epsilon, delta)-DP over all releases (module docstring; the paper's Theorem 7).
    Before t = w the window is the whole stream so far. A window larger than the declared horizon is refused.
    """

    strategy = Strategy.SLIDING

    def __init__(self, *args, horizon: int | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        if horizon is not None:
            if isinstance(horizon, bool) or not isinstance(horizon, (int, np.integer)) or horizon < 1:
                raise ContinualReleaseError(f"horizon {horizon!r} is invalid: give the stream's length in blocks")
            if self.params.window > horizon:
                raise ContinualReleaseError(f"window {self.params.window} is larger than the stream "
                                            f"({horizon} blocks): give a window <= {horizon}")
        self.levels = int(math.floor(math.log2(self.params.window)))
        self.buckets: dict[tuple[int, int], Released] = {}
        self.latest: dict[int, np.ndarray] = {}
        self._trained: list[Released] = []
        self.removed: list[tuple[int, int]] = []

    def _check_window(self, params):
        if params.window is None:
            raise ContinualReleaseError("window None is invalid: give the sliding window in blocks (>= 1)")

    def _step(self) -> Released:
        t = len(self.order)
        # 1. train the buckets completed by this arrival, largest first (they regularise the smaller ones)
        for j in range(self.levels, -1, -1):
            if t % (2 ** j) == 0:
                iv = (t - 2 ** j, t)
                rel = self._train(t, self.order[iv[0]:iv[1]], self.latest.get(j + 1), f"bucket-{j}")
                self.buckets[iv] = rel
                self.latest[j] = rel.weights
                self._trained.append(rel)
        # 2. drop the buckets that left the window; forget their blocks' records
        start = max(0, t - self.params.window)
        for iv in [iv for iv in self.buckets if iv[0] < start]:
            del self.buckets[iv]
            self.removed.append(iv)
        for b in self.order[:start]:
            self.data.pop(b, None)
        # 3. the release: the chain over the window's cover, largest bucket first (post-processing)
        cover = dyadic_cover(start, t, self.levels)
        chain, n_chain = None, 0
        for iv in cover:
            w_b, n_b = self.buckets[iv].weights, iv[1] - iv[0]
            chain = w_b if chain is None else chain + (n_b / (n_b + n_chain)) * (w_b - chain)
            n_chain += n_b
        return Released(t, self.order[start:t], "window", chain, 0)


# ------------------------------------------------------------------ reading Sage blocks, SLA check, pushing
def grant_reader(ledger, data_root: str, featurize: Callable[[list[bytes]], tuple[np.ndarray, np.ndarray]]
                 ) -> Reader:
    """A Reader that opens a grant's block through ``sage_tfx.ingest.access.grant_blocks`` (checked, charged
    grants only) and turns its tf.Example records into (X, y) with ``featurize``."""

    def read(grant):
        _, blocks = grant_blocks(ledger, data_root, grant)
        records = [r for blk in blocks for r in blk.records()]
        return featurize(records)

    return read


def record_hash_fraction(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """A public per-record number in [0, 1) from the record's own (clipped) values: the train/test split."""
    out = np.empty(len(y))
    for i in range(len(y)):
        digest = hashlib.sha256(x[i].tobytes() + y[i:i + 1].tobytes()).digest()
        out[i] = int.from_bytes(digest[:8], "big") / 2.0 ** 64
    return out


def check_sla(release: _Base, model: Released, validator) -> object:
    """The SLA check of Sage's iterator on a released model: ``validator`` (a ``sage_tfx.validation``
    DPLossValidator, its epsilon == the strategy's validation_epsilon) on the test part of the NEWEST block,
    under that block's grant's ``validation`` release (parallel split: each test record is used by this one
    check, so it loses validation_epsilon once). Losses are the model's log / squared losses."""
    if release.validation_epsilon is None:
        raise ContinualReleaseError("validation_epsilon None: build the release with validation_epsilon=... to "
                                    "run an SLA check (its grants then carry a parallel train/test split)")
    if not math.isclose(float(validator.epsilon), release.validation_epsilon, rel_tol=1e-12):
        raise ContinualReleaseError(f"validator epsilon {validator.epsilon!r} differs from validation_epsilon "
                                    f"{release.validation_epsilon!r}: give the validator that epsilon")
    block = release.order[model.t - 1]
    grant = release.grants[block]
    bound = bound_to_data(release.fingerprint, release.ledger, grant)
    fingerprint = hashlib.sha256((bound + "/sla/" + model.weights.tobytes().hex() +
                                  json.dumps(getattr(validator, "target", None))).encode()).hexdigest()
    release.ledger.release(grant, Stage.VALIDATION, fingerprint, release.validation_epsilon, 0.0)
    x, y = release.tests[block]  # none at all is validated too (noise only): no count of 0 in the result
    z = x @ model.weights
    losses = (np.logaddexp(0.0, -y * z) if release.params.loss is Loss.LOGISTIC else 0.5 * (z - y) ** 2)
    rng = as_secure_rng(release.ledger.private_seed(grant.id, f"sla/{model.t}"))
    return validator.validate(losses, rng=rng)


@dataclass(frozen=True)
class Pushed:
    """Where ``push_model`` put a released model: its Model artifact URI, its ModelBlessing URI, whether it was
    blessed, and the serving path it was pushed to (None: not pushed -- not blessed, or no serving dir)."""

    model_uri: str
    blessing_uri: str
    blessed: bool
    pushed_to: str | None


def push_model(push_dir: str, model: Released, result=None, serving_dir: str | None = None) -> Pushed:
    """Write ``model`` as a TFX Model artifact (push_dir/model-<t>/Format-Serving/: weights.npy, model.json) and
    its ModelBlessing (push_dir/blessing-<t>/, ``write_blessing``): blessed iff the SLA check ACCEPTed, or
    when no SLA check is set (``result`` None -- as a Pusher without a model_blessing input pushes every
    model). With ``serving_dir``, push it there (``push_blessed``: blessed models only, version t). A TFX
    Pusher given these two artifacts (tests/release/test_release_pusher.py) pushes exactly the same models."""

    model_uri = os.path.join(push_dir, f"model-{model.t:06d}")
    serving = os.path.join(model_uri, SERVING_MODEL_DIR)
    os.makedirs(serving, exist_ok=True)
    np.save(os.path.join(serving, "weights.npy"), model.weights)
    outcome = None if result is None else str(result.outcome)
    info = {"t": model.t, "blocks": model.blocks, "kind": model.kind, "sla_outcome": outcome}
    with open(os.path.join(serving, "model.json"), "w") as f:
        json.dump(info, f, indent=1)
    accepted = result is None or outcome == Outcome.ACCEPT
    blessing_uri = write_blessing(os.path.join(push_dir, f"blessing-{model.t:06d}"), model_uri, model.t, accepted,
                                  outcome=outcome)
    pushed = push_blessed(model_uri, blessing_uri, serving_dir, model.t) if serving_dir else None
    return Pushed(model_uri, blessing_uri, accepted, pushed)


def release_stream(ledger, data_root: str, stream: str, pipeline: str, params: ReleaseParams, *,
                   featurize: Callable[[list[bytes]], tuple[np.ndarray, np.ndarray]], dim: int,
                   blocks: Sequence[str] | None = None, validator=None, push_dir: str | None = None,
                   serving_dir: str | None = None, release: _Base | None = None
                   ) -> tuple[_Base, list[dict]]:
    """The entry point: release a model for every new block of ``stream`` (``blocks``, default the stream's
    blocks not yet observed, in ledger order), each charged before it is read; with ``validator`` every model
    goes through the SLA check (``check_sla``) and, with ``push_dir``, is written with its ModelBlessing
    (``push_model``: blessed only on ACCEPT) and, with ``serving_dir`` too, pushed there if blessed. A window in
    ``params`` selects SlidingWindowRelease. Pass the returned release back in as
    ``release`` on the next call to continue the same stream."""
    if serving_dir is not None and push_dir is None:
        raise ContinualReleaseError(f"serving_dir {serving_dir!r} needs push_dir: the models and their blessings "
                                    "are written there first (the artifacts a Pusher reads)")
    if release is None:
        cls = ContinualRelease if params.window is None else SlidingWindowRelease
        v_eps = None if validator is None else float(validator.epsilon)
        release = cls(ledger, stream, pipeline, params, grant_reader(ledger, data_root, featurize), dim=dim,
                      validation_epsilon=v_eps)
    if blocks is None:
        blocks = [b.id for b in ledger.blocks(stream) if b.id not in release.grants]
    out = []
    for block in blocks:
        model = release.observe(block)
        result = check_sla(release, model, validator) if validator is not None else None
        pushed = push_model(push_dir, model, result, serving_dir) if push_dir else None
        out.append({"t": model.t, "block": block, "kind": model.kind,
                    "sla": None if result is None else str(result.outcome),
                    "model": pushed and pushed.model_uri, "blessing": pushed and pushed.blessing_uri,
                    "blessed": pushed and pushed.blessed, "pushed": pushed and pushed.pushed_to})
    return release, out
