"""`vllm-contract demo` / `make demo`: a real CPU engine, recorded, then summarised."""

from __future__ import annotations

import os
import shutil
import sys
import time
import warnings
from pathlib import Path

DEMO_ENGINE = dict(kv_blocks=8, max_num_batched_tokens=128, max_num_seqs=8)


def record_demo(out: Path, model: Path | None = None) -> dict:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    # vLLM's start-up log (60 lines, among them a warning with a traceback about the tokenizer
    # the demo does without) buries the demo's own lines; read when vllm is first imported
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    if os.environ["VLLM_LOGGING_LEVEL"] == "ERROR":  # torch deprecations vLLM trips on import
        warnings.filterwarnings("ignore", category=FutureWarning, module=r"vllm\.")
    from vllm_contract.recorder import attach
    from vllm_contract.rig import tiny_model
    from vllm_contract.rig.engine import demo_workload, make_llm, scheduler_of

    model_dir = model or tiny_model.build()
    llm = make_llm(str(model_dir), **DEMO_ENGINE)
    with attach(scheduler_of(llm), out):
        tokens = demo_workload(llm, on_step=_progress())
    if sys.stderr.isatty():  # ends the progress line
        print(file=sys.stderr)
    return tokens


def _progress():
    """The step count on one line of a terminal; into a log or a pipe, a line per 100 steps."""
    if sys.stderr.isatty():
        return lambda n: print(f"\rstep {n}", end="", file=sys.stderr) if n % 10 == 0 else None
    return lambda n: print(f"step {n}", file=sys.stderr) if n % 100 == 0 else None


def main(out: Path, model: Path | None = None) -> None:
    from vllm_contract.replay.query.summary import summary
    from vllm_contract.trace import open_trace

    if out.exists():
        shutil.rmtree(out)
    print(f"recording a real vLLM engine (tiny local Llama, CPU) into {out}/ ..."
          + ("" if "VLLM_LOGGING_LEVEL" in os.environ
             else " (vLLM's log: set VLLM_LOGGING_LEVEL=INFO to see it)"), file=sys.stderr)
    t0 = time.time()
    tokens = record_demo(out, model)
    s = summary(open_trace(out))["engines"][0]
    rows = s["rows"]
    print(f"\nrecorded {s['steps']} steps of vLLM {s['vllm_version']} in {time.time() - t0:.1f} s:"
          f" {s['requests']} requests, {s['tokens_scheduled']} tokens scheduled, "
          f"{rows['preempted']} preemptions, {rows['finished']} finished ids delivered, "
          f"{sum(len(t) for t in tokens.values())} tokens generated")
    print(f"integrity: {'; '.join(s['integrity']) or 'OK'}")
    print("\nnext:")
    print(f"  vllm-contract info {out}")
    print(f"  vllm-contract check {out}")
    print(f"  vllm-contract sql {out} \"SELECT * FROM lifeline\"")
    print(f"  vllm-contract compact {out}")
    print(f"  vllm-contract replay {out} --worker vllm    # a real worker, token for token")
    print(f"  vllm-contract tui {out}")
