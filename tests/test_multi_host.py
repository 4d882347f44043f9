"""Several hosts, one stream (issue 12 part 3; docs/scale_out.md, "Several hosts on one PostgreSQL ledger").

Two `sage serve` processes, "host A" and "host B", share nothing but a PostgreSQL ledger's URL, the ledger's
key file (each host holds its own copy, as a key distributed to two machines) and the data root (a shared
filesystem). Each has its own work folder (TFX pipeline root and MLMD), serves two pipelines of its own, and
replays the same input into the one stream: whichever host commits a window first registers its block, the
other finds it registered. They run at the same time; the ledger decides every charge.
"""
import json
import os
import shutil
import subprocess
import sys
import threading
import time

import pytest

from sage_tfx.privacy import Ledger

PY = sys.executable
HOSTS = {"A": ("a-easy", "a-hard"), "B": ("b-easy", "b-hard")}
TARGETS = {"easy": 3000000, "hard": 100000}  # MSE in s^2: ACCEPT at the first iteration; out of reach (TIMEOUT)


def sage(*args, env=None, timeout=300):
    return subprocess.run([PY, "-m", "sage_tfx", *map(str, args)], capture_output=True, text=True, timeout=timeout,
                          env=env)


def _host_env(host_root):
    """A host's environment: no SAGE_KEY_FILE of the test session (each host passes its own --key-file)."""
    env = {k: v for k, v in os.environ.items() if k != "SAGE_KEY_FILE"}
    env["TMPDIR"] = str(host_root / "tmp")
    os.makedirs(env["TMPDIR"], exist_ok=True)
    return env


class Host:
    """One `sage serve` process with its own folder: key file copy, work dir (pipeline root, MLMD), TMPDIR."""

    def __init__(self, name, root, url, key_file, data, csv):
        self.name, self.root, self.url = name, root, url
        root.mkdir(mode=0o700)
        self.key_file = root / "ledger.key"
        shutil.copy2(key_file, self.key_file)  # "distributed securely": mode 0600 kept
        self.work = root / "work"
        pipelines = []
        for pipeline in HOSTS[name]:
            pipelines += ["--pipeline", f"{pipeline}=taxi_regression:{TARGETS[pipeline.split('-')[1]]}"]
        self.argv = [PY, "-m", "sage_tfx", "serve", "--db", url, "--key-file", self.key_file, "--stream", "taxi",
                     "--data-root", data, "--input", csv, "--time-column", "trip_start_timestamp", "--window", "1d",
                     "--initial-blocks", "0", "--blocks-per-step", "256", *pipelines, "--max-iterations", "1",
                     "--rejection-share", "0", "--work-dir", self.work]
        self.lines, self.proc, self.started, self.ended = [], None, None, None

    def start(self):
        self.started = time.time()
        self.proc = subprocess.Popen([str(a) for a in self.argv], cwd=self.root, env=_host_env(self.root),
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait(self, timeout):
        try:
            code = self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
        self.ended = time.time()
        self.reader.join(timeout=30)
        return code

    @property
    def output(self):
        return "\n".join(self.lines)


def _tfx_spans(host, name):
    """[(create, last update)] of the pipeline's TFX executions in this host's own MLMD, in seconds."""
    from ml_metadata.metadata_store import metadata_store

    from sage_tfx.pipelines._runner import metadata_config

    path = host.work / "tfx" / name / "metadata.sqlite"
    assert path.exists(), f"{name}'s MLMD is not in host {host.name}'s work dir {host.work}"
    store = metadata_store.MetadataStore(metadata_config(str(path)))
    runs = store.get_executions()
    assert runs, name
    return (min(e.create_time_since_epoch for e in runs) / 1000, max(e.last_update_time_since_epoch for e in runs) / 1000)


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.tf
def test_two_hosts_serve_two_pipelines_each_on_one_postgres_ledger(postgres_server, raw_sql, tmp_path):
    from sage_tfx.data.taxi import taxi_csv_path
    from sage_tfx.privacy.audit import audit_ledger

    url = postgres_server.new_database("hosts")
    keys = tmp_path / "keys"
    keys.mkdir(mode=0o700)
    key_file = keys / "ledger.key"
    init = sage("ledger", "init", "--db", url, "--key-file", key_file, "--stream", "taxi", "--epsilon", "1",
                "--delta", "1e-6", env=_host_env(tmp_path))
    assert init.returncode == 0, init.stderr
    data = tmp_path / "shared" / "data"  # the data root both hosts mount
    data.parent.mkdir()
    csv = taxi_csv_path("simple")
    hosts = {name: Host(name, tmp_path / f"host{name}", url, key_file, data, csv) for name in HOSTS}
    for host in hosts.values():
        host.start()
    codes = {name: host.wait(timeout=1200) for name, host in hosts.items()}
    for name, host in hosts.items():
        assert codes[name] == 0, f"host {name}:\n{host.output}"
        assert "audit: OK" in host.output, host.output
        for pipeline in HOSTS[name]:
            assert f"{pipeline}: " in host.output, host.output

    names = [p for ps in HOSTS.values() for p in ps]
    with Ledger.open(url, key_file=key_file) as ledger:
        # Every pipeline reached an outcome the ledger recorded, and each of its grants has one.
        status = {p["name"]: p for p in ledger.pipelines("taxi")}
        assert sorted(status) == sorted(names), status
        for name in names:
            assert status[name]["state"] == "done" and status[name]["outcome"] in ("ACCEPT", "REJECT", "TIMEOUT"), \
                status[name]
            history = ledger.history("taxi", name)
            assert history, f"{name} was never granted anything"
            assert all(outcome in ("ACCEPT", "REJECT", "RETRY") for _g, outcome, _d in history), (name, history)
        assert status["a-easy"]["outcome"] == status["b-easy"]["outcome"] == "ACCEPT", status
        # The audit passes, from Python and from the CLI (with another copy of the key: its head file is behind).
        report = audit_ledger(ledger)
        assert report.ok, report.problems
        # No block over its budget, through the public API.
        stream = ledger.stream("taxi")
        blocks = {b.id: b for b in ledger.blocks("taxi")}
        assert blocks
        for b in blocks.values():
            assert b.spent[0] <= stream.epsilon + 1e-9 and b.spent[1] <= stream.delta + 1e-15, (b.id, b.spent)
        grants = ledger.grants("taxi")
    audit = sage("ledger", "audit", "--db", url, "--key-file", key_file, env=_host_env(tmp_path))
    assert audit.returncode == 0, audit.stdout + audit.stderr

    # Independently of the ledger's code: the charges summed in SQL, per block, against the capacity.
    charged = dict(raw_sql(url, "SELECT b.value, sum((g.body::json->>'epsilon')::float8) FROM grants g, "
                             "json_array_elements_text(g.body::json->'blocks') b GROUP BY b.value"))
    capacity = raw_sql(url, "SELECT epsilon FROM streams WHERE name = 'taxi'")[0][0]
    assert charged and max(charged.values()) <= capacity + 1e-9, max(charged.values())
    spent = {b: json.loads(s)[0] for b, s in raw_sql(url, "SELECT id, spent FROM blocks WHERE stream = 'taxi'")}
    # Each grant charged exactly once: one log entry per grant, and each block's spent is the sum of its grants.
    logged = [json.loads(body)["id"] for (body,) in raw_sql(url, "SELECT body FROM log WHERE kind = 'grant'")]
    assert sorted(logged) == sorted(g.id for g in grants) and len(set(logged)) == len(logged), logged
    for block, eps in spent.items():
        assert eps == pytest.approx(charged.get(block, 0.0), abs=1e-12), block
    assert len(grants) == len(names)  # --max-iterations 1: one grant per pipeline, no second charge anywhere

    # Each host ran its own pipelines in its own work dir, and the two hosts ran at the same time.
    for name, host in hosts.items():
        assert sorted(os.listdir(host.work / "tfx")) == sorted(HOSTS[name]), os.listdir(host.work / "tfx")
    spans = {name: [_tfx_spans(host, p) for p in HOSTS[name]] for name, host in hosts.items()}
    overlap = max(min(a[1], b[1]) - max(a[0], b[0]) for a in spans["A"] for b in spans["B"])
    shortest = min(end - start for s in spans.values() for start, end in s)
    assert overlap > 0.5 * shortest, spans
    print({name: round(host.ended - host.started, 1) for name, host in hosts.items()}, spans)


_WRITER = """
import sys, time
from sage_tfx.privacy import Ledger
url, key_file, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
with Ledger.open(url, key_file=key_file) as ledger:
    end, i = time.time() + seconds, 0
    print("writing", flush=True)
    while time.time() < end:  # every kind of write another host makes: blocks, pipelines, grants, outcomes
        i += 1
        ledger.add_block("s", f"w{i}", start=1e9 + i * 86400, end=1e9 + (i + 1) * 86400, rows=10)
        ledger.register("s", f"p{i}")
        grant = ledger.request(f"p{i}", "s", blocks=[f"w{i}"], epsilon=0.01)
        ledger.record_outcome(grant.id, "RETRY")
        ledger.finish("s", f"p{i}", "TIMEOUT")
    print(i, flush=True)
"""


@pytest.mark.postgres
@pytest.mark.parametrize("own_key_copy", [True, False], ids=["another-host", "same-host"])
def test_audit_of_a_ledger_another_process_is_writing(postgres_server, tmp_path, own_key_copy):
    """The audit reads the log and every table in ONE snapshot (and the head file before it): an audit while
    another host (its own key file copy, its own head) or another process of this host (the same head file)
    writes passes. Before, the log was read in one transaction and the tables in another, each statement of
    PostgreSQL's READ COMMITTED seeing a newer state: a write in between was reported as tampering."""
    from sage_tfx.privacy.audit import audit_ledger

    url = postgres_server.new_database("audit")
    key_file = tmp_path / "ledger.key"
    with Ledger.open(url, create=True, key_file=key_file) as ledger:
        ledger.create_stream("s", 1.0, 1e-6)
    writer_key = key_file
    if own_key_copy:
        writer_key = tmp_path / "other" / "ledger.key"
        writer_key.parent.mkdir(mode=0o700)
        shutil.copy2(key_file, writer_key)
    env = {k: v for k, v in os.environ.items() if k != "SAGE_KEY_FILE"}
    writer = subprocess.Popen([PY, "-c", _WRITER, url, str(writer_key), "6"], stdout=subprocess.PIPE, text=True,
                              env=env)
    try:
        assert writer.stdout.readline().strip() == "writing"
        audits, problems = 0, []
        with Ledger.open(url, key_file=key_file) as ledger:
            while writer.poll() is None:
                report = audit_ledger(ledger)
                audits += 1
                problems += report.problems
        writes = int(writer.stdout.read().strip())
    finally:
        if writer.poll() is None:
            writer.kill()
        writer.wait()
    assert writer.returncode == 0
    assert writes >= 5 and audits >= 3, (writes, audits)  # the audits really ran while the writes went on
    assert problems == [], problems[:5]


_HOLDER = """
import sys, time
from sage_tfx.privacy import Ledger
ledger = Ledger.open(sys.argv[1], key_file=sys.argv[2])
ledger.claim("s", ["p"])
print("held", flush=True)
time.sleep(600)
"""


def _hold_claim(location, key_file):
    """A process (another 'host') that claims pipeline 'p' of stream 's' and holds it until killed."""
    env = {k: v for k, v in os.environ.items() if k != "SAGE_KEY_FILE"}
    holder = subprocess.Popen([PY, "-c", _HOLDER, str(location), str(key_file)], stdout=subprocess.PIPE, text=True,
                              env=env)
    assert holder.stdout.readline().strip() == "held"
    return holder


def _claim_eventually(ledger, names, seconds=30):
    """The claim once the server has seen the holder's connection drop (PostgreSQL: at once, or nearly)."""
    from sage_tfx.privacy import PipelineBusy

    deadline = time.monotonic() + seconds
    while True:
        try:
            return ledger.claim("s", names)
        except PipelineBusy:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def test_one_process_runs_a_pipeline_name_at_a_time(ledger_url, tmp_path):
    """Two serve/run processes (two hosts on one PostgreSQL ledger) running the same pipeline name would charge
    grants for its iterations side by side and resume each other's unfinished grant: the second is refused,
    naming the pipeline and the holder, until the holder's process ends (killed: its name is free again)."""
    from sage_tfx.privacy import PipelineBusy

    key_file = os.environ.get("SAGE_KEY_FILE") or f"{ledger_url}.key"
    with Ledger.open(ledger_url, create=True, key_file=key_file) as ledger:
        ledger.create_stream("s", 1.0, 1e-6)
    holder = _hold_claim(ledger_url, key_file)
    try:
        with Ledger.open(ledger_url, key_file=key_file) as ledger:
            with pytest.raises(PipelineBusy, match=rf"'p' \(held by sage@\S+ pid {holder.pid}.*--name OTHER"):
                ledger.claim("s", ["q", "p"])
            with ledger.claim("s", ["q"]):  # 'q' was not kept by the refused claim; other names are free
                pass
            holder.kill()
            holder.wait()
            with _claim_eventually(ledger, ["p", "q"]):  # a killed holder's names are free for its restart
                with pytest.raises(PipelineBusy):  # and held again, now by this process's claim
                    with Ledger.open(ledger_url, key_file=key_file) as other:
                        other.claim("s", ["p"])
            with Ledger.open(ledger_url, key_file=key_file) as other:  # released: free
                other.claim("s", ["p"]).release()
    finally:
        if holder.poll() is None:
            holder.kill()
        holder.wait()


@pytest.mark.postgres
def test_serve_and_run_refuse_a_pipeline_name_another_host_runs(postgres_server, tmp_path):
    """`sage serve` and `sage run` refuse a name another process (another host) runs: exit 2, before anything is
    registered or charged; the ledger is unchanged."""
    from sage_tfx.data.taxi import taxi_csv_path

    url = postgres_server.new_database("names")
    key_file = tmp_path / "ledger.key"
    with Ledger.open(url, create=True, key_file=key_file) as ledger:
        ledger.create_stream("s", 1.0, 1e-6)
        ledger.add_block("s", "b1", start=0, end=86400, rows=10)
        before = ledger.log_entries()
    holder = _hold_claim(url, key_file)
    try:
        env = {k: v for k, v in os.environ.items() if k != "SAGE_KEY_FILE"}
        serve = sage("serve", "--db", url, "--key-file", key_file, "--stream", "s", "--data-root", tmp_path / "data",
                     "--input", taxi_csv_path("simple"), "--time-column", "trip_start_timestamp",
                     "--pipeline", "mine=taxi_regression:3000000", "--pipeline", "p=taxi_regression:3000000", env=env)
        run = sage("run", "taxi_regression", "--name", "p", "--db", url, "--key-file", key_file, "--stream", "s",
                   "--data-root", tmp_path / "data", "--target", "3000000", env=env)
        for out in (serve, run):
            assert out.returncode == 2, out.stdout + out.stderr
            assert f"'p' (held by sage@" in out.stderr and f"pid {holder.pid}" in out.stderr, out.stderr
            assert "--pipeline OTHER=" in out.stderr, out.stderr
        with Ledger.open(url, key_file=key_file) as ledger:
            assert ledger.log_entries() == before and ledger.pipelines("s") == []
        assert not (tmp_path / "data").exists()
    finally:
        holder.kill()
        holder.wait()
