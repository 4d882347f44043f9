"""The privacy ledger, Sage's block-level access control (paper §3.2-3.3): the ``Ledger`` facade.

On ``LedgerBase`` (``ledger_base.py``: store, keys, head file, keyed log), each public method opens one transaction
of the store and runs the step modules below it (``streams``, ``blocks``, ``requests``, ``charges``, ``releases``,
``pipelines``, ``trusted_reads``, ``grants``, ``session``, ``opening``),
which import neither this module nor the audit; every SQL statement is in ``store/sql.py``.
The guarantee, the allocation rules and the key handling: docs/block_composition.md, "The ledger".
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from . import anchor as _anchor
from . import blocks as _blocks
from . import charges as _charges
from . import draws as _draws
from . import migrations as _migrations
from . import opening as _opening
from . import pipelines as _pipelines
from . import releases as _releases
from . import requests as _requests
from . import trusted_reads as _trusted_reads
from .allocation import get_policy
from .audit import AuditReport, audit_ledger
from .blocks import Block  # noqa: F401 (re-exported)
from .chain import GENESIS, chain_hash  # noqa: F401 (re-exported)
from .checks import check_name as _check_name
from .errors import BudgetRefused, GrantError, LedgerError
from .grants import Grant, Release, check_grant_copy, grant_terms, older_rdp, stage_cap
from .head_file import HeadSync, head_sync_mode
from .ledger_base import LedgerBase
from .ledger_reads import recorded_grant
from .session import PipelineClaim
from .store import check_location, sql
from .streams import (  # noqa: F401 (re-exported)
    DEFAULT_MAX_STREAM_EPSILON,
    DEFAULT_MIN_GRANT_EPSILON,
    Stream,
    check_stream_args,
    check_unit,
    insert_stream,
    read_stream,
    stream_filter,
    stream_status,
)
from .vocabulary import PIPELINE_OUTCOMES, Accounting, Composition, Outcome, Policy
from .write import Charge, StreamWrite

if TYPE_CHECKING:
    from .split import BudgetSplit

POLICIES = tuple(Policy)  # members equal their stored strings: "conserve", "aggressive", "dpf-n", ...
OUTCOMES = PIPELINE_OUTCOMES  # "ACCEPT", "REJECT", "TIMEOUT"


class Ledger(LedgerBase):
    """The privacy ledger: streams, blocks, grants and releases under one global guarantee per stream.

    Open with ``Ledger.open(path_or_url, key_file=None)``; ``create=True`` makes a new ledger if none exists.
    Argument order: the stream comes first in the stream-scoped calls (``register(stream, pipeline)``,
    ``finish(stream, pipeline, outcome)``, ``block(stream, block_id)``, ``history(stream, pipeline)``), the
    pipeline first in the pipeline's budget calls (``request(pipeline, stream, ...)``,
    ``available_epsilon(pipeline, stream, blocks)``).

    Args:
      store: The open backend store (``store/``); ``Ledger.open`` makes it.
      keys: The ledger's key source (``session``); ``Ledger.open`` makes it.
      head_sync: When the head file is made durable (``head_file.HeadSync``; None: $SAGE_HEAD_SYNC, else ``use``).
      check_head: Refuse (``LedgerRollback``) a database its anchor does not match; False: ``anchor_problem``.
      read_only: Open for the audit: nothing is written anywhere.
      upgrade: Allow an older ledger's migration (``sage ledger upgrade``).
    """

    @classmethod
    def reanchor(cls, location: str, reason: str, key_file: str | None = None) -> Ledger:
        """Re-anchor this host's head on the ledger as it is now, on purpose (``anchor.reanchor``).

        For a restored known-good copy or a new host of a PostgreSQL ledger: the keyed ``anchor`` entry records
        ``reason``, the host and the head it replaces; the head file is reset.

        Args:
          location: The ledger's SQLite path or PostgreSQL URL.
          reason: Why the head is re-anchored, recorded in the ``anchor`` entry.
          key_file: The ledger's key file (None: $SAGE_KEY_FILE, else ``<sqlite path>.key``).

        Returns:
          The open ledger (audit it: ``ledger.audit()``).
        """
        ledger = cls.open(location, key_file=key_file, head_sync=HeadSync.COMMIT, check_head=False)
        try:
            head = ledger._head.get(ledger._ledger_id)
            with ledger._store.transaction(write=False) as tx:
                meta_id = dict(tx.all(sql.META_ALL)).get("ledger_id") or ""
            entry = _anchor.reanchor(
                ledger._store,
                ledger._keys,
                ledger._ledger_id,
                meta_id,
                head,
                reason,
                socket.gethostname(),
                ledger._append,
            )
            ledger._head.advance(ledger._ledger_id, entry[0], entry[1], reset=True)
            ledger._anchored, ledger.anchor_problem = True, None
        except BaseException:
            ledger.close()
            raise
        return ledger

    @classmethod
    def open(
        cls,
        location: str,
        create: bool = False,
        key_file: str | None = None,
        *,
        head_sync: HeadSync | str | None = None,
        check_head: bool = True,
        read_only: bool = False,
        upgrade: bool = False,
    ) -> Ledger:
        """Open the ledger at ``location``, checked against its head file before any write (docs/security.md).

        Args:
          location: The ledger's SQLite path or PostgreSQL URL (never with a password in it).
          create: Create the ledger, and its key file (mode 0600), if they do not exist yet.
          key_file: The key file (``keys.resolve_key_path``; None: $SAGE_KEY_FILE, else ``<sqlite path>.key``).
          head_sync: When the head file is made durable (``head_file.HeadSync``; None: $SAGE_HEAD_SYNC, else ``use``).
          check_head: Refuse a database its head file does not match; False: ``anchor_problem``, no head file write.
          read_only: Write no byte anywhere (``sage ledger audit``: a read-only copy or mount, a full disk), and
            refuse every write: implies ``check_head=False``; never migrated, the head file only read.
          upgrade: Allow an older ledger's migration (``migrations.upgrade`` alone gives it).

        Returns:
          The open ``Ledger``.

        Raises:
          LedgerError: ``read_only`` with ``create``; a bad location or ``head_sync`` mode (``KeyFileError``).
          LedgerRollback: the database was rolled back, cut, re-identified or replaced (``check_head``).
          LedgerUpgradeNeeded: a ledger of an older version, without ``upgrade``.
        """
        if read_only and create:
            raise LedgerError("a read-only open cannot create a ledger: give create=False")
        check_head = check_head and not read_only
        location = check_location(location)  # never a password in a URL: before anything is created
        head_sync = head_sync_mode(head_sync)  # a bad mode is refused before anything is created
        keys = _opening.key_source(location, key_file, create)
        store = _opening.open_checked_store(location, keys, create, read_only, upgrade)
        try:
            return cls(store, keys, head_sync, check_head, read_only, upgrade)
        except BaseException:
            store.close()
            raise

    @classmethod
    def upgrade(cls, location: str, key_file: str | None = None, progress: Callable[[str], None] = print) -> int:
        """``sage ledger upgrade``: bring an older ledger to this version (``migrations.py``), keyed and idempotent.

        Args:
          location: The ledger's SQLite path or PostgreSQL URL.
          key_file: The ledger's key file (None: as ``open`` finds it).
          progress: Called with a line of text for each step.

        Returns:
          How many steps ran (0: already up to date, nothing written).
        """
        with cls.open(location, key_file=key_file, upgrade=True) as ledger:
            return _migrations.upgrade(ledger, ledger._log, location, progress)

    # ----------------------------------------------------------------- streams
    check_stream_args = staticmethod(check_stream_args)  # create_stream's checks alone (streams.py)

    def create_stream(
        self,
        name: str,
        epsilon: float,
        delta: float,
        *,
        accounting: Accounting | str = Accounting.BASIC,
        orders: Sequence[float] | None = None,
        policy: Policy | str = Policy.CONSERVE,
        min_epsilon: float | None = None,
        max_epsilon: float = DEFAULT_MAX_STREAM_EPSILON,
        min_grant_epsilon: float | None = None,
        policy_params: dict[str, Any] | None = None,
        query_delta_share: float | None = None,
        privacy_unit: str | None = None,
        max_rows_per_unit: int | None = None,
    ) -> Stream:
        """Create a stream with a global (epsilon, delta) guarantee over all its blocks, forever.

        Args:
          name: The stream's name (letters, digits, ``.``, ``_``, ``-``).
          epsilon: The stream's global epsilon, at most ``max_epsilon``.
          delta: The stream's global delta.
          accounting: ``basic`` (sums of epsilon and delta) or ``rdp`` (Rényi curves; docs/block_composition.md).
          orders: An ``rdp`` stream's Rényi orders (None: the default orders).
          policy: Who may spend a block's budget and when (``Policy``; docs/scheduling_policies.md).
          min_epsilon: The query a block must still admit to stay active (None: epsilon / 100).
          max_epsilon: The largest stream epsilon accepted (default ``DEFAULT_MAX_STREAM_EPSILON``, 10).
          min_grant_epsilon: What every grant must charge at least (None: 0.001, or ``min_epsilon`` if smaller).
          policy_params: A queued policy's parameters (``{"n": 50}``, ``{"lifetime": 3600.0}``), stored in full.
          query_delta_share: An ``rdp`` stream's share of its delta for the approximate-DP queries' deltas (None:
            0.5; 0 for a stream charged curves only); the rest converts the Rényi sum (``filters.RdpFilter``).
          privacy_unit: The column of the records whose every row the guarantee protects (None: unit = row).
          max_rows_per_unit: K, the rows of a unit kept per block (``streams.check_unit``).

        Returns:
          The new ``Stream``.

        Raises:
          LedgerError: a bad argument or an existing name (nothing written).
        """
        filt, min_epsilon, min_grant = self.check_stream_args(
            name,
            epsilon,
            delta,
            accounting,
            orders,
            policy,
            min_epsilon,
            max_epsilon,
            min_grant_epsilon,
            policy_params,
            query_delta_share,
            privacy_unit,
            max_rows_per_unit,
        )
        now = time.time()
        with self._store.transaction() as tx:
            insert_stream(
                tx,
                self._log,
                name,
                accounting,
                filt,
                policy,
                get_policy(policy, policy_params),
                min_epsilon,
                min_grant,
                now,
                check_unit(privacy_unit, max_rows_per_unit),
            )
        return self.stream(name)

    # ------------------------------------------------------------------ blocks
    def add_block(
        self,
        stream: str,
        block_id: str,
        *,
        start: float | None = None,
        end: float | None = None,
        shard: int | None = None,
        rows: int | None = None,
        created: float | None = None,
        digest: str | None = None,
        allow_duplicate_of: Iterable[str] = (),
    ) -> Block:
        """Add a fresh block (zero loss); its budget is split among the pipelines waiting now.

        Args:
          stream: The stream's name.
          block_id: The new block's id.
          start: The start of its time window [start, end), unix seconds.
          end: The end of its time window, unix seconds.
          shard: The user shard it keys.
          rows: Its exact row count, kept inside the ledger.
          created: Its creation time, unix seconds (None: now).
          digest: The content digest of its records (ingest's); see ``add_blocks``.
          allow_duplicate_of: Streams whose blocks may hold the same records.

        Returns:
          The new ``Block``.

        Raises:
          UnknownStream, LedgerError, DuplicateContent: as ``add_blocks`` (nothing written).
        """
        self.add_blocks(
            stream,
            [dict(id=block_id, start=start, end=end, shard=shard, rows=rows, created=created, digest=digest)],
            allow_duplicate_of=allow_duplicate_of,
        )
        return self.block(stream, block_id)

    def add_blocks(
        self, stream: str, blocks: Iterable[Mapping[str, Any]], *, allow_duplicate_of: Iterable[str] = ()
    ) -> None:
        """Add many fresh blocks in ONE transaction: all are added, or none (e.g. one ingest's blocks).

        Args:
          stream: The stream's name.
          blocks: Dicts with ``id`` and the keyword arguments of ``add_block``.
          allow_duplicate_of: Streams that may already hold a block's ``digest``.

        Raises:
          UnknownStream: no such stream.
          LedgerError: a bad or existing block id or field.
          DuplicateContent: another stream, not in ``allow_duplicate_of``, registered a block's ``digest`` already
            (the same records would get a fresh budget here).
        """
        checked = _blocks.check_new_blocks(blocks)
        allowed = set(allow_duplicate_of or ())
        with self._store.transaction() as tx:
            s = self.stream(stream, tx)
            filt = s.filter()
            _blocks.check_new_ids(tx, stream, checked, allowed)
            waiting = [r[0] for r in tx.all(sql.PIPELINE_WAITING, (stream,))]
            share = s.rules().new_block_shares(filt.capacity, waiting)  # the same for every new block
            write = StreamWrite(tx, self._log, self._keys, s, filt)
            for block in checked:
                _blocks.insert_block(write, block, waiting=waiting, share=share)
            if s.rules().queued:  # a scheduling point (DPF-T: time has passed)
                _charges.schedule(write, time.time())

    def record_trusted_read(self, stream: str, blocks: Sequence[str], purpose: str) -> None:
        """Log that TRUSTED code is about to decrypt ``blocks`` of ``stream`` outside any grant (no charge), and why.

        The ``trusted_read`` entry is in the keyed chain and committed before this returns; ``sage ledger audit`` lists
        it. The block doors call it before they derive a key (``ingest.access.trusted_block_keys``).

        Args:
          stream: The stream's name.
          blocks: The ids of the blocks about to be read.
          purpose: Why, a non-empty text.

        Raises:
          LedgerError, UnknownBlock: an empty purpose, or a block the stream does not hold (nothing written).
        """
        ids = _trusted_reads.check_trusted_read(blocks, purpose)
        with self._store.transaction() as tx:
            self.stream(stream, tx)
            _trusted_reads.log_trusted_read(tx, self._log, stream, ids, purpose)

    # --------------------------------------------------------------- pipelines
    def register(self, stream: str, pipeline: str) -> None:
        """Mark a pipeline as waiting: it gets an even share of every block that arrives from now on.

        Args:
          stream: The stream's name.
          pipeline: The pipeline's name.

        Raises:
          UnknownStream, LedgerError: no such stream, or a bad pipeline name (nothing written).
        """
        _check_name(pipeline, "pipeline name")
        with self._store.transaction() as tx:
            _pipelines.register_pipeline(tx, self._log, self._keys, self.stream(stream, tx), pipeline)

    def claim(self, stream: str, pipelines: Iterable[str]) -> PipelineClaim:
        """Claim ``pipelines`` of ``stream`` for this process while it runs them.

        One process runs a pipeline name at a time (docs/scale_out.md, "Several hosts on one PostgreSQL ledger"): the
        claim is a lock the holder's exit drops, held until ``release()`` (or ``with``), ``close()`` or the exit.

        Args:
          stream: The stream's name.
          pipelines: The pipeline names to claim, all or none.

        Returns:
          The ``PipelineClaim``.

        Raises:
          PipelineBusy: another process holds one of them (naming it and the holder; none is claimed).
        """
        names = [_check_name(p, "pipeline name") for p in pipelines]
        self.stream(stream)
        claim = _pipelines.claim_pipelines(self._store, stream, names)
        self._claims.append(claim)
        return claim

    def finish(self, stream: str, pipeline: str, outcome: Outcome | str) -> None:
        """End a pipeline; split its unused reservations among those still waiting.

        Args:
          stream: The stream's name.
          pipeline: The pipeline's name.
          outcome: ``ACCEPT``, ``REJECT`` or ``TIMEOUT``.

        Raises:
          LedgerError, UnknownStream: a bad outcome, name or stream (nothing written).
        """
        _pipelines.check_finish_outcome(outcome)
        _check_name(pipeline, "pipeline name")
        with self._store.transaction() as tx:
            _pipelines.finish_pipeline(tx, self._log, self._keys, self.stream(stream, tx), pipeline, outcome)

    # ------------------------------------------------------------------ grants
    def request(
        self,
        pipeline: str,
        stream: str,
        *,
        blocks: Sequence[str] | str | None = None,
        window: tuple[float, float] | None = None,
        epsilon: float | None = None,
        delta: float = 0.0,
        curve: Any = None,
        rule: str | None = None,
        meta: Mapping[str, Any] | None = None,
        split: BudgetSplit | None = None,
    ) -> Grant:
        """Check and charge every block atomically; return a signed Grant. Data may be read only after this returns.

        Args:
          pipeline: The pipeline's name.
          stream: The stream's name.
          blocks: Block ids (or one id); or give ``window``.
          window: (start, end): every active block inside it.
          epsilon: An (epsilon, delta)-DP query's epsilon; or give ``curve``.
          delta: The query's delta.
          curve: An RDP curve: values aligned with the stream's orders, an {order: value} map, or a dp_accounting
            DpEvent.
          rule: The split's ``ChargeRule`` ("single" without a split), if given; the grant records it.
          meta: Signed into the grant; ``meta["split"]`` a split's dict, ``meta["records"]`` a ``RecordSplit``'s
            dict (a grant with a split without one gets the default: ``split.sign_records``).
          split: What each stage may spend (``BudgetSplit``); it must compose, under its rule, to at most the charge.
            Without one the grant is single-stage: ONE stage may spend all of it (``release``).

        Returns:
          The signed ``Grant``.

        Raises:
          LedgerError: bad arguments, a charge under the grant floor, a finished pipeline (nothing charged).
          UnknownStream, UnknownBlock, BlockRetired: naming the stream or the blocks (nothing charged).
          BudgetRefused: a block cannot pay now (under a queued policy the demand stays recorded).
        """
        _check_name(pipeline, "pipeline name")
        blocks = _requests.requested_ids(blocks, window, lambda start, end: self.window_blocks(stream, start, end))
        meta, split, rule = grant_terms(meta, split, rule)
        with self._store.transaction() as tx:
            s, pipeline_state = _requests.read_request(tx, stream, pipeline, blocks)
            filt = stream_filter(s)
            cost = _requests.request_cost(s, filt, epsilon, delta, curve)
            found, reservations = _requests.requested_blocks(tx, stream, blocks)
            _requests.check_request(filt, s, cost, epsilon, curve, pipeline, pipeline_state)
            grant, refusal = _requests.charge_request(
                StreamWrite(tx, self._log, self._keys, s, filt),
                Charge(pipeline, blocks, cost, rule, meta, split),
                found,
                reservations,
            )
        if refusal:  # after the commit: the demand stays recorded, and the scheduler grants it when it fits
            raise BudgetRefused(stream, pipeline, refusal)
        assert grant is not None  # granted now, or refused above
        return grant

    def verify(
        self,
        grant: Grant | str | Mapping[str, Any],
        *,
        stream: str | None = None,
        epsilon: float | None = None,
        delta: float | None = None,
    ) -> Grant:
        """Check a grant before reading data; return the ledger's copy (its head made durable first: docs/security.md).

        Args:
          grant: A ``Grant``, its JSON or its dict.
          stream: The stream it must be of, if given.
          epsilon: The epsilon it must cover at least, if given.
          delta: The delta it must cover at least, if given.

        Returns:
          The ledger's ``Grant``.

        Raises:
          GrantError: the grant is missing, malformed, forged (bad signature or altered fields), unknown (never
            charged by this ledger), of another stream, or covers less than ``epsilon``/``delta``.
          LedgerRollback: the ledger does not match its anchor.
        """
        if grant is None or grant == "":
            raise GrantError("no grant given: a pipeline reads data only under a grant from the ledger")
        parsed = Grant.from_json(grant)
        if not self._signature_ok(parsed.body(), parsed.signature):
            raise GrantError(f"grant {parsed.id!r} is forged: its signature does not match its contents")
        with self._store.transaction(write=False) as tx:  # the grant's record and a log tail at or after its entry
            stored, last = recorded_grant(parsed.id, tx.one(sql.GRANT_BODY, (parsed.id,))), tx.one(sql.LOG_LAST)
        check_grant_copy(parsed, stored, stream, epsilon, delta)
        self._head_before_use(last)
        return stored

    def release(
        self,
        grant: Grant | str | Mapping[str, Any],
        stage: str,
        computation: str,
        epsilon: float,
        delta: float = 0.0,
        per_unit: str | None = None,
    ) -> Release:
        """Open ``stage``'s one release under ``grant``, BEFORE anything is drawn.

        A grant pays for one release per stage, of one computation: the first call records the computation with what
        the stage may spend (``privacy/split.py``); the same computation re-opens it (``Release.reopened``: the same
        noise, nothing new released), another is refused (docs/block_composition.md, "What a grant pays for").

        On a unit stream a stage gets the per-row budget (epsilon / K), unless ``per_unit`` names the grant's unit
        column: the stage's mechanism is calibrated to the unit itself and may spend its whole share, recorded in the
        release's entry (``unit_share``).

        Args:
          grant: A ``Grant``, its JSON or its dict (verified here).
          stage: The stage (``Stage``).
          computation: The computation's fingerprint (e.g. a digest of the traced transform graph, of the trainer's
            module and inputs, or of the validated model).
          epsilon: What the release spends.
          delta: What the release spends.
          per_unit: The grant's unit column when the stage's mechanism is calibrated to the unit (validation and
            rejection stages only); None otherwise.

        Returns:
          The ``Release``.

        Raises:
          GrantError: a bad grant, another computation on the stage, or more than the stage may spend.
          LedgerError: an unknown stage, a bad fingerprint, epsilon or delta (nothing recorded).
        """
        checked = self.verify(grant)
        epsilon, delta = _releases.check_release_args(stage, computation, epsilon, delta)
        with self._store.transaction() as tx:
            cap = stage_cap(checked, stream_filter(read_stream(tx, checked.stream))) if older_rdp(checked) else None
            return _releases.open_release(tx, self._log, checked, stage, computation, epsilon, delta, cap, per_unit)

    def draw(
        self,
        lifetime_grants: Sequence[Grant | str],
        run: int,
        epsilon: float,
        delta: float,
        *,
        schedule: str,
        split: BudgetSplit | None = None,
        meta: dict[str, Any] | None = None,
        composition: Composition | str = Composition.BASIC,
    ) -> Grant:
        """A run grant of ``run`` over ``lifetime_grants``, charging no block: its budget is drawn from theirs.

        Asked again with the same arguments, the same grant comes back (``draws.py``: the rules and their proofs).

        Args:
          lifetime_grants: One-block grants, in block order, each released once under ``schedule``'s fingerprint.
          run: The run's number.
          epsilon: The run grant's epsilon.
          delta: The run grant's delta.
          schedule: The growth schedule's fingerprint.
          split: What each stage of the run may spend (``BudgetSplit``).
          meta: Signed into the run grant.
          composition: How the runs compose on each lifetime grant: ``basic`` (sums of epsilon and delta) or ``zcdp``
            (approximate zCDP through the RDP filter).

        Returns:
          The run ``Grant``.

        Raises:
          LedgerError: a malformed draw.
          GrantError: forged or unknown lifetime grants, a structure the rule refuses, or a run index drawn before.
          BudgetRefused: a lifetime grant's draws would exceed it (nothing written).
        """
        return _draws.draw(
            self._store,
            self._log,
            self._keys,
            self.signature_ok,
            lifetime_grants,
            run,
            epsilon,
            delta,
            schedule=schedule,
            split=split,
            meta=meta,
            composition=composition,
        )

    def record_outcome(self, grant_id: str, outcome: Outcome | str, details: Mapping[str, Any] | None = None) -> None:
        """Record what a pipeline run under ``grant_id`` concluded, once per grant, in the audit log.

        With the grants, the outcomes are the pipeline's iteration history, from which a killed iterator resumes.

        Args:
          grant_id: The grant's id.
          outcome: ``ACCEPT``, ``REJECT``, ``RETRY`` or ``FAILED``.
          details: JSON-able details recorded with it.

        Raises:
          LedgerError: a bad outcome or details, or a second outcome for the grant (nothing written).
          GrantError: the grant is unknown to this ledger.
        """
        details, details_text = _pipelines.check_outcome(outcome, details)
        with self._store.transaction() as tx:
            _pipelines.insert_outcome(tx, self._log, grant_id, outcome, details, details_text)

    def audit(self) -> AuditReport:
        """Recompute every block's loss from the log alone; see ``audit.audit_ledger``."""
        return audit_ledger(self)
