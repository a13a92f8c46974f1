"""Generated workloads for the real Scheduler: a harness configuration and a list of operations
(add, abort, step), played deterministically and recorded. The clean-run property test
(tests/query/test_fuzz_clean.py) generates them with hypothesis; a failure shrinks to a small
Workload, which is plain data and is kept as a named regression case.

Operations, as tuples (plain data, so that a case prints and pastes back as it is):
  ("add", name, prompt_seed, prompt_len, shared_len, max_tokens, priority, n)
      n > 1 adds n requests "<k>_<name>" sharing one prompt, as vLLM's parallel sampling does;
      shared_len tokens of one common prefix come first (prefix caching hits)
  ("abort", name)   abort every request of that name, whatever its state (or none)
  ("step", k)       k engine steps
An add whose id the scheduler still holds is dropped (vLLM refuses a live id); with batches in
flight an id is reused only once no batch in flight schedules it (real engines suffix each id, so
a worker's late output can never land on a successor; the fabricated model cannot tell them apart).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vllm_contract.rig.harness import Harness, HarnessConfig
from vllm_contract.rig.scenarios import MAMBA_FULL, SLIDING_FULL, prompt

SHARED = prompt(4242, 512)  # the common prefix of every request that shares one
GROUPS = {"full": (), "sliding": SLIDING_FULL, "mamba": MAMBA_FULL}


@dataclass(frozen=True)
class Workload:
    ops: tuple = ()
    num_blocks: int = 64
    block_size: int = 16
    max_num_batched_tokens: int = 128
    max_num_seqs: int = 16
    max_model_len: int = 256
    enable_prefix_caching: bool = True
    num_spec_tokens: int = 0
    batch_queue: int = 1
    policy: str = "fcfs"
    groups: str = "full"  # a key of GROUPS
    settings: dict = field(default_factory=dict, compare=False, hash=False)

    def config(self) -> HarnessConfig:
        return HarnessConfig(
            num_blocks=self.num_blocks, block_size=self.block_size,
            max_num_batched_tokens=self.max_num_batched_tokens, max_num_seqs=self.max_num_seqs,
            max_model_len=self.max_model_len, enable_prefix_caching=self.enable_prefix_caching,
            num_spec_tokens=self.num_spec_tokens, batch_queue=self.batch_queue,
            policy=self.policy, groups=GROUPS[self.groups])


def ids_of(h: Harness, name: str) -> list[str]:
    """The scheduler's ids a name stands for: itself, or its parallel-sampling children."""
    return [r for r in h.scheduler.requests if r == name or r.endswith("_" + name)] or [name]


def prompt_tokens(op: tuple, max_model_len: int) -> list[int]:
    """The prompt of an add: shared_len tokens of SHARED, then the request's own."""
    _, _, seed, plen, shared, *_ = op
    shared = min(shared, plen)
    tokens = SHARED[:shared] + prompt(seed, plen - shared)
    # vLLM's input processor refuses a prompt of max_model_len tokens or more
    return tokens[:max_model_len - 1]


def _add(h: Harness, w: Workload, op: tuple) -> None:
    _, name, seed, plen, shared, max_tokens, priority, n = op
    ids = [name] if n == 1 else [f"{k}_{name}" for k in range(n)]
    if any(r in h.scheduler.requests for r in ids):
        return
    while any(h.in_flight(r) for r in ids):
        h.step()
    tokens = prompt_tokens(op, w.max_model_len)
    for r in ids:
        h.add(r, tokens, max_tokens=max_tokens, priority=priority)


def play(w: Workload, model_dir: str, trace_dir: str | None = None,
         max_steps: int = 5000) -> Harness:
    """Play `w` on the real scheduler (recorded into trace_dir if given), then run it dry."""
    from vllm_contract.recorder import attach

    h = Harness(model_dir, w.config())

    def drive() -> None:
        for op in w.ops:
            if op[0] == "add":
                _add(h, w, op)
            elif op[0] == "abort":
                h.abort(*ids_of(h, op[1]))
            else:
                for _ in range(op[1]):
                    h.step()
        h.run(max_steps=max_steps)

    if trace_dir is None:
        drive()
    else:
        with attach(h.scheduler, trace_dir):
            drive()
    if h.busy:
        raise RuntimeError(f"the workload did not drain in {max_steps} steps: {w}")
    return h
