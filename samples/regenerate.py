"""Regenerate samples/: small real traces recorded by the rig, compacted to Parquet.

Run with `make samples`. Each sample is one harness scenario (docs/scenarios.md) played on the
real vLLM Scheduler; see samples/README.md for what each holds.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from vllm_contract.recorder.compact import compact
from vllm_contract.replay.trace import open_trace
from vllm_contract.rig import breaks, scenarios, tiny_model

HERE = Path(__file__).resolve().parent
SAMPLES = {  # sample directory -> scenario
    "mixed": "mixed",
    "spec-decode": "spec_decode",
    "encoder-lookalike": "encoder_lookalike",
    "structured-output": "structured_output",
}


def main() -> None:
    model = str(tiny_model.build())
    for sample, scenario in SAMPLES.items():
        out = HERE / sample
        shutil.rmtree(out, ignore_errors=True)
        scenarios.run(scenario, model, out)
        compact(open_trace(out))
        size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
        print(f"samples/{sample}: scenario {scenario}, {size} bytes", file=sys.stderr)
    for sample, (scenario, make, what) in breaks.BREAKS.items():
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
    main()
