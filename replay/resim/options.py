"""What a re-run is asked to do (docs/resim.md): one frozen object that resim() takes whole or
builds from keywords, and that the run keeps, so a setting is named in one place."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable


@dataclass(frozen=True)
class ResimOptions:
    """- engine: the engine to re-run (needed when the trace has several)
    - scheduler_cls: "module:Class" instead of the installed vLLM's Scheduler
    - overrides: manifest engine settings to change (build.SETTINGS)
    - break_at: call `break_hook` (a callable or "module:function"; default pdb) with a
      debug.Break just before that step's schedule()
    - until: stop after that step
    - out: record the re-run into a new trace there and run the catalog on it
    - whatif: divergence expected (docs/resim.md, "What-if runs"): the re-run goes on until
      every request has finished and the summary's `whatif` compares it with the recording
    - arrivals: how a what-if run places the requests, "step" or "time"
    - keep: a what-if run of only the requests with these ids (their adds and aborts; the
      input log's)
    - trim: a what-if run's requests cut shorter, id -> (prompt tokens, output tokens), None
      for either kept as recorded (the first tokens of the prompt, the output capped by
      max_tokens)
    - check_recording: a what-if run's comparison has the catalog's findings on the
      recording too (reduce.py knows them already)"""
    engine: str | None = None
    scheduler_cls: str | None = None
    overrides: dict | None = None
    break_at: int | None = None
    break_hook: str | Callable[[Any], Any] | None = None
    until: int | None = None
    out: Path | None = None
    whatif: bool = False
    arrivals: str = "step"
    keep: frozenset[str] | None = None
    trim: dict | None = None
    check_recording: bool = True

    def __post_init__(self) -> None:
        # given as any path and any iterable of ids; held as one type each
        if self.out is not None:
            object.__setattr__(self, "out", Path(self.out))
        if self.keep is not None:
            object.__setattr__(self, "keep", frozenset(self.keep))
