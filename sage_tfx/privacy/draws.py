"""Run grants drawn from per-block lifetime grants: a pipeline re-run under a growth schedule (issue 14, item 3).

Under a growth schedule (``sage_tfx.release.growth``: BBScheduler, the paper seed 001's Section 3.1) every
arriving block is charged ONCE, at arrival, the whole (E, D) its records can ever lose under the schedule: its
*lifetime grant* (one block, single-stage, whose one release is the schedule's computation, fingerprint F). Run i
of the schedule reads ALL blocks so far with a budget (epsilon_i, delta_i) the schedule fixes in advance. The
ledger serves that run with a *run grant*: an ordinary signed ``Grant`` over the lifetime grants' blocks, of
(epsilon_i, delta_i) and the run's stage split, that charges NO block (its budget is drawn from the lifetime grants,
already charged), recorded as one ``draws`` row per (lifetime grant, run index) and one ``draw`` entry of the
chained log. Everything downstream (BlockExampleGen, the stage split, ``Ledger.release``, the validator, Pusher)
sees an ordinary grant.

The rule (basic composition of both parameters). A draw of run i at (epsilon_i, delta_i) from lifetime grants
L_1..L_t is admitted only if, for EVERY L_j, the draws on L_j (this one included, one per run index) satisfy
    sum_i epsilon_i <= E_j  and  sum_i delta_i <= D_j   (relative float slack ``split.SLACK``),
with (E_j, D_j) the (epsilon, delta) L_j charged on its block; and L_j is a one-block grant of the run grant's
stream and pipeline, with the same meta as the others (the schedule's), whose only release is F's (so nothing else
ever spends it), and which is not itself drawn.

Proof sketch (add/remove one record x of block b, adaptive basic composition: Dwork & Roth 2014, Thm. 3.16 and
its adaptive form, Dwork, Rothblum & Vadhan 2010). x is read only by computations under grants naming b: its
lifetime grant L (charged (E, D) on b's filter before anything read b: ``Ledger.request``), and run grants drawn
from L (a run grant's blocks are exactly its lifetime grants' blocks, one each). L's own release is F's, which the
draws subdivide: the run grants are F's runs. Run grant i's stages compose, under its split's rule, to at most
(epsilon_i, delta_i) (``split.BudgetSplit.check_covered`` at the draw, ``Ledger.release`` per stage, the audit
after), so run i is (epsilon_i, delta_i)-DP in x, whatever earlier runs released (its budget is the public
schedule's, fixed before any data was read). By adaptive basic composition the sequence of all runs drawn from L
is (sum epsilon_i, sum delta_i)-DP <= (E, D): x loses no more than its block was charged, over any number of runs.
The primary key (lifetime grant, run) makes a second draw of one run index impossible, under concurrent writers
too (each draw is one write transaction, the ledger's write lock held); a draw asked again with the same budget
returns the SAME run grant (a re-run after a crash re-opens its releases with the same seeds: nothing new).

Why not zCDP (BBImprover, BBScheduler's zcdp mode): their composition needs each run to be epsilon_i-DP (pure);
a TFX pipeline run is (epsilon_i, delta_i)-DP (DP-SGD, Gaussian noise), so only basic composition of both
parameters bounds it without knowing the mechanism's curve (docs/release_strategies.md).

This module holds the rule once: ``Ledger.draw`` runs it in its write transaction and the audit (audit.py)
re-runs it on the replayed log. It imports neither the ledger facade nor the audit (the facade hands ``draw`` its
store, log and keys; the audit hands ``audit_draw`` the ledger).
"""
from __future__ import annotations

import json
import math
import time
from typing import Callable, Iterable, Mapping, Optional, Sequence

from .chain import canonical
from .errors import BudgetRefused, GrantError, LedgerError
from .grants import Grant, check_split, new_grant
from .split import SINGLE_RULE, SLACK, BudgetSplit
from .store import sql
from .streams import read_stream, stream_filter
from .vocabulary import Accounting

DRAW_KEY = "draw"  # grant.meta key of a run grant: {"from": [lifetime grant ids], "run": i, "schedule": F}
COMPOSITION = "basic"


def is_run_grant(body: Mapping) -> bool:
    """Whether a grant body (or Grant.body()) is a run grant (drawn, charging nothing)."""
    return isinstance((body.get("meta") or {}).get(DRAW_KEY), dict)


def structure_problems(run_body: Mapping, lifetimes: Sequence[tuple[str, Optional[Mapping]]],
                       releases: Mapping[str, list], schedule: str) -> list[str]:
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
            out.append(f"lifetime grant {gid!r} is of pipeline {body['pipeline']!r} on stream {body['stream']!r}, "
                       f"not {run_body['pipeline']!r} on {run_body['stream']!r}")
        if len(body["blocks"]) != 1:
            out.append(f"grant {gid!r} names {len(body['blocks'])} blocks: a lifetime grant charges one block")
        if body.get("rule") != SINGLE_RULE:
            out.append(f"grant {gid!r} has a stage split (rule {body.get('rule')!r}): a lifetime grant is "
                       "single-stage, so its one release, the schedule's, is all that ever spends it")
        blocks.extend(body["blocks"])
        metas.append(canonical(body.get("meta") or {}))
        done = releases.get(gid, [])
        if [c for _, c in done] != [schedule]:
            out.append(f"lifetime grant {gid!r} has releases {[c[:16] for _, c in done]}, not the one release of "
                       f"the schedule {schedule[:16]}: open it (the block's charge) before drawing, and never "
                       "release anything else under it")
    if len(set(metas)) > 1:
        out.append("the lifetime grants carry different meta: they are not one schedule's")
    if not out and list(run_body["blocks"]) != blocks:
        out.append(f"the run grant's blocks {list(run_body['blocks'])} are not its lifetime grants' {blocks}")
    return out


def overdraws(run: int, epsilon: float, delta: float, lifetimes: Sequence[tuple[str, Mapping]],
              prior: Mapping[str, Iterable[tuple[int, float, float]]]) -> dict:
    """{block: why} for every lifetime grant on which the draws of the other runs (``prior``: {id: [(run, eps,
    delta)]}) plus this one exceed its (epsilon, delta) by basic composition; {} if all fit (module docstring)."""
    out = {}
    for gid, body in lifetimes:
        others = [(e, d) for r, e, d in prior.get(gid, ()) if r != run]
        eps_sum = math.fsum([e for e, _ in others] + [epsilon])
        delta_sum = math.fsum([d for _, d in others] + [delta])
        cap_eps, cap_delta = float(body["epsilon"]), float(body["delta"])
        if eps_sum > cap_eps * (1 + SLACK) or delta_sum > cap_delta * (1 + SLACK):
            out[body["blocks"][0]] = (f"lifetime grant {gid} (epsilon {cap_eps:.6g}, delta {cap_delta:.3g}) would "
                                      f"compose to (epsilon {eps_sum:.6g}, delta {delta_sum:.3g}) over "
                                      f"{len(others) + 1} runs")
    return out


def draw(store, log: Callable, keys, signature_ok: Callable, lifetime_grants: Sequence, run: int, epsilon: float,
         delta: float, *, schedule: str, split: Optional[BudgetSplit] = None, meta: Optional[dict] = None) -> Grant:
    """``Ledger.draw``: the run grant of run ``run`` at (epsilon, delta) over ``lifetime_grants`` (Grants or ids,
    in block order), drawn in one write transaction of ``store`` (module docstring), signed under ``keys`` (the
    ledger's ``KeyRing``), logged with ``log`` (the facade's ``_log``); ``signature_ok(body, signature)`` checks
    the lifetime grants. Returns the signed Grant; the same grant again for the same (lifetime grants, run,
    budget, split, meta). GrantError for a malformed draw or a run index already drawn otherwise; BudgetRefused
    when a lifetime grant's draws would exceed it. Nothing is written unless a new run grant is returned."""
    ids = [g if isinstance(g, str) else getattr(g, "id", None) for g in lifetime_grants]
    if not ids or not all(isinstance(g, str) and g for g in ids):
        raise LedgerError(f"lifetime_grants {list(lifetime_grants)!r} must be a non-empty list of grants or ids")
    if isinstance(run, bool) or not isinstance(run, int) or run < 0:
        raise LedgerError(f"run {run!r} is invalid: give the schedule's run index, an integer >= 0")
    if not (isinstance(epsilon, (int, float)) and math.isfinite(epsilon) and epsilon > 0):
        raise LedgerError(f"run epsilon {epsilon!r} is invalid: give a finite epsilon > 0")
    if not (isinstance(delta, (int, float)) and 0 <= delta < 1):
        raise LedgerError(f"run delta {delta!r} is invalid: give 0 <= delta < 1")
    if not isinstance(schedule, str) or not 0 < len(schedule) <= 256:
        raise LedgerError(f"schedule {schedule!r} must be the schedule's fingerprint (1-256 characters)")
    meta = dict(meta or {})
    if DRAW_KEY in meta:
        raise LedgerError(f"meta key {DRAW_KEY!r} is the ledger's own: leave it out")
    if split is not None:
        meta["split"] = split.to_dict()
    epsilon, delta = float(epsilon), float(delta)
    n = len(ids)
    with store.transaction() as tx:
        rows = {r[0]: (json.loads(r[1]), r[2]) for r in tx.all(sql.draw_grants(n), ids)}
        lifetimes = [(gid, rows[gid][0] if gid in rows else None) for gid in ids]
        forged = [gid for gid, (body, sig) in rows.items() if not signature_ok(body, sig)]
        if forged:
            raise GrantError(f"lifetime grant(s) {forged} do not verify: their records were altered")
        first = next((body for _, body in lifetimes if body is not None), None)
        if first is None:
            raise GrantError(f"lifetime grant(s) {ids} are unknown to this ledger")
        s = read_stream(tx, first["stream"])
        if s.accounting != Accounting.BASIC:
            raise LedgerError(f"stream {s.name!r} accounts in {s.accounting}: run grants compose by basic "
                              "composition of (epsilon, delta), on a stream with basic accounting only")
        releases = {}
        for gid, stage, computation in tx.all(sql.draw_releases(n), ids):
            releases.setdefault(gid, []).append((stage, computation))
        blocks = [b for _, body in lifetimes if body is not None for b in body["blocks"]]
        filt = stream_filter(s)
        cost = filt.cost(epsilon=epsilon, delta=delta)
        split = check_split(meta, None)  # the split canonical, its fields checked
        meta[DRAW_KEY] = {"from": ids, "run": run, "schedule": schedule, "composition": COMPOSITION}
        probe = {"stream": s.name, "pipeline": first["pipeline"], "blocks": blocks}
        problems = structure_problems(probe, lifetimes, releases, schedule)
        if problems:
            raise GrantError("cannot draw a run grant: " + "; ".join(problems))
        prior, same_run, again = {}, [], None
        for gid, r, run_grant, eps, dlt in tx.all(sql.draw_rows(n), ids):
            prior.setdefault(gid, []).append((r, eps, dlt))
            if r == run:
                same_run.append(run_grant)
        if same_run:  # this run index was drawn: the same draw gets its grant back, any other is refused
            drawn = sorted(set(same_run))
            row = tx.one(sql.draw_grants(1), drawn[:1]) if len(drawn) == 1 else None
            body = json.loads(row[1]) if row else {}
            if (row and len(same_run) == len(ids) and body["meta"] == json.loads(canonical(meta))
                    and (body["epsilon"], body["delta"], body["blocks"]) == (epsilon, delta, blocks)):
                again = Grant.from_row(row[1], row[2])
            else:
                raise GrantError(f"run {run} was already drawn from these lifetime grants (run grant(s) {drawn}) with "
                                 "another budget, split or block set: one release per run index")
        if again is None:
            short = overdraws(run, epsilon, delta, lifetimes, prior)
            if short:
                raise BudgetRefused(s.name, first["pipeline"], short)
            now = time.time()
            rule = SINGLE_RULE if split is None else split.rule
            grant, body_text = new_grant(keys, s, filt, first["pipeline"], blocks, cost, rule, meta, now, split)
            tx.run(sql.GRANT_INSERT, (grant.id, s.name, grant.pipeline, body_text, grant.signature, now))
            tx.many(sql.DRAW_INSERT, [(gid, run, grant.id, s.name, epsilon, delta, now) for gid in ids])
            log(tx, "draw", dict(grant.body(), signature=grant.signature))
    return grant if again is None else again


def audit_draw(ledger, seq: int, body: dict, grants: dict, releases: dict, draws: dict, problems: list) -> None:
    """Replay one ``draw`` log entry (audit.py): the run grant's signature, the rule against the replayed
    grants, releases and earlier draws; record the grant (``grants``) and its rows (``draws``)."""
    signature = body.pop("signature", "")
    gid = body.get("id")
    if not ledger.signature_ok(body, signature):
        problems.append(f"log entry {seq}: run grant {gid!r} has an invalid signature")
    info = (body.get("meta") or {}).get(DRAW_KEY) or {}
    ids, run = list(info.get("from") or []), info.get("run")
    lifetimes = [(g, json.loads(grants[g][0]) if g in grants else None) for g in ids]
    done = {}
    for (g, stage), (computation, _e, _d) in releases.items():
        if g in ids:
            done.setdefault(g, []).append((stage, computation))
    where = f"log entry {seq}: run grant {gid!r}"
    for text in structure_problems(body, lifetimes, done, str(info.get("schedule"))):
        problems.append(f"{where}: {text}")
    prior = {}
    for (g, r), (_rg, _s, e, d) in draws.items():
        prior.setdefault(g, []).append((r, e, d))
    for g in ids:
        if (g, run) in draws:
            problems.append(f"{where}: run {run} was already drawn from lifetime grant {g!r}")
    known = [(g, b) for g, b in lifetimes if b is not None]
    for block, why in sorted(overdraws(run, float(body["epsilon"]), float(body["delta"]), known, prior).items()):
        problems.append(f"{where} overdraws block {block!r}: {why}")
    grants[gid] = (canonical(body), signature)
    for g in ids:
        draws[(g, run)] = (gid, body["stream"], float(body["epsilon"]), float(body["delta"]))
