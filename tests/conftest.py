"""Shared test fixtures.

PostgreSQL: ``postgres_server`` (session) starts a REAL server from Debian's
``postgresql`` package in a temporary data directory, listening only on
127.0.0.1 on a free port, and stops it at the end of the session.
``postgres_url`` gives each test a fresh, empty database on it. Without the
binaries the PostgreSQL tests skip, except under CI (env var ``CI`` set), where
they fail: CI must run them (``.ci/run`` installs the package).

``ledger_url`` runs the same test on both ledger backends: a fresh SQLite file
path, then a fresh PostgreSQL database URL. ``raw_sql`` edits or reads a ledger
behind its back (tamper tests, table dumps) on either backend.
"""

import glob
import os
import shutil
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid

import pytest


def pytest_configure(config):
    """Let the suite's Python processes write and reuse bytecode caches (``__pycache__``), even when the shell
    sets PYTHONDONTWRITEBYTECODE (the shells on the development machine do, and the Makefile's `uv pip install`
    compiles none).

    Without them every process that imports TensorFlow, TFX and Beam compiles their sources again, about 15 s of
    CPU each (`python -c "import tensorflow, tfx.components, apache_beam, tensorflow_transform,
    tensorflow_model_analysis"`: 22-23 s user without caches, 8.3 s with; one `sage run taxi_regression`
    iteration: 32 s user without, 17 s with), and the suite starts many: both xdist workers, every `sage run` and
    `sage serve` subprocess, serve's worker processes, Beam's multi-processing and portable workers. Done here,
    before xdist starts its workers, so that they and every subprocess inherit it; what runs is the same code
    (a cache is used only while its source file's size and mtime match)."""
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    sys.dont_write_bytecode = False


def _postgres_bindir():
    """The newest /usr/lib/postgresql/<version>/bin holding initdb and pg_ctl, or None."""
    found = []
    for initdb in glob.glob("/usr/lib/postgresql/*/bin/initdb"):
        bindir = os.path.dirname(initdb)
        version = os.path.basename(os.path.dirname(bindir))
        if os.path.exists(os.path.join(bindir, "pg_ctl")):
            try:
                found.append((float(version), bindir))
            except ValueError:
                continue
    return max(found)[1] if found else None


def _free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PostgresServer:
    """A throw-away PostgreSQL server. ``new_database()`` returns the URL of a fresh empty database."""

    def __init__(self, bindir):
        self.bindir = bindir
        self.root = tempfile.mkdtemp(prefix="sage-pg-")
        self.datadir = os.path.join(self.root, "data")
        self.logfile = os.path.join(self.root, "server.log")
        self.port = None
        self.ssl_ca = None  # the self-signed certificate (PEM path) the server offers TLS with, if openssl made one
        # initdb and pg_ctl refuse to run as root: run them as the `postgres` system user.
        self._as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if self._as_user:
            shutil.chown(self.root, user="postgres", group="postgres")

    def _run(self, tool, *args, timeout=120):
        cmd = [*self._as_user, os.path.join(self.bindir, tool), *args]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if out.returncode != 0:
            log = ""
            if os.path.exists(self.logfile):
                with open(self.logfile) as f:
                    log = f.read()[-3000:]
            raise RuntimeError(f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stdout}\n{out.stderr}\n{log}")
        return out

    def start(self):
        self._run(
            "initdb",
            "-D",
            self.datadir,
            "--auth=trust",
            "--username=postgres",
            "--encoding=UTF8",
            "--no-sync",
            "--no-instructions",
        )
        # fsync=off: the tests kill CLIENTS (SIGKILL), never the server, so a committed
        # transaction is durable to them without flushing; it saves minutes of fsyncs.
        options = " ".join(
            [
                "-c listen_addresses=127.0.0.1",
                f"-c unix_socket_directories={self.root}",
                "-c max_connections=200",
                "-c fsync=off",
                "-c full_page_writes=off",
                "-c shared_buffers=64MB",
            ]
            + self._ssl_options()
        )
        for attempt in range(5):  # another process may grab the free port between probe and bind
            self.port = _free_port()
            try:
                self._run(
                    "pg_ctl",
                    "-D",
                    self.datadir,
                    "-l",
                    self.logfile,
                    "-w",
                    "-t",
                    "60",
                    "-o",
                    f"-p {self.port} {options}",
                    "start",
                )
                return self
            except RuntimeError:
                if attempt == 4:
                    raise
                time.sleep(0.5)
        return self

    def _ssl_options(self):
        """TLS with a fresh self-signed certificate for 127.0.0.1 (plain connections stay allowed), if openssl is
        installed; else none (the TLS tests then skip)."""
        crt, key = os.path.join(self.root, "server.crt"), os.path.join(self.root, "server.key")
        try:
            subprocess.run(
                [
                    "openssl",
                    "req",
                    "-x509",
                    "-newkey",
                    "rsa:2048",
                    "-nodes",
                    "-keyout",
                    key,
                    "-out",
                    crt,
                    "-days",
                    "2",
                    "-subj",
                    "/CN=127.0.0.1",
                    "-addext",
                    "subjectAltName=IP:127.0.0.1",
                ],
                check=True,
                capture_output=True,
                timeout=60,
            )
        except (OSError, subprocess.SubprocessError):
            return []
        os.chmod(key, 0o600)
        if self._as_user:
            for path in (crt, key):
                shutil.chown(path, user="postgres", group="postgres")
        self.ssl_ca = crt
        return ["-c ssl=on", f"-c ssl_cert_file={crt}", f"-c ssl_key_file={key}"]

    def stop(self):
        try:
            if self.port is not None:
                self._run("pg_ctl", "-D", self.datadir, "-m", "immediate", "-w", "stop", timeout=60)
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    def url(self, database="postgres", query="sslmode=disable"):
        """A ledger URL. sslmode=disable: the ledger's default is verified TLS, and the tests' loopback server
        has only a self-signed certificate (``ssl_ca``; tests/privacy/test_postgres_tls.py checks TLS itself)."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}" + (f"?{query}" if query else "")

    def new_database(self, prefix="t"):
        import pg8000.dbapi

        name = f"{prefix}_{uuid.uuid4().hex[:16]}"
        conn = pg8000.dbapi.connect(user="postgres", host="127.0.0.1", port=self.port, database="postgres")
        try:
            conn.autocommit = True
            conn.cursor().execute(f'CREATE DATABASE "{name}"')
        finally:
            conn.close()
        return self.url(name)


def replay_taxi_days(root, days, *, extra_streams=()):
    """A ledger (root/ledger.db, epsilon 1, delta 1e-6) and data root (root/data) holding the first ``days``
    real taxi days of stream "taxi" as daily blocks, replayed here; ``extra_streams`` are created empty."""
    from sage_tfx.data.taxi import TIME_COLUMN, taxi_csv_path
    from sage_tfx.ingest.replay import Replay
    from sage_tfx.privacy import Ledger

    db, data = root / "ledger.db", root / "data"
    with Ledger.open(db, create=True) as ledger:
        for stream in ("taxi", *extra_streams):
            ledger.create_stream(stream, 1.0, 1e-6)
        Replay.from_file(ledger, "taxi", str(data), taxi_csv_path("simple"), TIME_COLUMN, "1d").run(steps=days)
    return db, data


@pytest.fixture(scope="session")
def taxi_stream_300(tmp_path_factory):
    """A ledger and data root holding the first 300 real taxi days (about 3,000 trips) as daily blocks of stream
    "taxi", plus an empty stream "empty": replayed once per test process (pytest-xdist worker), shared by the
    modules whose `sage run` tests start from it (tests/pipelines/test_sage_run.py, test_url_pipeline_root.py,
    test_runners.py). Read only: a test that spends budget copies the ledger and its key file first; one that
    writes into the data root copies it (shutil.copytree)."""
    return replay_taxi_days(tmp_path_factory.mktemp("taxi_stream_300"), 300, extra_streams=("empty",))


@pytest.fixture(scope="session")
def postgres_server():
    """A real PostgreSQL server for the whole session (skips without the binaries, unless CI is set)."""
    bindir = _postgres_bindir()
    if bindir is None:
        reason = (
            "PostgreSQL binaries not found under /usr/lib/postgresql/*/bin "
            "(install Debian's `postgresql` package; .ci/run does)"
        )
        if os.environ.get("CI"):
            pytest.fail(f"CI is set but {reason}", pytrace=False)
        pytest.skip(reason)
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        pytest.fail("running as root needs `runuser` to start PostgreSQL as the postgres user", pytrace=False)
    server = PostgresServer(bindir).start()
    try:
        yield server
    finally:
        server.stop()


def _postgres_key_file(tmp_path, monkeypatch):
    """A PostgreSQL ledger has no default key file: each test's is SAGE_KEY_FILE (docs/security.md)."""
    monkeypatch.setenv("SAGE_KEY_FILE", str(tmp_path / "pg_ledger.key"))


@pytest.fixture
def postgres_url(postgres_server, tmp_path, monkeypatch):
    """URL of a fresh, empty PostgreSQL database (one per test); its key file is $SAGE_KEY_FILE in tmp_path."""
    _postgres_key_file(tmp_path, monkeypatch)
    return postgres_server.new_database()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def ledger_url(request, tmp_path, monkeypatch):
    """A fresh ledger location on each backend: an SQLite file path, then a PostgreSQL database URL (its key
    file: $SAGE_KEY_FILE in tmp_path)."""
    if request.param == "sqlite":
        return str(tmp_path / "ledger.db")
    _postgres_key_file(tmp_path, monkeypatch)
    return request.getfixturevalue("postgres_server").new_database()


def raw_connection(location):
    """A plain DB-API connection to a ledger location (SQLite path or PostgreSQL URL), behind the ledger's back."""
    if str(location).startswith(("postgresql://", "postgres://")):
        import urllib.parse

        import pg8000.dbapi

        u = urllib.parse.urlparse(str(location))
        return pg8000.dbapi.connect(
            user=u.username or "postgres", host=u.hostname, port=u.port, database=u.path.lstrip("/")
        )

    return sqlite3.connect(str(location))


def run_sql(location, sql, params=(), conn=None):
    """Run one SQL statement on a ledger location directly (committed); return the fetched rows, if any.

    Write SQL with ``?`` placeholders; they become ``%s`` for PostgreSQL. Pass ``conn``
    (from ``raw_connection``) to reuse one connection for many statements.
    """
    own = conn is None
    conn = raw_connection(location) if own else conn
    if str(location).startswith(("postgresql://", "postgres://")):
        sql = sql.replace("?", "%s")
    try:
        cur = conn.cursor()
        cur.execute(sql, tuple(params))
        rows = cur.fetchall() if cur.description else []
        conn.commit()
        return [tuple(r) for r in rows]
    finally:
        if own:
            conn.close()


@pytest.fixture
def raw_sql():
    """``raw_sql(location, sql, params=())``: SQL on a ledger behind its back, on either backend."""
    return run_sql


SLOW_WEIGHT = 60  # a slow test counts as 60 fast ones (CI: slow tests take 30-190 s, most others well under 1 s)
# unless it states a lighter weight, e.g. a Monte Carlo check of 5-25 s: @pytest.mark.slow(weight=20)


def _weight(item):
    marker = item.get_closest_marker("slow")
    return 1 if marker is None else marker.kwargs.get("weight", SLOW_WEIGHT)


def pytest_collection_modifyitems(session, config, items):
    """Order modules for `make test`'s ``-n 2 --dist worksteal``: each worker's first range starts with slow modules.

    worksteal gives each worker one contiguous range of the collection and lets an idle worker steal from the TAIL
    of another's queue, so a slow test at the end of a range runs last and stretches the run. Modules stay whole
    (module fixtures are set up once) and keep their order inside; the slow modules are shared out between the
    workers by weight, the fast ones fill the ranges to equal length, and each range runs its slowest modules
    first. Deterministic (every worker computes the same order, as xdist requires); with one process it only
    moves slow modules first.
    """
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    modules = {}
    for item in items:
        modules.setdefault(item.nodeid.split("::")[0], []).append(item)
    weight = {m: sum(_weight(it) for it in its) for m, its in modules.items()}
    piles = [[] for _ in range(workers)]
    loads = [0] * workers
    for m in sorted(modules, key=lambda m: (-weight[m], m)):  # heaviest first, each to the lightest pile
        i = (
            min(range(workers), key=lambda i: (loads[i], i))
            if weight[m] >= SLOW_WEIGHT
            else min(range(workers), key=lambda i: (sum(len(modules[x]) for x in piles[i]), i))
        )
        piles[i].append(m)
        loads[i] += weight[m]
    # Each range at least as long as xdist's split (len // workers per worker, in order), so that no pile's
    # slowest module lands at the tail of the range before it: move the earliest fast modules forwards if short.
    share = len(items) // workers
    for i in range(workers - 1):
        while sum(len(modules[x]) for x in piles[i]) < share:
            later = [(j, m) for j in range(i + 1, workers) for m in piles[j] if weight[m] < SLOW_WEIGHT]
            if not later:
                break
            j, m = later[-1]
            piles[j].remove(m)
            piles[i].append(m)
    order = [m for pile in piles for m in sorted(pile, key=lambda m: -weight[m])]
    items[:] = [it for m in order for it in modules[m]]
