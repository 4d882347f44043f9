"""Confinement for user code: a child process without the ledger's key, secrets or ledger handle.

``spawn`` starts ``python -m MODULE`` with a scrubbed environment (``child_environment``: an allow-list, no
``SAGE_KEY_FILE``, ``PGPASSWORD`` or any other secret; ``HOME`` and ``TMPDIR`` a private folder), every file
descriptor closed but the ones passed, and a ``Confinement`` the child applies to itself with ``confine`` before
it runs any user code: Linux Landlock (``landlock_create_ruleset`` / ``add_rule`` / ``restrict_self`` after
``PR_SET_NO_NEW_PRIVS``) lets it read only the system and Python install, sage-tfx's own package folders and the
folders it is given, and write only the folders it is given. Landlock also keeps it from tracing, or reading the
memory of, the launcher; with ABI 4 and ``network=False`` it opens no TCP connection, with ABI 6 it signals no
process outside its domain. Where the kernel has no Landlock, ``confine`` warns and the separate process and the
scrubbed environment still apply (docs/security.md, "User code runs without the key"). A root launcher starts the
child as an unprivileged OS user (``child_user``, default 65534:65534) where that user can run it, so the key
file's mode keeps it out too.

Standard library only: no TensorFlow, no ledger.
"""

from __future__ import annotations

import ctypes
import functools
import json
import os
import stat
import subprocess
import sys
import warnings
from dataclasses import asdict, dataclass, field

from sage_tfx.privacy.errors import SageError

# syscall numbers (the same on x86_64 and aarch64) and the access rights of linux/landlock.h
_CREATE_RULESET, _ADD_RULE, _RESTRICT_SELF = 444, 445, 446
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_DUMPABLE, _PR_CAPBSET_DROP, _CAP_LAST = 4, 24, 63
_CAPABILITY_VERSION_3 = 0x20080522
EXECUTE, WRITE_FILE, READ_FILE, READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
_FS_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 5: (1 << 16) - 1}  # + REFER, TRUNCATE, IOCTL_DEV
_FILE_RIGHTS = EXECUTE | WRITE_FILE | READ_FILE | (1 << 14) | (1 << 15)  # the rights a rule on a file may carry
_NET_TCP = 3  # BIND_TCP | CONNECT_TCP (ABI 4)
_SCOPE_SIGNAL = 2  # ABI 6 (abstract unix sockets stay usable: the channel is a socket pair)
READ = EXECUTE | READ_FILE | READ_DIR

SYSTEM_READ = ("/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin", "/etc", "/sys", "/opt")
# /proc: read, as TensorFlow needs its own /proc/self in every process the child starts (Beam's worker
# subprocesses abort without it), and a rule on /proc/self would name the child's pid only. Landlock's ptrace rule
# still refuses the launcher's memory (/proc/PID/mem: where the key is once read); the launcher makes itself
# non-dumpable before its first child (``guard_launcher``) and the child drops every capability
# (``drop_capabilities``), so the launcher's environment and memory maps are refused too. Its command line stays
# readable (docs/security.md).
PROC_READ = ("/proc",)
# Of /dev, only these (never a disk: a raw read of the device would bypass every file rule), and /dev/shm.
DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty")
# Environment variables a confined child keeps (no secret among them); every other one is dropped.
KEPT_ENVIRONMENT = (
    "PATH",
    "LANG",
    "LANGUAGE",
    "TZ",
    "TERM",
    "PYTHONHASHSEED",
    "PYTHONDONTWRITEBYTECODE",
    "PYTHONWARNINGS",
    "PYTHONUNBUFFERED",
    "TF_CPP_MIN_LOG_LEVEL",
    "TF_ENABLE_ONEDNN_OPTS",
    "OMP_NUM_THREADS",
    "CUDA_VISIBLE_DEVICES",
    "SOURCE_DATE_EPOCH",
)
KEPT_PREFIXES = ("LC_",)
# An operator's own opt-in: names listed here (comma-separated) pass to the child too, e.g. the credentials of a
# gs:// pipeline root. Nothing is passed by default.
PASS_ENVIRONMENT = "SAGE_CONFINED_ENV"
CONFINEMENT_ENV = "SAGE_CONFINEMENT"  # the child's Confinement, as JSON
# A root launcher's children run as this user ("UID:GID"; "off": as root, under Landlock only) ...
USER_ENV = "SAGE_CONFINED_USER"
DEFAULT_USER = "65534:65534"  # nobody:nogroup
# ... with this interpreter (default: the launcher's), which that user must be able to run
PYTHON_ENV = "SAGE_CONFINED_PYTHON"


class ConfinementError(SageError, RuntimeError):
    """Landlock was available but could not be applied: the child stops before any user code."""


@dataclass
class Confinement:
    """What a confined child may touch: ``read`` folders or files (besides the system's, Python's and sage-tfx's),
    ``write`` folders (read and write), and whether it may use TCP (``network``). ``landlock`` False skips
    Landlock (tests of the separate OS user alone)."""

    read: list = field(default_factory=list)
    write: list = field(default_factory=list)
    network: bool = True
    landlock: bool = True  # False only in tests of what the separate OS user alone keeps out

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Confinement:
        return cls(**json.loads(text))

    def readable(self) -> list:
        """Every path the child may read: the system's, Python's, sage-tfx's package folders and ``read``."""
        return sorted(
            {*SYSTEM_READ, *PROC_READ, sys.prefix, sys.base_prefix, *python_paths(), *package_paths(), *self.read}
        )

    def exposes(self, secret: str, granted_only: bool = False) -> str | None:
        """The granted path (read or write) under which ``secret`` (a file or folder) lies, or None;
        ``granted_only``: among ``read`` and ``write`` only (not the system's)."""
        secret = os.path.realpath(secret)
        paths = [*self.read, *self.write] if granted_only else [*self.readable(), *self.write, *DEVICES, "/dev/shm"]
        for granted in paths:
            real = os.path.realpath(granted)
            if secret == real or secret.startswith(real.rstrip(os.sep) + os.sep):
                return granted
        return None

    def exposes_any(self, secrets) -> bool:
        """Whether any of ``secrets`` lies under ``read`` or ``write``."""
        return any(self.exposes(secret, granted_only=True) for secret in secrets)


def python_paths() -> list:
    """The folders of ``sys.path`` inside the Python install (the standard library, site-packages)."""
    roots = (os.path.realpath(sys.prefix), os.path.realpath(sys.base_prefix))
    return [p for p in sys.path if p and os.path.realpath(p).startswith(roots)]


def package_paths() -> list:
    """sage-tfx's own package folders (an editable install keeps them in the checkout, never the whole checkout)."""
    import sage_tfx  # noqa: PLC0415

    folders = list(sage_tfx.__path__)
    for sub in ("components", "pipelines"):
        spec = __import__("importlib.util").util.find_spec(f"sage_tfx.{sub}")
        folders.extend(spec.submodule_search_locations or [])
    return folders


def child_environment(private_tmp: str, extra: dict | None = None) -> dict:
    """The environment of a confined child: the allow-listed variables, the names the operator listed in
    ``SAGE_CONFINED_ENV``, ``HOME`` and ``TMPDIR`` set to ``private_tmp``, and ``extra``."""
    passed = {n.strip() for n in os.environ.get(PASS_ENVIRONMENT, "").split(",") if n.strip()}
    env = {k: v for k, v in os.environ.items() if k in KEPT_ENVIRONMENT or k.startswith(KEPT_PREFIXES) or k in passed}
    env.update(HOME=private_tmp, TMPDIR=private_tmp, PYTHONNOUSERSITE="1")
    env.update(extra or {})
    return env


def spawn(
    module: str, args: list, confinement: Confinement, private_tmp: str, pass_fds=(), env=None, **popen
) -> subprocess.Popen:
    """Start ``python -m module *args`` confined: scrubbed environment (``child_environment``), only ``pass_fds``
    inherited, its ``Confinement`` in ``SAGE_CONFINEMENT`` (the child calls ``confine`` first thing); as the
    unprivileged ``child_user`` when the launcher is root and that user can reach the child's folders (its
    ``write`` folders and ``private_tmp`` are given to it first), else as the launcher's user."""
    environment = child_environment(private_tmp, {CONFINEMENT_ENV: confinement.to_json(), **(env or {})})
    python = sys.executable
    user, _ = child_user()
    if user is not None and not unreachable(user, confinement.read, [*confinement.write, private_tmp]):
        for folder in (*confinement.write, private_tmp):
            give_folder(folder, user)
        popen.update(user=user.uid, group=user.gid, extra_groups=[])
        python = user.python
        environment.update(interpreter_environment(python, environment.get("PYTHONPATH")))
    guard_launcher()
    return subprocess.Popen(
        [python, "-m", module, *args],
        env=environment,
        close_fds=True,
        pass_fds=tuple(pass_fds),
        cwd=private_tmp,
        **popen,
    )


@dataclass(frozen=True)
class ChildUser:
    """The OS user (``uid``, ``gid``) a root launcher's confined children run as, and their interpreter."""

    uid: int
    gid: int
    python: str


def child_user() -> tuple:
    """(the ``ChildUser`` confined children run as, or None; one line saying which, or why none). Only a root
    launcher switches (``SAGE_CONFINED_USER``, default 65534:65534; ``off``: none), and only where that user can
    run the interpreter (``SAGE_CONFINED_PYTHON``, default the launcher's) with sage-tfx (a probe, once per
    process). ConfinementError for a ``SAGE_CONFINED_USER`` that is not UID:GID of a user other than root."""
    if not sys.platform.startswith("linux") or os.geteuid() != 0:
        return None, "the launcher is not root: confined children run as its OS user (Landlock keeps the key out)"
    text = os.environ.get(USER_ENV, DEFAULT_USER).strip()
    if text.lower() == "off":
        return None, f"{USER_ENV}=off: confined children run as root, under Landlock"
    uid, _, gid = text.partition(":")
    if not (uid.isdigit() and (gid or uid).isdigit()) or int(uid) == 0:
        raise ConfinementError(
            f"{USER_ENV}={text!r} is not UID:GID of a user other than root: give e.g. {DEFAULT_USER} (nobody), or off"
        )
    user = ChildUser(int(uid), int(gid or uid), os.environ.get(PYTHON_ENV) or sys.executable)
    refusal = _refusal(user)
    if refusal is not None:
        return None, refusal
    return user, f"confined children run as uid {user.uid} gid {user.gid} ({user.python})"


@functools.cache
def _refusal(user: ChildUser) -> str | None:
    """Why ``user`` cannot run a confined child on this host (its interpreter importing sage-tfx), or None."""
    env = interpreter_environment(user.python, None, {"PATH": os.environ.get("PATH", "/usr/bin:/bin")})
    try:
        probe = subprocess.run(
            [user.python, "-c", "import sage_tfx.isolation"],
            user=user.uid,
            group=user.gid,
            extra_groups=[],
            env=env,
            cwd="/",
            capture_output=True,
            text=True,
            timeout=300,
        )
    except OSError as exc:
        why = exc.strerror or type(exc).__name__
    except subprocess.TimeoutExpired:
        why = "the probe timed out"
    else:
        if probe.returncode == 0:
            return None
        why = (probe.stderr.strip().splitlines() or [f"exit code {probe.returncode}"])[-1]
    return (
        f"uid {user.uid} cannot run {user.python} with sage-tfx ({why}): confined children run as root, under "
        f"Landlock; set {PYTHON_ENV} to an interpreter whose folders others may read, or {USER_ENV}=off"
    )


def interpreter_environment(python: str, path: str | None, env: dict | None = None) -> dict:
    """``env`` plus, for an interpreter other than the launcher's, a ``PYTHONPATH`` holding the launcher's
    site-packages (not its standard library) and sage-tfx's checkout (after ``path``, the caller's own entries)."""
    env = dict(env or {})
    if os.path.realpath(python) != os.path.realpath(sys.executable):
        import sage_tfx  # noqa: PLC0415

        base = os.path.realpath(sys.base_prefix) + os.sep  # the launcher's standard library: never the other's
        entries = [path] if path else []
        entries += [p for p in python_paths() if not os.path.realpath(p).startswith(base)]
        entries.append(os.path.dirname(os.path.abspath(sage_tfx.__path__[0])))
        env["PYTHONPATH"] = os.pathsep.join(entries)
    return env


def unreachable(user: ChildUser, read, write) -> list:
    """The paths of ``read`` and ``write`` that ``user`` cannot reach: a folder on the way it may not search, or,
    for ``read``, a file or folder under it (itself included) it may not read (a missing path is skipped, as
    Landlock skips it). The ``write`` folders' own modes do not matter: they are given to it (``give_folder``)."""
    blocked = []
    for path, readable in [(p, True) for p in read] + [(p, False) for p in write]:
        real = os.path.realpath(path)
        if not os.path.exists(real):
            continue
        folder, ok = real, True
        while ok and folder != os.path.dirname(folder):
            folder = os.path.dirname(folder)
            ok = _allows(os.stat(folder), user, stat.S_IXOTH)
        if ok and readable:
            ok = all(
                _allows(os.lstat(p), user, stat.S_IROTH | (stat.S_IXOTH if os.path.isdir(p) else 0))
                for p in _tree(real)
            )
        if not ok:
            blocked.append(path)
    return blocked


def _tree(path):
    yield path
    if os.path.isdir(path) and not os.path.islink(path):
        for root, dirs, files in os.walk(path):
            for name in dirs + files:
                yield os.path.join(root, name)


def _allows(st, user: ChildUser, other_bits: int) -> bool:
    """Whether ``st``'s mode grants ``user`` the rights ``other_bits`` (given as the "others" bits)."""
    if stat.S_ISLNK(st.st_mode):
        return True
    shift = 6 if st.st_uid == user.uid else 3 if st.st_gid == user.gid else 0
    return st.st_mode & (other_bits << shift) == other_bits << shift


def give_folder(folder: str, user: ChildUser) -> None:
    """Make ``folder`` and everything under it ``user``'s (a symbolic link is re-owned, never followed)."""
    if not os.path.isdir(folder) or os.path.islink(folder):
        return
    os.chown(folder, user.uid, user.gid)
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            os.lchown(os.path.join(root, name), user.uid, user.gid)


def guard_launcher() -> None:
    """Make this process (the launcher) non-dumpable: its /proc/PID files then belong to root and need
    CAP_SYS_PTRACE to read, which no confined child has (``drop_capabilities``), so a child reads neither the
    launcher's environment (a ``PGPASSWORD`` set there) nor its memory maps. Exec resets it in each child."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def drop_capabilities() -> None:
    """Drop every capability of THIS process for good (bounding set, then effective, permitted and inheritable):
    a child started as root keeps its user id but may no longer override file modes, trace or read another
    process's /proc files, or mount. ConfinementError if the kernel refuses (it cannot refuse a reduction)."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in range(_CAP_LAST + 1):
        libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0)  # EPERM without CAP_SETPCAP, EINVAL past the last: both fine
    header, data = _CapHeader(_CAPABILITY_VERSION_3, 0), (_CapData * 2)()
    if libc.capset(ctypes.byref(header), data) != 0:
        raise ConfinementError(f"capset (dropping every capability) failed: {os.strerror(ctypes.get_errno())}")


def landlock_abi() -> int:
    """The kernel's Landlock ABI version, 0 where Landlock is missing or disabled (or the host is not Linux)."""
    if not sys.platform.startswith("linux"):
        return 0
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    version = libc.syscall(
        ctypes.c_long(_CREATE_RULESET), None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION)
    )
    return max(0, int(version))


class _RulesetAttr(ctypes.Structure):
    _fields_ = [
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    ]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def confine(confinement: Confinement) -> int:
    """Restrict THIS process (and all it starts) to ``confinement`` with Landlock; return the ABI used (0: none).

    Irreversible. Every capability is dropped first (``drop_capabilities``). Without Landlock it warns
    (RuntimeWarning) and returns 0: the caller still runs without the key and secrets, but may read whatever its
    OS user can. ConfinementError if Landlock is there but fails."""
    drop_capabilities()
    if not confinement.landlock:
        return 0
    abi = landlock_abi()
    if abi <= 0:
        warnings.warn(
            "Landlock is not available on this kernel: the confined pipeline runs in its own process "
            "without the key file's path, the ledger or any secret in its environment, but it can read "
            "every file its OS user can (docs/security.md)",
            RuntimeWarning,
            stacklevel=2,
        )
        return 0
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    handled = _FS_BY_ABI[max(v for v in _FS_BY_ABI if v <= abi)]
    attr = _RulesetAttr(
        handled, _NET_TCP if abi >= 4 and not confinement.network else 0, _SCOPE_SIGNAL if abi >= 6 else 0
    )
    size = ctypes.sizeof(_RulesetAttr) if abi >= 6 else (16 if abi >= 4 else 8)
    ruleset = libc.syscall(
        ctypes.c_long(_CREATE_RULESET), ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0)
    )
    if ruleset < 0:
        raise ConfinementError(f"landlock_create_ruleset failed: {os.strerror(ctypes.get_errno())}")
    try:
        rules = [(p, READ) for p in confinement.readable()]
        rules += [(d, READ_FILE | WRITE_FILE | (1 << 15)) for d in DEVICES] + [("/dev/shm", handled)]
        rules += [(p, handled) for p in confinement.write]
        for path, access in rules:
            _add_rule(libc, ruleset, path, access & handled)
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise ConfinementError(f"prctl(PR_SET_NO_NEW_PRIVS) failed: {os.strerror(ctypes.get_errno())}")
        if libc.syscall(ctypes.c_long(_RESTRICT_SELF), ctypes.c_int(ruleset), ctypes.c_uint32(0)) != 0:
            raise ConfinementError(f"landlock_restrict_self failed: {os.strerror(ctypes.get_errno())}")
    finally:
        os.close(ruleset)
    return abi


def _add_rule(libc, ruleset, path, access):
    """Allow ``access`` beneath ``path`` (a missing path is skipped: nothing to allow)."""
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return
    try:
        if not os.path.isdir(path):
            access &= _FILE_RIGHTS
        rule = _PathBeneath(access, fd)
        if (
            libc.syscall(
                ctypes.c_long(_ADD_RULE),
                ctypes.c_int(ruleset),
                ctypes.c_int(_RULE_PATH_BENEATH),
                ctypes.byref(rule),
                ctypes.c_uint32(0),
            )
            != 0
        ):
            raise ConfinementError(f"landlock_add_rule on {path} failed: {os.strerror(ctypes.get_errno())}")
    finally:
        os.close(fd)


def confine_from_environment() -> int:
    """``confine`` with the ``Confinement`` the launcher put in ``SAGE_CONFINEMENT`` (removed from the
    environment first); ConfinementError if there is none: a confined entry point never runs unconfined."""
    text = os.environ.pop(CONFINEMENT_ENV, None)
    if not text:
        raise ConfinementError(
            f"no {CONFINEMENT_ENV} in the environment: this entry point runs only as a child of "
            "the sage launcher (sage_tfx.isolation.spawn)"
        )
    return confine(Confinement.from_json(text))
