"""The TUI driven by keys (Textual's pilot) on real recorded traces: every capability of the app,
each checked against a read of the same trace by the reader (pyarrow) or by DuckDB through the
command line, never against copies of the app's own output."""

from __future__ import annotations

import asyncio
import json
import time
import sys
from pathlib import Path

from typer.testing import CliRunner
from vllm_contract.cli import app as cli
from vllm_contract.replay import Session

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tuikit import SAMPLES, SIZE, make_app, ready, table, until

runner = CliRunner()


def run(scenario, trace, **kw):
    async def main():
        app = make_app(trace, **kw)
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: ready(app))
            await scenario(app, pilot)
    asyncio.run(main())


def test_navigation_keys_and_the_rows_shown():
    trace = SAMPLES / "mixed"
    steps = sorted({r["step"] for r in table(trace, "steps")})
    by_step = {r["step"]: r for r in table(trace, "steps")}

    async def scenario(app, pilot):
        lst = app.steps
        assert list(lst.steps) == steps
        await pilot.press("j", "j", "down")
        assert lst.step == steps[3]
        await pilot.press("k", "up")
        assert lst.step == steps[1]
        await pilot.press("pagedown")
        assert lst.cursor == 1 + lst.size.height - 1
        await pilot.press("G")
        assert lst.step == steps[-1]
        await until(pilot, lambda: lst.row(lst.cursor) is not None)
        row = lst.row(lst.cursor)
        src = by_step[steps[-1]]
        assert (row["tokens"], row["running"], row["waiting"], row["finished"]) == (
            src["total_num_scheduled_tokens"], src["num_running"], src["num_waiting"],
            src["num_finished"])
        assert row["new"] == src["num_new"] and row["cached"] + row["resumed"] == src["num_cached"]
        await pilot.press("g")
        assert lst.step == steps[0]
        await pilot.press("end", "home")
        assert lst.step == steps[0]
        # the mouse: a click on the list's sixth line selects that row
        await pilot.click("StepList", offset=(5, 5))
        assert lst.cursor == 5

    run(scenario, trace, run_checks=False)


def test_go_to_step():
    async def scenario(app, pilot):
        await pilot.press("colon")
        await pilot.press(*"57", "enter")
        assert app.steps.step == 57
        await until(pilot, lambda: app.query_one("DetailPane").detail.step == 57)
        assert app.query_one("DetailPane").text.startswith("step 57")

    run(scenario, SAMPLES / "mixed", run_checks=False)


def test_next_and_previous_finding_follow_the_catalog():
    trace = SAMPLES / "broken-unknown-cached"
    r = runner.invoke(cli, ["check", str(trace), "-f", "json"])
    expected = sorted({f["step"] for f in json.loads(r.stdout) if f["step"] is not None})
    assert len(expected) >= 2

    async def scenario(app, pilot):
        assert sorted({f.step for f in app.findings if f.step is not None}) == expected
        assert app.steps.marked == set(expected)
        seen = [app.steps.step] if app.steps.step in expected else []
        for _ in expected:
            await pilot.press("n")
            if app.steps.step not in seen:
                seen.append(app.steps.step)
        assert seen == expected
        await pilot.press("N")
        assert app.steps.step == expected[-2]

    run(scenario, trace)


def test_detail_shows_the_steps_rows_and_folds_long_lists():
    trace = SAMPLES / "mixed"
    preempted = table(trace, "preempted")
    step = preempted[0]["step"]  # a step with a preemption: several kinds of rows at once
    sched = [r for r in table(trace, "scheduled") if r["step"] == step]
    finished = [r["req_id"] for r in table(trace, "finished") if r["step"] == step]
    # the row with the longest block table: more blocks than the fold shows
    longest = max((r for r in table(trace, "scheduled") if r["new_block_ids"]),
                  key=lambda r: len(r["new_block_ids"][0]))

    async def scenario(app, pilot):
        app.goto_step(step)
        await until(pilot, lambda: ready(app))
        text = app.query_one("DetailPane").text
        for r in sched:
            line = next(ln for ln in text.splitlines() if f" {r['req_id']} " in ln)
            assert f" {r['num_scheduled_tokens']} " in line and (r["kind"] or "") in line
        assert f"preempted_req_ids ({len([p for p in preempted if p['step'] == step])})" in text
        assert f"finished_req_ids ({len(finished)})" in text
        for rid in finished:
            assert rid in text
        # a new request's block table is longer than the fold: shown folded, then whole
        app.goto_step(longest["step"])
        await until(pilot, lambda: ready(app) and app.steps.step == longest["step"])
        blocks = longest["new_block_ids"][0]
        assert len(blocks) > 8
        assert f"(+{len(blocks) - 8} more, {len(blocks)})" in app.query_one("DetailPane").text
        await pilot.press("z")
        assert ", ".join(map(str, blocks)) in app.query_one("DetailPane").text.replace("\n", "")

    run(scenario, trace, run_checks=False)


def test_findings_pane_explains_and_jumps_to_the_step_and_request():
    from vllm_contract.replay.query.catalog import load

    trace = SAMPLES / "broken-leak"
    inv = {i.id: i for i in load()}["finished.leaked"]

    async def scenario(app, pilot):
        await pilot.press("f")
        why = str(app.query_one("#why").render())
        leak = next(f for f in app.findings if f.invariant == "finished.leaked")
        assert inv.title in why and inv.why in why and inv.relies_on in why
        await pilot.press("enter")
        assert app.steps.step == leak.step
        await until(pilot, lambda: app.query_one("RequestPane").lifeline is not None)
        assert app.query_one("RequestPane").lifeline.req_id == leak.req_id

    run(scenario, trace)


def test_search_by_prefix_and_the_lifeline():
    trace = SAMPLES / "mixed"
    reqs = table(trace, "requests")
    preempted = table(trace, "preempted")[0]["req_id"]
    prefix = preempted[:1]
    expected = sorted({r["req_id"] for r in reqs if r["req_id"].startswith(prefix)})

    async def scenario(app, pilot):
        await pilot.press("slash")
        await pilot.press(*prefix)
        pane = app.query_one("RequestPane")
        await until(pilot, lambda: sorted(pane.matches) and sorted(
            r for r, _ in pane.matches) == expected)
        box = pane.query_one("#matches")
        i = [r for r, _ in pane.matches].index(preempted)
        box.focus()
        box.highlighted = i
        await pilot.press("enter")
        await until(pilot, lambda: pane.lifeline is not None and pane.lifeline.req_id == preempted)
        events = pane.lifeline.events
        kinds = [e.event for e in events]
        assert "introduced" in kinds and "preempted" in kinds and "resumed" in kinds
        assert [e.first for e in events] == sorted(e.first for e in events)
        intro = [r["step"] for r in reqs if r["req_id"] == preempted]
        assert [e.first for e in events if e.event == "introduced"] == intro
        ends = [(r["step"], r["reason"]) for r in table(trace, "finish_events")
                if r["req_id"] == preempted]
        assert [(e.first, e.info.split()[0]) for e in events if e.event == "finished"] == ends
        freed = [r["step"] for r in table(trace, "finished") if r["req_id"] == preempted]
        assert [e.first for e in events if e.event.startswith("freed")] == freed
        pre = [e.first for e in events if e.event == "preempted"]
        assert pre == [r["step"] for r in table(trace, "preempted") if r["req_id"] == preempted]
        # Enter on an event moves the cursor to its step
        life = pane.query_one("#lifeline")
        life.focus()
        life.highlighted = kinds.index("preempted")
        await pilot.press("enter")
        assert app.steps.step == pre[0]

    run(scenario, trace, run_checks=False)


def test_worker_pane_forward_and_back_equals_the_session():
    trace = SAMPLES / "mixed"
    ref = Session(trace)

    def expected(index: int) -> dict:
        ref.goto(index + 1)
        return ref.state()

    async def scenario(app, pilot):
        await pilot.press("w")
        pane = app.query_one("WorkerPane")
        for keys in (("colon", "4", "0", "enter"), ("j", "j", "j"), ("k",), ("g",), ("G",)):
            await pilot.press(*keys)
            i = app.steps.cursor
            await until(pilot, lambda i=i: pane.state is not None
                        and pane.state["position"] == i + 1)
            assert pane.state == expected(i)
            for rid in pane.state["requests"]:
                assert rid in pane.text

    run(scenario, trace, run_checks=False)


def test_a_worker_that_fails_shows_its_error_and_the_app_stays_usable():
    # A worker the Session cannot start: its TraceError, raised on the worker thread, reaches
    # the pane through the app's one error handler. (The real vLLM worker fails the same way
    # where it cannot start, after starting an engine: too slow for this suite.)
    async def scenario(app, pilot):
        await pilot.press("w")
        pane = app.query_one("WorkerPane")
        await until(pilot, lambda: pane.error is not None)
        assert "unknown worker 'no-such-worker'" in pane.text
        await pilot.press("d", "j")
        await until(pilot, lambda: ready(app) and app.steps.cursor == 1)
        await pilot.press("w")
        assert "unknown worker" in pane.text

    run(scenario, SAMPLES / "mixed", worker="no-such-worker", run_checks=False)


def test_sql_prompt_shows_the_same_rows_as_the_sql_command():
    trace = SAMPLES / "mixed"
    query = "SELECT req_id, intro_step, finished_step FROM lifeline ORDER BY intro_step, req_id"
    r = runner.invoke(cli, ["sql", str(trace), query, "-f", "json"])
    expected = [[str(v) if v is not None else "NULL" for v in row.values()]
                for row in json.loads(r.stdout)]

    async def scenario(app, pilot):
        await pilot.press("s")
        await pilot.press(*query, "enter")
        await until(pilot, lambda: app.query_one("#sql-result").row_count == len(expected))
        grid = app.query_one("#sql-result")
        assert [["NULL" if c is None else str(c) for c in grid.get_row_at(i)]
                for i in range(grid.row_count)] == expected
        # a long result is there whole, drawn lazily from its Arrow table
        app.query_one("#sql-input").value = ("SELECT s.step, s.req_id, t.step AS t FROM "
                                             "scheduled s CROSS JOIN steps t ORDER BY ALL")
        await pilot.press("enter")
        sched, steps = table(trace, "scheduled"), table(trace, "steps")
        n = len(sched) * len(steps)
        await until(pilot, lambda: app.query_one("#sql-result").row_count == n)
        assert n > 10_000
        grid = app.query_one("#sql-result")
        last = (*max((r["step"], r["req_id"]) for r in sched), max(r["step"] for r in steps))
        assert tuple(grid.get_row_at(n - 1)) == last
        grid.focus()
        await pilot.press("ctrl+end")  # the last row, drawn when scrolled to
        await pilot.pause(0.1)
        assert grid.cursor_row == n - 1 and grid.scroll_offset.y >= n - grid.size.height
        await pilot.press("s")
        await pilot.press(*" nonsense", "enter")
        await until(pilot, lambda: "error" in str(app.query_one("#sql-status").render()))

    run(scenario, trace, run_checks=False)


def test_help_screen_lists_every_key():
    from vllm_contract.tui.keys import KEYS
    from vllm_contract.tui.screens import HelpScreen

    async def scenario(app, pilot):
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        from vllm_contract.tui.detail import plain
        from vllm_contract.tui.screens import help_table

        text = plain(help_table())
        assert app.screen.query_one("#help-keys").size.height > len(KEYS)
        for k in KEYS:
            assert k.description in text, k
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)

    run(scenario, SAMPLES / "mixed", run_checks=False)


def test_charts_show_the_trace_and_mark_the_cursor():
    trace = SAMPLES / "mixed"
    rows = table(trace, "steps")

    async def scenario(app, pilot):
        tokens = app.query_one("#chart-tokens")
        await until(pilot, lambda: bool(tokens.values))
        assert max(tokens.values) == max(r["total_num_scheduled_tokens"] for r in rows)
        assert max(app.query_one("#chart-kv").values) == max(r["kv_usage"] for r in rows)
        before = tokens.at
        await pilot.press("G")
        assert tokens.at > before and "┃" in str(tokens.render())

    run(scenario, trace, run_checks=False)


def test_start_at_a_step_or_a_finding():
    async def at_step(app, pilot):
        assert app.steps.step == 100

    run(at_step, SAMPLES / "mixed", step=100)

    async def at_finding(app, pilot):
        leak = next(f for f in app.findings if f.invariant == "finished.leaked")
        await until(pilot, lambda: app.steps.step == leak.step)

    run(at_finding, SAMPLES / "broken-leak", finding="finished.leaked")


def test_a_bad_trace_is_one_line_and_exit_2_before_the_app(tmp_path):
    (tmp_path / "file").write_text("x")
    for args in ([str(tmp_path / "missing")], [str(tmp_path / "file")],
                 [str(SAMPLES / "mixed"), "--engine", "nope"],
                 [str(SAMPLES / "mixed"), "--finding", "no.such_check"]):
        r = runner.invoke(cli, ["tui", *args])
        assert r.exit_code == 2, (args, r.output)
        assert r.stderr.count("\n") == 1 and r.stderr.startswith("vllm-contract: error: ")


def test_the_demo_recording_steps_through_its_preemption(demo_trace):
    pre = table(demo_trace, "preempted")
    assert pre, "the demo's workload preempts"
    step, rid = pre[0]["step"], pre[0]["req_id"]

    async def scenario(app, pilot):
        app.goto_step(step)
        await until(pilot, lambda: ready(app) and app.steps.step == step)
        assert rid in app.query_one("DetailPane").text
        app.follow(rid)
        pane = app.query_one("RequestPane")
        await until(pilot, lambda: pane.lifeline is not None)
        kinds = [e.event for e in pane.lifeline.events]
        assert "preempted" in kinds and "resumed" in kinds and "finished" in kinds[-2:] + [
            kinds[-1]]

    run(scenario, demo_trace)


def test_a_real_worker_that_cannot_start_shows_vllms_error_and_the_app_stays_usable(tiny_model):
    # The sample's manifest asks for a KV cache this engine cannot give: vLLM itself refuses
    # to start, on the worker thread; the pane says why and the other panes work on. The
    # model is the suite's own: the one the manifest names is a path of the machine that
    # recorded the sample (tests/layout/test_path_independence.py).
    async def scenario(app, pilot):
        await pilot.press("w")
        pane = app.query_one("WorkerPane")
        await until(pilot, lambda: pane.error is not None, timeout=180)
        assert "could not start a vLLM engine" in pane.text
        await pilot.press("d", "j")
        await until(pilot, lambda: ready(app) and app.steps.cursor == 1)
        await pilot.press("w")
        assert "could not start a vLLM engine" in pane.text and app.session is None

    run(scenario, SAMPLES / "mixed", worker="vllm", run_checks=False, model=tiny_model)


def test_a_real_worker_marks_an_altered_token_goes_back_and_cancels(demo_trace, tmp_path):
    """The demo's recording with one recorded token changed (an edit, named as such): the real
    worker replays the original token there, which the pane marks as a divergence."""
    from checking import alter_one_token

    step, rid, orig, altered = alter_one_token(demo_trace, tmp_path / "t")
    steps = sorted({r["step"] for r in table(tmp_path / "t", "steps")})
    recorded = {r["req_id"]: r["sampled_token_ids"]
                for r in table(tmp_path / "t", "model_outputs") if r["step"] == step}

    async def scenario(app, pilot):
        pane = app.query_one("WorkerPane")

        def at(i: int) -> bool:
            return pane.state is not None and pane.state["position"] == i + 1

        await pilot.press("w")
        await until(pilot, lambda: at(0), timeout=300)  # the engine is built first
        app.goto_step(step)
        i = steps.index(step)
        await until(pilot, lambda: at(i), timeout=120)
        mine = next(ln for ln in pane.text.splitlines() if f" {rid} " in ln and "|" in ln)
        assert mine.lstrip().startswith("≠")
        assert mine.split("|")[0].split(rid)[1].strip() == ", ".join(map(str, altered))
        assert mine.split("|")[1].strip() == ", ".join(map(str, orig))
        others = [ln for ln in pane.text.splitlines() if "|" in ln and "req_id" not in ln
                  and f" {rid} " not in ln]
        assert len(others) == len(recorded) - 1 and all(
            ln.lstrip().startswith(("=", "~")) for ln in others)
        assert f"divergences so far: 1, the first at step {step} req {rid}" in pane.text
        assert step in app.steps.marked
        # back one step: the real worker re-runs from the start, to the step before
        await pilot.press("k")
        await until(pilot, lambda: at(i - 1), timeout=120)
        assert "divergences so far: 0" in pane.text
        # a long replay (the whole trace, from the start: the steps after the altered one may
        # be too few to catch it running), cancelled while its progress shows; the app goes on
        await pilot.press("g")
        await until(pilot, lambda: at(0), timeout=120)
        # a fast machine replays the whole tiny trace between two looks: the worker's own
        # steps, unchanged, are spaced out here so that the replay can be caught running
        rw = app.session.worker.w
        real_step = rw.step
        rw.step = lambda: (time.sleep(0.005), real_step())[1]
        await pilot.press("G")
        await until(pilot, lambda: pane.has_class("replaying"), timeout=60)
        await pilot.press("escape")
        await until(pilot, lambda: "replay cancelled at position" in pane.status)
        assert app.session.position < len(steps)
        await pilot.press("g")
        await until(pilot, lambda: at(0), timeout=120)
        assert "divergences so far: 0" in pane.text

    run(scenario, tmp_path / "t", worker="vllm", run_checks=False)


# a cross join of 10^10 rows: minutes for DuckDB on this box, unless interrupted
LONG_QUERY = "SELECT SUM(a.range * b.range) AS s FROM range(100000) a, range(100000) b"


def test_a_newer_query_of_a_kind_interrupts_the_one_before():
    import threading

    from vllm_contract.tui.data import Interrupted, TraceData

    data = TraceData(SAMPLES / "mixed")
    outcome = {}

    def old():
        t = time.monotonic()
        try:
            data.sql(LONG_QUERY, kind="sql")
            outcome["old"] = "finished"
        except Interrupted:
            outcome["old"] = "interrupted"
        outcome["seconds"] = time.monotonic() - t

    try:
        th = threading.Thread(target=old)
        th.start()
        time.sleep(0.5)
        assert th.is_alive()
        # the newer query runs to its end; the older stops
        assert data.sql("SELECT 42 AS x", kind="sql")["x"][0].as_py() == 42
        th.join(30)
        assert outcome["old"] == "interrupted" and outcome["seconds"] < 30
        # a query of another kind, or a pooled one, is not touched by either
        th = threading.Thread(target=old)
        th.start()
        time.sleep(0.3)
        assert data.sql("SELECT 1 AS x", kind="detail")["x"][0].as_py() == 1
        assert th.is_alive()
        assert data.stop("sql") and not data.stop("sql")
        th.join(30)
        assert outcome["old"] == "interrupted"
        assert data._cursors == data._free  # the kinds' own cursors closed, the pool's kept
    finally:
        data.close()


def test_escape_interrupts_a_running_sql_query_and_the_prompt_goes_on():
    async def scenario(app, pilot):
        await pilot.press("s")
        app.query_one("#sql-input").value = LONG_QUERY
        await pilot.press("enter")
        status = app.query_one("#sql-status")
        await until(pilot, lambda: "running" in str(status.render()))
        await asyncio.sleep(0.5)
        t = time.monotonic()
        await pilot.press("escape")
        await until(pilot, lambda: not any(w.group == "sql" and w.is_running
                                           for w in app.workers), timeout=30)
        assert time.monotonic() - t < 30
        assert "cancelled" in str(status.render())
        assert not app._notifications  # interrupted is not an error
        await pilot.press("s")
        app.query_one("#sql-input").value = "SELECT 6 * 7 AS answer"
        await pilot.press("enter")
        await until(pilot, lambda: app.query_one("#sql-result").row_count == 1)
        assert app.query_one("#sql-result").get_row_at(0) == [42]

    run(scenario, SAMPLES / "mixed", run_checks=False)
