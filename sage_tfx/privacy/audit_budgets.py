"""The audit's budget checks on the replayed state: every block within its stream's budget, every grant's released
stages within what the grant charged (docs/block_composition.md, "What an rdp grant's stages may spend").
"""

import json

from .audit_replay import _Replay
from .errors import LedgerError
from .grants import Grant, cap_text, capped, older_rdp, stage_cap
from .split import SLACK, BudgetSplit, over_budget, per_row_budget, per_row_split, unit_rows
from .unit_share import audited_shares, unit_costs


def _check_block_budgets(r: _Replay) -> None:
    """Every replayed block within its stream's global budget."""
    for (stream, block_id), replayed in r.blocks.items():
        filt = r.streams[stream]
        if not filt.admits(replayed["spent"], filt.zero()):
            r.problems.append(
                f"block {block_id!r} of stream {stream!r} exceeds the global budget: "
                f"{filt.shortfall(replayed['spent'], filt.zero()) or replayed['spent']}"
            )


def _grant_split(grant_body_text):
    """(grant body, its BudgetSplit or None, or an error text)."""
    body = json.loads(grant_body_text)
    try:
        return body, BudgetSplit.from_meta(body.get("meta")), None
    except LedgerError as exc:
        return body, None, str(exc)


def _check_release_totals(grants, releases, streams, problems, per_unit):
    """Every grant's released stages, recomposed by its split's rule, within what the grant charged. An older ``rdp``
    grant's stages within what its cost pays for (``grants.stage_cap``, with its stream's replayed filter: the rule
    ``Ledger.release`` applies); a release above it is a problem whenever it was made (the sage of its day allowed
    it, but it spent more than the filter charged its blocks, so the stream's guarantee does not cover it)."""
    by_grant = {}
    for (gid, stage), (_, eps, delta) in releases.items():
        by_grant.setdefault(gid, {})[stage] = (eps, delta)
    for gid, (body_text, _sig) in grants.items():
        body, split, error = _grant_split(body_text)
        if error:
            problems.append(f"grant {gid!r}: its split is invalid ({error})")
            continue
        epsilon, delta = float(body["epsilon"]), float(body["delta"])
        if split is not None and split.charged_epsilon > epsilon * (1 + SLACK):
            problems.append(
                f"grant {gid!r}: its split composes to epsilon {split.charged_epsilon:.6g} under "
                f"{split.rule!r}, more than its charge {epsilon:.6g}"
            )
        if split is not None and split.total_delta > delta * (1 + SLACK):
            problems.append(
                f"grant {gid!r}: its split's deltas add to {split.total_delta:.3g}, more than its charge {delta:.3g}"
            )
        spent = by_grant.get(gid, {})
        if not spent:
            continue
        cap = stage_cap(Grant.from_json(body), streams[body["stream"]])
        recorded = epsilon
        epsilon, delta, split = capped(epsilon, delta, split, cap)
        try:  # a unit stream's stages spend per row (split.per_row_budget)
            k = unit_rows(body.get("meta"))
        except LedgerError as exc:  # GrantError is one
            problems.append(f"grant {gid!r}: {exc}")
            continue
        unit_split, split = split, None if split is None else per_row_split(split, k)
        units = {stage: per_unit.get((gid, stage)) for stage in spent}
        why = (
            ""
            if cap is None
            else (
                f" ({cap_text(gid, recorded, cap, split)}; a release above that spent more "
                "than the filter charged the grant's blocks, whichever sage allowed it)"
            )
        )
        rows = {s: per_row_budget(epsilon, delta, k) if split is None else split.stage_budget(s) for s in spent}
        allowed = audited_shares(gid, body.get("meta"), units, rows, epsilon, delta, unit_split, problems)
        if split is None and len(spent) > 1:
            problems.append(f"grant {gid!r} is single-stage but stages {sorted(spent)} each released under it")
        what = "the charge allows" if split is None else "its share"
        for stage, (eps, dlt) in spent.items():
            if over_budget(eps, dlt, allowed[stage]):
                problems.append(
                    f"grant {gid!r}: stage {stage!r} released (epsilon={eps:.6g}, delta={dlt:.3g}), "
                    f"more than {what} (epsilon={allowed[stage][0]:.6g}, "
                    f"delta={allowed[stage][1]:.3g}){why}"
                )
        if split is None:
            continue
        total = unit_split.composed(unit_costs(spent, units, k))
        if total > epsilon * (1 + SLACK):
            problems.append(
                f"grant {gid!r}: its stages released epsilon {total:.6g} under {split.rule!r}, more "
                f"than its charge {epsilon:.6g}{why}"
            )
        total_delta = sum(d for _, d in spent.values())
        if total_delta > delta * (1 + SLACK):
            problems.append(
                f"grant {gid!r}: its stages released delta {total_delta:.3g}, more than its charge {delta:.3g}{why}"
            )


def _note_converted_rule(grants, notes):
    """A note naming how many ``rdp`` grants were made before grants recorded what was asked (``grants.older_rdp``:
    their epsilon the conversion; their stages capped at what their charge pays for)."""
    older = sum(1 for text, _sig in grants.values() if older_rdp(Grant.from_json(text)))
    if older:
        notes.append(
            f"{older} rdp grant(s) were made before grants recorded what was asked: their epsilon is the "
            "charge converted at the stream's delta, more than the filter charged; their stages may spend "
            "only what the charge pays for, and a release above it is listed as a problem "
            "(docs/block_composition.md, 'What an rdp grant's stages may spend')"
        )
