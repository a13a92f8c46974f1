"""Recorder overhead on the real vLLM Scheduler (driven by the harness, no model).

1. Steps per second with recording on ÷ off, at 256 and 1024 running decode requests. Blocks of
   steps alternate off/on in one process (these machines are noisy), and an "on" block includes
   closing the recorder, so the writer's work is paid inside the measurement. Target ≥ 0.97.
   Beside it, the engine thread's own CPU time on ÷ off: the hooks' cost on the hot path,
   without the writer's work and less swayed by other processes on a busy machine.
2. Bytes on disk per (step, request) row after compaction, against pickle.dumps of the same
   SchedulerOutputs. Target ≥ 10× smaller.

Usage: python bench/recorder_overhead.py [--reqs 256 1024] [--blocks 8] [--block-steps 50]
           [--writer process thread]
Prints a markdown table; paste it into bench/RESULTS.md with the date and machine.

Two versions of the recorder, alternated: `--checkouts DIR_A DIR_B [--rounds 3]` runs part 1
in a fresh process per (round, checkout), importing vllm_contract from that checkout (e.g. a
`git worktree add /tmp/before HEAD`), in ABAB... order, BABA... on odd rounds; the writer
process it starts imports the same checkout.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import pickle
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

from vllm_contract import schema  # noqa: E402
from vllm_contract.recorder import attach  # noqa: E402
from vllm_contract.recorder.compact import compact  # noqa: E402
from vllm_contract.trace import open_trace  # noqa: E402
from vllm_contract.rig import tiny_model  # noqa: E402
from vllm_contract.rig.harness import Harness, HarnessConfig  # noqa: E402
from vllm_contract.rig.scenarios import prompt  # noqa: E402


SCHEDULER_OUTPUT_TABLES = ("steps", "scheduled", "requests", "finished", "preempted", "freed_mm",
                           "extra_fields")


class DecodeLoad:
    """n running decode requests, each finished one replaced by a new one (lengths staggered,
    so a few requests turn over per step, as in a serving engine)."""

    def __init__(self, model: str, n: int) -> None:
        self.h = h = Harness(model, HarnessConfig(
            num_blocks=n * 40, max_num_batched_tokens=max(2048, n * 8), max_num_seqs=n,
            enable_prefix_caching=False, keep_model_outputs=False))
        self.scheduler = h.scheduler
        self.next_id = 0
        for _ in range(n):
            self.add()

    def add(self) -> None:
        i = self.next_id
        self.next_id += 1
        self.h.add(f"r{i}", prompt(i, 8), max_tokens=100 + (i * 37) % 380)

    def step(self):
        result = self.h.step()
        for _ in result.finished:
            self.add()
        return result


def decode_harness(model: str, n: int) -> DecodeLoad:
    h = DecodeLoad(model, n)
    for _ in range(20):  # past the first prefills, into steady decode
        h.step()
    return h


def overhead(model: str, n: int, blocks: int, block_steps: int, tmp: Path,
             writer: str = "process") -> dict:
    """Two identical, deterministic loads evolve in lockstep: A plain, B recorded from start to
    end (as in a real engine). They take turns, block by block, so block i of A and block i of B
    do the same scheduler work at nearly the same moment; B's last block includes closing the
    recorder, so every byte the writer owed is paid for inside the measurement."""
    plain, recorded = decode_harness(model, n), decode_harness(model, n)
    rec = attach(recorded.scheduler, tmp / f"overhead-{n}-{writer}", writer=writer)
    # Both heaps are alive; full GC runs walk both, whoever triggers them. Freezing what exists
    # now keeps those runs short, for both sides alike.
    gc.collect()
    gc.freeze()
    times = {"off": [], "on": []}
    cpu = {"off": 0.0, "on": 0.0}
    order = (("off", plain), ("on", recorded))
    for b in range(blocks):
        for mode, load in (order if b % 2 == 0 else order[::-1]):  # neither always goes first
            t0, c0 = time.perf_counter(), time.thread_time()
            for _ in range(block_steps):
                load.step()
            if mode == "on" and b == blocks - 1:
                rec.close()
            cpu[mode] += time.thread_time() - c0
            times[mode].append(time.perf_counter() - t0)
    gc.unfreeze()
    assert recorded.h.steps == plain.h.steps and rec.writer.manifest["closed_cleanly"]
    off, on = sum(times["off"]), sum(times["on"])
    pairs = [a / b for a, b in zip(times["off"], times["on"])]
    return {"reqs": n, "steps_per_s_off": blocks * block_steps / off,
            "steps_per_s_on": blocks * block_steps / on, "ratio": off / on,
            "pair_median": statistics.median(pairs), "cpu_ratio": cpu["on"] / cpu["off"]}


def size(model: str, n: int, steps: int, tmp: Path) -> dict:
    h = decode_harness(model, n)
    pickled = 0
    original = h.scheduler.schedule

    def schedule(*a, **kw):
        nonlocal pickled
        out = original(*a, **kw)
        pickled += len(pickle.dumps(out))
        return out

    h.scheduler.schedule = schedule
    out = tmp / "size"
    with attach(h.scheduler, out):
        for _ in range(steps):
            h.step()
    trace = open_trace(out)
    compact(trace)
    rows = trace.read("scheduled").num_rows
    # pickle holds the SchedulerOutputs only: compare with the tables that hold them, and show
    # the model outputs and update/finish tables (which pickle does not have) beside it.
    per_table = {t: sum(p.stat().st_size for p in schema.table_dir(e.dir, t).glob("*.parquet"))
                 for e in trace.engines for t in schema.TABLE_NAMES}
    so_bytes = sum(per_table[t] for t in SCHEDULER_OUTPUT_TABLES)
    return {"reqs": n, "steps": steps, "rows": rows, "trace_bytes_per_row": so_bytes / rows,
            "all_bytes_per_row": sum(per_table.values()) / rows,
            "pickle_bytes_per_row": pickled / rows, "ratio": pickled / so_bytes}


def _shim(checkout: Path, into: Path) -> Path:
    """A folder that, first on PYTHONPATH, makes `vllm_contract` that checkout's (as
    pyproject.toml's package-dir maps it), ahead of the editable install."""
    pkg = into / "vllm_contract"
    pkg.mkdir(parents=True)
    for entry in (checkout / "core").iterdir():
        (pkg / entry.name).symlink_to(entry)
    for sub in ("cli", "recorder", "replay", "tui", "rig"):
        (pkg / sub).symlink_to(checkout / sub)
    return into


def alternate(args: argparse.Namespace, tmp: Path) -> None:
    """Part 1 for each checkout, one process per (round, checkout), alternated."""
    checkouts = [Path(c).resolve() for c in args.checkouts]
    shims = [_shim(c, tmp / f"shim{i}") for i, c in enumerate(checkouts)]
    cmd = [sys.executable, str(Path(__file__).resolve()), "--json", "--reqs", *map(str, args.reqs),
           "--blocks", str(args.blocks), "--block-steps", str(args.block_steps),
           "--writer", *args.writer]
    results: dict[int, list[dict]] = {i: [] for i in range(len(checkouts))}
    for r in range(args.rounds):
        order = list(range(len(checkouts)))
        for i in (order if r % 2 == 0 else order[::-1]):
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(
                [str(shims[i]), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
            out = subprocess.run(cmd, env=env, cwd=tmp, check=True, capture_output=True,
                                 text=True).stdout
            for line in out.splitlines():
                if line.startswith("{"):
                    row = json.loads(line)
                    assert Path(row["recorder"]).resolve().is_relative_to(checkouts[i]), row

                    results[i].append({**row, "round": r})
                    print(f"round {r} {checkouts[i]}: {line}", file=sys.stderr, flush=True)
    print("\n| checkout | writer | running reqs | rounds | on ÷ off, each round | median | "
          "engine-thread CPU on ÷ off, median |")
    print("|---|---|---|---|---|---|---|")
    for i, c in enumerate(checkouts):
        for w in args.writer:
            for n in args.reqs:
                rows = [x for x in results[i] if x["writer"] == w and x["reqs"] == n]
                ratios = [x["ratio"] for x in rows]
                print(f"| {c} | {w} | {n} | {len(rows)} | "
                      f"{' '.join(f'{x:.3f}' for x in ratios)} | "
                      f"{statistics.median(ratios):.3f} | "
                      f"{statistics.median(x['cpu_ratio'] for x in rows):.3f} |")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reqs", type=int, nargs="+", default=[256, 1024])
    ap.add_argument("--blocks", type=int, default=12)
    ap.add_argument("--block-steps", type=int, default=64)
    ap.add_argument("--size-steps", type=int, default=400)
    ap.add_argument("--writer", nargs="+", choices=("process", "thread"), default=["process"])
    ap.add_argument("--checkouts", nargs="+", help="alternate part 1 across these checkouts")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", action="store_true", help="part 1 only, one JSON line a result")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="vllm-contract-bench-"))
    if args.checkouts:
        try:
            alternate(args, tmp)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return
    model = str(tiny_model.build())
    if args.json:
        import vllm_contract.recorder

        try:
            for w in args.writer:
                for n in args.reqs:
                    r = overhead(model, n, args.blocks, args.block_steps, tmp, w)
                    print(json.dumps({**r, "writer": w,
                                      "recorder": vllm_contract.recorder.__file__}), flush=True)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return
    try:
        print(f"# recorder overhead, {time.strftime('%Y-%m-%d')}, {platform.node()}, "
              f"{os.cpu_count()} cores, Python {platform.python_version()}", flush=True)
        print("\n| writer | running reqs | steps/s off | steps/s on | "
              "on ÷ off (target ≥ 0.97) | median of paired blocks | engine-thread CPU on ÷ off |")
        print("|---|---|---|---|---|---|---|")
        for w in args.writer:
            for n in args.reqs:
                r = overhead(model, n, args.blocks, args.block_steps, tmp, w)
                print(f"| {w} | {n} | {r['steps_per_s_off']:.1f} | {r['steps_per_s_on']:.1f} | "
                      f"{r['ratio']:.3f} | {r['pair_median']:.3f} | {r['cpu_ratio']:.3f} |",
                      flush=True)
        print("\n| running reqs | steps | rows | SchedulerOutput tables B/row | all tables B/row "
              "| pickle B/row | pickle ÷ trace (target ≥ 10) |")
        print("|---|---|---|---|---|---|---|")
        for n in args.reqs:
            r = size(model, n, args.size_steps, tmp)
            print(f"| {n} | {r['steps']} | {r['rows']} | {r['trace_bytes_per_row']:.2f} | "
                  f"{r['all_bytes_per_row']:.2f} | {r['pickle_bytes_per_row']:.2f} | "
                  f"{r['ratio']:.1f} |", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
