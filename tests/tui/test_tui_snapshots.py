"""SVG snapshots of the main screens at a fixed terminal size (pytest-textual-snapshot), on the
sample with a leaked finished id. Regenerate after a deliberate change to the look with
`pytest tests/tui/test_tui_snapshots.py --snapshot-update`, and look at the report."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tuikit import SAMPLES, SIZE, make_app, ready, until


def _at_the_finding(*keys: str):
    async def before(pilot):
        app = pilot.app
        await until(pilot, lambda: ready(app))
        await pilot.press("n")
        await until(pilot, lambda: ready(app) and app.steps.step in app.finding_steps)
        await pilot.press(*keys)
        await pilot.pause(0.2)
        if keys == ("w",):
            pane = app.query_one("WorkerPane")
            await until(pilot, lambda: pane.state is not None
                        and pane.state["position"] == app.steps.cursor + 1)
        if keys == ("r",):
            await until(pilot, lambda: app.query_one("RequestPane").lifeline is not None)
        await pilot.pause(0.1)
    return before


def _shot(snap_compare, *keys: str) -> bool:
    return snap_compare(make_app(SAMPLES / "broken-leak"), terminal_size=SIZE,
                        run_before=_at_the_finding(*keys))


def test_main_screen_at_a_finding(snap_compare):
    assert _shot(snap_compare)


def test_findings_pane(snap_compare):
    assert _shot(snap_compare, "f")


def test_worker_pane(snap_compare):
    assert _shot(snap_compare, "w")


def test_help_screen(snap_compare):
    assert _shot(snap_compare, "question_mark")
