"""Continual and sliding-window release (sage_tfx/release/continual/; the paper seed 000). numpy only.

Data here is GENERATED (a fixed-seed logistic model); the ledger is real (SQLite, tmp_path)."""

import math
import os

import numpy as np
import pytest

from sage_tfx.privacy import GrantError, Ledger, gaussian
from sage_tfx.privacy.digests import bound_to_data
from sage_tfx.privacy.randomness import secure_rng
from sage_tfx.release.continual import (
    ContinualRelease,
    ContinualReleaseError,
    ReleaseParams,
    SlidingWindowRelease,
    clip_features,
    dyadic_cover,
    private_erm,
    sensitivity,
    solve_erm,
)
from tests.helpers.ledgers import daily_ledger

D = 4
W_TRUE = np.array([1.5, -1.0, 0.5, 0.0])


def generated_block(index, n=200, loss="logistic"):
    rng = np.random.default_rng(1000 + index)
    x = rng.normal(size=(n, D)) / 2
    score = x @ W_TRUE + 0.3 * rng.normal(size=n)
    return x, (np.sign(score) if loss == "logistic" else np.clip(score / 3, -1, 1))


def make_ledger(tmp_path, blocks, epsilon=10.0, delta=1e-4):
    return daily_ledger(tmp_path, blocks, epsilon=epsilon, delta=delta, rows=200)


class CheckedReader:
    """Reads a block only if the ledger has a recorded grant charging it (the read happens after the charge)."""

    def __init__(self, ledger, loss="logistic"):
        self.ledger, self.loss, self.read = ledger, loss, []

    def __call__(self, grant):
        grant = self.ledger.verify(grant)  # refuses a grant the ledger did not record (never charged)
        (block,) = grant.blocks
        spent = self.ledger.status("s")["blocks"]
        assert next(b for b in spent if b["id"] == block)["epsilon_spent"] > 0  # charged before this read
        self.read.append(block)
        return generated_block(int(block[1:]), loss=self.loss)


def spent_by_block(ledger):
    return {b["id"]: (b["epsilon_spent"], b["delta_spent"]) for b in ledger.status("s")["blocks"]}


@pytest.mark.parametrize("loss", ["logistic", "squared"])
def test_solver_reaches_the_minimiser(loss):
    x, y = clip_features(*generated_block(0, loss=loss), loss)
    w = solve_erm(x, y, normaliser=len(y), lam=0.1, radius=10.0, loss=loss, tolerance=1e-12)

    # First-order optimality checked numerically: every coordinate's central difference of the objective is 0.
    def objective(u):
        z = x @ u
        loss_values = np.logaddexp(0, -y * z) if loss == "logistic" else 0.5 * (z - y) ** 2
        return loss_values.mean() + 0.05 * u @ u

    for k in range(D):
        e = np.zeros(D)
        e[k] = 1e-5
        assert abs(objective(w + e) - objective(w - e)) / 2e-5 < 1e-6


def test_sensitivity_bound_holds_for_neighbours():
    # Removing any one record moves the (tolerance-stopped) minimiser by at most the stated sensitivity.
    params = ReleaseParams(epsilon=1.0, delta=1e-6, records_per_block=200, lam=0.05)
    x, y = clip_features(*generated_block(3), "logistic")
    w = solve_erm(x, y, normaliser=200, lam=0.05, radius=10.0, loss="logistic")
    worst = max(
        np.linalg.norm(
            w - solve_erm(np.delete(x, i, 0), np.delete(y, i), normaliser=200, lam=0.05, radius=10.0, loss="logistic")
        )
        for i in range(0, 200, 7)
    )
    assert 0 < worst <= sensitivity(params, 1)


def test_noise_statistics():
    # private_erm's noise on a fixed input: mean 0, sd sigma. 1000 draws x 4 coordinates = 4000 samples:
    # the mean's |z| > 6 and the variance ratio outside [0.85, 1.15] (6.7 standard errors of 0.022) each have
    # probability < 1e-8 under the stated distribution, so the false-failure rate is < 1e-7.
    params = ReleaseParams(epsilon=1.0, delta=1e-6, records_per_block=200)
    x, y = generated_block(5)
    w = solve_erm(
        *clip_features(x, y, "logistic"), normaliser=200, lam=params.lam, radius=params.radius, loss="logistic"
    )
    sigma = 0.2
    rng = secure_rng(12345)
    noise = np.array([private_erm(x, y, params=params, blocks=1, sigma=sigma, rng=rng) - w for _ in range(1000)])
    flat = noise.reshape(-1)
    assert abs(flat.mean()) < 6 * sigma / math.sqrt(flat.size)
    assert 0.85 < flat.var() / sigma**2 < 1.15


def test_calibration_matches_the_budget():
    z = gaussian.rdp_multiplier(1.0, 1e-6)
    assert gaussian.rdp_epsilon(z, 1e-6) <= 1.0 + 1e-4
    assert gaussian.rdp_epsilon(z * 0.99, 1e-6) > 1.0


@pytest.mark.parametrize("cls,window", [(ContinualRelease, None), (SlidingWindowRelease, 5)])
def test_per_block_charge_equals_the_bound_and_audit_passes(tmp_path, cls, window):
    blocks = 13
    ledger = make_ledger(tmp_path, blocks)
    params = ReleaseParams(epsilon=2.0, delta=1e-5, records_per_block=200, window=window)
    reader = CheckedReader(ledger)
    rel = cls(ledger, "s", "continual", params, reader, dim=D)
    for i in range(blocks):
        out = rel.observe(f"b{i:03d}")
        assert out.t == i + 1 and out.weights.shape == (D,) and np.all(np.isfinite(out.weights))
        assert reader.read[-1] == f"b{i:03d}" and len(reader.read) == i + 1  # each block read once, at arrival
        # every block seen so far has been charged exactly the bound, once; unseen blocks nothing
        spent = spent_by_block(ledger)
        for j in range(blocks):
            eps, delta = spent[f"b{j:03d}"]
            assert (eps, delta) == ((pytest.approx(2.0), pytest.approx(1e-5)) if j <= i else (0.0, 0.0))
    # the per-record loss of every block stays under the bound charged for it
    rho = rel.per_record_rho()
    assert max(rho.values()) <= rel.rho_bound() * (1 + 1e-9)
    assert gaussian.rdp_epsilon(rel.z_eff, 1e-5) <= 2.0 + 1e-3
    if cls is ContinualRelease:  # block 0 is in every base: its loss approaches the bound
        assert rho["b000"] > 0.4 * rel.rho_bound()
    report = ledger.audit()
    assert report.ok, report.problems
    releases = ledger.releases()
    assert len(releases) == blocks  # one release per block's grant, re-opened by later reads, never recounted
    # each grant's release is the strategy's computation on that grant's block (its registered content)
    assert {r.grant_id: r.computation for r in releases} == {
        g.id: bound_to_data(rel.fingerprint, ledger, g) for g in rel.grants.values()
    }


def test_a_block_grants_release_reopened_on_other_data_is_refused(tmp_path):
    """Each block's release binds the block's registered content digest: the computation that reading another
    block (or other content) under that grant would be is another fingerprint, which the ledger refuses before any
    noise is drawn. The bare strategy fingerprint (every grant's release before) is refused too."""
    ledger = Ledger.open(tmp_path / "ledger.db", create=True)
    ledger.create_stream("s", 10.0, 1e-4)
    for i in range(2):
        ledger.add_block("s", f"b{i:03d}", start=i * 86400, end=(i + 1) * 86400, rows=200, digest=f"{i + 10:064x}")
    params = ReleaseParams(epsilon=2.0, delta=1e-5, records_per_block=200)
    rel = ContinualRelease(ledger, "s", "continual", params, CheckedReader(ledger), dim=D)
    rel.observe("b000")
    rel.observe("b001")
    g0, g1 = rel.grants["b000"], rel.grants["b001"]
    on_b0, on_b1 = bound_to_data(rel.fingerprint, ledger, g0), bound_to_data(rel.fingerprint, ledger, g1)
    assert len({on_b0, on_b1, rel.fingerprint}) == 3
    rel._open("b000")  # the same computation on the same data re-opens (a resume)
    for other in (on_b1, rel.fingerprint):
        with pytest.raises(GrantError, match="another computation|other computation|already released"):
            ledger.release(g0, "training", other, 2.0, 1e-5)
    assert {r.computation for r in ledger.releases(g0.id)} == {on_b0}


def test_cumulative_bound_over_a_long_horizon():
    # Theorem 4's constant: the worst block's rho over 300 arrivals (no ledger: accounting only).
    class FakeLedger:
        def __init__(self):
            self.n = 0

        def request(self, *a, **k):
            self.n += 1
            return type("G", (), {"id": f"g{self.n}", "blocks": [k["blocks"][0]], "stream": "s", "meta": {}})()

        def block_digest(self, stream, block):
            return None

        def stream(self, name):  # a stream whose unit is the row
            return type("S", (), {"unit_rows": 1})()

        def release(self, *a, **k):
            pass

        def private_seed(self, grant_id, purpose):
            return hash((grant_id, purpose)) & 0xFFFFFFFF

    params = ReleaseParams(epsilon=1.0, delta=1e-6, records_per_block=50)
    rel = ContinualRelease(FakeLedger(), "s", "p", params, lambda g: generated_block(0, n=50), dim=D)
    for i in range(300):
        rel.observe(f"b{i}")
    rho = rel.per_record_rho()
    assert max(rho.values()) <= rel.rho_bound() * (1 + 1e-9)
    assert max(rho.values()) > 0.9 * rel.rho_bound()  # the bound is nearly attained: the analysis is tight


def test_sliding_window_adds_and_removes_buckets(tmp_path):
    ledger = make_ledger(tmp_path, 12)
    params = ReleaseParams(epsilon=2.0, delta=1e-5, records_per_block=200, window=7)
    rel = SlidingWindowRelease(ledger, "s", "sw", params, CheckedReader(ledger), dim=D)
    for i in range(12):
        out = rel.observe(f"b{i:03d}")
        start = max(0, i + 1 - 7)
        assert out.blocks == [f"b{j:03d}" for j in range(start, i + 1)]  # exactly the window
        covered = sorted(b for iv in rel.buckets for b in range(*iv) if iv[0] >= start)
        assert set(range(start, i + 1)) <= set(covered)
        assert all(iv[0] >= start for iv in rel.buckets)  # everything older was removed
        assert set(rel.data) == {f"b{j:03d}" for j in range(start, i + 1)}  # old records forgotten
    assert {(0, 4), (4, 8), (4, 6)} <= set(rel.removed) and {(6, 8), (8, 12), (5, 6)} <= set(rel.buckets)


def test_dyadic_cover():
    assert dyadic_cover(3, 10, 2) == [(4, 8), (8, 10), (3, 4)]
    for s in range(20):
        for e in range(s + 1, s + 16):
            cover = dyadic_cover(s, e, 3)
            assert sorted(b for iv in cover for b in range(*iv)) == list(range(s, e))
            assert all(iv[0] % (iv[1] - iv[0]) == 0 and iv[1] - iv[0] <= 8 for iv in cover)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(epsilon=-1.0), "epsilon -1.0 is invalid"),
        (dict(delta=0.0), "delta 0.0 is invalid"),
        (dict(records_per_block=0), "records_per_block 0 is invalid"),
        (dict(lam=0.0), "lam 0.0 is invalid"),
        (dict(loss="hinge"), "loss 'hinge' is unknown"),
        (dict(window=0), "window 0 is invalid"),
        (dict(window=-3), "window -3 is invalid"),
    ],
)
def test_bad_parameters_are_refused_before_any_charge(tmp_path, kwargs, match):
    ledger = make_ledger(tmp_path, 3)
    before = ledger.status("s")
    base = dict(epsilon=1.0, delta=1e-6, records_per_block=200, window=2)
    with pytest.raises(ContinualReleaseError, match=match):
        SlidingWindowRelease(ledger, "s", "p", ReleaseParams(**{**base, **kwargs}), CheckedReader(ledger), dim=D)
    assert ledger.status("s") == before and ledger.grants() == []


def test_window_larger_than_the_stream_is_refused(tmp_path):
    ledger = make_ledger(tmp_path, 3)
    reader = CheckedReader(ledger)
    params = ReleaseParams(epsilon=1.0, delta=1e-6, records_per_block=200, window=9)
    with pytest.raises(ContinualReleaseError, match="window 9 is larger than the stream"):
        SlidingWindowRelease(ledger, "s", "p", params, reader, dim=D, horizon=3)
    with pytest.raises(ContinualReleaseError, match="window 9 is for SlidingWindowRelease"):
        ContinualRelease(ledger, "s", "p", params, reader, dim=D)
    with pytest.raises(ContinualReleaseError, match="dim 0 is invalid"):
        ContinualRelease(ledger, "s", "p", ReleaseParams(epsilon=1.0, delta=1e-6, records_per_block=2), reader, dim=0)
    assert ledger.grants() == [] and reader.read == []


def _taxi_featurize(schema):
    from sage_tfx.ingest.records import decode

    def featurize(records):
        batch = decode(records, schema)

        def col(name):
            return np.array([(v[0] if v else 0.0) for v in batch.column(name).to_pylist()], dtype=np.float64)

        fare, tips = col("fare"), col("tips")
        x = np.stack([np.clip(fare / 100, 0, 1), np.clip(col("trip_miles") / 30, 0, 1), np.ones(len(fare))], 1)
        return x / math.sqrt(3), np.where(tips > 0.2 * fare, 1.0, -1.0)

    return featurize


def test_release_stream_on_real_taxi_blocks_with_sla_and_push(tmp_path):
    # REAL taxi days ingested as sealed daily blocks; every block read through grant_blocks (charged grants only).

    from sage_tfx.release.continual import release_stream
    from sage_tfx.validation.loss import DPLossValidator
    from tests.conftest import replay_taxi_days

    db, data = replay_taxi_days(tmp_path, 4)
    ledger = Ledger.open(db)
    schema = {"fare": "float", "tips": "float", "trip_miles": "float"}  # the columns the features need
    params = ReleaseParams(epsilon=1.0, delta=1e-7, records_per_block=100)
    with pytest.raises(ContinualReleaseError, match="validation_epsilon 2.0 is larger than epsilon"):
        release_stream(
            ledger,
            str(data),
            "taxi",
            "cr",
            params,
            featurize=_taxi_featurize(schema),
            dim=3,
            validator=DPLossValidator(5.0, 2.0, loss_bound=5.0),
        )
    assert ledger.grants() == []
    rel, out = release_stream(
        ledger,
        str(data),
        "taxi",
        "cr",
        params,
        featurize=_taxi_featurize(schema),
        dim=3,
        validator=DPLossValidator(5.0, 0.5, loss_bound=5.0),
        push_dir=str(tmp_path / "push"),
        serving_dir=str(tmp_path / "serve"),
    )
    blocks = [b.id for b in ledger.blocks("taxi")]
    assert [o["block"] for o in out] == blocks and len(blocks) == 4
    assert all(o["sla"] in ("ACCEPT", "REJECT", "RETRY") for o in out)
    for o in out:
        assert os.path.exists(os.path.join(o["model"], "Format-Serving", "weights.npy"))
        assert os.path.exists(os.path.join(o["blessing"], "BLESSED")) == (o["sla"] == "ACCEPT") == o["blessed"]
        assert (o["pushed"] is not None) == o["blessed"]  # only blessed models reach the serving dir
    status = ledger.status("taxi")["blocks"]
    assert all(b["epsilon_spent"] == pytest.approx(1.0) for b in status)  # max(training 1.0, validation 0.5)
    stages = sorted((r.grant_id, r.stage) for r in ledger.releases())
    assert len(stages) == 8 and {s for _, s in stages} == {"training", "validation"}
    assert ledger.audit().ok


def test_sla_check_accepts_a_good_model_and_blesses_only_it(tmp_path):
    # GENERATED blocks of 2000 rows (about 200 test records each, a public per-record hash split).

    from sage_tfx.release.continual import check_sla, push_model
    from sage_tfx.validation.loss import DPLossValidator

    ledger = make_ledger(tmp_path, 3)

    def reader(grant):
        (block,) = ledger.verify(grant).blocks
        return generated_block(int(block[1:]), n=2000)

    params = ReleaseParams(epsilon=2.0, delta=1e-6, records_per_block=2000)
    rel = ContinualRelease(ledger, "s", "p", params, reader, dim=D, validation_epsilon=1.0)
    easy, impossible = DPLossValidator(1.0, 1.0, loss_bound=2.0), DPLossValidator(0.01, 1.0, loss_bound=2.0)
    model = rel.observe("b000")
    assert 100 < len(rel.tests["b000"][1]) < 300 and len(rel.data["b000"][1]) + len(rel.tests["b000"][1]) == 2000
    good = check_sla(rel, model, easy)
    assert good.outcome == "ACCEPT"
    assert check_sla(rel, model, easy).outcome == "ACCEPT"  # re-opened: the same release, the same noise
    with pytest.raises(Exception, match="already released its validation stage"):
        check_sla(rel, model, impossible)  # a second, different check of the same test records is refused
    model2 = rel.observe("b001")
    bad = check_sla(rel, model2, impossible)
    assert bad.outcome != "ACCEPT"
    assert os.path.exists(os.path.join(push_model(str(tmp_path), model, good).blessing_uri, "BLESSED"))
    assert not os.path.exists(os.path.join(push_model(str(tmp_path), model2, bad).blessing_uri, "BLESSED"))
    assert ledger.audit().ok
