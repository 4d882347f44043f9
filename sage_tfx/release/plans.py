"""Each strategy's plan for a release session: every check before any charge, then the strategy resumed from the
ledger, its ``observe`` step and how each released block is reported (``sage_tfx.release.session.Plan``).

``PLANS`` maps a settings class (``sage_tfx.release.settings``) to its plan.
"""

from __future__ import annotations

import json
import os

import numpy as np

from sage_tfx.privacy.errors import SageError
from sage_tfx.validation.loss import DPLossValidator

from .continual import (
    ContinualRelease,
    ReleaseParams,
    SlidingWindowRelease,
    Strategy,
    check_sla,
    grant_reader,
    push_model,
)
from .features import check_numeric, column_reader, featurizer, sign_labels
from .growth import (
    PMWG,
    BBImprover,
    BBScheduler,
    ImproverParams,
    PMWGParams,
    ScheduledRelease,
    SchedulerParams,
    Universe,
    clipped_mean,
)
from .incremental_regression import STRATEGY as INCREMENTAL
from .incremental_regression import IncrementalRegression, IncrementalRegressionParams
from .queries import parse_queries
from .session import Plan, SessionStatus, new_summary, resume, spent_line
from .settings import (
    ContinualSettings,
    FeatureSettings,
    GrowthSettings,
    IncrementalSettings,
    PMWGSettings,
    ReleaseInputError,
)


def _features(s: FeatureSettings, schema: dict):
    check_numeric(s.stream, schema, list(s.features) + [s.label])
    return featurizer(schema, s.features, s.scales, s.label, s.label_scale, s.intercept)


def _make_folders(s: ContinualSettings) -> None:
    """--push-dir and --serving-dir made now: an unwritable folder must fail before any charge."""
    for flag, folder in (("--push-dir", s.push_dir), ("--serving-dir", s.serving_dir)):
        if folder is not None:
            try:
                os.makedirs(folder, exist_ok=True)
            except OSError as exc:
                raise ReleaseInputError(
                    f"{flag} {folder!r} cannot be created ({exc.strerror}): give a writable directory"
                ) from None


def _pushed_text(pushed, serving_dir) -> str:
    if pushed is None:
        return ""
    wrote = f" wrote {pushed.model_uri} {'BLESSED' if pushed.blessed else 'NOT_BLESSED'}"
    if serving_dir:
        wrote += f" pushed {pushed.pushed_to}" if pushed.pushed_to else " not pushed"
    return wrote


def plan_continual(s: ContinualSettings, ledger, schema: dict) -> Plan:
    """Continual / sliding-window release: the columns, the parameters, the SLA validator, the pipeline's past."""
    featurize = _features(s, schema)
    _make_folders(s)
    params = ReleaseParams(
        epsilon=s.epsilon,
        delta=s.delta,
        records_per_block=s.rows_per_block,
        lam=s.lam,
        radius=s.radius,
        loss=s.loss,
        window=s.window,
        classes=s.classes,
        sampling=s.sampling,
    )
    validator = (
        None
        if s.sla_target is None
        else DPLossValidator(s.sla_target, s.sla_epsilon, s.sla_confidence, loss_bound=s.sla_loss_bound)
    )
    if s.loss == "logistic":  # the label is +1 iff its value > --positive-above (clip_features: y > 0 -> +1)
        featurize = sign_labels(featurize, s.positive_above / s.label_scale)
    cls = ContinualRelease if s.window is None else SlidingWindowRelease
    v_eps = None if validator is None else float(validator.epsilon)
    reader = grant_reader(ledger, s.data_root, featurize)
    release, previous, replaying = resume(
        ledger,
        s,
        {k.value for k in Strategy},
        lambda led: cls(led, s.stream, s.pipeline, params, reader, dim=s.dim, validation_epsilon=v_eps),
    )
    summary = new_summary("continual", release.strategy.value, s, release.meta, release.fingerprint, s.delta, models=[])
    tag = "continual" if s.window is None else "sliding-window"

    def emit(block, model, replayed):
        grant = release.grants[block]
        try:
            result = check_sla(release, model, validator) if validator is not None else None
            pushed = push_model(s.push_dir, model, result, s.serving_dir) if s.push_dir else None
        except SageError as exc:  # e.g. a replay whose SLA computation differs: the ledger refuses it
            s.warn(f"error: block {block}: {exc}")
            return SessionStatus.FAILED
        sla = None if result is None else str(result.outcome)
        s.say(
            f"[{tag}] block {block}: t={model.t} kind={model.kind} {spent_line(grant, replayed)}"
            + (f" SLA {sla}" if sla else "")
            + _pushed_text(pushed, s.serving_dir)
        )
        summary["models"].append(
            {
                "t": model.t,
                "block": block,
                "kind": model.kind,
                "grant": grant.id,
                "charged": not replayed,
                "window_blocks": list(model.blocks),
                "weights": [float(w) for w in model.weights],
                "sla": sla,
                "model": pushed and pushed.model_uri,
                "blessing": pushed and pushed.blessing_uri,
                "blessed": pushed and pushed.blessed,
                "pushed": pushed and pushed.pushed_to,
            }
        )
        return None

    return Plan(summary, release.observe, emit, replaying, previous)


def plan_incremental(s: IncrementalSettings, ledger, schema: dict) -> Plan:
    """Incremental regression over a horizon: blocks past it are left unobserved, never charged."""
    featurize = _features(s, schema)
    params = IncrementalRegressionParams(
        horizon=s.horizon,
        epsilon=s.epsilon,
        delta=s.delta,
        bound_x=s.bound_x,
        bound_y=s.bound_y,
        radius=s.radius,
        iterations=s.iterations,
    )
    reader = grant_reader(ledger, s.data_root, featurize)
    inc, previous, replaying = resume(
        ledger,
        s,
        {INCREMENTAL},
        lambda led: IncrementalRegression(led, s.stream, s.pipeline, params, dim=s.dim, reader=reader),
        meta=params.meta(),
    )
    if len(previous) > params.horizon:  # cannot happen with one instance; a guard
        raise ReleaseInputError(
            f"--pipeline {s.pipeline!r} holds {len(previous)} grants, more than --horizon {params.horizon}"
        )
    summary = new_summary(
        "incremental-regression",
        "incremental_regression",
        s,
        params.meta(),
        inc.fingerprint,
        s.delta,
        models=[],
        unobserved=[],
    )

    def emit(block, out, replayed):
        grant = ledger.get_grant(out.grant_id)
        s.say(
            f"[incremental-regression] block {block}: t={out.t} kind=tree-prefix "
            f"{spent_line(grant, replayed)} nodes={inc.tree.stored_nodes}"
        )
        summary["models"].append(
            {
                "t": out.t,
                "block": block,
                "grant": out.grant_id,
                "charged": not replayed,
                "weights": [float(w) for w in out.theta],
            }
        )
        return None

    return Plan(summary, inc.arrive, emit, replaying, previous, limit=params.horizon)


def _schedule(s: GrowthSettings):
    if s.schedule == "scheduler":
        return BBScheduler(
            SchedulerParams(epsilon=s.epsilon, delta=s.delta, gamma=s.gamma, t0=s.t0, composition=s.composition)
        )
    return BBImprover(ImproverParams(epsilon=s.epsilon, delta=s.delta, a=s.a, t0=s.t0))


def _run_text(run) -> str:
    if run is None:
        return "no run (the schedule keeps the last output)"
    return (
        f"run epoch {run.epoch} eps_i {run.epsilon:.6g}"
        + (f" delta_i {run.delta:.3g}" if run.delta else "")
        + f" mean {run.output:.6g}"
    )


def plan_growth(s: GrowthSettings, ledger, schema: dict) -> Plan:
    """A growth schedule (BBScheduler / BBImprover) re-running the DP clipped mean of a column."""
    check_numeric(s.stream, schema, [s.column])
    schedule = _schedule(s)
    mechanism = clipped_mean(s.bound, s.rows_per_block)
    name = f"clipped_mean(column={s.column},bound={s.bound!r},rows_per_block={s.rows_per_block})"
    read_column = column_reader(schema, [s.column])
    reader = grant_reader(ledger, s.data_root, lambda records: read_column(records)[:, 0])
    rel, previous, replaying = resume(
        ledger,
        s,
        {"bbscheduler", "bbimprover"},
        lambda led: ScheduledRelease(led, s.stream, s.pipeline, schedule, mechanism, reader, name=name),
    )
    summary = new_summary(
        "growth", schedule.meta["strategy"], s, rel.meta, rel.fingerprint, s.delta, blocks=[], runs=[]
    )

    def emit(block, run, replayed):
        grant, t = rel.grants[block], len(rel.order)
        entry = {"t": t, "block": block, "grant": grant.id, "charged": not replayed, "run": run is not None}
        if run is not None:
            summary["runs"].append(
                {
                    "t": t,
                    "epoch": run.epoch,
                    "epsilon_i": run.epsilon,
                    "delta_i": run.delta,
                    "mean": run.output,
                    "blocks": len(run.blocks),
                }
            )
            entry.update(epoch=run.epoch, epsilon_i=run.epsilon, delta_i=run.delta, mean=run.output)
        summary["blocks"].append(entry)
        s.say(f"[growth:{s.schedule}] block {block}: t={t} {spent_line(grant, replayed)} {_run_text(run)}")
        return None

    return Plan(summary, rel.observe, emit, replaying, previous, finalize=lambda: summary.update(current=rel.current))


def plan_pmwg(s: PMWGSettings, ledger, schema: dict) -> Plan:
    """PMWG: the declared query stream answered as blocks arrive, over the declared universe."""
    cols = [c for c, *_ in s.universe]
    check_numeric(s.stream, schema, cols)
    universe = Universe(
        columns=tuple(cols),
        edges=tuple(tuple(float(v) for v in np.linspace(lo, hi, k + 1)) for _, lo, hi, k in s.universe),
    )
    params = PMWGParams(
        epsilon=s.epsilon,
        hard_budget=s.hard_budget,
        threshold=s.threshold,
        eta=s.eta,
        growth_exponent=s.growth_exponent,
        delta=s.delta,
    )
    queries, digest = parse_queries(s.queries, cols, universe)
    computation = json.dumps(
        {"bins": s.bins, "queries_sha256": digest, "rows_per_block": s.rows_per_block}, sort_keys=True
    )
    reader = grant_reader(ledger, s.data_root, column_reader(schema, cols))
    pm, previous, replaying = resume(
        ledger,
        s,
        {"pmwg"},
        lambda led: PMWG(led, s.stream, s.pipeline, params, universe, reader, computation=computation),
    )
    summary = new_summary("pmwg", "pmwg", s, pm.meta, pm.fingerprint, s.delta, answers=[])

    def emit(block, _, replayed):
        grant, t = pm.grants[block], len(pm.order)
        asked = hard = 0
        for k, (at, weights, q) in enumerate(queries):
            if at is not None and at != t:
                continue
            try:
                ans = pm.query(weights)
            except SageError as exc:
                s.warn(f"error: block {block}: query {k + 1}: {exc}")
                return SessionStatus.FAILED
            asked, hard = asked + 1, hard + ans.hard
            scale = pm.n * (float(q["bound"]) if "sum" in q else 1.0)
            summary["answers"].append(
                {
                    "t": t,
                    "block": block,
                    "query": k + 1,
                    "fraction": ans.answer,
                    "estimate": ans.answer * scale,
                    "hard": ans.hard,
                }
            )
        s.say(
            f"[pmwg] block {block}: t={t} {spent_line(grant, replayed)} n={pm.n} {asked} "
            f"quer{'y' if asked == 1 else 'ies'} answered ({hard} hard; {pm.hard_used}/{pm.hard_limit()} hard used)"
        )
        return None

    return Plan(summary, lambda b: pm.observe(b, s.rows_per_block), emit, replaying, previous)


PLANS = {
    ContinualSettings: plan_continual,
    IncrementalSettings: plan_incremental,
    GrowthSettings: plan_growth,
    PMWGSettings: plan_pmwg,
}
