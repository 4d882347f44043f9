"""A PostgreSQL ledger's password never in argv nor in the pipeline metadata (sage_tfx/privacy/store/location.py,
docs/security.md "The PostgreSQL password").

Before, the password went into the ``--db`` URL: visible in the process list, and stored in MLMD as the components'
``ledger`` execution property (and handed to every worker). Now a URL holding a password is refused (exit 2 /
LedgerError, before anything is created, connected or charged) and the password comes from ``$PGPASSWORD`` or a
libpq password file (``passfile=PATH``, ``$PGPASSFILE``, ``~/.pgpass``). On the suite's real PostgreSQL server, with
a role that must authenticate (scram-sha-256; the server's other roles are trusted)."""

import os
import secrets
import subprocess
import sys
import threading
import time

import pytest

from sage_tfx.privacy import Ledger, LedgerError
from sage_tfx.privacy.store.location import check_location, postgres_password
from tests.conftest import run_sql

USER = "sage_pw"
PASSWORD = "s3:cr\\et-" + secrets.token_hex(8)  # a ':' and a '\\': escaped in a password file, as libpq reads it
ESCAPED = PASSWORD.replace("\\", "\\\\").replace(":", "\\:")


@pytest.fixture
def no_password_source(monkeypatch, tmp_path):
    """No PGPASSWORD, no PGPASSFILE, and a HOME without a .pgpass."""
    for name in ("PGPASSWORD", "PGPASSFILE"):
        monkeypatch.delenv(name, raising=False)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    return home


@pytest.fixture(scope="module")
def password_role(postgres_server):
    """``USER`` logs in with ``PASSWORD`` only (pg_hba.conf: scram-sha-256 for it, checked first)."""
    admin = postgres_server.url()
    run_sql(
        admin,
        f"DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{USER}') THEN "
        f"CREATE ROLE {USER} LOGIN SUPERUSER; END IF; END $$",
    )
    run_sql(admin, f"ALTER ROLE {USER} PASSWORD '{PASSWORD}'")
    hba = os.path.join(postgres_server.datadir, "pg_hba.conf")
    with open(hba) as f:
        original = f.read()
    with open(hba, "w") as f:
        f.write(f"host all {USER} 127.0.0.1/32 scram-sha-256\n{original}")
    postgres_server._run("pg_ctl", "-D", postgres_server.datadir, "reload")
    time.sleep(1.0)  # the postmaster rereads pg_hba.conf on SIGHUP
    try:
        yield
    finally:
        with open(hba, "w") as f:
            f.write(original)
        postgres_server._run("pg_ctl", "-D", postgres_server.datadir, "reload")


def _url(postgres_server, query="sslmode=disable"):
    """A fresh database's URL for ``USER``, without a password."""
    return postgres_server.new_database("pw").replace("postgres@", f"{USER}@").split("?")[0] + f"?{query}"


def _password_file(path, *lines):
    path.write_text("".join(f"{line}\n" for line in lines))
    path.chmod(0o600)
    return path


def _with_password(url):
    return url.replace(f"{USER}@", f"{USER}:{PASSWORD.replace(':', '%3A').replace(chr(92), '%5C')}@")


@pytest.mark.postgres
def test_the_password_comes_from_pgpassword_or_a_password_file(
    postgres_server, password_role, no_password_source, tmp_path, monkeypatch
):
    monkeypatch.setenv("SAGE_KEY_FILE", str(tmp_path / "ledger.key"))
    url = _url(postgres_server)
    port, database = url.split(":")[2].split("/")[0], url.split("/")[-1].split("?")[0]
    with pytest.raises(LedgerError, match="cannot connect") as caught:  # the server asks for it: none is given
        Ledger.open(url, create=True)
    assert "password" in str(caught.value)
    assert not os.path.exists(os.environ["SAGE_KEY_FILE"])  # the key made for it undone

    monkeypatch.setenv("PGPASSWORD", PASSWORD)
    with Ledger.open(url, create=True) as ledger:
        ledger.create_stream("s", 1.0, 1e-6)
    monkeypatch.delenv("PGPASSWORD")

    # libpq's password file: comments, a line for another database first, then wildcards; the first match wins
    lines = [
        "# host:port:database:user:password",
        f"127.0.0.1:{port}:other:{USER}:wrong",
        f"*:{port}:*:{USER}:{ESCAPED}",
    ]
    pgpass = _password_file(no_password_source / ".pgpass", *lines)
    with Ledger.open(url) as ledger:  # ~/.pgpass
        assert ledger.stream("s").epsilon == 1.0
    pgpass.unlink()
    named = _password_file(tmp_path / "named.pgpass", *lines)
    monkeypatch.setenv("PGPASSFILE", str(named))
    with Ledger.open(url) as ledger:  # $PGPASSFILE
        assert ledger.streams()
    wrong = _password_file(tmp_path / "wrong.pgpass", f"*:*:{database}:{USER}:wrong")
    monkeypatch.setenv("PGPASSFILE", str(wrong))
    with Ledger.open(f"{url}&passfile={named}") as ledger:  # passfile= in the URL comes before $PGPASSFILE
        assert ledger.streams()
    with pytest.raises(LedgerError, match="cannot connect"):
        Ledger.open(url)  # $PGPASSFILE's wrong password reaches the server, which refuses it

    named.chmod(0o644)
    with pytest.raises(LedgerError, match=f"mode 0644.*chmod 600 {named}"):
        Ledger.open(f"{url}&passfile={named}")
    with pytest.raises(LedgerError, match="does not exist"):
        Ledger.open(f"{url}&passfile={tmp_path / 'missing'}")


def test_a_password_file_line_is_read_as_libpq_reads_it(tmp_path, no_password_source):
    """Escaped ':' and '\\', '*' in any of the first four fields, comments skipped, the first match wins."""
    url = "postgresql://u@db.example:6543/ledger"
    path = _password_file(
        tmp_path / "p",
        "# comment",
        "db.example:6543:other:u:no",
        "db.example:*:ledger:v:no",
        f"db.example:6543:*:u:{ESCAPED}",
        "*:*:*:*:later",
    )
    assert postgres_password(f"{url}?passfile={path}") == PASSWORD
    assert postgres_password(f"postgresql://w@h/x?passfile={path}") == "later"
    assert postgres_password("postgresql://u@db.example:6543/ledger") is None  # no ~/.pgpass, no PGPASSWORD


def _refused_at_argv(out, secret):
    assert out.returncode == 2, out.stdout + out.stderr
    assert "holds a password" in out.stderr and "PGPASSWORD" in out.stderr and "~/.pgpass" in out.stderr, out.stderr
    assert secret not in out.stdout + out.stderr and "Traceback" not in out.stderr


@pytest.mark.postgres
def test_a_password_in_the_url_is_refused_before_anything_changes(
    postgres_server, password_role, tmp_path, monkeypatch
):
    """`sage ledger init`, `sage run` and the library API (Ledger.open, a component's spec) refuse the URL, never
    echo the password, and create, connect and charge nothing."""
    url = _url(postgres_server)
    secret_url = _with_password(url)
    key = tmp_path / "ledger.key"
    sage = [sys.executable, "-m", "sage_tfx"]
    out = subprocess.run(
        [
            *sage,
            "ledger",
            "init",
            "--db",
            secret_url,
            "--key-file",
            key,
            "--stream",
            "s",
            "--epsilon",
            "1",
            "--delta",
            "1e-6",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    _refused_at_argv(out, PASSWORD)
    assert not key.exists()
    admin = url.replace(f"{USER}@", "postgres@")
    assert run_sql(admin, "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public'") == [(0,)]

    monkeypatch.setenv("PGPASSWORD", PASSWORD)
    with Ledger.open(url, create=True, key_file=key) as ledger:
        ledger.create_stream("s", 1.0, 1e-6)
        ledger.add_block("s", "b0", shard=0, rows=10)
        before = ledger.log_entries()
    monkeypatch.delenv("PGPASSWORD")
    work = tmp_path / "work"
    out = subprocess.run(
        [
            *sage,
            "run",
            "taxi_regression",
            "--db",
            secret_url,
            "--key-file",
            key,
            "--stream",
            "s",
            "--data-root",
            tmp_path,
            "--target",
            "1000",
            "--work-dir",
            work,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    _refused_at_argv(out, PASSWORD)
    assert not work.exists()
    for bad in (secret_url, f"{url}&password={secrets.token_hex(4)}"):
        with pytest.raises(LedgerError, match="holds a password") as caught:
            Ledger.open(bad, key_file=key)
        assert PASSWORD not in str(caught.value)
        with pytest.raises(LedgerError, match="holds a password"):
            check_location(bad)  # what a component's spec runs on its ledger argument (components/_spec.py)
    monkeypatch.setenv("PGPASSWORD", PASSWORD)
    with Ledger.open(url, key_file=key) as ledger:
        assert ledger.log_entries() == before


@pytest.mark.postgres
@pytest.mark.tf
def test_a_component_built_with_a_password_in_its_ledger_url_is_refused():
    """The location is a component's execution property, stored in MLMD: refused as the component is built."""
    from sage_tfx.components._spec import grant_parameters

    with pytest.raises(LedgerError, match="holds a password"):
        grant_parameters(None, "postgresql://u:topsecret@127.0.0.1/sage")
    assert grant_parameters(None, "postgresql://u@127.0.0.1/sage")["ledger"] == "postgresql://u@127.0.0.1/sage"


def _watch_processes(root_pid, seen, stop):
    """Record the argv and environment of ``root_pid`` and its descendants until ``stop`` is set."""
    while not stop.is_set():
        parents = {}
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/stat") as f:
                    parents[int(pid)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
        family, grew = {root_pid}, True
        while grew:
            grew = False
            for pid, parent in parents.items():
                if parent in family and pid not in family:
                    family.add(pid)
                    grew = True
        for pid in family:
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    argv = f.read()
                with open(f"/proc/{pid}/environ", "rb") as f:
                    environ = f.read()
            except OSError:
                continue
            if argv:
                seen[pid] = (argv, environ)
        time.sleep(0.05)


@pytest.mark.postgres
@pytest.mark.slow
@pytest.mark.tf
def test_a_run_on_postgresql_keeps_the_password_out_of_argv_and_the_pipeline_metadata(
    postgres_server, password_role, no_password_source, tmp_path, monkeypatch
):
    """A real `sage run` iteration (TFX on Beam) on a PostgreSQL ledger whose role needs a password, given by a
    password file: the run is granted and audited, the pipeline metadata (MLMD) records the ledger's location, and
    neither MLMD nor any file of the work dir, nor the argv or environment of the run and of every process it
    started (read from /proc while it ran), holds the password."""
    from ml_metadata.metadata_store import metadata_store

    from sage_tfx.pipelines._runner import metadata_config

    pgpass = _password_file(tmp_path / "ledger.pgpass", f"*:*:*:{USER}:{ESCAPED}")
    url = _url(postgres_server, f"sslmode=disable&passfile={pgpass}")
    key = tmp_path / "ledger.key"
    monkeypatch.setenv("SAGE_KEY_FILE", str(key))
    with Ledger.open(url, create=True):
        pass
    _, data = replay_taxi_days_on(url, tmp_path, 40)
    work = tmp_path / "work"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sage_tfx",
            "run",
            "taxi_regression",
            "--db",
            url,
            "--stream",
            "taxi",
            "--data-root",
            str(data),
            "--target",
            "100000",
            "--max-iterations",
            "1",
            "--min-window",
            "32",
            "--rejection-share",
            "0",
            "--runner",
            "beam",
            "--work-dir",
            str(work),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    seen, stop = {}, threading.Event()
    watcher = threading.Thread(target=_watch_processes, args=(proc.pid, seen, stop), daemon=True)
    watcher.start()
    try:
        stdout, stderr = proc.communicate(timeout=1500)
    finally:
        stop.set()
        watcher.join()
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 5, stdout + stderr[-3000:]  # RETRY, then TIMEOUT: the iteration ran under its grant
    with Ledger.open(url) as ledger:
        assert len(ledger.grants("taxi")) == 1 and ledger.audit().ok

    secret = PASSWORD.encode()
    assert seen and proc.pid in seen
    for pid, (argv, environ) in seen.items():
        assert secret not in argv and secret not in environ, (pid, argv)
    metadata = work / "tfx" / "taxi_regression" / "metadata.sqlite"
    store = metadata_store.MetadataStore(metadata_config(str(metadata)))
    ledgers = {e.properties["ledger"].string_value for e in store.get_executions() if "ledger" in e.properties}
    ledgers |= {
        e.custom_properties["ledger"].string_value for e in store.get_executions() if "ledger" in e.custom_properties
    }
    from sage_tfx.components._grant_channel import ADDRESS

    # the components reach the ledger through the launcher's grant server: its address is all MLMD holds
    assert ledgers == {ADDRESS}, ledgers
    for folder, _, files in os.walk(work):
        for name in files:
            with open(os.path.join(folder, name), "rb") as f:
                assert secret not in f.read(), os.path.join(folder, name)


def replay_taxi_days_on(url, tmp_path, days):
    """``days`` real taxi days as daily blocks of stream "taxi" (epsilon 1) on the ledger at ``url``."""
    from sage_tfx.data.taxi import TIME_COLUMN, taxi_csv_path
    from sage_tfx.ingest.replay import Replay

    data = tmp_path / "data"
    with Ledger.open(url) as ledger:
        ledger.create_stream("taxi", 1.0, 1e-6)
        Replay.from_file(ledger, "taxi", str(data), taxi_csv_path("simple"), TIME_COLUMN, "1d").run(steps=days)
    return url, data
