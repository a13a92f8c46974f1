"""Named scheduler bugs, injected into the real Scheduler's output right after schedule()
returns (before a recorder sees it): the trace is a real recording of a broken contract.
Used for samples/broken-* and the demo of `vllm-contract check`."""

from __future__ import annotations

import dataclasses
from typing import Callable


def drop_finished_once() -> Callable:
    """finished_req_ids of one step lost (an early return in the scheduler): the worker never
    frees that request."""
    done = []

    def mutate(so, step):
        if so.finished_req_ids and not done:
            rid = sorted(so.finished_req_ids)[0]
            so.finished_req_ids.discard(rid)
            done.append((step, rid))
            return step, rid
        return None

    return mutate


def hand_out_held_block() -> Callable:
    """A new request is given a block another live request still holds."""
    held: dict[str, int] = {}

    def mutate(so, step):
        for r in so.scheduled_new_reqs:
            if held and r.num_computed_tokens == 0:
                r.block_ids[0][-1] = next(iter(held.values()))
                held.clear()
                held["__done__"] = -1
                return step, r.req_id
            if "__done__" not in held:
                held[r.req_id] = r.block_ids[0][-1]
        return None

    return mutate


def forget_new_request() -> Callable:
    """A request scheduled for the first time is left out of scheduled_new_reqs: the worker
    never learns it, and its next cached entry is a KeyError."""
    done = []

    def mutate(so, step):
        if so.scheduled_new_reqs and not done:
            done.append(so.scheduled_new_reqs.pop().req_id)
            return step, done[0]
        return None

    return mutate


def free_encoder_between_chunks() -> Callable:
    """LOOK-ALIKE inputs (encoder_lookalike: the CPU build cannot schedule a multimodal model
    here): a new request whose prefill is chunked gets its image's placeholder moved across the
    first chunk's end, and the image's encoder output is freed in the step of its next chunk,
    which still reads it (vLLM's chunked-prefill encoder-cache bugs). Returns (step, req_id) of
    that chunk."""
    pending: dict[str, str] = {}  # req_id -> identifier freed with its next chunk
    done = []

    def mutate(so, step):
        for rid, identifier in list(pending.items()):
            if rid in so.num_scheduled_tokens:
                so.free_encoder_mm_hashes.append(identifier)
                del pending[rid]
                done.append(rid)
                return step, rid
        if done or pending:
            return None
        for r in so.scheduled_new_reqs:
            end = r.num_computed_tokens + so.num_scheduled_tokens.get(r.req_id, 0)
            if r.mm_features and 8 <= end < len(r.prompt_token_ids):
                feature = r.mm_features[0]  # tokens end-4 .. end+3
                feature.mm_position = dataclasses.replace(feature.mm_position, offset=end - 4)
                pending[r.req_id] = r.mm_features[0].identifier
                return None
        return None

    return mutate


def resume_as_cached() -> Callable:
    """A request coming back after its preemption is left out of resumed_req_ids: the worker
    appends its whole new table to the stale one it kept, whose blocks were freed at the
    preemption. Returns (step, req_id)."""
    done = []

    def mutate(so, step):
        resumed = so.scheduled_cached_reqs.resumed_req_ids
        if resumed and not done:
            rid = sorted(resumed)[0]
            resumed.discard(rid)
            done.append(rid)
            return step, rid
        return None

    return mutate


def resume_without_table() -> Callable:
    """A request coming back after its preemption is listed in resumed_req_ids but sent no
    block table (new_block_ids None): the worker has nothing to replace the stale table with
    (an assertion in _update_states). Returns (step, req_id)."""
    done = []

    def mutate(so, step):
        cached = so.scheduled_cached_reqs
        if cached.resumed_req_ids and not done:
            rid = sorted(cached.resumed_req_ids)[0]
            cached.new_block_ids[cached.req_ids.index(rid)] = None
            done.append(rid)
            return step, rid
        return None

    return mutate


def lose_a_step(stall: int = 40) -> Callable:
    """A decode step the scheduler has already counted never reaches the worker (its requests
    are taken out of the SchedulerOutput after schedule() advanced them): the real scheduler
    then waits for tokens that never come, and every later step schedules nothing while those
    requests stay running (the deadlock of public vLLM hang reports). After `stall` such steps
    the lost step's requests are sent after all, standing in for whatever ends a hang, so that
    the run finishes. Returns (step, None) for the step lost."""
    from vllm.v1.core.sched.output import CachedRequestData

    lost: dict = {}

    def mutate(so, step):
        if not lost:
            cached = so.scheduled_cached_reqs
            if (step >= 5 and cached.req_ids and not so.scheduled_new_reqs
                    and not cached.resumed_req_ids and not so.scheduled_spec_decode_tokens):
                lost.update(step=step, cached=cached, tokens=so.num_scheduled_tokens,
                            total=so.total_num_scheduled_tokens)
                so.scheduled_cached_reqs = CachedRequestData.make_empty()
                so.num_scheduled_tokens = {}
                so.total_num_scheduled_tokens = 0
                return step, None
        elif "sent" not in lost and step == lost["step"] + stall:
            assert so.total_num_scheduled_tokens == 0, "the scheduler was not stuck"
            so.scheduled_cached_reqs = lost["cached"]
            so.num_scheduled_tokens = lost["tokens"]
            so.total_num_scheduled_tokens = lost["total"]
            lost["sent"] = step
        return None

    return mutate

# --- worker reads: encoder inputs and frees (docs/worker-reads.md) ---

def free_encoder_twice(after: int = 2) -> Callable:
    """LOOK-ALIKE inputs (encoder_lookalike): the first encoder hash the scheduler frees is
    freed again `after` steps later, with nothing bringing it back into the cache in between
    (an encoder-cache manager that keeps an evicted entry on its freed list). The worker's
    pop misses silently. Returns (step, None) of the second free."""
    first: dict = {}

    def mutate(so, step):
        if not first and so.free_encoder_mm_hashes:
            first.update(step=step, mm_hash=so.free_encoder_mm_hashes[0])
        elif first and step == first["step"] + after:
            so.free_encoder_mm_hashes.append(first["mm_hash"])
            return step, None
        return None

    return mutate


def encoder_input_past_features() -> Callable:
    """LOOK-ALIKE inputs (encoder_lookalike): the first new request with an image is also
    scheduled encoder input len(mm_features), one past its features (an index kept from another
    request, or counted before a feature was dropped): an IndexError in the worker. Returns
    (step, req_id)."""
    done = []

    def mutate(so, step):
        for r in so.scheduled_new_reqs:
            if r.mm_features and not done:
                so.scheduled_encoder_inputs.setdefault(r.req_id, []).append(len(r.mm_features))
                done.append(r.req_id)
                return step, r.req_id
        return None

    return mutate


def encoder_input_stripped() -> Callable:
    """LOOK-ALIKE inputs (on prefix_cache: its prefix hits are real, its image is stamped
    here): the first new request whose num_computed_tokens is a prefix hit past token 10 gets
    an image on tokens 2..9, sent as NewRequestData.from_request sends a covered feature (data
    None, strip_covered_mm_data), and that image is scheduled for encoding anyway, as a
    scheduler that ignores num_computed_tokens in _try_schedule_encoder_inputs would. The
    worker skips it and caches nothing. Returns (step, req_id)."""
    from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange

    done = []

    def mutate(so, step):
        for r in so.scheduled_new_reqs:
            if r.num_computed_tokens >= 10 and not done:
                mm_hash = f"img-{r.req_id}-stripped"
                r.mm_features = [MultiModalFeatureSpec(
                    data=None, modality="image", identifier=mm_hash, mm_hash=mm_hash,
                    mm_position=PlaceholderRange(offset=2, length=8))]
                so.scheduled_encoder_inputs[r.req_id] = [0]
                done.append(r.req_id)
                return step, r.req_id
        return None

    return mutate


# --- worker reads: encoder reads of drafts (docs/worker-reads.md) ---

def free_by_optimistic_count() -> Callable:
    """LOOK-ALIKE inputs and drafter, on spec_decode with batch_queue=2 (the real
    AsyncScheduler, its ngram drafts sent as -1 placeholders; the CPU build has no drafter that
    takes multimodal embeddings, so the test marks the recording's drafter as eagle). The first
    request prefilled whole gets a one-token image at each position from its prompt's end on,
    all encoded with its prefill: no real input lies there, but the drafter's window behind
    the target's never reaches the prompt. Each image is freed once its placeholder ends at or
    below the num_computed_tokens sent, which under async scheduling still counts the previous
    step's drafts as accepted (a scheduler that frees by that count, instead of the confirmed
    count less the drafter's look-ahead as _free_encoder_inputs does). After a step whose
    output rejected 2 drafts, the next step frees an image that its drafter reads (behind
    the target's window, from the worker's corrected count). Returns (step, req_id) of the
    first such step, found a step late (the rejections reach the scheduler's count only
    then), and frees no more until the request's finish delivers the rest."""
    from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange

    st: dict = {"rid": None, "done": False}
    ends: dict[str, int] = {}  # identifier -> placeholder end, for the images not freed yet
    rows: dict[int, tuple[int, int, int]] = {}  # step -> (num_computed, scheduled, drafts)
    freed: dict[int, list[int]] = {}  # step -> ends of the images freed in it

    def introduce(so):
        for r in so.scheduled_new_reqs:
            p = len(r.prompt_token_ids)
            if r.num_computed_tokens == 0 and so.num_scheduled_tokens.get(r.req_id) == p:
                st["rid"] = r.req_id
                r.mm_features = []
                for j in range(r.sampling_params.max_tokens + 8):
                    h = f"past-prompt-{r.req_id}-{p + j}"
                    r.mm_features.append(MultiModalFeatureSpec(
                        data=None, modality="image", identifier=h, mm_hash=h,
                        mm_position=PlaceholderRange(offset=p + j, length=1)))
                    ends[h] = p + j + 1
                so.scheduled_encoder_inputs[r.req_id] = list(range(len(r.mm_features)))
                return

    def mutate(so, step):
        rid = st["rid"]
        if rid is None:
            introduce(so)
            return None
        if rid in so.finished_req_ids:
            so.free_encoder_mm_hashes.extend(sorted(ends, key=ends.get))
            ends.clear()
            return None
        cached = so.scheduled_cached_reqs
        if st["done"] or rid not in cached.req_ids or rid in cached.resumed_req_ids:
            return None
        nc = cached.num_computed_tokens[cached.req_ids.index(rid)]
        rows[step] = (nc, so.num_scheduled_tokens[rid],
                      len(so.scheduled_spec_decode_tokens.get(rid, ())))
        prev, before = rows.get(step - 1), rows.get(step - 2)
        if prev and before and before[2]:
            # step - 2's rejected drafts, taken off the scheduler's count after step - 1
            rejected = prev[0] + prev[1] - nc
            start = prev[0] - rejected + 1  # the drafter's window in step - 1
            if 2 <= rejected <= before[2] and any(
                    start < e <= prev[0] and e - 1 < start - 1 + prev[1]
                    for e in freed.get(step - 1, ())):
                st["done"] = True
                return step - 1, rid
        gone = sorted((h for h, e in ends.items() if e <= nc), key=ends.get)
        so.free_encoder_mm_hashes.extend(gone)
        freed[step] = [ends.pop(h) for h in gone]
        return None

    return mutate


# --- worker reads: tokens and outputs (docs/worker-reads.md) ---

def drop_all_token_ids() -> Callable:
    """The first resumed request with outputs is sent without its all_token_ids (a scheduler
    that fills the dict from its own notion of which ids left the batch and forgets that a
    preemption takes one out): under async scheduling the worker's all_token_ids[req_id]
    raises KeyError. Returns (step, req_id)."""
    done = []

    def mutate(so, step):
        cached = so.scheduled_cached_reqs
        for rid in sorted(cached.resumed_req_ids):
            if (not done and rid in cached.all_token_ids
                    and cached.num_output_tokens[cached.req_ids.index(rid)] > 0):
                del cached.all_token_ids[rid]
                done.append(rid)
                return step, rid
        return None

    return mutate


def stale_all_token_ids() -> Callable:
    """The first resumed request with outputs is sent its token ids as they were before its
    last sampled token (a copy taken before the update that appended it): long enough, but
    under async scheduling the worker takes its last num_output_tokens entries as the outputs,
    one of them a prompt token. Returns (step, req_id)."""
    done = []

    def mutate(so, step):
        cached = so.scheduled_cached_reqs
        for rid in sorted(cached.resumed_req_ids):
            if (not done and rid in cached.all_token_ids
                    and cached.num_output_tokens[cached.req_ids.index(rid)] > 0):
                cached.all_token_ids[rid] = cached.all_token_ids[rid][:-1]
                done.append(rid)
                return step, rid
        return None

    return mutate


def undercount_outputs() -> Callable:
    """The first decoding request past its second output is sent num_output_tokens one short
    (a count taken before the last update): the worker reads a smaller count as discarded
    outputs and truncates the tokens it holds. Returns (step, req_id)."""
    done = []

    def mutate(so, step):
        cached = so.scheduled_cached_reqs
        for i, rid in enumerate(cached.req_ids):
            if (not done and rid not in cached.resumed_req_ids
                    and cached.num_output_tokens[i] >= 2):
                cached.num_output_tokens[i] -= 1
                done.append(rid)
                return step, rid
        return None

    return mutate


# --- worker reads: blocks (docs/worker-reads.md) ---

def _follow_tables(so, tables: dict) -> None:
    """Each request's block table (KV cache group 0) as the worker builds it from this
    SchedulerOutput: a new or resumed request's blocks are the whole table, a running one's are
    appended, a preempted one's are gone."""
    for r in so.scheduled_new_reqs:
        tables[r.req_id] = list(r.block_ids[0])
    cached = so.scheduled_cached_reqs
    for rid, nb in zip(cached.req_ids, cached.new_block_ids):
        if rid in cached.resumed_req_ids:
            tables[rid] = list(nb[0]) if nb else []
        elif nb:
            tables.setdefault(rid, []).extend(nb[0])
    for rid in getattr(so, "preempted_req_ids", None) or ():
        tables.pop(rid, None)


def zero_held_block(after: int = 3) -> Callable:
    """From step `after` on, the first running request given no new block in a step has the
    last block of its table (a block it filled in an earlier step) added to
    new_block_ids_to_zero: the worker wipes that KV before the forward pass. The CPU build's
    cache needs no zeroing, so the real scheduler sends None there; the break makes the list.
    Returns (step, req_id)."""
    tables: dict[str, list[int]] = {}
    done = []

    def mutate(so, step):
        hit = None
        if not done and step >= after:
            cached = so.scheduled_cached_reqs
            for rid, nb in zip(cached.req_ids, cached.new_block_ids):
                if not (nb and nb[0]) and rid not in cached.resumed_req_ids and tables.get(rid):
                    so.new_block_ids_to_zero = ((so.new_block_ids_to_zero or [])
                                                + [tables[rid][-1]])
                    done.append(rid)
                    hit = step, rid
                    break
        _follow_tables(so, tables)
        return hit

    return mutate


def zero_past_cache(num_blocks: int, at: int = 2) -> Callable:
    """At step `at`, new_block_ids_to_zero names block `num_blocks`, one past the KV cache's
    last. Returns (step, None)."""

    def mutate(so, step):
        if step == at:
            so.new_block_ids_to_zero = (so.new_block_ids_to_zero or []) + [num_blocks]
            return step, None
        return None

    return mutate


def repeat_new_blocks() -> Callable:
    """The first running request given new blocks is given each of them twice
    (`nb[0].extend(nb[0])`): its table's last entries map two ranges of positions to the same
    slots. Returns (step, req_id)."""
    done = []

    def mutate(so, step):
        cached = so.scheduled_cached_reqs
        for rid, nb in zip(cached.req_ids, cached.new_block_ids):
            if not done and nb and nb[0] and rid not in cached.resumed_req_ids:
                nb[0].extend(list(nb[0]))
                done.append(rid)
                return step, rid
        return None

    return mutate


def grow_table_past_width(num_blocks: int, width: int) -> Callable:
    """The first running request given new blocks is given enough more to make its table
    `width` + 1 blocks long (width: cdiv(max_model_len, block_size), the worker's row), from
    the cache's last ids, which the scheduler of a small scenario never reaches and no table
    holds. Returns (step, req_id)."""
    tables: dict[str, list[int]] = {}
    done = []

    def mutate(so, step):
        hit = None
        cached = so.scheduled_cached_reqs
        for rid, nb in zip(cached.req_ids, cached.new_block_ids):
            if not done and nb and nb[0] and rid not in cached.resumed_req_ids and rid in tables:
                held = {b for t in tables.values() for b in t}
                spare = [b for b in range(num_blocks - 1, 0, -1) if b not in held]
                more = width + 1 - len(tables[rid]) - len(nb[0])
                nb[0].extend(spare[:more])
                done.append(rid)
                hit = step, rid
                break
        _follow_tables(so, tables)
        return hit

    return mutate


# --- worker reads: drafts, structured output, pipeline (docs/worker-reads.md) ---

def draft_without_drafter(token: int = 7) -> Callable:
    """On an engine without a drafter, the first plain decode row from step 3 on gets a draft,
    its token count and the step's total grown by one to keep them consistent: the worker
    writes the draft as an input and samples after it, with no rejection. The scheduler's own
    count was advanced before the break, so computed.progress also reports the next step
    (a scheduler that drafted before its bookkeeping would leave it quiet). Returns
    (step, req_id)."""
    done = []

    def mutate(so, step):
        cached = so.scheduled_cached_reqs
        if done or step < 3:
            return None
        for rid in cached.req_ids:
            if (rid not in cached.resumed_req_ids and so.num_scheduled_tokens.get(rid) == 1
                    and rid not in so.scheduled_spec_decode_tokens):
                so.scheduled_spec_decode_tokens[rid] = [token]
                so.num_scheduled_tokens[rid] += 1
                so.total_num_scheduled_tokens += 1
                done.append(rid)
                return step, rid
        return None

    return mutate


def unflag_structured_output() -> Callable:
    """The first step in which the scheduler set has_structured_output_requests (a
    structured-output request samples) has it cleared: an async worker with a drafter keeps
    that step's drafts on the GPU. Returns (step, None)."""
    done = []

    def mutate(so, step):
        if so.has_structured_output_requests and not done:
            so.has_structured_output_requests = False
            done.append(step)
            return step, None
        return None

    return mutate


def drop_pipeline_token_list() -> Callable:
    """LOOK-ALIKE (the CPU build runs one stage): on a recording where the real scheduler fills
    new_token_ids as for pipeline parallelism without async scheduling (its use_pp set, the
    config's pipeline_parallel_size 2), the first step with two or more cached requests loses
    its last list: the worker's new_token_ids[i] is an IndexError on the stages before the
    last. Returns (step, None)."""
    done = []

    def mutate(so, step):
        lists = so.scheduled_cached_reqs.new_token_ids
        if len(lists) >= 2 and not done:
            lists.pop()
            done.append(step)
            return step, None
        return None

    return mutate


# --- hybrid engines: several KV cache groups (rig's hybrid_* scenarios) ---

def _group_tables(so, tables: dict, g: int) -> None:
    """_follow_tables for KV cache group `g`."""
    for r in so.scheduled_new_reqs:
        tables[r.req_id] = list(r.block_ids[g])
    cached = so.scheduled_cached_reqs
    for rid, nb in zip(cached.req_ids, cached.new_block_ids):
        if rid in cached.resumed_req_ids:
            tables[rid] = list(nb[g]) if nb else []
        elif nb:
            tables.setdefault(rid, []).extend(nb[g])
    for rid in set(getattr(so, "preempted_req_ids", None) or ()) | set(so.finished_req_ids):
        tables.pop(rid, None)


def _newest_block_to_new_request(group: int) -> Callable:
    """The first new request without a prefix hit, admitted while another request runs, is
    given, as its last block of group `group`, the newest real block of that running request's
    table there. Returns (step, req_id)."""
    tables: dict[str, list[int]] = {}
    done = []

    def mutate(so, step):
        hit = None
        running = [rid for rid in so.scheduled_cached_reqs.req_ids
                   if rid not in so.scheduled_cached_reqs.resumed_req_ids
                   and any(tables.get(rid, ()))]
        for r in so.scheduled_new_reqs:
            if not done and running and r.num_computed_tokens == 0 and r.block_ids[group]:
                r.block_ids[group][-1] = [b for b in tables[running[0]] if b][-1]
                done.append(r.req_id)
                hit = step, r.req_id
                break
        _group_tables(so, tables, group)
        return hit

    return mutate


def hand_out_window_block(group: int = 0) -> Callable:
    """On a sliding-window group (hybrid_sliding): a running request's newest window block,
    which its window still covers, handed to a new request (a window block freed too early
    and handed on: vllm's SWA-freeing bugs). Returns (step, req_id)."""
    return _newest_block_to_new_request(group)


def share_mamba_state(group: int = 0) -> Callable:
    """On a Mamba group (hybrid_mamba): a running request's current state block given to a
    new request as its own state block: two requests' recurrent states in one block
    (vllm#53142's kind of state-block mixup). Returns (step, req_id)."""
    return _newest_block_to_new_request(group)


def null_block_in_table(group: int = 0) -> Callable:
    """The first running request given new blocks in group `group` gets the null block (0)
    in place of the last of them: on a sliding-window group its newest tokens' KV, on a Mamba
    group the state its step writes, go to the placeholder every table shares. Returns
    (step, req_id)."""
    done = []

    def mutate(so, step):
        cached = so.scheduled_cached_reqs
        for rid, nb in zip(cached.req_ids, cached.new_block_ids):
            if not done and nb and nb[group] and nb[group][-1] and rid not in cached.resumed_req_ids:
                nb[group][-1] = 0
                done.append(rid)
                return step, rid
        return None

    return mutate


def drop_mamba_hit(group: int = 0) -> Callable:
    """The first new request with a prefix hit keeps its num_computed_tokens but loses the hit
    in its Mamba group: the hit state block becomes the null block (vllm#43090: a scalar
    computed count while the Mamba group missed the hit). Returns (step, req_id)."""
    done = []

    def mutate(so, step):
        for r in so.scheduled_new_reqs:
            ids = r.block_ids[group]
            if not done and r.num_computed_tokens > 0 and ids and any(ids[:-1]):
                # in "align" mode the table's first real block is the hit's state (nulls pad
                # it before, the new state and a prefill checkpoint come after)
                ids[min(i for i, b in enumerate(ids) if b)] = 0
                done.append(r.req_id)
                return step, r.req_id
        return None

    return mutate


BREAKS = {
    "broken-leak": ("preemption", drop_finished_once,
                    "finished.leaked: one step's finished_req_ids dropped"),
    "broken-held-block": ("aborts", hand_out_held_block,
                          "blocks.double_owner: a new request given a block still held"),
    "broken-unknown-cached": ("aborts", forget_new_request,
                              "tokens.unlisted_request + lifecycle.unknown_cached: a request "
                              "never sent as new"),
}
