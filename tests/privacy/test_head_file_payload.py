"""The head file's per-commit write (head_file.HeadFile, docs/security.md): its payload is the JSON it always was, and a
writer that keeps its descriptor and its last view of the file between commits still sees every other writer.

* ``_heads_payload`` (the heads formatted directly instead of through ``json.dumps``) gives the bytes
  ``json.dumps(heads, sort_keys=True, separators=(",", ":"))`` gives, for ids and entries of every odd form, so
  files written before and after it read the same and the slots' digests cover the same text.
* A head written by ANOTHER PROCESS between two commits of this one is seen: this process's next write merges into
  it, never moves a ledger's head back, keeps the other ledgers' heads, and writes a newer generation than the
  other process's.
* The view a writer keeps is compared with the whole file, not with the slots' headers: an in-place rewrite that
  keeps the generations (a restored copy, another writer's slot) is seen; so is a file replaced by a new one of
  the same size (new inode: the descriptor is re-opened, nothing written into the unlinked file).
"""

import json
import os
import stat
import subprocess
import sys
import textwrap

import pytest

from sage_tfx.privacy import head_file as head_module
from sage_tfx.privacy import head_slots, head_stat
from sage_tfx.privacy.head_file import HeadFile
from sage_tfx.privacy.keys import KeyFileError

SIZE = head_module.HEAD_SLOT_BYTES


def _dumps(heads):
    return json.dumps(heads, sort_keys=True, separators=(",", ":")).encode()


@pytest.mark.parametrize(
    "heads",
    [
        {},
        {"L": {"seq": 1, "chain": "c1"}},
        {"b" * 32: {"seq": 2**70, "chain": "ab" * 32}, "a" * 32: {"seq": 0, "chain": ""}},
        {'ledger "quoted" \\ slash': {"seq": 3, "chain": "tab\there\nnewline\x00nul\x7fdel"}},
        {"l\u00e9dger-\u00fc\u2603-\U0001f600": {"seq": 4, "chain": "\u00e9\U0001f600"}},
        {
            "Z": {"seq": 1, "chain": "c"},
            "a": {"seq": 2, "chain": "c"},
            "_": {"seq": 3, "chain": "c"},
            "\u00e9": {"seq": 4, "chain": "c"},
            "": {"seq": 5, "chain": "c"},
        },  # sort order: by code point, as json's
        {"extra": {"seq": 1, "chain": "c", "note": "written by another version"}},
        {"bool": {"seq": True, "chain": "c"}, "float": {"seq": 1.5, "chain": "c"}, "none": {"seq": 1, "chain": None}},
        {"list": [1, 2], "text": "t", "missing": {"seq": 1}, "number": 7},
        {"seq-first": {"seq": -1, "chain": "c"}},
    ],
)
def test_the_payload_is_the_json_sage_always_wrote(heads):
    assert head_slots._heads_payload(heads) == _dumps(heads)
    assert json.loads(head_slots._heads_payload(heads)) == heads


def _newest_generation(path):
    with open(path, "rb") as f:
        return head_slots._parse_head_file(f.read(), path).generation


def test_a_head_another_process_wrote_between_two_commits_is_seen_and_never_overwritten_back(tmp_path):
    path = str(tmp_path / "k.key.head")
    head = HeadFile(path, "commit")
    head.advance("L", 1, "c1")
    head.advance("L", 2, "c2")  # in place: this process now holds its descriptor and its view of the file
    other = textwrap.dedent("""
        import sys
        from sage_tfx.privacy.head_file import HeadFile
        head = HeadFile(sys.argv[1], "commit")
        head.advance("L", 5, "c5")
        head.advance("M", 7, "m7")
    """)
    subprocess.run([sys.executable, "-c", other, path], check=True, timeout=120)
    theirs = _newest_generation(path)
    head.advance("L", 3, "c3")  # behind the other process's 5: nothing to write, and nothing moved back
    assert HeadFile(path, "commit").read() == {"L": {"seq": 5, "chain": "c5"}, "M": {"seq": 7, "chain": "m7"}}
    assert _newest_generation(path) == theirs
    head.advance("L", 6, "c6")
    assert HeadFile(path, "commit").read() == {"L": {"seq": 6, "chain": "c6"}, "M": {"seq": 7, "chain": "m7"}}
    assert _newest_generation(path) == theirs + 1


def _same_layout_other_heads(path, heads):
    """The file's bytes with its newest slot's heads replaced by ``heads``, every generation and size kept."""
    with open(path, "rb") as f:
        data = f.read()
    state = head_slots._parse_head_file(data, path)
    slot = head_slots._slot_bytes(state.slot_size, state.generation, _dumps(heads))
    offset = state.newest * state.slot_size
    return data[:offset] + slot + data[offset + state.slot_size :], offset, slot


def test_an_in_place_rewrite_keeping_the_generations_is_seen(tmp_path):
    path = str(tmp_path / "k.key.head")
    head = HeadFile(path, "commit")
    head.advance("L", 1, "c1")
    head.advance("X", 1, "x1")
    head.advance("L", 2, "c2")
    inode = os.stat(path).st_ino
    with open(path, "rb") as f:
        before = f.read()
    restored = {"L": {"seq": 9, "chain": "c9"}, "X": {"seq": 4, "chain": "x4"}}  # the same payload length
    data, offset, slot = _same_layout_other_heads(path, restored)
    header = head_slots._SLOT_HEADER.size
    assert data[:header] == before[:header] and data[SIZE : SIZE + header] == before[SIZE : SIZE + header] != data
    with open(path, "r+b") as f:  # same inode, same slot headers (generations, lengths): only the bytes after differ
        f.seek(offset)
        f.write(slot)
    assert os.stat(path).st_ino == inode and len(data) == 2 * SIZE
    head.advance("L", 3, "c3")  # behind the file's 9: the file's heads stand
    assert HeadFile(path, "commit").read() == restored
    head.advance("L", 10, "c10")
    assert HeadFile(path, "commit").read() == {"L": {"seq": 10, "chain": "c10"}, "X": {"seq": 4, "chain": "x4"}}


def test_a_file_replaced_by_one_of_the_same_size_is_reopened(tmp_path):
    path = str(tmp_path / "k.key.head")
    head = HeadFile(path, "commit")
    head.advance("L", 1, "c1")
    head.advance("L", 2, "c2")
    inode = os.stat(path).st_ino
    data, _offset, _slot = _same_layout_other_heads(
        path, {"L": {"seq": 2, "chain": "c2"}, "Y": {"seq": 8, "chain": "y"}}
    )
    tmp = path + ".new"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, data)
    os.close(fd)
    os.replace(tmp, path)  # a new inode of the same size and generations at the path
    assert os.stat(path).st_ino != inode and os.path.getsize(path) == 2 * SIZE
    head.advance("L", 3, "c3")  # written into the new file (not the unlinked one this process had open)
    assert HeadFile(path, "commit").read() == {"L": {"seq": 3, "chain": "c3"}, "Y": {"seq": 8, "chain": "y"}}
    assert head._fds.inode == (os.stat(path).st_dev, os.stat(path).st_ino)


# ---- the per-write look at the path: statx without timestamps (head_stat._identify)
def test_identify_gives_what_stat_gives_and_never_follows_a_link(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"x" * 10)
    os.chmod(path, 0o640)
    st, got = os.stat(path), head_stat._identify(str(path))
    assert (got.st_dev, got.st_ino, got.st_mode, got.st_size) == (st.st_dev, st.st_ino, st.st_mode, st.st_size)
    link = tmp_path / "link"
    link.symlink_to(path)
    assert stat.S_ISLNK(head_stat._identify(str(link)).st_mode)
    with pytest.raises(FileNotFoundError):
        head_stat._identify(str(tmp_path / "missing"))


def test_identify_asks_for_no_timestamp():
    # STATX_ATIME 0x20, STATX_MTIME 0x40, STATX_CTIME 0x80, STATX_BTIME 0x800: asking for any of them would make the
    # next head write take a fine-grained timestamp on Linux >= 6.13 (docs/BENCHMARKS.md, the ledger's throughput)
    assert head_stat._STATX_ASK & (0x20 | 0x40 | 0x80 | 0x800) == 0
    if sys.platform.startswith("linux"):
        assert head_stat._statx is not None  # glibc >= 2.28 here: the statx path is the one measured


def test_without_statx_the_head_file_still_follows_a_replacement_and_refuses_an_open_mode(tmp_path, monkeypatch):
    monkeypatch.setattr(head_stat, "_statx", None)  # another OS or an old libc: os.stat
    path = str(tmp_path / "k.key.head")
    head = HeadFile(path, "commit")
    head.advance("L", 1, "c1")
    other = HeadFile(path, "commit")
    other._fds.close()
    os.replace(path, path + ".old")  # a missing file: written whole again, and followed by the first writer
    other.advance("L", 5, "c5")
    head.advance("L", 6, "c6")
    assert HeadFile(path, "commit").read() == {"L": {"seq": 6, "chain": "c6"}}
    os.chmod(path, 0o620)
    with pytest.raises(KeyFileError, match="chmod 600"):
        head.advance("L", 7, "c7")
