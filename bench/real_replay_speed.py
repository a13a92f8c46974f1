"""Real-worker replay against a plain run of the same workload (issue 19: ratio ≤ 1.3).

The demo's workload (chunked prefill, preemption, aborts; the tiny local model on the CPU
build) runs once recorded, to make the trace. Then, alternately in one process, `rounds`
times: the workload unrecorded on its engine (`plain`: the engine's own loop, scheduler and
all), and the trace's replay into a real worker (`replay`: rebuild of every SchedulerOutput
from the trace, executor calls, token comparison; the replay engine is built once, before
timing, as the plain engine is). Prints each pair and the median ratio replay ÷ plain.

Usage: python bench/real_replay_speed.py [--rounds 7] [--out DIR]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()

    from vllm_contract.recorder import attach
    from vllm_contract.replay.worker.plan import plan
    from vllm_contract.replay.worker.vllm_driver import VllmDriver
    from vllm_contract.rig import tiny_model
    from vllm_contract.rig.demo import DEMO_ENGINE
    from vllm_contract.rig.engine import demo_workload, make_llm, scheduler_of
    from vllm_contract.trace import open_trace

    out = a.out or Path(tempfile.mkdtemp(prefix="vc-replay-bench-")) / "trace"
    llm = make_llm(str(tiny_model.build()), **DEMO_ENGINE)
    with attach(scheduler_of(llm), out):
        demo_workload(llm)
    (engine,) = open_trace(out).engines
    w = VllmDriver(plan(engine))
    steps = len(w.steps)
    w.run()  # warm-up of both engines, untimed
    demo_workload(llm)
    pairs = []
    for r in range(a.rounds):
        t0 = time.perf_counter()
        demo_workload(llm)
        plain = time.perf_counter() - t0
        t0 = time.perf_counter()
        w.reset()
        w.run()
        replay = time.perf_counter() - t0
        assert w.divergences == [], w.divergences[:3]
        pairs.append((plain, replay))
        print(f"round {r + 1}: plain {plain:.3f} s, replay {replay:.3f} s, "
              f"ratio {replay / plain:.3f}", flush=True)
    ratios = sorted(rp / p for p, rp in pairs)
    print(f"{steps} steps; median plain {statistics.median(p for p, _ in pairs):.3f} s, "
          f"median replay {statistics.median(rp for _, rp in pairs):.3f} s; "
          f"replay ÷ plain median {statistics.median(ratios):.3f} "
          f"(min {ratios[0]:.3f}, max {ratios[-1]:.3f})")


if __name__ == "__main__":
    main()
