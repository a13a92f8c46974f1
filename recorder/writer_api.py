"""What the recorder (attach.py, armed.py) asks of a writer: the writer thread (writer.py) and
the writer process (writer_proc.py) both answer it, and the caller never asks which one it has.

What the engine thread hands over is taken as it is; each writer decides what to keep of it
(the thread makes snapshot.py's snapshot at once, the process pickles the object itself).
Nothing here raises into the engine on purpose: the recorder catches what does and calls fail().
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Writer(Protocol):
    dir: Path  # this engine's directory in the trace

    @property
    def failed(self) -> bool:
        """Recording has stopped (an error here, or in the writer)."""

    @property
    def manifest(self) -> dict:
        """The manifest as last written."""

    # -- engine thread: one call per hook, never waits (unless on_full="block") ----------------
    def submit_schedule(self, step: int, t_ns: int, dur_ns: int, state: tuple,
                        scheduler_output: Any) -> bool:
        """A schedule() result; False when the step was dropped (the writer is behind), so that
        its update is not sent either. A SchedulerOutput no snapshot can be made of is kept
        whole (quarantined) and counts as kept."""

    def keep_model_output(self, model_runner_output: Any) -> Any:
        """A copy of the model output as it is now (update_from_output() trims it), to give
        back to submit_update()."""

    def submit_update(self, step: int, t_ns: int, dur_ns: int, model_output: Any,
                      finishes: Any, transport: Any) -> None:
        """An update_from_output() of a kept step, with what keep_model_output() returned."""

    def submit_finish(self, step: int, t_ns: int, source: str, finishes: list) -> None:
        """Requests finished between steps."""

    def submit_transport(self, step: int, rows: list) -> None:
        """A step's transport rows, apart from its update."""

    def submit_input(self, record: Any) -> None:
        """A records.Input: a call that fed the scheduler (the input log)."""

    def update_manifest(self, **values: Any) -> None:
        """Merge keys into the manifest (written by the writer, never the engine)."""

    def fail(self, e: BaseException) -> None:
        """Recording is disabled; the manifest notes why."""

    # -- outside the step loop ----------------------------------------------------------------
    def flush(self, timeout: float = 30.0) -> bool:
        """Block until everything submitted so far is written; False on timeout or failure."""

    def close(self, timeout: float = 30.0, wait: bool = True) -> bool:
        """Seal the trace (with wait=False the writer finishes on its own); whether it has."""

    def wait_closed(self, timeout: float = 30.0) -> bool:
        """Wait for close() to finish; whether it has."""

    def alive(self) -> bool:
        """The writer (thread or process) still runs."""
