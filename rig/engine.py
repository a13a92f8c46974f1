"""A real vLLM engine on the CPU (tiny local model, sized KV cache), and workloads for it.

In-process mode (VLLM_ENABLE_V1_MULTIPROCESSING=0) puts the engine core, and its scheduler, in
this process, where attach() can reach it.
"""

from __future__ import annotations

import os
from typing import Any

from vllm_contract.rig.scenarios import prompt

# The tiny model holds 512 B of KV per token: one 128-token CPU block is 64 KiB.
BLOCK_BYTES = 64 << 10


def make_llm(model_dir: str, kv_blocks: int = 1024, **kwargs: Any):
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from vllm import LLM

    options = dict(model=str(model_dir), skip_tokenizer_init=True, enforce_eager=True,
                   max_model_len=512, dtype="bfloat16", seed=0,
                   kv_cache_memory_bytes=kv_blocks * BLOCK_BYTES)
    options.update(kwargs)
    return LLM(**options)


def scheduler_of(llm: Any) -> Any:
    """The in-process engine core's scheduler (needs VLLM_ENABLE_V1_MULTIPROCESSING=0)."""
    core = llm.llm_engine.engine_core
    inner = getattr(core, "engine_core", None)
    if inner is None:
        raise RuntimeError("engine core runs in another process; set "
                           "VLLM_ENABLE_V1_MULTIPROCESSING=0 to attach in-process")
    return inner.scheduler


def params(max_tokens: int, **kw: Any):
    from vllm import SamplingParams

    return SamplingParams(max_tokens=max_tokens, ignore_eos=True, detokenize=False,
                          temperature=kw.pop("temperature", 0.0), **kw)


def demo_workload(llm: Any, on_step=None) -> dict[str, list[int]]:
    """Chunked prefill (prompts longer than the token budget), preemption (a KV cache too small
    for all requests at once), an abort of a running request and one of a waiting request.
    Returns the tokens the engine emitted per external request id."""
    engine = llm.llm_engine
    tokens: dict[str, list[int]] = {}
    for i in range(8):
        rid = f"req-{i}"
        engine.add_request(rid, {"prompt_token_ids": prompt(i, 150 + 40 * i)},
                           params(96 + 8 * i, seed=i))
        tokens[rid] = []
    steps = 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            tokens[out.request_id] = list(out.outputs[0].token_ids)
        steps += 1
        if steps == 6:
            engine.abort_request(["req-1", "req-7"])
        if on_step:
            on_step(steps)
    return tokens
