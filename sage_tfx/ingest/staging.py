"""Staging runs: where an ingest's writers put part files and the part list before ``store.commit``.

By default a run is ``DATA_ROOT/STREAM/_staging`` and is committed by renaming; a staging location outside the
data root (a Beam FileSystems URL or a local folder) gets a fresh run id, and the driver fetches each part it
commits (size and SHA-256 checked) before the same commit. Part files and the part list are sealed, so a store
without O_EXCL or file modes sees only ciphertext. Runs left by killed ingests are removed by a later one.

Guarantees and stale runs: docs/security.md, "Staging outside the data root"; usage: docs/scale_out.md.
"""

import fcntl
import hashlib
import os
import re
import shutil
import socket
import time
import uuid

from . import sealed
from .layout import DIR_MODE, FILE_MODE, PLAIN_NAME, STAGING, data_root_dir, prepare_stream_dir
from .records import InputError, is_url

PARTS_FILE = "_parts.sealed"  # the part list, sealed under the run key (write_parts)
RUN_LOCK = ".run.lock"
STALE_SECONDS = 3600  # an unlocked staging folder (older versions, or a creation cut short) older than this is gone
REMOTE_STALE_SECONDS = 24 * 3600  # a run at a staging URL untouched this long belongs to a killed ingest
RUN_NAME = re.compile(r"^(\.new-)?[0-9a-f]{16}([0-9a-f]{16})?$")  # run ids: 16 hex (local), 32 hex (URL)
_HELD = {}  # run dir -> the open file whose flock marks it live


def new_run_dir(data_root, stream):
    """A fresh staging run, locked by this process until ``remove_run_dir``; stale runs are cleaned first."""
    return _new_locked_run(lambda: prepare_stream_dir(data_root, stream), f"data root {data_root_dir(data_root)}")


def _new_locked_run(prepare, what):
    """A fresh locked run folder in the folder ``prepare()`` makes (``what`` names it in errors)."""
    for attempt in range(3):  # a refused ingest nearby may rmdir an empty _staging between our mkdirs
        staging = prepare()
        clean_stale_runs(staging)
        run_id = uuid.uuid4().hex[:16]
        hidden, run = os.path.join(staging, f".new-{run_id}"), os.path.join(staging, run_id)
        try:
            os.makedirs(hidden, mode=DIR_MODE)
            os.chmod(hidden, DIR_MODE)
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
                "nothing was changed"
            ) from None
        return location.rstrip("/") or location
    root, path = data_root_dir(data_root), os.path.abspath(location)
    if path == os.path.join(root, stream, STAGING):
        return None
    if os.path.commonpath([root, path]) == root:
        raise InputError(
            f"staging location {location!r} is inside the data root {root}: leave --staging-location "
            f"out (the default, {os.path.join(root, stream, STAGING)}) or give a folder outside the data "
            "root; nothing was changed"
        )
    if os.path.commonpath([root, path]) == path:
        raise InputError(
            f"staging location {location!r} holds the data root {root}: give a folder of its own "
            "outside the data root (stale runs are removed there); nothing was changed"
        )
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
                os.makedirs(location, mode=DIR_MODE, exist_ok=True)
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
        run = m.path[len(prefix) :].split("/", 1)[0] if m.path.startswith(prefix) else ""
        if RUN_NAME.match(run) and not run.startswith("."):
            newest[run] = max(newest.get(run, 0.0), float(getattr(m, "last_updated_in_seconds", 0.0) or 0.0))
    removed = []
    for run, t in sorted(newest.items()):
        if now - t > REMOTE_STALE_SECONDS and remove_staged_run(prefix + run) is None:
            removed.append(run)
    return removed


def write_parts(run_dir, parts, run_key):
    """Write the run's part list (``_parts.sealed``) sealed under a key derived from the run key (AES-256-GCM):
    the staging location sees neither its row counts nor digests, and ``read_parts`` refuses a list that was
    edited or written by anyone without the run key (docs/security.md, "Staging outside the data root")."""
    body = sealed.seal_part_list(parts, run_key)
    if not is_url(run_dir):
        check_run_here(run_dir)
        path = os.path.join(run_dir, PARTS_FILE)
        tmp = f"{path}.{uuid.uuid4().hex[:8]}.tmp"
        with os.fdopen(
            os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), FILE_MODE), "wb"
        ) as f:
            f.write(body)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        return
    path = staged_path(run_dir, PARTS_FILE)
    out = create_staged(path)
    try:
        out.write(body)
        out.close()
    except BaseException:
        delete_staged_quietly(path)
        raise


def read_parts(run_dir, run_key):
    """The run's part list, decrypted and authenticated under the run key; an InputError if it does not
    authenticate (nothing is registered)."""
    path = staged_path(run_dir, PARTS_FILE)
    if not _staged_exists(path):
        raise InputError(
            f"the Beam job finished but its part list {path} is not there: the workers wrote it where "
            "this process does not see it. Workers that do not share this machine's disk at the same "
            "path need --staging-location URL_OR_DIR (e.g. gs://BUCKET/staging, or a folder both see; "
            "docs/scale_out.md); nothing was registered"
        )
    with _open_staged(path) as f:
        body = f.read()
    try:
        return sealed.open_part_list(body, run_key)
    except sealed.SealedError:
        raise InputError(
            f"the part list {path} does not authenticate under this run's key: it was written or "
            "edited by someone else in the staging location; nothing was registered. Check who can "
            "write there, and run the ingest again"
        ) from None


def fetch_parts(staged_run, run_dir, blocks):
    """Copy the part files of ``blocks`` ({block id: info with "files": [{"name", "bytes", "sha256"}]}) from a
    staged run (URL or local folder) into the local run folder ``run_dir``: each created O_EXCL|O_NOFOLLOW,
    0600, in 0700 block folders, its size and SHA-256 checked against what its writer reported (the part list
    is sealed under the run key: ``read_parts``). ``commit`` makes them durable (one sync) before any
    block moves into place. A mismatch is an InputError naming the part: nothing is registered."""
    for block_id, info in sorted(blocks.items()):
        if not PLAIN_NAME.match(str(block_id)):
            raise InputError(
                f"the part list of staged run {staged_run} names block {block_id!r}, not a plain folder "
                "name; nothing was registered"
            )
        folder = os.path.join(run_dir, block_id)
        os.makedirs(folder, mode=DIR_MODE, exist_ok=True)
        for f in info["files"]:
            name = f["name"]
            if not PLAIN_NAME.match(str(name)) or name.startswith("."):
                raise InputError(
                    f"the part list of staged run {staged_run} names file {name!r}, not a plain file "
                    "name; nothing was registered"
                )
            source = staged_path(staged_run, block_id, name)
            target = os.path.join(folder, name)
            h, n = hashlib.sha256(), 0
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), FILE_MODE)
            with os.fdopen(fd, "wb") as out, _open_staged(source) as src:
                while chunk := src.read(1 << 20):
                    h.update(chunk)
                    n += len(chunk)
                    out.write(chunk)
            if n != f["bytes"] or h.hexdigest() != f["sha256"]:
                raise InputError(
                    f"staged part {source} has {n} bytes, sha256 {h.hexdigest()[:16]}..., but its writer "
                    f"reported {f['bytes']} bytes, {str(f['sha256'])[:16]}...: it was altered or damaged "
                    "in the staging location; nothing was registered. Run the ingest again"
                )


def staged_path(run, *names):
    """``names`` joined under a staged run: a local path, or a URL (Beam's FileSystems.join)."""
    if is_url(run):
        from apache_beam.io.filesystems import FileSystems

        return FileSystems.join(run, *names)
    return os.path.join(run, *names)


def check_run_here(run_dir):
    """InputError unless the local staging run ``run_dir``, created by the driver, exists where this process
    (a Beam worker) runs: a worker that does not share the driver's disk would otherwise write its parts where
    the driver never looks (docs/scale_out.md)."""
    if not os.path.isdir(run_dir):
        raise InputError(
            f"the staging run {run_dir} does not exist on the Beam worker on host {socket.gethostname()} "
            f"(pid {os.getpid()}): the workers do not see the driver's disk at this path. Give "
            "--staging-location URL_OR_DIR, a Beam FileSystems URL (gs://BUCKET/staging) or a folder "
            "both see (docs/scale_out.md); nothing was registered"
        )


def _staged_exists(path):
    if is_url(path):
        from apache_beam.io.filesystems import FileSystems

        return FileSystems.exists(path)
    return os.path.isfile(path)


def _open_staged(path):
    if is_url(path):
        from apache_beam.io.filesystem import CompressionTypes
        from apache_beam.io.filesystems import FileSystems

        return FileSystems.open(
            path, mime_type="application/octet-stream", compression_type=CompressionTypes.UNCOMPRESSED
        )
    return open(path, "rb")


def create_staged(path):
    """A new object at a staging URL (Beam's FileSystems.create: no O_EXCL or modes on an object store; the
    run id is fresh and random, and every byte written is sealed or authenticated)."""
    from apache_beam.io.filesystem import CompressionTypes
    from apache_beam.io.filesystems import FileSystems

    return FileSystems.create(
        path, mime_type="application/octet-stream", compression_type=CompressionTypes.UNCOMPRESSED
    )


def delete_staged_quietly(path):
    """Delete one object at a staging URL, ignoring errors (the driver deletes the whole run afterwards)."""
    from apache_beam.io.filesystems import FileSystems

    try:
        FileSystems.delete([path])
    except Exception:
        pass  # the driver deletes the whole run prefix afterwards
