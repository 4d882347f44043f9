"""PMWG's declared query stream: a JSON-lines file of linear queries over the declared universe.

A line is ``{"count": {COL: [LO, HI], ...}}`` or ``{"sum": COL, "bound": B, "where": {COL: [LO, HI]}}``, with
``"at": T`` to ask it once when the stream has T blocks (default: after every block); a cell is in [LO, HI) when its
centre is (docs/release_strategies.md, "PMWG"). Every line is checked before anything is charged.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence

import numpy as np

from .growth import count_query, sum_query
from .settings import ReleaseInputError

KEYS = {"count", "sum", "bound", "where", "at"}


def _predicate(where, where_name, lineno, index, cols):
    """centres -> the mask of the cells inside every [LO, HI) of ``where``."""
    if not isinstance(where, dict):
        raise ReleaseInputError(f"--queries line {lineno}: {where_name} {where!r} must be {{COL: [LO, HI], ...}}")
    checks = []
    for c, rng in where.items():
        if c not in index:
            raise ReleaseInputError(f"--queries line {lineno}: column {c!r} is not in --bins ({', '.join(cols)})")
        if not (
            isinstance(rng, list)
            and len(rng) == 2
            and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in rng)
            and rng[0] < rng[1]
        ):
            raise ReleaseInputError(
                f"--queries line {lineno}: range {rng!r} of {c!r} is invalid: give [LO, HI], LO < HI"
            )
        checks.append((index[c], float(rng[0]), float(rng[1])))

    def pred(centres):
        ok = np.ones(len(centres), dtype=bool)
        for k, lo, hi in checks:
            ok &= (centres[:, k] >= lo) & (centres[:, k] < hi)
        return ok

    return pred


def _query(line, lineno, cols, index, universe):
    """One line -> (at or None, weights, the query's dict)."""
    try:
        q = json.loads(line)
    except ValueError:
        raise ReleaseInputError(f"--queries line {lineno} is not JSON: {line[:60]!r}") from None
    if not isinstance(q, dict) or ("count" in q) == ("sum" in q):
        raise ReleaseInputError(f'--queries line {lineno}: give exactly one of "count" or "sum"')
    unknown = set(q) - KEYS
    if unknown:
        raise ReleaseInputError(
            f"--queries line {lineno}: unknown key(s) {sorted(unknown)}: use count, sum, bound, where, at"
        )
    at = q.get("at")
    if at is not None and (isinstance(at, bool) or not isinstance(at, int) or at < 1):
        raise ReleaseInputError(f"--queries line {lineno}: at {at!r} is invalid: give a block count >= 1")
    if "count" in q:
        return at, count_query(universe, _predicate(q["count"], "count", lineno, index, cols)), q
    if q["sum"] not in index:
        raise ReleaseInputError(
            f"--queries line {lineno}: sum column {q['sum']!r} is not in --bins ({', '.join(cols)})"
        )
    bound = q.get("bound")
    if isinstance(bound, bool) or not isinstance(bound, (int, float)) or not bound > 0:
        raise ReleaseInputError(
            f"--queries line {lineno}: bound {bound!r} is invalid: give the column's public upper bound B > 0"
        )
    where = _predicate(q.get("where", {}), "where", lineno, index, cols)
    return at, sum_query(universe, index[q["sum"]], float(bound), where), q


def parse_queries(path: str, cols: Sequence[str], universe) -> tuple[list, str]:
    """The declared query stream of the file ``path``: ([(at or None, weights, query)], the file's sha256);
    ReleaseInputError naming the line and the fix for any bad line, before any charge."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError as exc:
        raise ReleaseInputError(f"--queries {path!r} cannot be read ({exc.strerror}): give a JSON-lines file") from None
    index = {c: k for k, c in enumerate(cols)}
    out = [
        _query(line, lineno, cols, index, universe)
        for lineno, line in enumerate(lines, 1)
        if line.strip() and not line.lstrip().startswith("#")
    ]
    if not out:
        raise ReleaseInputError(f"--queries {path!r} holds no query: give one JSON object per line")
    return out, hashlib.sha256("\n".join(lines).encode()).hexdigest()
