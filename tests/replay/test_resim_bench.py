"""bench/resim_speed.py at a tiny size, so that the benchmark cannot rot: its recording of the
real scheduler preempts, re-runs identically, and yields a ratio to the recorded floor."""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"


def test_bench_measures_a_preempting_recording(tiny_model, tmp_path):
    sys.path.insert(0, str(BENCH))
    try:
        import resim_speed
    finally:
        sys.path.remove(str(BENCH))

    path = tmp_path / "steps-300"
    rec = resim_speed.record(path, 300, tiny_model)
    assert rec["preemptions"] > 0
    assert resim_speed.recorded(path)
    m = resim_speed.measure(path)
    assert m["recorded_steps"] == m["steps"] == 300
    assert m["identical_pct"] == 100.0
    assert m["floor_seconds"] > 0 and m["ratio"] > 0
    assert m["peak_rss_mb"] > 0
