"""Blocks encrypted at rest: the ONE writer and reader of block files.

Every path that writes or reads a block's records (ingest, replay and serve, BlockExampleGen, trusted readers)
goes through here. Files are AES-256-GCM in authenticated chunks bound to their stream, block, file name and
place; each block's data key is wrapped under the block's key with its manifest as associated data, and every
read checks paths, manifest, size and SHA-256 before it decrypts a byte (refusals: ``SealedError``). Nothing
here opens the ledger: keys come in as bytes, from ``access.grant_block_keys`` or trusted code.

File format, keys and read checks: docs/security.md, "Blocks at rest, and reads gated by a grant".
"""

import gzip
import hashlib
import json
import os
import stat
import struct

from sage_tfx.privacy.errors import StorageError

from .layout import BLOCK_FILE, FILE_MODE, PLAIN_NAME

MAGIC = b"SAGEBLK1"
FORMAT = "sage-sealed-v1"
CHUNK = 64 << 10  # plaintext bytes per chunk (each chunk: 12-byte nonce + CHUNK + 16-byte tag)
PAD = 4 << 10  # the last chunk's plaintext is padded to a multiple of this
NONCE = 12
TAG = 16
SUFFIX = ".sealed"
KEY_BYTES = 32
_HEADER = MAGIC + struct.pack(">I", CHUNK)


class SealedError(StorageError, ValueError):
    """A block file or manifest that is missing, altered, moved, unsafe, unencrypted or under another key."""


# ------------------------------------------------------------------ keys
def _hkdf(key, info):
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    return HKDF(algorithm=hashes.SHA256(), length=KEY_BYTES, salt=b"sage-tfx/sealed/v1", info=info).derive(key)


def new_run_key():
    """A fresh random run key (in memory only: never written anywhere)."""
    return os.urandom(KEY_BYTES)


def data_key(run_key, stream, block):
    """The DEK of ``block`` of ``stream`` in the ingest run of ``run_key`` (one per block and run)."""
    _check_key(run_key, "run key")
    return _hkdf(run_key, b"sage-tfx block data|" + json.dumps([stream, block]).encode())


def _check_key(key, what):
    if not isinstance(key, (bytes, bytearray)) or len(key) != KEY_BYTES:
        raise SealedError(f"a {what} is {KEY_BYTES} bytes")


def _ad(stream, block, name, index, final):
    return _HEADER + json.dumps([stream, block, name]).encode() + struct.pack(">QB", index, 1 if final else 0)


# ------------------------------------------------------------------ part list (staging.write_parts/read_parts)
_PARTS_MAGIC = b"SAGEPARTS1"
_PARTS_AD = b"sage-tfx part list v1"


def _parts_key(run_key):
    return _hkdf(bytes(run_key), b"sage-tfx part list")


def seal_part_list(parts, run_key) -> bytes:
    """A run's part list as written to ``_parts.sealed``: magic, nonce, AES-256-GCM of its JSON under a key derived
    from the run key (the staging location sees neither its row counts nor digests)."""
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    nonce = os.urandom(NONCE)
    return (
        _PARTS_MAGIC
        + nonce
        + AESGCM(_parts_key(run_key)).encrypt(nonce, json.dumps(parts, sort_keys=True).encode(), _PARTS_AD)
    )


def open_part_list(body: bytes, run_key) -> list:
    """The part list ``seal_part_list`` wrote; SealedError if ``body`` does not authenticate under the run key
    (edited, or written by anyone without it)."""
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    head, nonce = body[: len(_PARTS_MAGIC)], body[len(_PARTS_MAGIC) : len(_PARTS_MAGIC) + NONCE]
    try:
        if head != _PARTS_MAGIC:
            raise InvalidTag()
        return json.loads(AESGCM(_parts_key(run_key)).decrypt(nonce, body[len(_PARTS_MAGIC) + NONCE :], _PARTS_AD))
    except (InvalidTag, ValueError):
        raise SealedError("the part list does not authenticate under this run's key") from None


# ------------------------------------------------------------------ writer
class SealedWriter:
    """A write-only file object: what is written goes out as encrypted chunks of one block file.

    ``digest()`` after ``close()``: {"bytes": size, "sha256": hex} of the file as written (the manifest's).
    The file is created with O_EXCL and mode 0600; or, given ``raw`` (a binary file object the caller opened,
    e.g. Beam's ``FileSystems.create`` on an object store), the chunks go there: the caller owns creating
    and, after ``abort``, removing it (docs/security.md, "Staging outside the data root").
    """

    def __init__(self, path, dek, stream, block, raw=None):
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        _check_key(dek, "data key")
        self.path, self.name, self.stream, self.block = path, os.path.basename(str(path)), stream, block
        self._aead = AESGCM(bytes(dek))
        self._own = raw is None
        if raw is None:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), FILE_MODE)
            raw = os.fdopen(fd, "wb")
        self._raw = raw
        self._buf = bytearray()
        self._index = 0
        self._sha = hashlib.sha256()
        self._size = 0
        self._emit(_HEADER)
        self.closed = False

    def writable(self):
        return True

    def _emit(self, data):
        self._raw.write(data)
        self._sha.update(data)
        self._size += len(data)

    def _chunk(self, data, final):
        body = struct.pack(">I", len(data)) + bytes(data)
        if final:
            body += b"\0" * (-len(body) % PAD)
        else:
            assert len(body) == CHUNK
        nonce = os.urandom(NONCE)
        self._emit(nonce + self._aead.encrypt(nonce, body, _ad(self.stream, self.block, self.name, self._index, final)))
        self._index += 1

    def write(self, data):
        self._buf += data
        step = CHUNK - 4
        if len(self._buf) > step:  # keep at least one byte back: the last chunk is written by close()
            n = (len(self._buf) - 1) // step * step
            view = memoryview(self._buf)
            for start in range(0, n, step):
                self._chunk(view[start : start + step], final=False)
            view.release()
            del self._buf[:n]
        return len(data)

    def flush(self):
        pass

    def close(self, fsync=False):
        if self.closed:
            return
        self._chunk(self._buf, final=True)
        self._buf = bytearray()
        self._raw.flush()
        if fsync and self._own:
            os.fsync(self._raw.fileno())
        self._raw.close()
        self.closed = True

    def abort(self):
        """Close and remove a file cut short by an error (a ``raw`` file: closed only; its opener removes it)."""
        if not self.closed:
            try:
                self._raw.close()
            except Exception:  # an object store's upload may fail again on close: the caller removes it
                pass
            self.closed = True
        if not self._own:
            return
        try:
            os.unlink(self.path)
        except OSError:
            pass

    def digest(self):
        return {"bytes": self._size, "sha256": self._sha.hexdigest()}


def write_records(path, records, dek, stream, block, compresslevel=6, fsync=False, raw=None):
    """Write records as one sealed block file (a gzip TFRecord stream, encrypted); return {"bytes", "sha256"}.
    ``raw``: an opened binary file object to write to instead of creating ``path`` (see ``SealedWriter``)."""
    from .records import frame_tfrecords

    out = SealedWriter(path, dek, stream, block, raw=raw)
    try:
        with gzip.GzipFile(fileobj=out, mode="wb", compresslevel=compresslevel, mtime=0) as gz:
            frame_tfrecords(gz, records)
        out.close(fsync=fsync)
    except BaseException:
        out.abort()
        raise
    return out.digest()


# ------------------------------------------------------------------ manifest
def manifest_ad(manifest):
    """The associated data that wraps a block's DEK: the manifest without its wrapped key, canonical JSON."""
    body = {k: v for k, v in manifest.items() if k != "sealed_key"}
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def seal_manifest(manifest, dek, block_key):
    """``manifest`` with ``format`` and its DEK wrapped under ``block_key`` (the manifest authenticated)."""
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    _check_key(dek, "data key")
    _check_key(block_key, "block key")
    manifest = dict(manifest, format=FORMAT)
    nonce = os.urandom(NONCE)
    wrapped = AESGCM(bytes(block_key)).encrypt(nonce, bytes(dek), manifest_ad(manifest))
    return dict(manifest, sealed_key={"nonce": nonce.hex(), "wrapped": wrapped.hex()})


def is_sealed(manifest):
    return isinstance(manifest, dict) and manifest.get("format") == FORMAT


def unwrap(manifest, block_key, where):
    """The DEK of a sealed manifest; SealedError if the manifest was altered or the key is another block's."""
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    _check_key(block_key, "block key")
    try:
        sk = manifest["sealed_key"]
        nonce, wrapped = bytes.fromhex(sk["nonce"]), bytes.fromhex(sk["wrapped"])
        return AESGCM(bytes(block_key)).decrypt(nonce, wrapped, manifest_ad(manifest))
    except InvalidTag:
        raise SealedError(
            f"{where} does not authenticate under this block's key: it was altered (files, digest, "
            "stream or block edited) or belongs to another block or stream; nothing was read. "
            "Restore the block folder from your backup, or re-ingest the block"
        ) from None
    except (KeyError, TypeError, ValueError):
        raise SealedError(
            f"{where} has no valid sealed key: nothing was read; restore the block folder from your backup"
        ) from None


# ------------------------------------------------------------------ reader
class Block:
    """An opened sealed block: its folder, stream, id, content digest, DEK and checked files."""

    def __init__(self, folder, stream, block, digest, dek, files):
        self.folder, self.stream, self.block, self.digest = folder, stream, block, digest
        self._dek, self.files = dek, files  # files: [(path, name, bytes, sha256)]

    def __repr__(self):  # never the key
        return f"sealed.Block({self.stream!r}, {self.block!r}, {len(self.files)} file(s))"

    def records(self):
        for path, _name, size, sha in self.files:
            yield from read_file(path, self._dek, self.stream, self.block, size, sha)

    def file_tasks(self):
        """(stream, block, path, bytes, sha256) per file: what a parallel reader needs besides the DEK."""
        return [(self.stream, self.block, path, size, sha) for path, name, size, sha in self.files]

    def file_names(self):
        """{path: the manifest's file name} (a staged copy is read as the file the manifest names)."""
        return {path: name for path, name, size, sha in self.files}

    @property
    def dek(self):
        return self._dek


def safe_block_folder(data_root, stream, block):
    """DATA_ROOT/STREAM/BLOCK, refused (SealedError) if stream or block is not a plain name or if the
    resolved folder is not exactly that path under the resolved data root (a symlinked stream or block)."""
    for what, name in (("stream", stream), ("block", block)):
        if not isinstance(name, str) or not PLAIN_NAME.match(name) or name in (".", ".."):
            raise SealedError(f"{what} name {name!r} is not a plain folder name: refusing a path outside the data root")
    root = os.path.realpath(os.path.abspath(str(data_root)))
    folder = os.path.join(root, stream, block)
    if os.path.realpath(folder) != folder:
        raise SealedError(
            f"block folder {folder} resolves to {os.path.realpath(folder)} (a symlink): block "
            "folders must be real folders inside the data root; nothing was read"
        )
    return folder


def safe_file(folder, name):
    """The path of block file ``name`` in ``folder``; SealedError unless it is a plain name of a regular
    file (no separator, no ``..``, no symlink) that resolves inside the folder."""
    if not isinstance(name, str) or not PLAIN_NAME.match(name) or name.startswith(".") or os.sep in name:
        raise SealedError(
            f"block file name {name!r} in {folder} is not a plain file name: a manifest may only name "
            "files inside its block folder; nothing was read"
        )
    path = os.path.join(folder, name)
    if os.path.dirname(os.path.realpath(path)) != folder:
        raise SealedError(
            f"block file {path} resolves outside its block folder ({os.path.realpath(path)}); nothing was read"
        )
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise SealedError(f"block file {path} is missing: restore the block folder from your backup") from None
    if not stat.S_ISREG(st.st_mode):
        raise SealedError(f"block file {path} is not a regular file (a symlink?): nothing was read")
    return path


def read_manifest(folder):
    path = os.path.join(folder, BLOCK_FILE)
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        raise SealedError(f"block folder {folder} has no {BLOCK_FILE}: the block has no data there") from None
    except (OSError, ValueError) as exc:
        raise SealedError(f"{path} is unreadable or not JSON ({exc}): restore it from your backup") from None


def open_block(data_root, stream, block, block_key, expected_digest=None):
    """Open one sealed block for reading with its block key; every check runs before a record is read."""
    folder = safe_block_folder(data_root, stream, block)
    manifest = read_manifest(folder)
    where = os.path.join(folder, BLOCK_FILE)
    if not is_sealed(manifest):
        raise SealedError(
            f"block {block!r} of stream {stream!r} is stored unencrypted ({where} is not a {FORMAT} manifest: a "
            f"sage-tfx before encryption at rest wrote it) and is not read. Encrypt it by ingesting the same input "
            f"again: sage ingest --db LEDGER --stream {stream} --data-root {data_root} --input ... (the same block "
            f"rule); each registered block whose records match is re-written encrypted, nothing is charged or "
            f"registered"
        )
    if manifest.get("stream") != stream or manifest.get("block") != block:
        raise SealedError(
            f"{where} is for block {manifest.get('block')!r} of stream {manifest.get('stream')!r}, not "
            f"{block!r} of {stream!r}: it was moved or edited; nothing was read"
        )
    files = []
    for entry in manifest.get("files", []) if isinstance(manifest.get("files"), list) else [None]:
        name = entry.get("name") if isinstance(entry, dict) else None
        path = safe_file(folder, name)  # paths first: nothing outside the folder is ever opened
        try:
            files.append((path, name, int(entry["bytes"]), str(entry["sha256"])))
        except (KeyError, TypeError, ValueError):
            raise SealedError(
                f"{where} lists file {name!r} without its size and SHA-256: restore it from your backup"
            ) from None
    dek = unwrap(manifest, block_key, where)  # authenticates the whole manifest (files, digest, stream, block)
    if expected_digest is not None and manifest.get("digest") != expected_digest:
        raise SealedError(
            f"{where} records content digest {manifest.get('digest')!r}, but the ledger registered "
            f"{expected_digest!r} for block {block!r} of stream {stream!r}: not the block the ledger "
            "holds; nothing was read"
        )
    return Block(folder, stream, block, manifest.get("digest"), dek, files)


def is_url(path):
    """True for a Beam FileSystems URL (``scheme://...``), False for a local path."""
    return "://" in str(path)


def open_raw(path):
    """A binary read-only file object of ``path``: ``open`` for a local path, Beam's ``FileSystems.open``
    (uncompressed) for a URL (a staged copy on an object store, docs/scale_out.md "BlockExampleGen on remote
    workers"). The checks that follow (``verify_file``, ``SealedReader``) are the same for both."""
    if not is_url(path):
        return open(path, "rb", buffering=0)
    from apache_beam.io.filesystem import CompressionTypes
    from apache_beam.io.filesystems import FileSystems

    try:
        return FileSystems.open(
            str(path), mime_type="application/octet-stream", compression_type=CompressionTypes.UNCOMPRESSED
        )
    except Exception as exc:  # BeamIOError and the filesystems' own errors
        raise SealedError(
            f"block file {path} cannot be opened through Beam's FileSystems ({exc}): nothing was read"
        ) from None


def verify_file(path, size, sha256):
    """SealedError unless ``path`` has exactly ``size`` bytes with SHA-256 ``sha256`` (the manifest's record).
    ``path``: a local path or a Beam FileSystems URL (``open_raw``)."""
    h, n = hashlib.sha256(), 0
    try:
        f = open_raw(path)
    except FileNotFoundError:
        raise SealedError(f"block file {path} is missing: nothing was read; restore it from your backup") from None
    with f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
            n += len(chunk)
    if n != size or h.hexdigest() != sha256:
        raise SealedError(
            f"block file {path} does not match the digest recorded at ingest ({n} bytes, sha256 "
            f"{h.hexdigest()[:16]}..., recorded {size} bytes, {str(sha256)[:16]}...): it was altered or "
            "damaged; nothing of it was read. Restore it from your backup"
        )


class SealedReader:
    """A read-only file object of a sealed file's plain stream; each chunk is authenticated before use.

    ``path``: a local path or a Beam FileSystems URL (``open_raw``). ``name``: the file's name in its block's
    manifest, bound into every chunk's associated data (default: the path's last component); a staged copy
    read under another path still authenticates only as the file the manifest names."""

    def __init__(self, path, dek, stream, block, name=None):
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        _check_key(dek, "data key")
        self.path, self.stream, self.block = path, stream, block
        self.name = name if name is not None else str(path).rstrip("/").rsplit("/", 1)[-1]
        self._aead = AESGCM(bytes(dek))
        self._raw = open_raw(path)
        header = self._read(len(_HEADER))
        if header != _HEADER:
            self._raw.close()
            raise SealedError(f"block file {path} is not a {FORMAT} file (bad header): nothing was read")
        self._size = NONCE + CHUNK + TAG
        self._next = self._read(self._size)
        self._buf = b""
        self._pos = 0
        self._index = 0
        self._done = False

    def readable(self):
        return True

    def _read(self, n):
        """Exactly ``n`` bytes, fewer only at the end (a FileSystems stream may return short reads)."""
        parts, got = [], 0
        while got < n:
            part = self._raw.read(n - got)
            if not part:
                break
            parts.append(part)
            got += len(part)
        return b"".join(parts)

    def _fill(self):
        current, self._next = self._next, self._read(self._size)
        final = not self._next
        if len(current) < NONCE + TAG or (not final and len(current) != self._size):
            raise SealedError(f"block file {self.path} is truncated at chunk {self._index}: nothing more was read")
        from cryptography.exceptions import InvalidTag

        try:
            body = self._aead.decrypt(
                current[:NONCE], current[NONCE:], _ad(self.stream, self.block, self.name, self._index, final)
            )
        except InvalidTag:
            raise SealedError(
                f"block file {self.path} fails authentication at chunk {self._index}: altered, "
                "damaged, moved from another block or stream, or under another key"
            ) from None
        (n,) = struct.unpack(">I", body[:4])
        if n > len(body) - 4:
            raise SealedError(f"block file {self.path} has a malformed chunk {self._index}")
        self._buf, self._pos = body[4 : 4 + n], 0
        self._index += 1
        self._done = final

    def read(self, n=-1):
        out = []
        want = float("inf") if n is None or n < 0 else n
        got = 0
        while got < want:
            if self._pos >= len(self._buf):
                if self._done:
                    break
                self._fill()
                continue
            take = self._buf[self._pos : self._pos + int(min(want - got, len(self._buf) - self._pos))]
            self._pos += len(take)
            got += len(take)
            out.append(take)
        return b"".join(out)

    def readinto(self, b):
        data = self.read(len(b))
        b[: len(data)] = data
        return len(data)

    def close(self):
        self._raw.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def read_file(path, dek, stream, block, size=None, sha256=None, name=None):
    """Yield the records of one sealed block file, after checking its size and SHA-256 (when given).

    ``path``: a local path or a Beam FileSystems URL (a staged copy); ``name``: the manifest's file name
    (``SealedReader``). One code path for both: the same size, digest and chunk checks."""
    from .records import iter_tfrecords

    if sha256 is not None:
        verify_file(path, size, sha256)
    with SealedReader(path, dek, stream, block, name=name) as raw, gzip.GzipFile(fileobj=raw, mode="rb") as gz:
        try:
            yield from iter_tfrecords(gz, path)
        except (OSError, EOFError) as exc:  # gzip errors inside an authenticated stream: a writer bug
            raise SealedError(f"block file {path} holds a damaged record stream: {exc}") from None
