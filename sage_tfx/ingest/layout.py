"""The block store's layout on disk: where a stream's blocks, manifests and staging runs live.

::

    DATA_ROOT/STREAM/_stream.json                  feature schema + block rule of the stream
    DATA_ROOT/STREAM/BLOCK_ID/part-*.sealed        the block's tf.Examples (gzip TFRecord), encrypted (sealed.py)
    DATA_ROOT/STREAM/BLOCK_ID/_BLOCK.json          content digest (keyed: ``store.keyed_digest``), files (size,
                                                   SHA-256), window or shard, the block's data key wrapped
                                                   under its block key (no row count)
    DATA_ROOT/STREAM/_staging/RUN_ID/...           an ingest in progress (never read; staging.py)
    DATA_ROOT/STREAM/_staging/RUN_ID/.run.lock     held (flock) by that ingest's process while it runs

Folders sage creates are ``DIR_MODE`` (0700) and files ``FILE_MODE`` (0600). A stream, block or block file name
is a plain name (``PLAIN_NAME``). Nothing here encrypts, stages or commits: ``sealed.py`` seals block files,
``staging.py`` holds runs in progress, ``store.py`` writes and commits blocks.
"""

import json
import os
import re
import uuid

from .records import InputError

STREAM_FILE = "_stream.json"
BLOCK_FILE = "_BLOCK.json"
STAGING = "_staging"
# a BlockExampleGen run's copy of the sealed blocks under a staging location (components/block_example_gen_executor)
STAGED_PREFIX = "sage-blocks-"
FILE_MODE, DIR_MODE = 0o600, 0o700
PLAIN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,200}$")  # a stream, block or block file name


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
        raise InputError(
            f"stream {stream!r} is blocked by {config['blocks']}, not {spec.describe()}: a stream keeps one block rule"
        )
    missing = [n for n in config["schema"] if n not in schema]
    if missing:
        raise InputError(f"input lacks column(s) {', '.join(missing)} of stream {stream!r}")
    return dict(config["schema"])


def write_json(path, obj, fsync=True):
    """Write ``obj`` as JSON to ``path`` atomically (a fresh 0600 temporary file, renamed over it)."""
    tmp = f"{path}.{uuid.uuid4().hex[:8]}.tmp"
    with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE), "w") as f:
        json.dump(obj, f, indent=1, sort_keys=True)
        f.flush()
        if fsync:
            os.fsync(f.fileno())
    os.replace(tmp, path)


def fsync_dir(path):
    """fsync the folder ``path`` (the renames in it durable); an OSError is raised."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def data_root_dir(data_root):
    """The data root as an absolute path; InputError if it exists and is not a folder."""
    root = os.path.abspath(str(data_root))
    if os.path.exists(root) and not os.path.isdir(root):
        raise InputError(f"data root {root} is not a directory")
    return root


def missing_dirs(data_root, stream):
    """The folders an ingest would create (data root, stream, staging), outermost first: removed again when
    a refused ingest leaves them empty."""
    root = data_root_dir(data_root)
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
    root = data_root_dir(data_root)
    staging = os.path.join(root, stream, STAGING)
    try:
        os.makedirs(os.path.dirname(root), exist_ok=True)
        for folder in (root, os.path.join(root, stream), staging):  # the folders sage creates are 0700
            os.makedirs(folder, mode=DIR_MODE, exist_ok=True)
    except OSError as exc:
        raise InputError(f"data root {data_root_dir(data_root)} is not writable: {exc.strerror or exc}") from None
    return staging
