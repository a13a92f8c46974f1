"""What the input log costs the engine thread per add_request() and per abort (issue 30 §1).

The real vLLM Scheduler in the rig's Harness (no model). Blocks of add_request() calls
alternate recording off / on in one process (these machines are noisy); each block adds
`--adds` requests of `--prompt` tokens and aborts them all in one finish_requests() call, and
only the scheduler calls are timed (building the Requests is the frontend's work). An "on"
block records into a fresh trace (the writer given), closed outside the timing.

Usage: python bench/input_log_cost.py [--adds 500] [--prompt 256] [--blocks 10]
           [--writer thread process] [--redact]
Prints one markdown row per writer: µs per add_request() and per aborted id, off and on.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

from vllm_contract.recorder import attach  # noqa: E402
from vllm_contract.rig import tiny_model  # noqa: E402
from vllm_contract.rig.harness import Harness, HarnessConfig  # noqa: E402
from vllm_contract.rig.scenarios import prompt  # noqa: E402


def _requests(h: Harness, n: int, length: int, tag: str) -> list:
    from vllm import SamplingParams
    from vllm.v1.request import Request

    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    return [Request(request_id=f"{tag}-{i}", prompt_token_ids=prompt(i, length),
                    sampling_params=params, pooling_params=None, block_hasher=h.block_hasher)
            for i in range(n)]


def _block(h: Harness, n: int, length: int, tag: str) -> tuple[float, float]:
    """Seconds in add_request() per call, and in finish_requests() per id."""
    from vllm.v1.request import RequestStatus

    reqs = _requests(h, n, length, tag)
    t0 = time.perf_counter()
    for r in reqs:
        h.scheduler.add_request(r)
    t1 = time.perf_counter()
    h.scheduler.finish_requests([r.request_id for r in reqs], RequestStatus.FINISHED_ABORTED)
    t2 = time.perf_counter()
    h.scheduler.finished_req_ids.clear()
    return (t1 - t0) / n, (t2 - t1) / n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--adds", type=int, default=500)
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--blocks", type=int, default=10)
    ap.add_argument("--writer", nargs="+", default=["thread", "process"])
    ap.add_argument("--redact", action="store_true")
    a = ap.parse_args()
    model = str(tiny_model.build())
    h = Harness(model, HarnessConfig(max_model_len=a.prompt + 64))
    _block(h, a.adds, a.prompt, "warm")
    print(f"# {time.strftime('%Y-%m-%d %H:%M')} {platform.node()} ({os.cpu_count()} cores), "
          f"{a.adds} adds of {a.prompt} tokens a block, {a.blocks} blocks each way"
          f"{', redacted' if a.redact else ''}")
    print("| writer | add_request µs off | on | on ÷ off | abort µs/id off | on | on ÷ off |")
    print("|---|---|---|---|---|---|---|")
    for writer in a.writer:
        off, on = [], []
        for k in range(a.blocks):
            off.append(_block(h, a.adds, a.prompt, f"off{k}"))
            with tempfile.TemporaryDirectory() as d:
                rec = attach(h.scheduler, d, writer=writer, redact_prompts=a.redact)
                on.append(_block(h, a.adds, a.prompt, f"on{k}"))
                rec.close()
        add_off = statistics.median(x[0] for x in off) * 1e6
        add_on = statistics.median(x[0] for x in on) * 1e6
        ab_off = statistics.median(x[1] for x in off) * 1e6
        ab_on = statistics.median(x[1] for x in on) * 1e6
        print(f"| {writer} | {add_off:.1f} | {add_on:.1f} | {add_on / add_off:.2f} | "
              f"{ab_off:.2f} | {ab_on:.2f} | {ab_on / ab_off:.2f} |")


if __name__ == "__main__":
    main()
