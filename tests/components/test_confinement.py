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
    with pytest.raises(GrantError, match="its stream's unit is the row"):  # a whole share claimed per unit
        client.release(grant, "validation", "m", 0.1, per_unit="company")
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
        "print(json.dumps(out))\n"
    )
    from sage_tfx.isolation import CONFINEMENT_ENV, child_environment

    secrets = {"SAGE_KEY_FILE": str(tmp_path / "ledger.db.key"), "PGPASSWORD": "hunter2"}
    with pytest.MonkeyPatch.context() as patch:
        for name, value in secrets.items():
            patch.setenv(name, value)
        env = child_environment(str(private), {CONFINEMENT_ENV: Confinement(read=[str(tmp_path / "mine")]).to_json()})
        proc = subprocess.run(
            [PY, str(probe), str(tmp_path / "mine" / "ok.txt"), str(tmp_path / "ledger.db.key")],
            env=env,
            capture_output=True,
            text=True,
            cwd=str(private),
            timeout=120,
        )
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    assert out["granted"] == "read"
    assert out["key"] == out["memory"] == out["environ"] == out["home"] == "PermissionError"
    assert out["disk"] in ("PermissionError", "FileNotFoundError")
    assert out["env"] == []
    unconfined = subprocess.run(
        [PY, "-m", "sage_tfx.pipelines.confined"],
        capture_output=True,
        text=True,
        env={"PATH": os.environ.get("PATH", "")},
        timeout=120,
    )
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
ATTACK = """
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
"""


def _hostile_pipeline(folder, key, db, data, block):
    """A pipeline file that runs ``ATTACK`` when it is loaded, and its (empty) trainer module."""
    folder.mkdir()
    (folder / "trainer.py").write_text("def run_fn(fn_args):\n    pass\n")
    (folder / "pipeline.py").write_text(
        "from sage_tfx.pipelines import SLA, SagePipeline\n"
        "PIPELINE = SagePipeline(name='p', sla=SLA(metric='mse', label='y', loss_bound=1.0), "
        "trainer_module='trainer.py')\n" + ATTACK + f"\n_attack('pipeline', {key!r}, {db!r}, {data!r}, {block!r})\n"
    )
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
    for what in (
        "key_file",
        "head_file",
        "key_env",
        "secret_env",
        "launcher_memory",
        "ledger_open",
        "ledger_open_keyed",
        "database",
        "block_plaintext",
        "other_block_key",
        "other_grant_seed",
    ):
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
    example = os.path.join(
        os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "examples", "taxi_fare"
    )
    hostile = tmp_path / "hostile"
    shutil.copytree(example, hostile)
    call = f"({key!r}, {str(db)!r}, {str(data)!r}, {first!r})"
    pipeline = (hostile / "pipeline.py").read_text()
    (hostile / "pipeline.py").write_text(pipeline + ATTACK + f"\n_attack('pipeline', *{call})\n")
    for name, fn in (
        ("preprocessing.py", "def preprocessing_fn(inputs, custom_config):\n"),
        ("trainer.py", "def run_fn(fn_args):\n"),
    ):
        text = (hostile / name).read_text()
        assert fn in text
        where = name.split(".")[0]
        (hostile / name).write_text(text.replace(fn, ATTACK + "\n\n" + fn + f"    _attack({where!r}, *{call})\n"))
    key_bytes = open(key, "rb").read()
    out = sage(
        "run",
        hostile / "pipeline.py",
        "--db",
        db,
        "--stream",
        "taxi",
        "--data-root",
        data,
        "--target",
        "300",
        "--epsilon-start",
        "1",
        "--min-window",
        "256",
        "--max-iterations",
        "1",
        "--work-dir",
        tmp_path / "work",
        env={**os.environ, "SAGE_KEY_FILE": key, "PGPASSWORD": "hunter2", "SAGE_SHOW_CONFINED_OUTPUT": "1"},
    )  # the markers are on the child's stderr
    text = out.stdout + out.stderr
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    assert "LEAK[" not in text, [line for line in text.splitlines() if "LEAK[" in line]
    for where in ("pipeline", "preprocessing", "trainer"):
        for what in (
            "key_file",
            "head_file",
            "key_env",
            "secret_env",
            "launcher_memory",
            "launcher_environ",
            "ledger_open",
            "ledger_open_keyed",
            "database",
            "block_plaintext",
            "other_block_key",
            "other_grant_seed",
            "unopened_seed",
            "exact_count",
            "request",
        ):
            assert f"BLOCKED[{where}:{what}]" in text, (where, what)
    assert "-> ACCEPT" in out.stdout and os.listdir(tmp_path / "work" / "serving")
    assert open(key, "rb").read() == key_bytes
    with Ledger.open(db) as ledger:
        assert ledger.audit().ok
        (grant,) = ledger.grants()
        assert first not in grant.blocks
        assert [o for _g, o, _d in ledger.history("taxi", "taxi_fare")] == ["ACCEPT"]
        assert {r.stage for r in ledger.releases(grant.id)} == {
            "count",
            "preprocessing",
            "training",
            "rejection",
            "validation",
        }
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


# A trainer module that trains honestly, then forges the validator's verdict in its own process (the validator
# runs after it in the same child) and leaks the granted records it was handed: to an extra file in the pipeline
# root and the work folder, and to its stdout.
FORGE_AND_LEAK = """
def _forge_and_leak(fn_args, work_dir):
    import os
    import tensorflow as tf
    import sage_tfx.components.dp_model_validator_executor as validator

    write_result, write_blessing = validator.write_result, validator.write_blessing
    validator.write_result = lambda artifact, report: write_result(artifact, {**report, "outcome": "ACCEPT"})
    validator.write_blessing = lambda uri, model_uri, model_id, accepted, **kw: write_blessing(
        uri, model_uri, model_id, True, **kw)
    files = [f for pattern in fn_args.train_files for f in tf.io.gfile.glob(pattern)]
    rows = [r.numpy() for r in tf.data.TFRecordDataset(files, compression_type="GZIP")]
    root = os.path.dirname(os.path.dirname(os.path.dirname(fn_args.model_run_dir)))
    for folder in (root, work_dir, fn_args.model_run_dir):
        try:
            os.makedirs(folder, exist_ok=True)
            with open(os.path.join(folder, "leaked_rows.bin"), "wb") as f:
                f.write(b"".join(rows))
        except OSError as exc:  # a folder it may not write
            os.write(2, f"NOT WRITTEN {folder}: {exc}\\n".encode())
    print("ROWLEAK", rows[0].hex(), flush=True)
    os.write(2, ("ROWLEAK " + rows[1].hex() + "\\n").encode())
"""


@pytest.mark.slow
@pytest.mark.tf
def test_a_trainer_module_that_forges_its_acceptance_and_leaks_rows_gets_neither(taxi_stream_300, tmp_path):
    """The exploit as the landed code allowed it: the validator ran in the child beside ``run_fn``, and the launcher
    read its verdict from the child's MLMD, so a ``run_fn`` that patched the validator's writers got ACCEPT (and a
    push) for a model that failed an out-of-reach target; the rows it wrote beside its outputs stayed in the work
    folder and the rows it printed reached the terminal. Now the verdict comes from a fresh confined child that
    ran no user code (the same release re-opened: the same noise), the launcher pushes only what that child
    accepted, removes every file of the run that is not a declared artifact, and shows none of the child's output."""
    from tests.pipelines.test_sage_run import _copy_stream, sage

    db, data = _copy_stream(taxi_stream_300, tmp_path)
    example = os.path.join(
        os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "examples", "taxi_fare"
    )
    hostile = tmp_path / "hostile"
    shutil.copytree(example, hostile)
    work = tmp_path / "work"
    text = (hostile / "trainer.py").read_text()
    fn = "def run_fn(fn_args):\n"
    assert fn in text and "    return trainer_utils.report_spent(fn_args, model)\n" in text
    text = text.replace(
        "    return trainer_utils.report_spent(fn_args, model)\n",
        f"    _forge_and_leak(fn_args, {str(work)!r})\n    return trainer_utils.report_spent(fn_args, model)\n",
    )
    (hostile / "trainer.py").write_text(text.replace(fn, FORGE_AND_LEAK + "\n\n" + fn))
    out = sage(
        "run",
        hostile / "pipeline.py",
        "--db",
        db,
        "--stream",
        "taxi",
        "--data-root",
        data,
        "--target",
        "1",
        "--epsilon-start",
        "1",
        "--min-window",
        "256",
        "--max-iterations",
        "1",
        "--work-dir",
        work,
    )
    shown = out.stdout + out.stderr
    assert "-> ACCEPT" not in out.stdout, out.stdout
    assert "ROWLEAK" not in shown
    assert not (work / "serving").exists() or not os.listdir(work / "serving")
    left = [
        os.path.join(folder, name)
        for folder, _, names in os.walk(tmp_path)
        for name in names
        if name == "leaked_rows.bin"
    ]
    assert left == []
    with Ledger.open(db) as ledger:
        assert ledger.audit().ok
        (grant,) = ledger.grants()
        outcomes = [o for _g, o, _d in ledger.history("taxi", "taxi_fare")]
        assert outcomes and "ACCEPT" not in outcomes, outcomes
        assert "validation" in {r.stage for r in ledger.releases(grant.id)}


ROOT = pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="the launcher is not root")


def _other_python():
    """An interpreter of this Python version outside /root (the test host's pyenv lives in /root, 0700), or None."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    for candidate in (
        os.environ.get("SAGE_CONFINED_PYTHON"),
        sys.executable,
        f"/usr/bin/{version}",
        f"/usr/local/bin/{version}",
    ):
        if candidate and os.path.exists(candidate):
            from sage_tfx.isolation import ChildUser, _refusal

            if _refusal(ChildUser(65534, 65534, candidate)) is None:
                return candidate
    return None


@ROOT
def test_a_root_launchers_child_runs_as_another_user_and_cannot_open_the_key_without_landlock(monkeypatch):
    """As root, the confined child switches to uid/gid 65534 after its folders are given to it, so even with
    Landlock off the key file (0600, the launcher's) fails with EACCES; the folder it is given stays readable and
    writable. Before, the child ran as root (dropping its capabilities, so only Landlock kept the key out)."""
    import errno
    import tempfile

    from sage_tfx.isolation import spawn

    python = _other_python()
    if python is None:
        pytest.skip("no interpreter of this Python version that uid 65534 can run with sage-tfx")
    monkeypatch.setenv("SAGE_CONFINED_PYTHON", python)
    monkeypatch.delenv("SAGE_CONFINED_USER", raising=False)
    base = tempfile.mkdtemp(prefix="sage-uid-", dir="/tmp")  # pytest's tmp_path lies under a 0700 folder
    try:
        os.chmod(base, 0o755)
        key = os.path.join(base, "ledger.db.key")
        with open(key, "wb") as f:
            f.write(b"secret key")
        os.chmod(key, 0o600)
        mine, private = os.path.join(base, "mine"), os.path.join(base, "tmp")
        os.makedirs(mine)
        os.makedirs(private, mode=0o700)
        with open(os.path.join(mine, "uid_probe.py"), "w") as f:
            f.write(
                "import json, os, sys\n"
                "from sage_tfx.isolation import confine_from_environment\n"
                "print(json.dumps({'abi': confine_from_environment(), 'uid': os.getuid(), 'gid': os.getgid()}))\n"
                "for path in sys.argv[1:]:\n"
                "    try:\n"
                "        open(path, 'rb').read(1)\n"
                "        print(json.dumps({path: 'read'}))\n"
                "    except OSError as exc:\n"
                "        print(json.dumps({path: exc.errno}))\n"
                "open(os.path.join(os.environ['TMPDIR'], 'written'), 'w').write('ok')\n"
            )
        with open(os.path.join(mine, "granted.txt"), "w") as f:
            f.write("fine")
        os.chmod(os.path.join(mine, "granted.txt"), 0o644)
        child = spawn(
            "uid_probe",
            [key, os.path.join(mine, "granted.txt")],
            Confinement(read=[mine], write=[], landlock=False),
            private,
            env={"PYTHONPATH": mine},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        out, err = child.communicate(timeout=300)
        assert child.returncode == 0, err[-2000:]
        lines = [json.loads(line) for line in out.splitlines()]
        assert lines[0] == {"abi": 0, "uid": 65534, "gid": 65534}  # Landlock off: the OS user alone
        assert lines[1] == {key: errno.EACCES}
        assert lines[2] == {os.path.join(mine, "granted.txt"): "read"}
        assert os.stat(os.path.join(private, "written")).st_uid == 65534
        assert open(key, "rb").read() == b"secret key" and os.stat(key).st_uid == 0
    finally:
        shutil.rmtree(base, ignore_errors=True)


@ROOT
def test_where_the_child_user_cannot_run_the_child_keeps_the_launchers_user_and_says_why(monkeypatch):
    """A host whose interpreter the unprivileged user cannot run (this one's pyenv under /root, 0700): the status
    names why and the child runs as root under Landlock, as before; off, and a bad value, are named too."""
    from sage_tfx.isolation import ConfinementError, child_user
    from sage_tfx.pipelines.confined import confinement_status

    monkeypatch.setenv("SAGE_CONFINED_PYTHON", "/nonexistent/python3")
    user, why = child_user()
    assert user is None and "cannot run /nonexistent/python3" in why and "SAGE_CONFINED_PYTHON" in why
    assert why in confinement_status()
    monkeypatch.setenv("SAGE_CONFINED_USER", "off")
    assert child_user() == (None, "SAGE_CONFINED_USER=off: confined children run as root, under Landlock")
    monkeypatch.setenv("SAGE_CONFINED_USER", "0:0")
    with pytest.raises(ConfinementError, match="not UID:GID of a user other than root"):
        child_user()


@pytest.mark.tf
def test_only_declared_artifacts_outlive_a_confined_run(tmp_path):
    """``keep_declared_outputs`` after a confined run: the LIVE Model's folder and the MLMD store stay; a ModelRun's
    folder, a file at the root, a folder no artifact names and one a kept type names through a symbolic link go;
    the removed artifacts are DELETED in MLMD; a separate MLMD folder loses only what the run added."""
    from ml_metadata.metadata_store import metadata_store
    from ml_metadata.proto import metadata_store_pb2

    from sage_tfx.pipelines._runner import PipelineConfig, folder_names, keep_declared_outputs, metadata_config

    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("not the run's")
    config = PipelineConfig(
        name="p",
        ledger="l.db",
        stream="s",
        data_root=str(tmp_path / "data"),
        work_dir=str(tmp_path / "work"),
        target=1.0,
    )
    root = tmp_path / "work" / "tfx" / "p"
    for folder in ("DPTrainer/model/3", "DPTrainer/model_run/3", "stray/inner"):
        (root / folder).mkdir(parents=True)
        (root / folder / "leaked_rows.bin").write_bytes(b"rows")
    (root / "leaked_rows.bin").write_bytes(b"rows")
    (root / "Linked" / "model").mkdir(parents=True)
    (root / "Linked" / "model" / "4").symlink_to(outside)
    store = metadata_store.MetadataStore(metadata_config(config.metadata_path))

    def record(kind, uri):
        type_id = store.put_artifact_type(metadata_store_pb2.ArtifactType(name=kind))
        store.put_artifacts(
            [metadata_store_pb2.Artifact(type_id=type_id, uri=str(uri), state=metadata_store_pb2.Artifact.LIVE)]
        )

    record("Model", root / "DPTrainer" / "model" / "3")
    record("ModelRun", root / "DPTrainer" / "model_run" / "3")
    record("Model", root / "Linked" / "model" / "4")
    elsewhere = tmp_path / "mlmd"
    elsewhere.mkdir()
    (elsewhere / "old.txt").write_text("there before")
    before = folder_names([str(elsewhere)])
    (elsewhere / "new_rows.bin").write_bytes(b"rows")
    keep_declared_outputs(config, before)
    left = sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs)
    assert left == ["DPTrainer/model/3/leaked_rows.bin", "metadata.sqlite"], left
    assert os.listdir(elsewhere) == ["old.txt"] and (outside / "keep.txt").exists()
    states = {a.uri: a.state for a in store.get_artifacts()}
    assert states[str(root / "DPTrainer" / "model" / "3")] == metadata_store_pb2.Artifact.LIVE
    assert states[str(root / "DPTrainer" / "model_run" / "3")] == metadata_store_pb2.Artifact.DELETED
    assert states[str(root / "Linked" / "model" / "4")] == metadata_store_pb2.Artifact.DELETED
