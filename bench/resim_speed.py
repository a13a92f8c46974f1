"""How fast does `resim` re-run the real scheduler on a long, preemption-heavy recording?

1. Record the real vLLM Scheduler (the rig's Harness, no model) on a KV cache too small for its
   growing requests, so that it preempts and resumes all the time, for --steps steps; each
   finished request is replaced, so the load never drains.
2. In a fresh subprocess, iterate `vllm_contract.replay.resim(trace)` over every step; its wall
   time and peak RSS are that process's own.
3. The floor: the recording's own time in the scheduler, Σ `steps.schedule_ns` +
   Σ `updates.update_ns` (each call's duration as the recorder measured it around
   schedule() and update_from_output()). Target: resim wall ÷ that floor <= 2, and a peak RSS
   that does not grow with the steps (--also STEPS measures a second size in the same run).

Usage: python bench/resim_speed.py [--steps 100000] [--also 25000] [--keep DIR]
                                   [--profile N]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# Six blocks of 16 tokens for each of 16 running requests, which grow from 2 blocks to 4..14:
# once they have grown the batch wants more than the cache holds, so the scheduler preempts
# (and resumes) all along, not only at the start.
CONFIG = dict(num_blocks=96, block_size=16, max_num_batched_tokens=256, max_num_seqs=16,
              max_model_len=512, enable_prefix_caching=False, keep_model_outputs=False)
IN_FLIGHT = 24  # requests queued at any time: more than max_num_seqs, so some always wait

CHILD = """
import json, resource, sys, time
from vllm_contract.replay import resim
t0 = time.perf_counter()
run = resim(sys.argv[1])
first = None
for _ in run:
    if first is None:
        first = time.perf_counter() - t0
s = run.summary
print(json.dumps({"seconds": time.perf_counter() - t0, "first_seconds": first, "steps": s.steps,
                  "identical_steps": s.identical_steps,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""

PROFILE = """
import cProfile, pstats, sys
from vllm_contract.replay import resim
prof = cProfile.Profile()
prof.enable()
for _ in resim(sys.argv[1]):
    pass
prof.disable()
stats = pstats.Stats(prof)
stats.sort_stats("tottime").print_stats(int(sys.argv[2]))
# where the re-run's own code spends it, callees included
stats.sort_stats("cumulative").print_stats("replay/|sched/scheduler.py", int(sys.argv[2]))
"""


def record(path: Path, steps: int, model_dir: str | None = None) -> dict:
    """Record `steps` schedule()/update_from_output() pairs of the real Scheduler into `path`;
    returns the recording's size and how many preemptions it saw."""
    from vllm_contract.recorder import attach
    from vllm_contract.rig import tiny_model
    from vllm_contract.rig.harness import Harness, HarnessConfig
    from vllm_contract.rig.scenarios import prompt

    h = Harness(model_dir or str(tiny_model.build()), HarnessConfig(**CONFIG))
    ids = itertools.count()

    def add() -> None:  # lengths staggered so that finishes (and refills) spread out
        i = next(ids)
        h.add(f"r{i}", prompt(i, 24), max_tokens=40 + (i * 37) % 160)

    preempted = 0
    t0 = time.perf_counter()
    with attach(h.scheduler, path):
        for _ in range(IN_FLIGHT):
            add()
        for _ in range(steps):
            result = h.step()
            preempted += len(result.scheduler_output.preempted_req_ids or ())
            for _ in result.finished:
                add()
    return {"steps": steps, "requests": next(ids), "preemptions": preempted,
            "seconds": time.perf_counter() - t0}


def recorded_floor(path: Path) -> tuple[int, float]:
    """The recording's steps and Σ(schedule_ns) + Σ(update_ns), in seconds."""
    from vllm_contract.replay.query.gateway import Gateway

    with Gateway(path) as gw:
        steps, sched = gw.sql("SELECT COUNT(*), CAST(SUM(schedule_ns) AS BIGINT) "
                              "FROM steps").to_pylist()[0].values()
        upd = gw.sql("SELECT CAST(SUM(update_ns) AS BIGINT) FROM updates").column(0)[0].as_py()
    return steps, ((sched or 0) + (upd or 0)) / 1e9


def measure(path: Path) -> dict:
    """Re-run the recording at `path` in a fresh process; its wall time, peak RSS, identical
    steps, and the ratio to the recording's own time in the scheduler."""
    r = subprocess.run([sys.executable, "-c", CHILD, str(path)], capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(f"resim child failed: {r.stderr.strip().splitlines()[-1:]}")
    out = json.loads(r.stdout.strip().splitlines()[-1])
    out["recorded_steps"], out["floor_seconds"] = recorded_floor(path)
    out["identical_pct"] = 100.0 * out["identical_steps"] / max(out["steps"], 1)
    out["ratio"] = out["seconds"] / out["floor_seconds"] if out["floor_seconds"] else 0.0
    return out


def profile(path: Path, top: int) -> str:
    r = subprocess.run([sys.executable, "-c", PROFILE, str(path), str(top)],
                       capture_output=True, text=True, check=True)
    return r.stdout


def recorded(path: Path) -> bool:
    """Whether --keep already holds a finished recording there, to be timed again."""
    from vllm_contract import schema

    return any((path / schema.ENGINES_DIR).glob(f"*/{schema.MANIFEST}")) if \
        (path / schema.ENGINES_DIR).is_dir() else (path / schema.MANIFEST).exists()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--also", type=int, default=0,
                    help="a second recording of this many steps, measured in the same run")
    ap.add_argument("--keep", type=Path, help="record into DIR/steps-N, or reuse what is there")
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="then re-run the largest recording once under cProfile: top N functions")
    a = ap.parse_args()
    root = a.keep or Path(tempfile.mkdtemp(prefix="vllm-contract-resim-"))
    sizes = sorted({a.steps, *([a.also] if a.also else [])})
    rows = []
    for n in sizes:
        path = root / f"steps-{n}"
        rec = None
        if not recorded(path):
            rec = record(path, n)
            print(f"recorded {n} steps: {rec['requests']} requests, {rec['preemptions']} "
                  f"preemptions, {rec['seconds']:.0f} s", file=sys.stderr)
        rows.append((n, rec, measure(path)))

    print(f"# resim speed, {time.strftime('%Y-%m-%d')}, {platform.node()}, "
          f"{os.cpu_count()} cores\n")
    print("| date | machine | steps | identical steps % | resim wall s | "
          "of which to the first step s | Σ schedule+update s | ratio | peak RSS MB |")
    print("|---|---|---|---|---|---|---|---|---|")
    for n, rec, m in rows:
        print(f"| {time.strftime('%Y-%m-%d')} | {platform.node()}, {os.cpu_count()} cores | "
              f"{m['recorded_steps']} | {m['identical_pct']:.2f} | {m['seconds']:.1f} | "
              f"{m['first_seconds'] or 0:.1f} | {m['floor_seconds']:.1f} | {m['ratio']:.2f} | "
              f"{m['peak_rss_mb']:.0f} |")
    if a.profile:
        print("\n```\n" + profile(root / f"steps-{sizes[-1]}", a.profile) + "```")


if __name__ == "__main__":
    main()
