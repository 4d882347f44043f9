"""Replay a historical data set as a live stream: one time-window block arrives per step.

The data set is read once and cut into windows by its time column. Each
``step()`` advances the clock to the end of the next window that holds data and
commits that window as a fresh block (zero spend) with the same writer and
commit as ``sage ingest``. The clock is simulated (steps run back to back, or
whenever the caller drives them) or real time (``run(realtime=True, speedup=S)``
sleeps window/S seconds of wall time per window of data time). Re-running a
replay resumes after the windows already registered (checked by content digest), and a step whose window
another replay of the stream registered meanwhile (another host's `sage serve`, docs/scale_out.md, "Several
hosts on one PostgreSQL ledger") checks that block's digest and moves on, without writing it again.
"""

import time
from dataclasses import dataclass

import numpy as np

from .blocks import TimeBlocks
from .layout import block_dir, check_stream_config, read_manifest
from .pipeline import ingest_batches, plan_schema
from .records import InputError, describe_columns, read_batches, row_hashes, schema_of, to_example_batch, typed_batch
from .store import digest_forms, refuse_copies


@dataclass(frozen=True)
class Step:
    block: str
    clock: float  # data time after this step (end of the window, unix seconds)
    added: bool  # False if the block was already registered (a resumed replay)
    generated: bool


class Replay:
    """Drive with ``step()`` (one block) or ``run(steps=..., realtime=..., speedup=...)``."""

    def __init__(self, ledger, stream, data_root, table, time_column, window, generated=None, schema=None):
        """``schema``: the feature types of ``table``'s columns (``from_file`` passes the ones ``sage ingest``
        gives the same file); default: ``records.schema_of`` its Arrow types. A stream that has a schema keeps
        it (``layout.check_stream_config``), so a replay types and digests its records as every ingest of the
        stream does.

        Args:
          ledger: The open ``Ledger`` holding ``stream``.
          stream: The stream the blocks are registered in.
          data_root: The data root the block files are written under.
          table: The records to replay (a pyarrow Table or RecordBatch).
          time_column: The column holding each record's time.
          window: The block window (e.g. ``1d``).
          generated: Whether the records are GENERATED (None: a ``generated`` column says so).
          schema: The feature types of ``table``'s columns.

        Raises:
          InputError: an empty table, or a time column the table lacks.
        """
        import pyarrow as pa

        if isinstance(table, pa.RecordBatch):
            table = pa.Table.from_batches([table])
        if table.num_rows == 0:
            raise InputError("the replay input is empty: no records to replay")
        self.ledger, self.stream, self.data_root = ledger, stream, data_root
        self.spec = TimeBlocks(time_column, window)
        self.schema = check_stream_config(data_root, stream, schema or schema_of(table.schema), self.spec)
        if time_column not in self.schema:
            raise InputError(f"time column {time_column!r} is not in the input (columns: {', '.join(self.schema)})")
        self.generated = bool(generated if generated is not None else "generated" in table.column_names)
        self.columns = None  # from_file: records.describe_columns of the file, what the CLI prints
        keys = np.concatenate([self.spec.keys(b) for b in table.to_batches()])
        order = np.argsort(keys, kind="stable")
        self._table = table.take(pa.array(order))
        sorted_keys = keys[order]
        self._windows = np.unique(sorted_keys)
        self._bounds = np.searchsorted(sorted_keys, np.append(self._windows, self._windows[-1] + 1))
        ledger.stream(stream)
        self._sums = self._row_sums()
        registered = {b.id for b in ledger.blocks(stream)}
        self._next = 0  # resume: skip the windows a previous replay registered, if they hold these very rows
        while self._next < len(self._windows) and self.spec.block_id(self._windows[self._next]) in registered:
            self._check_registered(self._next)
            self._next += 1
        # Records another stream registered are refused now, before a caller registers or charges anything.
        refuse_copies(
            ledger,
            stream,
            {self.spec.block_id(self._windows[i]): self._forms(i) for i in range(self._next, len(self._windows))},
        )
        self.clock = float(self._windows[min(self._next, len(self._windows) - 1)] * self.spec.window)

    @classmethod
    def from_file(cls, ledger, stream, data_root, path, time_column, window, fmt=None):
        """A replay of an input file, read and typed exactly as ``sage ingest`` reads it.

        The file goes through ``plan_schema`` and ``read_batches`` with their checks, so the same file gives the
        same blocks and content digests either way.

        Args:
          ledger: The open ``Ledger`` holding ``stream``.
          stream: The stream the blocks are registered in.
          data_root: The data root the block files are written under.
          path: The input file (CSV, TFRecord or Parquet).
          time_column: The column holding each record's time.
          window: The block window (e.g. ``1d``).
          fmt: The input format (``csv``, ``tfrecord`` or ``parquet``); None: from the file name.

        Returns:
          The ``Replay``, positioned at the first window not yet registered.

        Raises:
          InputError: an empty or unreadable input, an unknown format, or a time column the input lacks.
        """
        import pyarrow as pa

        spec = TimeBlocks(time_column, window)
        schema, fmts = plan_schema([path], fmt, data_root, stream, spec)
        batches = [typed_batch(b, schema) for b in read_batches(path, fmts[path], schema, time_column=time_column)]
        if not batches:
            raise InputError(f"the replay input {path} is empty: no records to replay")
        replay = cls(ledger, stream, data_root, pa.Table.from_batches(batches), time_column, window, schema=schema)
        replay.columns = describe_columns(path, fmts[path], replay.schema)
        return replay

    @property
    def remaining(self):
        """Windows with data not yet replayed."""
        return len(self._windows) - self._next

    def step(self):
        """Commit the next window that holds data as a block; None when the data set is exhausted."""
        if self._next >= len(self._windows):
            return None
        i = self._next
        key = int(self._windows[i])
        block = self.spec.block_id(key)
        if self._registered(block):  # another replay of this stream (another host) committed it meanwhile
            self._check_registered(i)
            added = False
        else:
            rows = self._window_rows(i)
            result = ingest_batches(self.ledger, self.stream, self.data_root, rows.to_batches(), self.spec, self.schema)
            added = block in result["added"]
        self._next += 1
        self.clock = float((key + 1) * self.spec.window)
        return Step(block=block, clock=self.clock, added=added, generated=self.generated)

    def _registered(self, block):
        from sage_tfx.privacy import UnknownBlock

        try:
            self.ledger.block(self.stream, block)
        except UnknownBlock:
            return False
        return True

    def _check_registered(self, i):
        """Window ``i``'s block is registered: it must hold these very rows (its manifest's content digest)."""
        block = self.spec.block_id(self._windows[i])
        manifest = read_manifest(block_dir(self.data_root, self.stream, block)) or {}
        if manifest.get("digest") not in self._forms(i):
            raise InputError(
                f"block {block!r} of stream {self.stream!r} is already registered with different "
                "records: this data set cannot be replayed there"
            )

    def _row_sums(self):
        """Each window's row-hash sum (``store.keyed_digest`` keys it), all windows in one pass."""
        hashes = np.concatenate([row_hashes(to_example_batch(b, self.schema)) for b in self._table.to_batches()])
        return np.add.reduceat(hashes, self._bounds[:-1].astype(np.int64))

    def _forms(self, i):
        """The digests window ``i``'s block may have recorded (``store.digest_forms``)."""
        return digest_forms(self.ledger, int(self._sums[i]))

    def _window_rows(self, i):
        return self._table.slice(int(self._bounds[i]), int(self._bounds[i + 1] - self._bounds[i]))

    def run(self, steps=None, realtime=False, speedup=1.0, on_step=None):
        """Replay ``steps`` windows (default: all); in real time, sleep the data time / ``speedup``.

        Args:
          steps: How many windows to replay (None: all).
          realtime: Sleep between windows as the data's time passes.
          speedup: How much faster than the data's time, a finite number > 0.
          on_step: Called with each step's result.

        Returns:
          The steps' results (``step``), in order.

        Raises:
          InputError: a bad ``speedup``.
        """
        if speedup is None or not np.isfinite(speedup) or speedup <= 0:
            raise InputError(f"speedup {speedup!r} must be a finite number > 0")
        done = []
        wall0, clock0 = time.monotonic(), self.clock
        while steps is None or len(done) < steps:
            if realtime and done:
                key = int(self._windows[self._next]) if self._next < len(self._windows) else None
                if key is not None:
                    due = wall0 + ((key + 1) * self.spec.window - clock0) / speedup
                    time.sleep(max(0.0, due - time.monotonic()))
            step = self.step()
            if step is None:
                break
            done.append(step)
            if on_step:
                on_step(step)
        return done
