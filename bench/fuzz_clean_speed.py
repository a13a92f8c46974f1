"""How many generated clean workloads a minute the property test runs (tests/query/
test_fuzz_clean.py), and where an example's time goes: playing it on vLLM's real scheduler while
recording, the catalog, the shadow worker.

The same fixed-seed examples for the Scheduler and the AsyncScheduler, in turns (`--rounds`),
in one process; medians shown, with the AsyncScheduler's rate over the Scheduler's.

Usage: python bench/fuzz_clean_speed.py [--examples 40] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
os.environ.setdefault("VLLM_CONTRACT_CACHE", str(ROOT / ".cache"))
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")


def one_round(model: str, invariants, batch_queue: int, n: int) -> dict:
    from hypothesis import HealthCheck, Phase, given, settings

    from vllm_contract.replay.query import checker
    from vllm_contract.replay.query.gateway import Gateway
    from vllm_contract.replay.worker.shadow import run_shadow
    from vllm_contract.rig.workloads import play
    from vllm_contract.trace import open_trace
    from workloadkit import workloads

    spent = {"play": 0.0, "catalog": 0.0, "shadow": 0.0, "examples": 0, "steps": 0}

    @settings(max_examples=n, derandomize=True, database=None, deadline=None,
              phases=[Phase.generate], suppress_health_check=list(HealthCheck))
    @given(workloads(batch_queue=batch_queue))
    def example(w):
        with tempfile.TemporaryDirectory() as d:
            t0 = time.perf_counter()
            h = play(w, model, d)
            t1 = time.perf_counter()
            with Gateway(d) as gw:
                checker.run(gw, invariants)
            t2 = time.perf_counter()
            run_shadow(open_trace(d))
            t3 = time.perf_counter()
        spent["play"] += t1 - t0
        spent["catalog"] += t2 - t1
        spent["shadow"] += t3 - t2
        spent["examples"] += 1
        spent["steps"] += h.steps

    t = time.perf_counter()
    example()
    spent["wall"] = time.perf_counter() - t
    return spent


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--examples", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    from vllm_contract.replay.query import catalog
    from vllm_contract.rig import tiny_model

    model = str(tiny_model.build())
    invariants = catalog.load()
    one_round(model, invariants, 1, 3)  # warm: imports, the first engine config
    runs = {1: [], 2: []}
    for r in range(args.rounds):
        for bq in (1, 2):
            s = one_round(model, invariants, bq, args.examples)
            runs[bq].append(s)
            print(f"round {r + 1} {'Async' if bq > 1 else ''}Scheduler: "
                  f"{60 * s['examples'] / s['wall']:.0f} examples/min "
                  f"(play {s['play']:.1f} s, catalog {s['catalog']:.1f} s, "
                  f"shadow {s['shadow']:.1f} s, {s['steps']} steps)", flush=True)
    rate = {bq: statistics.median(60 * s["examples"] / s["wall"] for s in rs)
            for bq, rs in runs.items()}
    print(f"{platform.node()}, {os.cpu_count()} cores, {args.examples} examples a round, "
          f"{args.rounds} rounds: Scheduler {rate[1]:.0f}/min, AsyncScheduler {rate[2]:.0f}/min "
          f"({rate[2] / rate[1]:.2f}x)")


if __name__ == "__main__":
    main()
