"""What both strategies share: each block's one grant charged before it is read, the release of every block a model
reads bound to its content, one sigma for every release (docs/release_strategies.md, "Continual and sliding-window
release: the proofs").
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from sage_tfx.privacy import gaussian
from sage_tfx.privacy.digests import bound_to_data
from sage_tfx.privacy.randomness import as_secure_rng
from sage_tfx.privacy.split import BudgetSplit
from sage_tfx.privacy.streams import require_row_unit
from sage_tfx.privacy.vocabulary import ChargeRule

from . import sampling
from .calibration import participation_sum
from .erm import clip_features, private_erm, sensitivity
from .params import STAGE, ContinualReleaseError, ReleaseParams, Sampling, Strategy, _positive

Reader = Callable[[object], tuple[np.ndarray, np.ndarray]]  # grant -> (X, y) of its (single) block


@dataclass
class Released:
    """One released model: the arrival index t (1-based), the blocks it read, its kind and weights."""

    t: int
    blocks: list[str]
    kind: str
    weights: np.ndarray
    noise_blocks: int  # its data size in blocks (noise multiplier z * noise_blocks; sampled: z on its Delta)
    rate: float = 1.0  # the Poisson sampling rate of its records (1: every record)


def record_hash_fraction(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """A public per-record number in [0, 1) from the record's own (clipped) values: the train/test split."""
    out = np.empty(len(y))
    for i in range(len(y)):
        digest = hashlib.sha256(x[i].tobytes() + y[i : i + 1].tobytes()).digest()
        out[i] = int.from_bytes(digest[:8], "big") / 2.0**64
    return out


class _Base:
    strategy: Strategy

    def __init__(
        self,
        ledger,
        stream: str,
        pipeline: str,
        params: ReleaseParams,
        reader: Reader,
        *,
        dim: int,
        validation_epsilon: float | None = None,
        test_fraction: float = 0.1,
    ):
        require_row_unit(ledger, stream, type(self).__name__)
        if validation_epsilon is not None:
            v = _positive("validation_epsilon", validation_epsilon, "give 0 < validation_epsilon <= epsilon")
            if v > params.epsilon:
                raise ContinualReleaseError(
                    f"validation_epsilon {validation_epsilon!r} is larger than epsilon "
                    f"{params.epsilon!r}: the parallel split charges max(training, "
                    "validation); give validation_epsilon <= epsilon"
                )
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
        self.sampled = params.sampling is Sampling.POISSON
        if self.sampled:  # each release (epsilon0, delta0)-DP before its sample; a record sums S of them (App. B)
            share = sampling.sampling_sum(self.strategy, params.window)
            self.epsilon0, self.delta0 = params.epsilon / share, params.delta / share
            self.z_eff = self.z = gaussian.rdp_multiplier(self.epsilon0, self.delta0)
        else:
            self.z_eff = gaussian.rdp_multiplier(params.epsilon, params.delta)
            self.z = self.z_eff * math.sqrt(participation_sum(self.strategy, params.window))
        self.sigma = self.z * sensitivity(params, 1)  # every release's sigma (unsampled), the smallest size's
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
        return BudgetSplit(
            preprocessing=0.0,
            count=0.0,
            training=self.params.epsilon,
            validation=self.validation_epsilon,
            delta=self.params.delta,
            rule=ChargeRule.PARALLEL.value,
        )

    @property
    def fingerprint(self) -> str:
        text = json.dumps({"pipeline": self.pipeline, "stream": self.stream, **self.meta}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()

    def observe(self, block: str) -> Released:
        """Charge ``block``'s grant (the whole per-record bound), read it under that grant, release a model."""
        if block in self.grants:
            raise ContinualReleaseError(f"block {block!r} was already observed: give each block once, in order")
        grant = self.ledger.request(
            self.pipeline,
            self.stream,
            blocks=[block],
            epsilon=self.params.epsilon,
            delta=self.params.delta,
            meta=self.meta,
            split=self._split(),
        )
        self.grants[block] = grant
        self.order.append(block)
        self._open(block)  # before reading: the read is under this release
        x, y = self.reader(grant)
        self.reads.append((block, grant.id))
        x = np.asarray(x, dtype=np.float64)
        if x.ndim != 2 or x.shape[1] != self.dim:
            raise ContinualReleaseError(f"block {block!r} gave features of shape {x.shape}; expected (n, {self.dim})")
        x, y = clip_features(x, y, self.params.loss, self.params.classes)
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
        self.ledger.release(
            grant, STAGE, bound_to_data(self.fingerprint, self.ledger, grant), self.params.epsilon, self.params.delta
        )

    def _rng(self, t, purpose):
        first = self.grants[self.order[t - 1]]
        return as_secure_rng(self.ledger.private_seed(first.id, f"{self.strategy.value}/{purpose}/{t}"))

    def _train(self, t, blocks, reference, kind):
        for b in blocks:
            self._open(b)  # re-opens the block's grant's release (same computation): nothing counted twice
        x = np.concatenate([self.data[b][0] for b in blocks])
        y = np.concatenate([self.data[b][1] for b in blocks])
        n, p, sigma = len(blocks), 1.0, self.sigma
        if self.sampled:  # the sample's rate and the noise of the full declared size (sigma z Delta_n)
            p, sigma = sampling.sampling_rate(self.epsilon0, n), self.z * sensitivity(self.params, n)
            keep = sampling.poisson_mask(len(y), p, self._rng(t, f"{kind}/sample"))
            x, y = x[keep], y[keep]
        w = private_erm(x, y, params=self.params, blocks=n, sigma=sigma, rng=self._rng(t, kind), reference=reference)
        return Released(t, list(blocks), kind, w, n, p)

    def per_record_epsilon(self) -> dict[str, tuple[float, float]]:
        """Sampled releases: each observed block's (epsilon, delta) so far, the sum over the releases that read it
        of their amplified (epsilon0, delta0) at their rates (basic composition; ``sampling.amplified``)."""
        if not self.sampled:
            raise ContinualReleaseError("per_record_epsilon is the sampled releases' account: use per_record_rho")
        out = {b: (0.0, 0.0) for b in self.order}
        for rel in self._trained:
            e, d = sampling.amplified(self.epsilon0, self.delta0, rel.rate)
            for b in rel.blocks:
                out[b] = (out[b][0] + e, out[b][1] + d)
        return out

    def per_record_rho(self) -> dict[str, float]:
        """Each observed block's zCDP rho so far: the sum over releases that read it of Delta_j^2/(2 sigma^2)."""
        if self.sampled:
            raise ContinualReleaseError("a sampled release is accounted in (epsilon, delta): use per_record_epsilon")
        rho = {b: 0.0 for b in self.order}
        for rel in self._trained:
            for b in rel.blocks:
                rho[b] += sensitivity(self.params, rel.noise_blocks) ** 2 / (2 * self.sigma**2)
        return rho

    def rho_bound(self) -> float:
        """The rho of one Gaussian with multiplier z_eff: what each block was charged for (as (epsilon, delta))."""
        return 1.0 / (2 * self.z_eff**2)  # c Delta_1^2 / (2 sigma^2) with sigma = z Delta_1, z^2 = c z_eff^2
