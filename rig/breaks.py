"""Named scheduler bugs, injected into the real Scheduler's output right after schedule()
returns (before a recorder sees it): the trace is a real recording of a broken contract.
Used for samples/broken-* and the demo of `vllm-contract check`."""

from __future__ import annotations

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
                return
            if "__done__" not in held:
                held[r.req_id] = r.block_ids[0][-1]

    return mutate


def forget_new_request() -> Callable:
    """A request scheduled for the first time is left out of scheduled_new_reqs: the worker
    never learns it, and its next cached entry is a KeyError."""
    done = []

    def mutate(so, step):
        if so.scheduled_new_reqs and not done:
            done.append(so.scheduled_new_reqs.pop().req_id)

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
