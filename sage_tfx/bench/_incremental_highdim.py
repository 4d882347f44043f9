"""PrivIncReg2 against PrivIncReg1 as the dimension grows (``sage bench incremental-regression --high-dim``).

The regime the paper's Section 5 is about: GENERATED k-sparse rows of norm 1 (small Gaussian width, about
sqrt(k log d)) in d dimensions, a 3-sparse truth of L1 norm 1 (non-negative for the simplex), a constraint set of small width (the L1 ball or the
simplex of radius 1), few rows against d. For each d in ``--dims``, the same rows go through (all at the same
(epsilon, delta) per block over the horizon, seeds fixed):

  reg1_l2       PrivIncReg1 over the L2 ball (the set whose noise term is the paper's sqrt(d) bound);
  reg1_<set>    PrivIncReg1 over the small-width set (``--set``);
  reg2_<set>_mM PrivIncReg2 over the same set, sketched to m for each m in ``--sketch-dims`` (m <= d).

Excess empirical risk per row at each arrival t: the mean squared error of theta_t on blocks 1..t minus that of the
non-private constrained least squares over the same set (3,000 projected-gradient steps), and that of theta = 0 for
scale. The tree's leaves are dense d x d upper triangles: the time grows as d^2 per row (d = 1,000 takes minutes).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

SPARSITY = 4  # non-zeros per row
CHUNK = 50  # rows per leaf computation
TRUTH = (0.5, -0.3, 0.2)  # the first three coordinates; L1 norm 1


def sparse_rows(seed: int, rows: int, dim: int, truth: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """GENERATED ``rows`` rows of norm 1 with SPARSITY non-zeros (one of the first three always on), labels
    x theta* + N(0, 0.05^2)."""
    rng = np.random.default_rng(seed)
    x = np.zeros((rows, dim))
    for j in range(rows):
        idx = np.unique(np.concatenate([[rng.integers(0, 3)], rng.choice(dim, SPARSITY - 1, replace=False)]))
        x[j, idx] = rng.choice([-1.0, 1.0], size=idx.size) / np.sqrt(idx.size)
    return x, x @ truth + 0.05 * rng.normal(size=rows)


def one_dim(args: argparse.Namespace, dim: int, seed: int, constraint: str) -> dict:
    """Per-arrival excess risks per row of every variant at dimension ``dim`` for one noise seed."""
    from sage_tfx.release.incremental_projection import ProjectedTreeRegressor
    from sage_tfx.release.incremental_regression import IncrementalRegressionParams, TreeRegressor, projected_gradient

    def params(c):
        return IncrementalRegressionParams(
            horizon=args.horizon, epsilon=args.epsilon, delta=args.delta, bound_x=1.0, bound_y=1.0, radius=1.0,
            iterations=args.iterations, constraint=c,
        )  # fmt: skip

    truth = np.zeros(dim)
    truth[:3] = np.abs(TRUTH) if constraint == "simplex" else TRUTH  # the truth in C: non-negative for the simplex
    trees = {
        "reg1_l2": TreeRegressor(params("l2_ball"), dim),
        f"reg1_{constraint}": TreeRegressor(params(constraint), dim),
    }
    sketches = {
        f"reg2_{constraint}_m{m}": ProjectedTreeRegressor(params(constraint), dim, m, projection_seed=7)
        for m in args.sketch_dims
        if m <= dim
    }
    excess = {name: [] for name in [*trees, *sketches, "zero"]}
    xs, ys = [], []
    for t in range(args.horizon):
        x, y = sparse_rows(5_000 + t, args.rows_per_block, dim, truth)
        xs.append(x)
        ys.append(y)
        first = next(iter(trees.values()))  # the same grids: one exact leaf for both PrivIncReg1 trees, summed over
        # chunks of rows (grid multiples: exact) so the rows' d x d outer products never all sit in memory
        leaf = sum(first.leaf(x[i : i + CHUNK], y[i : i + CHUNK]) for i in range(0, x.shape[0], CHUNK))
        thetas = {}
        for name, tree in trees.items():
            tree.add_leaf(leaf, seed * 1_000_003 + t)
            thetas[name] = tree.regressor()
        for name, sketch in sketches.items():
            thetas[name] = sketch.add(x, y, seed * 1_000_003 + t)
        xa, ya = np.vstack(xs), np.concatenate(ys)
        best = projected_gradient(xa.T @ xa, xa.T @ ya, 1.0, 3000, constraint)
        floor = float(np.mean((ya - xa @ best) ** 2))
        for name, theta in {**thetas, "zero": np.zeros(dim)}.items():
            excess[name].append(float(np.mean((ya - xa @ theta) ** 2)) - floor)
    return excess


def noise_through_the_set(dim: int, sketch_dims: list, seed: int = 0) -> dict:
    """How much of a unit-std symmetric noise matrix each variant's objective can see over its set (R = 1), one
    draw: sup over the L2 ball of theta' N theta is N's top eigenvalue (about 2 sqrt(d)); over the L1 ball or the
    simplex at most max_ij |N_ij| (about sqrt(2 ln d^2)), for PrivIncReg1 N d x d, for PrivIncReg2 Phi' M Phi
    with M m x m (its columns have norm about 1, so again a max over d^2 entries). PrivIncReg2's noise is not
    smaller than PrivIncReg1's over the same small-width set: the projection only pays against the L2 ball."""
    from sage_tfx.release.incremental_projection import projection_matrix

    rng = np.random.default_rng(seed)

    def symmetric(k):
        a = rng.normal(size=(k, k))
        return (a + a.T) / np.sqrt(2.0)

    noise = symmetric(dim)
    out = {
        "reg1_l2 (top eigenvalue)": float(np.linalg.eigvalsh(noise)[-1]),
        "reg1_set (max entry)": float(np.abs(noise).max()),
    }
    for m in sketch_dims:
        if m <= dim:
            phi = projection_matrix(m, dim, 7)
            out[f"reg2_set_m{m} (max entry of Phi' M Phi)"] = float(np.abs(phi.T @ symmetric(m) @ phi).max())
    return out


def run(args: argparse.Namespace) -> dict:
    """The figures: per d, each variant's excess risk per row at t = T and its mean over t, over ``args.seeds``.

    Args:
        args: the parsed options of ``sage bench incremental-regression --high-dim``.

    Returns:
        The figures (JSON-ready).
    """
    began = time.time()
    results = []
    for dim in args.dims:
        runs = [one_dim(args, dim, seed, args.set) for seed in range(args.seeds)]
        names = list(runs[0])
        results.append(
            {
                "dim": dim,
                "final": {n: float(np.mean([r[n][-1] for r in runs])) for n in names},
                "mean_over_t": {n: float(np.mean([np.mean(r[n]) for r in runs])) for n in names},
                "noise_seen_through_the_set": noise_through_the_set(dim, args.sketch_dims),
            }
        )
    return {
        "data": (
            f"GENERATED {SPARSITY}-sparse rows of norm 1, truth {list(TRUTH)} on the first 3 coordinates (L1 norm 1; "
            "absolute values for the simplex), "
            f"{args.horizon} blocks x {args.rows_per_block} rows"
        ),
        "set": args.set,
        "epsilon": args.epsilon,
        "delta": args.delta,
        "seeds": args.seeds,
        "sketch_dims": args.sketch_dims,
        "metric": "excess empirical risk per row over the non-private constrained least squares",
        "by_dim": results,
        "seconds": round(time.time() - began, 1),
    }
