"""Streams: a stream's row parsed into its ``Stream`` and filter, the checks of a new stream's arguments, and the
grant floor every request must reach (paper §3.2; docs/scheduling_policies.md for the policies).

A stream has a global (epsilon, delta) guarantee over all its blocks, forever; ``min_epsilon`` is the query a block
must still admit to stay active, and every grant charges at least ``min_grant_epsilon``. The ``Ledger`` facade
(``ledger.py``) reads and writes streams through these; this module imports neither the facade nor the audit.
"""

from __future__ import annotations

import collections.abc
import functools
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from . import filters
from .allocation import get_policy
from .chain import canonical
from .checks import check_name, finite
from .errors import LedgerError, UnknownStream
from .store import sql
from .vocabulary import Accounting, BlockState, Policy

if TYPE_CHECKING:
    from .allocation import AllocationPolicy
    from .blocks import Block
    from .ledger import Ledger
    from .store.base import Tx

# The largest global epsilon a stream may promise unless its creator raises the limit (max_epsilon=): beyond
# e^10 (about 22,000) the ratio of any outcome's odds with and without a person's records, the guarantee says
# little. And the smallest epsilon a grant may charge (min_grant_epsilon=, per stream; by default this, or the
# stream's min_epsilon if smaller): a grant of 1e-300 would buy a data read for nothing, noise a million times
# the data is no release.
DEFAULT_MAX_STREAM_EPSILON = 10.0
DEFAULT_MIN_GRANT_EPSILON = 1e-3


@dataclass(frozen=True)
class Stream:
    """A stream's public description: its global guarantee, accounting, policy and privacy unit.

    Args:
      name: The stream's name.
      accounting: ``basic`` or ``rdp`` (``Accounting``).
      epsilon: The global epsilon.
      delta: The global delta.
      orders: An ``rdp`` stream's Rényi orders (empty for basic).
      policy: The allocation policy (``Policy``).
      min_epsilon: The query a block must still admit to stay active.
      created: When it was created, unix seconds.
      min_grant_epsilon: What every grant must charge at least.
      policy_params: A queued policy's parameters as stored (n, lifetime); None: none.
      query_delta_share: An rdp stream's fixed delta split (``filters.RdpFilter``); None: basic, or an rdp stream
        made before schema 7.
      split_orders: 1: an rdp stream's conversion delta split over its orders; None: basic, or an rdp stream made
        before schema 8.
      privacy_unit: The column naming whose records a row is (a rider, a device); None: the row.
      max_rows_per_unit: K, at most K rows of a unit kept per block (ingest); None: unit = row.
    """

    name: str
    accounting: str
    epsilon: float
    delta: float
    orders: tuple
    policy: str
    min_epsilon: float
    created: float
    min_grant_epsilon: float | None = None
    policy_params: dict | None = None  # a queued policy's parameters as stored (n, lifetime); None: none
    query_delta_share: float | None = None  # an rdp stream's fixed delta split (filters.RdpFilter); None: basic, or
    # an rdp stream made before schema 7 (the legacy rule)
    split_orders: int | None = None  # 1: an rdp stream's conversion delta split over its orders (filters.RdpFilter);
    # None: basic, or an rdp stream made before schema 8 (every order converts at all of it)
    privacy_unit: str | None = None  # the column naming whose records a row is (a rider, a device); None: the row
    max_rows_per_unit: int | None = None  # K: at most K rows of a unit kept per block (ingest); None: unit = row

    @property
    def unit_rows(self) -> int:
        """K, the most rows one privacy unit has in a block (1: unit = row, event-level DP). Every grant on the
        stream hands its mechanisms the per-row budget that makes them DP for K rows (``split.per_row_budget``)."""
        return self.max_rows_per_unit or 1

    def rules(self) -> AllocationPolicy:
        """The stream's ``AllocationPolicy`` (allocation.py) with its stored parameters."""
        rules = self.__dict__.get("_rules")
        if rules is None:
            rules = get_policy(self.policy, self.policy_params)
            object.__setattr__(self, "_rules", rules)
        return rules

    @property
    def grant_floor(self) -> float:
        """The smallest epsilon a grant may charge: min_grant_epsilon (default 0.001, or min_epsilon if smaller)."""
        if self.min_grant_epsilon is None:
            return min(DEFAULT_MIN_GRANT_EPSILON, self.min_epsilon)
        return self.min_grant_epsilon

    def filter(self) -> filters.Filter:
        return filters.make_filter(
            self.accounting, self.epsilon, self.delta, self.orders, self.query_delta_share, bool(self.split_orders)
        )


@functools.lru_cache(maxsize=64)
def parsed_stream(row: tuple) -> Stream:
    """The Stream of a ``streams`` row and its filter, parsed once per distinct row (a tuple of the row's values).

    Keyed by the whole row as read in the caller's transaction, so a stream re-created under the same name with
    other parameters (a different row) is parsed afresh: nothing read earlier is trusted, only the parsing is
    reused. Stream and filter are immutable.
    """
    s = Stream(
        row[0],
        row[1],
        row[2],
        row[3],
        tuple(json.loads(row[4])),
        row[5],
        row[6],
        row[7],
        row[8],
        json.loads(row[9]) if row[9] else None,
        row[10],
        row[11],
        row[12],
        None if row[13] is None else int(row[13]),
    )
    object.__setattr__(s, "_filter", s.filter())
    return s


def stream_filter(s: Stream) -> filters.Filter:
    """``s.filter()``, built once per parsed stream row (filters are not changed after construction)."""
    filt = s.__dict__.get("_filter")
    return filt if filt is not None else s.filter()


def read_stream(tx: Tx, name: str) -> Stream:
    """The stream ``name`` as of ``tx``; UnknownStream naming the streams there are."""
    row = tx.one(sql.STREAM_ROW, (name,)) if isinstance(name, str) else None  # a list or number names no stream
    if row is None:
        known = [r[0] for r in tx.all(sql.STREAM_NAMES)]
        raise UnknownStream(f"stream {name!r} does not exist (streams: {', '.join(known) or 'none'})")
    return parsed_stream(tuple(row))


def insert_stream(
    tx: Tx,
    log: Callable[..., object],
    name: str,
    accounting: str,
    filt: filters.Filter,
    policy: str,
    rules: AllocationPolicy,
    min_epsilon: float,
    min_grant: float,
    now: float,
    unit: tuple[str | None, int | None] = (None, None),
) -> None:
    """Write a new stream (checked by ``check_stream_args``: its filter ``filt``, ``policy`` as given and its
    ``rules``) and its log entry (``log(tx, kind, body)``); LedgerError if the name is taken. A queued policy's
    parameters are stored in full (defaults written down), so every process applies the same rule. ``unit``:
    ``check_unit``'s (privacy unit, max rows per unit), (None, None) for unit = row."""
    orders = tuple(getattr(filt, "orders", ()))
    params = rules.params() if rules.queued else None
    if tx.one(sql.STREAM_EXISTS, (name,)):
        raise LedgerError(f"stream {name!r} already exists")
    share = getattr(filt, "query_delta_share", None)
    split_orders = 1 if getattr(filt, "split_orders", False) else None
    tx.run(
        sql.STREAM_INSERT,
        (
            name,
            accounting,
            filt.epsilon,
            filt.delta,
            json.dumps(orders),
            policy,
            min_epsilon,
            now,
            min_grant,
            None if params is None else canonical(params),
            share,
            split_orders,
            *unit,
        ),
    )
    body = {
        "name": name,
        "accounting": accounting,
        "epsilon": filt.epsilon,
        "delta": filt.delta,
        "orders": list(orders),
        "policy": policy,
        "min_epsilon": min_epsilon,
        "min_grant_epsilon": min_grant,
    }
    if params is not None:  # only queued streams carry it: other streams' entries stay as they were
        body["policy_params"] = params
    if share is not None:  # only rdp streams (schema 7 on) carry it: an entry without it replays the legacy rule
        body["query_delta_share"] = share
    if split_orders:  # only rdp streams (schema 8 on) carry it: an entry without it replays every order at all of it
        body["split_orders"] = split_orders
    if unit[0] is not None:  # only unit streams (schema 9 on) carry it: an entry without it replays unit = row
        body["privacy_unit"], body["max_rows_per_unit"] = unit
    log(tx, "stream", body, at=now)


def check_unit(privacy_unit: str | None = None, max_rows_per_unit: int | None = None) -> tuple:
    """A new stream's privacy unit: (column, K), or (None, None) for unit = row (event-level DP, the default);
    LedgerError naming the value and the fix otherwise. Whether the column is in the records is checked when they
    arrive (``sage ingest``), before anything is written."""
    if privacy_unit in (None, "row"):
        if max_rows_per_unit not in (None, 1):
            raise LedgerError(
                f"max_rows_per_unit {max_rows_per_unit!r} needs a privacy unit: give "
                "--privacy-unit COLUMN (privacy_unit=) with it, or leave it out for unit = row"
            )
        return None, None
    check_name(privacy_unit, "privacy unit column")
    if max_rows_per_unit is None:
        raise LedgerError(
            f"privacy unit {privacy_unit!r} needs a bound: give --max-rows-per-unit K "
            "(max_rows_per_unit=K), the most rows one unit may have in a block (K >= 1)"
        )
    if isinstance(max_rows_per_unit, bool) or not isinstance(max_rows_per_unit, int) or max_rows_per_unit < 1:
        raise LedgerError(
            f"max_rows_per_unit {max_rows_per_unit!r} is invalid: give an integer K >= 1 (the most "
            "rows one unit keeps per block; every mechanism is then charged for K rows)"
        )
    return privacy_unit, max_rows_per_unit


def check_unit_charge(stream: Stream, curve: object) -> None:
    """Refuse (LedgerError, before anything is charged) an RDP curve charged on a stream whose privacy unit has
    K > 1 rows: group privacy turns an (epsilon, delta)-DP mechanism on one row into a (K epsilon, ...)-DP one on
    K rows (``split.per_row_budget``), but a Renyi curve has no such rule the ledger applies. Charge the
    (epsilon, delta) the mechanism is calibrated to instead."""
    if curve is not None and stream.unit_rows > 1:
        raise LedgerError(
            f"stream {stream.name!r} protects privacy unit {stream.privacy_unit!r} (up to {stream.unit_rows} rows a "
            "block): a charge given as an RDP curve cannot be scaled to a unit by group privacy; request epsilon "
            "(and delta) instead, whose stages then get the per-row budget"
        )


def require_row_unit(ledger: Ledger, stream: str, what: str) -> None:
    """Refuse (LedgerError, before anything is charged) ``what``, a release strategy whose mechanisms take their
    epsilon from its own parameters rather than from a grant's stage budget (``split.stage_budget``), on a stream
    whose privacy unit has K > 1 rows: its mechanisms are calibrated to one row, and ``Ledger.release`` would refuse
    their full-epsilon release only after the charge. ``ledger``: anything with ``stream(name)``."""
    s = ledger.stream(stream)
    if s.unit_rows > 1:
        raise LedgerError(
            f"{what} calibrates its mechanisms to one row, but stream {stream!r} protects privacy unit "
            f"{s.privacy_unit!r} (up to {s.unit_rows} rows a block): run it on a stream whose unit is the row, or "
            "run a TFX pipeline (sage run), whose stages get the per-row budget"
        )


def check_stream_args(
    name: str,
    epsilon: float,
    delta: float,
    accounting: str = Accounting.BASIC,
    orders: Sequence[float] | None = None,
    policy: str = Policy.CONSERVE,
    min_epsilon: float | None = None,
    max_epsilon: float = DEFAULT_MAX_STREAM_EPSILON,
    min_grant_epsilon: float | None = None,
    policy_params: Mapping[str, Any] | None = None,
    query_delta_share: float | None = None,
    privacy_unit: str | None = None,
    max_rows_per_unit: int | None = None,
) -> tuple[filters.Filter, float, float]:
    """``create_stream``'s checks alone, without a ledger; ``sage ledger init`` runs them before it creates a file.

    Args:
      name: The stream's name.
      epsilon: The stream's global epsilon.
      delta: The stream's global delta.
      accounting: ``basic`` or ``rdp``.
      orders: An ``rdp`` stream's Rényi orders.
      policy: The allocation policy's name.
      min_epsilon: The query a block must still admit to stay active.
      max_epsilon: The largest stream epsilon accepted.
      min_grant_epsilon: What every grant must charge at least.
      policy_params: A queued policy's parameters (``n``, ``lifetime``; allocation_policies.py).
      query_delta_share: An rdp stream's fixed split of its delta (``filters.RdpFilter``; None: the default
        ``filters.DEFAULT_QUERY_DELTA_SHARE``); refused on a basic stream.
      privacy_unit: The unit column (``check_unit``).
      max_rows_per_unit: The rows of a unit kept per block (``check_unit``).

    Returns:
      (filter, min_epsilon, min_grant_epsilon).

    Raises:
      LedgerError: naming the bad value.
    """
    check_name(name, "stream name")
    check_unit(privacy_unit, max_rows_per_unit)
    if accounting not in tuple(Accounting):
        raise LedgerError(f"accounting {accounting!r} is unknown: use 'basic' or 'rdp'")
    if policy_params is not None and not isinstance(policy_params, collections.abc.Mapping):
        raise LedgerError(f"policy_params {policy_params!r} is invalid: give a dict such as {{'n': 50}}")
    get_policy(policy, policy_params)  # LedgerError naming the known policies, or the bad parameter
    try:
        share = () if query_delta_share is None else (query_delta_share,)  # None here: the default, not legacy
        filt = filters.make_filter(accounting, epsilon, delta, orders, *share)
    except ValueError as exc:
        raise LedgerError(str(exc)) from None
    max_epsilon = finite(max_epsilon, "max_epsilon", allow_none=False)
    if not max_epsilon > 0:
        raise LedgerError(f"max_epsilon {max_epsilon!r} is invalid: need max_epsilon > 0")
    if filt.epsilon > max_epsilon:
        raise LedgerError(
            f"stream epsilon {epsilon!r} is above the maximum {max_epsilon:g}: a guarantee that weak says little "
            f"(e^epsilon bounds how much one person's records may change any outcome's odds); give epsilon <= "
            f"{max_epsilon:g}, or raise the limit knowingly (sage ledger init --max-epsilon E; "
            "create_stream(..., max_epsilon=E))"
        )
    if min_epsilon is None:
        min_epsilon = filt.epsilon / 100.0
    min_epsilon = finite(min_epsilon, "min_epsilon", allow_none=False)
    if not 0 < min_epsilon <= filt.epsilon:
        raise LedgerError(f"min_epsilon {min_epsilon!r} is invalid: need 0 < min_epsilon <= epsilon ({epsilon!r})")
    if min_grant_epsilon is None:
        min_grant_epsilon = min(DEFAULT_MIN_GRANT_EPSILON, min_epsilon)
    min_grant = finite(min_grant_epsilon, "min_grant_epsilon", allow_none=False)
    if not 0 < min_grant <= filt.epsilon:
        raise LedgerError(f"min_grant_epsilon {min_grant_epsilon!r} is invalid: need 0 < min_grant_epsilon <= epsilon")
    return filt, min_epsilon, min_grant


def stream_cost(stream: Stream, filt: filters.Filter, epsilon: float) -> tuple[float, ...]:
    """``filt.cost(epsilon=epsilon)``; for the parsed stream row's own filter (``stream_filter``) computed once
    per row and epsilon (a stream's grant floor and min_epsilon cost are fixed by its row, which
    ``parsed_stream`` keys on; filters are not changed after construction)."""
    if stream.__dict__.get("_filter") is not filt:
        return filt.cost(epsilon=epsilon)
    costs = stream.__dict__.get("_costs")
    if costs is None:
        costs = {}
        object.__setattr__(stream, "_costs", costs)
    cost = costs.get(epsilon)
    if cost is None:
        cost = costs[epsilon] = filt.cost(epsilon=epsilon)
    return cost


def check_minimum(filt: filters.Filter, stream: Stream, cost: Sequence[float], epsilon: float | None) -> None:
    """Refuse a grant smaller than the stream's grant floor (LedgerError, before anything is charged).

    Basic accounting compares the charged epsilon; RDP calls a query too small when its curve lies below a
    min_epsilon query's at every order (whatever its delta: the minimum is on the epsilon part).
    """
    least = stream.grant_floor
    floor = stream_cost(stream, filt, least)
    if filt.accounting == Accounting.BASIC:
        small = cost[0] < floor[0]
    else:
        small = all(c < f for c, f in zip(cost[1:], floor[1:]))
    if small:
        asked = f"epsilon {epsilon!r}" if epsilon is not None else "an RDP curve below the minimum's at every order"
        raise LedgerError(
            f"grant {asked} is below stream {stream.name!r}'s minimum grant epsilon {least:g}: a read that costs "
            f"less buys data for nothing; ask for epsilon >= {least:g} (set per stream by `sage ledger init "
            "--min-grant-epsilon`, default 0.001, or the stream's --min-epsilon if smaller)"
        )


def stream_status(
    s: Stream, blocks: Sequence[Block], grants: int, pipelines: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """``Ledger.status``: a JSON-ready summary of stream ``s``, its ``blocks`` (``Block``s in key order) with each
    one's spent and remaining budget, its count of ``grants`` and its ``pipelines``."""
    filt = s.filter()
    out_blocks = []
    for b in blocks:
        eps_spent, delta_spent, eps_left = filt.summary(b.spent)
        entry = {
            "id": b.id,
            "state": b.state,
            "epsilon_spent": eps_spent,
            "delta_spent": delta_spent,
            "epsilon_remaining": 0.0 if b.state == BlockState.RETIRED else eps_left,
            "created": b.created,
            "retired": b.retired,
            **b.key,
        }
        if s.accounting == Accounting.RDP:
            entry["rdp_spent"] = dict(zip((str(a) for a in s.orders), b.spent[1:]))
        out_blocks.append(entry)
    return {
        "stream": s.name,
        "accounting": s.accounting,
        "epsilon": s.epsilon,
        "delta": s.delta,
        "policy": s.policy,
        "policy_params": s.policy_params,
        "min_epsilon": s.min_epsilon,
        "min_grant_epsilon": s.grant_floor,
        "orders": list(s.orders),
        # an rdp stream's delta split (filters.RdpFilter); None: basic, or an rdp stream made before schema 7
        "query_delta_share": s.query_delta_share,
        # 1: an rdp stream's conversion delta split over its orders; None: basic, or made before schema 8
        "split_orders": s.split_orders,
        # the privacy unit ("row": event-level DP) and K, the most rows a unit keeps per block (1 for row)
        "privacy_unit": s.privacy_unit or "row",
        "max_rows_per_unit": s.unit_rows,
        "active_blocks": sum(b["state"] == BlockState.ACTIVE for b in out_blocks),
        "retired_blocks": sum(b["state"] == BlockState.RETIRED for b in out_blocks),
        "grants": grants,
        "pipelines": pipelines,
        "blocks": out_blocks,
    }
