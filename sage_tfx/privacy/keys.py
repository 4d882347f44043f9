"""The ledger's keys, kept OUT of the ledger (paper §3.2: only trusted code holds the key that signs grants and
seeds releases).

One master key (32 random bytes) in a key file the operator chooses, created 0600 and refused when its group
or others may read or write it; HKDF-SHA256 derives one key per purpose (signing, noise seeds, the audit
chain, block encryption, content digests), so knowing one derived key reveals neither the master nor
another. Where the key file is, the derived keys and migrated ledgers' key files: docs/security.md,
"The key file".
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import secrets
import stat
from typing import cast

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from .errors import LedgerError
from .store.location import is_postgres

KEY_BYTES = 32
LEGACY_SECRET_CHARS = 64  # schema 3's meta.secret: secrets.token_hex(32)
ENV_KEY_FILE = "SAGE_KEY_FILE"
KEY_SUFFIX = ".key"
HEAD_SUFFIX = ".head"  # the head file (head_file.HeadFile) sits beside the key file: KeyRing.head_path


class KeyFileError(LedgerError):
    """A key file that is missing, unreadable, too open, malformed, or not this ledger's."""


def _hkdf(master, info, length=32):

    return HKDF(algorithm=hashes.SHA256(), length=length, salt=b"sage-tfx/keyring/v1", info=info).derive(master)


def resolve_key_path(location: str | os.PathLike[str], key_file: str | os.PathLike[str] | None = None) -> str:
    """The key file's path for a ledger ``location``: ``key_file``, else $SAGE_KEY_FILE, else ``<sqlite path>.key``.

    A PostgreSQL ledger has no default (the key must never sit in or beside the shared database): KeyFileError
    naming ``--key-file`` and ``SAGE_KEY_FILE``.
    """
    if key_file is None or key_file == "":
        key_file = os.environ.get(ENV_KEY_FILE) or None
    if key_file is not None:
        if not isinstance(key_file, (str, os.PathLike)):
            raise KeyFileError(
                f"key file {key_file!r} is invalid: give a file path (--key-file PATH or {ENV_KEY_FILE}=PATH)"
            )
        return os.path.abspath(os.fspath(key_file))
    text = str(location)
    if is_postgres(text):
        raise KeyFileError(
            "a PostgreSQL ledger needs an explicit key file (the key never goes into the database): give "
            f"--key-file PATH (Ledger.open(..., key_file=PATH)) or set {ENV_KEY_FILE}=PATH, the same key file on "
            "every host; `sage ledger init` creates it (mode 0600)"
        )
    return os.path.abspath(text) + KEY_SUFFIX


def _check_mode(path, st):
    if not stat.S_ISREG(st.st_mode):
        raise KeyFileError(f"key file {path} is not a regular file")
    if st.st_mode & 0o077:
        raise KeyFileError(
            f"key file {path} is readable or writable by group or others (mode {stat.S_IMODE(st.st_mode):04o}): "
            f"the key signs grants and seeds every DP release; refusing to use it. Fix: chmod 600 {path}"
        )


def _write_new(path, data):
    """Create ``path`` with ``data``, mode 0600, O_EXCL (never overwrites), fsynced with its folder."""
    folder = os.path.dirname(path) or "."
    if not os.path.isdir(folder):
        raise KeyFileError(f"cannot create key file {path}: folder {folder} does not exist (create it, mode 0700)")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    except FileExistsError:
        raise KeyFileError(
            f"key file {path} already exists: not overwritten (a key file is never replaced; "
            "move it away only if it belongs to no ledger)"
        ) from None
    except OSError as exc:
        raise KeyFileError(f"cannot create key file {path}: {exc.strerror}") from None
    try:
        os.fchmod(fd, 0o600)  # whatever the umask
        os.write(fd, data)
        os.fsync(fd)
    except OSError as exc:
        os.close(fd)
        os.unlink(path)
        raise KeyFileError(f"cannot write key file {path}: {exc.strerror}") from None
    os.close(fd)
    fsync_dir(folder)


def fsync_dir(folder: str) -> None:
    """fsync ``folder`` (a rename or a new file in it durable); best effort: an error is ignored."""
    with contextlib.suppress(OSError):
        dfd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


class KeyRing:
    """The master key and the keys derived from it (HKDF-SHA256). Load with ``KeyRing.load(path)``."""

    def __init__(self, master: bytes, path: str | None = None, legacy_secret: bytes | None = None) -> None:
        if not isinstance(master, bytes) or len(master) != KEY_BYTES:
            raise KeyFileError(f"a master key is {KEY_BYTES} bytes")
        self._master = master
        self.path = path
        self.legacy_secret = legacy_secret
        self.signing_key = _hkdf(master, b"sage-tfx signing")
        self.noise_key = _hkdf(master, b"sage-tfx noise")
        self.audit_key = _hkdf(master, b"sage-tfx audit")
        self.content_key = _hkdf(master, b"sage-tfx content digest")
        self.key_id = hmac.new(_hkdf(master, b"sage-tfx key id"), b"sage-tfx key id", hashlib.sha256).hexdigest()[:32]

    def __repr__(self) -> str:  # never the key bytes
        return f"KeyRing(path={self.path!r}, key_id={self.key_id!r}, legacy={self.legacy_secret is not None})"

    @property
    def head_path(self) -> str | None:
        return None if self.path is None else self.path + HEAD_SUFFIX

    def block_key(self, stream: str, block: str) -> bytes:
        """A 32-byte key for one block of one stream (distinct per (stream, block); e.g. AES-256-GCM)."""
        if not isinstance(stream, str) or not isinstance(block, str):
            raise LedgerError(f"block_key needs a stream and block id as text, not {stream!r}, {block!r}")
        info = b"sage-tfx block|" + json.dumps([stream, block]).encode()
        return _hkdf(self._master, info)

    def content_digest(self, row_sum: int) -> str:
        """The keyed content digest of a block's records: HMAC-SHA256 under ``content_key`` of their 64-bit
        row-hash sum (``ingest.records.row_hashes``), 64 hex digits. One key per ledger, so the same records
        give the same digest in every stream of it (the duplicate check), and without the key no guess of a
        record can be checked against it."""
        if not isinstance(row_sum, int) or not 0 <= row_sum < 1 << 64:
            raise LedgerError(f"a content digest keys a 64-bit row-hash sum, not {row_sum!r}")
        return hmac.digest(self.content_key, b"sage-tfx content digest|" + row_sum.to_bytes(8, "big"), "sha256").hex()

    @classmethod
    def create(cls, path: str) -> KeyRing:
        """Create a new key file at ``path`` (32 random bytes, mode 0600, never overwriting); return its KeyRing."""
        master = secrets.token_bytes(KEY_BYTES)
        _write_new(path, master)
        return cls(master, path)

    @classmethod
    def create_migrated(cls, path: str, legacy_secret: bytes | str) -> KeyRing:
        """A new master key plus the old ledger secret (schema 3's meta.secret), written to a new key file."""
        legacy = legacy_secret.encode() if isinstance(legacy_secret, str) else bytes(legacy_secret)
        if len(legacy) != LEGACY_SECRET_CHARS:
            raise KeyFileError(f"the ledger's old secret has {len(legacy)} characters, not {LEGACY_SECRET_CHARS}")
        master = secrets.token_bytes(KEY_BYTES)
        _write_new(path, master + legacy)
        return cls(master, path, legacy)

    @classmethod
    def load(cls, path: str) -> KeyRing:
        """Load a key file; KeyFileError naming the path and the fix if missing, too open, or malformed."""
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except FileNotFoundError:
            raise KeyFileError(
                f"key file {path} does not exist: the ledger's key is needed to sign grants, seed releases and "
                "audit; give the right one (--key-file PATH or SAGE_KEY_FILE=PATH) or restore it from your backup "
                "(without it no grant of this ledger can be verified)"
            ) from None
        except OSError as exc:
            raise KeyFileError(f"cannot read key file {path}: {exc.strerror}") from None
        try:
            _check_mode(path, os.fstat(fd))
            data = os.read(fd, 4096)
        finally:
            os.close(fd)
        if len(data) == KEY_BYTES:
            return cls(data, path)
        if len(data) == KEY_BYTES + LEGACY_SECRET_CHARS:
            return cls(data[:KEY_BYTES], path, data[KEY_BYTES:])
        raise KeyFileError(
            f"key file {path} is malformed ({len(data)} bytes, expected {KEY_BYTES}): not a sage key "
            "file; give the right one (--key-file PATH or SAGE_KEY_FILE=PATH)"
        )

    # -------------------------------------------------------------- uses
    def sign(self, text: bytes) -> str:
        """HMAC-SHA256 of ``text`` under the signing key, in hex (``hmac.digest``: the one-shot form of
        ``hmac.new(...).hexdigest()``, the same value without building an HMAC object)."""
        return hmac.digest(self.signing_key, text, "sha256").hex()

    def legacy_sign(self, text: bytes) -> str | None:
        """Schema 3's signature (HMAC-SHA256 of the raw old secret), for grants made before the migration."""
        if self.legacy_secret is None:
            return None
        return hmac.new(self.legacy_secret, text, hashlib.sha256).hexdigest()

    def seed(self, text: bytes, legacy: bool = False) -> int:
        key = self.legacy_secret if legacy else self.noise_key
        return int.from_bytes(hmac.new(cast(bytes, key), text, hashlib.sha256).digest()[:16], "big")

    def chain_value(self, prev: str, seq: int, kind: str, body_text: str, ts: float | None = None) -> str:
        """A log entry's keyed chain value: HMAC-SHA256(audit_key, v2 | prev | seq | ts | kind | body), the entry's
        time ``ts`` bound with it (schema 10 on); without ``ts`` the value of entries written before schema 10
        (prev | seq | kind | body), whose times the keyed ``upgrade`` entry binds instead (``migrations.py``)."""
        text = f"{prev}|{seq}|{kind}|{body_text}" if ts is None else f"v2|{prev}|{seq}|{float(ts)!r}|{kind}|{body_text}"
        return hmac.digest(self.audit_key, text.encode(), "sha256").hex()

    def entry_ok(self, prev: str, seq: int, ts: float, kind: str, body_text: str, chain: str | None) -> bool:
        """``chain`` is the keyed chain value of this entry: with its time (schema 10 on) or, for an entry
        written before schema 10, without it. A writer without the key can produce neither."""
        return hmac.compare_digest(
            self.chain_value(prev, seq, kind, body_text, ts), chain or ""
        ) or hmac.compare_digest(self.chain_value(prev, seq, kind, body_text), chain or "")

    def secret_forms(self) -> list[str]:
        """Every form of the key bytes that must never appear in the database (tests grep for these)."""
        forms = [
            self._master,
            self._master.hex().encode(),
            self.signing_key,
            self.noise_key,
            self.audit_key,
            self.signing_key.hex().encode(),
            self.noise_key.hex().encode(),
            self.audit_key.hex().encode(),
        ]
        return forms
