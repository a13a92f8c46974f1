"""How much more does `check` cost on a hybrid engine's trace than on a Llama's of the same size?

The same workload on vLLM's real Scheduler (the rig's harness), recorded three times: one
full-attention KV cache group (the Llama shape), a sliding-window group beside a full one
(Gemma 2/3, gpt-oss), and a Mamba group beside a full one (Granite-4.0-H, Nemotron-H). `slots`
requests run at once, each finished one replaced (prompts behind a shared prefix, so prefix
hits happen, 100-400 tokens out), for `--steps` steps; the traces are compacted. Then the full
catalog runs on each in a fresh process, in turns (`--rounds` times; medians shown, each
round's ratio listed): every hybrid run's time against the Llama run of its round.
Target (issue 46): a hybrid trace within 1.5x the Llama one.

Usage: python bench/hybrid_check_speed.py [--steps 100000] [--slots 64] [--rounds 3] [--keep DIR]
"""

from __future__ import annotations

import argparse
import itertools
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from check_speed import child  # noqa: E402  (a fresh process per run, peak RSS measured)

SHAPES = {
    "llama (full)": (),
    "sliding + full": ({"spec": "SlidingWindowSpec", "sliding_window": 32},
                       {"spec": "FullAttentionSpec"}),
    "mamba + full": ({"spec": "MambaSpec", "num_prefill_checkpoint_blocks": 1,
                      "prefill_checkpoint_alignment": 1}, {"spec": "FullAttentionSpec"}),
}


def record(out: Path, groups: tuple, steps: int, slots: int) -> float:
    """The workload on the real Scheduler with these KV cache groups, recorded and compacted;
    returns the seconds it took."""
    from vllm_contract.recorder import attach
    from vllm_contract.recorder.compact import compact
    from vllm_contract.rig import tiny_model
    from vllm_contract.rig.harness import Harness, HarnessConfig
    from vllm_contract.rig.scenarios import prompt
    from vllm_contract.trace import open_trace

    t0 = time.perf_counter()
    cfg = HarnessConfig(num_blocks=8192, max_num_batched_tokens=2048, max_num_seqs=slots,
                        groups=groups, keep_model_outputs=False)
    h = Harness(str(tiny_model.build()), cfg)
    shared = prompt(7, 64)
    ids = itertools.count()

    def add() -> None:
        i = next(ids)
        h.add(f"r{i}", shared + prompt(i, 8 + i % 40), max_tokens=100 + (i * 37) % 300)

    shutil.rmtree(out, ignore_errors=True)
    with attach(h.scheduler, out):
        for _ in range(slots):
            add()
        for n in range(steps):
            for _ in h.step().finished:
                add()
            if n % 10_000 == 0:
                print(f"  {out.name}: step {n:,}", file=sys.stderr)
    compact(open_trace(out))
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--slots", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--keep", type=Path)
    a = ap.parse_args()
    root = a.keep or Path(tempfile.mkdtemp(prefix="vllm-contract-hybrid-"))
    traces = {}
    for i, (name, groups) in enumerate(SHAPES.items()):
        out = root / f"shape{i}-{a.steps}"
        if not (out / "_engines").exists():
            print(f"recording {name} ({a.steps:,} steps) ...", file=sys.stderr)
            print(f"  recorded in {record(out, groups, a.steps, a.slots):.0f} s", file=sys.stderr)
        traces[name] = out
    runs: dict[str, list[dict]] = {name: [] for name in SHAPES}
    for r in range(a.rounds):
        for name, path in traces.items():
            run = child("check", path)
            serious = [f for f in run["findings"] if f["severity"] in ("error", "warning")]
            assert not serious, f"{name}: a clean run has findings: {serious[:3]}"
            runs[name].append(run)
            print(f"  round {r + 1}: {name} {run['seconds']:.1f} s", file=sys.stderr)
    base = "llama (full)"
    print(f"# check on hybrid traces, {time.strftime('%Y-%m-%d %H:%M')}, {platform.node()}, "
          f"{os.cpu_count()} cores")
    print(f"\n{a.steps:,} steps, {a.slots} requests at once, real Scheduler (rig harness); "
          f"{len(runs[base][0]['findings'])} findings (info) on the Llama trace; "
          f"{runs[base][0]['ran']} checks\n")
    print("| trace | check, s (median) | peak RSS MB | ratio to Llama (median; each round) "
          "| target |")
    print("|---|---|---|---|---|")
    for name in SHAPES:
        secs = [x["seconds"] for x in runs[name]]
        ratios = [x["seconds"] / b["seconds"] for x, b in zip(runs[name], runs[base])]
        each = ", ".join(f"{q:.2f}" for q in ratios)
        print(f"| {name} | {statistics.median(secs):.1f} | "
              f"{max(x['peak_rss_mb'] for x in runs[name]):.0f} | "
              f"{statistics.median(ratios):.2f}x ({each}) | "
              f"{'' if name == base else '<= 1.5x'} |")


if __name__ == "__main__":
    main()
