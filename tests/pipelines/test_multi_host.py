"""Several hosts, one stream (docs/scale_out.md, "Several hosts on one PostgreSQL ledger").

Two `sage serve` processes, "host A" and "host B", share nothing but a PostgreSQL ledger's URL, the ledger's
key file (each host holds its own copy, as a key distributed to two machines) and the data root (a shared
filesystem). Each has its own work folder (TFX pipeline root and MLMD) and TMPDIR, serves two pipelines of its
own, and replays the same input into the one stream: whichever host commits a window first registers its
block, the other finds it registered. They run at the same time; the ledger decides every charge.

As root, each host runs in its own network namespace and reaches PostgreSQL only over a veth pair (through a
relay in the test process to the loopback server), so it shares no network with the other host or the server;
without root (or without `ip netns`), both run on loopback and the test says so.
"""

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time

import pytest

from sage_tfx.privacy import Ledger
from tests.helpers.cli import sage

PY = sys.executable
HOSTS = {"A": ("a-easy", "a-hard"), "B": ("b-easy", "b-hard")}
TARGETS = {"easy": 3000000, "hard": 100000}  # MSE in s^2: ACCEPT at the first iteration; out of reach (TIMEOUT)
# The smallest real workload: taxi_regression's modules on MONTHLY blocks, 8 per window (~2,400 real trips, as
# 256 daily blocks hold), so each host's replay commits a handful of blocks instead of hundreds.
PIPELINE_FILE = """
from sage_tfx.pipelines import SLA, SagePipeline
from sage_tfx.pipelines.taxi_regression import LABEL, LOSS_BOUND, MAX_SECONDS, MODULES

PIPELINE = SagePipeline(
    name="taxi_monthly",
    sla=SLA(metric="mse", label=LABEL, loss_bound=LOSS_BOUND),
    preprocessing_module=MODULES + "/taxi_preprocessing.py",
    trainer_module=MODULES + "/taxi_regression_trainer.py",
    # 0.2 per block: under the quarter of a block each of four waiting pipelines is reserved
    defaults={"epsilon_start": 0.2, "min_window": 8, "rejection_share": 0.0},
    trainer_config={"max_seconds": MAX_SECONDS},
)
"""


def _host_env(host_root):
    """A host's environment: no SAGE_KEY_FILE of the test session (each host passes its own --key-file)."""
    env = {k: v for k, v in os.environ.items() if k != "SAGE_KEY_FILE"}
    env["TMPDIR"] = str(host_root / "tmp")
    os.makedirs(env["TMPDIR"], exist_ok=True)
    return env


class Relay:
    """A TCP relay in the test process from ``listen`` (the root end of a host's veth) to PostgreSQL on loopback;
    counts the connections and bytes it carried."""

    def __init__(self, listen, target):
        self.target, self.connections, self.bytes = target, 0, 0
        self.sock = socket.create_server((listen, 0))
        self.address = (listen, self.sock.getsockname()[1])
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            try:
                upstream = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src, dst):
        try:
            while data := src.recv(65536):
                self.bytes += len(data)
                dst.sendall(data)
        except OSError:
            pass
        finally:  # either side gone (a killed host): close both, so the server drops the session and its locks
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()

    def close(self):
        self.sock.close()


class Network:
    """Each host in its own network namespace, joined to the root namespace by a veth pair /30; None if
    ``ip netns`` is unavailable (not root, no iproute2): then the hosts share loopback."""

    def __init__(self, tag):
        self.tag, self.namespaces, self.relays = tag, {}, {}

    def add(self, host, index, pg_port):
        ns, outer, inner = f"sage-{self.tag}-{host}", f"smh{self.tag}{host}0", f"smh{self.tag}{host}1"
        net = f"10.213.{int(self.tag) % 250}"
        here, there = f"{net}.{4 * index + 1}", f"{net}.{4 * index + 2}"
        for cmd in (
            ["ip", "netns", "add", ns],
            ["ip", "link", "add", outer, "type", "veth", "peer", "name", inner],
            ["ip", "link", "set", inner, "netns", ns],
            ["ip", "addr", "add", f"{here}/30", "dev", outer],
            ["ip", "link", "set", outer, "up"],
            ["ip", "-n", ns, "addr", "add", f"{there}/30", "dev", inner],
            ["ip", "-n", ns, "link", "set", inner, "up"],
            ["ip", "-n", ns, "link", "set", "lo", "up"],
        ):
            subprocess.run(cmd, check=True, capture_output=True, timeout=30)
            if cmd[:3] == ["ip", "netns", "add"]:
                self.namespaces[host] = ns
        self.relays[host] = Relay(here, ("127.0.0.1", pg_port))
        return ["ip", "netns", "exec", ns]

    def close(self):
        for relay in self.relays.values():
            relay.close()
        for host, ns in self.namespaces.items():  # deleting the namespace removes its veth end, and so the pair
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
            subprocess.run(["ip", "link", "del", f"smh{self.tag}{host}0"], capture_output=True, timeout=30)


def _network(hosts, pg_port):
    """A Network with a namespace per host, or None (loopback), and why not."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        return None, "not root or no iproute2"
    network = Network(str(os.getpid() % 100000))
    try:
        prefixes = {host: network.add(host, i, pg_port) for i, host in enumerate(hosts)}
    except (OSError, subprocess.SubprocessError) as exc:
        network.close()
        return None, f"ip netns failed: {getattr(exc, 'stderr', '') or exc}"
    network.prefixes = prefixes
    return network, None


class Host:
    """One `sage serve` process with its own folder: key file copy, work dir (pipeline root, MLMD), TMPDIR."""

    def __init__(self, name, root, url, key_file, data, csv, pipeline_file, prefix=()):
        self.name, self.root, self.url = name, root, url
        root.mkdir(mode=0o700)
        self.key_file = root / "ledger.key"
        shutil.copy2(key_file, self.key_file)  # "distributed securely": mode 0600 kept
        shutil.copy2(f"{key_file}.head", f"{self.key_file}.head")  # and its head: Ledger.open checks the log against it
        self.work = root / "work"
        pipelines = []
        for pipeline in HOSTS[name]:
            pipelines += ["--pipeline", f"{pipeline}={pipeline_file}:{TARGETS[pipeline.split('-')[1]]}"]
        self.argv = [
            *prefix,
            PY,
            "-m",
            "sage_tfx",
            "serve",
            "--db",
            url,
            "--key-file",
            self.key_file,
            "--stream",
            "taxi",
            "--data-root",
            data,
            "--input",
            csv,
            "--time-column",
            "trip_start_timestamp",
            "--window",
            "30d",
            "--blocks-per-step",
            "8",
            *pipelines,
            "--max-iterations",
            "1",
            "--work-dir",
            self.work,
        ]
        self.lines, self.proc, self.started, self.ended = [], None, None, None

    def start(self):
        self.started = time.time()
        self.proc = subprocess.Popen(
            [str(a) for a in self.argv],
            cwd=self.root,
            env=_host_env(self.root),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(f"{time.time() - self.started:7.1f}s {line.rstrip()}")

    def wait(self, timeout):
        try:
            code = self.proc.wait(timeout=max(1.0, timeout))
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


def _tfx_span(host, name):
    """(first execution's creation, last execution's update) in the pipeline's MLMD on this host, in seconds."""
    from ml_metadata.metadata_store import metadata_store

    from sage_tfx.pipelines._runner import metadata_config

    path = host.work / "tfx" / name / "metadata.sqlite"
    assert path.exists(), f"{name}'s MLMD is not in host {host.name}'s work dir {host.work}"
    store = metadata_store.MetadataStore(metadata_config(str(path)))
    runs = store.get_executions()
    assert runs, name
    return (
        min(e.create_time_since_epoch for e in runs) / 1000,
        max(e.last_update_time_since_epoch for e in runs) / 1000,
    )


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
    init = sage(
        "ledger",
        "init",
        "--db",
        url,
        "--key-file",
        key_file,
        "--stream",
        "taxi",
        "--epsilon",
        "1",
        "--delta",
        "1e-6",
        env=_host_env(tmp_path),
    )
    assert init.returncode == 0, init.stderr
    data = tmp_path / "shared" / "data"  # the data root both hosts mount
    data.parent.mkdir()
    pipeline_file = tmp_path / "shared" / "taxi_monthly.py"
    pipeline_file.write_text(PIPELINE_FILE)
    csv = taxi_csv_path("simple")
    network, why = _network(list(HOSTS), postgres_server.port)
    print(f"hosts in network namespaces over veth: {'no (' + why + '), loopback' if network is None else 'yes'}")
    try:
        hosts = {}
        for name in HOSTS:
            prefix, host_url = (), url
            if network is not None:  # the same database, reached only through this host's veth
                prefix, (addr, port) = network.prefixes[name], network.relays[name].address
                host_url = url.replace(f"127.0.0.1:{postgres_server.port}", f"{addr}:{port}")
                probe = subprocess.run(
                    [
                        *prefix,
                        PY,
                        "-c",
                        f"import socket, sys; socket.create_connection(('127.0.0.1', {postgres_server.port}), 5)",
                    ],
                    capture_output=True,
                )
                assert probe.returncode != 0, f"host {name}'s namespace reaches the server's loopback"
            hosts[name] = Host(name, tmp_path / f"host{name}", host_url, key_file, data, csv, pipeline_file, prefix)
        for host in hosts.values():
            host.start()
        deadline = time.monotonic() + 1200
        codes = {name: host.wait(timeout=deadline - time.monotonic()) for name, host in hosts.items()}
    finally:
        if network is not None:
            network.close()
    for name, host in hosts.items():
        print(f"--- host {name}: exit {codes[name]}, {host.ended - host.started:.1f} s\n{host.output}")
    for name, host in hosts.items():
        assert codes[name] == 0, f"host {name}:\n{host.output}"
        assert "audit: OK" in host.output, host.output
        for pipeline in HOSTS[name]:
            assert f"{pipeline}: " in host.output, host.output
        if network is not None:  # every ledger connection of the host went over its own veth
            relay = network.relays[name]
            assert relay.connections >= 1 + len(HOSTS[name]) and relay.bytes > 0, (name, relay.connections)

    names = [p for ps in HOSTS.values() for p in ps]
    with Ledger.open(url, key_file=key_file) as ledger:
        # Every pipeline reached an outcome the ledger recorded, and each of its grants has one.
        status = {p["name"]: p for p in ledger.pipelines("taxi")}
        assert sorted(status) == sorted(names), status
        for name in names:
            assert status[name]["state"] == "done" and status[name]["outcome"] in ("ACCEPT", "REJECT", "TIMEOUT"), (
                status[name]
            )
            history = ledger.history("taxi", name)
            assert history, f"{name} was never granted anything"
            assert all(outcome in ("ACCEPT", "REJECT", "RETRY") for _g, outcome, _d in history), (name, history)
        assert status["a-easy"]["outcome"] == status["b-easy"]["outcome"] == "ACCEPT", status
        # The audit passes, from Python and from the CLI (with the first copy of the key, whose head file knows
        # only `ledger init`'s entries: the hosts' later ones verify under the key, accepted with a note).
        report = audit_ledger(ledger)
        assert report.ok, report.problems
        # No block over its budget, through the public API.
        stream = ledger.stream("taxi")
        blocks = {b.id: b for b in ledger.blocks("taxi")}
        assert blocks
        # Each block was added by exactly one host's replay; the other's step found it registered and said so.
        added = [
            int(m)
            for host in hosts.values()
            for m in re.findall(r"\[replay\] step \d+: (\d+) new block\(s\)", host.output)
        ]
        assert sum(added) == len(blocks), (added, len(blocks))
        for b in blocks.values():
            assert b.spent[0] <= stream.epsilon + 1e-9 and b.spent[1] <= stream.delta + 1e-15, (b.id, b.spent)
        grants = ledger.grants("taxi")
    audit = sage("ledger", "audit", "--db", url, "--key-file", key_file, env=_host_env(tmp_path))
    assert audit.returncode == 0, audit.stdout + audit.stderr

    # Independently of the ledger's code: the charges summed in SQL, per block, against the capacity.
    charged = dict(
        raw_sql(
            url,
            "SELECT b.value, sum((g.body::json->>'epsilon')::float8) FROM grants g, "
            "json_array_elements_text(g.body::json->'blocks') b GROUP BY b.value",
        )
    )
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
    spans = {name: [_tfx_span(host, p) for p in HOSTS[name]] for name, host in hosts.items()}
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
        shutil.copy2(f"{key_file}.head", f"{writer_key}.head")  # a host joins with a copy of a head file
    env = {k: v for k, v in os.environ.items() if k != "SAGE_KEY_FILE"}
    writer = subprocess.Popen(
        [PY, "-c", _WRITER, url, str(writer_key), "6"], stdout=subprocess.PIPE, text=True, env=env
    )
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
    holder = subprocess.Popen(
        [PY, "-c", _HOLDER, str(location), str(key_file)], stdout=subprocess.PIPE, text=True, env=env
    )
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
        serve = sage(
            "serve",
            "--db",
            url,
            "--key-file",
            key_file,
            "--stream",
            "s",
            "--data-root",
            tmp_path / "data",
            "--input",
            taxi_csv_path("simple"),
            "--time-column",
            "trip_start_timestamp",
            "--pipeline",
            "mine=taxi_regression:3000000",
            "--pipeline",
            "p=taxi_regression:3000000",
            env=env,
        )
        run = sage(
            "run",
            "taxi_regression",
            "--name",
            "p",
            "--db",
            url,
            "--key-file",
            key_file,
            "--stream",
            "s",
            "--data-root",
            tmp_path / "data",
            "--target",
            "3000000",
            env=env,
        )
        for out in (serve, run):
            assert out.returncode == 2, out.stdout + out.stderr
            assert "'p' (held by sage@" in out.stderr and f"pid {holder.pid}" in out.stderr, out.stderr
            assert "--pipeline OTHER=" in out.stderr, out.stderr
        with Ledger.open(url, key_file=key_file) as ledger:
            assert ledger.log_entries() == before and ledger.pipelines("s") == []
        assert not (tmp_path / "data").exists()
    finally:
        holder.kill()
        holder.wait()


def test_a_replay_step_another_host_committed_is_checked_not_written_again(ledger_url, tmp_path):
    """Two hosts replay the same input into one stream (each `sage serve` replays it): a step whose window the
    other replay registered meanwhile checks the block's digest and moves on, writing nothing (before, it
    staged, encrypted and synced the window again, to find it registered at commit: on the loaded 2-core
    machine ~0.5 s a window, serialized under the commit lock); other records for it are refused."""
    from sage_tfx.data.taxi import taxi_csv_path
    from sage_tfx.ingest.records import InputError
    from sage_tfx.ingest.replay import Replay

    key_file = os.environ.get("SAGE_KEY_FILE") or f"{ledger_url}.key"
    data = tmp_path / "data"
    with Ledger.open(ledger_url, create=True, key_file=key_file) as ledger:
        ledger.create_stream("taxi", 1.0, 1e-6)
    first, second = (Ledger.open(ledger_url, key_file=key_file) for _ in range(2))
    try:
        csv = taxi_csv_path("simple")
        a = Replay.from_file(first, "taxi", str(data), csv, "trip_start_timestamp", "30d")
        b = Replay.from_file(second, "taxi", str(data), csv, "trip_start_timestamp", "30d")
        # A third host's input lacks one row of the fifth window (made before anything is registered).
        c = Replay(second, "taxi", str(data), _without_row(a._table, int(a._bounds[4])), "trip_start_timestamp", "30d")
        ahead = a.run(steps=3)
        assert [s.added for s in ahead] == [True] * 3
        staging = data / "taxi" / "_staging"
        before = os.stat(staging).st_mtime_ns
        behind = b.run(steps=3)
        assert [(s.block, s.added) for s in behind] == [(s.block, False) for s in ahead]
        assert os.stat(staging).st_mtime_ns == before  # no staging run was made: nothing written again
        assert b.step().added and not a.step().added  # the next window: B first this time
        fifth = a.step()
        assert fifth.added
        assert [s.added for s in c.run(steps=4)] == [False] * 4  # the same rows as registered: moves on
        with pytest.raises(InputError, match=f"block '{fifth.block}' .* already registered with different records"):
            c.step()
    finally:
        first.close()
        second.close()
    with Ledger.open(ledger_url, key_file=key_file) as ledger:
        assert len(ledger.blocks("taxi")) == 5 and ledger.audit().ok


def _without_row(table, index):
    import pyarrow as pa

    return pa.concat_tables([table.slice(0, index), table.slice(index + 1)])
