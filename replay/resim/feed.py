"""The vLLM objects a re-run hands the scheduler: Requests rebuilt from the recording's
NewRequestData, and ModelRunnerOutputs built from the re-run's own batch (vLLM lazily)."""

from __future__ import annotations

import weakref
from typing import Any, Callable

from vllm_contract.replay.resim.inputs import Outputs

FILLER = 3  # a token for a request past its recorded outputs: only after a divergence


class Requests:
    """Each request the re-run added, with its incarnation (n-th introduction of its id), so
    that a reused id reads its own recorded outputs."""

    def __init__(self, block_hasher: Any, structured_manager: Any) -> None:
        self.hasher = block_hasher
        self.manager = structured_manager
        self.count: dict[str, int] = {}
        # req_id -> (Request, incarnation); weakly, so that a request the scheduler has let go
        # of is not kept alive for the rest of the run
        self.live: dict[str, tuple[Any, int]] = {}
        self._arrival = 0.0
        # called with (req_id, incarnation) once the re-run has let go of that Request: its
        # recorded tokens are not asked for again (inputs.Outputs.release)
        self.on_release: Any = None

    def make(self, req_id: str, prompt: list[int], sampling: Any, pooling: Any = None,
             lora: Any = None, mm: Any = None, counted: bool = True, **given: Any) -> Any:
        """A Request as the engine would add it; `given`: the recorded constructor arguments
        besides these (arrival_time, priority, cache_salt, ...). Without a recorded arrival
        time, increasing ones keep the order requests are added in."""
        from vllm.v1.request import Request

        self._arrival += 1.0
        given.setdefault("arrival_time", self._arrival)
        req = Request(request_id=req_id, prompt_token_ids=list(prompt), sampling_params=sampling,
                      pooling_params=pooling, mm_features=mm or None, lora_request=lora,
                      block_hasher=self.hasher, **given)
        if counted:
            k = self.count[req_id] = self.count.get(req_id, -1) + 1
            self.live[req_id] = (weakref.ref(req), k)
            if self.on_release is not None:
                weakref.finalize(req, self.on_release, (req_id, k))
        if req.use_structured_output:
            self.manager.grammar_init(req)
            future = req.structured_output_request._grammar
            if hasattr(future, "result"):  # compiled in a pool; waited for, as the rig does
                future.result(timeout=60)
        return req

    def from_new(self, nr: Any) -> Any:
        return self.make(nr.req_id, nr.prompt_token_ids, nr.sampling_params, nr.pooling_params,
                         nr.lora_request, nr.mm_features)

    def from_added(self, row: dict, decode: Any, others: dict) -> Any:
        """The Request an input log's `added` row recorded. Redacted prompts: made-up tokens
        of the recorded length, and the recorded (salted) block hashes in place of the ones
        they would hash to, so that prefix-cache hits come out as recorded."""
        prompt = row["prompt_token_ids"]
        if prompt is None:
            prompt = [FILLER] * max(1, row["num_prompt_tokens"] or 0)
        given = {k: row[k] for k in ("arrival_time", "priority", "client_index", "cache_salt")
                 if row[k] is not None}
        req = self.make(row["req_id"], prompt, decode(row["sampling_params"]),
                        decode(row["pooling_params"]), decode(row["lora_request"]),
                        decode(row["mm_features"]), **given, **others)
        hashes = row["prompt_block_hashes"]
        if hashes is not None:
            req.block_hashes[:] = [bytes(h) for h in hashes]
        return req

    def phantom(self, req_id: str) -> Any:
        """A request aborted before any step scheduled it: the trace has nothing of it but its
        id, and the scheduler only queues and frees it."""
        from vllm import SamplingParams

        params = SamplingParams(max_tokens=1, temperature=0.0)
        return self.make(req_id, [FILLER], params, counted=False)

    def key(self, req: Any) -> tuple[str, int] | None:
        held = self.live.get(req.request_id)
        return None if held is None or held[0]() is not req else (req.request_id, held[1])


def runner_output(so: Any, chunks: dict[str, bool], tokens: Callable[[str], list[int]]) -> Any:
    """The ModelRunnerOutput of the re-run's batch `so`, for the requests in `chunks`: nothing
    for a prefill chunk, else `tokens(req_id)`."""
    from vllm.v1.outputs import ModelRunnerOutput

    req_ids, sampled = [], []
    for rid in so.num_scheduled_tokens:
        if rid not in chunks:
            continue
        req_ids.append(rid)
        sampled.append([] if chunks[rid] else tokens(rid))
    return ModelRunnerOutput(req_ids=req_ids, req_id_to_index={r: i for i, r in enumerate(req_ids)},
                             sampled_token_ids=sampled)


def model_output(so: Any, chunks: dict[str, bool], step: int, scheduler: Any,
                 requests: Requests, outputs: Outputs) -> Any:
    """What the worker returns for the re-run's batch `so`: the recorded tokens at each
    request's output position."""
    reqs = scheduler.requests

    def recorded(rid: str) -> list[int]:
        req = reqs.get(rid)
        toks = None
        if req is not None and not req.is_finished():
            key = requests.key(req)
            toks = None if key is None else outputs.at(key, req.num_output_tokens)  # a copy
        else:  # finished or aborted while its batch was in flight: ignored by the scheduler
            toks = outputs.by_step.get((step, rid))
            toks = None if toks is None else list(toks)
        return toks or [FILLER]

    return runner_output(so, chunks, recorded)


def finishes_of(engine_outputs: dict) -> list[tuple[str, str]]:
    return sorted((o.request_id, o.finish_reason.name) for eco in engine_outputs.values()
                  for o in eco.outputs if o.finish_reason is not None)
