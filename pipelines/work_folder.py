"""The pipeline work folder (docs/security.md, "The pipeline work folder"): made 0700 (``make_private_dir``);
after each run the artifacts that hold records are scrubbed (``scrub_raw_artifacts``), and after a confined run
every file but the declared outputs is removed (``keep_declared_outputs``); both mark what they remove DELETED
in MLMD so TFX's cache never hands it to a re-run.
"""

import os
import shutil

from sage_tfx.ingest.layout import STAGED_PREFIX


def is_url(path):
    """Whether ``path`` names a filesystem by a scheme (``gs://...``) rather than a local path."""
    return "://" in str(path)


def inside_root(path, root) -> bool:
    """Whether ``path`` lies strictly inside the folder or URL ``root``, reached through no symbolic link (a local
    path) and no ``..`` segment (a URL): what a confined run's MLMD names is checked so before it is read."""
    if is_url(root):
        return str(path).startswith(str(root).rstrip("/") + "/") and ".." not in str(path).split("/")
    path, real = os.path.abspath(path), os.path.realpath(root)
    return (
        os.path.realpath(path) == path.replace(os.path.abspath(root), real, 1)
        and path != os.path.abspath(root)
        and os.path.realpath(path).startswith(real + os.sep)
    )


def metadata_config(path):
    """MLMD's connection config for the local SQLite file ``path`` (its folder created): what TFX's
    ``sqlite_metadata_connection_config`` builds, without importing TFX and TensorFlow (``sage run``'s launcher
    reads MLMD after each confined iteration and never needs them)."""
    from ml_metadata.proto import metadata_store_pb2

    os.makedirs(os.path.dirname(path), exist_ok=True)
    config = metadata_store_pb2.ConnectionConfig()
    config.sqlite.filename_uri = path
    config.sqlite.connection_mode = metadata_store_pb2.SqliteMetadataSourceConfig.READWRITE_OPENCREATE
    return config


RAW_OUTPUTS = ("examples", "transformed_examples")  # output keys of BlockExampleGen and DPTransform


def make_private_dir(path):
    """Create ``path`` (and parents) and make it 0700; a URL folder is created through TFX's file layer, with no
    chmod (its access is the object store's: docs/scale_out.md)."""
    if is_url(path):
        from tfx.dsl.io import fileio

        fileio.makedirs(path)
        return
    os.makedirs(path, mode=0o700, exist_ok=True)
    os.chmod(path, 0o700)


def scrub_raw_artifacts(config):
    """Remove the pipeline's artifacts that hold records (Examples), mark them DELETED in MLMD; return the
    folders removed. Only folders inside the pipeline root are touched. A URL pipeline root goes through TFX's
    file layer (``tfx.dsl.io.fileio``), a local one through os/shutil as before (symbolic links not followed)."""
    if config.remote_root:
        # no ".." segment may walk a URL out of the root (a local root resolves its paths with realpath instead)
        return _scrub(
            config,
            config.pipeline_root.rstrip("/"),
            lambda uri: "" if ".." in uri.split("/") else uri.rstrip("/"),
            _UrlFiles(),
        )
    return _scrub(config, os.path.realpath(config.pipeline_root), os.path.realpath, _LocalFiles())


class _LocalFiles:
    sep = os.sep
    exists, isdir, listdir, islink = (
        staticmethod(os.path.exists),
        staticmethod(os.path.isdir),
        staticmethod(os.listdir),
        staticmethod(os.path.islink),
    )
    join = staticmethod(os.path.join)

    @staticmethod
    def rmtree(path):
        shutil.rmtree(path, ignore_errors=True)


class _UrlFiles:
    sep = "/"

    def __init__(self):
        from tfx.dsl.io import fileio

        self.fileio = fileio

    def exists(self, path):
        return self.fileio.exists(path)

    def isdir(self, path):
        return self.fileio.isdir(path)

    def listdir(self, path):
        return [name.rstrip("/") for name in self.fileio.listdir(path)]

    @staticmethod
    def islink(path):
        return False

    @staticmethod
    def join(*parts):
        return "/".join([parts[0].rstrip("/"), *(p.strip("/") for p in parts[1:])])

    def rmtree(self, path):
        try:
            self.fileio.rmtree(path)
        except Exception:  # already gone (as ignore_errors=True locally)
            pass


def _scrub(config, root, real, files):
    removed = []

    def inside(uri):
        resolved = real(uri)
        return resolved != root and resolved.startswith(root + files.sep)

    if os.path.exists(config.metadata_path):
        from ml_metadata.metadata_store import metadata_store
        from ml_metadata.proto import metadata_store_pb2

        store = metadata_store.MetadataStore(metadata_config(config.metadata_path))
        try:
            artifacts = store.get_artifacts_by_type("Examples")
        except Exception:  # no Examples type registered yet
            artifacts = []
        changed = []
        for artifact in artifacts:
            if artifact.uri and inside(artifact.uri) and files.exists(artifact.uri):
                files.rmtree(artifact.uri)
                removed.append(artifact.uri)
            if artifact.state != metadata_store_pb2.Artifact.DELETED:
                artifact.state = metadata_store_pb2.Artifact.DELETED
                changed.append(artifact)
        if changed:
            store.put_artifacts(changed)
    if files.isdir(root):  # outputs of executions cut short before MLMD recorded them
        for component in files.listdir(root):
            for key in RAW_OUTPUTS:
                folder = files.join(root, component, key)
                if files.isdir(folder) and not files.islink(folder):
                    for name in files.listdir(folder):
                        path = files.join(folder, name)
                        if files.isdir(path) and not files.islink(path):
                            files.rmtree(path)
                            removed.append(path)
    return removed


# The artifact types a confined run's outputs may keep in the pipeline root (its model, transform graph, blessing,
# validation result and push record); ``keep_declared_outputs`` removes every other file it wrote there.
KEPT_ARTIFACTS = ("Model", "TransformGraph", "ModelBlessing", "SageValidationResult", "PushedModel")
WHEELS = "_wheels"  # PIPELINE_ROOT/_wheels: the user modules' wheels (``stage_user_modules``)
_JOURNALS = ("", "-wal", "-shm", "-journal")


def keep_declared_outputs(config, before: dict | None = None) -> list:
    """After a confined run: remove every file and folder of the local pipeline root but the folders of LIVE
    artifacts of a ``KEPT_ARTIFACTS`` type (reached through no symbolic link) and the MLMD store, and mark every
    other artifact inside the root DELETED (TFX's cache never hands a removed artifact to a re-run). ``before``
    ({folder: names}, ``folder_names``): other folders the run could write (the MLMD folder, a local staging
    location) lose every entry not there before, the MLMD store's files excepted. Returns the paths removed. A
    URL pipeline root is left as it is."""
    removed = []
    metadata = {
        where(config.metadata_path) + suffix for suffix in _JOURNALS for where in (os.path.abspath, os.path.realpath)
    }
    for folder, names in (before or {}).items():
        for name in sorted(set(os.listdir(folder)) - set(names)) if os.path.isdir(folder) else ():
            path = os.path.join(folder, name)
            # a staged run of sealed blocks (ciphertext) belongs to a job that deletes it, and an MLMD store beside
            # this one to another pipeline: `sage serve`'s pipelines share the staging location and the MLMD
            # folder (--metadata-path DIR/{name}.sqlite) and run at once, so either may be in use
            if path not in metadata and not name.startswith(STAGED_PREFIX) and not _mlmd_store(folder, name, config):
                _remove(path, removed)
    if config.remote_root or not os.path.isdir(config.pipeline_root):
        return removed
    root = os.path.realpath(config.pipeline_root)
    # the user modules' wheels (``stage_user_modules``: the module files packaged by the launcher) serve every
    # iteration of the pipeline; like a kept model, their folder is the pipeline's code, not the run's records
    kept = metadata | _kept_artifacts(config, root) | {os.path.join(root, WHEELS)}
    _prune(root, kept, removed)
    return removed


def _mlmd_store(folder, name, config) -> bool:
    """Whether ``name`` in ``folder`` is an MLMD store (or its journal) beside this pipeline's, in its folder."""
    store = os.path.basename(config.metadata_path)
    suffix = os.path.splitext(store)[1]
    return (
        os.path.realpath(folder) == os.path.realpath(os.path.dirname(config.metadata_path))
        and bool(suffix)
        and any(name.endswith(suffix + journal) for journal in _JOURNALS)
    )


def folder_names(folders) -> dict:
    """{folder: its entries now} for the local folders of ``folders`` (``keep_declared_outputs``' ``before``)."""
    return {f: os.listdir(f) for f in folders if f and not is_url(f) and os.path.isdir(f)}


def _kept_artifacts(config, root) -> set:
    """The folders of the LIVE artifacts of a kept type inside ``root`` (through no symbolic link); every other
    artifact named under the pipeline root is marked DELETED."""
    from ml_metadata.metadata_store import metadata_store
    from ml_metadata.proto import metadata_store_pb2

    if not os.path.exists(config.metadata_path):
        return set()
    store = metadata_store.MetadataStore(metadata_config(config.metadata_path))
    kept, changed = set(), []
    named = tuple(os.path.join(where(config.pipeline_root), "") for where in (os.path.abspath, os.path.realpath))
    for kind in store.get_artifact_types():
        for artifact in store.get_artifacts_by_type(kind.name):
            if not artifact.uri or not os.path.abspath(artifact.uri).startswith(named):
                continue  # not the run's: left as it is
            if (
                kind.name in KEPT_ARTIFACTS
                and artifact.state == metadata_store_pb2.Artifact.LIVE
                and inside_root(artifact.uri, root)
            ):
                kept.add(os.path.realpath(artifact.uri))
            elif artifact.state != metadata_store_pb2.Artifact.DELETED:
                artifact.state = metadata_store_pb2.Artifact.DELETED
                changed.append(artifact)
    if changed:
        store.put_artifacts(changed)
    return kept


def _prune(folder, kept, removed):
    for name in os.listdir(folder):
        path = os.path.join(folder, name)
        if path in kept:
            continue
        if os.path.isdir(path) and not os.path.islink(path) and any(k.startswith(path + os.sep) for k in kept):
            _prune(path, kept, removed)
        else:
            _remove(path, removed)


def _remove(path, removed):
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
    removed.append(path)
