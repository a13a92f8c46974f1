"""Stopping a re-run at a step (`--break-at`, `--break-hook`, `--until`): what the stop hands
over, and pdb as the default hook (docs/resim.md, "Stopping at a step")."""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass, field
from typing import Any, Callable

from vllm_contract.errors import TraceError


@dataclass
class Pending:
    """One call the re-run is about to make: `add_request` (with the vLLM Request it adds),
    `schedule`, and from an input log also `finish_requests` (args: (req_id, status name)),
    `update_draft_token_ids` and `update_draft_token_ids_in_output` (args: (req_ids, drafts,
    the step whose output they go into or None))."""
    call: str
    request: Any = None
    args: Any = None

    @property
    def req_id(self) -> str | None:
        if self.request is not None:
            return self.request.request_id
        if self.call == "finish_requests" and self.args:
            return self.args[0]
        return None

    def __repr__(self) -> str:
        return f"{self.call}({self.req_id or ''})"


@dataclass
class Break:
    """What a break hook is given, just before `step`'s schedule():

    - step: the step about to be scheduled
    - scheduler: the re-run's scheduler, with everything before the step fed to it
    - pending: the calls about to be made, in order (add_request()s, then schedule()); the
      requests the re-run adds are the add_request entries left in it when the hook returns
    - recorded: the recording's SchedulerOutput for the step, in canonical form
      (replay/worker/canonical.py), which the re-run's is compared with
    - recorded_finishes: (req_id, reason) the recording's update of the step finished
    - run: the run itself, a Resim or a WhatIf (its inputs, notes, summary so far)
    """
    step: int
    scheduler: Any
    pending: list[Pending]
    recorded: dict
    recorded_finishes: list[tuple[str, str]] = field(default_factory=list)
    run: Any = None


def pdb_hook(stop: Break) -> None:
    """The default hook: breakpoint(), so PYTHONBREAKPOINT chooses the debugger (0: none)."""
    step, scheduler, pending, recorded = stop.step, stop.scheduler, stop.pending, stop.recorded
    print(f"resim: stopped before step {step:,}'s schedule(). In reach: step, scheduler, "
          "pending (the calls about to be made), recorded (the recording's output for the "
          "step), stop (all of them). `b type(scheduler).schedule` then `c` steps into "
          "schedule(); `c` alone runs on; `q` ends the run.", file=sys.stderr)
    breakpoint()
    del step, scheduler, pending, recorded  # `c` goes on to the step: the names were for here


def hook_of(spec: str | Callable[[Break], Any] | None) -> Callable[[Break], Any]:
    """A hook as given (a callable, or "module:function"), else pdb's; TraceError when the name
    does not import or is not callable."""
    if spec is None:
        return pdb_hook
    if callable(spec):
        return spec
    module, _, attr = str(spec).partition(":")
    if not module or not attr:
        raise TraceError(f"--break-hook {spec!r}: expected module:function")
    try:
        fn = getattr(importlib.import_module(module), attr)
    except Exception as e:  # any failure to import is the user's input, said in one line
        raise TraceError(f"break hook {spec} is not importable: {type(e).__name__}: "
                         f"{' '.join(str(e).split())}") from None
    if not callable(fn):
        raise TraceError(f"break hook {spec} is not callable")
    return fn


def check_step(option: str, step: int | None, steps: dict) -> None:
    """TraceError unless `step` is one of the recording's steps (None: not asked for)."""
    if step is None or step in steps:
        return
    first, last = min(steps), max(steps)
    raise TraceError(f"{option} {step}: the recording has steps {first:,} to {last:,}")
