"""The privacy ledger: Sage's block-level access control (paper §3.2-3.3, SAGE_SPEC.md §2-3).

One ledger holds streams. A stream has a global (epsilon, delta) guarantee and a
growing set of disjoint blocks; each block carries a budget filter
(``filters.py``). A pipeline reads data only through a *grant*: ``request``
checks every block of the set and charges all of them in one transaction, all
or nothing, and returns a signed ``Grant`` that data readers verify before they
read a single record. Nothing un-charges a grant. A block whose remaining
budget cannot serve even a ``min_epsilon`` query is retired and never offered
again; new blocks arrive with a fresh budget, so the stream holds its one
guarantee forever.

Allocation across pipelines (paper §3.3, "Block/Conserve" and "Block/Aggressive"):
pipelines ``register`` as waiting; each new block's budget is split evenly
among the pipelines waiting at that moment and reserved for them; a grant draws
on the pipeline's own reservation first, then on the unreserved pool; when a
pipeline ``finish``es, its unused reservation is split among those still
waiting. The stream's policy tells the iterator how to spend a reservation
(``plan_epsilon``): conserve starts small and doubles, aggressive takes it all.
What a pipeline could be granted now is ``available_epsilon`` (on a set of
blocks) or ``available_per_block`` (on each block alone, all in one read: how the
iterator chooses blocks); both are advisory, ``request`` decides.

Under a queued policy (DPF-N, DPF-T, DPack: docs/scheduling_policies.md) there are no reservations: a
request the scheduler does not grant at once is recorded as the pipeline's demand, every write that is a
scheduling point runs ``allocation.QueuedAllocation`` over the pending demands, and an admitted demand is
charged at admission and handed to the pipeline's next identical request.

Every change is appended to a keyed, hash-chained audit log in the same transaction;
``audit()`` recomputes every table from the log alone.

Keys (docs/security.md): the ledger holds no key. ``Ledger.open(location, key_file=...)`` loads the
master key from a key file outside the database (``keys.py``: ``key_file=``, else $SAGE_KEY_FILE, else
``<sqlite path>.key``; PostgreSQL needs one explicitly); grants are signed with its derived signing key,
release seeds come from its noise key, and the log is chained with its audit key. After every committed
write the log's head (last sequence number and chain value) is written to the head file beside the key
file, outside the database. A ledger of an older version (its secret in ``meta.secret``) is migrated on
open: the key file is written first (0600, fsync), then the secret is deleted in one transaction.
"""
import collections
import collections.abc
import functools
import hashlib
import hmac
import json
import logging
import os
import re
import secrets
import time
from dataclasses import dataclass, field

from . import filters
from .audit import audit_ledger
from .chain import GENESIS, canonical, chain_hash  # noqa: F401 (chain_hash: re-exported)
from .allocation import BudgetArrays, QueuedAllocation, bisect as _bisect, get_policy
from .errors import (
    BlockRetired,
    DuplicateContent,
    BudgetRefused,
    GrantError,
    LedgerError,
    PipelineBusy,
    UnknownBlock,
    UnknownStream,
)
from .checks import check_name as _check_name, finite as _finite
from .split import SINGLE_RULE, SLACK, SPLIT_KEY, STAGES, BudgetSplit, grant_split
from .keys import HeadFile, KeyFileError, KeyRing, head_sync_mode, resolve_key_path
from .store import open_store, sql
from .vocabulary import Accounting, BlockState, GrantOutcome, Outcome, PipelineState, Policy, Source

POLICIES = tuple(Policy)  # members equal their stored strings: "conserve", "aggressive"
# The largest global epsilon a stream may promise unless its creator raises the limit (max_epsilon=): beyond
# e^10 (about 22,000) the ratio of any outcome's odds with and without a person's records, the guarantee says
# little. And the smallest epsilon a grant may charge (min_grant_epsilon=, per stream; by default this, or the
# stream's min_epsilon if smaller): a grant of 1e-300 would buy a data read for nothing, noise a million times the data is no release.
DEFAULT_MAX_STREAM_EPSILON = 10.0
DEFAULT_MIN_GRANT_EPSILON = 1e-3
OUTCOMES = tuple(Outcome)  # "ACCEPT", "REJECT", "TIMEOUT"
_DIGEST = re.compile(r"^[0-9a-f]{1,64}$")
_PENDING, _ADMITTED = "pending", "admitted"  # a queued stream's demand: waiting, or charged and not yet collected


_canonical = canonical  # the name older code and tests import from here


@dataclass(frozen=True)
class Stream:
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

    def rules(self):
        """The stream's ``AllocationPolicy`` (allocation.py) with its stored parameters."""
        rules = self.__dict__.get("_rules")
        if rules is None:
            rules = get_policy(self.policy, self.policy_params)
            object.__setattr__(self, "_rules", rules)
        return rules

    @property
    def grant_floor(self):
        """The smallest epsilon a grant may charge: min_grant_epsilon (default 0.001, or min_epsilon if smaller)."""
        if self.min_grant_epsilon is None:
            return min(DEFAULT_MIN_GRANT_EPSILON, self.min_epsilon)
        return self.min_grant_epsilon

    def filter(self):
        return filters.make_filter(self.accounting, self.epsilon, self.delta, self.orders)


@functools.lru_cache(maxsize=64)
def _parsed_stream(row):
    """The Stream of a ``streams`` row and its filter, parsed once per distinct row (a tuple of the row's values).

    Keyed by the whole row as read in the caller's transaction, so a stream re-created under the same name with
    other parameters (a different row) is parsed afresh: nothing read earlier is trusted, only the parsing is
    reused. Stream and filter are immutable.
    """
    s = Stream(row[0], row[1], row[2], row[3], tuple(json.loads(row[4])), row[5], row[6], row[7], row[8],
               json.loads(row[9]) if row[9] else None)
    object.__setattr__(s, "_filter", s.filter())
    return s


def _stream_filter(s):
    """``s.filter()``, built once per parsed stream row (filters are not changed after construction)."""
    filt = s.__dict__.get("_filter")
    return filt if filt is not None else s.filter()


@dataclass(frozen=True)
class Block:
    """A block's public description. Its exact row count is NOT here: it stays in the ledger."""

    stream: str
    id: str
    start: float | None
    end: float | None
    shard: int | None
    created: float
    state: str
    spent: tuple
    retired: float | None = None

    @property
    def key(self):
        if self.shard is not None:
            return {"shard": self.shard}
        if self.start is not None:
            return {"start": self.start, "end": self.end}
        return {}


@dataclass(frozen=True)
class Grant:
    """Permission to read ``blocks`` of ``stream``, already charged. Verify with ``Ledger.verify``."""

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

    def body(self):
        return {
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

    def to_json(self):
        return _canonical(dict(self.body(), signature=self.signature))

    @classmethod
    def from_json(cls, text):
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
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise GrantError(f"grant is malformed ({type(exc).__name__}: {exc}): {str(text)[:200]!r}") from None


@dataclass(frozen=True)
class Release:
    """One stage's release under a grant (``Ledger.release``): the computation's fingerprint and its spend."""

    grant_id: str
    stage: str
    computation: str
    epsilon: float
    delta: float
    created: float
    reopened: bool = False


class PipelineClaim:
    """Pipeline names this process holds (``Ledger.claim``); ``release()`` or leave the ``with`` block."""

    def __init__(self, store, handles):
        self._store, self._handles = store, list(handles)

    def release(self):
        handles, self._handles = self._handles, []
        for handle in handles:
            self._store.release_claim(handle)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()


class Ledger:
    """Open with ``Ledger.open(path_or_url, key_file=None)``; ``create=True`` makes a new ledger if none exists."""

    def __init__(self, store, keys, head_sync=None):
        """``keys``: the ledger's ``_KeySource`` (use ``Ledger.open``)."""
        self._head_sync = head_sync_mode(head_sync)
        self._store = store
        self._claims = []  # PipelineClaims of this process (Ledger.claim), released by close()
        self._key_source = keys
        self._legacy_grants = frozenset()
        with store.transaction(write=False) as tx:
            meta = dict(tx.all(sql.META_ALL))
        if "secret" in meta and "key_id" not in meta:
            self._keys = self._migrate_secret(meta["secret"])
            with store.transaction(write=False) as tx:
                meta = dict(tx.all(sql.META_ALL))
        else:
            self._keys = keys.keyring()
        if meta.get("key_id") != self._keys.key_id:
            raise KeyFileError(
                f"key file {keys.path} is not the key of ledger {store.display} (key id {self._keys.key_id}, the "
                f"ledger's {meta.get('key_id')}): give this ledger's key file (--key-file PATH or SAGE_KEY_FILE=PATH)")
        self._ledger_id = meta.get("ledger_id") or ""
        self._head = HeadFile(self._keys.head_path, self._head_sync)
        store.after_commit = self._advance_head
        if keys.created_ledger:
            self._advance_head((0, GENESIS), reset=True)
        if self._keys.legacy_secret is not None:
            self._legacy_grants = frozenset(self._migration_entry().get("legacy_grants", ()))

    @classmethod
    def open(cls, location, create=False, key_file=None, head_sync=None):
        """Open the ledger at ``location`` with its key file (``keys.resolve_key_path``: ``key_file``, else
        $SAGE_KEY_FILE, else ``<sqlite path>.key``). ``create=True`` creates the ledger, and its key file
        (mode 0600) if that does not exist yet. ``head_sync`` (``keys.HeadSync``: ``commit`` or ``group``;
        default $SAGE_HEAD_SYNC, else ``commit``) says when the audit's head file is made durable
        (docs/security.md)."""
        if not isinstance(location, (str, os.PathLike)) or not str(location):
            raise LedgerError(f"ledger location {location!r} is invalid: give a file path or a postgresql:// URL")
        head_sync = head_sync_mode(head_sync)  # a bad mode is refused before anything is created
        try:
            keys = _KeySource(resolve_key_path(location, key_file), create)
        except KeyFileError as exc:
            if create:
                raise  # before anything is created
            keys = _KeySource(None, create, error=exc)  # PostgreSQL: a connection error is named first
        if keys.path is None:
            pass
        elif os.path.exists(keys.path):
            keys.keyring()  # a key file that is too open or malformed is refused before anything is created
        elif create and not os.path.isdir(os.path.dirname(keys.path)):
            raise KeyFileError(f"cannot create key file {keys.path}: folder {os.path.dirname(keys.path)} does not "
                               "exist (create it, mode 0700, or give another --key-file)")
        try:
            store = open_store(location, create=create, on_create=keys.new_ledger_meta)
        except BaseException:
            keys.undo_created()
            raise
        try:
            return cls(store, keys, head_sync)
        except BaseException:
            store.close()
            raise

    @property
    def keyring(self):
        """The ledger's ``KeyRing`` (derived keys; ``block_key(stream, block)``). TRUSTED CODE ONLY."""
        return self._keys

    @property
    def key_file(self):
        return self._keys.path

    def _advance_head(self, head, reset=False):
        """After a committed write: record its last log entry in the head file (outside the database)."""
        seq, chain = head
        try:
            self._head.advance(self._ledger_id, seq, chain, reset=reset)
        except (OSError, LedgerError) as exc:  # the write is committed: the audit will say the head is behind
            logging.getLogger(__name__).warning("sage ledger: could not update head file %s: %s", self._head.path, exc)

    def _migrate_secret(self, secret):
        """Move an older ledger's ``meta.secret`` out of the database (docs/security.md, "Migration").

        1. the key file is written (new master key + the old secret, 0600, fsync) unless it exists already
           holding this secret (a migration killed after step 1);
        2. one transaction deletes ``meta.secret``, records the key id and a ledger id, and appends a keyed
           ``keys`` log entry naming the grants signed with the old secret and the last entry chained without
           a key (the audit verifies those with the old rules).
        A kill between the steps leaves the secret in the database and the key file beside it: the next open
        finds both and finishes step 2.
        """
        if self._key_source.path is None:
            self._key_source.keyring()  # raises: no key file location (PostgreSQL)
        path = self._key_source.path
        if not os.path.exists(path):
            try:
                KeyRing.create_migrated(path, secret)
            except KeyFileError:
                if not os.path.exists(path):  # else: another process migrating at the same moment
                    raise
        keys = KeyRing.load(path)
        if keys.legacy_secret != secret.encode():
            raise KeyFileError(
                f"key file {path} exists but does not hold ledger {self._store.display}'s old secret: this ledger "
                "is from an older version and is migrated on open; give its own key file, or a path where none "
                "exists yet (--key-file PATH or SAGE_KEY_FILE=PATH)")
        self._keys = keys
        with self._store.transaction() as tx:
            if tx.one(sql.META_HAS_SECRET) is None or tx.one(sql.META_HAS_KEY_ID) is not None:
                return keys  # migrated by another process meanwhile
            last = tx.one(sql.LOG_LAST_SEQ)
            grants = sorted(r[0] for r in tx.all(sql.GRANT_IDS))
            ledger_id = (tx.one(sql.META_LEDGER_ID) or [None])[0] or secrets.token_hex(16)
            tx.run(sql.META_DELETE_KEY_ROWS)
            tx.run(sql.META_INSERT_KEY_ID, (keys.key_id,))
            tx.run(sql.META_INSERT_LEDGER_ID, (ledger_id,))
            self._ledger_id = ledger_id
            self._head = HeadFile(keys.head_path, self._head_sync)
            self._store.after_commit = self._advance_head
            self._log(tx, "keys", {"key_id": keys.key_id, "legacy_chain_until": last[0] if last else 0,
                                   "legacy_grants": grants})
        return keys

    def _migration_entry(self):
        """The body of the keyed ``keys`` entry a migration wrote ({} if none, or if it does not verify)."""
        with self._store.transaction(write=False) as tx:
            row = tx.one(sql.LOG_FIRST_KEYS_ENTRY)
        if row is None or not hmac.compare_digest(self._keys.chain_value(row[3], row[0], row[1], row[2]), row[4]):
            return {}
        body = json.loads(row[2])
        return body if body.get("legacy_chain_until") == row[0] - 1 else {}

    @property
    def backend(self):
        return self._store.kind

    def close(self):
        for claim in getattr(self, "_claims", ()):
            claim.release()
        try:
            if hasattr(self, "_head"):
                self._head.flush()  # HeadSync.GROUP: this ledger's last head made durable now (commit: nothing)
                self._head.close()  # the descriptors kept open between writes
        except (OSError, LedgerError) as exc:  # as _advance_head: the commits stand, the audit says the head lags
            logging.getLogger(__name__).warning("sage ledger: could not update head file %s: %s", self._head.path, exc)
        finally:
            self._store.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ----------------------------------------------------------------- streams
    @staticmethod
    def check_stream_args(name, epsilon, delta, accounting=Accounting.BASIC, orders=None, policy=Policy.CONSERVE,
                          min_epsilon=None, max_epsilon=DEFAULT_MAX_STREAM_EPSILON,
                          min_grant_epsilon=None, policy_params=None):
        """``create_stream``'s checks alone, without a ledger: (filter, min_epsilon, min_grant_epsilon), or
        LedgerError naming the value. ``sage ledger init`` runs them before it creates a ledger file, so a refusal
        leaves nothing. ``policy_params``: a queued policy's parameters (``n``, ``lifetime``; allocation.py)."""
        _check_name(name, "stream name")
        if accounting not in tuple(Accounting):
            raise LedgerError(f"accounting {accounting!r} is unknown: use 'basic' or 'rdp'")
        if policy_params is not None and not isinstance(policy_params, collections.abc.Mapping):
            raise LedgerError(f"policy_params {policy_params!r} is invalid: give a dict such as {{'n': 50}}")
        get_policy(policy, policy_params)  # LedgerError naming the known policies, or the bad parameter
        try:
            filt = filters.make_filter(accounting, epsilon, delta, orders)
        except ValueError as exc:
            raise LedgerError(str(exc)) from None
        max_epsilon = _finite(max_epsilon, "max_epsilon", allow_none=False)
        if not max_epsilon > 0:
            raise LedgerError(f"max_epsilon {max_epsilon!r} is invalid: need max_epsilon > 0")
        if filt.epsilon > max_epsilon:
            raise LedgerError(
                f"stream epsilon {epsilon!r} is above the maximum {max_epsilon:g}: a guarantee that weak says little "
                f"(e^epsilon bounds how much one person's records may change any outcome's odds); give epsilon <= "
                f"{max_epsilon:g}, or raise the limit knowingly (sage ledger init --max-epsilon E; "
                "create_stream(..., max_epsilon=E))")
        if min_epsilon is None:
            min_epsilon = filt.epsilon / 100.0
        min_epsilon = _finite(min_epsilon, "min_epsilon", allow_none=False)
        if not 0 < min_epsilon <= filt.epsilon:
            raise LedgerError(f"min_epsilon {min_epsilon!r} is invalid: need 0 < min_epsilon <= epsilon")
        if min_grant_epsilon is None:
            min_grant_epsilon = min(DEFAULT_MIN_GRANT_EPSILON, min_epsilon)
        min_grant = _finite(min_grant_epsilon, "min_grant_epsilon", allow_none=False)
        if not 0 < min_grant <= filt.epsilon:
            raise LedgerError(f"min_grant_epsilon {min_grant_epsilon!r} is invalid: need 0 < min_grant_epsilon <= "
                              "epsilon")
        return filt, min_epsilon, min_grant

    def create_stream(self, name, epsilon, delta, accounting=Accounting.BASIC, orders=None, policy=Policy.CONSERVE,
                      min_epsilon=None, max_epsilon=DEFAULT_MAX_STREAM_EPSILON,
                      min_grant_epsilon=None, policy_params=None):
        """Create a stream with a global (epsilon, delta) guarantee over all its blocks, forever.

        ``policy`` (``Policy``) decides who may spend a block's budget and when (docs/scheduling_policies.md);
        a queued one (dpf-n, dpf-t, dpack) takes ``policy_params`` (``{"n": 50}``, ``{"lifetime": 3600.0}``;
        defaults otherwise), stored with the stream in full so every process applies the same rule.

        ``epsilon`` may be at most ``max_epsilon`` (default 10, ``DEFAULT_MAX_STREAM_EPSILON``);
        ``min_epsilon`` (default epsilon / 100) is the query a block must still admit to stay active;
        every grant must charge at least ``min_grant_epsilon`` (default: 0.001, or ``min_epsilon`` if smaller).
        """
        filt, min_epsilon, min_grant = self.check_stream_args(name, epsilon, delta, accounting, orders, policy,
                                                              min_epsilon, max_epsilon, min_grant_epsilon,
                                                              policy_params)
        orders = tuple(getattr(filt, "orders", ()))
        rules = get_policy(policy, policy_params)
        params = rules.params() if rules.queued else None  # in full: defaults written down
        now = time.time()
        with self._store.transaction() as tx:
            if tx.one(sql.STREAM_EXISTS, (name,)):
                raise LedgerError(f"stream {name!r} already exists")
            tx.run(
                sql.STREAM_INSERT,
                (name, accounting, filt.epsilon, filt.delta, json.dumps(orders), policy, min_epsilon, now, min_grant,
                 None if params is None else _canonical(params)),
            )
            body = {
                "name": name, "accounting": accounting, "epsilon": filt.epsilon, "delta": filt.delta,
                "orders": list(orders), "policy": policy, "min_epsilon": min_epsilon, "min_grant_epsilon": min_grant,
            }
            if params is not None:  # only queued streams carry it: other streams' entries stay as they were
                body["policy_params"] = params
            self._log(tx, "stream", body)
        return self.stream(name)

    def stream(self, name, tx=None):
        if tx is None:
            with self._store.transaction(write=False) as tx:
                return self.stream(name, tx)
        row = tx.one(sql.STREAM_ROW, (name,))
        if row is None:
            known = [r[0] for r in tx.all(sql.STREAM_NAMES)]
            raise UnknownStream(f"stream {name!r} does not exist (streams: {', '.join(known) or 'none'})")
        return _parsed_stream(tuple(row))

    def streams(self):
        with self._store.transaction(write=False) as tx:
            return [self.stream(r[0], tx) for r in tx.all(sql.STREAM_NAMES)]

    # ------------------------------------------------------------------ blocks
    def add_block(self, stream, block_id, start=None, end=None, shard=None, rows=None, created=None, digest=None,
                  allow_duplicate_of=()):
        """Add a fresh block (zero loss). Its budget is split among the pipelines waiting now.

        ``start``/``end`` (unix seconds) key a time window [start, end); ``shard``
        keys a user shard. ``rows`` is the exact row count, kept inside the ledger;
        ``digest`` the content digest of its records (ingest's), see ``add_blocks``.
        """
        self.add_blocks(stream, [dict(id=block_id, start=start, end=end, shard=shard, rows=rows, created=created,
                                      digest=digest)], allow_duplicate_of=allow_duplicate_of)
        return self.block(stream, block_id)

    def add_blocks(self, stream, blocks, allow_duplicate_of=()):
        """Add many fresh blocks in ONE transaction: all are added, or none (e.g. one ingest's blocks).

        ``blocks`` are dicts with ``id`` and the keyword arguments of ``add_block``. A block whose
        ``digest`` another stream already registered is refused (DuplicateContent: the same records
        would get a fresh budget here), unless that stream is in ``allow_duplicate_of``.
        """
        if isinstance(blocks, (str, bytes)) or not all(isinstance(b, collections.abc.Mapping) for b in blocks):
            bad = blocks if isinstance(blocks, (str, bytes)) else next(
                b for b in blocks if not isinstance(b, collections.abc.Mapping))
            raise LedgerError(f"add_blocks: block {bad!r} is not a dict: give a list of dicts with 'id' and the keyword "
                              "arguments of add_block (e.g. [{'id': 'b0'}]), or call add_block(stream, id)")
        checked = [self._check_block(**b) for b in blocks]
        ids = [b[0] for b in checked]
        dupes = sorted(i for i, n in collections.Counter(ids).items() if n > 1)
        if dupes:
            raise LedgerError(f"block id(s) given more than once: {', '.join(dupes)}")
        allowed = set(allow_duplicate_of or ())
        with self._store.transaction() as tx:
            s = self.stream(stream, tx)
            filt = s.filter()
            # before the digest check: a block of this stream is never taken for a copy. One query per 500 ids
            # (primary key look-ups), so the cost does not grow with the stream (docs/BENCHMARKS.md).
            existing = set()
            for i in range(0, len(ids), 500):
                chunk = ids[i:i + 500]
                existing.update(r[0] for r in tx.all(sql.block_ids_present(len(chunk)), [stream, *chunk]))
            for block_id in ids:
                if block_id in existing:
                    raise LedgerError(f"block {block_id!r} already exists in stream {stream!r}")
            owners = self._digest_owners(tx, [b[-1] for b in checked if b[-1]], stream)
            for args in checked:
                others = [o for o in owners.get(args[-1], []) if o[0] not in allowed]
                if others:
                    raise DuplicateContent(
                        f"block {args[0]!r}: its records (digest {args[-1]}) are already registered as block "
                        f"{others[0][1]!r} of stream {others[0][0]!r}; in stream {stream!r} they would get a fresh "
                        f"budget: nothing was added (allow the copy knowingly with "
                        f"--allow-duplicate-of-stream {others[0][0]}, allow_duplicate_of=({others[0][0]!r},))")
            waiting = [r[0] for r in tx.all(sql.PIPELINE_WAITING, (stream,))]
            share = s.rules().new_block_shares(filt.capacity, waiting)  # the same for every new block
            for args in checked:
                self._insert_block(tx, stream, filt, waiting, share, *args)
            if s.rules().queued:  # a scheduling point (DPF-T: time has passed)
                self._schedule(tx, s, filt, time.time())

    def digest_owners(self, digests, exclude_stream=None):
        """{digest: [(stream, block id), ...]} for the given content digests registered in streams other than
        ``exclude_stream``. TRUSTED CODE ONLY (ingest)."""
        with self._store.transaction(write=False) as tx:
            return self._digest_owners(tx, digests, exclude_stream)

    @staticmethod
    def _digest_owners(tx, digests, exclude_stream):
        digests, out = sorted(set(digests)), {}
        for i in range(0, len(digests), 500):
            chunk = digests[i:i + 500]
            for digest, stream, block_id in tx.all(sql.block_digest_owners(len(chunk)), [*chunk, exclude_stream or ""]):
                out.setdefault(digest, []).append((stream, block_id))
        return out

    @staticmethod
    def _check_block(id, start=None, end=None, shard=None, rows=None, created=None, digest=None):
        block_id = _check_name(id, "block id")
        start, end = _finite(start, "start"), _finite(end, "end")
        if (start is None) != (end is None):
            raise LedgerError(f"block {block_id!r}: give both start and end of its window (start={start}, end={end})")
        if start is not None and not start < end:
            raise LedgerError(f"block {block_id!r}: window start {start} must be before end {end}")
        if shard is not None:
            if start is not None:
                raise LedgerError(f"block {block_id!r}: a block is keyed by a time window or a shard, not both")
            if isinstance(shard, bool) or not isinstance(shard, int) or shard < 0:
                raise LedgerError(f"block {block_id!r}: shard {shard!r} must be an integer >= 0")
        if rows is not None and (isinstance(rows, bool) or not isinstance(rows, int) or rows < 0):
            raise LedgerError(f"block {block_id!r}: rows {rows!r} must be an integer >= 0")
        created = time.time() if created is None else _finite(created, "created", allow_none=False)
        if digest is not None and not (isinstance(digest, str) and _DIGEST.match(digest)):
            raise LedgerError(f"block {block_id!r}: digest {digest!r} must be 1-64 lowercase hex digits")
        return block_id, start, end, shard, rows, created, digest

    def _insert_block(self, tx, stream, filt, waiting, share, block_id, start, end, shard, rows, created, digest=None):
        # The caller (add_blocks) refused ids present in the stream or repeated in the batch, in the same transaction.
        if start is not None:
            # Does [start, end) overlap a window of the stream? The windows already there are pairwise disjoint
            # (each was checked here), so it is enough to look at the ONE window that starts last before ``end``:
            # if some window B overlaps (B.start < end, B.end > start) and the last-starting one M is not B, then
            # B.start < M.start, so M.start >= B.end > start, and M overlaps too (M.end > M.start > start). The
            # look-up is one descent of the (stream, start_ts) index, not a scan of every older window.
            clash = tx.one(sql.BLOCK_LAST_WINDOW_CLASH, (stream, end, start))
            if clash:  # refused: name the earliest overlapping window, as the scan this replaced did
                clash = tx.one(sql.BLOCK_FIRST_WINDOW_CLASH, (stream, end, start)) or clash
                raise LedgerError(f"block {block_id!r}: window [{start}, {end}) overlaps block {clash[0]!r}")
        if shard is not None:
            clash = tx.one(sql.BLOCK_SHARD_CLASH, (stream, shard))
            if clash:
                raise LedgerError(f"block {block_id!r}: shard {shard} is already block {clash[0]!r}")
        zero = filt.zero()
        tx.run(
            sql.BLOCK_INSERT,
            (stream, block_id, start, end, shard, rows, created, json.dumps(zero), digest),
        )
        self._log(tx, "block", {"stream": stream, "id": block_id, "start": start, "end": end,
                                "shard": shard, "created": created, "rows": rows, "digest": digest})
        if share is not None:
            tx.many(
                sql.RESERVATION_INSERT,
                [(stream, block_id, p, json.dumps(share), json.dumps(zero)) for p in waiting],
            )
            self._log(tx, "reserve", {"stream": stream, "block": block_id, "pipelines": waiting,
                                      "share": list(share)})

    def block(self, stream, block_id):
        with self._store.transaction(write=False) as tx:
            self.stream(stream, tx)
            rows = self._blocks(tx, stream, [block_id])
        if not rows:
            raise UnknownBlock(f"block {block_id!r} does not exist in stream {stream!r}")
        return rows[block_id]

    def blocks(self, stream, state=None):
        """The stream's blocks in key order (time or shard), optionally only 'active' or 'retired'."""
        if state is not None and state not in tuple(BlockState):
            raise LedgerError(f"block state {state!r} is unknown: use 'active' or 'retired'")
        with self._store.transaction(write=False) as tx:
            self.stream(stream, tx)
            rows = tx.all(sql.BLOCK_ROWS_IN_STATE, (stream, state)) if state else tx.all(sql.BLOCK_ROWS, (stream,))
        return self._block_rows(stream, rows)

    def private_row_count(self, stream, block_id):
        """The exact row count of a block. TRUSTED CODE ONLY (ingest, data readers' sanity checks).

        Never show this to a pipeline: what a pipeline learns about its data size
        must be the public block count or a DP count charged to its grant.
        """
        with self._store.transaction(write=False) as tx:
            row = tx.one(sql.BLOCK_N_ROWS, (stream, block_id))
        if row is None:
            raise UnknownBlock(f"block {block_id!r} does not exist in stream {stream!r}")
        return row[0]

    def block_digest(self, stream, block_id):
        """The content digest registered for a block at ingest (None for blocks registered without one).

        TRUSTED CODE ONLY (the block readers check the block files against it, docs/security.md).
        """
        with self._store.transaction(write=False) as tx:
            row = tx.one(sql.BLOCK_DIGEST, (stream, block_id))
        if row is None:
            raise UnknownBlock(f"block {block_id!r} does not exist in stream {stream!r}")
        return row[0]

    def _block_row(self, stream, r, decode=None):
        spent = decode(r[6]) if decode else tuple(json.loads(r[6]))
        return Block(stream, r[0], r[1], r[2], r[3], r[4], r[5], spent, r[7])

    def _block_rows(self, stream, rows):
        decode = _vector_decoder()
        return [self._block_row(stream, r, decode) for r in rows]

    def _blocks(self, tx, stream, ids):
        found = {}
        ids = list(ids)
        for i in range(0, len(ids), 500):  # stay under SQL variable limits
            chunk = ids[i:i + 500]
            rows = tx.all(sql.block_rows(len(chunk)), [stream, *chunk])
            found.update((b.id, b) for b in self._block_rows(stream, rows))
        return found

    @staticmethod
    def _block_budgets(tx, stream, ids):
        """What ``request`` checks of the blocks ``ids`` that exist, in one read: ({id: (state, spent TEXT as
        stored)}, their reservations as ``_reservations`` gives them: {block: {pipeline: {"reserved", "used"}}},
        pipelines in name order). The spent text is decoded by the caller once per distinct text."""
        found, reservations, decode = {}, {}, _vector_decoder()
        ids = list(ids)
        for i in range(0, len(ids), 500):  # stay under SQL variable limits
            chunk = ids[i:i + 500]
            rows = tx.all(sql.block_budgets(len(chunk)), [stream, *chunk])
            for block, state, spent, pipeline, reserved, used in rows:
                found[block] = (state, spent)
                if pipeline is not None:
                    reservations.setdefault(block, {})[pipeline] = {"reserved": decode(reserved), "used": decode(used)}
        return found, reservations

    def window_blocks(self, stream, start, end):
        """Active blocks whose time window lies inside [start, end)."""
        start, end = _finite(start, "window start", False), _finite(end, "window end", False)
        if not start < end:
            raise LedgerError(f"window [{start}, {end}) is empty: start must be before end")
        with self._store.transaction(write=False) as tx:
            self.stream(stream, tx)
            ids = [r[0] for r in tx.all(sql.BLOCK_WINDOW_IDS, (stream, start, end))]
        if not ids:
            raise LedgerError(f"window [{start}, {end}) holds no active blocks of stream {stream!r}")
        return ids

    # --------------------------------------------------------------- pipelines
    def register(self, stream, pipeline):
        """Mark a pipeline as waiting: it gets an even share of every block that arrives from now on."""
        _check_name(pipeline, "pipeline name")
        with self._store.transaction() as tx:
            s = self.stream(stream, tx)
            row = tx.one(sql.PIPELINE_STATE_OUTCOME, (stream, pipeline))
            if row is not None:
                if row[0] == PipelineState.WAITING:
                    return
                raise LedgerError(f"pipeline {pipeline!r} already finished on stream {stream!r} with {row[1]}")
            tx.run(sql.PIPELINE_INSERT, (stream, pipeline, time.time()))
            self._log(tx, "register", {"stream": stream, "pipeline": pipeline})
            if s.rules().queued:  # an arrival: one more share of every live block unlocks (DPF-N, DPack)
                tx.run(sql.BLOCK_COUNT_ARRIVAL, (stream,))
                self._schedule(tx, s, s.filter(), time.time())

    def claim(self, stream, pipelines):
        """Claim ``pipelines`` of ``stream`` for this process while it runs them; return a ``PipelineClaim``.

        One process runs a pipeline name at a time: two `sage serve`/`sage run` processes (on one host or on
        several sharing a PostgreSQL ledger) running the same name would charge grants for one pipeline's
        iterations side by side and resume each other's unfinished grant (docs/scale_out.md, "Several hosts
        on one PostgreSQL ledger"). A claim is a lock the holder's exit drops (a PostgreSQL session advisory
        lock, or an flock beside an SQLite ledger), so a killed run's name is free for its restart. Raises
        PipelineBusy, naming the pipeline and who holds it, if another process holds any of them (then none is
        claimed). The claim holds until ``release()`` (or ``with``), the ledger's ``close()`` or the exit.
        """
        names = [_check_name(p, "pipeline name") for p in pipelines]
        self.stream(stream)
        held, busy = [], []
        for name in dict.fromkeys(names):
            handle, holder = self._store.try_claim(f"{stream}\0{name}")
            if handle is None:
                busy.append(f"{name!r} (held by {holder})")
            else:
                held.append(handle)
        if busy:
            for handle in held:
                self._store.release_claim(handle)
            raise PipelineBusy(
                f"pipeline(s) {', '.join(busy)} of stream {stream!r} are being run by another process: one process "
                "runs a pipeline name at a time (else both would charge and resume the same pipeline's grants). "
                "Give this run other names (sage serve --pipeline OTHER=..., sage run --name OTHER), or wait until "
                "that process ends")
        claim = PipelineClaim(self._store, held)
        self._claims.append(claim)
        return claim

    def pipelines(self, stream):
        with self._store.transaction(write=False) as tx:
            self.stream(stream, tx)
            return [dict(zip(("name", "state", "outcome", "registered", "finished"), r))
                    for r in tx.all(sql.PIPELINE_ROWS, (stream,))]

    def finish(self, stream, pipeline, outcome):
        """End a pipeline (ACCEPT, REJECT or TIMEOUT); split its unused reservations among those still waiting."""
        if outcome not in OUTCOMES:
            raise LedgerError(f"outcome {outcome!r} is unknown: use one of {', '.join(OUTCOMES)}")
        with self._store.transaction() as tx:
            s = self.stream(stream, tx)
            row = tx.one(sql.PIPELINE_STATE, (stream, pipeline))
            if row is None:
                raise LedgerError(f"pipeline {pipeline!r} is not registered on stream {stream!r}")
            if row[0] != PipelineState.WAITING:
                raise LedgerError(f"pipeline {pipeline!r} already finished on stream {stream!r}")
            tx.run(sql.PIPELINE_FINISH, (outcome, time.time(), stream, pipeline))
            others = [r[0] for r in tx.all(sql.PIPELINE_WAITING, (stream,))]
            # Every reservation on the stream's active blocks held by this pipeline or one still waiting,
            # read at once; the new values are computed here and written back in a few statements.
            held = collections.defaultdict(dict)
            for block_id, holder, reserved, used in tx.all(sql.RESERVATION_HELD, (stream, pipeline)):
                held[block_id][holder] = (reserved, used)
            zero = s.filter().zero()
            rules = s.rules()
            writes = []  # (block, pipeline, reserved, used): upserted, only `reserved` changes on existing rows
            released = sorted(b for b in held if pipeline in held[b])
            for block_id in released:
                holdings = {holder: {"reserved": json.loads(reserved), "used": json.loads(used)}
                            for holder, (reserved, used) in held[block_id].items()}
                # The finished pipeline keeps only what it used; the rest goes to those waiting (allocation.py).
                for holder, (reserved, used) in rules.redistribute(holdings, pipeline, others, zero).items():
                    writes.append((block_id, holder, json.dumps(list(reserved)), json.dumps(list(used))))
            for i in range(0, len(writes), 400):  # 5 values a row: under every backend's parameter limit
                chunk = writes[i:i + 400]
                tx.run(sql.reservation_upsert(len(chunk)), [v for row in chunk for v in (stream, *row)])
            moved = len(released)
            self._log(tx, "finish", {"stream": stream, "pipeline": pipeline, "outcome": outcome,
                                     "blocks_released": moved, "to": others})
            if rules.queued:  # its demand (pending, or admitted and never collected) is withdrawn
                tx.run(sql.DEMAND_DELETE, (stream, pipeline))
                self._schedule(tx, s, s.filter(), time.time())

    # ------------------------------------------------------------------ grants
    def request(self, pipeline, stream, blocks=None, window=None, epsilon=None, delta=0.0, curve=None,
                rule=None, meta=None, split=None):
        """Check and charge every block atomically; return a signed Grant, or raise BudgetRefused.

        Give ``blocks`` (ids) or ``window`` ((start, end), all active blocks inside).
        Give ``epsilon`` (and ``delta``) for an (epsilon, delta)-DP query, or an RDP
        ``curve`` (values aligned with the stream's orders, an {order: value} map,
        or a dp_accounting DpEvent). Data may be read only after this returns.

        ``split`` (a ``BudgetSplit``, or its dict in ``meta["split"]``) says what each pipeline
        stage may spend; it must compose, under its rule, to at most the charge (refused
        otherwise, nothing charged). Without one the grant is single-stage: ONE stage may
        spend all of it (``release``). ``rule``, if given, must be the split's rule
        ("single" without a split); the grant records it.
        """
        _check_name(pipeline, "pipeline name")
        if (blocks is None) == (window is None):
            raise LedgerError("give either blocks or window, not both and not neither")
        if window is not None:
            try:
                start, end = window
            except (TypeError, ValueError):
                raise LedgerError(f"window {window!r} must be a (start, end) pair") from None
            blocks = self.window_blocks(stream, start, end)
        if isinstance(blocks, str):
            blocks = [b for b in blocks.split(",") if b]
        blocks = list(blocks)
        if not blocks:
            raise LedgerError("the block set is empty: name at least one block")
        dupes = len(set(blocks)) != len(blocks) and sorted(b for b, n in collections.Counter(blocks).items() if n > 1)
        if dupes:
            raise LedgerError(f"the block set names blocks more than once: {', '.join(map(str, dupes))}")
        meta = dict(meta or {})
        if split is not None:
            if not isinstance(split, BudgetSplit):
                raise LedgerError(f"split {split!r} must be a BudgetSplit (or give its dict as meta['split'])")
            if SPLIT_KEY in meta and meta[SPLIT_KEY] != split.to_dict():
                raise LedgerError("give the split once: as split= or as meta['split'], not two different ones")
            meta[SPLIT_KEY] = split.to_dict()
        split = self._check_split(meta, rule)
        rule = SINGLE_RULE if split is None else split.rule
        with self._store.transaction() as tx:
            # One statement reads the stream row, the pipeline's state and the log's last entry (what ``_log``
            # chains the grant's entry to): all three as of this write transaction, which is exclusive (SQLite's
            # write lock, PostgreSQL's meta lock row), so nothing read here is from before another writer's commit.
            row = tx.one(sql.STREAM_REQUEST_READ, (stream, pipeline, stream))
            if row is None:
                self.stream(stream, tx)  # raises UnknownStream, naming the streams there are
            s = _parsed_stream(tuple(row[:10]))
            pipeline_state, tx.log_last = row[10], (row[11], row[12]) if row[11] is not None else None
            filt = _stream_filter(s)
            try:
                if curve is None and epsilon is None:
                    raise ValueError("give epsilon (and delta) or an RDP curve")
                cost = filt.cost(epsilon=epsilon, delta=delta, curve=curve)
            except ValueError as exc:
                raise LedgerError(str(exc)) from None
            found, reservations = self._block_budgets(tx, stream, blocks)
            missing = [b for b in blocks if b not in found]
            if missing:
                raise UnknownBlock(f"unknown block(s) in stream {stream!r}: {', '.join(map(str, missing))}")
            active = BlockState.ACTIVE.value
            retired = [b for b in blocks if found[b][0] != active]
            if retired:
                raise BlockRetired(f"block(s) {', '.join(retired)} of stream {stream!r} are retired "
                                   "(budget exhausted) and are never offered again")
            _check_minimum(filt, s, cost, epsilon if curve is None else None)
            if pipeline_state is not None and pipeline_state != PipelineState.WAITING:
                raise LedgerError(f"pipeline {pipeline!r} already finished on stream {stream!r}")
            if s.rules().queued:
                if split is not None:  # checked before the demand is recorded: its grant's split must compose
                    split.check_covered(filt.query_epsilon(cost),
                                        cost[0] if s.accounting == Accounting.RDP else cost[1])
                grant, refusal = self._queued_request(tx, s, filt, pipeline, blocks, found, cost, rule, meta)
            else:
                grant = self._charge_now(tx, s, filt, pipeline, blocks, found, reservations, cost, rule, meta, split)
                refusal = None
        if refusal:  # after the commit: the demand stays recorded, and the scheduler grants it when it fits
            raise BudgetRefused(stream, pipeline, refusal)
        return grant

    def _charge_now(self, tx, s, filt, pipeline, blocks, found, reservations, cost, rule, meta, split):
        """Conserve/Aggressive: charge ``cost`` on every block now if the policy's source admits it on all, or
        raise BudgetRefused (nothing charged); return the signed Grant.

        Every block is checked, but blocks in the same state (the same stored spent text and the same
        reservations) get the same answer and the same new values from these pure functions, so each distinct
        state is decoded, evaluated and encoded once (32 fresh blocks: once), and written in one UPDATE per
        distinct new value, naming its blocks."""
        stream = s.name
        if reservations:  # a block's state: its spent text and its reservations
            keys = [(found[b][1], tuple((p, h["reserved"], h["used"]) for p, h in reservations.get(b, {}).items()))
                    for b in blocks]
        else:  # no reservation on any of the blocks: its spent text alone
            keys = [(found[b][1], ()) for b in blocks]
        groups = {}  # {state key: [blocks, in grant order]}
        for b, key in zip(blocks, keys):
            group = groups.get(key)
            if group is None:
                groups[key] = [b]
            else:
                group.append(b)
        verdicts, rules = {}, s.rules()
        for key, members in groups.items():
            spent, holdings = tuple(json.loads(key[0])), reservations.get(members[0], {})
            if not filt.admits(spent, cost):
                verdicts[key] = (False, filt.shortfall(spent, cost), spent)
            else:
                source = self._source(filt, spent, cost, holdings, pipeline, rules)
                verdicts[key] = ((True, source, spent) if isinstance(source, str) else (False, source.reason, spent))
        if not all(v[0] for v in verdicts.values()):
            raise BudgetRefused(stream, pipeline, {b: verdicts[k][1] for b, k in zip(blocks, keys)
                                                   if not verdicts[k][0]})

        now = time.time()
        grant, body_text = self._new_grant(s, filt, pipeline, blocks, cost, rule, meta, now, split)
        min_cost = _stream_cost(s, filt, s.min_epsilon)
        active, retired_state, own = BlockState.ACTIVE.value, BlockState.RETIRED.value, Source.OWN
        block_groups, own_groups, alive_of = {}, {}, {}
        for key, members in groups.items():
            _ok, source, spent = verdicts[key]
            spent = filters.add(spent, cost)
            alive = alive_of[key] = not rules.retires(filt, spent, min_cost)
            block_groups.setdefault((json.dumps(spent), active if alive else retired_state, None if alive else now),
                                    []).extend(members)
            if source == own:
                used = json.dumps(filters.add(reservations[members[0]][pipeline]["used"], cost))
                own_groups.setdefault(used, []).extend(members)
        for used, ids in sorted(own_groups.items(), key=lambda kv: kv[1][0]):
            for i in range(0, len(ids), 500):  # stay under SQL variable limits
                chunk = ids[i:i + 500]
                tx.run(sql.reservation_set_used(len(chunk)), [used, stream, pipeline, *chunk])
        for (spent_text, state, retired_at), ids in sorted(block_groups.items(), key=lambda kv: kv[1][0]):
            for i in range(0, len(ids), 500):
                chunk = ids[i:i + 500]
                tx.run(sql.block_set_spent(len(chunk)), [spent_text, state, retired_at, stream, *chunk])
        tx.run(sql.GRANT_INSERT, (grant.id, stream, pipeline, body_text, grant.signature, now))
        sources = [verdicts[k][1] for k in keys]
        self._log(tx, "grant", None, _grant_log_text(grant, body_text, sources))
        if not all(alive_of.values()):
            self._log(tx, "retire", {"stream": stream, "blocks": [b for b, k in zip(blocks, keys) if not alive_of[k]]})
        return grant

    def _new_grant(self, s, filt, pipeline, blocks, cost, rule, meta, now, split=None):
        """A signed Grant of ``cost`` on ``blocks`` and its body text (signed and stored: one text)."""
        grant = Grant(
            id="g-" + secrets.token_hex(12), stream=s.name, pipeline=pipeline, blocks=tuple(blocks),
            epsilon=filt.query_epsilon(cost), delta=cost[0] if s.accounting == Accounting.RDP else cost[1],
            accounting=s.accounting, cost=cost, rule=rule, created=now, meta=meta,
        )
        if split is not None:  # the stages compose to at most what is charged (privacy/split.py)
            split.check_covered(grant.epsilon, grant.delta)
        body_text = _canonical(grant.body())
        return Grant(**{**grant.__dict__, "signature": self._keys.sign(body_text.encode())}), body_text

    # ------------------------------------------------------------ queued policies (DPF-N, DPF-T, DPack)
    # docs/scheduling_policies.md. A refused request is recorded as the pipeline's demand (table ``demands``, log
    # ``demand``) in the transaction that refuses it; every scheduling point (request, add_blocks, register,
    # finish) runs ``allocation.QueuedAllocation.schedule`` (the simulator's code: the rules are not written
    # here) over the pending demands, charges each admitted one at once (the filter checked as it is charged,
    # all blocks or none: log ``admit`` then one ``grant`` per admission) and keeps its grant for the
    # pipeline's next identical request (log ``collect``). The audit replays all of it (audit.py).
    def _queued_request(self, tx, s, filt, pipeline, blocks, found, cost, rule, meta):
        """(grant, None) if granted now or collected; (None, {block: why}) once the demand is recorded."""
        stream, meta_text = s.name, _canonical(meta)
        row = tx.one(sql.DEMAND_ROW, (stream, pipeline))
        same = row is not None and (json.loads(row[0]), tuple(json.loads(row[1])), row[2], row[3]) == (
            list(blocks), tuple(cost), rule, meta_text)
        if same and row[4] == _ADMITTED:  # admitted and charged by an earlier scheduling point: hand it over
            tx.run(sql.DEMAND_DELETE, (stream, pipeline))
            self._log(tx, "collect", {"stream": stream, "pipeline": pipeline, "grant": row[5]})
            body, signature = tx.one(sql.GRANT_BODY, (row[5],))
            return Grant.from_json(dict(json.loads(body), signature=signature)), None
        if not same:  # a new demand (replacing any earlier one of this pipeline; an admitted grant stays charged)
            self._log(tx, "demand", {"stream": stream, "pipeline": pipeline, "blocks": list(blocks),
                                     "cost": list(cost), "rule": rule, "meta": meta})
            tx.run(sql.DEMAND_DELETE, (stream, pipeline))
            tx.run(sql.DEMAND_INSERT,
                   (stream, pipeline, json.dumps(list(blocks)), json.dumps(list(cost)), rule, meta_text, tx.head[0],
                    _PENDING))
        now = time.time()
        granted, queue = self._schedule(tx, s, filt, now, caller=pipeline)
        if pipeline in granted:
            return granted[pipeline], None
        why = {}
        for b in blocks:
            if queue.fits(b, cost, now):
                continue
            if b in queue.retired:
                why[b] = "retired meanwhile (budget exhausted)"
            elif not filt.admits(queue.spent[b], cost):
                why[b] = filt.shortfall(queue.spent[b], cost)
            else:
                why[b] = (f"waits in the {s.policy} queue: {queue.fraction(b, now):.4g} of the block's budget is "
                          "unlocked so far, and unlocked minus spent does not fit this demand; it is recorded and "
                          "granted (charged) when it fits, in the policy's order: repeat this request to collect it")
        return None, why or {b: f"waits in the {s.policy} queue behind earlier demands" for b in blocks}

    def _queue(self, tx, s, filt, blocks=()):
        """The stream's queue as ``QueuedAllocation`` state: the pending demands, and the blocks they (and
        ``blocks``) name, as stored. ({pipeline: (rule, meta text)}, state)."""
        queue = QueuedAllocation(filt, filt.cost(epsilon=s.min_epsilon), s.rules())
        pending = tx.all(sql.DEMAND_IN_STATE, (s.name, _PENDING))
        demands = [(p, json.loads(b), tuple(json.loads(c)), r, m, q) for p, b, c, r, m, q in pending]
        ids = list(dict.fromkeys([*blocks, *(b for d in demands for b in d[1])]))
        decode = _vector_decoder()
        for i in range(0, len(ids), 500):
            chunk = ids[i:i + 500]
            for block_id, state, spent, created, arrivals in tx.all(sql.block_queue_rows(len(chunk)),
                                                                    [s.name, *chunk]):
                queue.load_block(block_id, spent=decode(spent), arrived=created, arrivals=arrivals,
                                 retired=state != BlockState.ACTIVE)
        for pipeline, demand_blocks, cost, *_rest, seq in demands:
            queue.demand(pipeline, demand_blocks, cost, seq=seq)
        return {d[0]: (d[3], d[4]) for d in demands}, queue

    def _schedule(self, tx, s, filt, now, caller=None):
        """A scheduling point: grant the pending demands the policy admits now, in its order, each charged at
        once. Returns ({pipeline: Grant} admitted, the queue's state after). ``caller``'s grant is handed to it
        now (its demand row removed); the others wait in ``demands`` as admitted, for their next request."""
        infos, queue = self._queue(tx, s, filt)
        if not infos:
            return {}, queue
        before = set(queue.retired)
        admitted = queue.schedule(now)
        if not admitted:
            return {}, queue
        grants = {}
        for pipeline, blocks, cost in admitted:
            rule, meta_text = infos[pipeline]
            grants[pipeline] = self._new_grant(s, filt, pipeline, blocks, cost, rule, json.loads(meta_text), now)
        self._log(tx, "admit", {"stream": s.name, "now": now,
                                "admitted": [[p, grants[p][0].id] for p, _, _ in admitted],
                                "collected": caller if caller in grants else None})
        touched = []
        for pipeline, blocks, _cost in admitted:
            grant, body_text = grants[pipeline]
            touched.extend(b for b in blocks if b not in touched)
            tx.run(sql.GRANT_INSERT, (grant.id, s.name, pipeline, body_text, grant.signature, now))
            self._log(tx, "grant", dict(grant.body(), signature=grant.signature))
            if pipeline == caller:
                tx.run(sql.DEMAND_DELETE, (s.name, pipeline))
            else:
                tx.run(sql.DEMAND_ADMIT,
                       (_ADMITTED, grant.id, s.name, pipeline))
        for b in touched:  # the queue's own sums (filters.add, in admission order) are what is stored
            retired = b in queue.retired
            tx.run(sql.BLOCK_SET_SPENT,
                   (json.dumps(queue.spent[b]), BlockState.RETIRED.value if retired else BlockState.ACTIVE.value,
                    now if retired else None, s.name, b))
        newly_retired = [b for b in touched if b in queue.retired and b not in before]
        if newly_retired:
            self._log(tx, "retire", {"stream": s.name, "blocks": newly_retired})
        return {p: g for p, (g, _text) in grants.items()}, queue

    @staticmethod
    def _check_split(meta, rule):
        """The grant's split from ``meta`` (None: single-stage), its fields checked; refuse a rule that differs."""
        if "count_epsilon" in meta:
            raise LedgerError(f"meta count_epsilon {meta['count_epsilon']!r}: the DP record count is a stage of the "
                              "split now; give split=BudgetSplit(..., count=EPSILON, ...)")
        split = BudgetSplit.from_meta(meta)
        if split is not None:
            meta[SPLIT_KEY] = split.to_dict()  # canonical: every stage present, rule spelled once
        expected = SINGLE_RULE if split is None else split.rule
        if rule is not None and rule != expected:
            raise LedgerError(f"rule {rule!r} does not match the grant: it is {expected!r} (the split's rule; "
                              f"{SINGLE_RULE!r} without a split); leave rule out")
        return split

    @staticmethod
    def _source(filt, spent, cost, block_reservations, pipeline, policy=Policy.CONSERVE):
        """The policy's source (allocation.py: own reservation first, then the unreserved pool); else a
        _NoSource saying what each had left. ``policy``: its name, or the ``AllocationPolicy`` itself."""
        rules = get_policy(policy) if isinstance(policy, str) else policy
        source = rules.source(filt, spent, cost, block_reservations, pipeline)
        if source is not None:
            return source
        own = block_reservations.get(pipeline)
        pool_used, pool_reserved = rules.pool(filt, spent, block_reservations)
        asked = filt.query_epsilon(cost)
        own_left = "none reserved" if own is None else f"{_eps_left(filt, own['used'], own['reserved']):.4g} left"
        return _NoSource(f"epsilon {asked:.4g} asked; this pipeline's reservation: {own_left}; unreserved pool: "
                         f"{_eps_left(filt, pool_used, pool_reserved):.4g} left; the rest is reserved for other "
                         "waiting pipelines")

    def _reservations(self, tx, stream, blocks=None):
        """{block: {pipeline: {"reserved", "used"}}} for ``blocks`` (None: every active block of the stream).

        Pipelines come in name order, so every reader sums a block's pool in the same order.
        """
        if blocks is None:
            rows = tx.all(sql.RESERVATION_ACTIVE, (stream,))
        else:
            blocks, rows = list(blocks), []
            for i in range(0, len(blocks), 500):
                chunk = blocks[i:i + 500]
                rows += tx.all(sql.reservation_rows(len(chunk)), [stream, *chunk])
        out, decode = {}, _vector_decoder()
        for block, pipeline, reserved, used in rows:
            out.setdefault(block, {})[pipeline] = {"reserved": decode(reserved), "used": decode(used)}
        return out

    # ------------------------------------------------------------ availability
    def available_epsilon(self, pipeline, stream, blocks, delta=0.0, tolerance=1e-4):
        """The largest epsilon a (epsilon, delta) request by ``pipeline`` on ALL of ``blocks`` would be granted now.

        A bisection over epsilon in [0, the stream's epsilon], from below, to within
        ``tolerance`` times the stream's epsilon: the answer itself is granted (unless
        another writer spends first). 0.0 if any block is unknown or retired.
        """
        blocks = list(blocks)
        with self._store.transaction(write=False) as tx:
            s = self.stream(stream, tx)
            filt = s.filter()
            _check_availability_args(filt, delta, tolerance)
            found = self._blocks(tx, stream, blocks)
            if len(found) != len(set(blocks)) or any(b.state != BlockState.ACTIVE for b in found.values()):
                return 0.0
            budgets = BudgetArrays(filt, pipeline, {b: found[b].spent for b in found}, blocks,
                                   self._reservations(tx, stream, blocks), delta, s.rules(),
                                   self._unlocked(tx, s, filt, found))
        return float(_bisect(lambda eps: budgets.fits(eps[0]).all().reshape(1), 1, s.epsilon, tolerance)[0])

    def available_per_block(self, pipeline, stream, blocks=None, delta=0.0, tolerance=1e-4):
        """{block id: the largest epsilon ``pipeline`` could be granted on that block ALONE now}, in ONE read.

        For every block b this equals ``available_epsilon(pipeline, stream, [b], delta,
        tolerance)`` exactly (the same bisection, run on all blocks at once). ``blocks``
        None: every active block of the stream, in key order (time window or shard),
        oldest first. Given ids map in their order; an unknown or retired block maps to
        0.0, as in ``available_epsilon`` (nothing can be granted on it).
        """
        with self._store.transaction(write=False) as tx:
            s = self.stream(stream, tx)
            filt = s.filter()
            _check_availability_args(filt, delta, tolerance)
            if blocks is None:
                decode = _vector_decoder()
                spent = {b: decode(text) for b, text in tx.all(sql.BLOCK_ACTIVE_SPENT, (stream,))}
                blocks = active = list(spent)
                reservations = self._reservations(tx, stream)
            else:
                blocks = list(dict.fromkeys(blocks))
                spent = {b.id: b.spent for b in self._blocks(tx, stream, blocks).values() if b.state == BlockState.ACTIVE}
                active = [b for b in blocks if b in spent]
                reservations = self._reservations(tx, stream, active)
            unlocked = self._unlocked(tx, s, filt, active)
        budgets = BudgetArrays(filt, pipeline, spent, active, reservations, delta, s.rules(), unlocked)
        out = dict.fromkeys(blocks, 0.0)
        out.update(zip(active, _bisect(budgets.fits, len(active), s.epsilon, tolerance).tolist()))
        return out

    def _unlocked(self, tx, s, filt, blocks):
        """A queued stream: {block: its unlocked budget now} (``QueuedAllocation.unlocked``; the availability
        answers then say what fits unlocked minus spent, as the scheduler checks). None under other policies."""
        if not s.rules().queued:
            return None
        _infos, queue = self._queue(tx, s, filt, blocks)
        now = time.time()
        return {b: queue.unlocked(b, now) for b in queue.spent}

    def plan_epsilon(self, pipeline, stream, blocks, start_epsilon, delta=0.0):
        """Epsilon for the next attempt under the stream's policy: conserve = start small, aggressive = all."""
        available = self.available_epsilon(pipeline, stream, blocks, delta)
        return get_policy(self.stream(stream).policy).plan_epsilon(available, start_epsilon)

    def _sign(self, body):
        """A grant's signature: HMAC-SHA256 under the key ring's signing key (never the master key)."""
        return self._keys.sign(_canonical(body).encode())

    def _signature_ok(self, body, signature):
        """``signature`` signs ``body``: under the signing key, or, for a grant made before the ledger's key
        migration (listed in its keyed ``keys`` entry), under the old secret with the old rule."""
        signature = signature or ""
        if hmac.compare_digest(self._sign(body), signature):
            return True
        if body.get("id") in self._legacy_grants:
            return hmac.compare_digest(self._keys.legacy_sign(_canonical(body).encode()) or "", signature)
        return False

    def private_seed(self, grant_id, purpose):
        """A 128-bit seed only trusted code can derive (HMAC under the key ring's noise key). TRUSTED CODE ONLY.

        A DP release made under a grant draws its noise from this seed, so re-running
        the release under the same grant returns the same value (post-processing, no
        extra privacy loss), while the pipeline, which never sees the secret, cannot
        reproduce the noise. A grant made before the ledger's key migration keeps its old seed (the old
        secret's HMAC), so its re-runs still draw the same noise.
        """
        text = f"seed|{grant_id}|{purpose}".encode()
        return self._keys.seed(text, legacy=grant_id in self._legacy_grants)

    def get_grant(self, grant_id):
        with self._store.transaction(write=False) as tx:
            row = tx.one(sql.GRANT_BODY, (grant_id,))
        if row is None:
            raise GrantError(f"grant {grant_id!r} is unknown to this ledger")
        return Grant.from_json(dict(json.loads(row[0]), signature=row[1]))

    def grants(self, stream=None):
        with self._store.transaction(write=False) as tx:
            if stream is None:
                rows = tx.all(sql.GRANT_BODIES)
            else:
                rows = tx.all(sql.GRANT_STREAM_BODIES, (stream,))
        return [Grant.from_json(dict(json.loads(b), signature=sig)) for b, sig in rows]

    def verify(self, grant, stream=None, epsilon=None, delta=None):
        """Check a grant before reading data; return the ledger's copy.

        Raises GrantError if the grant is missing, malformed, forged (bad signature
        or altered fields), unknown (never charged by this ledger), of another
        stream, or covers less than ``epsilon``/``delta``.
        """
        if grant is None or grant == "":
            raise GrantError("no grant given: a pipeline reads data only under a grant from the ledger")
        grant = Grant.from_json(grant)
        if not self._signature_ok(grant.body(), grant.signature):
            raise GrantError(f"grant {grant.id!r} is forged: its signature does not match its contents")
        stored = self.get_grant(grant.id)
        if stored.to_json() != grant.to_json():
            raise GrantError(f"grant {grant.id!r} differs from the ledger's record of it")
        if stream is not None and grant.stream != stream:
            raise GrantError(f"grant {grant.id!r} is for stream {grant.stream!r}, not {stream!r}")
        if epsilon is not None and grant.epsilon + 1e-12 < float(epsilon):
            raise GrantError(f"grant {grant.id!r} covers epsilon {grant.epsilon:.6g}, but {float(epsilon):.6g} "
                             "is needed")
        if delta is not None and grant.delta + 1e-15 < float(delta):
            raise GrantError(f"grant {grant.id!r} covers delta {grant.delta:.3g}, but {float(delta):.3g} is needed")
        return stored

    def release(self, grant, stage, computation, epsilon, delta=0.0):
        """Open ``stage``'s one release under ``grant``, BEFORE anything is drawn; return a ``Release``.

        A grant pays for one release per stage, of one computation: the first call records the
        computation's fingerprint (``computation``: e.g. a digest of the traced transform graph, of
        the trainer's module and inputs, or of the validated model) with what the stage may spend.
        Afterwards the same stage and computation is re-opened (``Release.reopened``: a re-run draws
        the same noise from the grant's seed, so it releases nothing new), and a different computation
        is refused with GrantError: two releases under one seed would differ by data alone (their
        difference reveals records exactly), and under two seeds they would spend the stage twice.

        What a stage may spend comes from ``privacy/split.py``: its share of the grant's split, or,
        for a single-stage grant (no split), the whole grant for the FIRST stage that opens a release
        and nothing for any other. The check and the record are one transaction, appended to the audit
        log, so two writers cannot both take a stage, and the audit recomputes every grant's spend.
        """
        grant = self.verify(grant)
        if stage not in STAGES:
            raise LedgerError(f"stage {stage!r} is unknown: use one of {', '.join(STAGES)}")
        if not isinstance(computation, str) or not 0 < len(computation) <= 256:
            raise LedgerError(f"computation {computation!r} must be a fingerprint string of 1-256 characters")
        epsilon = _finite(epsilon, "release epsilon", allow_none=False, nonnegative=True)
        delta = _finite(delta, "release delta", allow_none=False, nonnegative=True)
        if not delta < 1:
            raise LedgerError(f"release delta {delta!r} is invalid: need 0 <= delta < 1")
        with self._store.transaction() as tx:
            done = {r[0]: r[1:] for r in tx.all(sql.RELEASE_OF_GRANT, (grant.id,))}
            if stage in done:
                fingerprint, have_eps, have_delta, created = done[stage]
                if (fingerprint, have_eps, have_delta) != (computation, epsilon, delta):
                    raise GrantError(
                        f"grant {grant.id!r} already released its {stage} stage for computation "
                        f"{fingerprint[:16]} (epsilon {have_eps:.6g}); computation {computation[:16]} (epsilon "
                        f"{epsilon:.6g}) is a different release the grant did not pay for: run it under a new grant")
                return Release(grant.id, stage, computation, epsilon, delta, created, reopened=True)
            split = grant_split(grant)
            if split is None:
                if done:
                    raise GrantError(
                        f"grant {grant.id!r} is single-stage (it has no split) and its {sorted(done)[0]} stage "
                        f"already spent it: the {stage} stage needs its own grant, or charge one grant with a split "
                        "(sage ledger charge --split ..., or Ledger.request(..., split=BudgetSplit(...)))")
                allowed = (grant.epsilon, grant.delta)
            else:
                allowed = split.stage_budget(stage)
            if epsilon > allowed[0] * (1 + SLACK) or delta > allowed[1] * (1 + SLACK):
                raise GrantError(f"the {stage} stage asks for (epsilon={epsilon:.6g}, delta={delta:.3g}) but grant "
                                 f"{grant.id!r} covers only (epsilon={allowed[0]:.6g}, delta={allowed[1]:.3g}) "
                                 f"for {stage}")
            now = time.time()
            tx.run(sql.RELEASE_INSERT,
                   (grant.id, stage, grant.stream, grant.pipeline, computation, epsilon, delta, now))
            self._log(tx, "release", {"grant": grant.id, "stream": grant.stream, "pipeline": grant.pipeline,
                                      "stage": stage, "computation": computation, "epsilon": epsilon,
                                      "delta": delta})
        return Release(grant.id, stage, computation, epsilon, delta, now, reopened=False)

    def releases(self, grant_id=None):
        """The releases opened so far (all, or one grant's), oldest first."""
        with self._store.transaction(write=False) as tx:
            rows = tx.all(sql.RELEASE_ROWS_OF_GRANT, (grant_id,)) if grant_id else tx.all(sql.RELEASE_ROWS)
        return [Release(*r, reopened=False) for r in rows]

    def record_outcome(self, grant_id, outcome, details=None):
        """Record what a pipeline run under ``grant_id`` concluded (ACCEPT, REJECT, RETRY, FAILED).

        One outcome per grant, appended to the audit log: with the grants, it is the
        pipeline's iteration history, from which a killed iterator resumes.
        """
        if outcome not in tuple(GrantOutcome):
            raise LedgerError(f"outcome {outcome!r} is unknown: use {', '.join(GrantOutcome)}")
        details = dict(details or {})
        with self._store.transaction() as tx:
            row = tx.one(sql.GRANT_OWNER, (grant_id,))
            if row is None:
                raise GrantError(f"grant {grant_id!r} is unknown to this ledger")
            if tx.one(sql.OUTCOME_EXISTS, (grant_id,)):
                raise LedgerError(f"grant {grant_id!r} already has an outcome")
            tx.run(sql.OUTCOME_INSERT,
                   (grant_id, row[0], row[1], outcome, _canonical(details), time.time()))
            self._log(tx, "outcome", {"grant": grant_id, "stream": row[0], "pipeline": row[1],
                                      "outcome": outcome, "details": details})

    def history(self, stream, pipeline):
        """The pipeline's grants in order, each with its recorded outcome (None while running or killed)."""
        with self._store.transaction(write=False) as tx:
            self.stream(stream, tx)
            rows = tx.all(sql.GRANT_HISTORY, (stream, pipeline))
        return [(Grant.from_json(dict(json.loads(body), signature=sig)), outcome,
                 json.loads(details) if details else None) for body, sig, outcome, details in rows]

    # ------------------------------------------------------------------ status
    def status(self, stream):
        """A JSON-ready summary: the stream's guarantee and each block's spent and remaining budget."""
        s = self.stream(stream)
        filt = s.filter()
        out_blocks = []
        for b in self.blocks(stream):
            eps_spent, delta_spent, eps_left = filt.summary(b.spent)
            entry = {
                "id": b.id, "state": b.state, "epsilon_spent": eps_spent, "delta_spent": delta_spent,
                "epsilon_remaining": 0.0 if b.state == BlockState.RETIRED else eps_left, "created": b.created,
                "retired": b.retired, **b.key,
            }
            if s.accounting == Accounting.RDP:
                entry["rdp_spent"] = dict(zip((str(a) for a in s.orders), b.spent[1:]))
            out_blocks.append(entry)
        return {
            "stream": s.name, "accounting": s.accounting, "epsilon": s.epsilon, "delta": s.delta,
            "policy": s.policy, "policy_params": s.policy_params, "min_epsilon": s.min_epsilon,
            "min_grant_epsilon": s.grant_floor,
            "orders": list(s.orders),
            "active_blocks": sum(b["state"] == BlockState.ACTIVE for b in out_blocks),
            "retired_blocks": sum(b["state"] == BlockState.RETIRED for b in out_blocks),
            "grants": self._grant_count(stream), "pipelines": self.pipelines(stream), "blocks": out_blocks,
        }

    def _grant_count(self, stream):
        with self._store.transaction(write=False) as tx:
            return tx.one(sql.GRANT_COUNT, (stream,))[0]

    # ------------------------------------------------------------------- audit
    def _log(self, tx, kind, body, text=None):
        """Append ``body`` (its canonical text ``text`` if the caller has it) to the chained log."""
        # The entry this write transaction logged last is the log's last one (a write transaction is exclusive).
        # ``request`` reads it with the stream row in its own write transaction (``tx.log_last``).
        last = (getattr(tx, "head", None) or getattr(tx, "log_last", None)
                or tx.one(sql.LOG_LAST))
        seq, prev = (last[0] + 1, last[1]) if last else (1, GENESIS)
        text = _canonical(body) if text is None else text
        value = self._keys.chain_value(prev, seq, kind, text)
        tx.run(sql.LOG_INSERT,
               (seq, time.time(), kind, text, prev, value))
        tx.head = (seq, value)  # written to the head file once the transaction commits

    def log_entries(self):
        with self._store.transaction(write=False) as tx:
            return tx.all(sql.LOG_ALL)

    def audit(self):
        """Recompute every block's loss from the log alone; see ``audit.audit_ledger``."""
        return audit_ledger(self)

    # What the audit reads of a ledger (audit.py imports no ledger name: it is handed the ledger).
    @property
    def store(self):
        """The backend store (``store/``): the audit reads every table through it. TRUSTED CODE ONLY."""
        return self._store

    @property
    def head_file(self):
        """The head file outside the database (``keys.HeadFile``) recording this ledger's last log entry."""
        return self._head

    @property
    def ledger_id(self):
        return self._ledger_id

    def migration_entry(self):
        """The body of the keyed ``keys`` entry a key migration wrote ({} if none, or if it does not verify)."""
        return self._migration_entry()

    def signature_ok(self, body, signature):
        """``signature`` is this ledger's signature of the grant ``body`` (or a pre-migration one it lists)."""
        return self._signature_ok(body, signature)


def _check_minimum(filt, stream, cost, epsilon):
    """Refuse a grant smaller than the stream's grant floor (LedgerError, before anything is charged).

    Basic accounting compares the charged epsilon; RDP calls a query too small when its curve lies below a
    min_epsilon query's at every order (whatever its delta: the minimum is on the epsilon part).
    """
    least = stream.grant_floor
    floor = _stream_cost(stream, filt, least)
    if filt.accounting == Accounting.BASIC:
        small = cost[0] < floor[0]
    else:
        small = all(c < f for c, f in zip(cost[1:], floor[1:]))
    if small:
        asked = f"epsilon {epsilon!r}" if epsilon is not None else "an RDP curve below the minimum's at every order"
        raise LedgerError(
            f"grant {asked} is below stream {stream.name!r}'s minimum grant epsilon {least:g}: a read that costs "
            f"less buys data for nothing; ask for epsilon >= {least:g} (set per stream by `sage ledger init "
            "--min-grant-epsilon`, default 0.001, or the stream's --min-epsilon if smaller)")


def _grant_log_text(grant, body_text, sources):
    """The canonical text of a grant's log body, ``dict(grant.body(), signature=..., sources=...)``, spliced
    from ``body_text`` (the canonical text of ``grant.body()``, already made to sign it) instead of encoding the
    block list a second time. Canonical text has sorted keys, and ``signature`` and ``sources`` sort after every
    key of the body but ``stream``, its last (``_SPLICE_GRANT_LOG``, checked on import against ``Grant.body``):
    so they go just before ``"stream":``, the text's end. The same text as ``_canonical`` of the whole dict
    (tests/test_ledger_request_reads.py compares them); anything else falls back to encoding the dict."""
    tail = ',"stream":' + _canonical(grant.stream) + "}"
    if _SPLICE_GRANT_LOG and body_text.endswith(tail):
        return (body_text[:-len(tail)] + ',"signature":' + _canonical(grant.signature) + ',"sources":'
                + _canonical(sources) + tail)
    return _canonical(dict(grant.body(), signature=grant.signature, sources=sources))


_SPLICE_GRANT_LOG = sorted([*Grant("", "", "", (), 0.0, 0.0, "", (), "", 0.0).body(), "signature", "sources"])[-4:] == [
    "rule", "signature", "sources", "stream"]


def _stream_cost(stream, filt, epsilon):
    """``filt.cost(epsilon=epsilon)``; for the parsed stream row's own filter (``_stream_filter``) computed once
    per row and epsilon (a stream's grant floor and min_epsilon cost are fixed by its row, which
    ``_parsed_stream`` keys on; filters are not changed after construction)."""
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


class _NoSource:
    def __init__(self, reason):
        self.reason = reason


def _eps_left(filt, used, reserved):
    """Epsilon still available in a reservation, in the stream's epsilon units (for messages)."""
    if filt.accounting == Accounting.BASIC:
        return max(0.0, reserved[0] - used[0])
    shares = [(r - u) / c for u, r, c in zip(used[1:], reserved[1:], filt.capacity[1:]) if c > 0]
    return max(0.0, max(shares, default=0.0)) * filt.epsilon


def _vector_decoder():
    """A json.loads for stored budget vectors (as tuples) that parses each distinct text once.

    Thousands of rows hold few distinct vectors (fresh blocks, equal shares), and parsing
    dominates reading them.
    """
    cache = {}

    def decode(text):
        value = cache.get(text)
        if value is None:
            value = cache[text] = tuple(json.loads(text))
        return value

    return decode


def _check_availability_args(filt, delta, tolerance):
    try:
        filt.cost(epsilon=filt.epsilon, delta=delta)  # the request's own check of delta
    except ValueError as exc:
        raise LedgerError(str(exc)) from None
    tol = _finite(tolerance, "tolerance", allow_none=False)
    if not 0 < tol < 1:
        raise LedgerError(f"tolerance {tolerance!r} is invalid: need 0 < tolerance < 1 (a fraction of epsilon)")


class _KeySource:
    """Where a ledger's key file is, and creating it with a new ledger (``Ledger.open``)."""

    def __init__(self, path, create, error=None):
        self.path, self.create, self._error = path, create, error
        self._keyring = None
        self.created_key = self.created_ledger = False

    def keyring(self):
        if self._error is not None:
            raise self._error
        if self._keyring is None:
            self._keyring = KeyRing.load(self.path)
        return self._keyring

    def new_ledger_meta(self):
        """Called by the store as it creates a ledger: the meta rows (key id, ledger id); creates the key file
        if it does not exist (an existing key file is used: one key may serve a ledger re-created at its path)."""
        if not os.path.exists(self.path):
            self._keyring = KeyRing.create(self.path)
            self.created_key = True
        self.created_ledger = True
        return {"key_id": self.keyring().key_id, "ledger_id": secrets.token_hex(16)}

    def undo_created(self):
        """The ledger was not created after all: remove the key file made for it."""
        if self.created_key:
            try:
                os.unlink(self.path)
            except OSError:
                pass

