"""rig/workloads.py's Workloads played on a real vLLM engine (`LLM(...).llm_engine`) instead of
the bare Scheduler: the recorder's real paths (the plugin in a multiprocess engine, the batch
queue of async scheduling, a drafter) under the same generated operations.

Only a Workload's ops are played; the engine's settings are its own (a Workload's harness fields
are ignored). An add becomes `engine.add_request(name, {"prompt_token_ids": ...}, ...)` with the
prompt of rig/workloads.py (cut below the engine's max_model_len); vLLM fans n > 1 out into its
own children. An add whose name is still unfinished in the engine is dropped. An abort is
`engine.abort_request([name])`, which in vLLM 0.32 aborts every request of that external id, the
children of a parallel-sampling parent included. ("step", k) is k `engine.step()` calls, none when
nothing is unfinished. After each workload the engine is stepped until nothing is unfinished.

Sampling: greedy where n == 1; vLLM refuses n > 1 with greedy sampling, so those sample at
temperature 1 without a seed (a seeded CPU generator crashes on a chunked prefill:
docs/vllm-on-cpu.md). Priorities are passed only to an engine with scheduling_policy="priority"
(vLLM refuses them otherwise).

    python -m vllm_contract.rig.workload_engine MODEL WORKLOADS.json [ENGINE.json]

plays the ops lists of WORKLOADS.json (a list of lists of ops) on make_llm(MODEL, **ENGINE) in
a process of its own: with VLLM_CONTRACT_TRACE_DIR set, the plugin records it (also in
multiprocess mode, the engine core in a child process).
"""

from __future__ import annotations

import json
import sys
from typing import Any, Callable, Iterable

from vllm_contract.rig.workloads import Workload, prompt_tokens


def request_id(i: int, name: str, tag: bool) -> str:
    """The external id of `name` in workload `i`: "w<i>.<name>" when tagged, so that a
    request's id in the trace names its workload ("w3.a-1a2b3c4d", "1_w3.a-1a2b3c4d")."""
    return f"w{i}.{name}" if tag else name


def workload_of(req_id: str) -> int | None:
    """The workload index in a tagged id as the trace has it (see request_id)."""
    head = req_id.split("_", 1)[1] if req_id[:1].isdigit() and "_" in req_id else req_id
    if not head.startswith("w") or "." not in head:
        return None
    index = head[1:].split(".", 1)[0]
    return int(index) if index.isdigit() else None


def play_on_engine(llm_engine: Any, workloads: Iterable[Workload | tuple | list],
                   on_step: Callable[[int], Any] | None = None, tag_ids: bool = False,
                   max_steps: int = 5000) -> int:
    """Play each workload's ops on `llm_engine`, one workload after the other, each run dry
    before the next. `workloads` are Workloads or bare ops sequences. on_step(i) is called
    after every engine.step() made while workload i plays. With tag_ids, each request's id
    names its workload (request_id). Returns the engine.step() calls made."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    config = llm_engine.vllm_config
    max_model_len = config.model_config.max_model_len
    priorities = config.scheduler_config.policy == "priority"
    unfinished: set[str] = set()  # external ids added and neither finished nor aborted
    steps = 0

    def step(i: int) -> None:
        nonlocal steps
        for out in llm_engine.step():
            if out.finished:
                unfinished.discard(out.request_id)
        steps += 1
        if on_step is not None:
            on_step(i)

    for i, w in enumerate(workloads):
        ops = w.ops if isinstance(w, Workload) else w
        for op in ops:
            kind = op[0]
            if kind == "add":
                _, name, _, _, _, max_tokens, priority, n = op
                rid = request_id(i, name, tag_ids)
                if rid in unfinished:
                    continue
                sampling = SamplingParams(
                    max_tokens=max_tokens, n=n, ignore_eos=True, detokenize=False,
                    temperature=0.0 if n == 1 else 1.0,
                    output_kind=RequestOutputKind.FINAL_ONLY)
                llm_engine.add_request(rid, {"prompt_token_ids": prompt_tokens(op, max_model_len)},
                                       sampling, priority=priority if priorities else 0)
                unfinished.add(rid)
            elif kind == "abort":
                rid = request_id(i, op[1], tag_ids)
                llm_engine.abort_request([rid])
                unfinished.discard(rid)
            elif kind == "step":
                for _ in range(op[1]):
                    if not llm_engine.has_unfinished_requests():
                        break
                    step(i)
            else:
                raise ValueError(f"unknown op {op!r}")
        drained = 0
        while llm_engine.has_unfinished_requests():
            if drained >= max_steps:
                raise RuntimeError(f"workload {i} did not drain in {max_steps} steps: {ops}")
            step(i)
            drained += 1
        unfinished.clear()
    return steps


def main(argv: list[str]) -> None:
    from vllm_contract.rig.engine import make_llm

    model, path = argv[0], argv[1]
    engine = json.loads(argv[2]) if len(argv) > 2 else {}
    with open(path) as f:
        ops_lists = [[tuple(op) for op in ops] for ops in json.load(f)]
    llm = make_llm(model, **engine)
    play_on_engine(llm.llm_engine, ops_lists, tag_ids=True)
    llm.llm_engine.engine_core.shutdown()


if __name__ == "__main__":  # vLLM may spawn its engine core: the module is imported again
    main(sys.argv[1:])
