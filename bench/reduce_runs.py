"""How far and how fast does `reduce` cut a recording of a scheduler bug?

Per bug (a vLLM Scheduler subclass written below): record 60 requests of staggered lengths on
a batch of 4 until all have finished (over a thousand steps), then reduce it to the finding of
the bug's invariant, with --jobs 1 and then 2. Prints requests and steps before -> after,
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

BUGS = {  # module text, class, the invariant its recording shows
    "drop_finished_once": ('''
from vllm.v1.core.sched.scheduler import Scheduler


class DropFinishedOnce(Scheduler):
    dropped = None

    def schedule(self, *args, **kwargs):
        so = super().schedule(*args, **kwargs)
        if self.dropped is None and so.finished_req_ids:
            self.dropped = sorted(so.finished_req_ids)[0]
            so.finished_req_ids.discard(self.dropped)
        return so
''', "DropFinishedOnce", "finished.leaked"),
    "forget_new_request": ('''
from vllm.v1.core.sched.scheduler import Scheduler


class ForgetNewOnce(Scheduler):
    forgotten = None

    def schedule(self, *args, **kwargs):
        so = super().schedule(*args, **kwargs)
        if self.forgotten is None and so.scheduled_new_reqs:
            self.forgotten = so.scheduled_new_reqs.pop().req_id
        return so
''', "ForgetNewOnce", "lifecycle.unknown_cached"),
    "hand_out_held_block": ('''
from vllm.v1.core.sched.scheduler import Scheduler


class HandOutHeldBlock(Scheduler):
    held = None
    done = False

    def schedule(self, *args, **kwargs):
        so = super().schedule(*args, **kwargs)
        for r in so.scheduled_new_reqs:
            if self.done:
                break
            if self.held is not None and r.num_computed_tokens == 0:
                r.block_ids[0][-1] = self.held
                self.done = True
            elif self.held is None:
                self.held = r.block_ids[0][-1]
        return so
''', "HandOutHeldBlock", "blocks.double_owner"),
}


def record(cls, path: Path, requests: int) -> int:
    import vllm.v1.core.sched.scheduler as sched_mod

    from vllm_contract.recorder import attach
    from vllm_contract.rig import tiny_model
    from vllm_contract.rig.harness import Harness, HarnessConfig
    from vllm_contract.rig.scenarios import prompt

    stock, sched_mod.Scheduler = sched_mod.Scheduler, cls
    try:
        h = Harness(str(tiny_model.build()), HarnessConfig(max_num_seqs=4,
                                                           max_num_batched_tokens=128))
    finally:
        sched_mod.Scheduler = stock
    steps = 0
    with attach(h.scheduler, path):
        for i in range(requests):
            h.add(f"w{i}", prompt(i, 20), max_tokens=50 + (i * 37) % 60)
        while h.busy:
            h.step()
            steps += 1
    return steps


def main() -> None:
    import importlib

    from vllm_contract.replay.resim.reduce import reduce

    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=60)
    a = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="vllm-contract-reduce-"))
    sys.path.insert(0, str(root))
    rows = []
    for name, (text, cls_name, invariant) in BUGS.items():
        (root / f"bench_{name}.py").write_text(text)
        cls = getattr(importlib.import_module(f"bench_{name}"), cls_name)
        steps = record(cls, root / name, a.requests)
        walls, calls = [], []
        for jobs in (1, 2):
            t0 = time.perf_counter()
            r = reduce(root / name, invariant, root / f"{name}-out-{jobs}",
                       scheduler_cls=f"bench_{name}:{cls_name}", jobs=jobs)
            walls.append(time.perf_counter() - t0)
            calls.append(r.calls)
        rows.append((name, invariant, r, steps, walls, calls))
    print(f"# reduce, {time.strftime('%Y-%m-%d')}, {platform.node()}, {os.cpu_count()} cores\n")
    print("| bug | invariant | requests before → after | steps before → after | "
          "re-simulations --jobs 1 / 2 | wall s --jobs 1 / 2 | pytest file |")
    print("|---|---|---|---|---|---|---|")
    for name, inv, r, steps, walls, calls in rows:
        print(f"| {name} | {inv} | {r.original_requests} → {len(r.best.requests)} | "
              f"{steps:,} → {r.best_steps:,} | {calls[0]} / {calls[1]} | "
              f"{walls[0]:.1f} / {walls[1]:.1f} | {'yes' if r.pytest_file else r.no_pytest} |")


if __name__ == "__main__":
    main()
