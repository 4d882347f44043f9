"""Scale-out: ingest rows/s of GENERATED rows on 4 Beam setups; `sage serve` ACCEPTs/hour, 1 vs 2 TFX runs at once.

Part 1, ingest (docs/scale_out.md): the same GENERATED taxi-like rows (sage_tfx.data.generator, fitted to
the real Chicago taxi data), spread over ``--files`` CSV files (each input file is read by one worker), are
ingested by ``sage ingest`` on each setup, in one run:

  direct       the DirectRunner in one process: the BASELINE
  direct-mp2   the DirectRunner in multi_processing mode with 2 worker processes
  portable2    Beam's PortableRunner with an EXTERNAL worker pool of 2 workers (sage_tfx.clusters)
  dask2        Beam's DaskRunner on a distributed LocalCluster of 2 worker processes (sage_tfx.clusters)

Every setup's run must register the same blocks with the same row count and content digest as the
baseline's; a bench that timed a wrong result would be worthless, so a mismatch stops it. Each setup's
cluster is started once (its start-up is reported, not timed in rows/s) and warmed up on a small ingest;
the timed runs go in rounds (each round: every setup once, in order). Figures: rows/s of each run, the
median per setup, and the ratio to the baseline (median of the per-round ratios). The machine's cores and
load are reported with them: 2 workers on a 2-core machine cannot be 2x.

Part 2, serve: ``--serve-pipelines`` taxi_regression pipelines with an easy target (they ACCEPT at their
first iteration) on the REAL taxi CSV of the tfx wheel, replayed by ``sage serve`` with ``--parallel 1``
(one TFX run at a time) and ``--parallel 2`` (two at once), one fixed workload each (one iteration per
pipeline); the ACCEPTs are counted from the ledger; ACCEPTs per hour = ACCEPTs / the serve command's wall
time. docs/BENCHMARKS.md has the command and a run.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence

from sage_tfx import comma_lists
from sage_tfx.plots import label_bars, pyplot, save_figure
from sage_tfx.privacy.keys import KeyRing
from sage_tfx.privacy.vocabulary import Outcome

GENERATED = "GENERATED taxi-like rows (sage_tfx.data.generator, fitted to the real Chicago taxi data)"
SETUPS = {
    "direct": "DirectRunner in one process (the baseline)",
    "direct-mp2": "DirectRunner, multi_processing, 2 worker processes",
    "portable2": "PortableRunner, EXTERNAL worker pool of 2 workers (loopback, sage_tfx.clusters)",
    "dask2": "DaskRunner on a distributed LocalCluster of 2 worker processes (loopback, sage_tfx.clusters)",
}
BASELINE = "direct"
TIME_COLUMN = "trip_start_timestamp"
STREAM = "bench"
SERVE_TARGET = 3_000_000  # taxi_regression's MSE target (s^2) that its first iteration ACCEPTs
TINY = {"rows": 20_000, "files": 4, "rows_per_day": 5_000, "warm_rows": 2_000, "repeats": 1}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter  # keep the docstring's list of setups
    parser.add_argument("--rows", type=int, default=1_000_000, help="GENERATED rows to ingest (default 1M)")
    parser.add_argument(
        "--files",
        type=int,
        default=8,
        help="input CSV files the rows are spread over (each file is read by one worker; default 8)",
    )
    parser.add_argument(
        "--rows-per-day",
        type=int,
        default=100_000,
        help="generated rate; daily blocks (default 100,000: 10 blocks of 1M rows)",
    )
    parser.add_argument(
        "--warm-rows",
        type=int,
        default=20_000,
        help="GENERATED rows (in 2 files) of each setup's untimed warm-up ingest (default 20,000)",
    )
    parser.add_argument(
        "--repeats", type=int, default=1, help="timed rounds of the ingest part (each: every setup once; default 1)"
    )
    parser.add_argument(
        "--setups",
        type=comma_lists.names,
        default=",".join(SETUPS),
        help=f"comma list of ingest setups, the first is the baseline (default {','.join(SETUPS)})",
    )
    parser.add_argument("--workers", type=int, default=2, help="workers of the multi-process setups (default 2)")
    parser.add_argument(
        "--serve-pipelines",
        type=int,
        default=2,
        help="pipelines in each `sage serve` run (0: skip the serve part; default 2: the default "
        "run took 11 min on 2 shared cores, docs/BENCHMARKS.md)",
    )
    parser.add_argument(
        "--serve-parallel",
        type=comma_lists.counts,
        default="1,2",
        help="`sage serve --parallel` values to compare, the first is the reference (default 1,2)",
    )
    parser.add_argument(
        "--serve-initial-blocks",
        type=int,
        default=256,
        help="real taxi days replayed before the pipelines start (default 256)",
    )
    parser.add_argument("--serve-timeout", type=float, default=1800.0, help="seconds per serve run (default 1800)")
    parser.add_argument(
        "--tiny",
        action="store_true",
        help=f"a seconds-long check run: {TINY['rows']:,} rows in {TINY['files']} files, 1 round, "
        "no serve part (for tests; not a measurement)",
    )
    parser.add_argument("--plot", default=None, help="write a PNG of the figures to this path")
    parser.add_argument("--seed", type=int, default=0)


def _say(line: str) -> None:
    print(f"bench scale: {line}", file=sys.stderr, flush=True)


def _check_args(args: argparse.Namespace) -> tuple[list[str], list[int]]:
    if args.tiny:
        for key, value in TINY.items():
            setattr(args, key, value)
        args.serve_pipelines = 0
    for option, least in (
        ("rows", 1),
        ("files", 1),
        ("rows_per_day", 1),
        ("warm_rows", 2),
        ("repeats", 1),
        ("workers", 1),
    ):
        if getattr(args, option) < least:
            raise SystemExit(f"--{option.replace('_', '-')} must be >= {least}, got {getattr(args, option)}")
    if args.files > args.rows:
        raise SystemExit(f"--files ({args.files}) must be at most --rows ({args.rows})")
    if args.serve_pipelines < 0 or args.serve_initial_blocks < 1:
        raise SystemExit("--serve-pipelines must be >= 0 and --serve-initial-blocks >= 1")
    setups = args.setups
    for name in setups:
        if name not in SETUPS:
            raise SystemExit(f"--setups: {name!r} is not one of {', '.join(SETUPS)}")
    if len(set(setups)) != len(setups):
        raise SystemExit(f"--setups must name distinct setups, got {','.join(setups)!r}")
    return setups, args.serve_parallel


def machine() -> dict:
    """The cores this process may use, the CPU model and the load average now (a shared machine drifts)."""
    model = None
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), None)
    return {"cores": len(os.sched_getaffinity(0)), "cpu": model, "load_average": [round(x, 2) for x in os.getloadavg()]}


# ---------------------------------------------------------------------------------------------- ingest
def write_inputs(folder: str, rows: int, files: int, rows_per_day: int, seed: int, prefix: str = "part") -> list[str]:
    """``rows`` GENERATED rows of one stream (TaxiGenerator(seed)), split into ``files`` CSV files of
    consecutive rows (file i holds rows i*rows//files .. (i+1)*rows//files - 1)."""
    import pyarrow.csv as pacsv

    from sage_tfx.data.generator import TaxiGenerator

    os.makedirs(folder, exist_ok=True)
    cuts = [i * rows // files for i in range(files + 1)]
    paths = [os.path.join(folder, f"{prefix}-{i:03d}.csv") for i in range(files)]
    writers: list = [None] * files
    first = 0
    for batch in TaxiGenerator(seed=seed, rows_per_day=rows_per_day).chunks(rows):
        while batch.num_rows:
            i = max(j for j in range(files) if cuts[j] <= first)
            take = min(batch.num_rows, cuts[i + 1] - first)
            writers[i] = writers[i] or pacsv.CSVWriter(paths[i], batch.schema)
            writers[i].write(batch.slice(0, take))
            batch, first = batch.slice(take), first + take
    for w in writers:
        w.close()
    return paths


def registered_blocks(db: str, stream: str) -> dict[str, tuple[int, str]]:
    """{block id: (private row count, content digest)} as the ledger holds them (trusted code: the bench's
    own throwaway ledger)."""
    from sage_tfx.privacy import Ledger

    with Ledger.open(db) as ledger:
        return {
            b.id: (ledger.private_row_count(stream, b.id), ledger.block_digest(stream, b.id))
            for b in ledger.blocks(stream)
        }


def ingest_once(
    folder: str, inputs: Sequence[str], beam_args: Sequence[str], key_file: str | None = None
) -> tuple[float, dict]:
    """A fresh ledger and data root in ``folder``, one ``sage ingest`` of ``inputs`` timed (the Beam job,
    commit and registration); returns (seconds, registered_blocks). ``key_file``: a key file the ledger is
    created with (a copy of it): content digests are keyed by the ledger's key, so runs compared block by block
    share one."""
    from sage_tfx.ingest.pipeline import ingest
    from sage_tfx.privacy import Ledger

    os.makedirs(folder, exist_ok=True)
    db = os.path.join(folder, "ledger.db")
    if key_file is not None:
        shutil.copy(key_file, db + ".key")  # mode 0600 kept
    with Ledger.open(db, create=True) as ledger:
        ledger.create_stream(STREAM, 1.0, 1e-6)
    t0 = time.perf_counter()
    ingest(
        db,
        STREAM,
        list(inputs),
        os.path.join(folder, "data"),
        time_column=TIME_COLUMN,
        window="1d",
        beam_args=list(beam_args),
        progress=False,
    )
    seconds = time.perf_counter() - t0
    return seconds, registered_blocks(db, STREAM)


def compare_blocks(name: str, got: dict, want: dict) -> None:
    """Raise naming the setup and the first differing blocks unless ``got`` == ``want``."""
    if got == want:
        return
    missing, extra = sorted(set(want) - set(got)), sorted(set(got) - set(want))
    differ = sorted(b for b in set(got) & set(want) if got[b] != want[b])
    raise RuntimeError(
        f"setup {name} registered different blocks than the baseline: missing {missing[:5]}, "
        f"extra {extra[:5]}, different rows/digest {[(b, got[b], want[b]) for b in differ[:5]]}"
    )


@contextlib.contextmanager
def _setup(name: str, workers: int) -> Iterator[list[str]]:
    """The Beam arguments of a setup, with its loopback cluster (if any) up while the block runs."""
    if name == "direct":
        yield []
    elif name == "direct-mp2":
        yield ["--direct_running_mode=multi_processing", f"--direct_num_workers={workers}"]
    else:
        try:
            from sage_tfx import clusters
        except ImportError as exc:
            raise SystemExit(f"setup {name} needs sage_tfx.clusters ({exc}); leave it out with --setups") from None
        if name == "portable2":
            with clusters.portable_cluster(workers=workers) as ctx:
                yield list(ctx.beam_args)
        else:
            with clusters.dask_cluster(workers=workers) as ctx:
                yield ["--runner=dask", f"--dask-address={ctx.address}"]


def _median(values: Sequence[float]) -> float:
    return statistics.median(values)


def ingest_part(args: argparse.Namespace, setups: list[str], work: str) -> dict:
    _say(f"generating {args.rows:,} {GENERATED} in {args.files} CSV files")
    t0 = time.perf_counter()
    inputs = write_inputs(os.path.join(work, "inputs"), args.rows, args.files, args.rows_per_day, args.seed)
    warm = write_inputs(os.path.join(work, "warm"), args.warm_rows, 2, args.rows_per_day, args.seed + 1, "warm")
    _say(f"generated in {time.perf_counter() - t0:.1f} s")
    seconds: dict[str, list[float]] = {s: [] for s in setups}
    started: dict[str, float] = {}
    warmup: dict[str, float] = {}
    beam_args: dict[str, list[str]] = {}
    want: dict | None = None
    key_file = os.path.join(work, "bench.key")  # one key for every run: their keyed digests compare
    if not os.path.exists(key_file):
        KeyRing.create(key_file)
    with contextlib.ExitStack() as stack:
        for name in setups:
            _say(f"{name}: starting ({SETUPS[name]})")
            t0 = time.perf_counter()
            beam_args[name] = stack.enter_context(_setup(name, args.workers))
            started[name] = time.perf_counter() - t0
            warmup[name], _ = ingest_once(os.path.join(work, f"warm-{name}"), warm, beam_args[name])
            shutil.rmtree(os.path.join(work, f"warm-{name}"), ignore_errors=True)
            _say(f"{name}: up in {started[name]:.1f} s, warm-up ingest of {args.warm_rows:,} rows {warmup[name]:.1f} s")
        for r in range(args.repeats):
            for name in setups:
                folder = os.path.join(work, f"run-{name}-{r}")
                _say(f"round {r + 1}/{args.repeats}: {name} ingesting {args.rows:,} rows")
                s, blocks = ingest_once(folder, inputs, beam_args[name], key_file)
                shutil.rmtree(folder, ignore_errors=True)
                if sum(rows for rows, _ in blocks.values()) != args.rows:
                    raise RuntimeError(
                        f"setup {name} registered {sum(r for r, _ in blocks.values())} rows, expected {args.rows}"
                    )
                if want is None:
                    want = blocks
                compare_blocks(name, blocks, want)
                seconds[name].append(s)
                _say(
                    f"round {r + 1}/{args.repeats}: {name} {s:.1f} s = {args.rows / s:,.0f} rows/s "
                    f"({len(blocks)} blocks, same as the baseline's)"
                )
        _say("stopping the clusters")
    base = setups[0]
    out = {}
    for name in setups:
        rps = [args.rows / s for s in seconds[name]]
        ratios = [b / s for b, s in zip(seconds[base], seconds[name])]
        out[name] = {
            "setup": SETUPS[name],
            "beam_args": beam_args[name],
            "start_seconds": round(started[name], 2),
            # a whole ingest job of --warm-rows rows: about the job's fixed cost (workers started per job)
            "warmup_seconds": round(warmup[name], 2),
            "seconds_all": [round(s, 2) for s in seconds[name]],
            "rows_per_second": round(_median(rps), 1),
            "rows_per_second_all": [round(x, 1) for x in rps],
            "ratio": round(_median(ratios), 3),
            "ratio_all": [round(x, 3) for x in ratios],
            "same_blocks_rows_digests_as_baseline": True,
        }
    return {
        "baseline": base,
        "blocks": len(want or {}),
        "files": args.files,
        "rows": args.rows,
        "rows_per_day": args.rows_per_day,
        "rounds": args.repeats,
        "setups": out,
    }


# ----------------------------------------------------------------------------------------------- serve
def count_outcomes(db: str, stream: str) -> dict[str, list[str | None]]:
    """{pipeline: [outcome of each grant, in order]} from the ledger (None: no outcome recorded)."""
    from sage_tfx.privacy import Ledger

    with Ledger.open(db) as ledger:
        return {
            p["name"]: [outcome for _g, outcome, _d in ledger.history(stream, p["name"])]
            for p in ledger.pipelines(stream)
        }


def serve_once(
    folder: str, pipelines: int, parallel: int, initial_blocks: int, timeout: float, say: Callable[[str], None] = _say
) -> dict:
    """One `sage serve` of ``pipelines`` easy taxi_regression pipelines (one iteration each) on the real taxi
    CSV in a fresh ledger, with ``--parallel parallel``; its wall time and the ACCEPTs the ledger holds."""
    from sage_tfx.privacy import Ledger

    os.makedirs(folder, exist_ok=True)
    db = os.path.join(folder, "ledger.db")
    with Ledger.open(db, create=True) as ledger:
        # every pipeline's share of a block (epsilon / pipelines) covers taxi_regression's first iteration (0.25)
        ledger.create_stream("taxi", float(pipelines), 1e-6)
    names = [f"p{i + 1}" for i in range(pipelines)]
    cmd = _serve_command(folder, db, names, initial_blocks, parallel)
    lines: list[tuple[float, str]] = []
    log_path = os.path.join(folder, "serve-stderr.log")  # library chatter (TensorFlow, absl); its tail on failure
    t0 = time.perf_counter()
    with open(log_path, "w") as log:
        # a session of its own: on a timeout the serve command and its worker processes are killed together
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True, start_new_session=True)

    def read() -> None:
        for line in proc.stdout:
            lines.append((time.perf_counter() - t0, line.rstrip("\n")))
            say(f"serve --parallel {parallel} [{lines[-1][0]:6.1f} s] {lines[-1][1]}")

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise RuntimeError(f"sage serve --parallel {parallel} did not finish in {timeout:.0f} s") from None
    wall = time.perf_counter() - t0
    reader.join(timeout=30)
    if code != 0:
        _serve_failed(parallel, code, lines, log_path)
    replayed = next((t for t, line in lines if line.startswith("[replay]")), 0.0)
    outcomes = count_outcomes(db, "taxi")
    accepts = sum(o.count(Outcome.ACCEPT) for o in outcomes.values())
    with Ledger.open(db) as ledger:
        audit_ok = ledger.audit().ok
    return {
        "parallel": parallel,
        "pipelines": pipelines,
        "wall_seconds": round(wall, 1),
        "initial_replay_done_at_seconds": round(replayed, 1),
        "accepts": accepts,
        "iterations": sum(len(o) for o in outcomes.values()),
        "outcomes": {p: outcomes.get(p, []) for p in names},
        "accepts_per_hour": round(accepts / wall * 3600, 1),
        "audit_ok": audit_ok,
    }


def _serve_command(folder: str, db: str, names: list[str], initial_blocks: int, parallel: int) -> list[str]:
    """The `sage serve` command line of ``serve_once``: pipelines ``names``, one iteration each."""
    from sage_tfx.data.taxi import taxi_csv_path

    cmd = [
        sys.executable,
        "-m",
        "sage_tfx",
        "serve",
        "--db",
        db,
        "--stream",
        "taxi",
        "--data-root",
        os.path.join(folder, "data"),
        "--input",
        taxi_csv_path("simple"),
        "--time-column",
        TIME_COLUMN,
        "--window",
        "1d",
        "--initial-blocks",
        str(initial_blocks),
        "--blocks-per-step",
        str(initial_blocks),
        "--max-iterations",
        "1",
        "--rejection-share",
        "0",
        "--work-dir",
        os.path.join(folder, "work"),
        "--parallel",
        str(parallel),
    ]
    for name in names:
        cmd += ["--pipeline", f"{name}=taxi_regression:{SERVE_TARGET}"]
    return cmd


def _serve_failed(parallel: int, code: int, lines: list[tuple[float, str]], log_path: str) -> None:
    """Raise the RuntimeError of a `sage serve` that exited ``code``: its last output lines and its stderr's tail."""
    tail = "\n".join(line for _t, line in lines[-30:])
    with open(log_path, errors="replace") as f:
        err = f.read()[-3000:]
    raise RuntimeError(f"sage serve --parallel {parallel} exited {code}:\n{tail}\n{err}")


def serve_part(args: argparse.Namespace, parallels: list[int], work: str) -> dict:
    runs = {}
    for parallel in parallels:
        _say(f"serve: {args.serve_pipelines} pipelines, --parallel {parallel}")
        runs[str(parallel)] = serve_once(
            os.path.join(work, f"serve-{parallel}"),
            args.serve_pipelines,
            parallel,
            args.serve_initial_blocks,
            args.serve_timeout,
        )
        shutil.rmtree(os.path.join(work, f"serve-{parallel}"), ignore_errors=True)
        r = runs[str(parallel)]
        _say(
            f"serve --parallel {parallel}: {r['accepts']} ACCEPT(s) in {r['wall_seconds']} s = "
            f"{r['accepts_per_hour']} per hour"
        )
    ref = runs[str(parallels[0])]["accepts_per_hour"]
    for r in runs.values():
        r["ratio"] = round(r["accepts_per_hour"] / ref, 3) if ref else None
    return {
        "data": "the REAL Chicago taxi trips of the tfx wheel (taxi_csv_path('simple')), replayed in daily blocks",
        "pipeline": f"taxi_regression, target {SERVE_TARGET:,} s^2 (ACCEPTs at its first iteration), "
        "--max-iterations 1 --rejection-share 0",
        "reference": str(parallels[0]),
        "initial_blocks": args.serve_initial_blocks,
        "runs": runs,
    }


def run(args: argparse.Namespace) -> dict:
    """The figures of ``sage bench scale`` (see the module docstring)."""

    setups, parallels = _check_args(args)
    # Beam's multi-process DirectRunner forwards each worker's start-up warnings (no semi_persistent_directory,
    # unparseable args) per job: noise among the progress lines. Errors still show.
    logging.getLogger("apache_beam.runners.portability.local_job_service").setLevel(logging.ERROR)
    logging.getLogger("distributed").setLevel(logging.WARNING)  # the LocalCluster's INFO lines, likewise
    import sage_tfx

    figures: dict = {
        "data": GENERATED,
        "machine_start": machine(),
        "tiny": bool(args.tiny),
        "code": os.path.dirname(os.path.abspath(sage_tfx.__file__)),
    }
    _say(f"machine: {figures['machine_start']}")
    t0 = time.perf_counter()
    work = tempfile.mkdtemp(prefix="sage-bench-scale-")
    try:
        figures["ingest"] = ingest_part(args, setups, work)
        if args.serve_pipelines:
            figures["serve"] = serve_part(args, parallels, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    figures["machine_end"] = machine()
    figures["seconds_total"] = round(time.perf_counter() - t0, 1)
    cores = figures["machine_start"]["cores"]
    figures["note"] = (
        f"{cores} cores shared with other work: {args.workers} workers can be at most "
        f"{min(args.workers, cores)}x the in-process DirectRunner"
    )
    if args.plot:
        plot(figures, args.plot)
        figures["plot"] = args.plot
    return figures


def plot(figures: dict, path: str) -> None:
    """Ingest rows/s per setup and, if measured, serve ACCEPTs/hour per --parallel, side by side."""
    plt = pyplot()
    serve = figures.get("serve")
    fig, axes = plt.subplots(1, 2 if serve else 1, figsize=(11 if serve else 6, 4.2), squeeze=False)
    ing = figures["ingest"]
    names = list(ing["setups"])
    rps = [ing["setups"][n]["rows_per_second"] for n in names]
    ax = axes[0][0]
    bars = ax.bar(names, rps, color=[f"C{i}" for i in range(len(names))])
    label_bars(ax, bars, [f"{ing['setups'][n]['ratio']:.2f}x" for n in names])
    ax.set_ylabel("ingest rows/s (median of rounds)")
    ax.set_title(
        f"sage ingest, {ing['rows']:,} GENERATED rows in {ing['files']} files\n"
        f"(ratio to {ing['baseline']}; {figures['machine_start']['cores']} shared cores)",
        fontsize=10,
    )
    if serve:
        ax = axes[0][1]
        keys = list(serve["runs"])
        aph = [serve["runs"][k]["accepts_per_hour"] for k in keys]
        bars = ax.bar([f"--parallel {k}" for k in keys], aph, color=["C4", "C5", "C6", "C7"][: len(keys)])
        label_bars(ax, bars, [f"{serve['runs'][k]['ratio']:.2f}x" for k in keys])
        first = serve["runs"][keys[0]]
        ax.set_ylabel("models ACCEPTed per hour")
        ax.set_title(
            f"sage serve, {first['pipelines']} taxi_regression pipelines\n(real taxi days; one run each)", fontsize=10
        )
    save_figure(fig, path)
