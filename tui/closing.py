"""Quitting while work is in flight. Textual's cancel ends a thread worker's task at once, but
its thread runs on (in a DuckDB query, a replay step) and posts nothing more; the command line
then closes the trace's connections under it ("Connection already closed!"), and asyncio.run
waits for every executor thread before the process can exit. So the app counts its thread
workers' bodies while they run, and at unmount refuses new ones and interrupts every query in
flight until each body has returned: the connections close only after that.

An interrupt reaches only a query that is running, and a body may start its next query just
after one: hence interrupts again at every poll, until the bodies are gone."""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from contextlib import contextmanager
from typing import Callable

from vllm_contract.tui.data import Interrupted

POLL = 0.005  # seconds between two rounds of interrupts while waiting for the bodies
# Longer than any interrupted query or cancelled step takes to return; what can run longer (a
# vLLM engine being built) cannot be interrupted, and is then left to finish on its own.
WAIT = 5.0


class Bodies:
    """The thread workers' bodies running now, and whether the app is closing."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.running = 0
        self.closing = False

    @contextmanager
    def body(self):
        with self._lock:
            if self.closing:  # a worker whose thread started after the app began to close
                raise Interrupted("the app is closing")
            self.running += 1
        try:
            yield
        finally:
            with self._lock:
                self.running -= 1

    def refuse(self) -> None:
        """No body starts from now on."""
        with self._lock:
            self.closing = True

    async def stop(self, interrupt: Callable[[], None], wait: float = WAIT) -> bool:
        """Refuse new bodies, and call `interrupt()` until no body runs (True) or `wait`
        seconds have passed (False)."""
        self.refuse()
        end = time.monotonic() + wait
        while True:
            interrupt()
            if self.running == 0:
                return True
            if time.monotonic() > end:
                return False
            await asyncio.sleep(POLL)


def counted(fn):
    """A thread worker's body, counted in its app's `bodies` while it runs."""
    @functools.wraps(fn)
    def run(app, *args, **kwargs):
        with app.bodies.body():
            return fn(app, *args, **kwargs)
    return run
