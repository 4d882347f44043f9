"""Property-based input tests (Hypothesis) over the CLI's and the Ledger API's inputs.

Each example changes ONE argument of a well-formed call to a wild value (huge, negative, NaN, inf, unicode, empty,
path-like, not a number...) and runs it on a fresh copy of a real ledger folder: the call either succeeds, or is
refused (the CLI: exit 2 or, for a well-formed charge the budget cannot cover, 3; the API: a SageError) with a
message naming the value, and then every file under the folder (ledger database, key file, head file, data root)
is byte-identical to before and no file or folder appeared. Never a traceback, never exit 1 on bad input.

The CLI runs in this process (``sage_tfx.cli.main``), as tests/privacy/test_ledger_bad_input.py does for PostgreSQL, to keep
it fast. Hypothesis is derandomized (a fixed seed, no example database) with a bounded example count, so CI runs
the same examples every time (SAGE_FUZZ_EXAMPLES and SAGE_FUZZ_RANDOM search longer); each fixed bug keeps its
input as an ``@example``. SQLite, no TensorFlow.
"""

import argparse
import collections
import contextlib
import hashlib
import io
import math
import os
import shutil

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from sage_tfx.cli import main
from sage_tfx.cli.ledger import parse_time
from sage_tfx.privacy import BudgetRefused, Ledger, SageError

DAY = 86400.0
# SAGE_FUZZ_EXAMPLES=N (and SAGE_FUZZ_RANDOM=1 for fresh random examples) searches longer, outside CI
FUZZ = settings(
    derandomize=not os.environ.get("SAGE_FUZZ_RANDOM"),
    database=None,
    deadline=None,
    max_examples=int(os.environ.get("SAGE_FUZZ_EXAMPLES", "60")),
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

SPECIAL_NUMBERS = [
    "nan",
    "NaN",
    "inf",
    "-inf",
    "Infinity",
    "1e309",
    "-1e309",
    "1e-400",
    "-0",
    "0",
    "-1",
    "1e300",
    "-1e300",
    "9" * 40,
    "-" + "9" * 40,
    "0x10",
    "1_000",
    "",
    " ",
    "1,5",
    "\u0663",
    "\uff11",
    "1e",
    "0.1.2",
]
SPECIAL_NAMES = [
    "",
    ".",
    "..",
    "../x",
    "a/b",
    "/abs",
    "s",
    "b0",
    "-x",
    "a" * 129,
    "\u540d\u524d",
    "a\x00b",
    "a\nb",
    " s",
    "s ",
    "CON",
    "a:b@c+d-e.f",
    "\U0001f600",
]
SPECIAL_TIMES = [
    "1970-01-01",
    "9999-12-31T23:59:59",
    "0001-01-01",
    "2024-02-30",
    "1e300",
    "-1e300",
    "nan",
    "inf",
    "2024-01-01T00:00:00+14:00",
    "2024-01-01T00:00:00-23:59",
    "",
    "now",
    "1e18",
    "-62135596801",
]

numbers_text = st.one_of(
    st.sampled_from(SPECIAL_NUMBERS),
    st.floats().map(repr),
    st.integers(-(10**30), 10**30).map(str),
    st.text(max_size=8),
)
names_text = st.one_of(
    st.sampled_from(SPECIAL_NAMES),
    st.text(max_size=40),
    st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._:@+-]{0,140}", fullmatch=True),
)
times_text = st.one_of(
    st.sampled_from(SPECIAL_TIMES),
    st.datetimes().map(lambda d: d.isoformat()),
    st.floats().map(repr),
    st.text(max_size=25),
)
# path-like names, relative to the folder of the example (``{root}`` is put in front of those starting with /)
paths_text = st.one_of(
    st.sampled_from(
        [
            "",
            ".",
            "..",
            "{root}",
            "{root}/nope/x",
            "{root}/ledger.db/x",
            "{root}/ledger.db.key",
            "{root}/data",
            "/proc/1/nope",
            "/dev/null",
            "a\x00b",
            "{root}/" + "x" * 300,
        ]
    ),
    names_text.map(lambda n: "{root}/" + n),
)


# outcome -> examples run (shown with pytest -s): "refused" (cleanly, else the test fails) or "accepted"
TALLY = collections.Counter()


@pytest.fixture(autouse=True)
def _no_env_key(monkeypatch):
    monkeypatch.delenv("SAGE_KEY_FILE", raising=False)


@pytest.fixture(scope="module", autouse=True)
def _tally():
    yield
    print(
        f"\nfuzzed inputs: {sum(TALLY.values())} examples, {TALLY['refused']} refused cleanly, "
        f"{TALLY['accepted']} accepted; 0 tracebacks, 0 state changes on refusal"
    )


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    """A real ledger folder: stream s (blocks b0, b1 by time, b2 a shard; p registered, one grant), empty stream
    e, a data root folder."""
    root = tmp_path_factory.mktemp("fuzz-template")
    (root / "data").mkdir()
    with Ledger.open(str(root / "ledger.db"), create=True) as ledger:
        ledger.create_stream("s", 1.0, 1e-6)
        ledger.create_stream("e", 1.0, 1e-6)
        ledger.register("s", "p")
        ledger.add_block("s", "b0", start=0.0, end=DAY, rows=10)
        ledger.add_block("s", "b1", start=DAY, end=2 * DAY, rows=10)
        ledger.add_block("s", "b2", shard=3, rows=10)
        ledger.request("p", "s", blocks=["b0"], epsilon=0.1)
    return root


class Folder:
    """A fresh copy of the template for each example, and the hash of every file and folder under it."""

    def __init__(self, template, tmp_path):
        self.template, self.root = template, tmp_path / "case"

    def fresh(self):
        shutil.rmtree(self.root, ignore_errors=True)
        shutil.copytree(self.template, self.root)
        return str(self.root)

    def state(self):
        out = {}
        for folder, _dirs, files in os.walk(self.root):
            rel = os.path.relpath(folder, self.root)
            if rel.endswith(".claims"):  # the pipeline claims' lock files (Ledger.claim), held while a run lasts
                continue
            out[rel + "/"] = None
            for name in files:
                if name.endswith((".lock", "-wal", "-shm")):  # lock files and SQLite's transient files
                    continue
                with open(os.path.join(folder, name), "rb") as f:
                    out[os.path.join(rel, name)] = hashlib.sha256(f.read()).hexdigest()
        return out


@pytest.fixture
def folder(template, tmp_path):
    return Folder(template, tmp_path)


def cli(argv):
    """``sage ARGV`` in this process -> (exit code, stdout, stderr); argparse's own refusals exit 2 too."""
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            code = main(argv)
        except SystemExit as exc:
            code = exc.code
    return code, stdout.getvalue(), stderr.getvalue()


def renderings(value):
    """The ways an error message may show ``value``: as given, or as the number or unix time it parses to."""
    out = {str(value), repr(value), str(value).strip()}
    if isinstance(value, str) and value and "\x00" not in value:
        out.add(os.path.abspath(value))
    try:
        number = parse_time(value) if isinstance(value, str) else float(value)
    except (TypeError, ValueError, OverflowError, argparse.ArgumentTypeError):
        return out
    out |= {repr(number), f"{number:g}", f"{number:.3g}"}
    if math.isfinite(number) and number == int(number):
        out.add(str(int(number)))
    return out


def names_value(message, value):
    """The message shows ``value`` (None is a value left out, and an empty text shows as nothing: the message says
    what to give instead)."""
    if value is None or (isinstance(value, str) and value.strip() == ""):
        return True
    return any(r and r in message for r in renderings(value))


def check_cli(folder, argv, value, codes=(0, 2), named=True):
    """Run ``argv`` on a fresh folder: exit 0 (anything may change) or a refusal in ``codes`` that names ``value``
    (``named``: True, or the message the well-formed call is refused with: then only another message must name
    it), changes nothing and shows no traceback."""
    root = folder.fresh()
    before = folder.state()
    argv = [a.replace("{root}", root) for a in argv]
    value = value.replace("{root}", root) if isinstance(value, str) else value
    with contextlib.chdir(root):  # a relative path names a place in the folder
        code, out, err = cli(argv)
        assert "Traceback" not in err and "Traceback" not in out, (argv, err)
        assert code in (0,) + tuple(codes), (argv, code, err)
        if code == 2 and (named is True or err != named):
            assert names_value(err, value), (argv, err)
    if code != 0:
        assert folder.state() == before, (argv, err)
        assert err.strip(), argv
    TALLY["accepted" if code == 0 else "refused"] += 1
    return code, err


# ------------------------------------------------------------------------------------------ sage ledger ...
LEDGER_ARGS = {
    "init": (
        ["--stream", "s2", "--epsilon", "1", "--delta", "1e-6"],
        {
            "--stream": names_text,
            "--epsilon": numbers_text,
            "--delta": numbers_text,
            "--min-epsilon": numbers_text,
            "--min-grant-epsilon": numbers_text,
            "--max-epsilon": numbers_text,
            "--query-delta-share": numbers_text,
            "--policy-param": names_text,
        },
    ),
    "add-block": (
        ["--stream", "s", "--block", "b9", "--start", str(5 * DAY), "--end", str(6 * DAY)],
        {
            "--stream": names_text,
            "--block": names_text,
            "--start": times_text,
            "--end": times_text,
            "--shard": numbers_text,
            "--rows": numbers_text,
        },
    ),
    "status": (["--stream", "s"], {"--stream": names_text}),
    "audit": ([], {}),
    "upgrade": ([], {}),
    "charge": (
        ["--stream", "s", "--pipeline", "p", "--blocks", "b1", "--epsilon", "0.1"],
        {
            "--stream": names_text,
            "--pipeline": names_text,
            "--blocks": names_text,
            "--epsilon": numbers_text,
            "--delta": numbers_text,
            "--split": names_text,
        },
    ),
}


def _ledger_argv(action, flag, value):
    """``sage ledger ACTION`` with the well-formed arguments, ``flag`` given ``value`` instead."""
    base, _ = LEDGER_ARGS[action]
    if flag in ("--shard", "--rows"):  # a shard block: no window
        base = ["--stream", "s", "--block", "b9"] + (["--shard", "9"] if flag == "--rows" else [])
    argv = ["ledger", action, "--db", value if flag == "--db" else "{root}/ledger.db"]
    if flag in base:
        base = base[: base.index(flag)] + base[base.index(flag) + 2 :]
    argv += base
    if flag != "--db":
        argv.append(f"{flag}={value}")  # '=': a value starting with - is the value, not a flag
    return argv


ledger_calls = st.one_of(
    *[
        st.tuples(st.just(action), st.sampled_from(sorted(flags) + ["--db"])).flatmap(
            lambda t, flags=flags: st.tuples(
                st.just(t[0]), st.just(t[1]), paths_text if t[1] == "--db" else flags[t[1]]
            )
        )
        for action, (_, flags) in LEDGER_ARGS.items()
    ]
)


@FUZZ
@given(ledger_calls)
@example(("add-block", "--rows", "9223372036854775808"))  # beyond SQLite's INTEGER: was an OverflowError traceback
@example(("add-block", "--shard", "9" * 40))
@example(("add-block", "--end", "1e300"))  # a window no date names: `status` crashed for good after it
@example(("add-block", "--start", "-62135596801"))
@example(("charge", "--blocks", ","))  # the empty block set did not show what was given
@example(("init", "--db", "a\x00b"))  # a NUL byte in the path: a ValueError traceback from sqlite3
def test_sage_ledger_refuses_bad_values_changing_nothing(folder, call):
    action, flag, value = call
    argv = _ledger_argv(action, flag, value)
    check_cli(folder, argv, value, codes=(2, 3) if action == "charge" else (2,))


# ------------------------------------------------------------------------------------------ sage ingest
INGEST_BASE = [
    "ingest",
    "--db",
    "{root}/ledger.db",
    "--stream",
    "s",
    "--input",
    "{root}/nope.csv",
    "--data-root",
    "{root}/data",
    "--time-column",
    "t",
    "--window",
    "1d",
]
INGEST_FLAGS = {
    "--stream": names_text,
    "--window": st.one_of(names_text, numbers_text.map(lambda n: n + "d")),
    "--time-column": names_text,
    "--data-root": paths_text,
    "--input": paths_text,
    "--shards": numbers_text,
    "--user-column": names_text,
    "--hash-key": names_text,
}


@FUZZ
@example(("--window", "99999999999w"))  # beyond 999 years: its blocks were no date ranges
@given(st.sampled_from(sorted(INGEST_FLAGS)).flatmap(lambda f: st.tuples(st.just(f), INGEST_FLAGS[f])))
def test_sage_ingest_refuses_bad_values_changing_nothing(folder, call):
    """The input file does not exist: every example is refused (exit 2) before Beam loads, changing nothing."""
    flag, value = call
    argv = list(INGEST_BASE)
    if flag in ("--shards", "--user-column", "--hash-key"):
        argv[argv.index("--time-column") :] = ["--block-by", "user", "--user-column", "u", "--shards", "4"]
    if flag in argv:
        del argv[argv.index(flag) : argv.index(flag) + 2]
    argv.append(f"{flag}={value}")
    code, err = check_cli(folder, argv, value, named=base_refusal(folder, INGEST_BASE))
    assert code == 2, (argv, err)


def base_refusal(folder, argv):
    """What the well-formed ``argv`` is refused with (the example's values then passed the checks before it)."""
    root = folder.fresh()
    with contextlib.chdir(root):
        code, _, err = cli([a.replace("{root}", root) for a in argv])
    assert code == 2, err
    return err


# ------------------------------------------------------------------------------------------ sage run
RUN_BASE = [
    "run",
    "taxi_regression",
    "--db",
    "{root}/ledger.db",
    "--stream",
    "s",
    "--data-root",
    "{root}/data",
    "--target",
    "1.0",
    "--work-dir",
    "{root}/work",
]
RUN_FLAGS = {
    "--target": numbers_text,
    "--confidence": numbers_text,
    "--max-iterations": numbers_text,
    "--max-seconds": numbers_text,
    "--epsilon-start": numbers_text,
    "--min-window": numbers_text,
    "--name": names_text,
    "--work-dir": paths_text,
    "--data-root": paths_text,
    "--stream": names_text,
    "--rejection-share": numbers_text,
    "--schedule": names_text,
    "--model": names_text,
}


@FUZZ
@given(st.sampled_from(sorted(RUN_FLAGS)).flatmap(lambda f: st.tuples(st.just(f), RUN_FLAGS[f])))
def test_sage_run_refuses_bad_values_changing_nothing(folder, call):
    """The data root holds no blocks of the stream: every example is refused (exit 2) before any charge."""
    flag, value = call
    argv = list(RUN_BASE)
    if flag in argv:
        del argv[argv.index(flag) : argv.index(flag) + 2]
    argv.append(f"{flag}={value}")
    code, err = check_cli(folder, argv, value, named=base_refusal(folder, RUN_BASE))
    assert code == 2, (argv, err)


# ------------------------------------------------------------------------------------------ the Ledger API
wild = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(),
    st.sampled_from([math.nan, math.inf, -math.inf, 0.0, -0.0, 1e-320, 1e308]),
    st.text(max_size=20),
    st.sampled_from(SPECIAL_NAMES),
    st.lists(st.text(max_size=3), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)

# (method, the well-formed call's keyword arguments)
API_CALLS = {
    "create_stream": dict(
        name="s2",
        epsilon=1.0,
        delta=1e-6,
        min_epsilon=0.01,
        min_grant_epsilon=0.01,
        max_epsilon=10.0,
        query_delta_share=None,
        policy="conserve",
        accounting="basic",
    ),
    "add_block": dict(stream="s", block_id="b9", start=5 * DAY, end=6 * DAY, shard=None, rows=10, digest=None),
    "add_blocks": dict(stream="s", blocks=[{"id": "b9", "start": 5 * DAY, "end": 6 * DAY, "rows": 10}]),
    "request": dict(pipeline="p", stream="s", blocks=["b1"], epsilon=0.1, delta=0.0),
    "request_window": dict(pipeline="p", stream="s", window=(DAY, 2 * DAY), epsilon=0.1, delta=0.0),
    "release": dict(stage="training", computation="c", epsilon=0.05, delta=0.0),
    "record_outcome": dict(outcome="RETRY", details=None),
    "register": dict(stream="s", pipeline="p2"),
    "finish": dict(stream="s", pipeline="p", outcome="ACCEPT"),
    "record_trusted_read": dict(stream="s", blocks=["b0"], purpose="baseline"),
}


def _call(ledger, method, kwargs):
    if method == "add_block" and kwargs["shard"] is not None:  # a shard block: no window
        kwargs = dict(kwargs, start=None, end=None)
    if method == "request_window":
        return ledger.request(**kwargs)
    if method in ("release", "record_outcome"):
        grant = ledger.grants("s")[0]
        return getattr(ledger, method)(grant if method == "release" else grant.id, **kwargs)
    return getattr(ledger, method)(**kwargs)


api_calls = st.sampled_from(sorted(API_CALLS)).flatmap(
    lambda m: st.tuples(st.just(m), st.sampled_from(sorted(API_CALLS[m])), wild)
)


@FUZZ
@given(api_calls)
# each was a traceback (TypeError, ValueError, OverflowError or sqlite3's binding error), or a message without it
@example(("request", "blocks", False))
@example(("request", "stream", []))
@example(("record_outcome", "details", "0"))
@example(("record_outcome", "details", True))
@example(("record_trusted_read", "blocks", None))
@example(("add_blocks", "blocks", None))
@example(("add_blocks", "stream", []))
@example(("finish", "pipeline", []))
@example(("add_block", "rows", 2**63))
@example(("create_stream", "epsilon", 0.0078125))  # below min_epsilon: the message now shows epsilon
def test_ledger_api_refuses_bad_values_changing_nothing(folder, call):
    method, name, value = call
    root = folder.fresh()
    before = folder.state()
    kwargs = dict(API_CALLS[method], **{name: value})
    with Ledger.open(os.path.join(root, "ledger.db")) as ledger:
        try:
            _call(ledger, method, kwargs)
        except BudgetRefused:
            refused = None
        except SageError as exc:
            refused = str(exc)
        else:
            TALLY["accepted"] += 1
            return
    assert folder.state() == before, (method, name, value)
    TALLY["refused"] += 1
    if refused is not None and name not in ("blocks", "window"):
        assert names_value(refused, value), (method, name, value, refused)
