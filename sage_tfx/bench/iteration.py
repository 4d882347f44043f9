"""One iteration against stock TFX: a private `sage run` iteration of taxi_regression beside the same pipeline
built from TFX's stock components without privacy, on the same real taxi days; wall, CPU and where it goes.

Set-up (not timed): the first ``--days`` real taxi days replayed as daily blocks of a fresh ledger (as
`sage run`'s tests do), and the same rows written to one CSV file.

- Private: ``sage run taxi_regression --max-iterations 1 --min-window DAYS`` (every block), one iteration:
  BlockExampleGen, DPTransform, DPTrainer (the linear model, AdaSSP), DPModelValidator, Pusher, with the
  launcher, its ledger and its two confined children.
- Stock: CsvExampleGen, ImportSchemaGen, Transform, Trainer, Evaluator (TFMA; ``--no-evaluator`` leaves it
  out), Pusher under TFX's LocalDagRunner, in a process that imports nothing of sage_tfx
  (sage_tfx/bench/_stock_taxi): the same features (the hour's mean speed exact) and the same linear model,
  exported with the transform graph in a signature that takes raw tf.Examples.

The two sides alternate ``--repeats`` times. Each side's CPU is its process tree's (``RUSAGE_CHILDREN``, every
process waited for, plus this process's own CPU in between); the figures are the min and median of each side
and their ratios (private / stock, lower is better). The private side runs with ``SAGE_PROFILE``
(sage_tfx/phases.py): the launcher and each confined child sample where their CPU goes, and ``split`` gives the
median over repeats of each phase summed over those processes (imports: interpreter start-up and imports;
export: SavedModel writing; tracing: tf.function graph building; dp: the DP tables, AdaSSP, the validator's
bounds, the ledger's charge and grant checks; beam; other: TFX's orchestration, MLMD, running models, reading
records, ledger set-up), with ``dp_share`` the DP work's share of the sampled CPU; ``process_cpu`` and
``process_imports`` give each process's median CPU and the imports' part of it.
"""

import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from sage_tfx.isolation import PASS_ENVIRONMENT
from sage_tfx.phases import PROFILE_ENV
from sage_tfx.privacy.vocabulary import Outcome

STOCK = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_stock_taxi", "pipeline.py")
TARGET = 3_000_000  # taxi_regression's MSE target (s^2): its first iteration ACCEPTs (bench/scale.py's)
SCHEMA_TYPES = {"i": "INT", "f": "FLOAT", "O": "BYTES"}


def add_arguments(parser):
    parser.add_argument("--days", type=int, default=256, help="real taxi days (blocks) the iteration reads")
    parser.add_argument("--repeats", type=int, default=3, help="runs per side, alternating; min and median")
    parser.add_argument("--no-evaluator", action="store_true", help="leave TFX's Evaluator (TFMA) out")
    parser.add_argument("--work-dir", default=None, help="where the runs write (default: a temporary folder)")


def _replay(root: str, days: int) -> tuple[str, str]:
    """A fresh ledger (epsilon 1, delta 1e-6) with the first ``days`` taxi days as daily blocks of "taxi"."""
    from sage_tfx.data.taxi import TIME_COLUMN, taxi_csv_path
    from sage_tfx.ingest.replay import Replay
    from sage_tfx.privacy import Ledger

    db, data = os.path.join(root, "ledger.db"), os.path.join(root, "data")
    with Ledger.open(db, create=True) as ledger:
        ledger.create_stream("taxi", 1.0, 1e-6)
        Replay.from_file(ledger, "taxi", data, taxi_csv_path("simple"), TIME_COLUMN, "1d").run(steps=days)
    return db, data


def _csv(root: str, days: int) -> tuple[str, str, int]:
    """The same days' rows as one CSV file (in ``root``/csv) and a schema of the columns the pipeline reads."""
    import pandas as pd

    from sage_tfx.data.taxi import TIME_COLUMN, taxi_csv_path

    frame = pd.read_csv(taxi_csv_path("simple"))
    day = frame[TIME_COLUMN] // 86400
    frame = frame[day.isin(sorted(day.unique())[:days])]
    os.makedirs(os.path.join(root, "csv"))
    frame.to_csv(os.path.join(root, "csv", "rows.csv"), index=False)
    schema = os.path.join(root, "schema.pbtxt")
    with open(schema, "w") as f:
        for name in ("trip_miles", "trip_seconds", "trip_start_hour"):
            f.write(f'feature {{ name: "{name}" type: {SCHEMA_TYPES[frame[name].dtype.kind]} }}\n')
    return os.path.join(root, "csv"), schema, len(frame)


def _timed(cmd: list, env: dict) -> dict:
    """Run ``cmd`` to its end; its wall time and its process tree's CPU (with this process's own)."""
    before, own = resource.getrusage(resource.RUSAGE_CHILDREN), time.process_time()
    start = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime + time.process_time() - own
    if out.returncode not in (0, 4, 5):  # ACCEPT, REJECT, TIMEOUT: the iteration ran to an outcome
        raise RuntimeError(f"{cmd[:4]} exited {out.returncode}:\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}")
    return {"wall": round(wall, 2), "cpu": round(cpu, 2), "stdout": out.stdout}


def _private(root: str, days: int) -> dict:
    db, data = _replay(root, days)
    profile = os.path.join(root, "profile.json")
    passed = ",".join(filter(None, [os.environ.get(PASS_ENVIRONMENT, ""), PROFILE_ENV]))
    env = {**os.environ, PROFILE_ENV: profile, PASS_ENVIRONMENT: passed}
    cmd = [sys.executable, "-m", "sage_tfx", "run", "taxi_regression", "--db", db, "--stream", "taxi"]
    cmd += ["--data-root", data, "--target", str(TARGET), "--max-iterations", "1", "--min-window", str(days)]
    result = _timed(cmd + ["--work-dir", os.path.join(root, "work")], env)
    with open(profile) as f:
        processes = json.load(f)
    stdout = result.pop("stdout")
    outcome = [o.value for o in (Outcome.ACCEPT, Outcome.RETRY, Outcome.REJECT) if f"-> {o.value}" in stdout]
    return {**result, "outcome": outcome[0] if outcome else None, "processes": processes}


def _stock(root: str, csv_dir: str, schema: str, evaluator: bool) -> dict:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    cmd = [sys.executable, STOCK, csv_dir, schema, root] + ([] if evaluator else ["--no-evaluator"])
    result = _timed(cmd, env)
    result["components"] = json.loads(result.pop("stdout").strip().splitlines()[-1])["components"]
    return result


def _split(processes: dict) -> dict:
    """{phase: CPU seconds} summed over the launcher and its confined children."""
    total: dict = {}
    for process in [processes["launcher"], *processes["children"]]:
        for phase, seconds in process["phases"].items():
            total[phase] = total.get(phase, 0.0) + seconds
    return total


def _process_cpu(private: list, phase: str | None = None) -> dict:
    """The median CPU of each sampled process of the private side: the launcher, then its children in order (the
    iteration's, the validation's); ``phase``: of that phase only (e.g. "imports")."""
    names = ["launcher", "iteration_child", "validation_child"]
    per_run = [[r["processes"]["launcher"], *r["processes"]["children"]] for r in private]
    counts = {len(p) for p in per_run}
    if counts != {len(names)}:
        return {}

    def seconds(process: dict) -> float:
        return process["cpu"] if phase is None else process["phases"].get(phase, 0.0)

    return {name: round(statistics.median(seconds(p[i]) for p in per_run), 2) for i, name in enumerate(names)}


def _summary(runs: list, key: str) -> dict:
    values = [r[key] for r in runs]
    return {"runs": values, "min": min(values), "median": round(statistics.median(values), 2)}


def run(args):
    if args.days < 1 or args.repeats < 1:
        raise ValueError(f"--days {args.days!r} and --repeats {args.repeats!r} must be at least 1")
    base = tempfile.mkdtemp(prefix="sage-bench-iteration-", dir=args.work_dir)
    try:
        csv_dir, schema, rows = _csv(base, args.days)
        private, stock = [], []
        for i in range(args.repeats):
            private.append(_private(tempfile.mkdtemp(dir=base), args.days))
            stock.append(_stock(tempfile.mkdtemp(dir=base), csv_dir, schema, not args.no_evaluator))
            print(
                f"  [{i + 1}/{args.repeats}] private {private[-1]['wall']:.1f} s wall {private[-1]['cpu']:.1f} s CPU"
                f" ({private[-1]['outcome']}); stock {stock[-1]['wall']:.1f} s wall {stock[-1]['cpu']:.1f} s CPU",
                file=sys.stderr,
                flush=True,
            )
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return _figures(args, rows, private, stock)


def _figures(args, rows: int, private: list, stock: list) -> dict:
    sides = {"private": private, "stock": stock}
    figures = {side: {k: _summary(runs, k) for k in ("wall", "cpu")} for side, runs in sides.items()}
    splits = [_split(r["processes"]) for r in private]
    phases = sorted({p for s in splits for p in s})
    split = {p: round(statistics.median(s.get(p, 0.0) for s in splits), 2) for p in phases}
    sampled = sum(split.values())
    return {
        "days": args.days,
        "rows": rows,
        "repeats": args.repeats,
        **figures,
        "ratio": {
            f"{k}_{stat}": round(figures["private"][k][stat] / figures["stock"][k][stat], 3)
            for k in ("wall", "cpu")
            for stat in ("min", "median")
        },
        "split": split,
        "split_processes": len(private[0]["processes"]["children"]) + 1,
        "process_cpu": _process_cpu(private),
        "process_imports": _process_cpu(private, "imports"),
        "dp_share": round(split.get("dp", 0.0) / sampled, 3) if sampled else None,
        "outcomes": [r["outcome"] for r in private],
        "stock_components": stock[0]["components"],
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
    }
