"""The scheduler-side breaks of breaks.py written as vLLM Scheduler subclasses: a module of
vLLM-only source (the break's function, any helper of breaks.py it calls, and a subclass
applying it after every schedule()), so that the class is importable by name
(`--scheduler-cls module:Class`) in a process that has only vLLM, as the pytest file of
`vllm-contract reduce` is run; and the workloads reduce's tests and bench record them on."""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass, field
from pathlib import Path

from vllm_contract.rig import breaks, scenarios


@dataclass(frozen=True)
class Workload:
    """The engine a break's recording runs on (record_workload adds the requests, of
    `prompt_tokens` each, all at the start, and steps until they have all finished)."""
    num_blocks: int = 512
    max_num_seqs: int = 4
    max_num_batched_tokens: int = 128
    # batches in flight: above 1 the real AsyncScheduler under the break, as an async engine
    # runs it (the checks of what an async worker reads apply to such a recording only)
    batch_queue: int = 1
    prompt_tokens: int = 20
    # a hybrid engine's KV cache groups (HarnessConfig.groups, e.g. rig/scenarios.py's
    # SLIDING_FULL, MAMBA_FULL); empty: one full-attention group
    groups: tuple = ()
    mamba_cache_mode: str = "align"  # for a Mamba group ("align": prefix caching)
    enable_prefix_caching: bool = True
    # tokens of a prefix every odd-numbered request's prompt starts with (prefix-cache hits
    # once the first of them has been prefilled); its own `prompt_tokens` follow
    shared_prefix: int = 0


# a batch of 4 with room for every request: no preemption
PLAIN = Workload()
# 16 blocks of 16 tokens for 4 requests of up to 130 tokens: preempted and resumed over and over
PREEMPTING = Workload(num_blocks=16)
PREEMPTING_ASYNC = Workload(num_blocks=16, batch_queue=2)
# hybrid engines (rig/scenarios.py's groups): a sliding-window group (window 32) beside a
# full-attention one; a Mamba group ("align" mode, as with prefix caching) beside a
# full-attention one, without and with prompts that share a 48-token prefix. The budget keeps
# the second request out of the first step (a 16-token budget prefills a 20-token prompt in two
# steps; a Mamba group's chunks are block-aligned, so 32 tokens leave 12 that fit no block),
# so that it is admitted while the first runs (what the breaks of a running request's blocks
# wait for) with two requests alone.
SLIDING = Workload(max_num_batched_tokens=16, groups=scenarios.SLIDING_FULL)
MAMBA = Workload(max_num_batched_tokens=32, groups=scenarios.MAMBA_FULL)
MAMBA_SHARED = dataclasses.replace(MAMBA, shared_prefix=48)


@dataclass(frozen=True)
class Covered:
    """A break reduce is tested on: the invariant its reduction keeps, the recording's
    workload, and the break's arguments as Python expressions evaluated in the subclass's
    __init__ (`self` is the scheduler: a bound that follows the engine a reduction made
    smaller, such as its KV cache's size)."""
    invariant: str
    workload: Workload = PLAIN
    kwargs: dict = field(default_factory=dict)


# the named breaks (breaks.BREAKS), each with the invariant a reduction of its recording keeps
SCHEDULER_BREAKS = {make.__name__: what.split(":")[0].split(" + ")[-1]
                    for _, make, what in breaks.BREAKS.values()}
# the one the default suite reduces (tests/replay/test_reduce.py): each reduction records and
# re-simulates over a thousand steps many times over; `make reduce-all` reduces every other
IN_SUITE = ("drop_finished_once",)

# every break of breaks.py that the real CPU scheduler's output can carry and that a what-if
# re-run shows (docs/reduce.md has the table of those left out, and why)
COVERED = {
    "drop_finished_once": Covered("finished.leaked"),
    "hand_out_held_block": Covered("blocks.double_owner"),
    "forget_new_request": Covered("lifecycle.unknown_cached"),
    "resume_as_cached": Covered("lifecycle.preempted_not_resumed", PREEMPTING),
    "resume_without_table": Covered("lifecycle.resumed_without_blocks", PREEMPTING),
    "drop_all_token_ids": Covered("outputs.all_token_ids_missing", PREEMPTING_ASYNC),
    "stale_all_token_ids": Covered("outputs.all_token_ids_mismatch", PREEMPTING_ASYNC),
    "undercount_outputs": Covered("outputs.count_below_held"),
    "zero_held_block": Covered("blocks.zeroed_held"),
    "zero_past_cache": Covered("blocks.zeroed_out_of_range",
                               kwargs={"num_blocks": "self.kv_cache_config.num_blocks"}),
    "repeat_new_blocks": Covered("blocks.repeated_in_grant"),
    "grow_table_past_width": Covered("blocks.table_too_long", kwargs={
        "num_blocks": "self.kv_cache_config.num_blocks",
        "width": "-(-self.max_model_len // self.block_size)"}),
    "draft_without_drafter": Covered("spec.without_drafter"),
    # hybrid engines: the break's group is the workload's first (sliding window or Mamba)
    "hand_out_window_block": Covered("blocks.double_owner", SLIDING),
    "share_mamba_state": Covered("blocks.double_owner", MAMBA),
    "null_block_in_table": Covered("blocks.null_needed", MAMBA),
    "drop_mamba_hit": Covered("blocks.null_needed", MAMBA_SHARED),
}

_HEAD = '''"""Scheduler subclasses with a bug: vllm_contract/rig/breaks.py's, applied after each
schedule(). Needs vLLM only."""

import dataclasses
from typing import Callable

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler
'''

_CLASS = '''

class {cls}({base}):
    """{doc}"""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs){flag}
        self._break, self._calls = {fn}({kwargs}), 0
        self.broken = []  # (schedule() call, request id) of each output the break changed

    def schedule(self, *args, **kwargs):
        so = super().schedule(*args, **kwargs)
        hit = self._break(so, self._calls)
        if hit:
            self.broken.append(hit)
        self._calls += 1
        return so
'''

# vLLM builds the AsyncScheduler only for an engine with async_scheduling set; the subclass
# says so in its config, which the recorder writes to the manifest
_ASYNC_FLAG = "\n        self.scheduler_config.async_scheduling = True"


def class_name(name: str) -> str:
    """drop_finished_once -> DropFinishedOnce."""
    return "".join(part.capitalize() for part in name.split("_"))


def _helpers(fn) -> list[str]:
    """The private functions of breaks.py that `fn`, a function nested in it or one of those
    helpers calls (their source goes along)."""
    names, codes = [], [fn.__code__]
    while codes:
        code = codes.pop()
        found = [n for n in code.co_names if n.startswith("_") and n not in names
                 and inspect.isfunction(getattr(breaks, n, None))]
        names += found
        codes += [c for c in code.co_consts if inspect.iscode(c)]
        codes += [getattr(breaks, n).__code__ for n in found]
    return names


def module_source(names: list[str]) -> str:
    """The text of a module with a Scheduler subclass per break function in `names`; the
    breaks of COVERED get their arguments and base class from there."""
    parts, helpers = [_HEAD], []
    for name in names:
        fn = getattr(breaks, name, None)
        if fn is None or not callable(fn):
            raise ValueError(f"no break {name!r} in rig/breaks.py")
        covered = COVERED.get(name, Covered(""))
        doc = " ".join((inspect.getdoc(fn) or name).split())
        for h in _helpers(fn):
            if h not in helpers:
                helpers.append(h)
                parts.append("\n\n" + inspect.getsource(getattr(breaks, h)).rstrip() + "\n")
        asynced = covered.workload.batch_queue > 1
        kwargs = ", ".join(f"{k}={v}" for k, v in covered.kwargs.items())
        parts += ["\n\n" + inspect.getsource(fn).rstrip() + "\n",
                  _CLASS.format(cls=class_name(name), doc=doc.replace('"""', "'''"), fn=name,
                                base="AsyncScheduler" if asynced else "Scheduler",
                                flag=_ASYNC_FLAG if asynced else "", kwargs=kwargs)]
    return "".join(parts)


def write(where: Path, module: str, names: list[str]) -> dict[str, str]:
    """`module`.py under `where` with the subclasses of `names`; break name -> "module:Class"
    (importable once `where` is on the path)."""
    (Path(where) / f"{module}.py").write_text(module_source(names))
    return {n: f"{module}:{class_name(n)}" for n in names}


def record_workload(cls, model: str, path: Path, requests: int = 60,
                    workload: Workload = PLAIN) -> int:
    """`requests` requests of staggered lengths, all added at the start, recorded with `cls` in
    place of vLLM's Scheduler (its AsyncScheduler with batches in flight) until they have all
    finished: over a thousand steps. Returns the steps recorded."""
    import vllm.v1.core.sched.async_scheduler as async_mod
    import vllm.v1.core.sched.scheduler as sched_mod

    from vllm_contract.recorder import attach
    from vllm_contract.rig.harness import Harness, HarnessConfig
    from vllm_contract.rig.scenarios import prompt
    from vllm_contract.trace import open_trace

    w = workload
    mod, attr = (async_mod, "AsyncScheduler") if w.batch_queue > 1 else (sched_mod, "Scheduler")
    stock = getattr(mod, attr)
    setattr(mod, attr, cls)
    try:
        h = Harness(model, HarnessConfig(num_blocks=w.num_blocks, max_num_seqs=w.max_num_seqs,
                                         max_num_batched_tokens=w.max_num_batched_tokens,
                                         batch_queue=w.batch_queue, groups=w.groups,
                                         mamba_cache_mode=w.mamba_cache_mode,
                                         enable_prefix_caching=w.enable_prefix_caching))
    finally:
        setattr(mod, attr, stock)
    shared = prompt(4242, w.shared_prefix)
    with attach(h.scheduler, path):
        for i in range(requests):
            h.add(f"w{i}", (shared if i % 2 else []) + prompt(i, w.prompt_tokens),
                  max_tokens=50 + (i * 37) % 60)
        while h.busy:
            h.step()
    # the schedule() calls, as the trace has them: with batches in flight the last engine
    # steps only update
    return open_trace(path).read("steps").num_rows
