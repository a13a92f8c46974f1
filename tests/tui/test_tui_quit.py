"""Quitting the TUI while its work is in flight, on a real recorded trace: the queries running
are interrupted and their threads return before the app does, so that the trace's connections
can close under no one, and the app exits cleanly."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tuikit import SAMPLES, SIZE, until

from vllm_contract.tui.app import ContractApp
from vllm_contract.tui.data import TraceData

# The trace's own rows crossed five times: 186^5 rows of samples/mixed, far longer than the
# suite may wait, so the query still runs when `q` is pressed, and ends only if interrupted.
HEAVY = """SELECT SUM(a.num_scheduled_tokens + b.num_scheduled_tokens + c.num_scheduled_tokens
                  + d.num_scheduled_tokens + e.num_scheduled_tokens) AS s
           FROM scheduled a, scheduled b, scheduled c, scheduled d, scheduled e"""
HANG = 60  # seconds: only a quit that hangs takes this long (bench/tui_speed.py --quit times it)


def quit_while(trace: Path, busy, **kw) -> tuple[ContractApp, TraceData, bool]:
    """Start the app, let `busy(app, pilot)` start work, press q. The app once it has returned,
    its trace still open (as the command line has it then), and whether the checks were still
    running when q was pressed."""
    async def main():
        data = TraceData(trace)
        app = ContractApp(data, **kw)
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: len(app.steps.steps) > 0)
            await busy(app, pilot)
            assert app.bodies.running > 0
            checking = app.run_checks and not app.checked
            t = time.monotonic()
            await pilot.press("q")
        assert time.monotonic() - t < HANG
        return app, data, checking

    return asyncio.run(main())


def test_quit_with_an_sql_query_running_interrupts_it_and_exits_cleanly():
    async def busy(app, pilot):
        await pilot.press("s")
        app.query_one("#sql-input").value = HEAVY
        await pilot.press("enter")
        status = app.query_one("#sql-status")
        await until(pilot, lambda: "running" in str(status.render()))
        await until(pilot, lambda: "sql" in app.data._slots)  # the query is in DuckDB
        app.steps.focus()  # `q` in the prompt is a letter of the query

    app, data, _ = quit_while(SAMPLES / "mixed", busy, run_checks=False)
    try:
        assert app.return_code == 0
        # the query's thread has left it, interrupted (it would run on for minutes), and
        # closed its cursor: the pool's alone are left, idle
        assert app.bodies.running == 0 and not data._slots and data._cursors == data._free
        # and the trace's connections are intact for the caller to read on, or close
        assert data.sql("SELECT COUNT(*) AS n FROM steps")["n"][0].as_py() == 132
    finally:
        data.close()


def test_quit_while_the_findings_are_computed_joins_the_checks_and_exits_cleanly():
    # The checks close their own gateway as their thread ends; quitting interrupted it, and
    # could race that close ("Connection already closed!", exit 1).
    async def busy(app, pilot):
        await until(pilot, lambda: any(w.group == "findings" and w.is_running
                                       for w in app.workers))

    # q lands while the checks run unless they finish first (about a second on this trace):
    # a run where they did says nothing about quitting during them, so another is made
    stopped = 0
    for _ in range(3):
        app, data, checking = quit_while(SAMPLES / "mixed", busy)
        try:
            assert app.return_code == 0
            # the checks' thread returned, and its gateway is closed
            assert app.bodies.running == 0 and app._check_gateway is None
            if checking and not app.checked:  # no findings had come when q was handled
                stopped += 1
                break
        finally:
            data.close()
    assert stopped == 1
