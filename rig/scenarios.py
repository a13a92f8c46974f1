"""Named, deterministic workloads for the real Scheduler (see docs/scenarios.md).

Each scenario is a HarnessConfig plus a driver that adds, aborts and steps requests; `run()` plays
one, optionally recording it, and calls `on_schedule` with every SchedulerOutput right after
schedule() returns (before anything can mutate it).
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass, replace
from typing import Callable

from vllm_contract.rig.harness import Harness, HarnessConfig


def prompt(seed: int, n: int) -> list[int]:
    return [3 + (seed * 7919 + i * 31) % 500 for i in range(n)]


@dataclass
class Scenario:
    name: str
    doc: str
    config: HarnessConfig
    drive: Callable[[Harness], None]


def _chunked_prefill(h: Harness) -> None:
    for i in range(3):
        h.add(f"long-{i}", prompt(i, 200), max_tokens=4)
    h.run()


def _prefix_cache(h: Harness) -> None:
    shared = prompt(99, 64)
    for i in range(2):
        h.add(f"first-{i}", shared + prompt(i, 8), max_tokens=6)
    for _ in range(3):
        h.step()
    for i in range(2):
        h.add(f"second-{i}", shared + prompt(10 + i, 8), max_tokens=6)
    h.run()


def _preemption(h: Harness) -> None:
    for i in range(6):
        h.add(f"p{i}", prompt(i, 80), max_tokens=30)
    h.run()


def _aborts(h: Harness) -> None:
    for i in range(4):
        h.add(f"a{i}", prompt(i, 40), max_tokens=12)
    h.add("never-scheduled", prompt(9, 40), max_tokens=12)
    h.abort("never-scheduled")  # aborted while waiting: a phantom finished id, by design
    for _ in range(4):
        h.step()
    h.abort("a1")  # running
    h.run()


def _id_reuse(h: Harness) -> None:
    h.add("x", prompt(1, 20), max_tokens=3)
    h.add("y", prompt(2, 20), max_tokens=8)
    while "x" in h.scheduler.requests:
        h.step()
    # Reused before the step that delivers x's finish: in finished_req_ids and new at once.
    h.add("x", prompt(3, 20), max_tokens=3)
    h.run()


def _spec_decode(h: Harness) -> None:
    for i in range(4):
        h.add(f"s{i}", prompt(i, 30), max_tokens=20)
    for _ in range(5):
        h.step()
    h.add("late", prompt(7, 30), max_tokens=10)
    h.run()


def _structured_output(h: Harness) -> None:
    h.add("so-yes-no", prompt(1, 20), max_tokens=10, choice=["yes", "no"])
    h.add("so-maybe", prompt(2, 20), max_tokens=10, choice=["maybe", "never"])
    h.add("plain", prompt(3, 20), max_tokens=6)
    h.run()


def _encoder_lookalike(h: Harness) -> None:
    for i in range(3):
        h.add(f"img-req-{i}", prompt(i, 40 + 30 * i), max_tokens=5)
    h.run()


def _mixed(h: Harness, settle: bool = False) -> None:
    """`settle`: the aborted id is reused only once no batch in flight still schedules it.
    vLLM's update_from_output finds a request by its id, so an in-flight output of the aborted
    request would land on its successor (real engines never reuse an id: each carries a random
    suffix). The Llama's run happens never to have it in flight; a hybrid engine's
    block-aligned Mamba chunks do."""
    shared = prompt(42, 48)
    for i in range(8):
        h.add(f"m{i}", (shared if i % 2 else []) + prompt(i, 40 + 37 * i), max_tokens=24)
    h.add("doomed", prompt(77, 30), max_tokens=10)
    h.abort("doomed")
    for _ in range(10):
        h.step()
    h.abort("m3")
    while settle and h.in_flight("m3"):
        h.step()
    h.add("m3", prompt(3, 30), max_tokens=8)  # id reuse after an abort
    h.run()


def _mixed_hybrid(h: Harness) -> None:
    _mixed(h, settle=True)


def _long_run(h: Harness) -> None:
    n = int(os.environ.get("VLLM_CONTRACT_LONG_REQS", "1024"))
    steps = int(os.environ.get("VLLM_CONTRACT_LONG_STEPS", "10000"))
    ids = itertools.count()

    def add() -> None:  # lengths staggered so that finishes (and refills) spread out
        i = next(ids)
        h.add(f"L{i}", prompt(i, 8), max_tokens=100 + (i * 37) % 300)

    for _ in range(n):
        add()
    for _ in range(steps):
        for _ in h.step().finished:
            add()


# KV cache groups of the hybrid scenarios (HarnessConfig.groups): vLLM's spec classes
SLIDING_FULL = ({"spec": "SlidingWindowSpec", "sliding_window": 32}, {"spec": "FullAttentionSpec"})
# the Mamba spec as vLLM 0.32 makes it with prefix caching (a prefill checkpoint block, so
# that a prompt's state at a block boundary is cached and hit)
MAMBA_FULL = ({"spec": "MambaSpec", "num_prefill_checkpoint_blocks": 1,
               "prefill_checkpoint_alignment": 1}, {"spec": "FullAttentionSpec"})
# without prefix caching one Mamba block holds a request's whole state: vLLM sizes it to
# max_model_len
MAMBA_NONE_FULL = ({"spec": "MambaSpec", "block_size": 512}, {"spec": "FullAttentionSpec"})

SCENARIOS = {s.name: s for s in [
    Scenario("chunked_prefill", "Prompts longer than the token budget, prefilled in chunks.",
             HarnessConfig(max_num_batched_tokens=64), _chunked_prefill),
    Scenario("prefix_cache", "Requests sharing a 64-token prefix; the later ones hit the cache.",
             HarnessConfig(), _prefix_cache),
    Scenario("preemption", "KV cache of 12 blocks for six growing requests: preempt and resume.",
             HarnessConfig(num_blocks=12, max_num_batched_tokens=64), _preemption),
    Scenario("aborts", "Abort a waiting (never scheduled) and a running request.",
             HarnessConfig(), _aborts),
    Scenario("id_reuse", "Reuse a request id in the step its first request's finish is delivered.",
             HarnessConfig(), _id_reuse),
    Scenario("spec_decode", "Two fabricated draft tokens per step through update_draft_token_ids, "
             "partly accepted.", HarnessConfig(num_spec_tokens=2), _spec_decode),
    Scenario("structured_output", "Two requests constrained by a real xgrammar grammar (the tiny "
             "tokenizer), one plain; tokens chosen from the real bitmask.",
             HarnessConfig(structured_output=True), _structured_output),
    Scenario("encoder_lookalike", "LOOK-ALIKE: real steps with fabricated image encoder inputs "
             "and freed mm hashes stamped on (the CPU build cannot schedule a multimodal model "
             "here).", HarnessConfig(encoder_lookalike=True, max_num_batched_tokens=64),
             _encoder_lookalike),
    Scenario("mixed", "Chunked prefill, prefix hits, preemption, aborts and id reuse together.",
             HarnessConfig(num_blocks=26, max_num_batched_tokens=96), _mixed),
    Scenario("hybrid_sliding", "The mixed workload on a hybrid engine: a sliding-window group "
             "(window 32) beside a full-attention group, vLLM's own managers for each.",
             HarnessConfig(num_blocks=40, max_num_batched_tokens=96, groups=SLIDING_FULL),
             _mixed_hybrid),
    Scenario("hybrid_mamba", "The mixed workload on a Mamba hybrid: a Mamba group (\"align\" "
             "cache mode, as with prefix caching) beside a full-attention group.",
             HarnessConfig(num_blocks=40, max_num_batched_tokens=96, groups=MAMBA_FULL),
             _mixed_hybrid),
    Scenario("hybrid_mamba_plain", "The mixed workload on a Mamba hybrid without prefix "
             "caching: the Mamba group keeps one state block per request (\"none\" mode).",
             HarnessConfig(num_blocks=40, max_num_batched_tokens=96, enable_prefix_caching=False,
                           groups=MAMBA_NONE_FULL, mamba_cache_mode="none"), _mixed_hybrid),
    Scenario("long_run", "1024 running decode requests for 10k steps, each finished request "
             "replaced (VLLM_CONTRACT_LONG_REQS / _STEPS to size it).",
             HarnessConfig(num_blocks=32768, max_num_batched_tokens=8192, max_num_seqs=1024,
                           enable_prefix_caching=False), _long_run),
]}


def run(name: str, model_dir: str, trace_dir: str | None = None,
        on_schedule: Callable | None = None, batch_queue: int = 1, **writer_options) -> Harness:
    """Play scenario `name`; batch_queue=2 plays it with two batches in flight (the real
    AsyncScheduler, as on vLLM's async-scheduling step path)."""
    from vllm_contract.recorder import attach

    s = SCENARIOS[name]
    h = Harness(model_dir, replace(s.config, batch_queue=batch_queue))
    if on_schedule is not None:
        original = h.scheduler.schedule

        def schedule(*a, **kw):
            out = original(*a, **kw)
            on_schedule(out)
            return out

        h.scheduler.schedule = schedule
    if trace_dir is None:
        s.drive(h)
        return h
    with attach(h.scheduler, trace_dir, **writer_options):
        s.drive(h)
    return h
