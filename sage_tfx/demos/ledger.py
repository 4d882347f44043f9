"""The ledger demo: Sage's block composition on the real Chicago taxi trips shipped in the tfx wheel.

Monthly blocks of 2013 arrive one at a time (a replayed stream). Two pipelines
wait for budget; each new block's budget is split between them. One pipeline
asks for more and more (as privacy-adaptive training does on RETRY) until its
blocks retire; new blocks keep arriving with a fresh budget. No model is
trained here: this demo exercises the ledger alone.
"""

import collections
import csv
import datetime as dt
import importlib.resources
import os
import sys

from sage_tfx.privacy import BudgetRefused, Ledger
from sage_tfx.privacy.report import heatmap_png, status_table

TAXI_CSV = "examples/chicago_taxi_pipeline/data/simple/data.csv"


def monthly_row_counts(year=2013):
    """(month start, month end, exact row count) of the real taxi trips in ``year``, in order."""
    counts = collections.Counter()
    with (importlib.resources.files("tfx") / TAXI_CSV).open() as f:
        for row in csv.DictReader(f):
            t = dt.datetime.fromtimestamp(int(row["trip_start_timestamp"]), dt.UTC)
            if t.year == year:
                counts[t.month] += 1
    months = []
    for m in sorted(counts):
        start = dt.datetime(year, m, 1, tzinfo=dt.UTC)
        end = dt.datetime(year + (m == 12), m % 12 + 1, 1, tzinfo=dt.UTC)
        months.append((start, end, counts[m]))
    return months


def say(text=""):
    print(text, flush=True)


def run(out_dir="demo_out"):
    os.makedirs(out_dir, exist_ok=True)
    db = os.path.join(out_dir, "ledger.db")
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(db + suffix):
            os.remove(db + suffix)
    months = monthly_row_counts()
    ledger = Ledger.open(db, create=True)
    ledger.create_stream("taxi", epsilon=1.0, delta=1e-6, accounting="basic", policy="conserve")
    say(f"ledger {db}: stream 'taxi' with ONE global guarantee (epsilon=1, delta=1e-6) for all its blocks")
    for pipeline in ("fare-model", "tips-model"):
        ledger.register("taxi", pipeline)
    say("pipelines fare-model and tips-model wait for budget\n")

    arrived = []

    def arrive():
        start, end, rows = months[len(arrived)]
        block = start.strftime("%Y-%m")
        ledger.add_block("taxi", block, start=start.timestamp(), end=end.timestamp(), rows=rows)
        arrived.append(block)
        say(f"block {block} arrives with a fresh budget, split among the waiting pipelines")

    def ask(pipeline, window, epsilon):
        try:
            grant = ledger.request(pipeline, "taxi", blocks=window, epsilon=epsilon, delta=1e-8)
        except BudgetRefused as refusal:
            say(f"  {pipeline}: REFUSED epsilon={epsilon:.3g} on {','.join(window)}")
            for block, why in sorted(refusal.shortfalls.items()):
                say(f"      {block}: {why}")
            return None
        say(f"  {pipeline}: granted {grant.id}, epsilon={epsilon:.3g} on {','.join(window)} (charged before reading)")
        return grant

    say("Act 1. Conserve: fare-model starts small and doubles epsilon on each RETRY.")
    for _ in range(3):
        arrive()
    epsilon = 0.05
    while ask("fare-model", arrived[-3:], epsilon):
        epsilon *= 2
    say("  2*epsilon no longer fits its reservation on these blocks: it waits for fresh blocks")
    for _ in range(3):
        arrive()
    ask("fare-model", arrived[-3:], epsilon)
    ledger.finish("taxi", "fare-model", "ACCEPT")
    say("  fare-model is ACCEPTed: its unused reservations are split among those still waiting (tips-model)\n")

    say("Act 2. Aggressive: tips-model spends everything available to it on the oldest blocks.")
    window = arrived[:3]
    available = ledger.available_epsilon("tips-model", "taxi", window, delta=1e-8)
    ask("tips-model", window, available)
    retired = [b.id for b in ledger.blocks("taxi", state="retired")]
    say(f"  retired (budget exhausted, never offered again): {', '.join(retired) or 'none'}")
    try:
        ledger.request("tips-model", "taxi", blocks=window[:1], epsilon=0.01)
    except Exception as exc:  # a retired block is an error, not a refusal
        say(f"  asking for {window[0]} again: {exc}")
    say("")

    say("Act 3. The stream keeps growing: new blocks arrive fresh, so the stream never runs out.")
    ledger.register("taxi", "late-model")
    say("  late-model registers and waits")
    for _ in range(3):
        arrive()
    ask("late-model", arrived[-3:], 0.3)
    ask("tips-model", arrived[-3:], 0.3)
    say("")
    say(status_table(ledger.status("taxi")))
    report = ledger.audit()
    say("")
    say(f"audit: {'OK' if report.ok else 'FAILED'} ({report.entries} log entries, {report.grants} grants)")
    png = heatmap_png(ledger, "taxi", os.path.join(out_dir, "budget_heatmap.png"))
    say(f"heat-map: {png}")
    say(f"inspect it yourself: sage ledger status --db {db} --stream taxi")
    ledger.close()
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(run(*sys.argv[1:]))
