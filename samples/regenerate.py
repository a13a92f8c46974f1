"""Regenerate samples/: small real traces recorded by the rig, compacted to Parquet.

Run with `make samples` (all of them), or `python samples/regenerate.py NAME ...` for some. Each
sample is one harness scenario (docs/scenarios.md) played on the real vLLM Scheduler; see
samples/README.md for what each holds.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from vllm_contract.recorder.compact import compact
from vllm_contract.trace import open_trace
from vllm_contract.rig import breaks, scenarios, tiny_model

HERE = Path(__file__).resolve().parent
SAMPLES = {  # sample directory -> (scenario, batches in flight)
    "mixed": ("mixed", 1),
    "mixed-async": ("mixed", 2),
    "spec-decode": ("spec_decode", 1),
    "encoder-lookalike": ("encoder_lookalike", 1),
    "structured-output": ("structured_output", 1),
}
# recorded from a real vLLM engine on a tiny hybrid model (rig/hybrid_engine.py), each in a
# process of its own (one in-process engine per process)
LIVE = {
    "hybrid-sliding": "gemma2",
    "hybrid-mamba": "granite-hybrid",
}


def main(names: list[str]) -> None:
    unknown = set(names) - set(SAMPLES) - set(breaks.BREAKS) - set(LIVE)
    if unknown:
        sys.exit(f"unknown sample(s): {', '.join(sorted(unknown))}")
    model = str(tiny_model.build())
    for sample, (scenario, batch_queue) in SAMPLES.items():
        if names and sample not in names:
            continue
        out = HERE / sample
        shutil.rmtree(out, ignore_errors=True)
        scenarios.run(scenario, model, out, batch_queue=batch_queue)
        compact(open_trace(out))
        size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
        print(f"samples/{sample}: scenario {scenario}, {size} bytes", file=sys.stderr)
    for sample, kind in LIVE.items():
        if names and sample not in names:
            continue
        out = HERE / sample
        shutil.rmtree(out, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "vllm_contract.rig.hybrid_engine", kind, str(out)],
                       check=True, stdout=subprocess.DEVNULL)
        compact(open_trace(out))
        print(f"samples/{sample}: a real engine on the tiny {kind} model", file=sys.stderr)
    for sample, (scenario, make, what) in breaks.BREAKS.items():
        if names and sample not in names:
            continue
        out = HERE / sample
        shutil.rmtree(out, ignore_errors=True)
        mutate, step = make(), [0]

        def on_schedule(so, mutate=mutate, step=step):
            mutate(so, step[0])
            step[0] += 1

        scenarios.run(scenario, model, out, on_schedule=on_schedule)
        compact(open_trace(out))
        print(f"samples/{sample}: scenario {scenario} with {what}", file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1:])
