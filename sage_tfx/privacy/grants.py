"""Grants and releases: what a grant says, how it is signed and checked, what each stage may release under it.

A ``Grant`` is permission to read some blocks of a stream, already charged (paper §3.2; docs/security.md). Its
body is signed with the key ring's signing key (HMAC-SHA256, never the master key); a grant made before a ledger's
key migration is checked under the old secret with the old rule. A ``Release`` is one stage's release under a
grant (``Ledger.release``): a grant pays for one release per stage, of one computation, within the stage's share
of its split (``split.py``), or the whole grant for a single-stage grant's first stage.

The ``Ledger`` facade (``ledger.py``) writes and reads grants through these; this module imports neither the facade
nor the store.
"""

from __future__ import annotations

import hmac
import json
import secrets
from collections.abc import Container, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .chain import canonical
from .errors import GrantError, LedgerError
from .split import (
    SINGLE_RULE,
    SPLIT_KEY,
    BudgetSplit,
    grant_split,
    over_budget,
    per_row_budget,
    sign_records,
    unit_meta,
    unit_rows,
)
from .unit_share import grant_unit_budget, unit_stage_budget
from .vocabulary import Accounting

if TYPE_CHECKING:
    from .blocks import BlockSource
    from .filters import Filter
    from .keys import KeyRing
    from .streams import Stream


@dataclass(frozen=True)
class Grant:
    """Permission to read ``blocks`` of ``stream``, already charged. Verify with ``Ledger.verify``.

    ``epsilon`` and ``delta`` are what the grant's stages may spend (``split.stage_budget``, ``Ledger.release``): what
    was asked. On an ``rdp`` stream the filter charged the asked epsilon's pure-DP curve (or the curve given) and
    ``converted_epsilon`` records that charge converted to epsilon at the stream's delta, for information only
    (``filters.RdpFilter.spendable``). An ``rdp`` grant without ``converted_epsilon`` was made before it was
    recorded: its ``epsilon`` IS that converted figure, and its stages may spend only what its cost pays for
    (``stage_cap``; docs/block_composition.md).

    Args:
      id: The grant's id.
      stream: The stream it reads.
      pipeline: The pipeline it was charged to.
      blocks: The ids of the blocks it charged.
      epsilon: What its stages may spend.
      delta: What its stages may spend.
      accounting: Its stream's accounting (``basic`` or ``rdp``).
      cost: What it charged each block (the filter's vector).
      rule: How its stages compose (``ChargeRule``).
      created: When it was made, unix seconds.
      meta: Signed metadata (its split, record split, unit, ...).
      signature: The ledger's signature of the rest.
      converted_epsilon: An ``rdp`` grant's charge converted to epsilon at the stream's delta, for information.
    """

    id: str
    stream: str
    pipeline: str
    blocks: tuple
    epsilon: float
    delta: float
    accounting: str
    cost: tuple
    rule: str
    created: float
    meta: dict = field(default_factory=dict)
    signature: str = ""
    converted_epsilon: float | None = None

    def body(self) -> dict[str, Any]:
        body = {
            "id": self.id,
            "stream": self.stream,
            "pipeline": self.pipeline,
            "blocks": list(self.blocks),
            "epsilon": self.epsilon,
            "delta": self.delta,
            "accounting": self.accounting,
            "cost": list(self.cost),
            "rule": self.rule,
            "created": self.created,
            "meta": self.meta,
        }
        if self.converted_epsilon is not None:  # rdp grants only: a basic grant's body is as it always was
            body["converted_epsilon"] = self.converted_epsilon
        return body

    def to_json(self) -> str:
        return canonical(dict(self.body(), signature=self.signature))

    @classmethod
    def from_json(cls, text: str | Mapping[str, Any] | Grant) -> Grant:
        """A grant from its JSON form (``to_json``); the signature is carried, not checked.

        Args:
          text: The grant's JSON text, its decoded mapping, or a ``Grant`` (returned as it is).

        Returns:
          The ``Grant``.

        Raises:
          GrantError: malformed JSON, or a field missing or of the wrong type.
        """
        if isinstance(text, Grant):
            return text
        try:
            data = json.loads(text) if isinstance(text, (str, bytes)) else dict(text)
            return cls(
                id=data["id"],
                stream=data["stream"],
                pipeline=data["pipeline"],
                blocks=tuple(data["blocks"]),
                epsilon=float(data["epsilon"]),
                delta=float(data["delta"]),
                accounting=data["accounting"],
                cost=tuple(float(c) for c in data["cost"]),
                rule=data["rule"],
                created=float(data["created"]),
                meta=dict(data.get("meta") or {}),
                signature=data.get("signature", ""),
                converted_epsilon=None if data.get("converted_epsilon") is None else float(data["converted_epsilon"]),
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise GrantError(f"grant is malformed ({type(exc).__name__}: {exc}): {str(text)[:200]!r}") from None

    @classmethod
    def from_row(cls, body: str, signature: str) -> Grant:
        """The grant of a stored ``grants`` row: its body text and its signature (carried, not checked).

        Args:
          body: The row's body, the grant's canonical JSON without its signature.
          signature: The row's signature of ``body``.

        Returns:
          The ``Grant``.

        Raises:
          GrantError: a field missing or of the wrong type.
          ValueError: a body that is not JSON (``json.JSONDecodeError``).
        """
        return cls.from_json(dict(json.loads(body), signature=signature))


@dataclass(frozen=True)
class Release:
    """One stage's release under a grant (``Ledger.release``): the computation's fingerprint and its spend.

    Args:
      grant_id: The grant it was made under.
      stage: The stage (``Stage``).
      computation: The computation's fingerprint.
      epsilon: What the release spends.
      delta: What the release spends.
      created: When it was first opened, unix seconds.
      reopened: Whether this call re-opened an existing release.
    """

    grant_id: str
    stage: str
    computation: str
    epsilon: float
    delta: float
    created: float
    reopened: bool = False


def grant_terms(
    meta: Mapping[str, Any] | None, split: BudgetSplit | None, rule: str | None
) -> tuple[dict[str, Any], BudgetSplit | None, str]:
    """``request``'s meta, split and rule made one: (meta with the canonical split, the split or None, its rule).

    ``split`` (a ``BudgetSplit``) or ``meta["split"]`` (its dict), given once; ``rule``, if given, must be the
    split's rule (``SINGLE_RULE`` without a split). LedgerError naming the value otherwise, before anything is read.
    """
    meta = dict(meta or {})
    if split is not None:
        if not isinstance(split, BudgetSplit):
            raise LedgerError(f"split {split!r} must be a BudgetSplit (or give its dict as meta['split'])")
        if SPLIT_KEY in meta and meta[SPLIT_KEY] != split.to_dict():
            raise LedgerError("give the split once: as split= or as meta['split'], not two different ones")
        meta[SPLIT_KEY] = split.to_dict()
    split = check_split(meta, rule)
    return meta, split, SINGLE_RULE if split is None else split.rule


def check_split(meta: dict[str, Any], rule: str | None) -> BudgetSplit | None:
    """The grant's split from ``meta`` (None: single-stage), its fields checked; refuse a rule that differs.
    The record split is signed into ``meta`` here too (``split.sign_records``)."""
    if "count_epsilon" in meta:
        raise LedgerError(
            f"meta count_epsilon {meta['count_epsilon']!r}: the DP record count is a stage of the "
            "split now; give split=BudgetSplit(..., count=EPSILON, ...)"
        )
    split = BudgetSplit.from_meta(meta)
    if split is not None:
        meta[SPLIT_KEY] = split.to_dict()  # canonical: every stage present, rule spelled once
    sign_records(meta, split)
    expected = SINGLE_RULE if split is None else split.rule
    if rule is not None and rule != expected:
        raise LedgerError(
            f"rule {rule!r} does not match the grant: it is {expected!r} (the split's rule; "
            f"{SINGLE_RULE!r} without a split); leave rule out"
        )
    return split


def grant_budget(filt: Filter, cost: Sequence[float]) -> tuple[float, float, float | None]:
    """(epsilon, delta, converted_epsilon) a grant charged ``cost`` records: what its stages may spend
    (``spendable``: what was asked) and, on an ``rdp`` stream, the charge converted at the stream's delta (None on
    a basic stream, whose charge needs no conversion)."""
    epsilon, delta = filt.spendable(cost)
    return epsilon, delta, filt.query_epsilon(cost) if filt.accounting == Accounting.RDP else None


def older_rdp(grant: Grant) -> bool:
    """An ``rdp`` grant made before grants recorded what was asked: no ``converted_epsilon``, and its ``epsilon`` is
    its charge converted at the stream's delta, more than the filter charged (0.1875 for an ask of 0.05 at 1e-6)."""
    return grant.accounting == Accounting.RDP and grant.converted_epsilon is None


def stage_cap(grant: Grant, filt: Filter) -> tuple[float, float] | None:
    """What the stages of an older ``rdp`` grant (``older_rdp``) may spend in all: the (epsilon, delta) its cost pays
    for (``grant_budget`` with the stream's filter ``filt``: the largest pure epsilon whose curve lies within the
    charged curve, and the charge's delta), where that is below what the grant records. None for every other grant:
    what it records is what its stages may spend. ``Ledger.release`` and the audit apply it alike (``capped``)."""
    if not older_rdp(grant):
        return None
    epsilon, delta, _ = grant_budget(filt, grant.cost)
    if epsilon >= grant.epsilon and delta >= grant.delta:
        return None
    return min(epsilon, grant.epsilon), min(delta, grant.delta)


def capped(
    epsilon: float, delta: float, split: BudgetSplit | None, cap: tuple[float, float] | None
) -> tuple[float, float, BudgetSplit | None]:
    """(epsilon, delta, split) a grant recording ``epsilon``, ``delta`` and ``split`` (None: single-stage) lets its
    stages spend under ``cap`` (``stage_cap``; None: what it records). Under a cap a single stage gets the cap, and a
    split is scaled down by cap / recorded (every stage's share by the same factor: it keeps its proportions and
    composes to at most the cap, ``BudgetSplit.scaled``)."""
    if cap is None:
        return epsilon, delta, split
    if split is not None:
        split = split.scaled(cap[0] / epsilon if epsilon > 0 else 1.0, cap[1] / delta if delta > 0 else 1.0)
    return cap[0], cap[1], split


def per_unit_allowance(grant: Grant, stage: str, per_unit: str, cap: tuple[float, float] | None) -> tuple[float, float]:
    """The whole unit share of ``stage`` (``unit_share.grant_unit_budget``), capped as ``capped`` caps a split."""
    if cap is None:
        return grant_unit_budget(grant, stage, per_unit)
    _, _, split = capped(grant.epsilon, grant.delta, BudgetSplit.from_meta(grant.meta), cap)
    grant_unit_budget(grant, stage, per_unit)  # the per_unit claim checked
    return unit_stage_budget(cap[0], cap[1], grant.meta, stage, split)


def cap_text(grant_id: str, epsilon: float, cap: tuple[float, float], split: BudgetSplit | None) -> str:
    """Why an older ``rdp`` grant's stage gets less than the grant records (refusals, the audit)."""
    what = ", its split scaled down to it" if split is not None else ""
    return (
        f"grant {grant_id!r} is an rdp grant made before grants recorded what was asked: its recorded epsilon "
        f"{epsilon:.6g} is its charge converted at the stream's delta, but the charge pays for epsilon "
        f"{cap[0]:.6g} (delta {cap[1]:.3g}){what}"
    )


def registered_blocks(ledger: BlockSource, grant: Grant) -> list[str]:
    """The blocks of ``grant`` registered in its stream (``ledger.blocks``), in the grant's order."""
    registered = {b.id for b in ledger.blocks(grant.stream)}
    return [b for b in grant.blocks if b in registered]


def require_registered(ledger: BlockSource, grant: Grant, consequence: str = "") -> None:
    """Refuse (GrantError) a ``grant`` naming a block not registered in its stream; the message names them.

    Args:
      ledger: an open ``Ledger`` (only its ``blocks(stream)`` is read).
      grant: a verified ``Grant``.
      consequence: appended to the message (e.g. ": no keys given").
    """
    found = set(registered_blocks(ledger, grant))
    missing = [b for b in grant.blocks if b not in found]
    if missing:
        raise GrantError(
            f"grant {grant.id!r} names block(s) not registered in stream {grant.stream!r}: "
            f"{', '.join(missing)}{consequence}"
        )


def new_grant(
    keys: KeyRing,
    s: Stream,
    filt: Filter,
    pipeline: str,
    blocks: Sequence[str],
    cost: tuple[float, ...],
    rule: str,
    meta: Mapping[str, Any] | None,
    now: float,
    split: BudgetSplit | None = None,
) -> tuple[Grant, str]:
    """A Grant of ``cost`` on ``blocks`` of stream ``s``, signed under ``keys`` (a ``KeyRing``), and its body text
    (signed and stored: one text). A fresh random id (``g-`` and 24 hex digits). The stream's privacy unit is
    signed into its meta (``split.unit_meta``): what its stages hand their mechanisms is then per row."""
    epsilon, delta, converted = grant_budget(filt, cost)
    meta = unit_meta(meta, s.privacy_unit, s.max_rows_per_unit)
    grant = Grant(
        id="g-" + secrets.token_hex(12),
        stream=s.name,
        pipeline=pipeline,
        blocks=tuple(blocks),
        epsilon=epsilon,
        delta=delta,
        accounting=s.accounting,
        cost=cost,
        rule=rule,
        created=now,
        meta=meta,
        converted_epsilon=converted,
    )
    if split is not None:  # the stages compose to at most what is charged (privacy/split.py)
        split.check_covered(grant.epsilon, grant.delta)
    body_text = canonical(grant.body())
    object.__setattr__(grant, "signature", keys.sign(body_text.encode()))  # not yet seen by anyone: signed in place
    return grant, body_text


def sign(keys: KeyRing, body: Mapping[str, Any]) -> str:
    """A grant body's signature: HMAC-SHA256 under the key ring's signing key (never the master key)."""
    return keys.sign(canonical(body).encode())


def signature_ok(keys: KeyRing, legacy_grants: Container[str], body: Mapping[str, Any], signature: str) -> bool:
    """``signature`` signs ``body``: under the signing key, or, for a grant made before the ledger's key
    migration (its id in ``legacy_grants``, from the keyed ``keys`` entry), under the old secret with the old
    rule."""
    signature = signature or ""
    if hmac.compare_digest(sign(keys, body), signature):
        return True
    if body.get("id") in legacy_grants:
        return hmac.compare_digest(keys.legacy_sign(canonical(body).encode()) or "", signature)
    return False


def check_grant_copy(
    grant: Grant, stored: Grant, stream: str | None = None, epsilon: float | None = None, delta: float | None = None
) -> None:
    """``Ledger.verify``'s checks once the signature verified: ``grant`` is the ledger's record ``stored``, of
    ``stream`` if given, covering at least ``epsilon``/``delta`` if given; GrantError naming what differs."""
    if stored.to_json() != grant.to_json():
        raise GrantError(f"grant {grant.id!r} differs from the ledger's record of it")
    if stream is not None and grant.stream != stream:
        raise GrantError(f"grant {grant.id!r} is for stream {grant.stream!r}, not {stream!r}")
    if epsilon is not None and grant.epsilon + 1e-12 < float(epsilon):
        raise GrantError(f"grant {grant.id!r} covers epsilon {grant.epsilon:.6g}, but {float(epsilon):.6g} is needed")
    if delta is not None and grant.delta + 1e-15 < float(delta):
        raise GrantError(f"grant {grant.id!r} covers delta {grant.delta:.3g}, but {float(delta):.3g} is needed")


def grant_log_text(grant: Grant, body_text: str, sources: Any) -> str:
    """The canonical text of a grant's log body, ``dict(grant.body(), signature=..., sources=...)``, spliced
    from ``body_text`` (the canonical text of ``grant.body()``, already made to sign it) instead of encoding the
    block list a second time. Canonical text has sorted keys, and ``signature`` and ``sources`` sort after every
    key of the body but ``stream``, its last (``SPLICE_GRANT_LOG``, checked on import against ``Grant.body``):
    so they go just before ``"stream":``, the text's end. The same text as ``canonical`` of the whole dict
    (tests/privacy/test_ledger_request_reads.py compares them); anything else falls back to encoding the dict."""
    tail = ',"stream":' + canonical(grant.stream) + "}"
    if SPLICE_GRANT_LOG and body_text.endswith(tail):
        return (
            body_text[: -len(tail)]
            + ',"signature":'
            + canonical(grant.signature)
            + ',"sources":'
            + canonical(sources)
            + tail
        )
    return canonical(dict(grant.body(), signature=grant.signature, sources=sources))


SPLICE_GRANT_LOG = sorted([*Grant("", "", "", (), 0.0, 0.0, "", (), "", 0.0).body(), "signature", "sources"])[-4:] == [
    "rule",
    "signature",
    "sources",
    "stream",
]


def stage_allowance(
    grant: Grant,
    stage: str,
    done: Mapping[str, tuple[str, float, float, float]],
    computation: str,
    epsilon: float,
    delta: float,
    cap: tuple[float, float] | None = None,
    per_unit: str | None = None,
) -> Release | None:
    """What ``stage`` may release under ``grant``, given its releases ``done`` ({stage: (computation, epsilon,
    delta, created)}): the earlier ``Release`` of the same computation (re-opened: nothing new is released), or
    None once the new release is checked to fit the stage's budget. GrantError naming the grant and the fix
    otherwise. ``cap`` (``stage_cap``: an older ``rdp`` grant's) bounds the budget by what the grant's cost pays
    for (``capped``). ``per_unit``: the unit column a mechanism calibrated to the unit names (``unit_share``): it may
    spend the stage's whole share, not the per-row budget."""
    if stage in done:
        fingerprint, have_eps, have_delta, created = done[stage]
        if (fingerprint, have_eps, have_delta) != (computation, epsilon, delta):
            raise GrantError(
                f"grant {grant.id!r} already released its {stage} stage for computation "
                f"{fingerprint[:16]} (epsilon {have_eps:.6g}); computation {computation[:16]} (epsilon "
                f"{epsilon:.6g}) is a different release the grant did not pay for: run it under a new grant"
            )
        return Release(grant.id, stage, computation, epsilon, delta, created, reopened=True)
    _, _, split = capped(grant.epsilon, grant.delta, grant_split(grant), cap)
    if per_unit is not None:
        allowed = per_unit_allowance(grant, stage, per_unit, cap)
    elif split is None:
        if done:
            raise GrantError(
                f"grant {grant.id!r} is single-stage (it has no split) and its {sorted(done)[0]} stage "
                f"already spent it: the {stage} stage needs its own grant, or charge one grant with a split "
                "(sage ledger charge --split ..., or Ledger.request(..., split=BudgetSplit(...)))"
            )
        allowed = per_row_budget(*((grant.epsilon, grant.delta) if cap is None else cap), unit_rows(grant.meta))
    else:
        allowed = split.stage_budget(stage)
    if over_budget(epsilon, delta, allowed):
        why = (
            ""
            if cap is None
            else (
                f": {cap_text(grant.id, grant.epsilon, cap, split)}; request a new grant (sage ledger charge, or "
                "Ledger.request), whose stages get what it asks for"
            )
        )
        raise GrantError(
            f"the {stage} stage asks for (epsilon={epsilon:.6g}, delta={delta:.3g}) but grant "
            f"{grant.id!r} covers only (epsilon={allowed[0]:.6g}, delta={allowed[1]:.3g}) "
            f"for {stage}{why}"
        )
    return None
