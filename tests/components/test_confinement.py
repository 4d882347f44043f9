"""User code without the key: `sage run` loads a pipeline file and runs its iterations in a confined child.

The child (pipelines/confined.py, sage_tfx/isolation.py) has no key file access (Landlock), no SAGE_KEY_FILE or
other secret in its environment, no ledger handle; the launcher's grant server (components/_grant_server.py)
serves it one grant. Before, a 12-line pipeline file read every raw record of the stream with the launcher's key.
"""
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
from multiprocessing.connection import Connection

import pytest

from sage_tfx.components._grant_channel import GrantClient
from sage_tfx.components._grant_server import GrantServer
from sage_tfx.isolation import Confinement, landlock_abi
from sage_tfx.privacy import GrantError, Ledger
from tests.components.test_grant_step import make_grant

PY = sys.executable
LANDLOCK = pytest.mark.skipif(landlock_abi() == 0, reason="no Landlock on this kernel")


def _served(location, grant, job=None):
    """A GrantClient talking to a GrantServer (in a thread) that serves ``grant`` of the ledger at ``location``."""
    ours, theirs = socket.socketpair()
    server = GrantServer(job or {"mode": "iterate"}, location, grant)
    thread = threading.Thread(target=server.serve, args=(Connection(ours.detach()),), daemon=True)
    thread.start()
    return GrantClient(Connection(theirs.detach())), server


def test_the_grant_server_serves_its_grant_and_refuses_everything_else(tmp_path):
    """The door a confined run gets: its grant's blocks, keys, releases and DP count; nothing of another grant, no
    seed before its release, no exact count, no request, draw or registration."""
    from sage_tfx.components._grant import GrantedExecutor, _connection, data_digest

    db = str(tmp_path / "l.db")
    grant = make_grant(db)
    with Ledger.open(db) as ledger:
        ledger.add_block("s", "b9", start=9 * 86400.0, end=10 * 86400.0, rows=100)
        other = ledger.request("q", "s", blocks=["b9"], epsilon=0.5)
        before = ledger.log_entries()
        keys = {b: ledger.keyring.block_key("s", b) for b in ("b0", "b1")}
        digest = data_digest(ledger, grant)
    client, server = _served(db, grant)
    with _connection(client) as remote:  # the executors' own door, on the client
        assert remote.verify(grant.to_json(), stream="s").id == grant.id
        assert [b.id for b in remote.blocks("s")] == ["b0", "b1"]
        assert {b: remote.keyring.block_key("s", b) for b in ("b0", "b1")} == keys
        assert data_digest(remote, grant) == digest
    with pytest.raises(GrantError, match="not granted"):
        client.keyring.block_key("s", "b9")  # a block of another grant
    with pytest.raises(GrantError, match="not granted"):
        client.block_digest("s", "b9")
    with pytest.raises(GrantError, match="served grant"):
        client.verify(other.to_json())
    with pytest.raises(GrantError, match="served grant"):
        client.private_seed(other.id, "training")  # another grant's seed
    with pytest.raises(GrantError, match="open the stage's release first"):
        client.private_seed(grant.id, "training")  # no draw before the ledger recorded the release
    with pytest.raises(GrantError, match="served grant"):
        client.release(other, "training", "m", 0.1)
    for op in ("request", "draw", "add_block", "private_row_count", "record_outcome", "trusted_block_keys"):
        with pytest.raises(GrantError, match="no request"):
            client.call(op, stream="s", block="b0")
    with pytest.raises(GrantError, match="no exact row count"):
        client.private_row_count("s", "b0")
    with Ledger.open(db) as ledger:
        assert ledger.log_entries() == before  # every refusal left the ledger as it was
    # the run's own work goes through: the executors' CheckGrant on the server's address, a release, its seed
    with GrantedExecutor().CheckGrant({"grant": grant.to_json(), "ledger": client}, stream="s") as run:
        seed = run.open_release("training", "model-1", 0.3)
        count, eps = run.released_record_count()
    assert count != 200.0 and eps == pytest.approx(0.05)  # a DP count, never the exact 200
    with Ledger.open(db) as ledger:
        assert seed == ledger.private_seed(grant.id, "training")
        assert {r.stage for r in ledger.releases(grant.id)} == {"training", "count"}
    assert server.opened == {"training", "count"}


def test_a_describe_server_has_no_grant_to_give(tmp_path):
    client, _ = _served(None, None, job={"mode": "describe"})
    assert client.job() == {"mode": "describe"}
    with pytest.raises(GrantError, match="has no grant"):
        client.keyring.block_key("s", "b0")


@LANDLOCK
def test_the_confined_child_reads_no_key_and_inherits_no_secret(tmp_path):
    """sage_tfx.isolation alone: a child spawned confined reads its granted folder, not the key beside it, not the
    launcher's environment or memory, not a raw disk; it has no SAGE_KEY_FILE or PGPASSWORD; it cannot start unconfined."""
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "ok.txt").write_text("fine")
    (tmp_path / "ledger.db.key").write_bytes(b"secret key")
    private = tmp_path / "tmp"
    private.mkdir()
    probe = tmp_path / "mine" / "probe.py"
    probe.write_text(
        "import json, os, sys\n"
        "from sage_tfx.isolation import confine_from_environment\n"
        "confine_from_environment()\n"
        "out = {}\n"
        "for name, path in [('granted', sys.argv[1]), ('key', sys.argv[2]),"
        " ('memory', f'/proc/{os.getppid()}/mem'), ('environ', f'/proc/{os.getppid()}/environ'),"
        " ('disk', '/dev/sda'), ('home', '/root')]:\n"
        "    try:\n"
        "        os.listdir(path) if os.path.isdir(path) else open(path, 'rb').read(1)\n"
        "        out[name] = 'read'\n"
        "    except OSError as exc:\n"
        "        out[name] = type(exc).__name__\n"
        "out['env'] = sorted(k for k in os.environ if k in ('SAGE_KEY_FILE', 'PGPASSWORD', 'SAGE_CONFINEMENT'))\n"
        "print(json.dumps(out))\n")
    from sage_tfx.isolation import CONFINEMENT_ENV, child_environment

    secrets = {"SAGE_KEY_FILE": str(tmp_path / "ledger.db.key"), "PGPASSWORD": "hunter2"}
    with pytest.MonkeyPatch.context() as patch:
        for name, value in secrets.items():
            patch.setenv(name, value)
        env = child_environment(str(private), {CONFINEMENT_ENV: Confinement(read=[str(tmp_path / "mine")]).to_json()})
        proc = subprocess.run([PY, str(probe), str(tmp_path / "mine" / "ok.txt"), str(tmp_path / "ledger.db.key")],
                              env=env, capture_output=True, text=True, cwd=str(private), timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    assert out["granted"] == "read"
    assert out["key"] == out["memory"] == out["environ"] == out["home"] == "PermissionError"
    assert out["disk"] in ("PermissionError", "FileNotFoundError")
    assert out["env"] == []
    unconfined = subprocess.run([PY, "-m", "sage_tfx.pipelines.confined"], capture_output=True, text=True,
                                env={"PATH": os.environ.get("PATH", "")}, timeout=120)
    assert unconfined.returncode != 0 and "SAGE_CONFINEMENT" in unconfined.stderr


def test_a_folder_the_child_gets_may_not_hold_the_key(tmp_path):
    """Refused before anything is charged: a work or data folder around the ledger's key. A pipeline file beside
    the key gets the child that file alone, not its folder."""
    from sage_tfx.pipelines.confined import check_confinement, code_paths, ledger_secrets

    db = str(tmp_path / "ledger.db")
    secrets = ledger_secrets(db)
    assert secrets[:2] == [db + ".key", db + ".key.head"] and db in secrets
    with pytest.raises(ValueError, match=r"ledger.db.key lies in .*keep the ledger, its key file"):
        check_confinement(Confinement(write=[str(tmp_path)]), secrets)
    check_confinement(Confinement(read=[str(tmp_path / "pipeline")], write=[str(tmp_path / "work")]), secrets)
    beside, apart = str(tmp_path / "pipe.py"), str(tmp_path / "mine" / "pipe.py")
    assert code_paths([beside, apart], secrets) == sorted([beside, str(tmp_path / "mine")])
    check_confinement(Confinement(read=code_paths([beside], secrets)), secrets)


# What each hostile module tries; every attempt prints BLOCKED[...] or LEAK[...] on the raw stderr.
ATTACK = '''
def _attack(where, key, db, data, other_block):
    import json, os, sqlite3
    from sage_tfx.components._grant_channel import channel_client
    from sage_tfx.ingest.access import read_block_records
    from sage_tfx.privacy import Ledger

    def grant_id():
        job = channel_client().job()
        return json.loads(job["grant"])["id"] if job.get("grant") else "none"

    attempts = {
        "key_file": lambda: open(key, "rb").read(),
        "head_file": lambda: open(key + ".head", "rb").read(),
        "key_env": lambda: os.environ.get("SAGE_KEY_FILE"),
        "secret_env": lambda: os.environ.get("PGPASSWORD"),
        "launcher_memory": lambda: open(f"/proc/{os.getppid()}/mem", "rb").read(1),
        "launcher_environ": lambda: b"hunter2" in open(f"/proc/{os.getppid()}/environ", "rb").read(),
        "ledger_open": lambda: Ledger.open(db).grants(),
        "ledger_open_keyed": lambda: Ledger.open(db, key_file=key).grants(),
        "database": lambda: sqlite3.connect(f"file:{db}?mode=ro", uri=True).execute("select * from meta").fetchall(),
        "block_plaintext": lambda: next(read_block_records(Ledger.open(db), data, "taxi", [other_block], purpose="x")),
        "other_block_key": lambda: channel_client().keyring.block_key("taxi", other_block),
        "other_grant_seed": lambda: channel_client().private_seed("g-other", "training"),
        "unopened_seed": lambda: channel_client().private_seed(grant_id(), "validation"),
        "exact_count": lambda: channel_client().call("private_row_count", stream="taxi", block=other_block),
        "request": lambda: channel_client().call("request", pipeline="x", stream="taxi", blocks=[other_block]),
    }
    for what, attempt in attempts.items():
        try:
            got = attempt()
        except Exception as exc:
            got, why = None, type(exc).__name__
        else:
            why = repr(got)[:40]
        verdict = "LEAK" if got else "BLOCKED"
        os.write(2, f"\\n{verdict}[{where}:{what}] {why}\\n".encode())
'''


def _hostile_pipeline(folder, key, db, data, block):
    """A pipeline file that runs ``ATTACK`` when it is loaded, and its (empty) trainer module."""
    folder.mkdir()
    (folder / "trainer.py").write_text("def run_fn(fn_args):\n    pass\n")
    (folder / "pipeline.py").write_text(
        "from sage_tfx.pipelines import SLA, SagePipeline\n"
        "PIPELINE = SagePipeline(name='p', sla=SLA(metric='mse', label='y', loss_bound=1.0), "
        "trainer_module='trainer.py')\n" + ATTACK + f"\n_attack('pipeline', {key!r}, {db!r}, {data!r}, {block!r})\n")
    return str(folder / "pipeline.py")


@LANDLOCK
def test_a_hostile_pipeline_file_loaded_by_sage_run_reads_no_key(tmp_path, capfd):
    """The exploit as `sage run FILE` allowed it: loading the file in the launcher (``load_pipeline``, what `sage run`
    did) hands it the key file, SAGE_KEY_FILE and the ledger. ``describe`` (what `sage run` does now) loads it in a
    confined child: every attempt is BLOCKED, and the launcher still gets the pipeline's fields."""
    from sage_tfx.pipelines import load_pipeline
    from sage_tfx.pipelines.confined import describe, ledger_secrets

    db = str(tmp_path / "ledger.db")
    make_grant(db)
    path = _hostile_pipeline(tmp_path / "hostile", db + ".key", db, str(tmp_path / "data"), "b0")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SAGE_KEY_FILE", db + ".key")
        patch.setenv("PGPASSWORD", "hunter2")
        load_pipeline(path)
        before = capfd.readouterr().err
        assert "LEAK[pipeline:key_file]" in before and "LEAK[pipeline:ledger_open]" in before
        assert "LEAK[pipeline:key_env]" in before and "LEAK[pipeline:secret_env]" in before
        pipeline = describe(path, ledger_secrets(db))
    after = capfd.readouterr().err
    assert pipeline.name == "p" and pipeline.module_path("trainer_module") == str(tmp_path / "hostile" / "trainer.py")
    assert "LEAK[" not in after, [line for line in after.splitlines() if "LEAK[" in line]
    for what in ("key_file", "head_file", "key_env", "secret_env", "launcher_memory", "ledger_open",
                 "ledger_open_keyed", "database", "block_plaintext", "other_block_key", "other_grant_seed"):
        assert f"BLOCKED[pipeline:{what}]" in after, what


@pytest.mark.slow
@pytest.mark.tf
@LANDLOCK
def test_hostile_pipeline_preprocessing_and_trainer_modules_reach_no_key_ledger_or_block(taxi_stream_300, tmp_path):
    """A pipeline file, a preprocessing_fn and a run_fn that each try to open the key and head files, read
    SAGE_KEY_FILE and PGPASSWORD (both set for the launcher), the launcher's environment, open the ledger (with and
    without the key's path) and its SQLite file, decrypt a block outside the grant, get another block's key,
    another grant's seed, a seed before its release, an exact count, a new grant. Before, the pipeline file alone
    read every record with the launcher's key. Now every attempt is BLOCKED, the pipeline still ACCEPTs and pushes
    and the ledger holds the honest iteration only (no trusted read, audit OK)."""

    from tests.helpers.cli import sage
    from tests.pipelines.test_sage_run import _copy_stream

    db, data = _copy_stream(taxi_stream_300, tmp_path)
    key = f"{db}.key"
    with Ledger.open(db) as ledger:
        first = ledger.blocks("taxi")[0].id  # the window of 256 recent days leaves it out of the grant
    example = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "examples", "taxi_fare")
    hostile = tmp_path / "hostile"
    shutil.copytree(example, hostile)
    call = f"({key!r}, {str(db)!r}, {str(data)!r}, {first!r})"
    pipeline = (hostile / "pipeline.py").read_text()
    (hostile / "pipeline.py").write_text(pipeline + ATTACK + f"\n_attack('pipeline', *{call})\n")
    for name, fn in (("preprocessing.py", "def preprocessing_fn(inputs, custom_config):\n"),
                     ("trainer.py", "def run_fn(fn_args):\n")):
        text = (hostile / name).read_text()
        assert fn in text
        where = name.split(".")[0]
        (hostile / name).write_text(text.replace(fn, ATTACK + "\n\n" + fn + f"    _attack({where!r}, *{call})\n"))
    key_bytes = open(key, "rb").read()
    out = sage("run", hostile / "pipeline.py", "--db", db, "--stream", "taxi", "--data-root", data, "--target", "300",
               "--epsilon-start", "1", "--min-window", "256", "--max-iterations", "1", "--work-dir", tmp_path / "work",
               env={**os.environ, "SAGE_KEY_FILE": key, "PGPASSWORD": "hunter2"})
    text = out.stdout + out.stderr
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    assert "LEAK[" not in text, [line for line in text.splitlines() if "LEAK[" in line]
    for where in ("pipeline", "preprocessing", "trainer"):
        for what in ("key_file", "head_file", "key_env", "secret_env", "launcher_memory", "launcher_environ",
                     "ledger_open",
                     "ledger_open_keyed", "database", "block_plaintext", "other_block_key", "other_grant_seed",
                     "unopened_seed", "exact_count", "request"):
            assert f"BLOCKED[{where}:{what}]" in text, (where, what)
    assert "-> ACCEPT" in out.stdout and os.listdir(tmp_path / "work" / "serving")
    assert open(key, "rb").read() == key_bytes
    with Ledger.open(db) as ledger:
        assert ledger.audit().ok
        (grant,) = ledger.grants()
        assert first not in grant.blocks
        assert [o for _g, o, _d in ledger.history("taxi", "taxi_fare")] == ["ACCEPT"]
        assert {r.stage for r in ledger.releases(grant.id)} == {"count", "preprocessing", "training", "rejection",
                                                                "validation"}
        assert not any("trusted_read" in json.dumps(e) for e in ledger.log_entries())


@pytest.mark.tf
def test_a_validation_result_outside_the_pipeline_root_is_refused(tmp_path):
    """A confined run writes its own MLMD store: a SageValidationResult whose result.json is a symbolic link (to a
    file only the launcher may read) or whose folder lies outside the pipeline root is refused, not parsed."""
    from ml_metadata.metadata_store import metadata_store
    from ml_metadata.proto import metadata_store_pb2

    from sage_tfx.pipelines._runner import metadata_config, validation_result

    root, outside = tmp_path / "root", tmp_path / "outside"
    for folder in (root / "good", root / "linked", outside):
        folder.mkdir(parents=True)
    (root / "good" / "result.json").write_text('{"outcome": "RETRY", "bound": 2.0}')
    (outside / "result.json").write_text('{"outcome": "ACCEPT", "bound": 1.0}')
    (root / "linked" / "result.json").symlink_to(outside / "result.json")
    mlmd = str(tmp_path / "metadata.sqlite")
    store = metadata_store.MetadataStore(metadata_config(mlmd))
    kind = store.put_artifact_type(metadata_store_pb2.ArtifactType(name="SageValidationResult"))

    def record(grant, uri):
        artifact = metadata_store_pb2.Artifact(type_id=kind, uri=str(uri), state=metadata_store_pb2.Artifact.LIVE)
        artifact.custom_properties["grant_id"].string_value = grant
        store.put_artifacts([artifact])

    record("g1", root / "good")
    record("g2", root / "linked")
    record("g3", outside)
    assert validation_result(mlmd, "g1", str(root)) == {"outcome": "RETRY", "bound": 2.0}
    for grant in ("g2", "g3"):
        with pytest.raises(RuntimeError, match="not a file inside the pipeline root"):
            validation_result(mlmd, grant, str(root))
