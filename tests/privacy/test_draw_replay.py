"""The audit's replay of run-grant draws keeps exact running sums per lifetime grant (privacy/draws.py ``ExactSum``,
``DrawTotals``, ``DrawReplay``): they must decide every draw exactly as summing each grant's whole history does
(``math.fsum`` over the list, what ``Ledger.draw`` runs), and replaying one draw must not read the others' rows."""

import math
import random

import pytest

from sage_tfx.privacy.draws import DrawTotals, ExactSum, _list_terms, overdraws


def _values(rng, n):
    kinds = [
        lambda: rng.uniform(0, 1),
        lambda: rng.uniform(0, 1) * 10 ** rng.randint(-300, 300),
        lambda: rng.choice([0.1, 0.2, 0.3, 1e-16, 1e16]),
        lambda: rng.uniform(-1, 1) * 10 ** rng.randint(-20, 20),
    ]
    return [rng.choice(kinds)() for _ in range(n)]


@pytest.mark.parametrize("seed", range(40))
def test_exact_sum_plus_one_more_is_fsum_of_the_whole_list(seed):
    rng = random.Random(seed)
    values = _values(rng, rng.randint(0, 300))
    total = ExactSum()
    for i, v in enumerate(values):
        total.add(v)
        extra = _values(rng, 1)[0]
        assert math.fsum(total.partials + [extra]) == math.fsum(values[: i + 1] + [extra])
    assert math.fsum(total.partials) == math.fsum(values)


def test_exact_sum_keeps_what_naive_summing_loses():
    total = ExactSum()
    for v in [1e16, 1.0, -1e16] * 1000 + [0.1] * 10:
        total.add(v)
    assert math.fsum(total.partials) == math.fsum([1.0] * 1000 + [0.1] * 10) == 1001.0
    assert sum([1e16, 1.0, -1e16] * 1000) != 1000.0  # what a plain running sum would give instead


def _terms_equal(a, b):
    n_a, eps_a, delta_a, curves_a = a
    n_b, eps_b, delta_b, curves_b = b
    assert n_a == n_b
    assert math.fsum(eps_a) == math.fsum(eps_b)
    assert math.fsum(delta_a) == math.fsum(delta_b)
    assert (curves_a is None) == (curves_b is None)
    if curves_a is not None:
        assert len(curves_a) == len(curves_b)
        assert [math.fsum(c) for c in curves_a] == [math.fsum(c) for c in curves_b]


@pytest.mark.parametrize("seed", range(25))
def test_draw_totals_give_the_sums_of_the_rows(seed):
    """Runs drawn in any order, a run drawn twice (the audit's error case: the rows win), the current run among
    the rows, curves asked at some draws and not others: always what the list of the other runs' rows gives."""
    rng = random.Random(seed)
    totals, rows = DrawTotals("g", 0), {}
    runs = rng.sample(range(400), 60) + [rng.randrange(400) for _ in range(rng.randint(0, 3))]  # maybe repeats
    for r in runs:
        eps, delta = rng.uniform(1e-4, 0.05) * 10 ** rng.randint(-3, 0), rng.uniform(0, 1e-8)
        for asked in (r, rng.randrange(400)):
            curves_too = rng.random() < 0.5
            others = [(e, d) for run, (_g, e, d) in rows.items() if run != asked]
            _terms_equal(totals.terms(asked, eps, delta, curves_too), _list_terms(others, eps, delta, curves_too))
        totals.add(r, f"rg{r}", eps, delta)
        rows[r] = (f"rg{r}", eps, delta)
    assert totals.rows == rows


@pytest.mark.parametrize("composition", ["basic", "zcdp"])
@pytest.mark.parametrize("seed", range(8))
def test_overdraws_decide_the_same_from_totals_and_from_rows(composition, seed):
    """Lifetime grants with histories of different lengths and caps set around their sums: the same {block: why}
    (refusals and their texts) from the replay's totals as from the rows."""
    rng = random.Random(seed)
    lifetimes, prior_rows, prior_totals = [], {}, {}
    for j in range(12):
        gid = f"g{j}"
        history = [(r, rng.uniform(0.001, 0.05), rng.uniform(0, 2e-9)) for r in range(j, 40)]
        spent = math.fsum(e for _, e, _ in history)
        cap = spent * rng.choice([0.5, 0.99, 1.0, 1.01, 2.0]) + 1e-6
        lifetimes.append((gid, {"epsilon": cap, "delta": 1e-6 * rng.choice([0.01, 1.0]), "blocks": [f"b{j}"]}))
        prior_rows[gid] = history
        totals = prior_totals[gid] = DrawTotals(gid, j)
        for r, e, d in history:
            totals.add(r, f"rg{r}", e, d)
    for run, eps, delta in [(40, 0.02, 1e-9), (40, 0.5, 0.0), (7, 0.01, 1e-10), (41, 1e-4, 3e-7)]:
        want = overdraws(run, eps, delta, lifetimes, prior_rows, composition)
        assert overdraws(run, eps, delta, lifetimes, prior_totals, composition) == want
    assert any(overdraws(40, 0.02, 1e-9, lifetimes, prior_rows, composition).values())  # the caps do bite


@pytest.mark.parametrize("composition", ["basic", "zcdp"])
def test_the_audit_replays_a_draw_from_its_own_grants_state_only(tmp_path, monkeypatch, composition):
    """Replaying a draw entry must not walk every earlier draw or release of the ledger (that made auditing T runs
    grow as T^3): the replay's rows are walked once, by the final reconciliation with the table, and the
    ledger's releases never by a draw's replay. A real ledger: 12 lifetime grants, a run at each arrival
    drawn from every grant so far, audited OK."""
    from sage_tfx.privacy import Ledger
    from sage_tfx.privacy import draws as draws_module
    from sage_tfx.release.growth import charge_lifetime

    ledger = Ledger.open(str(tmp_path / "l.db"), create=True)
    ledger.create_stream("s", 10.0, 1e-3)
    lifetimes = []
    for t in range(12):
        ledger.add_block("s", f"b{t}")
        lifetimes.append(charge_lifetime(ledger, "s", "p", f"b{t}", 1.0, 1e-5, {"k": "v"}, "fp"))
        ledger.draw(lifetimes, t, 0.01, 1e-9, schedule="fp", composition=composition)

    walks = {"rows": 0, "releases": 0}

    def walker(name, method):
        def walk(self, *args):
            walks[name] += 1
            return method(self, *args)

        return walk

    class CountedRows(dict):
        items, keys, values, __iter__ = (walker("rows", m) for m in (dict.items, dict.keys, dict.values, dict.__iter__))

    real_init, real_audit_draw = draws_module.DrawReplay.__init__, draws_module.audit_draw

    def init(self):
        real_init(self)
        self.rows = CountedRows()

    class WatchedReleases(dict):
        items, keys, values, __iter__ = (
            walker("releases", m) for m in (dict.items, dict.keys, dict.values, dict.__iter__)
        )

    def audit_draw(ledger_, seq, body, grants, releases, replay, problems):
        return real_audit_draw(ledger_, seq, body, grants, WatchedReleases(releases), replay, problems)

    monkeypatch.setattr(draws_module.DrawReplay, "__init__", init)
    monkeypatch.setattr("sage_tfx.privacy.audit_replay.audit_draw", audit_draw)
    report = ledger.audit()
    assert report.ok, report.problems
    assert walks == {"rows": 1, "releases": 0}, walks
    ledger.close()
