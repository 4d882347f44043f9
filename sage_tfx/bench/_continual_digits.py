"""The paper's Fig. 4 on a REAL multiclass data set: softmax continual / sliding-window release on scikit-learn's
bundled digits (1,797 8x8 images, 10 classes), test accuracy against the block count t and against epsilon.

Data: ``sklearn.datasets.load_digits`` (shipped inside scikit-learn, nothing downloaded), shuffled by a fixed
seed (the paper orders MNIST at random), 25% held out as the test set (as the paper's Arxiv split), the rest cut
into blocks of ``--rows-per-block`` m0 rows. Features: the 64 pixels / 16 and a bias, each row scaled to unit
norm (a public per-record map). Model: softmax regression (d = 65, k = 10: 650 weights). For each epsilon of
``--epsilons`` and each trial a real SQLite ledger charges every block (epsilon, delta) before it is read.
Variants at every arrival t:
- ``continual``: ContinualRelease (all history, infinite horizon);
- ``sliding``: SlidingWindowRelease over ``--window`` blocks;
- ``independent`` (the paper's Fig. 4(d) baseline): the newest block trained alone, output perturbation at the
  whole per-record budget (each record is read once);
- ``non_private``: the same regularised ERM on all blocks so far, no noise.
"""

from __future__ import annotations

import argparse
import tempfile
import time

import numpy as np

from sage_tfx.bench._trials import block_reader, trial_ledger
from sage_tfx.plots import pyplot, save_figure

DEFAULT_PLOT = "docs/img/continual_release_digits.png"
VARIANTS = ("continual", "sliding", "independent")
CLASSES = 10
TEST_FRACTION = 0.25
SHUFFLE_SEED = 0


def digits_blocks(blocks: int | None, rows: int) -> tuple[list[tuple[np.ndarray, np.ndarray]], tuple]:
    """The digits stream as ``blocks`` blocks of ``rows`` rows (None: as many as fit) and the held-out test set.

    Args:
        blocks: the blocks wanted (None: all that fit in the 75% training part).
        rows: the rows per block (m0).

    Returns:
        ``([(X, y) per block], (X_test, y_test))``, X with unit-norm rows.
    """
    from sklearn.datasets import load_digits

    digits = load_digits()
    order = np.random.default_rng(SHUFFLE_SEED).permutation(len(digits.target))
    x = np.hstack([digits.data / 16.0, np.ones((len(order), 1))])[order]
    x /= np.linalg.norm(x, axis=1)[:, None]
    y = digits.target.astype(np.float64)[order]
    n_test = int(round(TEST_FRACTION * len(y)))
    fit = (len(y) - n_test) // rows
    if blocks is None:
        blocks = fit
    if blocks < 1 or blocks > fit:
        raise SystemExit(
            f"--blocks {blocks} x --rows-per-block {rows}: the digits' training part holds "
            f"{len(y) - n_test} rows ({fit} blocks of {rows}); lower one of them"
        )
    train = [
        (x[n_test + i * rows : n_test + (i + 1) * rows], y[n_test + i * rows : n_test + (i + 1) * rows])
        for i in range(blocks)
    ]
    return train, (x[:n_test], y[:n_test])


def run(args: argparse.Namespace) -> dict:
    """Run the digits benchmark: accuracy by t for every epsilon, each variant, ``args.trials`` noise seeds.

    Args:
        args: the parsed options of ``sage bench continual-release --dataset digits`` (resolved defaults).

    Returns:
        The figures (JSON-ready): test accuracy medians by t and by epsilon, the charges and the audits.
    """
    began = time.time()
    data, test = digits_blocks(args.blocks, args.rows_per_block)
    T = len(data)
    epsilons = args.epsilons
    non_private = _non_private_accuracy(data, test, args)
    acc = {e: {v: np.zeros((args.trials, T)) for v in VARIANTS} for e in epsilons}
    charged, audits = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for e in epsilons:
            for trial in range(args.trials):
                ok, spent = _trial(args, e, trial, tmp, data, test, acc[e])
                audits.append(ok)
                charged.extend(s / e for s in spent)
    figures = _figures(args, epsilons, acc, non_private, T, charged, audits, began)
    if args.plot:
        plot(figures, args.plot)
        figures["plot"] = args.plot
    return figures


def _params(args: argparse.Namespace, epsilon: float, window: int | None):
    from sage_tfx.release.continual import ReleaseParams

    return ReleaseParams(
        epsilon=epsilon,
        delta=args.delta,
        records_per_block=args.rows_per_block,
        lam=args.lam,
        loss="softmax",
        classes=CLASSES,
        window=window,
    )


def _accuracy(w: np.ndarray, test: tuple) -> float:
    from sage_tfx.release.continual import predict

    return float(np.mean(predict(w, test[0], "softmax") == test[1]))


def _non_private_accuracy(data: list, test: tuple, args: argparse.Namespace) -> list[float]:
    from sage_tfx.release.continual import solve_erm

    out = []
    for t in range(1, len(data) + 1):
        x = np.concatenate([b[0] for b in data[:t]])
        y = np.concatenate([b[1] for b in data[:t]])
        w = solve_erm(
            x, y, normaliser=t * args.rows_per_block, lam=args.lam, radius=10.0, loss="softmax", classes=CLASSES
        )
        out.append(_accuracy(w, test))
    return out


def _trial(
    args: argparse.Namespace, epsilon: float, trial: int, tmp: str, data: list, test: tuple, acc: dict
) -> tuple[bool, list[float]]:
    """One ledger, both strategies and the independent baseline at one epsilon; fills row ``trial`` of ``acc``."""
    from sage_tfx.privacy.randomness import secure_rng
    from sage_tfx.release.continual import ContinualRelease, SlidingWindowRelease, private_erm, sensitivity

    T, m0, d = len(data), args.rows_per_block, data[0][0].shape[1]
    name = f"e{epsilon:g}-{trial}"
    ledger = trial_ledger(tmp, name, ("digits", "digits_sw"), T, m0, epsilon, args.delta)
    reader = block_reader(ledger, data)
    cum = ContinualRelease(ledger, "digits", f"c{name}", _params(args, epsilon, None), reader, dim=d)
    sw = SlidingWindowRelease(
        ledger, "digits_sw", f"s{name}", _params(args, epsilon, args.window), reader, dim=d, horizon=T
    )
    single = _params(args, epsilon, None)
    rng = secure_rng(20_000 + trial)
    for t in range(1, T + 1):
        block = f"b{t - 1:03d}"
        acc["continual"][trial, t - 1] = _accuracy(cum.observe(block).weights, test)
        acc["sliding"][trial, t - 1] = _accuracy(sw.observe(block).weights, test)
        w_ind = private_erm(*data[t - 1], params=single, blocks=1, sigma=cum.z_eff * sensitivity(single, 1), rng=rng)
        acc["independent"][trial, t - 1] = _accuracy(w_ind, test)
    ok = bool(ledger.audit().ok)
    spent = [b["epsilon_spent"] for s in ("digits", "digits_sw") for b in ledger.status(s)["blocks"]]
    ledger.close()
    return ok, spent


def _figures(
    args: argparse.Namespace,
    epsilons: list,
    acc: dict,
    non_private: list,
    T: int,
    charged: list,
    audits: list,
    began: float,
) -> dict:
    q = max(1, T // 4)
    med = {e: {v: np.median(acc[e][v], axis=0) for v in VARIANTS} for e in epsilons}
    late_np = float(np.mean(non_private[-q:]))
    return {
        "data": f"REAL scikit-learn digits: {T} blocks x {args.rows_per_block} rows (shuffled, seed {SHUFFLE_SEED}), "
        f"test {TEST_FRACTION:.0%} held out; softmax regression, d=65, k={CLASSES}",
        "epsilons": epsilons,
        "delta": args.delta,
        "lam": args.lam,
        "window": args.window,
        "trials": args.trials,
        "accuracy_median_by_t": {
            f"{e:g}": {v: [round(float(a), 4) for a in med[e][v]] for v in VARIANTS} for e in epsilons
        },
        "non_private_accuracy_by_t": [round(a, 4) for a in non_private],
        "last_quarter_accuracy": {f"{e:g}": {v: float(np.mean(med[e][v][-q:])) for v in VARIANTS} for e in epsilons},
        "non_private_last_quarter_accuracy": late_np,
        "continual_over_non_private_last_quarter": {
            f"{e:g}": float(np.mean(med[e]["continual"][-q:]) / late_np) for e in epsilons
        },
        "continual_over_independent_mean": {
            f"{e:g}": float(np.mean(med[e]["continual"]) / max(np.mean(med[e]["independent"]), 1e-9)) for e in epsilons
        },
        "block_charge_over_epsilon": [float(min(charged)), float(max(charged))],
        "audit_ok": all(audits),
        "seconds": round(time.time() - began, 1),
    }


def plot(figures: dict, path: str) -> None:
    """Fig. 4's two views: accuracy against t (continual at every epsilon), accuracy against epsilon.

    Args:
        figures: what ``run`` returns.
        path: the PNG to write.
    """
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    np_curve = figures["non_private_accuracy_by_t"]
    t = np.arange(1, len(np_curve) + 1)
    left.plot(t, np_curve, "k--", label="non-private ERM, all history")
    for e, curves in figures["accuracy_median_by_t"].items():
        left.plot(t, curves["continual"], marker="o", ms=3, label=f"continual, eps={e}")
    left.set_xlabel("block arrivals t")
    left.set_ylabel("test accuracy (450 held-out digits)")
    left.legend(fontsize=7)
    eps = [float(e) for e in figures["last_quarter_accuracy"]]
    for v in VARIANTS:
        right.plot(eps, [figures["last_quarter_accuracy"][f"{e:g}"][v] for e in eps], marker="o", label=v)
    right.axhline(figures["non_private_last_quarter_accuracy"], color="k", ls="--", label="non-private")
    right.set_xscale("log")
    right.set_xlabel(f"epsilon per record (delta {figures['delta']:g})")
    right.set_ylabel("test accuracy, last quarter of t")
    right.legend(fontsize=7)
    fig.suptitle(f"REAL digits (10 classes), {figures['data'].split(':')[1].split(';')[0].strip()}", fontsize=9)
    save_figure(fig, path, dpi=120)
