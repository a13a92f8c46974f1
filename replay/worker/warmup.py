"""Prefix-cache hits on blocks the replay never computed, and the prefill that fills them first.

A request may be introduced with `num_computed_tokens > 0`: the scheduler found its prefix in
KV blocks computed earlier. When those blocks were computed before the recording began (an
engine attached to while it ran, a recording begun on an engine that served earlier traffic)
or before the replay's `--from`, the fresh worker's blocks hold something else, and every
token the request samples is computed from the wrong context. The trace holds the request's
whole prompt, so the prefix can be computed into the blocks it was given before the step that
introduces it: a warm-up request with the same prompt and block table, prefilled (greedy, in
chunks within the engine's token budget) up to the hit length and then freed. The request is
then compared as usual. Where that is impossible (no prompt tokens, multimodal inputs, a
resumed request whose hit blocks were never computed) the request is named not comparable.

The ledger follows which blocks the replay has written, by the same rules the worker applies
to its block tables: a new request's `block_ids`, a cached request's `new_block_ids` appended
(or, resumed, replacing its table), and each scheduled token written at its position.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterator

WARM_SUFFIX = "#warmup"


class Ledger:
    """Blocks written since the worker was fresh, and the block tables that write them."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.written: set[tuple[int, int]] = set()  # (kv cache group, block id)
        self.tables: dict[str, list[list[int]]] = {}

    def missing(self, block_ids: Any, computed: int) -> list[tuple[int, int]]:
        """The blocks a hit of `computed` tokens reads that the replay never wrote. Block 0 is
        vLLM's null block (BlockPool takes it off the free queue first and never hands it out):
        the placeholder a sliding-window or Mamba group's table carries where the window has
        left a block behind, read by nobody, so never missing."""
        n = computed // self.block_size
        return [(g, b) for g, ids in enumerate(block_ids or ()) for b in list(ids)[:n]
                if b != 0 and (g, b) not in self.written]

    def _write(self, rid: str, start: int, count: int) -> None:
        table = self.tables.get(rid)
        if not table or count <= 0:
            return
        first, last = start // self.block_size, (start + count - 1) // self.block_size
        for g, ids in enumerate(table):
            for b in ids[first:last + 1]:
                self.written.add((g, b))

    def apply(self, so: Any) -> None:
        """What the worker does with this step's tables and tokens."""
        for rid in so.finished_req_ids or ():
            self.tables.pop(rid, None)
        sched = so.num_scheduled_tokens or {}
        for r in so.scheduled_new_reqs:
            self.tables[r.req_id] = [list(ids) for ids in r.block_ids or ()]
            self._write(r.req_id, int(r.num_computed_tokens), int(sched.get(r.req_id, 0)))
        c = so.scheduled_cached_reqs
        resumed = set(getattr(c, "resumed_req_ids", None) or ())
        for i, rid in enumerate(c.req_ids):
            new = c.new_block_ids[i] if i < len(c.new_block_ids) else None
            if rid in resumed:
                self.tables[rid] = [list(ids) for ids in new or ()]
            elif new is not None:
                table = self.tables.setdefault(rid, [[] for _ in new])
                for g, ids in enumerate(new):
                    if g < len(table):
                        table[g].extend(ids)
            self._write(rid, int(c.num_computed_tokens[i]), int(sched.get(rid, 0)))


def why_not(r: Any) -> str | None:
    """Why a new request's prefix cannot be warmed up, or None."""
    prompt = r.prompt_token_ids
    if prompt is None:
        return "its prompt tokens are not in the trace"
    if getattr(r, "mm_features", None):
        return "it has multimodal inputs, which a warm-up does not encode"
    if getattr(r, "prompt_embeds", None) is not None:
        return "it was given prompt embeddings, not tokens"
    if int(r.num_computed_tokens) > len(prompt):
        return "its prefix-cache hit is longer than its prompt"
    return None


def warmup_steps(r: Any, budget: int, greedy: Any) -> Iterator[Any]:
    """SchedulerOutputs that prefill `r`'s first num_computed_tokens tokens into its hit blocks
    under a warm-up request id, then free that id. `greedy`: SamplingParams for the warm-up
    (its sampled tokens are discarded: the prefill stays partial)."""
    from vllm.v1.core.sched.output import CachedRequestData, SchedulerOutput

    wid = r.req_id + WARM_SUFFIX
    total = int(r.num_computed_tokens)
    done = 0
    while done < total:
        k = min(budget, total - done)
        so = SchedulerOutput.make_empty()
        if done == 0:
            so.scheduled_new_reqs = [dataclasses.replace(
                r, req_id=wid, sampling_params=greedy, num_computed_tokens=0)]
        else:
            # the fields this chunk needs on an otherwise empty object, whatever else the
            # installed vLLM's class carries
            c = CachedRequestData.make_empty()
            c.req_ids, c.new_token_ids = [wid], [[]]
            c.new_block_ids, c.num_computed_tokens, c.num_output_tokens = [None], [done], [0]
            so.scheduled_cached_reqs = c
        so.num_scheduled_tokens = {wid: k}
        so.total_num_scheduled_tokens = k
        yield so
        done += k
    end = SchedulerOutput.make_empty()
    end.finished_req_ids = {wid}
    yield end
