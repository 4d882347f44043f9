"""A ledger's location (an SQLite file path or a ``postgresql://`` URL): checked, shown and resolved here, once.

A location is not a secret: it travels as a command-line argument (the process list), as the pipeline
components' execution property (stored in the pipeline metadata, MLMD) and to Beam workers, child processes and
serve workers, and it is printed. So a password inside the URL is refused (``check_location``: before anything
is opened, created or charged), by the CLI and the library alike. A PostgreSQL ledger's password comes, as
libpq's does, from (first match):

1. ``$PGPASSWORD``;
2. a password file in libpq's format (lines ``hostname:port:database:username:password``, ``*`` matching anything,
   ``\\:`` and ``\\\\`` escaped, ``#`` comments; the first matching line wins): ``passfile=PATH`` in the URL, else
   ``$PGPASSFILE``, else ``~/.pgpass``. The file must be the owner's alone (mode 0600), as a key file.

Each process that opens the ledger reads it there; only the file's path ever travels with the location.
"""

from __future__ import annotations

import os
import stat
import urllib.parse

from ..errors import LedgerError

POSTGRES_SCHEMES = ("postgresql://", "postgres://")
PASSWORD_SOURCES = (
    "PGPASSWORD=..., or a password file in libpq's format (lines host:port:database:user:password, "
    "mode 0600): ~/.pgpass, PGPASSFILE=PATH, or passfile=PATH in the URL"
)


def is_postgres(location: str | os.PathLike[str]) -> bool:
    """The location is a PostgreSQL URL (else an SQLite file path)."""
    return str(location).startswith(POSTGRES_SCHEMES)


def display(location: str | os.PathLike[str]) -> str:
    """The location as shown in messages: a URL without its user information (``user:password@``)."""
    text = str(location)
    if not is_postgres(text):
        return text
    parsed = urllib.parse.urlsplit(text)
    return parsed._replace(netloc=parsed.netloc.rpartition("@")[2]).geturl()


def check_location(location: object) -> str:
    """``str(location)`` if it names a ledger without a secret in it; LedgerError otherwise (naming the fix): not a
    path or URL, empty, holding a NUL byte (no file has such a name) or a password."""
    if not isinstance(location, (str, os.PathLike)) or not str(location) or "\x00" in str(location):
        raise LedgerError(f"ledger location {location!r} is invalid: give a file path or a postgresql:// URL")
    text = str(location)
    if is_postgres(text):
        parsed = urllib.parse.urlsplit(text)
        if parsed.password is not None or "password" in dict(urllib.parse.parse_qsl(parsed.query)):
            raise LedgerError(
                f"the ledger URL {_redacted(parsed)} holds a password "
                "(in its user information or a password= parameter): a ledger location is "
                "shown in the process list, stored in the pipeline metadata and passed to worker processes. Remove "
                f"it from the URL and give it by {PASSWORD_SOURCES}"
            )
    return text


def _redacted(parsed) -> str:
    """A URL with its password (user information, ``password=`` parameter) shown as ``***``."""
    user = f"{parsed.username}:***@" if parsed.username else ""
    query = urllib.parse.urlencode(
        [(k, "***" if k == "password" else v) for k, v in urllib.parse.parse_qsl(parsed.query)], safe="*/"
    )
    return parsed._replace(netloc=user + parsed.netloc.rpartition("@")[2], query=query).geturl()


def postgres_password(url: str) -> str | None:
    """The password for the PostgreSQL ``url`` (no password in it: ``check_location``): $PGPASSWORD, else the
    first matching line of the password file (passfile=, $PGPASSFILE, ~/.pgpass), else None. LedgerError if a
    password file that is named explicitly is missing, or any password file is readable by others."""
    if os.environ.get("PGPASSWORD"):
        return os.environ["PGPASSWORD"]
    parsed = urllib.parse.urlsplit(url)
    query = dict(urllib.parse.parse_qsl(parsed.query))
    path = query.get("passfile") or os.environ.get("PGPASSFILE")
    explicit = path is not None
    path = os.path.expanduser(path if path is not None else "~/.pgpass")
    key = (
        parsed.hostname or "127.0.0.1",
        str(parsed.port or 5432),
        (parsed.path or "/postgres").lstrip("/") or "postgres",
        urllib.parse.unquote(parsed.username or "postgres"),
    )
    return _password_file_lookup(path, key, explicit)


def _password_file_lookup(path, key, explicit):
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        if explicit:
            raise LedgerError(
                f"the PostgreSQL password file {path} does not exist: create it (mode 0600, lines "
                "host:port:database:user:password) or give another passfile=PATH / PGPASSFILE"
            ) from None
        return None
    except OSError as exc:
        raise LedgerError(f"cannot read the PostgreSQL password file {path}: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise LedgerError(f"the PostgreSQL password file {path} is not a regular file")
        if st.st_mode & 0o077:
            raise LedgerError(
                f"the PostgreSQL password file {path} is readable or writable by group or others (mode "
                f"{stat.S_IMODE(st.st_mode):04o}): refusing to use it. Fix: chmod 600 {path}"
            )
        with os.fdopen(os.dup(fd), encoding="utf-8") as f:
            lines = f.read().splitlines()
    finally:
        os.close(fd)
    for line in lines:
        fields = _password_fields(line)
        if fields is not None and all(f == "*" or f == k for f, k in zip(fields[:4], key)):
            return fields[4]
    return None


def _password_fields(line):
    """The five fields of a password-file line (``\\`` escapes ``:`` and itself), or None (comment, malformed)."""
    if not line.strip() or line.lstrip().startswith("#"):
        return None
    fields, current, escaped = [], [], False
    for char in line:
        if escaped:
            current.append(char)
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == ":" and len(fields) < 4:
            fields.append("".join(current))
            current = []
        else:
            current.append(char)
    fields.append("".join(current))
    return fields if len(fields) == 5 else None
