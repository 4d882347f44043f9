"""Run grants drawn from per-block lifetime grants: a pipeline re-run under a growth schedule.

Every arriving block is charged once, at arrival, a *lifetime grant* (E, D); run i of the schedule reads
all blocks so far under a *run grant* (epsilon_i, delta_i) drawn from those lifetime grants, charging no
block. Contract: a draw is admitted only if, on every lifetime grant, the runs drawn compose under the
draws' one composition ("basic": sums of epsilon and delta; "zcdp": the RDP filter at D / 2 plus deltas
summing to at most D / 2) to at most (E, D), so a record loses no more than its block was charged, over
any number of runs. ``Ledger.draw`` runs the rule in its write transaction and the audit re-runs it on the
replayed log; this module imports neither. Rules and proofs: docs/release_strategies.md, "Run grants drawn
from lifetime grants: the two rules and their proofs".
"""

from __future__ import annotations

import functools
import json
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, cast

from . import curves
from .chain import canonical
from .errors import BudgetRefused, GrantError, LedgerError
from .filters import RdpFilter
from .grants import Grant, check_split, new_grant
from .split import SINGLE_RULE, SLACK, BudgetSplit, unit_meta
from .store import sql
from .streams import read_stream, stream_filter
from .vocabulary import Accounting, Composition

DRAW_KEY = "draw"  # grant.meta key of a run grant: {"from": [ids], "run": i, "schedule": F, "composition": C}
COMPOSITION = Composition.BASIC  # the default rule, and the rule of a draw that records none (older ledgers)
COMPOSITIONS = (Composition.BASIC, Composition.ZCDP)
ZCDP_RUN_DELTA_SHARE = (
    0.5  # under "zcdp": the draws' deltas may sum to this share of D; the filter converts at the rest
)


def is_run_grant(body: Mapping) -> bool:
    """Whether a grant body (or Grant.body()) is a run grant (drawn, charging nothing)."""
    return isinstance((body.get("meta") or {}).get(DRAW_KEY), dict)


def composition_of(body: Mapping) -> str:
    """The draw rule a run grant body was drawn under ("basic" when it records none: older ledgers)."""
    return (body.get("meta") or {}).get(DRAW_KEY, {}).get("composition", COMPOSITION)


def mixed_compositions(composition: str, earlier: Mapping[str, str]) -> list[str]:
    """What refuses a draw under ``composition`` from lifetime grants whose earlier draws were under
    ``earlier`` ({lifetime grant id: composition}); [] if all agree (one composition per lifetime grant)."""
    return [
        f"lifetime grant {gid!r} was drawn under composition {was!r}: a draw under {composition!r} would mix "
        "two rules on it (all draws of one lifetime grant use one composition)"
        for gid, was in earlier.items()
        if was != composition
    ]


def structure_problems(
    run_body: Mapping, lifetimes: Sequence[tuple[str, Mapping | None]], releases: Mapping[str, list], schedule: str
) -> list[str]:
    """What makes ``run_body`` (a run grant body) not drawable from ``lifetimes`` ([(id, body or None)], in the
    run grant's block order) whose releases are ``releases`` ({id: [(stage, computation)]}); [] if drawable."""
    out = []
    ids = [gid for gid, _ in lifetimes]
    if len(set(ids)) != len(ids):
        out.append(f"lifetime grants named more than once: {sorted({g for g in ids if ids.count(g) > 1})}")
    blocks, metas = [], []
    for gid, body in lifetimes:
        if body is None:
            out.append(f"lifetime grant {gid!r} is unknown to this ledger")
            continue
        if is_run_grant(body):
            out.append(f"grant {gid!r} is a run grant itself: draw from lifetime grants only")
            continue
        if (body["stream"], body["pipeline"]) != (run_body["stream"], run_body["pipeline"]):
            out.append(
                f"lifetime grant {gid!r} is of pipeline {body['pipeline']!r} on stream {body['stream']!r}, "
                f"not {run_body['pipeline']!r} on {run_body['stream']!r}"
            )
        if len(body["blocks"]) != 1:
            out.append(f"grant {gid!r} names {len(body['blocks'])} blocks: a lifetime grant charges one block")
        if body.get("rule") != SINGLE_RULE:
            out.append(
                f"grant {gid!r} has a stage split (rule {body.get('rule')!r}): a lifetime grant is "
                "single-stage, so its one release, the schedule's, is all that ever spends it"
            )
        blocks.extend(body["blocks"])
        metas.append(canonical(body.get("meta") or {}))
        done = releases.get(gid, [])
        if [c for _, c in done] != [schedule]:
            out.append(
                f"lifetime grant {gid!r} has releases {[c[:16] for _, c in done]}, not the one release of "
                f"the schedule {schedule[:16]}: open it (the block's charge) before drawing, and never "
                "release anything else under it"
            )
    if len(set(metas)) > 1:
        out.append("the lifetime grants carry different meta: they are not one schedule's")
    if not out and list(run_body["blocks"]) != blocks:
        out.append(f"the run grant's blocks {list(run_body['blocks'])} are not its lifetime grants' {blocks}")
    return out


class ExactSum:
    """The exact sum of the floats added so far, held as non-overlapping partials (Shewchuk's algorithm, the one
    ``math.fsum`` runs): ``math.fsum(partials + more)`` is the correctly rounded sum of every value added and of
    ``more``, so the same float as ``math.fsum`` over the whole list (tests/privacy/test_draw_replay.py). Adding is O(1)
    amortized: a replay keeps each lifetime grant's totals as its draws come, instead of summing its history at
    every draw. Finite values only (budgets are)."""

    __slots__ = ("partials",)

    def __init__(self) -> None:
        self.partials: list[float] = []

    def add(self, x: float) -> None:
        partials, i = self.partials, 0
        for y in partials:
            if abs(x) < abs(y):
                x, y = y, x
            hi = x + y
            lo = y - (hi - x)
            if lo:
                partials[i] = lo
                i += 1
            x = hi
        partials[i:] = [x]


class DrawTotals:
    """One lifetime grant's draws as a replay sees them: ``rows`` {run: (run grant, epsilon, delta)} in replay order
    (a run seen again keeps its place and takes the new values, as a dict does), and exact running sums of their
    epsilons, deltas and (folded on first use) pure-DP curves, which ``overdraws`` reads instead of the rows."""

    __slots__ = ("grant", "rows", "eps", "delta", "order", "_curves", "_pending", "_stale")

    def __init__(self, grant: str = "", order: int = 0) -> None:
        self.grant, self.order = grant, order  # order: of the grant's first draw in the replay
        self.rows: dict = {}
        self.eps, self.delta = ExactSum(), ExactSum()
        self._curves: list | None = None
        self._pending: list = []
        self._stale = False

    def add(self, run: int, run_grant: str, epsilon: float, delta: float) -> None:
        if run in self.rows:  # a run index drawn twice (the audit reports it): the sums are rebuilt from the rows
            self._stale = True
        self.rows[run] = (run_grant, epsilon, delta)
        if not self._stale:
            self.eps.add(epsilon)
            self.delta.add(delta)
            self._pending.append(epsilon)  # its curve is added to the per-order sums when first needed

    def terms(self, run: int, epsilon: float, delta: float, curves_too: bool):
        """(number of other runs, epsilon terms, delta terms, per-order curve terms of the other runs or None):
        lists whose ``math.fsum`` is what summing the other runs' rows and this draw gives."""
        if self._stale or run in self.rows:  # the rare case: sum the rows themselves
            others = [(e, d) for r, (_g, e, d) in self.rows.items() if r != run]
            return _list_terms(others, epsilon, delta, curves_too)
        curve_terms = None
        if curves_too:
            if self._curves is None:
                self._curves = [ExactSum() for _ in curves.DEFAULT_ORDERS]
            for e in self._pending:
                for total, c in zip(self._curves, _pure_curve(e)):
                    total.add(c)
            self._pending = []
            curve_terms = [list(total.partials) for total in self._curves]
        return (len(self.rows), self.eps.partials + [epsilon], self.delta.partials + [delta], curve_terms)


def _list_terms(others: list, epsilon: float, delta: float, curves_too: bool):
    curve_terms = None
    if curves_too:
        curve_terms = (
            [list(column) for column in zip(*(_pure_curve(e) for e, _ in others))]
            if others
            else [[] for _ in curves.DEFAULT_ORDERS]
        )
    return (len(others), [e for e, _ in others] + [epsilon], [d for _, d in others] + [delta], curve_terms)


def overdraws(
    run: int,
    epsilon: float,
    delta: float,
    lifetimes: Sequence[tuple[str, Mapping]],
    prior: Mapping[str, Iterable[tuple[int, float, float]] | DrawTotals],
    composition: str = COMPOSITION,
) -> dict:
    """{block: why} for every lifetime grant on which the draws of the other runs (``prior``: {id: [(run, eps,
    delta)]}, or {id: ``DrawTotals``} as the audit's replay keeps them) plus this one break ``composition``'s rule
    ("basic" or "zcdp", docs/release_strategies.md); {} if all fit. Both forms give the same sums (``ExactSum``)."""
    out = {}
    zcdp = composition != COMPOSITION
    for gid, body in lifetimes:
        got = prior.get(gid, ())
        if isinstance(got, DrawTotals):
            n_others, eps_terms, delta_terms, curve_terms = got.terms(run, epsilon, delta, zcdp)
        else:
            others = [(e, d) for r, e, d in got if r != run]
            n_others, eps_terms, delta_terms, curve_terms = _list_terms(others, epsilon, delta, zcdp)
        cap_eps, cap_delta = float(body["epsilon"]), float(body["delta"])
        if zcdp:
            why = _zcdp_overdraw(delta_terms, curve_terms, epsilon, cap_eps, cap_delta)
        else:
            why = _basic_overdraw(eps_terms, delta_terms, cap_eps, cap_delta)
        if why:
            out[body["blocks"][0]] = (
                f"lifetime grant {gid} (epsilon {cap_eps:.6g}, delta {cap_delta:.3g}) {why} over {n_others + 1} runs"
            )
    return out


def _basic_overdraw(eps_terms: list, delta_terms: list, cap_eps: float, cap_delta: float) -> str:
    eps_sum = math.fsum(eps_terms)
    delta_sum = math.fsum(delta_terms)
    if eps_sum > cap_eps * (1 + SLACK) or delta_sum > cap_delta * (1 + SLACK):
        return f"would compose to (epsilon {eps_sum:.6g}, delta {delta_sum:.3g})"
    return ""


@functools.lru_cache(maxsize=1 << 16)
def _pure_curve(epsilon: float) -> tuple:
    """``curves.pure_dp_curve(epsilon)`` at the default orders (cached: a run's epsilon recurs on every lifetime
    grant it was drawn from)."""
    return curves.pure_dp_curve(epsilon, curves.DEFAULT_ORDERS)


@functools.lru_cache(maxsize=256)
def zcdp_filter(epsilon: float, delta: float) -> RdpFilter:
    """The RDP filter of a lifetime grant of (epsilon, delta) under the "zcdp" rule: its delta split at
    ``ZCDP_RUN_DELTA_SHARE`` (the runs' deltas; the rest converts), at the default orders (docs/release_strategies.md).
    LedgerError if it leaves no budget at any order. Built once per (epsilon, delta) (filters are not changed
    after construction; a schedule's lifetime grants share one budget, and every draw checks each of them)."""
    # every order converts at all of the conversion's half: the rule the draws were made and are audited by. Its
    # runs' budgets are the schedule's, fixed before any data is read (docs/release_strategies.md), so their composed curve
    # is one fixed curve, whose best order may be chosen after the fact (the ordinary conversion); the per-path
    # choice that filters.RdpFilter pays a union bound for does not arise.
    return RdpFilter(epsilon, delta, query_delta_share=ZCDP_RUN_DELTA_SHARE, split_orders=False)


def _zcdp_overdraw(delta_terms: list, curve_terms: list, epsilon: float, cap_eps: float, cap_delta: float) -> str:
    """Why the RDP filter of (cap_eps, cap_delta), its delta coordinate fixed at the runs' share, refuses a draw of
    ``epsilon`` after the other runs (their pure-DP curves summed per order: ``curve_terms``; every run's delta,
    this one's too: ``delta_terms``) ("" if it admits it; docs/release_strategies.md)."""
    if cap_delta <= 0:
        return "has delta 0: composition 'zcdp' needs a lifetime delta > 0 (draw under 'basic')"
    runs_delta = cap_delta * ZCDP_RUN_DELTA_SHARE
    delta_sum = math.fsum(delta_terms)
    if delta_sum > runs_delta * (1 + SLACK):
        return (
            f"would compose to delta {delta_sum:.3g} over its runs, above the runs' share "
            f"{runs_delta:.3g} (half its delta; the other half converts the Renyi sum) under composition 'zcdp'"
        )
    try:
        filt = zcdp_filter(cap_eps, cap_delta)
    except LedgerError as exc:
        return f"admits no run under composition 'zcdp': {exc}"
    spent = (runs_delta,) + tuple(math.fsum(column) for column in curve_terms)
    cost = (0.0,) + _pure_curve(epsilon)
    if filt.admits(spent, cost):
        return ""
    return f"would exceed its Renyi filter under composition 'zcdp' ({filt.shortfall(spent, cost)})"


def draw(
    store,
    log: Callable,
    keys,
    signature_ok: Callable,
    lifetime_grants: Sequence,
    run: int,
    epsilon: float,
    delta: float,
    *,
    schedule: str,
    split: BudgetSplit | None = None,
    meta: dict | None = None,
    composition: str = COMPOSITION,
) -> Grant:
    """``Ledger.draw``: the run grant of run ``run`` at (epsilon, delta) over ``lifetime_grants``.

    Drawn under ``composition`` ("basic" or "zcdp": the two rules of docs/release_strategies.md) in one write transaction of
    ``store``; nothing is written unless a new run grant is returned.

    Args:
        store: the ledger's store.
        log: the facade's ``_log``.
        keys: the ledger's ``KeyRing``, which signs the run grant.
        signature_ok: ``signature_ok(body, signature)``, which checks the lifetime grants.
        lifetime_grants: Grants or ids, in block order.
        run, epsilon, delta: the schedule's run index and the run's budget.
        schedule: the schedule's fingerprint (1-256 characters).
        split, meta, composition: the run grant's split, metadata and composition rule.

    Returns:
        The signed Grant; the same grant again for the same (lifetime grants, run, budget, split, meta).

    Raises:
        LedgerError: a malformed draw.
        GrantError: forged or unknown lifetime grants, a structure the rule refuses, or a run index drawn before.
        BudgetRefused: a lifetime grant's draws would exceed it.
    """
    ids, composition, meta, epsilon, delta = _check_draw_args(
        lifetime_grants, run, epsilon, delta, composition, schedule, meta, split
    )
    with store.transaction() as tx:
        lifetimes, first, s, blocks = _read_lifetimes(tx, ids, signature_ok)
        filt = stream_filter(s)
        cost = filt.cost(epsilon=epsilon, delta=delta)
        split = check_split(meta, None)  # the split canonical, its fields checked
        meta[DRAW_KEY] = {"from": ids, "run": run, "schedule": schedule, "composition": composition}
        meta = unit_meta(meta, s.privacy_unit, s.max_rows_per_unit)  # as new_grant signs it: a re-draw compares equal
        _check_structure(tx, ids, s, first, blocks, lifetimes, schedule)
        prior, latest, same_run = _prior_draws(tx, ids, run)
        if same_run:  # this run index was drawn: the same draw gets its grant back, any other is refused
            return _drawn_again(tx, run, ids, same_run, meta, epsilon, delta, blocks)
        _check_budget(tx, s, first, latest, prior, run, epsilon, delta, lifetimes, composition)
        now = time.time()
        rule = SINGLE_RULE if split is None else split.rule
        grant, body_text = new_grant(keys, s, filt, first["pipeline"], blocks, cost, rule, meta, now, split)
        tx.run(sql.GRANT_INSERT, (grant.id, s.name, grant.pipeline, body_text, grant.signature, now))
        tx.many(sql.DRAW_INSERT, [(gid, run, grant.id, s.name, epsilon, delta, now) for gid in ids])
        log(tx, "draw", dict(grant.body(), signature=grant.signature), at=now)
    return grant


def _check_draw_args(
    lifetime_grants: Sequence,
    run: int,
    epsilon: float,
    delta: float,
    composition: str,
    schedule: str,
    meta: dict | None,
    split: BudgetSplit | None,
) -> tuple:
    """The draw's arguments checked before any transaction: ``(ids, composition, meta, epsilon, delta)``.

    Raises:
        LedgerError: naming the bad argument.
    """
    ids = [g if isinstance(g, str) else getattr(g, "id", None) for g in lifetime_grants]
    if not ids or not all(isinstance(g, str) and g for g in ids):
        raise LedgerError(f"lifetime_grants {list(lifetime_grants)!r} must be a non-empty list of grants or ids")
    if isinstance(run, bool) or not isinstance(run, int) or run < 0:
        raise LedgerError(f"run {run!r} is invalid: give the schedule's run index, an integer >= 0")
    if not (isinstance(epsilon, (int, float)) and math.isfinite(epsilon) and epsilon > 0):
        raise LedgerError(f"run epsilon {epsilon!r} is invalid: give a finite epsilon > 0")
    if not (isinstance(delta, (int, float)) and 0 <= delta < 1):
        raise LedgerError(f"run delta {delta!r} is invalid: give 0 <= delta < 1")
    if composition not in COMPOSITIONS:
        raise LedgerError(
            f"composition {composition!r} is unknown: give 'basic' (sums of epsilon and delta) or "
            "'zcdp' (approximate zCDP through the RDP filter; privacy/draws.py)"
        )
    composition = Composition(composition).value  # the plain string the grant records and messages name
    if not isinstance(schedule, str) or not 0 < len(schedule) <= 256:
        raise LedgerError(f"schedule {schedule!r} must be the schedule's fingerprint (1-256 characters)")
    meta = dict(meta or {})
    if DRAW_KEY in meta:
        raise LedgerError(f"meta key {DRAW_KEY!r} is the ledger's own: leave it out")
    if split is not None:
        meta["split"] = split.to_dict()
    return ids, composition, meta, float(epsilon), float(delta)


def _read_lifetimes(tx, ids: list[str], signature_ok: Callable) -> tuple:
    """``(lifetimes, first body, stream, blocks)`` of the lifetime grants ``ids``, each verified.

    Raises:
        GrantError: a lifetime grant whose record was altered, or none known to this ledger.
        LedgerError: a stream without basic accounting.
    """
    rows = {r[0]: (json.loads(r[1]), r[2]) for r in tx.all(sql.draw_grants(len(ids)), ids)}
    lifetimes: list[tuple[Any, Any]] = [(gid, rows[gid][0] if gid in rows else None) for gid in ids]
    forged = [gid for gid, (body, sig) in rows.items() if not signature_ok(body, sig)]
    if forged:
        raise GrantError(f"lifetime grant(s) {forged} do not verify: their records were altered")
    first = next((body for _, body in lifetimes if body is not None), None)
    if first is None:
        raise GrantError(f"lifetime grant(s) {ids} are unknown to this ledger")
    s = read_stream(tx, first["stream"])
    if s.accounting != Accounting.BASIC:
        raise LedgerError(
            f"stream {s.name!r} accounts in {s.accounting}: run grants are drawn from lifetime "
            "grants charged (epsilon, delta), on a stream with basic accounting only"
        )
    blocks = [b for _, body in lifetimes if body is not None for b in body["blocks"]]
    return lifetimes, first, s, blocks


def _check_structure(tx, ids: list[str], s, first: dict, blocks: list, lifetimes: list, schedule: str) -> None:
    """GrantError unless the lifetime grants and their releases have the structure a draw needs."""
    releases: dict = {}
    for gid, stage, computation in tx.all(sql.draw_releases(len(ids)), ids):
        releases.setdefault(gid, []).append((stage, computation))
    probe = {"stream": s.name, "pipeline": first["pipeline"], "blocks": blocks}
    problems = structure_problems(probe, lifetimes, releases, schedule)
    if problems:
        raise GrantError("cannot draw a run grant: " + "; ".join(problems))


def _prior_draws(tx, ids: list[str], run: int) -> tuple[dict, dict, list]:
    """``(prior, latest, same_run)``: each lifetime grant's earlier draws (run, epsilon, delta), its latest
    (run, run grant), and the run grants already drawn for ``run``."""
    prior: dict = {}
    latest: dict = {}
    same_run = []
    for gid, r, run_grant, eps, dlt in tx.all(sql.draw_rows(len(ids)), ids):
        prior.setdefault(gid, []).append((r, eps, dlt))
        if r >= latest.get(gid, (-1,))[0]:
            latest[gid] = (r, run_grant)
        if r == run:
            same_run.append(run_grant)
    return prior, latest, same_run


def _drawn_again(
    tx, run: int, ids: list[str], same_run: list, meta: dict, epsilon: float, delta: float, blocks: list
) -> Grant:
    """The run grant of the same draw made before; GrantError if ``run`` was drawn with other terms."""
    drawn = sorted(set(same_run))
    row = tx.one(sql.draw_grants(1), drawn[:1]) if len(drawn) == 1 else None
    body = json.loads(row[1]) if row else {}
    if (
        row
        and len(same_run) == len(ids)
        and body["meta"] == json.loads(canonical(meta))
        and (body["epsilon"], body["delta"], body["blocks"]) == (epsilon, delta, blocks)
    ):
        return Grant.from_row(row[1], row[2])
    raise GrantError(
        f"run {run} was already drawn from these lifetime grants (run grant(s) {drawn}) with "
        "another budget, split or block set: one release per run index"
    )


def _check_budget(
    tx,
    s,
    first: dict,
    latest: dict,
    prior: dict,
    run: int,
    epsilon: float,
    delta: float,
    lifetimes: list,
    composition: str,
) -> None:
    """GrantError for compositions mixed across draws; BudgetRefused when the draw overdraws a lifetime grant."""
    earlier = _compositions(tx, latest)
    mixed = mixed_compositions(composition, earlier)
    if mixed:
        raise GrantError("cannot draw a run grant: " + "; ".join(mixed))
    short = overdraws(run, epsilon, delta, lifetimes, prior, composition)
    if short:
        raise BudgetRefused(s.name, first["pipeline"], short)


def _compositions(tx, latest: Mapping[str, tuple]) -> dict:
    """{lifetime grant: the composition of its latest earlier draw} (``latest``: {id: (run, run grant id)}); by
    induction every draw of a lifetime grant has that one composition."""
    wanted = sorted({rg for _, rg in latest.values()})
    bodies = {r[0]: json.loads(r[1]) for r in tx.all(sql.draw_grants(len(wanted)), wanted)} if wanted else {}
    return {gid: composition_of(bodies.get(rg, {})) for gid, (_, rg) in latest.items()}


class DrawReplay:
    """The audit's replay of the draws: ``rows`` {(lifetime grant, run): (run grant, stream, epsilon, delta)} in
    replay order (what the ``draws`` table must hold), ``totals`` {lifetime grant: ``DrawTotals``} and ``stages``
    {grant: its released stages in replay order, ``release``}, so that replaying one draw reads its own lifetime
    grants' state only, not every earlier draw and release of the ledger."""

    __slots__ = ("rows", "totals", "stages")

    def __init__(self) -> None:
        self.rows: dict = {}
        self.totals: dict = {}
        self.stages: dict = {}

    def release(self, grant_id: str, stage: str) -> None:
        """A release the audit recorded (``releases[(grant_id, stage)]``)."""
        self.stages.setdefault(grant_id, []).append(stage)


def audit_draw(ledger, seq: int, body: dict, grants: dict, releases: dict, replay: DrawReplay, problems: list) -> None:
    """Replay one ``draw`` log entry (audit.py): the run grant's signature, the rule against the replayed
    grants, releases and earlier draws; record the grant (``grants``) and its rows (``replay``)."""
    signature = body.pop("signature", "")
    gid = body.get("id")
    if not ledger.signature_ok(body, signature):
        problems.append(f"log entry {seq}: run grant {gid!r} has an invalid signature")
    info = (body.get("meta") or {}).get(DRAW_KEY) or {}
    ids, run = list(info.get("from") or []), cast(int, info.get("run"))  # as logged; checked by the replay
    lifetimes = [(g, json.loads(grants[g][0]) if g in grants else None) for g in ids]
    distinct, done = list(dict.fromkeys(ids)), dict[str, list]()
    for g in distinct:
        for stage in replay.stages.get(g, ()):
            done.setdefault(g, []).append((stage, releases[(g, stage)][0]))
    where = f"log entry {seq}: run grant {gid!r}"
    for text in structure_problems(body, lifetimes, done, str(info.get("schedule"))):
        problems.append(f"{where}: {text}")
    prior, latest = {}, {}
    for totals in sorted((replay.totals[g] for g in distinct if g in replay.totals), key=lambda t: t.order):
        g = totals.grant
        prior[g] = totals
        r, (rg, _e, _d) = next(reversed(totals.rows.items()))  # replay order: the last seen is the latest draw
        latest[g] = (r, rg)
    composition = composition_of(body)
    parsed = {rg: json.loads(grants[rg][0]) for rg in {rg for _, rg in latest.values()} if rg in grants}
    earlier = {g: composition_of(parsed.get(rg, {})) for g, (_, rg) in latest.items()}
    if composition not in COMPOSITIONS:
        problems.append(f"{where}: composition {composition!r} is unknown")
    for text in mixed_compositions(composition, earlier):
        problems.append(f"{where}: {text}")
    for g in ids:
        if (g, run) in replay.rows:
            problems.append(f"{where}: run {run} was already drawn from lifetime grant {g!r}")
    known = [(g, b) for g, b in lifetimes if b is not None]
    for block, why in sorted(
        overdraws(run, float(body["epsilon"]), float(body["delta"]), known, prior, composition).items()
    ):
        problems.append(f"{where} overdraws block {block!r}: {why}")
    grants[gid] = (canonical(body), signature)
    for g in ids:
        replay.rows[(g, run)] = (gid, body["stream"], float(body["epsilon"]), float(body["delta"]))
        totals = replay.totals.get(g)
        if totals is None:
            totals = replay.totals[g] = DrawTotals(g, len(replay.totals))
        totals.add(run, gid, float(body["epsilon"]), float(body["delta"]))
