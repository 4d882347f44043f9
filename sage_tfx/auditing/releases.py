"""Auditable entries for the release strategies and the stages' own paths: the Tree Mechanism, PMWG, the custom
validator and AdaSSP as DPTrainer runs it (registered in ``mechanisms``' registry, ``sage audit-privacy --list``).

Each drives the public functions the strategy or executor calls, not a re-implementation: ``tree-mechanism``
(``TreeRegressor``, ``TREE_HORIZON`` = 4 blocks; ``tree_residuals`` gives the per-cell residuals),
``pmwg`` (``PMWG`` on a throwaway ledger, claim ``PMWG.round_epsilon``), ``validator-custom`` (the custom
metric's clip and ``release_pair``) and ``adassp-dptrainer`` (``DPLinearRegressor`` under ``training_seed``).
Contract: as ``mechanisms``' entries; the ledger-seeded ones (``pmwg``, ``adassp-dptrainer``) are not
reproducible run to run (the bound's law is the same).

Neighbours, statistics and claims: docs/privacy_auditing.md ("What is covered", "Limits").
"""

from __future__ import annotations

import functools
import os
import tempfile
from collections.abc import Callable

import numpy as np

from sage_tfx.privacy.randomness import secure_rng
from sage_tfx.privacy.vocabulary import Stage

from .core import Mechanism
from .mechanisms import GAUSSIAN_DELTA, RECORDS, register_mechanism

__all__ = [
    "TREE_HORIZON",
    "tree_residuals",
    "tree_mechanism",
    "pmwg_mechanism",
    "observed_pmwg",
    "custom_validator_mechanism",
    "adassp_dptrainer_mechanism",
]

TREE_HORIZON = 4  # blocks; L = 3 levels
TREE_RELEASES = (1, 2, 4)  # the arrivals whose prefixes are the nodes holding block 1
PMWG_ROWS = 100  # the block's declared (public) rows
CUSTOM_LOSS = "def loss(labels, outputs):\n    return 1000.0 * (labels - outputs['p']) ** 2\n"


def _block_seed(seed: int, block: int) -> int:
    """Block ``block``'s seed in trial ``seed`` (each arrival has its own grant, hence its own seed)."""
    return int(np.random.SeedSequence([seed, block]).generate_state(1, np.uint64)[0] >> np.uint64(1))


@functools.cache
def _tree_blocks(neighbour: bool) -> tuple:
    rng = np.random.default_rng(0)
    blocks = []
    for t in range(TREE_HORIZON):
        x = rng.uniform(-0.5, 0.5, (20, 1))
        y = np.clip(0.5 * x[:, 0] + rng.normal(0.0, 0.1, 20), -1.0, 1.0)
        if neighbour and t == 0:
            x, y = np.vstack([x, [[1.0]]]), np.append(y, 1.0)
        blocks.append((x, y))
    return tuple(blocks)


@functools.cache
def _tree_exact(params) -> tuple:
    """D's exact prefixes after blocks 1, 2 and 4 (the cells ``tree_residuals`` compares with) and the sigmas."""
    from sage_tfx.release.incremental_regression import TreeRegressor

    tree = TreeRegressor(params, 1)
    leaves = np.cumsum([tree.leaf(x, y) for x, y in _tree_blocks(False)], axis=0)
    sigma = params.noise_multiplier * np.array([params.bound_x**2, params.bound_x * params.bound_y])
    return leaves, sigma


def tree_residuals(params, neighbour: bool, seed: int, tree_class: Callable | None = None) -> np.ndarray:
    """The Tree Mechanism's noisy prefixes after blocks 1, 2 and 4 (the three nodes holding block 1), minus D's
    exact values, over each cell's sigma: 6 numbers, N(0, 1) on D, shifted by about 1/c on D'
    (docs/privacy_auditing.md).

    Args:
        params: the ``IncrementalRegressionParams`` (horizon ``TREE_HORIZON``, one feature).
        neighbour: run on D' (one record (B_x, B_y) added to block 1) instead of D.
        seed: the trial's seed; block t's node draws from ``_block_seed(seed, t)``.
        tree_class: builds the tree from (params, dim); default ``TreeRegressor`` (a planted variant's
            subclass in the tests).
    """
    from sage_tfx.release.incremental_regression import TreeRegressor

    tree = (tree_class or TreeRegressor)(params, 1)
    exact, sigma = _tree_exact(params)
    out = []
    for t, (x, y) in enumerate(_tree_blocks(neighbour), start=1):
        tree.add_leaf(tree.leaf(x, y), _block_seed(seed, t))
        if t in TREE_RELEASES:
            matrix, vector = tree.noisy_prefix()
            out.append((np.array([matrix[0, 0], vector[0]]) - exact[t - 1]) / sigma)
    return np.concatenate(out)


def tree_mechanism(
    epsilon: float,
    tree_class: Callable | None = None,
    statistic: Callable[[np.ndarray], float] = np.sum,
    name: str = "tree-mechanism",
) -> Mechanism:
    """PrivIncReg1's Tree Mechanism at (``epsilon``, 1e-5) per block over the horizon (module docstring).

    Args:
        epsilon: the claimed epsilon per block (``IncrementalRegressionParams.epsilon``).
        tree_class: the tree's class (default ``TreeRegressor``).
        statistic: maps ``tree_residuals`` to the scalar tested; default their sum (the likelihood ratio).
        name: the mechanism's name in the result.
    """
    from sage_tfx.release.incremental_regression import IncrementalRegressionParams

    params = IncrementalRegressionParams(
        horizon=TREE_HORIZON, epsilon=epsilon, delta=GAUSSIAN_DELTA, bound_x=1.0, bound_y=1.0, radius=10.0, iterations=1
    )

    def release(neighbour, seed):
        return float(statistic(tree_residuals(params, neighbour, seed, tree_class)))

    return Mechanism(name, release, epsilon, GAUSSIAN_DELTA)


register_mechanism(
    "tree-mechanism",
    "PrivIncReg1's Tree Mechanism (release.incremental_regression.TreeRegressor), "
    "horizon 4, delta = 1e-5; D' adds a record to block 1 (in 3 nodes)",
    slow=True,
)(tree_mechanism)


def _pmwg_ledger(directory: str, epsilon: float):
    from sage_tfx.privacy import Ledger

    ledger = Ledger.open(os.path.join(directory, "pmwg.db"), create=True)
    ledger.create_stream("audit", epsilon, 0.0, max_epsilon=max(epsilon, 10.0))
    return ledger


def observed_pmwg(ledger, index: int, pmwg_class: Callable, params, universe, rows: np.ndarray, declared: int):
    """A fresh ``pmwg_class`` on a new block ``b<index>`` of the stream ``audit`` of ``ledger``, that block observed
    (its grant charged and released, ``rows`` read under it, ``declared`` public rows).

    Args:
        ledger: the throwaway ledger (``_pmwg_ledger``).
        index: a number naming the block and the pipeline (one per call).
        pmwg_class: ``PMWG`` or a planted variant's subclass.
        params: the ``PMWGParams``.
        universe: the ``Universe``.
        rows: the block's records.
        declared: its declared (public) row count.
    """
    block = f"b{index}"
    ledger.add_block("audit", block, start=float(index), end=index + 1.0, rows=declared)
    pmwg = pmwg_class(ledger, "audit", f"audit-{block}", params, universe, lambda grant: rows)
    pmwg.observe(block, declared)
    return pmwg


def pmwg_mechanism(epsilon: float, pmwg_class: Callable | None = None, name: str = "pmwg") -> Mechanism:
    """PMWG's AboveThreshold round and hard answer, on a throwaway ledger, at a round epsilon of ``epsilon``
    (module docstring). The ledger lives in a temporary folder for the process's lifetime.

    Args:
        epsilon: the claimed epsilon: the round's (``PMWG.round_epsilon``); the grant charges it over
            ``PMWGParams.round_scale`` / epsilon.
        pmwg_class: the class run (default ``PMWG``; a planted variant's subclass in the tests).
        name: the mechanism's name in the result.
    """
    from sage_tfx.release.growth import PMWG, PMWGParams, Universe

    shape = PMWGParams(epsilon=1.0, hard_budget=1, threshold=0.05, growth_exponent=1.0)
    params = PMWGParams(epsilon=epsilon / shape.round_scale, hard_budget=1, threshold=0.05, growth_exponent=1.0)
    universe = Universe(("v",), (np.arange(11.0),))
    base = np.concatenate([np.full(15, 0.5), np.repeat(np.arange(1.0, 10.0) + 0.5, 9)])[:, None]  # 15 in cell 0
    weights = (np.arange(universe.size) == 0).astype(np.float64)  # true 0.15, public estimate 0.1: gap = T
    folder = tempfile.TemporaryDirectory(prefix="sage-audit-pmwg-")
    ledger = _pmwg_ledger(folder.name, params.epsilon)
    trials = iter(range(1 << 62))

    def release(neighbour, seed):
        rows = np.vstack([base, [[0.5]]]) if neighbour else base
        pmwg = observed_pmwg(ledger, next(trials), (pmwg_class or PMWG), params, universe, rows, PMWG_ROWS)
        answer = pmwg.query(weights)
        return float(answer.answer) if answer.hard else -1.0

    mechanism = Mechanism(name, release, epsilon)
    release.folder = folder  # type: ignore[attr-defined]  # keeps the ledger's folder as long as the mechanism
    return mechanism


register_mechanism(
    "pmwg",
    "PMWG's AboveThreshold round (release.growth.PMWG) on a throwaway ledger, each trial "
    "its own grant and seed; claim: the round's epsilon",
    slow=True,
)(pmwg_mechanism)


def custom_validator_mechanism(epsilon: float, name: str = "validator-custom") -> Mechanism:
    """DPModelValidator's custom metric path at ``epsilon`` (module docstring).

    Args:
        epsilon: the claimed epsilon (the validation share).
        name: the mechanism's name in the result.
    """
    from sage_tfx.components.validation_steps import (
        Metric,
        custom_loss_plan,
        load_loss_function,
        per_example_values,
    )
    from sage_tfx.validation.core import Mode
    from sage_tfx.validation.noisy import release_pair

    folder = tempfile.mkdtemp(prefix="sage-audit-loss-")
    path = os.path.join(folder, "loss.py")
    with open(path, "w") as f:
        f.write(CUSTOM_LOSS)
    loss_fn = load_loss_function(custom_loss_plan(Metric.CUSTOM, path, "loss"))
    labels = np.full(RECORDS, 0.5)
    predictions = np.full(RECORDS, 0.49)  # losses 0.1 each
    mode = Mode.parse("sage")

    def release(neighbour, seed):
        y, p = (np.append(labels, 1.0), np.append(predictions, -1e3)) if neighbour else (labels, predictions)
        values = per_example_values(Metric.CUSTOM, y, {"p": p}, None, 1.0, loss_fn)
        total, _ = release_pair(values, 1.0, epsilon, secure_rng(seed, Stage.VALIDATION.value), mode)
        return total.value

    return Mechanism(name, release, epsilon)


register_mechanism(
    "validator-custom",
    "DPModelValidator's custom metric: a user loss module (unbounded loss) "
    "through custom_loss_plan, per_example_values (clip to B = 1), "
    "release_pair",
)(custom_validator_mechanism)


def _training_grant_seed(ledger, index: int, epsilon: float, delta: float) -> int:
    """A grant on a new block ``index`` whose training share is (epsilon, delta), and the seed its ``open_release`` of the
    training stage returns (what DPTrainer's executor hands ``train_and_audit``)."""
    from sage_tfx.components._grant import open_release

    block = f"b{index}"
    ledger.add_block("audit", block, start=float(index), end=index + 1.0, rows=1)
    grant = ledger.request("audit", "audit", blocks=[block], epsilon=epsilon, delta=delta)
    return open_release(ledger, grant, Stage.TRAINING, f"audit adassp {block}", epsilon, delta)


def adassp_dptrainer_mechanism(epsilon: float, name: str = "adassp-dptrainer") -> Mechanism:
    """AdaSSP (``DPLinearRegressor``, one feature, no intercept) fitted the way DPTrainer runs ``run_fn``, at
    (``epsilon``, 1e-5) (module docstring).

    Args:
        epsilon: the claimed epsilon (the training share).
        name: the mechanism's name in the result.
    """
    from sage_tfx.components.dp_trainer_executor import audit_fits
    from sage_tfx.models import DPLinearRegressor, training_seed
    from sage_tfx.privacy import Ledger

    rng = np.random.default_rng(0)
    x = rng.uniform(-1.0, 1.0, (50, 1))
    y = np.clip(0.5 * x[:, 0] + rng.normal(0.0, 0.1, 50), -1.0, 1.0)
    folder = tempfile.TemporaryDirectory(prefix="sage-audit-adassp-")
    ledger = Ledger.open(os.path.join(folder.name, "adassp.db"), create=True)
    ledger.create_stream("audit", epsilon, 0.5, max_epsilon=max(epsilon, 10.0))
    budget = (epsilon, GAUSSIAN_DELTA)
    trials = iter(range(1 << 62))

    def release(neighbour, seed):
        xs, ys = (np.vstack([x, [[1.0]]]), np.append(y, -1.0)) if neighbour else (x, y)
        grant_seed = _training_grant_seed(ledger, next(trials), *budget)
        with training_seed(grant_seed, share=budget) as block:
            model = DPLinearRegressor(budget, feature_bound=1.0, label_range=(-1.0, 1.0), fit_intercept=False)
            model.fit(xs, ys)
        audit_fits(block, budget)  # the executor's check of what the fits reported
        return float(np.ravel(model.coef_)[0])

    release.folder = folder  # type: ignore[attr-defined]
    return Mechanism(name, release, epsilon, GAUSSIAN_DELTA)


register_mechanism(
    "adassp-dptrainer",
    "AdaSSP (DPLinearRegressor) fitted as DPTrainer runs run_fn: a grant's "
    "training seed on a throwaway ledger, training_seed(share), audit_fits; "
    "delta = 1e-5",
    slow=True,
)(adassp_dptrainer_mechanism)
