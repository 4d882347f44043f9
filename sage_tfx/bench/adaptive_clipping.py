"""DP-SGD adaptive clipping (private quantile of the gradient norms) vs a fixed clip 1 at EQUAL epsilon, on an imbalanced binary label.

Data: GENERATED, a logistic task shaped like the first-week user's table (a binary label with ~12% positives):
x ~ N(0, I_10), P(y = 1 | x) = sigmoid(0.4 sum_j x_j + b) with b set so that 12% of the rows are positive
(fixed seed; --rows training rows, 5,000 test rows). At a fitted rate near the truth a positive's per-example
gradient norm is about |1 - p| sqrt(||x||^2 + 1) ~ 2.9 and a negative's ~ 0.4, the ratio that user measured,
so a fixed clip 1 scales the positives down ~3x and the model under-predicts the positive rate.

Model: DPLogisticRegressor (ghost engine), the settings of that user's run: SGD lr 1, no momentum, batch 512,
--epochs passes, delta 1e-5, epsilon --epsilon (0.5), calibrated on the training-set size (public here;
pipelines use the ledger's DP count). Compared at the SAME (epsilon, delta), steps, batch and seed (paired):
``fixed`` (clip_norm=1), ``adaptive`` (clip_norm="adaptive": target quantile 0.5) and ``imbalanced``
(sage_tfx.privacy.adaptive_clip.IMBALANCED: target quantile 0.9); both adaptive ones start at C_0 = 1 and
use sigma_b = 512/20. Figures per variant: the fitted positive rate (mean predicted probability on the test
rows; the truth is the test rows' positive share), the test log loss and accuracy, the final clip norm, the
realised epsilon; median over --seeds seeds and every seed's value. ``nonprivate``: the same logistic model
fitted without DP (the same SGD steps, no clipping or noise) as a reference.
"""

import sys

import numpy as np

from sage_tfx.plots import pyplot, save_figure

VARIANTS = ("fixed", "adaptive", "imbalanced")
DEFAULT_PLOT = "docs/img/adaptive_clipping.png"
TEST_ROWS = 5000
DIM = 10
POSITIVE_SHARE = 0.12


def add_arguments(parser):
    parser.add_argument("--epsilon", type=float, default=0.5, help="the budget of every run (default 0.5)")
    parser.add_argument("--rows", type=int, default=20000, help="training rows (default 20000)")
    parser.add_argument("--epochs", type=int, default=5, help="epochs of DP-SGD (default 5)")
    parser.add_argument("--seeds", type=int, default=3, help="seeds (paired across variants; default 3)")
    parser.add_argument("--plot", default=DEFAULT_PLOT, help=f"PNG to write ('' for none; default {DEFAULT_PLOT})")


def generated_task(rows, seed=0):
    """(x, y, x_test, y_test): the GENERATED imbalanced logistic task (module docstring)."""

    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows + TEST_ROWS, DIM)).astype(np.float32)
    score = 0.4 * x.sum(axis=1)
    low, high = -10.0, 10.0  # the intercept whose expected positive share is POSITIVE_SHARE (bisection)
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if np.mean(1 / (1 + np.exp(-(score + mid)))) < POSITIVE_SHARE else (low, mid)
    y = (rng.random(len(x)) < 1 / (1 + np.exp(-(score + low)))).astype(np.float32)
    return x[:rows], y[:rows], x[rows:], y[rows:]


def _clip(variant):
    from sage_tfx.privacy.adaptive_clip import IMBALANCED

    return {"fixed": 1.0, "adaptive": "adaptive", "imbalanced": IMBALANCED}[variant]


def _metrics(p, y):

    p = np.clip(p, 1e-7, 1 - 1e-7)
    return {
        "fitted_positive_rate": float(np.mean(p)),
        "log_loss": float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p))),
        "accuracy": float(np.mean((p > 0.5) == (y == 1))),
    }


def _fit(variant, data, epsilon, epochs, seed):
    from sage_tfx.models import DPLogisticRegressor

    x, y, xt, yt = data
    est = DPLogisticRegressor(
        (epsilon, 1e-5),
        num_examples=len(x),
        batch_size=512,
        epochs=epochs,
        learning_rate=1.0,
        momentum=0.0,
        clip_norm=_clip(variant),
        seed=seed,
    ).fit(x, y)
    out = _metrics(est.predict_proba(xt)[:, 1], yt)
    ps = est.privacy_spent
    out["epsilon"] = float(ps["epsilon"])
    out["final_clip_norm"] = float(ps["adaptive_clip"]["final_clip_norm"]) if "adaptive_clip" in ps else 1.0
    return out


def _nonprivate(data, epochs):
    """The same logistic model by plain mini-batch SGD (lr 1, batch 512, no clip, no noise): a reference."""

    x, y, xt, yt = data
    w, b = np.zeros(x.shape[1]), 0.0
    rng = np.random.default_rng(0)
    for _ in range(epochs):
        order = rng.permutation(len(x))
        for start in range(0, len(x), 512):
            rows = order[start : start + 512]
            err = 1 / (1 + np.exp(-(x[rows] @ w + b))) - y[rows]
            w -= x[rows].T @ err / 512
            b -= err.sum() / 512
    return _metrics(1 / (1 + np.exp(-(xt @ w + b))), yt)


def run(args):

    import sage_tfx  # noqa: F401  (before TensorFlow)
    from sage_tfx.privacy import dpsgd

    if args.seeds < 1 or args.epochs < 1 or args.rows < 1024 or not args.epsilon > 0:
        raise SystemExit("--seeds and --epochs must be >= 1, --rows >= 1024, --epsilon > 0")
    data = generated_task(args.rows)
    figures = {
        "data": f"GENERATED imbalanced logistic task: {args.rows} train / {TEST_ROWS} test rows, {DIM} "
        f"features, test positive share {float(np.mean(data[3])):.4f}",
        "epsilon": args.epsilon,
        "delta": 1e-5,
        "epochs": args.epochs,
        "batch_size": 512,
        "steps": dpsgd.num_steps(args.rows, 512, args.epochs),
        "seeds": args.seeds,
        "true_positive_rate": round(float(np.mean(data[3])), 4),
        "nonprivate": {k: round(v, 4) for k, v in _nonprivate(data, args.epochs).items()},
    }
    values = {v: [] for v in VARIANTS}
    for seed in range(args.seeds):
        for variant in VARIANTS:
            print(f"[adaptive-clipping] seed {seed} {variant}", file=sys.stderr, flush=True)
            values[variant].append(_fit(variant, data, args.epsilon, args.epochs, seed))
    for variant in VARIANTS:
        rows = values[variant]
        figures[variant] = {key: round(float(np.median([r[key] for r in rows])), 4) for key in rows[0]}
        figures[variant]["all"] = {key: [round(r[key], 4) for r in rows] for key in rows[0] if key != "epsilon"}
    if args.plot:
        plot(figures, args.plot)
        figures["plot"] = args.plot
    return figures


def plot(figures, path):

    plt = pyplot()
    panels = (
        ("fitted_positive_rate", "fitted positive rate (test)"),
        ("log_loss", "test log loss"),
        ("accuracy", "test accuracy"),
    )
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.6))
    for ax, (key, label) in zip(axes, panels):
        for i, variant in enumerate(VARIANTS):
            v = figures[variant]["all"][key]
            ax.scatter([i] * len(v), v, color="grey", s=12)
            ax.scatter([i], [figures[variant][key]], color="C3", marker="_", s=400)
        ax.axhline(figures["nonprivate"][key], color="C0", ls="--", lw=1, label="non-private")
        if key == "fitted_positive_rate":
            ax.axhline(figures["true_positive_rate"], color="k", ls=":", lw=1, label="true rate")
        ax.set_xticks(range(len(VARIANTS)))
        ax.set_xticklabels(["fixed C=1", "adaptive q=0.5", "adaptive q=0.9"], fontsize=8)
        ax.set_ylabel(label)
        ax.legend(fontsize=7)
    fig.suptitle(
        f"DP logistic regression, 12% positives, epsilon={figures['epsilon']:g} each (seeds grey, median red)",
        fontsize=9,
    )
    save_figure(fig, path, dpi=100)
