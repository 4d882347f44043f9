"""Block files written, and the commit that makes a block visible.

``BlockWriter`` (in each ingest worker) writes a run's records as sealed part files into its staging run;
``commit`` (in the driver) renames each block into place and registers it in the ledger, the only index readers
use. A crash at any step leaves no visible partial block, re-ingesting the same input adds nothing, and a
registered block is immutable. Exact row counts go only into the ledger.

Commit order and crash cases: docs/growing_database.md, "Ingest (`sage ingest`)"; encryption:
docs/security.md, "Blocks at rest, and reads gated by a grant".
"""

import contextlib
import fcntl
import os
import shutil
import uuid

import numpy as np

from sage_tfx.privacy.errors import DuplicateContent, UnknownBlock

from . import sealed
from .access import ledger_digest
from .layout import (
    BLOCK_FILE,
    DIR_MODE,
    STAGING,
    STREAM_FILE,
    block_dir,
    fsync_dir,
    read_manifest,
    stream_dir,
    write_json,
)
from .records import InputError, is_url, row_hashes, to_example_batch
from .staging import check_run_here, create_staged, delete_staged_quietly, fetch_parts, staged_path

_MASK = (1 << 64) - 1


def keyed_digest(ledger, total: int) -> str:
    """The content digest a new block records (manifest and ledger): the ledger key ring's HMAC of ``total``, the
    64-bit sum (mod 2^64) of ``records.row_hashes`` of its records (``KeyRing.content_digest``). Only the sealed
    part list holds the sum itself (``BlockWriter`` sums it per part)."""
    return ledger.keyring.content_digest(total)


def digest_forms(ledger, total: int) -> tuple:
    """Every digest a block of these records may have recorded: the keyed one (64 hex digits), and the unkeyed
    16-hex-digit row-hash sum that blocks ingested before digests were keyed recorded (read as they are)."""
    return keyed_digest(ledger, total), f"{total:016x}"


class BlockWriter:
    """Buffers encoded records per block and writes them as part files in a staging run directory.

    Memory is bounded: a block's buffer is written as a part once it passes
    ``part_bytes``, and the largest buffer whenever all pass ``max_buffered``.
    """

    def __init__(
        self,
        run_dir,
        spec,
        schema,
        part_bytes=64 << 20,
        max_buffered=256 << 20,
        compresslevel=6,
        stream=None,
        run_key=None,
    ):
        """``stream`` and ``run_key`` (``sealed.new_run_key()``, the same for every writer of one run, kept in
        memory): each block's parts are encrypted under ``sealed.data_key(run_key, stream, block)``."""
        if stream is None or run_key is None:
            raise ValueError("BlockWriter needs the stream and the run key (block files are always encrypted)")
        self.run_dir, self.spec, self.schema = run_dir, spec, schema
        self.stream, self._run_key, self._deks = stream, run_key, {}
        self.part_bytes, self.max_buffered, self.compresslevel = part_bytes, max_buffered, compresslevel
        self.tag = uuid.uuid4().hex[:12]
        self._buffers, self._sizes, self._digests, self._parts, self._seq = {}, {}, {}, [], 0
        self._total = 0

    def add(self, batch):
        if not batch.num_rows:
            return
        from tfx_bsl.coders import example_coder

        keys = self.spec.keys(batch)
        examples = to_example_batch(batch, self.schema)
        records = example_coder.RecordBatchToExamples(examples)
        hashes = row_hashes(examples)
        order = np.argsort(keys, kind="stable")
        sorted_keys = keys[order]
        cuts = np.flatnonzero(np.diff(sorted_keys)) + 1
        for idx in np.split(order, cuts):
            key = int(keys[idx[0]])
            chunk = [records[i] for i in idx]
            size = sum(map(len, chunk))
            self._buffers.setdefault(key, []).extend(chunk)
            self._digests[key] = (self._digests.get(key, 0) + int(hashes[idx].sum())) & _MASK
            self._sizes[key] = self._sizes.get(key, 0) + size
            self._total += size
            if self._sizes[key] >= self.part_bytes:
                self._flush(key)
        while self._total > self.max_buffered:
            self._flush(max(self._sizes, key=self._sizes.get))

    def _flush(self, key):
        records = self._buffers.pop(key)
        digest = self._digests.pop(key)
        self._total -= self._sizes.pop(key)
        block_id = self.spec.block_id(key)
        name = f"part-{self.tag}-{self._seq:05d}{sealed.SUFFIX}"
        self._seq += 1
        if block_id not in self._deks:
            self._deks[block_id] = sealed.data_key(self._run_key, self.stream, block_id)
        if is_url(self.run_dir):  # a staging URL: through Beam's FileSystems (module docstring)
            target = staged_path(self.run_dir, block_id, name)
            try:
                written = sealed.write_records(
                    target,
                    records,
                    self._deks[block_id],
                    self.stream,
                    block_id,
                    self.compresslevel,
                    raw=create_staged(target),
                )
            except BaseException:
                delete_staged_quietly(target)
                raise
        else:
            if self._seq == 1:  # the first part of this writer: its run must be here
                check_run_here(self.run_dir)
            folder = os.path.join(self.run_dir, block_id)
            os.makedirs(folder, mode=DIR_MODE, exist_ok=True)
            written = sealed.write_records(
                os.path.join(folder, name), records, self._deks[block_id], self.stream, block_id, self.compresslevel
            )
        self._parts.append(
            {
                "key": key,
                "block": block_id,
                "file": name,
                "rows": len(records),
                "digest": f"{digest:016x}",  # hex: Beam coders mangle ints >= 2^63
                "bytes": written["bytes"],
                "sha256": written["sha256"],
            }
        )

    def close(self):
        """Write what is buffered; return the part descriptions (for ``commit``)."""
        for key in list(self._buffers):
            self._flush(key)
        return self._parts


def commit(
    ledger, stream, data_root, run_dir, parts, spec, schema, allow_duplicate_of=(), run_key=None, staged_run=None
):
    """Move staged blocks into place and register them; returns {"added": [...], "unchanged": [...]}.

    ``staged_run``: the run at a staging location other than ``run_dir`` (a URL or another local folder): the
    parts of the blocks to be written are first copied from it into ``run_dir`` (``fetch_parts``: O_EXCL, 0600,
    sizes and SHA-256 checked), then committed as below.

    ``run_key``: the key the run's writers encrypted with; each new block's data key is wrapped under its block
    key (``ledger.keyring.block_key``) with the manifest as associated data (``sealed.seal_manifest``).

    Every check (immutability, window/shard clashes, records already registered in another stream) runs
    before the first block is moved or registered, so bad input registers nothing. Each new block's content
    digest goes into the ledger with it; a block whose digest another stream already registered is refused
    (the same records in a second stream would get a fresh budget there), unless that stream is named in
    ``allow_duplicate_of`` (``sage ingest --allow-duplicate-of-stream S``). The ledger checks it again in the
    transaction that registers the blocks.
    """
    allow_duplicate_of = tuple(allow_duplicate_of or ())
    blocks = {}
    for part in parts:
        b = blocks.setdefault(part["block"], {"key": part["key"], "rows": 0, "digest": 0, "files": []})
        b["rows"] += part["rows"]
        b["digest"] = (b["digest"] + int(part["digest"], 16)) & _MASK
        b["files"].append({"name": part["file"], "bytes": part["bytes"], "sha256": part["sha256"]})
    if not blocks or sum(b["rows"] for b in blocks.values()) == 0:
        raise InputError("the input is empty: no records to ingest (nothing registered)")
    for info in blocks.values():
        info["forms"] = digest_forms(ledger, info["digest"])
        info["recorded"] = info["forms"][0]

    registered = {b.id: b for b in ledger.blocks(stream)}
    plan, unchanged, reseal = [], [], []
    for block_id in sorted(blocks):
        info = blocks[block_id]
        if block_id in registered:
            manifest = read_manifest(block_dir(data_root, stream, block_id))
            if manifest is None or manifest.get("digest") not in info["forms"]:
                raise InputError(
                    f"block {block_id!r} of stream {stream!r} is already registered with different "
                    "records; registered blocks are immutable (nothing registered)"
                )
            if not sealed.is_sealed(manifest):  # written before encryption at rest: replaced by this sealed copy
                if ledger_digest(ledger, stream, block_id) not in (None, *info["forms"]):
                    raise InputError(
                        f"block {block_id!r} of stream {stream!r}: the ledger registered other records "
                        "for it (nothing changed)"
                    )
                info["recorded"] = manifest["digest"]  # the resealed manifest keeps the digest the ledger holds
                reseal.append((block_id, info, spec.ledger_key(info["key"])))
            unchanged.append(block_id)
            continue
        key = spec.ledger_key(info["key"])
        for other in registered.values():
            if "shard" in key and other.shard == key["shard"]:
                raise InputError(f"block {block_id!r}: shard {key['shard']} is already block {other.id!r}")
            if "start" in key and other.start is not None and other.start < key["end"] and other.end > key["start"]:
                raise InputError(
                    f"block {block_id!r}: its window overlaps registered block {other.id!r} (nothing registered)"
                )
        plan.append((block_id, info, key))

    refuse_copies(ledger, stream, {block_id: info["forms"] for block_id, info, _ in plan}, allow_duplicate_of)

    if staged_run is not None and staged_run != run_dir:
        fetch_parts(staged_run, run_dir, {block_id: info for block_id, info, _ in [*plan, *reseal]})
    with _commit_lock(data_root, stream):
        return _commit_plan(
            ledger, stream, data_root, run_dir, plan, unchanged, spec, schema, allow_duplicate_of, run_key, reseal
        )


def refuse_copies(ledger, stream, forms: dict, allow_duplicate_of=()) -> None:
    """Refuse blocks whose records another stream of the ledger already registered (InputError naming both).

    ``forms``: {block id: its ``digest_forms``}. The same records in a second stream would get a fresh budget
    there, unless that stream is in ``allow_duplicate_of`` (``sage ingest --allow-duplicate-of-stream S``)."""
    digests = {form: block_id for block_id, both in forms.items() for form in both}
    owners = ledger.digest_owners(list(digests), exclude_stream=stream)
    for digest, block_id in sorted(digests.items(), key=lambda kv: kv[1]):
        others = [o for o in owners.get(digest, []) if o[0] not in tuple(allow_duplicate_of or ())]
        if others:
            other_stream, other_block = others[0]
            raise InputError(
                f"block {block_id!r}: its records (content digest {digest[:16]}...) are already registered as block "
                f"{other_block!r} of stream {other_stream!r}; in stream {stream!r} they would get a fresh budget, "
                f"so nothing was registered. If this copy is intended (its privacy loss adds up with the other "
                f"stream's), pass --allow-duplicate-of-stream {other_stream}"
            )


@contextlib.contextmanager
def _commit_lock(data_root, stream):
    """One committer per stream at a time (an advisory lock on this host)."""
    with open(os.path.join(stream_dir(data_root, stream), STAGING, ".commit.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _commit_plan(
    ledger, stream, data_root, run_dir, plan, unchanged, spec, schema, allow_duplicate_of=(), run_key=None, reseal=()
):
    if run_key is None:
        raise ValueError("commit needs the run key its writers encrypted with")

    config_path = os.path.join(stream_dir(data_root, stream), STREAM_FILE)
    if not os.path.exists(config_path):
        write_json(config_path, {"schema": schema, "blocks": spec.describe()})
    for block_id, info, key in [*plan, *reseal]:
        staged = os.path.join(run_dir, block_id)
        listed = {f["name"] for f in info["files"]}
        for name in os.listdir(staged):  # parts of retried bundles that were never committed
            if name not in listed:
                os.remove(os.path.join(staged, name))
        manifest = sealed.seal_manifest(
            {
                "stream": stream,
                "block": block_id,
                "digest": info["recorded"],
                "files": sorted(info["files"], key=lambda f: f["name"]),
                **key,
            },
            sealed.data_key(run_key, stream, block_id),
            ledger.keyring.block_key(stream, block_id),
        )
        write_json(os.path.join(staged, BLOCK_FILE), manifest, fsync=False)
    os.sync()  # every staged file is durable before any block moves into place (one sync, not one per file)
    for block_id, _info, _key in reseal:  # an unencrypted block of an older version: the sealed copy replaces it
        final = block_dir(data_root, stream, block_id)
        old = os.path.join(run_dir, f".plain-{block_id}")
        os.rename(final, old)
        os.rename(os.path.join(run_dir, block_id), final)
        shutil.rmtree(old, ignore_errors=True)
    new = []
    for block_id, info, key in plan:
        staged = os.path.join(run_dir, block_id)
        final = block_dir(data_root, stream, block_id)
        try:
            ledger.block(stream, block_id)
        except UnknownBlock:
            pass
        else:  # registered meanwhile by an ingest on another host: it must be the same records
            if (read_manifest(final) or {}).get("digest") not in info["forms"]:
                raise InputError(
                    f"block {block_id!r} of stream {stream!r} was registered meanwhile with different records"
                )
            unchanged.append(block_id)
            continue
        if os.path.exists(final):  # left by a crash before add_block: unregistered, so invisible; replace it
            shutil.rmtree(final)
        os.rename(staged, final)
        new.append(dict(id=block_id, rows=int(info["rows"]), digest=info["recorded"], **key))
    if new:
        fsync_dir(stream_dir(data_root, stream))  # the renames are durable before the ledger shows them
        try:  # one transaction: all of this ingest's new blocks, or none
            ledger.add_blocks(stream, new, allow_duplicate_of=allow_duplicate_of)
        except DuplicateContent as exc:  # another stream registered these records meanwhile: take ours back
            for b in new:
                shutil.rmtree(block_dir(data_root, stream, b["id"]), ignore_errors=True)
            raise InputError(str(exc)) from None
    return {
        "added": [b["id"] for b in new],
        "unchanged": sorted(unchanged),
        "encrypted": sorted(b for b, _, _ in reseal),
    }
