"""The block store on disk, and the commit that makes a block visible.

Layout (easy to see with ``ls``)::

    DATA_ROOT/STREAM/_stream.json                  feature schema + block rule of the stream
    DATA_ROOT/STREAM/BLOCK_ID/part-*.sealed        the block's tf.Examples (gzip TFRecord), encrypted (sealed.py)
    DATA_ROOT/STREAM/BLOCK_ID/_BLOCK.json          content digest (keyed: ``keyed_digest``), files (size,
                                                   SHA-256), window or shard, the block's data key wrapped
                                                   under its block key (no row count)
    DATA_ROOT/STREAM/_staging/RUN_ID/...           an ingest in progress (never read)
    DATA_ROOT/STREAM/_staging/RUN_ID/.run.lock     held (flock) by that ingest's process while it runs

Staging location (``sage ingest --staging-location``, docs/scale_out.md): where the Beam workers write a run's
part files and part list. By default it is ``DATA_ROOT/STREAM/_staging`` and a run is committed by renaming its
folders into place. It may instead be any Beam FileSystems URL or local folder outside the data root that the
workers reach (``gs://B/P``, ``s3://B/P``, ``hdfs://H/P``, ``/shared/staging``): workers write through Beam's
``FileSystems`` (a local folder: with the same O_EXCL / 0600 / O_NOFOLLOW files and 0700 folders), runs are
``LOCATION/RUN_ID`` (a fresh random id), and the driver copies each part it commits into a local run under
``DATA_ROOT/STREAM/_staging`` (``fetch_parts``: O_EXCL, 0600, size and SHA-256 checked against what the writer
reported) before the same commit; then it deletes the staged run, also after an error. The part list is
sealed under the run key (``write_parts``/``read_parts``), and so are the part files (``sealed.py``):
a store without O_EXCL or file modes sees only ciphertext, and an altered part or list is refused at commit
(docs/security.md, "Staging outside the data root").

Staging runs left by killed ingests are removed by the next ingest of the stream (``clean_stale_runs``):
a run whose ``.run.lock`` can be locked belongs to a process that is gone (the kernel drops a dead
process's flock), so it is removed; a locked one is live and kept. A new run is created under a
dot-name, locked, then renamed into place, so no run is ever visible unlocked. Folders without a lock
(left by older versions) are removed once older than ``STALE_SECONDS``. The lock is host-local: with a
distributed Beam runner on a shared filesystem, run one ingest of a stream at a time. A staging URL holds no
locks: runs there whose newest object is older than ``REMOTE_STALE_SECONDS`` are removed by the next ingest
that stages there (``clean_stale_remote_runs``). Only names of the form of a run id are ever removed.

Visibility: a block is visible to pipelines only once the ledger holds it; the
ledger is the only index readers use. Commit order per block: finish every part
file in staging (fsynced), write its manifest, rename the staging directory to
DATA_ROOT/STREAM/BLOCK_ID (atomic on one filesystem), then ``add_block``. A crash
before the rename leaves only staging; a crash between the rename and
``add_block`` leaves an unregistered (invisible) directory that the next ingest
of the same input checks by digest and registers. Re-ingesting the same input
finds the block registered with the same digest and skips it: no duplicate rows
or blocks. A registered block is immutable: different rows for it are refused.

Exact row counts go only into the ledger (``add_block(rows=...)``), never into
the data root's manifests or any output a pipeline sees.

At rest every part file is encrypted (``sealed.py``, the one writer and reader of block files): writers
encrypt each block under a data key derived from the run's random key (``BlockWriter(run_key=...)``, in
memory only), and ``commit`` wraps it under the block's key from the ledger's key ring, with the manifest as
associated data. Folders are created 0700 and files 0600. Reading needs the block's key: a charged,
signed grant (``access.grant_block_keys``) or trusted code (``access.trusted_block_keys``).
"""
import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import time
import uuid

import numpy as np

from . import sealed
from .records import InputError, is_url, row_hashes, to_example_batch

STREAM_FILE = "_stream.json"
BLOCK_FILE = "_BLOCK.json"
STAGING = "_staging"
PARTS_FILE = "_parts.sealed"  # the part list, sealed under the run key (write_parts)
RUN_LOCK = ".run.lock"
STALE_SECONDS = 3600  # an unlocked staging folder (older versions, or a creation cut short) older than this is gone
REMOTE_STALE_SECONDS = 24 * 3600  # a run at a staging URL untouched this long belongs to a killed ingest
RUN_NAME = re.compile(r"^(\.new-)?[0-9a-f]{16}([0-9a-f]{16})?$")  # run ids: 16 hex (local), 32 hex (URL)
_HELD = {}  # run dir -> the open file whose flock marks it live
_MASK = (1 << 64) - 1


def stream_dir(data_root, stream):
    return os.path.join(os.path.abspath(data_root), stream)


def block_dir(data_root, stream, block_id):
    return os.path.join(stream_dir(data_root, stream), block_id)


def block_files(data_root, stream, block_id):
    """The part files of a committed block (from its manifest; encrypted: read them with ``access``)."""
    path = block_dir(data_root, stream, block_id)
    manifest = read_manifest(path)
    if manifest is None:
        raise InputError(f"block {block_id!r} of stream {stream!r} has no data under {path}")
    return [os.path.join(path, f["name"] if isinstance(f, dict) else f) for f in manifest["files"]]


def read_manifest(path):
    try:
        with open(os.path.join(path, BLOCK_FILE)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _write_json(path, obj, fsync=True):
    tmp = f"{path}.{uuid.uuid4().hex[:8]}.tmp"
    with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, sealed.FILE_MODE), "w") as f:
        json.dump(obj, f, indent=1, sort_keys=True)
        f.flush()
        if fsync:
            os.fsync(f.fileno())
    os.replace(tmp, path)


def _fsync_dir(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def keyed_digest(ledger, total: int) -> str:
    """The content digest a new block records (manifest and ledger): the ledger key ring's HMAC of ``total``, the
    64-bit sum (mod 2^64) of ``records.row_hashes`` of its records (``KeyRing.content_digest``). Only the sealed
    part list holds the sum itself (``BlockWriter`` sums it per part)."""
    return ledger.keyring.content_digest(total)


def digest_forms(ledger, total: int) -> tuple:
    """Every digest a block of these records may have recorded: the keyed one (64 hex digits), and the unkeyed
    16-hex-digit row-hash sum that blocks ingested before digests were keyed recorded (read as they are)."""
    return keyed_digest(ledger, total), f"{total:016x}"


def _data_root(data_root):
    root = os.path.abspath(str(data_root))
    if os.path.exists(root) and not os.path.isdir(root):
        raise InputError(f"data root {root} is not a directory")
    return root


def missing_dirs(data_root, stream):
    """The folders an ingest would create (data root, stream, staging), outermost first: removed again when
    a refused ingest leaves them empty."""
    root = _data_root(data_root)
    chain = [root, os.path.join(root, stream), os.path.join(root, stream, STAGING)]
    return [d for d in chain if not os.path.exists(d)]


def remove_empty_dirs(dirs):
    """rmdir each of ``dirs`` (innermost first) that is still empty; a folder another ingest uses stays."""
    for d in reversed(list(dirs)):
        try:
            os.rmdir(d)
        except OSError:
            pass


def prepare_stream_dir(data_root, stream):
    """DATA_ROOT/STREAM/_staging (created if needed); clear errors if the data root is unusable."""
    root = _data_root(data_root)
    staging = os.path.join(root, stream, STAGING)
    try:
        os.makedirs(os.path.dirname(root), exist_ok=True)
        for folder in (root, os.path.join(root, stream), staging):  # the folders sage creates are 0700
            os.makedirs(folder, mode=sealed.DIR_MODE, exist_ok=True)
    except OSError as exc:
        raise InputError(f"data root {_data_root(data_root)} is not writable: {exc.strerror or exc}") from None
    return staging


def new_run_dir(data_root, stream):
    """A fresh staging run, locked by this process until ``remove_run_dir``; stale runs are cleaned first."""
    return _new_locked_run(lambda: prepare_stream_dir(data_root, stream), f"data root {_data_root(data_root)}")


def _new_locked_run(prepare, what):
    """A fresh locked run folder in the folder ``prepare()`` makes (``what`` names it in errors)."""

    for attempt in range(3):  # a refused ingest nearby may rmdir an empty _staging between our mkdirs
        staging = prepare()
        clean_stale_runs(staging)
        run_id = uuid.uuid4().hex[:16]
        hidden, run = os.path.join(staging, f".new-{run_id}"), os.path.join(staging, run_id)
        try:
            os.makedirs(hidden, mode=sealed.DIR_MODE)
            os.chmod(hidden, sealed.DIR_MODE)
            lock = open(os.path.join(hidden, RUN_LOCK), "w")
        except FileNotFoundError:
            if attempt == 2:
                raise
            continue
        except OSError as exc:
            raise InputError(f"{what} is not writable: {exc.strerror or exc}") from None
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a fresh file: always free
        os.rename(hidden, run)  # visible only once locked
        _HELD[run] = lock
        return run


def remove_run_dir(run):
    """Remove a staging run of this process and release its lock."""
    shutil.rmtree(run, ignore_errors=True)
    lock = _HELD.pop(run, None)
    if lock is not None:
        lock.close()


def clean_stale_runs(staging, now=None):
    """Remove the staging runs no live ingest holds (see the module docstring); returns the names removed."""

    now = time.time() if now is None else now
    removed = []
    try:
        names = os.listdir(staging)
    except OSError:
        return removed
    for name in names:
        path = os.path.join(staging, name)
        if path in _HELD or not RUN_NAME.match(name) or not os.path.isdir(path) or os.path.islink(path):
            continue
        lock_path = os.path.join(path, RUN_LOCK)
        if name.startswith(".") or not os.path.exists(lock_path):
            try:
                old = now - os.stat(path).st_mtime > STALE_SECONDS
            except OSError:
                continue
            if old:
                shutil.rmtree(path, ignore_errors=True)
                removed.append(name)
            continue
        try:
            lock = open(lock_path, "a")
        except OSError:
            continue
        with lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:  # held: a live ingest
                continue
            shutil.rmtree(path, ignore_errors=True)  # its process is gone: nobody will read these files
            removed.append(name)
    return removed


# ------------------------------------------------------------------ staging location (docs/scale_out.md)
def check_staging_location(data_root, stream, location: str | None) -> str | None:
    """The checked ``--staging-location``: None for the default ``DATA_ROOT/STREAM/_staging`` (not given, or
    given as that folder), else the URL or absolute local folder. Nothing is created here, so a bad value
    changes nothing: an unknown scheme (no installed Beam filesystem), a local folder inside the data root
    (runs would look like streams or blocks) or holding it (stale-run cleanup works in it), or a file."""
    if location is None or str(location) == "":
        return None
    location = str(location)
    if is_url(location):
        from apache_beam.io.filesystems import FileSystems

        try:
            FileSystems.get_filesystem(location)
        except Exception as exc:  # ValueError for an unknown scheme, BeamIOError for a missing extra
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise InputError(
                f"staging location {location!r}: no Beam filesystem for scheme {FileSystems.get_scheme(location)!r} "
                f"here ({reason}). Give a local folder outside the data root, or a URL of a filesystem Beam has "
                "installed (gs://, s3://, hdfs://: pip install 'apache-beam[gcp]', '[aws]' or '[hadoopfs]'); "
                "nothing was changed") from None
        return location.rstrip("/") or location
    root, path = _data_root(data_root), os.path.abspath(location)
    if path == os.path.join(root, stream, STAGING):
        return None
    if os.path.commonpath([root, path]) == root:
        raise InputError(f"staging location {location!r} is inside the data root {root}: leave --staging-location "
                         f"out (the default, {os.path.join(root, stream, STAGING)}) or give a folder outside the data "
                         "root; nothing was changed")
    if os.path.commonpath([root, path]) == path:
        raise InputError(f"staging location {location!r} holds the data root {root}: give a folder of its own "
                         "outside the data root (stale runs are removed there); nothing was changed")
    if os.path.exists(path) and not os.path.isdir(path):
        raise InputError(f"staging location {location!r} is not a folder; nothing was changed")
    return path


def missing_staging_dirs(location: str | None):
    """The local folders ``new_staged_run`` would create for ``location`` (outermost first; none for a URL)."""
    if location is None or is_url(location):
        return []
    missing, d = [], os.path.abspath(location)
    while not os.path.exists(d) and os.path.dirname(d) != d:
        missing.append(d)
        d = os.path.dirname(d)
    return missing[::-1]


def new_staged_run(location: str) -> str:
    """A fresh run at a staging location other than the default: a local folder gets a locked run folder
    (as ``new_run_dir``); a URL gets ``LOCATION/RUN_ID`` with a random 128-bit id (nothing is created: the
    workers' first write makes it), after its stale runs are removed."""
    if not is_url(location):
        def prepare():
            try:
                os.makedirs(location, mode=sealed.DIR_MODE, exist_ok=True)
            except OSError as exc:
                raise InputError(f"staging location {location!r} is not writable: {exc.strerror or exc}") from None
            return location

        return _new_locked_run(prepare, f"staging location {location!r}")
    from apache_beam.io.filesystems import FileSystems

    clean_stale_remote_runs(location)
    return FileSystems.join(location, uuid.uuid4().hex)


def _run_files(run):
    """The paths of every object under a staged run URL."""
    from apache_beam.io.filesystems import FileSystems

    return [m.path for m in FileSystems.match([run.rstrip("/") + "/**"])[0].metadata_list]


def remove_staged_run(run: str) -> str | None:
    """Delete a staged run (local folder or URL); None when it is gone, else why not (the caller says so)."""
    if not is_url(run):
        remove_run_dir(run)
        return f"{run} is still there" if os.path.lexists(run) else None
    from apache_beam.io.filesystems import FileSystems

    try:
        paths = _run_files(run)
        if paths:
            FileSystems.delete(paths)
        if FileSystems.get_filesystem(run).has_dirs() and FileSystems.exists(run):
            FileSystems.delete([run])
        left = _run_files(run)
    except Exception as exc:  # a store that refuses or fails: reported, never raised over the ingest's outcome
        return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return f"{len(left)} object(s) left under {run}" if left else None


def clean_stale_remote_runs(location, now=None):
    """Remove the runs at a staging URL whose newest object is older than ``REMOTE_STALE_SECONDS`` (left by
    killed ingests: a live run's workers keep writing, and a run never outlives its ingest); best effort.
    Returns the run ids removed."""

    from apache_beam.io.filesystems import FileSystems

    now = time.time() if now is None else now
    prefix = location.rstrip("/") + "/"
    try:
        metas = FileSystems.match([prefix + "**"])[0].metadata_list
    except Exception:
        return []
    newest = {}
    for m in metas:
        run = m.path[len(prefix):].split("/", 1)[0] if m.path.startswith(prefix) else ""
        if RUN_NAME.match(run) and not run.startswith("."):
            newest[run] = max(newest.get(run, 0.0), float(getattr(m, "last_updated_in_seconds", 0.0) or 0.0))
    removed = []
    for run, t in sorted(newest.items()):
        if now - t > REMOTE_STALE_SECONDS and remove_staged_run(prefix + run) is None:
            removed.append(run)
    return removed


def fetch_parts(staged_run, run_dir, blocks):
    """Copy the part files of ``blocks`` ({block id: info with "files": [{"name", "bytes", "sha256"}]}) from a
    staged run (URL or local folder) into the local run folder ``run_dir``: each created O_EXCL|O_NOFOLLOW,
    0600, in 0700 block folders, its size and SHA-256 checked against what its writer reported (the part list
    is sealed under the run key: ``read_parts``). ``commit`` makes them durable (one sync) before any
    block moves into place. A mismatch is an InputError naming the part: nothing is registered."""
    for block_id, info in sorted(blocks.items()):
        if not sealed._NAME.match(str(block_id)):
            raise InputError(f"the part list of staged run {staged_run} names block {block_id!r}, not a plain folder "
                             "name; nothing was registered")
        folder = os.path.join(run_dir, block_id)
        os.makedirs(folder, mode=sealed.DIR_MODE, exist_ok=True)
        for f in info["files"]:
            name = f["name"]
            if not sealed._NAME.match(str(name)) or name.startswith("."):
                raise InputError(f"the part list of staged run {staged_run} names file {name!r}, not a plain file "
                                 "name; nothing was registered")
            source = _staged_path(staged_run, block_id, name)
            target = os.path.join(folder, name)
            h, n = hashlib.sha256(), 0
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0),
                         sealed.FILE_MODE)
            with os.fdopen(fd, "wb") as out, _open_staged(source) as src:
                while chunk := src.read(1 << 20):
                    h.update(chunk)
                    n += len(chunk)
                    out.write(chunk)
            if n != f["bytes"] or h.hexdigest() != f["sha256"]:
                raise InputError(f"staged part {source} has {n} bytes, sha256 {h.hexdigest()[:16]}..., but its writer "
                                 f"reported {f['bytes']} bytes, {str(f['sha256'])[:16]}...: it was altered or damaged "
                                 "in the staging location; nothing was registered. Run the ingest again")


def _staged_path(run, *names):
    if is_url(run):
        from apache_beam.io.filesystems import FileSystems

        return FileSystems.join(run, *names)
    return os.path.join(run, *names)


def check_run_here(run_dir):
    """InputError unless the local staging run ``run_dir``, created by the driver, exists where this process
    (a Beam worker) runs: a worker that does not share the driver's disk would otherwise write its parts where
    the driver never looks (docs/scale_out.md)."""
    if not os.path.isdir(run_dir):
        import socket

        raise InputError(f"the staging run {run_dir} does not exist on the Beam worker on host {socket.gethostname()} "
                         f"(pid {os.getpid()}): the workers do not see the driver's disk at this path. Give "
                         "--staging-location URL_OR_DIR, a Beam FileSystems URL (gs://BUCKET/staging) or a folder "
                         "both see (docs/scale_out.md); nothing was registered")


def _staged_exists(path):
    if is_url(path):
        from apache_beam.io.filesystems import FileSystems

        return FileSystems.exists(path)
    return os.path.isfile(path)


def _open_staged(path):
    if is_url(path):
        from apache_beam.io.filesystem import CompressionTypes
        from apache_beam.io.filesystems import FileSystems

        return FileSystems.open(path, mime_type="application/octet-stream",
                                compression_type=CompressionTypes.UNCOMPRESSED)
    return open(path, "rb")


def _create_staged(path):
    """A new object at a staging URL (Beam's FileSystems.create: no O_EXCL or modes on an object store; the
    run id is fresh and random, and every byte written is sealed or authenticated)."""
    from apache_beam.io.filesystem import CompressionTypes
    from apache_beam.io.filesystems import FileSystems

    return FileSystems.create(path, mime_type="application/octet-stream",
                              compression_type=CompressionTypes.UNCOMPRESSED)


def _delete_quietly(path):
    from apache_beam.io.filesystems import FileSystems

    try:
        FileSystems.delete([path])
    except Exception:
        pass  # the driver deletes the whole run prefix afterwards


def stream_config(data_root, stream):
    try:
        with open(os.path.join(stream_dir(data_root, stream), STREAM_FILE)) as f:
            return json.load(f)
    except FileNotFoundError:
        return None


def check_stream_config(data_root, stream, schema, spec):
    """The stream's fixed schema and block rule; a clear error if this ingest disagrees."""
    config = stream_config(data_root, stream)
    if config is None:
        return schema
    if config["blocks"] != spec.describe():
        raise InputError(f"stream {stream!r} is blocked by {config['blocks']}, not {spec.describe()}: a stream "
                         "keeps one block rule")
    missing = [n for n in config["schema"] if n not in schema]
    if missing:
        raise InputError(f"input lacks column(s) {', '.join(missing)} of stream {stream!r}")
    return dict(config["schema"])


class BlockWriter:
    """Buffers encoded records per block and writes them as part files in a staging run directory.

    Memory is bounded: a block's buffer is written as a part once it passes
    ``part_bytes``, and the largest buffer whenever all pass ``max_buffered``.
    """

    def __init__(self, run_dir, spec, schema, part_bytes=64 << 20, max_buffered=256 << 20, compresslevel=6,
                 stream=None, run_key=None):
        """``stream`` and ``run_key`` (``sealed.new_run_key()``, the same for every writer of one run, kept in
        memory): each block's parts are encrypted under ``sealed.data_key(run_key, stream, block)``."""
        if stream is None or run_key is None:
            raise ValueError("BlockWriter needs the stream and the run key (block files are always encrypted)")
        self.run_dir, self.spec, self.schema = run_dir, spec, schema
        self.stream, self._run_key, self._deks = stream, run_key, {}
        self.part_bytes, self.max_buffered, self.compresslevel = part_bytes, max_buffered, compresslevel
        self.tag = uuid.uuid4().hex[:12]
        self._buffers, self._sizes, self._digests, self._parts, self._seq = {}, {}, {}, [], 0
        self._total = 0

    def add(self, batch):
        if not batch.num_rows:
            return
        from tfx_bsl.coders import example_coder

        keys = self.spec.keys(batch)
        examples = to_example_batch(batch, self.schema)
        records = example_coder.RecordBatchToExamples(examples)
        hashes = row_hashes(examples)
        order = np.argsort(keys, kind="stable")
        sorted_keys = keys[order]
        cuts = np.flatnonzero(np.diff(sorted_keys)) + 1
        for idx in np.split(order, cuts):
            key = int(keys[idx[0]])
            chunk = [records[i] for i in idx]
            size = sum(map(len, chunk))
            self._buffers.setdefault(key, []).extend(chunk)
            self._digests[key] = (self._digests.get(key, 0) + int(hashes[idx].sum())) & _MASK
            self._sizes[key] = self._sizes.get(key, 0) + size
            self._total += size
            if self._sizes[key] >= self.part_bytes:
                self._flush(key)
        while self._total > self.max_buffered:
            self._flush(max(self._sizes, key=self._sizes.get))

    def _flush(self, key):
        records = self._buffers.pop(key)
        digest = self._digests.pop(key)
        self._total -= self._sizes.pop(key)
        block_id = self.spec.block_id(key)
        name = f"part-{self.tag}-{self._seq:05d}{sealed.SUFFIX}"
        self._seq += 1
        if block_id not in self._deks:
            self._deks[block_id] = sealed.data_key(self._run_key, self.stream, block_id)
        if is_url(self.run_dir):  # a staging URL: through Beam's FileSystems (module docstring)
            target = _staged_path(self.run_dir, block_id, name)
            try:
                written = sealed.write_records(target, records, self._deks[block_id], self.stream, block_id,
                                               self.compresslevel, raw=_create_staged(target))
            except BaseException:
                _delete_quietly(target)
                raise
        else:
            if self._seq == 1:  # the first part of this writer: its run must be here
                check_run_here(self.run_dir)
            folder = os.path.join(self.run_dir, block_id)
            os.makedirs(folder, mode=sealed.DIR_MODE, exist_ok=True)
            written = sealed.write_records(os.path.join(folder, name), records, self._deks[block_id], self.stream,
                                           block_id, self.compresslevel)
        self._parts.append({"key": key, "block": block_id, "file": name, "rows": len(records),
                            "digest": f"{digest:016x}",  # hex: Beam coders mangle ints >= 2^63
                            "bytes": written["bytes"], "sha256": written["sha256"]})

    def close(self):
        """Write what is buffered; return the part descriptions (for ``commit``)."""
        for key in list(self._buffers):
            self._flush(key)
        return self._parts


_PARTS_MAGIC = b"SAGEPARTS1"
_PARTS_AD = b"sage-tfx part list v1"


def _parts_key(run_key):
    return sealed._hkdf(bytes(run_key), b"sage-tfx part list")


def write_parts(run_dir, parts, run_key):
    """Write the run's part list (``_parts.sealed``) sealed under a key derived from the run key (AES-256-GCM):
    the staging location sees neither its row counts nor digests, and ``read_parts`` refuses a list that was
    edited or written by anyone without the run key (docs/security.md, "Staging outside the data root")."""
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    nonce = os.urandom(sealed.NONCE)
    body = _PARTS_MAGIC + nonce + AESGCM(_parts_key(run_key)).encrypt(
        nonce, json.dumps(parts, sort_keys=True).encode(), _PARTS_AD)
    if not is_url(run_dir):
        check_run_here(run_dir)
        path = os.path.join(run_dir, PARTS_FILE)
        tmp = f"{path}.{uuid.uuid4().hex[:8]}.tmp"
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0),
                               sealed.FILE_MODE), "wb") as f:
            f.write(body)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        return
    path = _staged_path(run_dir, PARTS_FILE)
    out = _create_staged(path)
    try:
        out.write(body)
        out.close()
    except BaseException:
        _delete_quietly(path)
        raise


def read_parts(run_dir, run_key):
    """The run's part list, decrypted and authenticated under the run key; an InputError if it does not
    authenticate (nothing is registered)."""
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    path = _staged_path(run_dir, PARTS_FILE)
    if not _staged_exists(path):
        raise InputError(f"the Beam job finished but its part list {path} is not there: the workers wrote it where "
                         "this process does not see it. Workers that do not share this machine's disk at the same "
                         "path need --staging-location URL_OR_DIR (e.g. gs://BUCKET/staging, or a folder both see; "
                         "docs/scale_out.md); nothing was registered")
    with _open_staged(path) as f:
        body = f.read()
    head, nonce = body[:len(_PARTS_MAGIC)], body[len(_PARTS_MAGIC):len(_PARTS_MAGIC) + sealed.NONCE]
    try:
        if head != _PARTS_MAGIC:
            raise InvalidTag()
        return json.loads(AESGCM(_parts_key(run_key)).decrypt(nonce, body[len(_PARTS_MAGIC) + sealed.NONCE:],
                                                              _PARTS_AD))
    except (InvalidTag, ValueError):
        raise InputError(f"the part list {path} does not authenticate under this run's key: it was written or "
                         "edited by someone else in the staging location; nothing was registered. Check who can "
                         "write there, and run the ingest again") from None


def commit(ledger, stream, data_root, run_dir, parts, spec, schema, allow_duplicate_of=(), run_key=None,
           staged_run=None):
    """Move staged blocks into place and register them; returns {"added": [...], "unchanged": [...]}.

    ``staged_run``: the run at a staging location other than ``run_dir`` (a URL or another local folder): the
    parts of the blocks to be written are first copied from it into ``run_dir`` (``fetch_parts``: O_EXCL, 0600,
    sizes and SHA-256 checked), then committed as below.

    ``run_key``: the key the run's writers encrypted with; each new block's data key is wrapped under its block
    key (``ledger.keyring.block_key``) with the manifest as associated data (``sealed.seal_manifest``).

    Every check (immutability, window/shard clashes, records already registered in another stream) runs
    before the first block is moved or registered, so bad input registers nothing. Each new block's content
    digest goes into the ledger with it; a block whose digest another stream already registered is refused
    (the same records in a second stream would get a fresh budget there), unless that stream is named in
    ``allow_duplicate_of`` (``sage ingest --allow-duplicate-of-stream S``). The ledger checks it again in the
    transaction that registers the blocks.
    """
    allow_duplicate_of = tuple(allow_duplicate_of or ())
    blocks = {}
    for part in parts:
        b = blocks.setdefault(part["block"], {"key": part["key"], "rows": 0, "digest": 0, "files": []})
        b["rows"] += part["rows"]
        b["digest"] = (b["digest"] + int(part["digest"], 16)) & _MASK
        b["files"].append({"name": part["file"], "bytes": part["bytes"], "sha256": part["sha256"]})
    if not blocks or sum(b["rows"] for b in blocks.values()) == 0:
        raise InputError("the input is empty: no records to ingest (nothing registered)")
    for info in blocks.values():
        info["forms"] = digest_forms(ledger, info["digest"])
        info["recorded"] = info["forms"][0]

    registered = {b.id: b for b in ledger.blocks(stream)}
    plan, unchanged, reseal = [], [], []
    for block_id in sorted(blocks):
        info = blocks[block_id]
        if block_id in registered:
            manifest = read_manifest(block_dir(data_root, stream, block_id))
            if manifest is None or manifest.get("digest") not in info["forms"]:
                raise InputError(f"block {block_id!r} of stream {stream!r} is already registered with different "
                                 "records; registered blocks are immutable (nothing registered)")
            if not sealed.is_sealed(manifest):  # written before encryption at rest: replaced by this sealed copy
                from .access import ledger_digest

                if ledger_digest(ledger, stream, block_id) not in (None, *info["forms"]):
                    raise InputError(f"block {block_id!r} of stream {stream!r}: the ledger registered other records "
                                     "for it (nothing changed)")
                info["recorded"] = manifest["digest"]  # the resealed manifest keeps the digest the ledger holds
                reseal.append((block_id, info, spec.ledger_key(info["key"])))
            unchanged.append(block_id)
            continue
        key = spec.ledger_key(info["key"])
        for other in registered.values():
            if "shard" in key and other.shard == key["shard"]:
                raise InputError(f"block {block_id!r}: shard {key['shard']} is already block {other.id!r}")
            if "start" in key and other.start is not None and other.start < key["end"] and other.end > key["start"]:
                raise InputError(f"block {block_id!r}: its window overlaps registered block {other.id!r} "
                                 "(nothing registered)")
        plan.append((block_id, info, key))

    refuse_copies(ledger, stream, {block_id: info["forms"] for block_id, info, _ in plan}, allow_duplicate_of)

    if staged_run is not None and staged_run != run_dir:
        fetch_parts(staged_run, run_dir, {block_id: info for block_id, info, _ in [*plan, *reseal]})
    with _commit_lock(data_root, stream):
        return _commit_plan(ledger, stream, data_root, run_dir, plan, unchanged, spec, schema, allow_duplicate_of,
                            run_key, reseal)


def refuse_copies(ledger, stream, forms: dict, allow_duplicate_of=()) -> None:
    """Refuse blocks whose records another stream of the ledger already registered (InputError naming both).

    ``forms``: {block id: its ``digest_forms``}. The same records in a second stream would get a fresh budget
    there, unless that stream is in ``allow_duplicate_of`` (``sage ingest --allow-duplicate-of-stream S``)."""
    digests = {form: block_id for block_id, both in forms.items() for form in both}
    owners = ledger.digest_owners(list(digests), exclude_stream=stream)
    for digest, block_id in sorted(digests.items(), key=lambda kv: kv[1]):
        others = [o for o in owners.get(digest, []) if o[0] not in tuple(allow_duplicate_of or ())]
        if others:
            other_stream, other_block = others[0]
            raise InputError(
                f"block {block_id!r}: its records (content digest {digest[:16]}...) are already registered as block "
                f"{other_block!r} of stream {other_stream!r}; in stream {stream!r} they would get a fresh budget, "
                f"so nothing was registered. If this copy is intended (its privacy loss adds up with the other "
                f"stream's), pass --allow-duplicate-of-stream {other_stream}")


@contextlib.contextmanager
def _commit_lock(data_root, stream):
    """One committer per stream at a time (an advisory lock on this host)."""

    with open(os.path.join(stream_dir(data_root, stream), STAGING, ".commit.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _commit_plan(ledger, stream, data_root, run_dir, plan, unchanged, spec, schema, allow_duplicate_of=(),
                 run_key=None, reseal=()):
    from sage_tfx.privacy import UnknownBlock

    if run_key is None:
        raise ValueError("commit needs the run key its writers encrypted with")

    config_path = os.path.join(stream_dir(data_root, stream), STREAM_FILE)
    if not os.path.exists(config_path):
        _write_json(config_path, {"schema": schema, "blocks": spec.describe()})
    for block_id, info, key in [*plan, *reseal]:
        staged = os.path.join(run_dir, block_id)
        listed = {f["name"] for f in info["files"]}
        for name in os.listdir(staged):  # parts of retried bundles that were never committed
            if name not in listed:
                os.remove(os.path.join(staged, name))
        manifest = sealed.seal_manifest(
            {"stream": stream, "block": block_id, "digest": info["recorded"],
             "files": sorted(info["files"], key=lambda f: f["name"]), **key},
            sealed.data_key(run_key, stream, block_id), ledger.keyring.block_key(stream, block_id))
        _write_json(os.path.join(staged, BLOCK_FILE), manifest, fsync=False)
    os.sync()  # every staged file is durable before any block moves into place (one sync, not one per file)
    for block_id, _info, _key in reseal:  # an unencrypted block of an older version: the sealed copy replaces it
        final = block_dir(data_root, stream, block_id)
        old = os.path.join(run_dir, f".plain-{block_id}")
        os.rename(final, old)
        os.rename(os.path.join(run_dir, block_id), final)
        shutil.rmtree(old, ignore_errors=True)
    new = []
    for block_id, info, key in plan:
        staged = os.path.join(run_dir, block_id)
        final = block_dir(data_root, stream, block_id)
        try:
            ledger.block(stream, block_id)
        except UnknownBlock:
            pass
        else:  # registered meanwhile by an ingest on another host: it must be the same records
            if (read_manifest(final) or {}).get("digest") not in info["forms"]:
                raise InputError(f"block {block_id!r} of stream {stream!r} was registered meanwhile with "
                                 "different records")
            unchanged.append(block_id)
            continue
        if os.path.exists(final):  # left by a crash before add_block: unregistered, so invisible; replace it
            shutil.rmtree(final)
        os.rename(staged, final)
        new.append(dict(id=block_id, rows=int(info["rows"]), digest=info["recorded"], **key))
    if new:
        from sage_tfx.privacy import DuplicateContent

        _fsync_dir(stream_dir(data_root, stream))  # the renames are durable before the ledger shows them
        try:  # one transaction: all of this ingest's new blocks, or none
            ledger.add_blocks(stream, new, allow_duplicate_of=allow_duplicate_of)
        except DuplicateContent as exc:  # another stream registered these records meanwhile: take ours back
            for b in new:
                shutil.rmtree(block_dir(data_root, stream, b["id"]), ignore_errors=True)
            raise InputError(str(exc)) from None
    return {"added": [b["id"] for b in new], "unchanged": sorted(unchanged),
            "encrypted": sorted(b for b, _, _ in reseal)}
