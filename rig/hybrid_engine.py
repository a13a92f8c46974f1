"""A real vLLM engine on the CPU over a tiny *hybrid* model (several KV-cache groups), and a
workload for it: prefix-cache hits across a shared prefix longer than the sliding window, chunked
prefill, preemption under a small KV cache, aborts of a running and of a waiting request.

`python -m vllm_contract.rig.hybrid_engine KIND OUT` records the workload into OUT.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

from vllm_contract.rig.engine import params, scheduler_of
from vllm_contract.rig.scenarios import prompt

MAMBA_KINDS = {"granite-hybrid", "qwen3-next", "nemotron-h", "falcon-h1", "mamba2"}

# Per kind: engine options that differ from the defaults in make_hybrid_llm. Sliding-window kinds
# set block_size 32 (one block = the window); Mamba kinds keep the block vLLM aligns to the Mamba
# state's page (128 here) and a token budget below it: a Mamba2 prefill chunk that crosses a block
# boundary can fail inside vLLM (`index 1 is out of bounds`). Plain mamba2 gets a 16-token block
# from vLLM (no attention to align to), hence block_size=128 there. kv_cache_memory_bytes is sized
# for a few preemptions (mamba2 shows none at 4, 6 or 10 blocks: the scheduler admits fewer).
ENGINE_OPTIONS: dict[str, dict] = {
    "gemma2": dict(max_num_batched_tokens=64, block_size=32, kv_cache_memory_bytes=448 << 10),
    "granite-hybrid": dict(max_num_batched_tokens=64, kv_cache_memory_bytes=768 << 10),
    "gemma3": dict(max_num_batched_tokens=64, block_size=32, kv_cache_memory_bytes=448 << 10),
    "gpt-oss": dict(max_num_batched_tokens=64, block_size=32, kv_cache_memory_bytes=448 << 10),
    "qwen3-next": dict(max_num_batched_tokens=64, kv_cache_memory_bytes=4 << 20),
    "nemotron-h": dict(max_num_batched_tokens=64, kv_cache_memory_bytes=768 << 10),
    "falcon-h1": dict(max_num_batched_tokens=64, kv_cache_memory_bytes=2 << 20),
    "mamba2": dict(max_num_batched_tokens=64, block_size=128, kv_cache_memory_bytes=768 << 10),
}


def engine_options(kind: str, model_dir: str | Path, **kw: Any) -> dict:
    options = dict(model=str(model_dir), skip_tokenizer_init=True, enforce_eager=True,
                   dtype="bfloat16", seed=0, max_model_len=512, enable_prefix_caching=True,
                   enable_chunked_prefill=True, max_num_seqs=8)
    if kind in MAMBA_KINDS:
        options["mamba_cache_mode"] = "align"
    options.update(ENGINE_OPTIONS.get(kind, {}))
    options.update(kw)
    return options


def make_hybrid_llm(kind: str, model_dir: str | Path, **kw: Any):
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm import LLM

    return LLM(**engine_options(kind, model_dir, **kw))


def hybrid_workload(llm: Any, on_step=None) -> dict[str, list[int]]:
    """Ten requests, six of them sharing a 160-token prefix (longer than the sliding window and than one
    128-token block);
    prompts of 130-250 tokens against a small token budget (chunked prefill); enough decoding to
    overflow a small KV cache (preemption); a running request and a waiting one aborted.
    Greedy, ignore_eos. Returns the tokens emitted per request id."""
    engine = llm.llm_engine
    tokens: dict[str, list[int]] = {}
    shared = prompt(99, 160)

    def add(rid: str, ids: list[int], max_tokens: int) -> None:
        engine.add_request(rid, {"prompt_token_ids": ids}, params(max_tokens))
        tokens[rid] = []

    # the first wave: two sharers, two unrelated long prompts
    add("share-0", shared + prompt(0, 40), 48)
    add("long-0", prompt(10, 180), 40)
    add("share-1", shared + prompt(1, 30), 48)
    add("long-1", prompt(11, 250), 32)
    steps = 0
    late_added = False
    while engine.has_unfinished_requests():
        for out in engine.step():
            tokens[out.request_id] = list(out.outputs[0].token_ids)
        steps += 1
        if steps == 8 and not late_added:
            # the second wave, after the shared prefix is computed and cached
            for i in range(2, 6):
                add(f"share-{i}", shared + prompt(i, 30 + 10 * i), 40)
            add("victim-waiting", prompt(20, 140), 20)
            add("long-2", prompt(12, 160), 36)
            late_added = True
        if steps == 12:
            engine.abort_request(["long-0", "victim-waiting"])
        if on_step:
            on_step(steps)
    tokens["__steps__"] = [steps]
    return tokens


def record(kind: str, out_dir: str | Path, **kw: Any) -> dict:
    from vllm_contract.recorder import attach
    from vllm_contract.rig.hybrid_models import build

    model_dir = build(kind)
    t0 = time.monotonic()
    llm = make_hybrid_llm(kind, model_dir, **kw)
    t1 = time.monotonic()
    with attach(scheduler_of(llm), out_dir):
        tokens = hybrid_workload(llm)
    t2 = time.monotonic()
    steps = tokens.pop("__steps__")[0]
    return dict(kind=kind, model_dir=str(model_dir), out_dir=str(out_dir), steps=steps,
                engine_s=round(t1 - t0, 1), workload_s=round(t2 - t1, 1),
                options=engine_options(kind, model_dir, **kw),
                tokens={k: len(v) for k, v in tokens.items()})


if __name__ == "__main__":
    import json

    if len(sys.argv) != 3:
        sys.exit("usage: python -m vllm_contract.rig.hybrid_engine KIND OUT")
    print(json.dumps(record(sys.argv[1], sys.argv[2]), indent=1))
