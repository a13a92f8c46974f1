"""Drive the real vLLM Scheduler with no model, as vLLM's own unit tests do: schedule() → a
fabricated ModelRunnerOutput → update_from_output(), deterministically.

Fabricated parts, and only these: the sampled token ids (a function of request id and position,
or for structured-output requests the lowest token the real grammar's bitmask allows), draft
tokens fed back through the scheduler's own update_draft_token_ids() (with batch_queue > 1 the
drafts stay in the worker, as under async scheduling), how many drafts are accepted, and, only
with encoder_lookalike=True, encoder inputs stamped on the real outputs.
Everything the scheduler does with them is vLLM's real code.
"""

from __future__ import annotations

import collections
import math
import re
import zlib
from dataclasses import dataclass, field
from typing import Any

VOCAB = 512
EOS_TOKEN_ID = 2  # the tiny tokenizer's </s>


@dataclass
class HarnessConfig:
    num_blocks: int = 512
    block_size: int = 16
    max_num_batched_tokens: int = 256
    max_num_seqs: int = 64
    max_model_len: int = 512
    enable_prefix_caching: bool = True
    num_spec_tokens: int = 0
    structured_output: bool = False  # needs the model's tokenizer
    # LOOK-ALIKE, not vLLM: stamp encoder inputs onto real SchedulerOutputs (see
    # docs/scenarios.md for why the CPU build cannot schedule a multimodal model here).
    encoder_lookalike: bool = False
    # Keep every fabricated model output (tests compare them with the trace). Benchmarks turn it
    # off: 1024 lists kept per step make Python's full GC runs frequent and skew timings.
    keep_model_outputs: bool = True
    # Batches in flight, as EngineCore.step_with_batch_queue keeps them (async scheduling,
    # pipeline parallelism): above 1, the real AsyncScheduler schedules the next step before
    # the previous one's update. Drafts then stay in the worker: the scheduler sends -1
    # placeholders, and the fabricated model accepts some of its (unseen) drafts.
    batch_queue: int = 1
    policy: str = "fcfs"  # or "priority": Harness.add(priority=...) orders the queue
    # KV cache groups of a hybrid engine, each {"spec": a vLLM spec class name, its fields};
    # empty: one full-attention group. The specs are vLLM's own, so each group's block manager
    # is the real one (sliding window, Mamba): only the layers behind them are absent.
    groups: tuple = ()
    mamba_cache_mode: str = "align"  # for a MambaSpec group (prefix caching needs "align")


def token_for(req_id: str, position: int) -> int:
    """The fabricated model: a fixed token per (request, position), never EOS (id 2)."""
    return 3 + zlib.crc32(f"{req_id}:{position}".encode()) % (VOCAB - 3)


@dataclass
class StepResult:
    scheduler_output: Any
    model_output: Any
    engine_outputs: dict
    finished: list[str] = field(default_factory=list)


class Harness:
    def __init__(self, model_dir: str, config: HarnessConfig | None = None) -> None:
        import torch
        from vllm.engine.arg_utils import EngineArgs
        from vllm.utils.hashing import get_hash_fn_by_name
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
        from vllm.v1.core.sched.async_scheduler import AsyncScheduler
        from vllm.v1.core.sched.scheduler import Scheduler
        from vllm.v1.kv_cache_interface import (FullAttentionSpec, KVCacheConfig,
                                                KVCacheGroupSpec)
        from vllm.v1.structured_output import StructuredOutputManager

        self.config = c = config or HarnessConfig()
        spec = None
        if c.num_spec_tokens:
            spec = {"method": "ngram", "num_speculative_tokens": c.num_spec_tokens,
                    "prompt_lookup_max": 2, "prompt_lookup_min": 1}
        args = EngineArgs(model=str(model_dir), skip_tokenizer_init=not c.structured_output,
                          max_model_len=c.max_model_len, block_size=c.block_size,
                          enable_prefix_caching=c.enable_prefix_caching,
                          max_num_batched_tokens=c.max_num_batched_tokens,
                          max_num_seqs=c.max_num_seqs, enable_chunked_prefill=True,
                          dtype="bfloat16", seed=0, speculative_config=spec,
                          enforce_eager=True)
        self.vllm_config = vc = args.create_engine_config()
        vc.cache_config.num_gpu_blocks = c.num_blocks
        vc.scheduler_config.policy = c.policy
        if c.groups:
            groups = [KVCacheGroupSpec([f"group{i}.layer"], self._spec(g))
                      for i, g in enumerate(c.groups)]
            if any(g["spec"] == "MambaSpec" for g in c.groups):
                vc.cache_config.mamba_cache_mode = c.mamba_cache_mode
        else:
            groups = [KVCacheGroupSpec(["layer"], FullAttentionSpec(
                block_size=c.block_size, num_kv_heads=2, head_size=32, dtype=torch.bfloat16))]
        kv_config = KVCacheConfig(num_blocks=c.num_blocks, kv_cache_tensors=[],
                                  kv_cache_groups=groups)
        cls = AsyncScheduler if c.batch_queue > 1 else Scheduler
        # vLLM schedules in the least common multiple of its groups' block sizes and hashes
        # prompts in blocks of the harness's size (resolve_kv_cache_block_sizes)
        sched_block = math.lcm(*(g.kv_cache_spec.block_size for g in groups))
        self.scheduler = cls(vllm_config=vc, kv_cache_config=kv_config,
                             structured_output_manager=StructuredOutputManager(vc),
                             block_size=sched_block, hash_block_size=c.block_size,
                             log_stats=False)
        # batches in flight, newest first: (SchedulerOutput, prefill chunks)
        self._queue: collections.deque = collections.deque()
        self.block_hasher = None
        if c.enable_prefix_caching:
            hash_fn = get_hash_fn_by_name(vc.cache_config.prefix_caching_hash_algo)
            init_none_hash(hash_fn)
            self.block_hasher = get_request_block_hasher(c.block_size, hash_fn)
        if c.encoder_lookalike:
            self._mm_live: dict[str, str] = {}
            real_schedule = self.scheduler.schedule
            self.scheduler.schedule = lambda *a, **kw: self._stamp_encoder(real_schedule(*a, **kw))
        self.steps = 0
        self.overlapped = 0  # schedule() calls made while an earlier batch was in flight
        self.outputs: dict[str, list[int]] = {}  # req_id -> tokens the engine emitted
        self.model_outputs: list[tuple[list[str], list[list[int]]]] = []  # what we fed, per step

    def _spec(self, group: dict) -> Any:
        """A vLLM KV cache spec of the class the group names, at the harness's block size."""
        import torch
        from vllm.v1 import kv_cache_interface as kvi

        fields = {k: v for k, v in group.items() if k != "spec"}
        fields.setdefault("block_size", self.config.block_size)
        if group["spec"] == "MambaSpec":
            fields.setdefault("shapes", ((4, 32), (2, 16, 8)))
            fields.setdefault("dtypes", (torch.bfloat16, torch.bfloat16))
            fields.setdefault("mamba_cache_mode", self.config.mamba_cache_mode)
        else:
            fields.setdefault("num_kv_heads", 2)
            fields.setdefault("head_size", 32)
            fields.setdefault("dtype", torch.bfloat16)
        return getattr(kvi, group["spec"])(**fields)

    # -- requests ------------------------------------------------------------------------------
    def add(self, req_id: str, prompt: list[int], max_tokens: int = 8,
            choice: list[str] | None = None, priority: int = 0, cache_salt: str | None = None,
            arrival_time: float | None = None, **sampling: Any) -> Any:
        """Queue a request. `choice` makes it a structured-output request (the harness must
        have been built with structured_output=True, which loads the model's tokenizer)."""
        from vllm import SamplingParams
        from vllm.sampling_params import StructuredOutputsParams
        from vllm.v1.request import Request

        if choice is not None:
            # vLLM's input processor turns `choice` into a grammar; a regex is what it accepts raw.
            regex = "(" + "|".join(map(re.escape, choice)) + ")"
            structured = StructuredOutputsParams(regex=regex)
            structured._backend = "xgrammar"  # what vLLM's input processor would pick
            sampling["structured_outputs"] = structured
            sampling["ignore_eos"] = False
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0,
                                **{"ignore_eos": True, **sampling})
        params.update_from_generation_config({}, EOS_TOKEN_ID)
        req = Request(request_id=req_id, prompt_token_ids=list(prompt), sampling_params=params,
                      pooling_params=None, block_hasher=self.block_hasher, priority=priority,
                      cache_salt=cache_salt, arrival_time=arrival_time)
        if req.use_structured_output:
            self.scheduler.structured_output_manager.grammar_init(req)
            # Compilation runs in a thread pool; waiting here keeps scenarios deterministic.
            future = req.structured_output_request._grammar
            if hasattr(future, "result"):
                future.result(timeout=60)
        self.scheduler.add_request(req)
        self.outputs[req_id] = []
        return req

    def abort(self, *req_ids: str) -> None:
        from vllm.v1.request import RequestStatus

        self.scheduler.finish_requests(list(req_ids), RequestStatus.FINISHED_ABORTED)

    def in_flight(self, req_id: str) -> bool:
        """Whether a batch in flight (batch_queue > 1) schedules `req_id`."""
        return any(req_id in so.num_scheduled_tokens for so, _ in self._queue)

    @property
    def busy(self) -> bool:
        return (self.scheduler.get_num_unfinished_requests() > 0
                or self.scheduler.has_finished_requests() or bool(self._queue))

    # -- steps ---------------------------------------------------------------------------------
    def step(self) -> StepResult:
        """One engine step: schedule, then update with the fabricated output. With
        batch_queue > 1, as step_with_batch_queue: schedule while the queue has room (no update
        then: the result has no model output), else update the oldest batch in flight."""
        if self.config.batch_queue == 1:
            return self._update(*self._schedule())
        sched, queue = self.scheduler, self._queue
        if sched.has_requests():
            self.overlapped += bool(queue)
            queue.appendleft(self._schedule())
            so = queue[0][0]
            if len(queue) < self.config.batch_queue and (
                    so.total_num_scheduled_tokens > 0 or sched.has_requests()):
                return StepResult(so, None, {})
        elif not queue:
            return StepResult(None, None, {})
        return self._update(*queue.pop())

    def _schedule(self) -> tuple[Any, dict[str, bool]]:
        """A SchedulerOutput, and for each request it schedules that the scheduler knows
        whether it is a prefill chunk (which samples nothing), as marked when it was
        scheduled: by the time a queued batch is updated, later schedule() calls have moved
        each request on, and it may have finished or been aborted meanwhile."""
        so = self.scheduler.schedule()
        requests = self.scheduler.requests
        chunks = {rid: requests[rid].is_prefill_chunk for rid in so.num_scheduled_tokens
                  if rid in requests}
        return so, chunks

    def _update(self, so: Any, chunks: dict[str, bool]) -> StepResult:
        from vllm.v1.outputs import DraftTokenIds, ModelRunnerOutput

        sched = self.scheduler
        allowed = self._grammar_choices(so)
        req_ids, sampled = [], []
        for rid in so.num_scheduled_tokens:
            if rid not in chunks:  # unknown when scheduled (a test's patch): no worker has it
                continue
            req_ids.append(rid)
            if chunks[rid]:
                sampled.append([])
                continue
            req = sched.requests.get(rid)
            if req is None:  # finished or aborted while its batch was in flight: still run
                sampled.append([token_for(rid, -1)])
                continue
            drafts = so.scheduled_spec_decode_tokens.get(rid, [])
            # Accept a deterministic prefix of the real drafts, then one fresh token.
            accept = zlib.crc32(f"{rid}:{req.num_tokens}".encode()) % (len(drafts) + 1)
            if self.config.batch_queue > 1:  # placeholders: the worker's drafts, accepted
                toks = [token_for(rid, req.num_tokens + i) for i in range(accept)]
            else:
                toks = [t for t in drafts[:accept] if t >= 0]
            pos = req.num_tokens + len(toks)
            sampled.append(toks + [allowed.get(rid, token_for(rid, pos))])
        mro = ModelRunnerOutput(req_ids=req_ids, req_id_to_index={r: i for i, r in enumerate(req_ids)},
                                sampled_token_ids=sampled)
        if self.config.keep_model_outputs:
            self.model_outputs.append((list(req_ids), [list(t) for t in sampled]))
        outs = sched.update_from_output(so, mro)
        finished = []
        for eco in outs.values():
            for o in eco.outputs:
                self.outputs.setdefault(o.request_id, []).extend(o.new_token_ids)
                if o.finish_reason is not None:
                    finished.append(o.request_id)
        if self.config.num_spec_tokens and self.config.batch_queue == 1:
            k = self.config.num_spec_tokens
            live = [r for r in req_ids if r in sched.requests and not sched.requests[r].is_finished()]
            drafts = [[token_for(r, 10_000 + self.steps + i) for i in range(k)] for r in live]
            sched.update_draft_token_ids(DraftTokenIds(live, drafts))
        self.steps += 1
        return StepResult(so, mro, outs, finished)

    def _stamp_encoder(self, so: Any) -> Any:
        """LOOK-ALIKE: one image per new request (real MultiModalFeatureSpec objects), its
        encoder input scheduled with the request's first chunk, its hash freed in the step that
        delivers the request's finish. Everything else in `so` is the real scheduler's."""
        from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange

        for r in so.scheduled_new_reqs:
            mm_hash = f"img-{r.req_id}-{self.steps}"
            r.mm_features = [MultiModalFeatureSpec(
                data=None, modality="image", identifier=mm_hash, mm_hash=mm_hash,
                mm_position=PlaceholderRange(offset=2, length=8))]
            so.scheduled_encoder_inputs[r.req_id] = [0]
            self._mm_live[r.req_id] = mm_hash
        for rid in sorted(so.finished_req_ids):
            if rid in self._mm_live:
                so.free_encoder_mm_hashes.append(self._mm_live.pop(rid))
        return so

    def _grammar_choices(self, so: Any) -> dict[str, int]:
        """For structured-output requests, the lowest token id the real grammar allows."""
        grammar = self.scheduler.get_grammar_bitmask(so)
        if grammar is None:
            return {}
        import numpy as np

        bits = np.unpackbits(np.asarray(grammar.grammar_bitmask).view(np.uint8), axis=-1,
                             bitorder="little")
        return {rid: int(np.flatnonzero(bits[i])[0])
                for i, rid in enumerate(grammar.structured_output_request_ids)}

    def run(self, max_steps: int = 100_000, on_step=None) -> int:
        """Step until nothing is left to do (including the last zero-token step that delivers
        finished ids); returns the number of steps."""
        n = 0
        while self.busy and n < max_steps:
            result = self.step()
            if on_step is not None:
                on_step(self, result)
            n += 1
        return n
