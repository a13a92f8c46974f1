"""How far and how fast does `reduce` cut a recording of a scheduler bug?

Per named break of rig/breaks.py (BREAKS; with --all every break of rig/bugged.py COVERED), as
a vLLM Scheduler subclass (rig/bugged.py): record 60 requests of staggered lengths on a batch of
4 until all have finished (over a thousand steps; the break's workload: few KV blocks, batches
in flight), then reduce it to the finding of the break's invariant, with --jobs 1 and then 2.
Prints requests and steps before -> after, re-simulations and wall time of each.

Usage: python bench/reduce_runs.py [--requests 60] [--all | --only BREAK ...] [--jobs 1 2]
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


def record(cls, path: Path, requests: int, workload) -> int:
    from vllm_contract.rig import bugged, tiny_model

    return bugged.record_workload(cls, str(tiny_model.build()), path, requests, workload)


def main() -> None:
    import importlib

    from vllm_contract.replay.resim.reduce import reduce
    from vllm_contract.rig import bugged

    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=60)
    ap.add_argument("--all", action="store_true",
                    help="every covered break (rig/bugged.py COVERED), not only BREAKS'")
    ap.add_argument("--only", nargs="+", metavar="BREAK",
                    help="these breaks (rig/bugged.py COVERED names) and no others")
    ap.add_argument("--jobs", type=int, nargs="+", default=[1, 2])
    a = ap.parse_args()
    unknown = sorted(set(a.only or ()) - set(bugged.COVERED))
    if unknown:
        ap.error(f"--only {' '.join(unknown)}: not in rig/bugged.py COVERED")
    root = Path(tempfile.mkdtemp(prefix="vllm-contract-reduce-"))
    sys.path.insert(0, str(root))
    names = a.only or list(bugged.COVERED if a.all else bugged.SCHEDULER_BREAKS)
    # the header first and each row as its break is done: a long --all run that is stopped
    # keeps the rows it finished
    print(f"# reduce, {time.strftime('%Y-%m-%d')}, {platform.node()}, {os.cpu_count()} cores\n")
    jobs = " / ".join(map(str, a.jobs))
    print("| bug | invariant | requests before → after | steps before → after | "
          f"re-simulations --jobs {jobs} | wall s --jobs {jobs} | cut to | pytest file |")
    print("|---|---|---|---|---|---|---|---|", flush=True)
    specs = bugged.write(root, "bench_bugs", names)
    for name in names:
        spec, covered = specs[name], bugged.COVERED[name]
        invariant = covered.invariant
        cls = getattr(importlib.import_module("bench_bugs"), spec.split(":")[1])
        steps = record(cls, root / name, a.requests, covered.workload)
        walls, calls, bests = [], [], set()
        for n in a.jobs:
            t0 = time.perf_counter()
            r = reduce(root / name, invariant, root / f"{name}-out-{n}",
                       scheduler_cls=spec, jobs=n)
            walls.append(time.perf_counter() - t0)
            calls.append(r.calls)
            bests.add(r.best)
        same = "" if len(bests) == 1 else " (NOT the same result for every --jobs)"
        print(f"| {name} | {invariant} | {r.original_requests} → {len(r.best.requests)} | "
              f"{steps:,} → {r.best_steps:,} | {' / '.join(map(str, calls))} | "
              f"{' / '.join(f'{w:.1f}' for w in walls)} | {_cuts(r)}{same} | "
              f"{'yes' if r.pytest_file else r.no_pytest} |", flush=True)


def _cuts(r) -> str:
    """Prompt/outputs kept of recorded per request, and the settings made smaller."""
    parts = [f"{rid}: prompt {c['prompt_tokens']}/{c['prompt_tokens_recorded']}, outputs "
             f"{c['outputs']}/{c['outputs_recorded']}" for rid, c in r.cuts().items()]
    parts += [f"{k} {v['value']}/{v['recorded']}" for k, v in r.settings().items()]
    return "; ".join(parts) or "-"


if __name__ == "__main__":
    main()
