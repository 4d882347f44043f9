"""Beam FileSystems for the TensorFlow file system schemes Beam has none for (``ram://``, ``file://``).

TFX's artifacts go through TensorFlow's file system layer (``tfx.dsl.io.fileio``, i.e. ``tf.io.gfile``), the
Beam jobs of BlockExampleGen and DPTransform through Beam's ``FileSystems``. For gs://, s3:// and hdfs:// both
layers have their own client of the same store. TensorFlow's ``ram://`` (an in-process store, the URL pipeline
root the tests run a whole taxi iteration on: docs/scale_out.md, "The pipeline root on a URL filesystem") has
no Beam filesystem, nor has TensorFlow's local filesystem by URL (``file://``, the URL root the tests run a
whole taxi iteration on); ``GfileFileSystem`` is one for each, every call forwarded to ``tf.io.gfile``, so the
Beam jobs and TFX read and write the same files. Importing this module registers them (Beam finds FileSystem
subclasses by their ``scheme()``). ``ram://`` only makes sense on runners whose workers are the launcher process
(the DirectRunner in_memory): it lives in one process.
"""

from apache_beam.io.filesystem import BeamIOError, CompressedFile, CompressionTypes, FileMetadata, FileSystem

GFILE_ONLY_SCHEMES = ("ram", "file")  # the schemes registered here


class _GfileWriter:
    """A binary write channel on a ``tf.io.gfile.GFile`` (Beam wants ``write``/``tell``/``close``/``closed``;
    ``tell`` counts the bytes written, since ram:// files have no Tell())."""

    mode = "wb"

    def __init__(self, handle):
        self._handle, self.closed, self._written = handle, False, 0

    def writable(self):
        return True

    def write(self, data):
        data = bytes(data)
        self._handle.write(data)
        self._written += len(data)
        return len(data)

    def flush(self):
        self._handle.flush()

    def tell(self):
        return self._written

    def close(self):
        if not self.closed:
            self._handle.close()
            self.closed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class GfileFileSystem(FileSystem):
    """Beam's FileSystem API over ``tf.io.gfile`` for ``ram://`` paths."""

    @classmethod
    def scheme(cls):
        return "ram"

    def join(self, basepath, *paths):
        path = basepath
        for part in paths:
            path = path.rstrip("/") + "/" + part.lstrip("/")
        return path

    def split(self, path):
        head, _, tail = path.rstrip("/").rpartition("/")
        return head, tail

    def has_dirs(self):
        return True

    def mkdirs(self, path):
        import tensorflow as tf

        if tf.io.gfile.exists(path):
            raise OSError(f"{path} already exists")
        tf.io.gfile.makedirs(path)

    def _url_dirname(self, url_or_path):
        return self.split(url_or_path)[0]

    def _list(self, dir_or_prefix):
        import tensorflow as tf

        if not tf.io.gfile.exists(dir_or_prefix):
            return
        try:
            for folder, _, files in tf.io.gfile.walk(dir_or_prefix):
                for name in files:
                    yield self.metadata(self.join(folder, name))
        except Exception as exc:
            raise BeamIOError("List operation failed", {dir_or_prefix: exc})  # noqa: B904

    def _open(self, path, mode, compression_type):
        import tensorflow as tf

        compression_type = FileSystem._get_compression_type(path, compression_type)
        raw = tf.io.gfile.GFile(path, mode)
        if mode == "wb":
            raw = _GfileWriter(raw)
        if compression_type == CompressionTypes.UNCOMPRESSED:
            return raw
        return CompressedFile(raw, compression_type=compression_type)

    def create(self, path, mime_type="application/octet-stream", compression_type=CompressionTypes.AUTO):
        import tensorflow as tf

        folder = self._url_dirname(path)
        if folder:
            tf.io.gfile.makedirs(folder)
        return self._open(path, "wb", compression_type)

    def open(self, path, mime_type="application/octet-stream", compression_type=CompressionTypes.AUTO):
        return self._open(path, "rb", compression_type)

    def _each(self, operation, pairs, what):
        errors = {}
        for pair in pairs:
            try:
                operation(*pair)
            except Exception as exc:
                errors[pair] = exc
        if errors:
            raise BeamIOError(f"{what} operation failed", errors)

    def copy(self, source_file_names, destination_file_names):
        import tensorflow as tf

        def copy(source, destination):
            if tf.io.gfile.isdir(source):
                for folder, _, files in tf.io.gfile.walk(source):
                    for name in files:
                        src = self.join(folder, name)
                        copy(src, destination + src[len(source) :])
            else:
                tf.io.gfile.makedirs(self._url_dirname(destination))
                tf.io.gfile.copy(source, destination, overwrite=True)

        self._each(copy, zip(source_file_names, destination_file_names), "Copy")

    def rename(self, source_file_names, destination_file_names):
        import tensorflow as tf

        def rename(source, destination):
            tf.io.gfile.makedirs(self._url_dirname(destination))
            tf.io.gfile.rename(source, destination, overwrite=True)

        self._each(rename, zip(source_file_names, destination_file_names), "Rename")

    def exists(self, path):
        import tensorflow as tf

        return tf.io.gfile.exists(path)

    def _stat(self, path):
        import tensorflow as tf

        try:
            return tf.io.gfile.stat(path)
        except Exception as exc:
            raise BeamIOError(f"Path does not exist: {path}", {path: exc})  # noqa: B904

    def size(self, path):
        return self._stat(path).length

    def last_updated(self, path):
        return self._stat(path).mtime_nsec / 1e9

    def checksum(self, path):
        return str(self.size(path))

    def metadata(self, path):
        stat = self._stat(path)
        return FileMetadata(path, stat.length, stat.mtime_nsec / 1e9)

    def delete(self, paths):
        import tensorflow as tf

        def delete(path):
            if tf.io.gfile.isdir(path):
                tf.io.gfile.rmtree(path)
            elif tf.io.gfile.exists(path):
                tf.io.gfile.remove(path)
            else:
                raise OSError(f"No files found to delete under: {path}")

        self._each(delete, [(p,) for p in paths], "Delete")

    def report_lineage(self, path, lineage):
        pass


class GfileLocalUrlFileSystem(GfileFileSystem):
    """The same for ``file://`` URLs (TensorFlow's local filesystem by URL; Beam takes local paths only
    without a scheme)."""

    @classmethod
    def scheme(cls):
        return "file"
