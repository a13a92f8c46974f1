"""How far and how fast does `reduce` cut a recording of a scheduler bug?

Per named break of rig/breaks.py (BREAKS), as a vLLM Scheduler subclass (rig/bugged.py):
record 60 requests of staggered lengths on a batch of 4 until all have finished (over a
thousand steps), then reduce it to the finding of the break's invariant, with --jobs 1 and then 2. Prints requests and steps before -> after,
re-simulations and wall time of each.

Usage: python bench/reduce_runs.py [--requests 60]
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # the table on stdout, not vLLM's log


def record(cls, path: Path, requests: int) -> int:
    from vllm_contract.rig import bugged, tiny_model

    return bugged.record_workload(cls, str(tiny_model.build()), path, requests)


def main() -> None:
    import importlib

    from vllm_contract.replay.resim.reduce import reduce
    from vllm_contract.rig import bugged

    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=60)
    a = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="vllm-contract-reduce-"))
    sys.path.insert(0, str(root))
    rows = []
    specs = bugged.write(root, "bench_bugs", list(bugged.SCHEDULER_BREAKS))
    for name, invariant in bugged.SCHEDULER_BREAKS.items():
        spec = specs[name]
        cls = getattr(importlib.import_module("bench_bugs"), spec.split(":")[1])
        steps = record(cls, root / name, a.requests)
        walls, calls = [], []
        for jobs in (1, 2):
            t0 = time.perf_counter()
            r = reduce(root / name, invariant, root / f"{name}-out-{jobs}",
                       scheduler_cls=spec, jobs=jobs)
            walls.append(time.perf_counter() - t0)
            calls.append(r.calls)
        rows.append((name, invariant, r, steps, walls, calls))
    print(f"# reduce, {time.strftime('%Y-%m-%d')}, {platform.node()}, {os.cpu_count()} cores\n")
    print("| bug | invariant | requests before → after | steps before → after | "
          "re-simulations --jobs 1 / 2 | wall s --jobs 1 / 2 | cut to | pytest file |")
    print("|---|---|---|---|---|---|---|---|")
    for name, inv, r, steps, walls, calls in rows:
        print(f"| {name} | {inv} | {r.original_requests} → {len(r.best.requests)} | "
              f"{steps:,} → {r.best_steps:,} | {calls[0]} / {calls[1]} | "
              f"{walls[0]:.1f} / {walls[1]:.1f} | {_cuts(r)} | "
              f"{'yes' if r.pytest_file else r.no_pytest} |")


def _cuts(r) -> str:
    """Prompt/outputs kept of recorded per request, and the settings made smaller."""
    parts = [f"{rid}: prompt {c['prompt_tokens']}/{c['prompt_tokens_recorded']}, outputs "
             f"{c['outputs']}/{c['outputs_recorded']}" for rid, c in r.cuts().items()]
    parts += [f"{k} {v['value']}/{v['recorded']}" for k, v in r.settings().items()]
    return "; ".join(parts) or "-"


if __name__ == "__main__":
    main()
