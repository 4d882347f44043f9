"""Multiclass (softmax) continual and sliding-window release: the solver, the sensitivity bound the noise is
calibrated to, the parameter checks (before anything is charged) and the charge on a real ledger.

Data here is GENERATED (a fixed-seed 3-class linear model); the ledger is real (SQLite, tmp_path)."""

import math

import numpy as np
import pytest

from sage_tfx.privacy import gaussian
from sage_tfx.privacy.randomness import secure_rng
from sage_tfx.release.continual import (
    ContinualRelease,
    ContinualReleaseError,
    Loss,
    ReleaseParams,
    SlidingWindowRelease,
    check_sla,
    clip_features,
    empirical_loss,
    lipschitz,
    predict,
    private_erm,
    record_losses,
    sensitivity,
    smoothness,
    solve_erm,
)
from sage_tfx.release.continual.erm import _loss_grad
from tests.helpers.ledgers import daily_ledger

D, K = 4, 3
W_TRUE = np.array([[2.0, -1.0, 0.0], [-1.0, 2.0, -1.0], [0.0, 0.5, 2.0], [0.3, 0.0, -0.3]])


def generated_block(index, n=200):
    rng = np.random.default_rng(2000 + index)
    x = rng.normal(size=(n, D)) / 2
    return x, np.argmax(x @ W_TRUE + 0.3 * rng.gumbel(size=(n, K)), axis=1).astype(float)


def params(**kw):
    base = dict(epsilon=2.0, delta=1e-5, records_per_block=200, lam=0.05, loss="softmax", classes=K)
    return ReleaseParams(**{**base, **kw})


def objective(w, x, y, lam, normaliser):
    return record_losses(w, x, y, "softmax", K).sum() / normaliser + 0.5 * lam * w @ w


def test_softmax_solver_reaches_the_minimiser():
    x, y = clip_features(*generated_block(0), "softmax", K)
    w = solve_erm(x, y, normaliser=len(y), lam=0.1, radius=10.0, loss="softmax", tolerance=1e-12, classes=K)
    assert w.shape == (D * K,)
    for k in range(D * K):  # first-order optimality, coordinate by coordinate, by central differences
        e = np.zeros(D * K)
        e[k] = 1e-5
        assert abs(objective(w + e, x, y, 0.1, len(y)) - objective(w - e, x, y, 0.1, len(y))) / 2e-5 < 1e-6
    assert np.mean(predict(w, x, "softmax") == y) > 0.8  # the generated task is learnable


def test_softmax_lipschitz_and_smoothness_bound_the_gradients():
    # One record's gradient norm ||x|| ||p - e_y|| <= sqrt(2); the Hessian's norm <= 1/2 (||x|| <= 1).
    assert lipschitz("softmax", 10.0) == pytest.approx(math.sqrt(2)) and smoothness("softmax") == 0.5
    rng = np.random.default_rng(7)
    x, y = clip_features(rng.normal(size=(500, D)) * 3, rng.integers(0, K, 500), "softmax", K)
    for _ in range(20):
        w = rng.normal(size=D * K) * 5
        grads = [_loss_grad(w, x[i : i + 1], y[i : i + 1], Loss.SOFTMAX)[1] for i in range(50)]
        assert max(np.linalg.norm(g) for g in grads) <= math.sqrt(2) + 1e-12


def test_softmax_sensitivity_bound_holds_for_neighbours():
    # Removing any one record moves the (tolerance-stopped) minimiser by at most the stated sensitivity.
    p = params()
    x, y = clip_features(*generated_block(3), "softmax", K)
    fit = dict(normaliser=200, lam=p.lam, radius=p.radius, loss="softmax", classes=K)
    w = solve_erm(x, y, **fit)
    worst = max(np.linalg.norm(w - solve_erm(np.delete(x, i, 0), np.delete(y, i), **fit)) for i in range(0, 200, 9))
    assert 0 < worst <= sensitivity(p, 1)
    assert sensitivity(p, 1) == pytest.approx(sensitivity(params(loss="logistic", classes=None), 1) * math.sqrt(2))


def test_softmax_noise_is_the_stated_gaussian():
    # 400 draws x 12 cells = 4800 samples: |mean z| > 6 or a variance ratio outside [0.85, 1.15] (7.3 standard
    # errors) each have probability < 1e-8 under N(0, sigma^2): false-failure rate < 1e-7.
    p = params()
    x, y = generated_block(5)
    w = solve_erm(
        *clip_features(x, y, "softmax", K), normaliser=200, lam=p.lam, radius=p.radius, loss="softmax", classes=K
    )
    sigma, rng = 0.2, secure_rng(4321)
    flat = np.array([private_erm(x, y, params=p, blocks=1, sigma=sigma, rng=rng) - w for _ in range(400)]).ravel()
    assert abs(flat.mean()) < 6 * sigma / math.sqrt(flat.size)
    assert 0.85 < flat.var() / sigma**2 < 1.15


@pytest.mark.parametrize(
    "kw,match",
    [
        ({"classes": None}, "classes None is invalid"),
        ({"classes": 1}, "classes 1 is invalid"),
        ({"classes": True}, "classes True is invalid"),
        ({"loss": "logistic"}, "classes 3 is for the softmax loss"),
    ],
)
def test_bad_classes_refused_before_anything_is_charged(tmp_path, kw, match):
    ledger = daily_ledger(tmp_path, 2, epsilon=10.0, delta=1e-4, rows=200)
    with pytest.raises(ContinualReleaseError, match=match):
        params(**kw)
    assert all(b["epsilon_spent"] == 0 for b in ledger.status("s")["blocks"])


def test_labels_out_of_range_are_clipped_not_refused():
    # The labels are private: a post-charge refusal would tell that some record holds a bad label.
    x, y = clip_features(np.ones((4, D)), np.array([-3.0, 0.4, 1.6, 9.0]), "softmax", K)
    assert y.tolist() == [0.0, 0.0, 2.0, 2.0]
    with pytest.raises(ContinualReleaseError, match="classes None"):
        clip_features(np.ones((1, D)), np.zeros(1), "softmax")


def test_binary_fingerprints_unchanged():
    assert "classes" not in params(loss="logistic", classes=None).to_dict()
    assert params().to_dict()["classes"] == K


@pytest.mark.parametrize("cls,window", [(ContinualRelease, None), (SlidingWindowRelease, 4)])
def test_multiclass_release_charges_the_bound_once_and_learns(tmp_path, cls, window):
    blocks = 9
    ledger = daily_ledger(tmp_path, blocks, epsilon=10.0, delta=1e-4, rows=200)

    def reader(grant):
        (block,) = ledger.verify(grant).blocks  # only a recorded (charged) grant opens a block
        return generated_block(int(block[1:]))

    rel = cls(ledger, "s", "multiclass", params(epsilon=8.0, window=window), reader, dim=D)
    for i in range(blocks):
        out = rel.observe(f"b{i:03d}")
        assert out.weights.shape == (D * K,) and np.all(np.isfinite(out.weights))
    spent = {b["id"]: (b["epsilon_spent"], b["delta_spent"]) for b in ledger.status("s")["blocks"]}
    assert list(spent.values()) == [(pytest.approx(8.0), pytest.approx(1e-5))] * blocks  # each block once
    assert max(rel.per_record_rho().values()) <= rel.rho_bound() * (1 + 1e-9)
    assert gaussian.rdp_epsilon(rel.z_eff, 1e-5) <= 8.0 + 1e-3
    x, y = generated_block(99, n=2000)
    acc = np.mean(predict(out.weights, clip_features(x, y, "softmax", K)[0], "softmax") == y)
    assert acc > 0.6  # 3 classes: chance is about 1/3
    assert empirical_loss(out.weights, x, y, "softmax", K) < math.log(K)
    assert ledger.audit().ok


def test_multiclass_sla_check_uses_the_cross_entropy(tmp_path):
    from sage_tfx.validation.loss import DPLossValidator

    ledger = daily_ledger(tmp_path, 2, epsilon=10.0, delta=1e-4, rows=200)
    rel = ContinualRelease(
        ledger,
        "s",
        "multiclass",
        params(epsilon=8.0),
        lambda g: generated_block(int(ledger.verify(g).blocks[0][1:])),
        dim=D,
        validation_epsilon=5.0,
        test_fraction=0.3,
    )
    model = rel.observe("b000")
    x, y = rel.tests["b000"]
    assert len(y) > 20 and set(np.unique(y)) <= {0.0, 1.0, 2.0}
    easy = check_sla(rel, model, DPLossValidator(3.0, 5.0, loss_bound=5.0))
    assert str(easy.outcome) == "ACCEPT"
