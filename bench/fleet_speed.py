"""A fleet in one root: `check` as engines are added (issue 21: per-engine scaling), with
DuckDB, and with Spark when asked.

Engines are generated one after another into one format-2 root (bench/gen_trace.py: `--steps`
steps each, a different request plan per engine); after engine 1, 2, 4, 8 and 16 (up to
`--engines`), `vllm-contract check` runs in a fresh process over the whole root: wall time and
the process's peak RSS. Linear scaling means time per engine stays flat.

Usage: python bench/fleet_speed.py OUT [--engines 16] [--steps 100000] [--slots 16] [--spark]
       python bench/fleet_speed.py OUT --as-is [--spark]   (OUT's engines, generated before)
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gen_trace  # noqa: E402

CLI = str(Path(sys.executable).with_name("vllm-contract"))


def _tree_rss(pid: int) -> int:
    """Resident KiB of a process and all its descendants (a Spark check's JVM is a child)."""
    kids: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            status = (d / "status").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        kids.setdefault(ppid, []).append(int(d.name))
        rss[int(d.name)] = next((int(ln.split()[1]) for ln in status.splitlines()
                                 if ln.startswith("VmRSS:")), 0)
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        total += rss.get(p, 0)
        todo += kids.get(p, [])
    return total


def _check(root: Path, *extra: str) -> tuple[float, float, int]:
    """Wall seconds, peak RSS in MiB of the check's process with its children (a JVM it
    starts), sampled every 0.2 s, and the exit code."""
    t0 = time.perf_counter()
    proc = subprocess.Popen([CLI, "check", str(root), "-f", "json", *extra],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    peak = 0
    while proc.poll() is None:
        peak = max(peak, _tree_rss(proc.pid))
        time.sleep(0.2)
    wall = time.perf_counter() - t0
    err = proc.stderr.read().decode()
    if proc.returncode not in (0, 1):
        sys.exit(f"check failed ({proc.returncode}): {err[-2000:]}")
    return wall, peak / 1024, proc.returncode


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--engines", type=int, default=16)
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--slots", type=int, default=16)
    ap.add_argument("--spark", action="store_true", help="also check with Spark local[2]")
    ap.add_argument("--as-is", action="store_true",
                    help="check OUT as it is, once, generating nothing")
    ap.add_argument("--spark-conf", action="append", default=[], metavar="KEY=VALUE",
                    help="passed to check (e.g. spark.driver.memory=6g)")
    a = ap.parse_args()
    spark_conf = [x for kv in a.spark_conf for x in ("--spark-conf", kv)]
    if a.as_is:
        n = len([p for p in (a.out / "_engines").iterdir() if p.name.startswith("engine=")])
        wall, rss, _ = _check(a.out)
        print(f"{n} engines: duckdb {wall:.2f} s, peak {rss:.0f} MiB", flush=True)
        if a.spark:
            wall, rss, _ = _check(a.out, "--sql-engine", "spark", *spark_conf)
            print(f"{n} engines: spark local[2] {wall:.2f} s, peak {rss:.0f} MiB "
                  "(the check's process and its JVM)", flush=True)
        return
    marks = [k for k in (1, 2, 4, 8, 16, 32, 64) if k <= a.engines]
    if a.engines not in marks:
        marks.append(a.engines)
    print(f"{'engines':>7} {'steps':>9} {'duckdb s':>9} {'s/engine':>9} {'peak MiB':>9}"
          + ("  spark s  peak MiB" if a.spark else ""), flush=True)
    for k in range(1, a.engines + 1):
        gen_trace.generate(a.out, a.steps, a.slots, min(a.steps, 20_000),
                           engine=f"fleet-{k - 1}-dp0", fresh=k == 1, seed=k)
        if k not in marks:
            continue
        wall, rss, _ = _check(a.out)
        line = f"{k:>7} {k * a.steps:>9} {wall:>9.2f} {wall / k:>9.2f} {rss:>9.0f}"
        if a.spark:
            swall, srss, _ = _check(a.out, "--sql-engine", "spark", *spark_conf)
            line += f"  {swall:>7.2f} {srss:>9.0f}"
        print(line, flush=True)


if __name__ == "__main__":
    main()
