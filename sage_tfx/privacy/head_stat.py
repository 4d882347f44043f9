"""How a ``HeadFile`` looks at and opens its path: ``statx`` without timestamps (``_identify``), no symbolic link and
no access-time update (``_open_head``), so a head write dirties no inode the commit's ``fdatasync`` then waits on.
"""

from __future__ import annotations

import ctypes
import errno
import os
import sys


class _Identity:
    """What ``_identify`` tells of a path: ``st_dev``, ``st_ino``, ``st_mode`` and ``st_size``, as ``os.stat``'s."""

    __slots__ = ("st_dev", "st_ino", "st_mode", "st_size")

    def __init__(self, dev, ino, mode, size) -> None:
        self.st_dev, self.st_ino, self.st_mode, self.st_size = dev, ino, mode, size


class _Statx(ctypes.Structure):  # struct statx (linux/stat.h), 256 bytes
    _fields_ = [
        ("mask", ctypes.c_uint32),
        ("blksize", ctypes.c_uint32),
        ("attributes", ctypes.c_uint64),
        ("nlink", ctypes.c_uint32),
        ("uid", ctypes.c_uint32),
        ("gid", ctypes.c_uint32),
        ("mode", ctypes.c_uint16),
        ("spare0", ctypes.c_uint16),
        ("ino", ctypes.c_uint64),
        ("size", ctypes.c_uint64),
        ("blocks", ctypes.c_uint64),
        ("attributes_mask", ctypes.c_uint64),
        ("times", ctypes.c_uint64 * 8),
        ("rdev_major", ctypes.c_uint32),
        ("rdev_minor", ctypes.c_uint32),
        ("dev_major", ctypes.c_uint32),
        ("dev_minor", ctypes.c_uint32),
        ("spare", ctypes.c_uint64 * 14),
    ]


_STATX_ASK = 0x1 | 0x2 | 0x100 | 0x200  # STATX_TYPE | STATX_MODE | STATX_INO | STATX_SIZE: no timestamp
_AT_FDCWD, _AT_SYMLINK_NOFOLLOW = -100, 0x100


_O_NOATIME = getattr(os, "O_NOATIME", 0)


def _load_statx():
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).statx
    except (OSError, AttributeError):  # a libc without statx (glibc < 2.28, musl < 1.2.5)
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_uint, ctypes.POINTER(_Statx)]
    fn.restype = ctypes.c_int
    return fn


_statx = _load_statx()


def _identify(path):
    """The file at ``path`` (not following a symbolic link), as ``os.stat`` would give it, WITHOUT asking for its
    timestamps: FileNotFoundError if there is none.

    Why not ``os.stat``: on Linux 6.13 and later (multigrain timestamps) a stat that reports ctime/mtime marks the
    inode so that the next write takes a fine-grained timestamp and dirties the inode, which made every head-file
    write's ``fdatasync`` slower (0.03-0.05 ms of about 0.15 on this machine's ext4: docs/BENCHMARKS.md, the
    ledger's throughput). ``statx`` asking for type, mode, inode and size only does not. Where statx is missing
    (another OS, an old libc or kernel, a sandbox refusing it), ``os.stat``."""
    global _statx
    if _statx is not None:
        buf = _Statx()
        if _statx(_AT_FDCWD, os.fsencode(path), _AT_SYMLINK_NOFOLLOW, _STATX_ASK, ctypes.byref(buf)) == 0:
            return _Identity(os.makedev(buf.dev_major, buf.dev_minor), buf.ino, buf.mode, buf.size)
        err = ctypes.get_errno()
        if err not in (errno.ENOSYS, errno.EPERM, errno.EINVAL):
            raise OSError(err, os.strerror(err), path)  # ENOENT gives a FileNotFoundError (PEP 3151)
        _statx = None  # this system cannot: os.stat from now on
    st = os.stat(path, follow_symlinks=False)
    return _Identity(st.st_dev, st.st_ino, st.st_mode, st.st_size)


def _open_head(path):
    """The head file's descriptor, read-write, never through a symbolic link, without access-time updates (each
    would dirty the inode a commit's ``fdatasync`` then waits on) where the OS allows it (the owner's file)."""
    flags = os.O_RDWR | getattr(os, "O_NOFOLLOW", 0)
    if _O_NOATIME:
        try:
            return os.open(path, flags | _O_NOATIME)
        except PermissionError:  # O_NOATIME needs the file's owner: open as before
            pass
    return os.open(path, flags)
