"""Recorder overhead as whole runs, each in a fresh process (issue: foundation).

bench/recorder_overhead.py steps two identical loads in one process. An A/A test of that method
(both loads unrecorded) found them differing by more than the 3 % target, and the difference
drifting within a run, so it cannot resolve the target here; and the writer thread's work
for the recorded load also lands in the other load's blocks. Here each run is its own process:
build the decode load, warm it up, then time `--steps` steps, and with recording also the
writer's flush (every step converted and written is paid inside the run); both sides first step
64 untimed steps, and the recording's close is timed apart, so its one-time costs (the first
flush opens the segments, the close seals them) stay out. Runs alternate off/on
(order alternating too); each process gets its own heap layout, so that difference becomes
noise to average out instead of a bias. Printed: mean and standard error per side, the ratio of
means and an approximate 95 % interval for it, for each writer (--writers: the writer process,
the default, and the writer thread), all interleaved in one run. Target ≥ 0.97.

Usage: python bench/recorder_runs.py [--reqs 256] [--runs 10] [--steps 400]
                                     [--writers process,thread]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

CHILD = """
import gc, json, os, sys, tempfile, time
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
sys.path.insert(0, sys.argv[4])
from recorder_overhead import decode_harness
from vllm_contract.recorder import attach
from vllm_contract.rig import tiny_model
mode, n, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
load = decode_harness(str(tiny_model.build()), n)
gc.collect()
gc.freeze()
out = tempfile.mkdtemp(prefix="vllm-contract-runs-")
rec = attach(load.scheduler, out, writer=mode) if mode != "off" else None
for _ in range(64):  # past a recording's one-time costs (its first flush opens the segments)
    load.step()
t0 = time.perf_counter()
for _ in range(steps):
    load.step()
if rec is not None:
    assert rec.flush(timeout=600)  # every step converted and written: paid inside the run
seconds = time.perf_counter() - t0
if rec is not None:
    t1 = time.perf_counter()
    rec.close()  # a recording's one-time end (closing the segments, the manifest): outside
    assert rec.writer.manifest["closed_cleanly"] and not rec.writer.manifest["dropped_steps"]
    close = time.perf_counter() - t1
else:
    close = 0.0
print(json.dumps({"seconds": seconds, "close": close}))
"""


def one_run(mode: str, n: int, steps: int) -> dict:
    """mode: "off", or the writer ("process", "thread")."""
    r = subprocess.run([sys.executable, "-c", CHILD, mode, str(n), str(steps), str(HERE)],
                       capture_output=True, text=True, check=True)
    return json.loads(r.stdout.strip().splitlines()[-1])


def ratio_interval(off: list[float], on: list[float]) -> tuple[float, float, float]:
    """Speed with recording ÷ speed without (mean time off ÷ mean time on), with a
    delta-method 95 % interval from the two means' standard errors."""
    m_off, m_on = statistics.mean(off), statistics.mean(on)
    se_off = statistics.stdev(off) / math.sqrt(len(off))
    se_on = statistics.stdev(on) / math.sqrt(len(on))
    r = m_off / m_on
    rel = math.sqrt((se_off / m_off) ** 2 + (se_on / m_on) ** 2)
    return r, r * (1 - 1.96 * rel), r * (1 + 1.96 * rel)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reqs", type=int, default=256)
    ap.add_argument("--runs", type=int, default=10, help="runs per side")
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--writers", default="process,thread")
    a = ap.parse_args()
    writers = a.writers.split(",")
    sys.path.insert(0, str(HERE))
    from vllm_contract.rig import tiny_model

    tiny_model.build()  # before the clock: every child finds it built
    modes = ["off", *writers]
    times: dict[str, list[float]] = {m: [] for m in modes}
    closes: dict[str, list[float]] = {m: [] for m in writers}
    t_start = time.perf_counter()
    for i in range(a.runs):
        for mode in modes[i % len(modes):] + modes[:i % len(modes)]:  # order rotates
            r = one_run(mode, a.reqs, a.steps)
            times[mode].append(r["seconds"])
            if mode != "off":
                closes[mode].append(r["close"])
            print(f"run {i + 1}/{a.runs} {mode}: {r['seconds']:.2f} s", file=sys.stderr,
                  flush=True)
    print(f"# recorder overhead in whole runs, {time.strftime('%Y-%m-%d')}, {platform.node()}, "
          f"{os.cpu_count()} cores, {time.perf_counter() - t_start:.0f} s")
    print("\n| running reqs | writer | runs per side × steps | ms per step off (mean ± s.e.) | "
          "ms per step on | on ÷ off speed | 95 % interval | target | close, ms (apart) |")
    print("|---|---|---|---|---|---|---|---|---|")

    def per_step(xs: list[float]) -> str:
        return (f"{statistics.mean(xs) / a.steps * 1e3:.3f} ± "
                f"{statistics.stdev(xs) / math.sqrt(len(xs)) / a.steps * 1e3:.3f}")

    for w in writers:
        r, lo, hi = ratio_interval(times["off"], times[w])
        print(f"| {a.reqs} | {w} | {a.runs} × {a.steps} | {per_step(times['off'])} | "
              f"{per_step(times[w])} | {r:.3f} | {lo:.3f}–{hi:.3f} | ≥ 0.97 | "
              f"{statistics.median(closes[w]) * 1e3:.0f} |")


if __name__ == "__main__":
    main()
