"""The grant's records by split, without TFX or Beam: the record split rule BlockExampleGen's executor
(components/block_example_gen_executor.py) writes its splits by, and ``granted_records``, the same records
read for a reader that must not trust an Examples artifact written beside user code (``pipelines.confined``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from sage_tfx.privacy import DEFAULT_RECORD_SPLIT, GrantError, record_split

if TYPE_CHECKING:
    from sage_tfx.privacy import Grant

DEFAULT_SPLITS = DEFAULT_RECORD_SPLIT.splits  # {"train": 9, "eval": 1}: the record split a grant signs by default


def parse_splits(text: str | None) -> list[tuple[str, int]] | None:
    """'{"train": 9, "eval": 1}' -> [("train", 9), ("eval", 1)] (positive integer buckets)."""
    try:
        splits = json.loads(text) if text else dict(DEFAULT_SPLITS)
    except ValueError:
        raise ValueError(f"splits {text!r} is not JSON like {json.dumps(DEFAULT_SPLITS)}") from None
    if not isinstance(splits, dict) or not splits:
        raise ValueError(f"splits {text!r} must be a non-empty JSON object of split name -> buckets")
    out = []
    for name, buckets in splits.items():
        if not isinstance(name, str) or not name or "-" in name:
            raise ValueError(f"split name {name!r} is invalid")
        if isinstance(buckets, bool) or not isinstance(buckets, int) or buckets <= 0:
            raise ValueError(f"split {name!r} has {buckets!r} buckets: need an integer > 0")
        out.append((name, buckets))
    return out


def granted_splits(text: str | None, grant: Grant) -> list[tuple[str, int]]:
    """The [(name, buckets), ...] a run under ``grant`` splits its records by: the grant's signed record split
    (``record_split``). ``text`` (the component's ``splits``), if given, must be that same rule in the same order;
    another one is refused with GrantError naming both, before anything is read: two runs under one grant
    with other splits would give its releases other records under the same noise."""
    signed = list(record_split(grant).splits.items())
    if text in (None, ""):
        return signed
    given = parse_splits(text)
    if given != signed:
        raise GrantError(
            f"splits {dict(given)} differ from the record split signed into grant {grant.id!r}: "
            f"{dict(signed)} (in this order): a grant's records are split by its signed rule only. "
            "Leave BlockExampleGen's `splits` unset, or request a grant with another record split "
            "(Ledger.request(..., meta={'records': {...}})); nothing was read"
        )
    return signed


def split_index(record: bytes, bounds: Sequence[int]) -> int:
    """The split of one record, from a hash of its own bytes (independent of all other records)."""
    bucket = int.from_bytes(hashlib.blake2b(record, digest_size=8).digest(), "big") % bounds[-1]
    for i, bound in enumerate(bounds):
        if bucket < bound:
            return i
    raise AssertionError("unreachable")


def split_bounds(splits: Sequence[tuple[str, int]]) -> list[int]:
    """The cumulative bucket bounds of [(name, buckets), ...], as ``split_index`` takes them."""
    bounds, total = [], 0
    for _, buckets in splits:
        total += buckets
        bounds.append(total)
    return bounds


def granted_records(ledger: Any, data_root: str, grant: Grant, wanted: Sequence[str]) -> dict:
    """{split: [serialized tf.Examples]} for the splits ``wanted`` of ``grant``'s records: its blocks opened through
    the key door (``access.grant_blocks``: signature and charge re-checked) and split by its signed record split
    (``split_index``), the records the executor's Beam job writes to those splits (here in block and file order).
    For a reader that must not trust an Examples artifact written beside user code (``pipelines.confined``)."""
    from sage_tfx.ingest.access import grant_blocks

    verified, blocks = grant_blocks(ledger, data_root, grant.to_json(), stream=grant.stream)
    splits = granted_splits(None, verified)
    names, bounds = [name for name, _ in splits], split_bounds(splits)
    found = {name: [] for name in wanted}
    for block in blocks:
        for record in block.records():
            name = names[split_index(record, bounds)]
            if name in found:
                found[name].append(record)
    return found
