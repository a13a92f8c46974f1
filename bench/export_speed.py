"""How long do `export --perfetto` and `report` take on a long trace, and how big are their
files?

Generates a contract-respecting trace (bench/gen_trace.py; `--keep DIR` reuses one there),
then in one process: the catalog alone (what `check` runs, and what the export's findings
cost), the export's reading of steps and request phases, and the writing of the file. Prints
each time, the export's total as a ratio of the catalog's measured beside it, the file's bytes
per step and the peak RSS; then `report` of the same trace in a fresh process (its own peak
RSS): its time, as a ratio of the catalog's, and the page's size.

Usage: python bench/export_speed.py [--steps 1000000] [--keep DIR]
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=1_000_000)
    ap.add_argument("--keep", type=Path)
    a = ap.parse_args()
    sys.path.insert(0, str(HERE))
    from check_speed import generated
    from gen_trace import generate

    from vllm_contract.replay.query.gateway import Gateway
    from vllm_contract.replay.timeline import spans
    from vllm_contract.replay.timeline.perfetto import Writer

    root = a.keep or Path(tempfile.mkdtemp(prefix="vllm-contract-export-"))
    trace = root / f"big-{a.steps}"
    if not generated(trace):
        generate(trace, a.steps, 64, 20_000)
    t0 = time.perf_counter()
    with Gateway(trace) as gw:
        findings = spans.findings_of(gw)
    catalog_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    engines = spans.read(trace)
    read_s = time.perf_counter() - t0
    out = root / "export.pftrace"
    t0 = time.perf_counter()
    counts = Writer(out).write(engines)
    write_s = time.perf_counter() - t0
    size = out.stat().st_size
    steps = sum(len(e.steps) for e in engines)
    print(f"# export --perfetto, {time.strftime('%Y-%m-%d')}, {platform.node()}, "
          f"{os.cpu_count()} cores\n")
    print("| steps | requests | lanes | findings | catalog s | export: read s (its catalog "
          "included) | write s | export / catalog | bytes | bytes per step | packets | "
          "peak RSS MB |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    print(f"| {steps:,} | {sum(len(e.requests) for e in engines):,} | "
          f"{sum(e.lanes for e in engines):,} | {len(findings):,} | {catalog_s:.1f} | "
          f"{read_s:.1f} | {write_s:.1f} | {(read_s + write_s) / catalog_s:.2f} | {size:,} | "
          f"{size / steps:.0f} | {counts['packets']:,} | "
          f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:,.0f} |")
    page = root / "report.html"
    code = ("import resource, sys, time; from vllm_contract.replay.timeline.report import write; "
            "t0 = time.perf_counter(); c = write(sys.argv[1], sys.argv[2]); "
            "print(time.perf_counter() - t0, c['bytes'], "
            "resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)")
    import subprocess

    got = subprocess.run([sys.executable, "-c", code, str(trace), str(page)], check=True,
                         capture_output=True, text=True).stdout.split()
    secs, size, rss = float(got[0]), int(got[1]), float(got[2])
    print("\n| report s | report / catalog | page bytes | peak RSS MB |\n|---|---|---|---|")
    print(f"| {secs:.1f} | {secs / catalog_s:.2f} | {size:,} | {rss:,.0f} |")


if __name__ == "__main__":
    main()
