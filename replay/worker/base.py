"""What `Session` steps: the one interface the shadow worker and a real vLLM worker share.

A worker stands at a position (steps applied, 0..len(steps)) over one engine's recorded steps.
`step()` applies the next one and returns what it found there (with the end-of-trace findings
after the last); `goto(n)` reaches position n however the worker can (a checkpoint and forward
for the shadow, a reset and a re-run for a real worker), with progress and a cancel, and says
False when cancelled. `findings`, `divergences` (a real worker's token departures; none for the
shadow) and `notes` (what the replay cannot compare or reproduce) are what it has so far;
`state()` is its state as plain data. A new worker goes here: implement this, then name it in
`Session`'s factory (replay/session.py).
"""

from __future__ import annotations

from typing import Callable, Protocol, runtime_checkable

from vllm_contract.findings import Finding

Progress = Callable[[int, int], None]


@runtime_checkable
class Worker(Protocol):
    engine: str

    @property
    def steps(self) -> list[int]: ...

    @property
    def position(self) -> int: ...

    @property
    def findings(self) -> list[Finding]: ...

    @property
    def divergences(self) -> list: ...

    @property
    def notes(self) -> list[str]: ...

    def step(self) -> list: ...

    def goto(self, n: int, progress: Progress | None = None,
             cancel: Callable[[], bool] | None = None) -> bool: ...

    def state(self) -> dict: ...
