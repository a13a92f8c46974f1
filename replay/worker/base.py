"""What `Session` steps: the one interface every replay worker implements, and what a step returns.

A worker stands at a position (steps applied, 0..len(steps)) over one engine's recorded steps.
A new worker kind is one class implementing `Worker` and one line in `registry.py`; `Session`,
`replay`, `check`'s choices, the TUI and the exporters then take it as they take the others.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field
from typing import Callable, ClassVar

from vllm_contract.findings import Finding
from vllm_contract.kinds import KINDS

Progress = Callable[[int, int], None]  # (steps done, steps to do)
Cancel = Callable[[], bool]  # asked between steps: True stops


@dataclass
class Divergence:
    """A step at which a worker's sampled tokens for a request differ from the recorded ones."""
    step: int
    req_id: str
    recorded: list[int] | None
    replayed: list[int] | None

    def to_dict(self) -> dict:
        return asdict(self)

    def finding(self, engine: str | None = None) -> Finding:
        return KINDS["replay.token_divergence"].finding(
            self.step, self.req_id, f"recorded {self.recorded}, replayed {self.replayed}", engine)


@dataclass
class Stepped:
    """What one `step()` found: the contract findings at that step (after the last step, with
    the end-of-trace ones), and the token divergences of a worker that compares tokens.
    `applied` is False when the step was not run (past the end, or refused)."""
    findings: list[Finding] = field(default_factory=list)
    divergences: list[Divergence] = field(default_factory=list)
    applied: bool = True


class Worker(ABC):
    """A worker over one engine of a trace, stepped by `Session`.

    Class attributes say what the callers may expect without knowing the kind by name."""

    # the registry's name for this kind (`--worker NAME`)
    kind: ClassVar[str]
    # how outputs name it ("replayed into the shadow worker")
    title: ClassVar[str]
    # True when it runs the model and compares sampled tokens with the recorded ones
    compares_tokens: ClassVar[bool] = False
    # True when going back is cheap (checkpoints); False when it re-runs from the start
    rewinds_cheaply: ClassVar[bool] = True
    # said while the worker starts, when starting takes long (e.g. an engine is built)
    starting: ClassVar[str | None] = None

    engine: str  # the engine's name in the trace

    @classmethod
    def engines(cls, trace, engine: str | None) -> list[str]:
        """The engines a whole replay covers: `engine`, or when None every engine of the trace.
        Raises TraceError for an engine the trace lacks. Cheap (reads the manifest)."""
        from vllm_contract import schema
        from vllm_contract.errors import TraceError

        names = [e.name for e in trace.engines]
        if engine is None:
            return names
        name = schema.plain_engine(engine)
        if name not in names:
            raise TraceError(f"no engine {name!r} in the trace (it has {', '.join(names)})")
        return [name]

    @classmethod
    def precheck(cls, trace, engine: str | None, options: "WorkerOptions") -> None:
        """Raises TraceError for what is known wrong before the worker starts (a model that
        cannot be loaded), so that a caller can say it before it shows anything. Cheap: no
        engine is built."""

    @classmethod
    @abstractmethod
    def open(cls, trace, engine: str | None, options: "WorkerOptions") -> "Worker":
        """The worker for `engine` of `trace` (None: the first engine, or the only one if the
        kind needs one), at position 0. Raises TraceError when the trace or the options cannot
        be replayed by this kind; may take long (`starting` says so)."""

    @property
    @abstractmethod
    def steps(self) -> list[int]:
        """The recorded step numbers this worker applies, in order. Cheap."""

    @property
    @abstractmethod
    def position(self) -> int:
        """Steps applied so far, 0..len(steps). Cheap."""

    @property
    @abstractmethod
    def findings(self) -> list[Finding]:
        """Contract findings up to the position (the end-of-trace ones once the last step is
        applied), by step. Cheap: a copy of what it holds."""

    @property
    def divergences(self) -> list[Divergence]:
        """Token divergences up to the position; always empty when not `compares_tokens`."""
        return []

    @property
    def notes(self) -> list[str]:
        """What the replay cannot compare or reproduce, for a person to read (a trace begun
        mid-stream, requests warmed up). Cheap."""
        return []

    @property
    def not_comparable(self) -> dict[str, str]:
        """Request id -> why its tokens are not compared; empty when not `compares_tokens`."""
        return {}

    @property
    def crash(self) -> dict | None:
        """The worker's own failure, once it raised or died: {"step", "error", "traceback"}."""
        return None

    @property
    def warmed(self) -> dict[str, int]:
        """Request id -> prefix tokens computed before its first step so it could be compared."""
        return {}

    @property
    def stopped(self) -> bool:
        """True when it cannot step on from here (a refused or failed step) until it goes back."""
        return False

    @abstractmethod
    def step(self) -> Stepped:
        """Apply the next step and say what it found. Past the end: an empty, not `applied`
        result. A failure of the replayed code is a finding, not an exception; TraceError for a
        trace it cannot go on with. Costs one step of the kind (pure Python, or a model run)."""

    @abstractmethod
    def goto(self, n: int, progress: Progress | None = None, cancel: Cancel | None = None
             ) -> bool:
        """Reach position n (0..len(steps)) however the kind can: a checkpoint and forward, or a
        re-run from the start. `progress` is told of long work; False if `cancel` stopped it
        (the worker then stands where it stopped). Stops early where `stopped`."""

    @abstractmethod
    def state(self) -> dict:
        """The worker's state at the position, as JSON-ready plain data."""

    def close(self) -> None:
        """Release what the worker holds outside this process (a child, an engine)."""


@dataclass(frozen=True)
class WorkerOptions:
    """The settings of a replay; each kind reads those it has and ignores the others."""
    strict_order: bool = False  # shadow: the batch's order is checked too
    checkpoint_every: int = 256  # shadow: a checkpoint every this many steps
    model: str | None = None  # vllm: a copy of the trace's model
    force_recorded_tokens: bool = False  # vllm: the recorded tokens are fed back
    allow_crash: bool = False  # vllm: steps that raise are run (in a child process)
    start: int | None = None  # vllm: the first step to run (earlier ones cannot be skipped by
    until: int | None = None  # the shadow, which applies them all and reports from `start`)
    llm: object = None  # vllm: an engine already built for the trace (tests share one)
