"""The app: the steps list beside the panes (detail, findings, request, worker, SQL), charts
below. Every query and every worker step runs in a thread worker that posts a typed message
back (tui/messages.py); errors of all of them go through one handler (on_worker_state_changed).
"""

from __future__ import annotations

import bisect
import gc
import threading
import time

from textual import work
from textual.app import App, ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Footer, Static, TabbedContent, TabPane
from textual.worker import Worker as ThreadWorker
from textual.worker import WorkerState, get_current_worker
from vllm_contract.errors import TraceError
from vllm_contract.findings import Finding
from vllm_contract.kinds import without_repeats
from vllm_contract.replay import Gateway, Session, worker_class
from vllm_contract.tui import checks, keys
from vllm_contract.tui import messages as m
from vllm_contract.tui.charts import Charts
from vllm_contract.tui.closing import Bodies, counted
from vllm_contract.tui.data import Interrupted, TraceData
from vllm_contract.tui.detail import DetailPane
from vllm_contract.tui.findings_pane import FindingsPane
from vllm_contract.tui.request_pane import RequestPane
from vllm_contract.tui.screens import GotoScreen, HelpScreen
from vllm_contract.tui.sql_pane import SqlPane
from vllm_contract.tui.steps import HEADER, StepList
from vllm_contract.tui.worker_pane import WorkerPane

# A held key moves many steps: only the step the cursor rests on is read in full (and the
# worker replayed to it); a key repeats about every 33 ms.
REST_DELAY = 0.06
FINDINGS_AHEAD = 3  # steps with a finding whose pages are fetched ahead of `n`
PROGRESS_EVERY = 0.05  # seconds between two progress messages of a replay


def _live() -> bool:
    """False once the worker running this was superseded or the app is closing."""
    return not get_current_worker().is_cancelled


class ContractApp(App):
    TITLE = "vllm-contract"
    BINDINGS = keys.bindings()
    CSS_PATH = "app.tcss"

    def __init__(self, data: TraceData, worker: str = "shadow", step: int | None = None,
                 finding: str | None = None, run_checks: bool = True,
                 model: str | None = None) -> None:
        super().__init__()
        self.data = data
        self.worker_kind = worker
        self.model = model  # a real worker's model, when not the one the manifest names
        self.start_step = step
        self.start_finding = finding
        self.run_checks = run_checks
        self.findings: list[Finding] = []  # the catalog's
        self.worker_findings: list[Finding] = []
        self.finding_steps: list[int] = []
        self.checked = False
        self.session: Session | None = None
        self.session_error: str | None = None
        self._session_lock = threading.Lock()
        self._rest_timer = None
        self._charts_asked = False
        self._check_gateway: Gateway | None = None
        self._check_lock = threading.Lock()  # the check gateway is never closed mid-interrupt
        self.bodies = Bodies()
        self.follow_req: str | None = None

    # -- layout -------------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        with Horizontal(id="main"):
            with Vertical(id="left"):
                yield Static(HEADER, id="list-header")
                yield StepList(id="steps")
            with TabbedContent(id="panes", initial="detail"):
                with TabPane("Detail [d]", id="detail"):
                    yield DetailPane(id="detail-pane")
                with TabPane("Findings [f]", id="findings"):
                    yield FindingsPane(id="findings-pane")
                with TabPane("Request [r]", id="request"):
                    yield RequestPane(id="request-pane")
                with TabPane("Worker [w]", id="worker"):
                    yield WorkerPane(id="worker-pane")
                with TabPane("SQL [s]", id="sql"):
                    yield SqlPane(self.data.gateway.views, id="sql-pane")
        yield Charts(id="charts")
        yield Static("", id="status")
        yield Footer()

    @property
    def steps(self) -> StepList:
        return self.query_one(StepList)

    def on_mount(self) -> None:
        self.sub_title = f"{self.data.root.name} · {self.data.engine}"
        self.steps.focus()
        self.status()
        self.load_steps()
        if self.run_checks:
            self.check_trace()

    def status(self, extra: str = "") -> None:
        n = len(self.steps.steps)
        found = (f"{len(self.all_findings())} finding(s)" if self.checked
                 else "checking…" if self.run_checks else "catalog not run")
        self.query_one("#status", Static).update(
            f"{self.data.root.name} · {self.data.engine} · {n} steps · {found} · "
            f"worker {self.worker_kind}" + (f" · {extra}" if extra else ""))

    def post(self, message) -> None:
        """Post from a worker thread, unless that worker was superseded."""
        if _live():
            self.post_message(message)

    # -- workers (threads; each posts one typed message back) --------------------------------
    @work(thread=True, exclusive=True, group="steps", exit_on_error=False)
    @counted
    def load_steps(self) -> None:
        self.post(m.StepsLoaded(self.data.load_steps()))

    @work(thread=True, exclusive=True, group="charts", exit_on_error=False)
    @counted
    def load_charts(self) -> None:
        self.post(m.ChartsLoaded(self.data.series()))

    @work(thread=True, exclusive=True, group="pages", exit_on_error=False)
    @counted
    def load_pages(self, starts: list[int]) -> None:
        """The pages in the order asked; a newer ask stops this one between two pages. A page
        read is posted even when superseded: it goes to the cache all the same."""
        for start in starts:
            if not _live():
                return
            self.post_message(m.PageLoaded(start, self.data.page(start)))

    @work(thread=True, exclusive=True, group="detail", exit_on_error=False)
    @counted
    def load_detail(self, step: int) -> None:
        detail = self.data.detail(step, cancelled=lambda: not _live())
        if detail is not None:
            self.post(m.DetailLoaded(detail))

    @work(thread=True, exclusive=True, group="findings", exit_on_error=False)
    @counted
    def check_trace(self) -> None:
        explained = checks.explanations()
        gw = Gateway(self.data.root)
        with self._check_lock:
            self._check_gateway = gw
        try:
            found = checks.findings(gw, self.data.engine, cancelled=lambda: not _live())
        finally:
            with self._check_lock:
                self._check_gateway = None
            gw.close()
        self.post(m.FindingsLoaded(found, explained))

    @work(thread=True, exclusive=True, group="search", exit_on_error=False)
    @counted
    def search(self, prefix: str) -> None:
        self.post(m.SearchDone(prefix, self.data.search(prefix)))

    @work(thread=True, exclusive=True, group="request", exit_on_error=False)
    @counted
    def load_lifeline(self, req_id: str) -> None:
        self.post(m.LifelineLoaded(self.data.lifeline(req_id)))

    @work(thread=True, exclusive=True, group="worker", exit_on_error=False)
    @counted
    def replay_to(self, position: int) -> None:
        me = get_current_worker()
        with self._session_lock:  # a superseded replay stops at its next step
            if not _live():
                return
            if self.session is None:
                try:
                    if worker_class(self.worker_kind).starting:
                        self.post(m.WorkerNote(worker_class(self.worker_kind).starting))
                    self.session = Session(self.data.root, worker=self.worker_kind,
                                           engine=self.data.engine, model=self.model)
                except BaseException as e:
                    self.session_error = str(e) if isinstance(e, TraceError) else (
                        f"{type(e).__name__}: {e}")
                    raise
            s = self.session
            # a worker without checkpoints (a real one: each step a model run) re-runs from the
            # start to go back
            slow = not type(s.worker).rewinds_cheaply and (position < s.position
                                                           or position - s.position > 1)
            what = ("re-running from the start" if position < s.position
                    else "replaying") + f" to step position {position}"
            last = [0.0]

            def progress(done: int, total: int) -> None:
                now = time.monotonic()
                if now - last[0] >= PROGRESS_EVERY or done == total:
                    last[0] = now
                    self.post(m.WorkerProgress(done, total, what))

            far = slow or abs(position - s.position) > 256
            ok = s.goto(position, progress=progress if far else None,
                        cancel=lambda: me.is_cancelled)
            if ok:
                self.post(m.WorkerReached(s.position, s.state(), s.findings, s.divergences,
                                          s.notes))

    @work(thread=True, exclusive=True, group="sql", exit_on_error=False)
    @counted
    def run_sql(self, query: str) -> None:
        t = time.perf_counter()
        self.post(m.SqlDone(query, self.data.sql(query, kind="sql"), time.perf_counter() - t))

    # -- the one handler for worker errors ----------------------------------------------------
    def on_worker_state_changed(self, event: ThreadWorker.StateChanged) -> None:
        if event.state != WorkerState.ERROR:
            return
        error = event.worker.error
        if isinstance(error, Interrupted):  # superseded, or stopped by the person: no error
            return
        text = str(error) if isinstance(error, TraceError) else f"{type(error).__name__}: {error}"
        group = event.worker.group
        # what a failed group leaves behind, beyond the notice every failure gets
        recover = {"worker": self._worker_failed, "pages": self._pages_failed,
                   "sql": self._sql_failed, "findings": self._check_failed}.get(group)
        if recover is not None:
            recover(text)
        self.notify(text, title=f"{group} failed", severity="error", timeout=8)
        self.status(f"{group}: {text}")

    def _worker_failed(self, text: str) -> None:
        self.query_one(WorkerPane).fail(text, started=self.session is not None)

    def _pages_failed(self, text: str) -> None:
        self.steps.asked = []  # asked again at the next move

    def _sql_failed(self, text: str) -> None:
        self.query_one(SqlPane).status(f"error: {text}")

    def _check_failed(self, text: str) -> None:
        self.checked = True
        self.query_one(FindingsPane).query_one("#why", Static).update(f"checking failed: {text}")

    # -- results ------------------------------------------------------------------------------
    def on_steps_loaded(self, msg: m.StepsLoaded) -> None:
        self.steps.set_steps(msg.steps, self.data.t0)
        self.status()
        if len(msg.steps) == 0:
            self.query_one(DetailPane).set_lines(["the engine has no steps"])
            return
        index = 0 if self.start_step is None else self.data.index_of(self.start_step)
        self.steps.go(index)
        if index == 0:  # the cursor did not change: no Moved message
            self.on_step_list_moved(StepList.Moved(0, int(msg.steps[0])))

    def on_step_list_need_pages(self, msg: StepList.NeedPages) -> None:
        self.load_pages(msg.starts)

    def on_page_loaded(self, msg: m.PageLoaded) -> None:
        lists = self.query(StepList)
        if not lists:  # a page read as the app closed: its screen is gone
            return
        lists.first().add_page(msg.start, msg.rows)
        if not self._charts_asked:  # after the first page: the charts' scan would delay it
            self._charts_asked = True
            self.load_charts()
            # What exists now lives as long as the app: kept out of the collector's full
            # passes, each of which held the event loop (and the cursor) for a whole scan of
            # it (bench/RESULTS.md). Given back at unmount.
            gc.freeze()

    def on_step_list_moved(self, msg: StepList.Moved) -> None:
        self.query_one(Charts).point(msg.step)
        self.steps.prefetch(*self._finding_rows(msg.step))
        if self._rest_timer is not None:
            self._rest_timer.stop()
        self._rest_timer = self.set_timer(REST_DELAY, lambda: self._rested(msg.step))

    def _rested(self, step: int) -> None:
        """The cursor stopped on `step`: read it in full, and replay the worker to it."""
        if not self.is_running or step != self.steps.step:  # the timer outlived the app
            return
        self.load_detail(step)
        if self.query_one(TabbedContent).active == "worker":
            self.sync_worker()

    def _finding_rows(self, step: int) -> list[int]:
        """The rows `n` and `N` reach from `step`: the next FINDINGS_AHEAD steps with a
        finding, nearest first, then the previous one (a repeated `n` stays ahead of reads)."""
        fs = self.finding_steps
        if not fs:
            return []
        i = bisect.bisect_right(fs, step)
        j = bisect.bisect_left(fs, step)
        ks = [*range(i, i + FINDINGS_AHEAD), j - 1]
        return [self.data.index_of(fs[k]) for k in ks if 0 <= k < len(fs)]

    def on_detail_loaded(self, msg: m.DetailLoaded) -> None:
        if msg.detail.step != self.steps.step:
            return
        here = [f for f in self.all_findings() if f.step == msg.detail.step]
        self.query_one(DetailPane).show(msg.detail, here)

    def on_charts_loaded(self, msg: m.ChartsLoaded) -> None:
        charts = self.query_one(Charts)
        charts.load(msg.series)
        if self.steps.step is not None:
            charts.point(self.steps.step)

    def on_findings_loaded(self, msg: m.FindingsLoaded) -> None:
        self.findings, self.checked = msg.findings, True
        self.query_one(FindingsPane).load(msg.findings, msg.explanations)
        self._remark()
        if self.start_finding is not None:
            self._jump_to_named(self.start_finding)
        pane = self.query_one(DetailPane)
        if pane.detail is not None:
            pane.show(pane.detail, [f for f in self.all_findings()
                                    if f.step == pane.detail.step])

    def all_findings(self) -> list[Finding]:
        """The catalog's and the worker's, less the worker's that repeat a catalog finding
        (as `check --worker` reports them)."""
        return without_repeats(self.findings, self.worker_findings, key=checks.in_pane)

    def _remark(self) -> None:
        steps = {f.step for f in self.all_findings() if f.step is not None}
        self.finding_steps = sorted(steps)
        self.steps.mark(steps)
        self.status()

    def _jump_to_named(self, name: str) -> None:
        pick = None
        if name.isdigit() and 1 <= int(name) <= len(self.findings):
            pick = self.findings[int(name) - 1]
        else:
            pick = next((f for f in self.findings if f.invariant == name), None)
        if pick is None:
            self.notify(f"no finding {name!r} in this trace", severity="warning")
        else:
            self.jump(pick)

    def jump(self, f: Finding) -> None:
        if f.step is not None:
            self.steps.go(self.data.index_of(f.step))
        if f.req_id:
            self.follow(f.req_id)

    def follow(self, req_id: str) -> None:
        self.follow_req = req_id
        self.load_lifeline(req_id)

    def on_search_done(self, msg: m.SearchDone) -> None:
        self.query_one(RequestPane).show_matches(msg.prefix, msg.ids)

    def on_lifeline_loaded(self, msg: m.LifelineLoaded) -> None:
        self.query_one(RequestPane).show_lifeline(msg.lifeline)

    def on_worker_progress(self, msg: m.WorkerProgress) -> None:
        self.query_one(WorkerPane).progress(msg.done, msg.total, msg.what)

    def on_worker_note(self, msg: m.WorkerNote) -> None:
        self.query_one(WorkerPane).note(msg.text)

    def on_worker_reached(self, msg: m.WorkerReached) -> None:
        self.worker_findings = msg.findings + [d.finding(self.data.engine)
                                               for d in msg.divergences]
        self.query_one(WorkerPane).show(msg.state, msg.findings, msg.divergences, msg.notes,
                                        type(self.session.worker),
                                        self.query_one(DetailPane).unfolded)
        self._remark()

    async def on_sql_done(self, msg: m.SqlDone) -> None:
        await self.query_one(SqlPane).show(msg.table, msg.seconds)

    # -- pane events --------------------------------------------------------------------------
    def on_findings_pane_jump(self, msg: FindingsPane.Jump) -> None:
        self.jump(msg.finding)
        self.steps.focus()

    def on_request_pane_search(self, msg: RequestPane.Search) -> None:
        self.search(msg.prefix)

    def on_request_pane_follow(self, msg: RequestPane.Follow) -> None:
        self.follow(msg.req_id)

    def on_request_pane_jump_to(self, msg: RequestPane.JumpTo) -> None:
        self.steps.go(self.data.index_of(msg.step))

    def on_sql_pane_run(self, msg: SqlPane.Run) -> None:
        self.run_sql(msg.query)

    def on_tabbed_content_tab_activated(self, event: TabbedContent.TabActivated) -> None:
        if event.pane.id == "worker":
            self.sync_worker()

    def sync_worker(self) -> None:
        """Replay the worker to just after the cursor's step (or show why it cannot)."""
        pane = self.query_one(WorkerPane)
        if self.session_error is not None:
            pane.fail(self.session_error, started=False)
            return
        if self.steps.step is not None:
            self.replay_to(self.steps.cursor + 1)

    # -- actions (keys.py binds them) ---------------------------------------------------------
    def action_move(self, delta: int) -> None:
        self.steps.go(self.steps.cursor + delta)

    def action_page(self, delta: int) -> None:
        self.steps.go(self.steps.cursor + delta * max(1, self.steps.size.height - 1))

    def action_first(self) -> None:
        self.steps.go(0)

    def action_last(self) -> None:
        self.steps.go(len(self.steps.steps) - 1)

    def action_goto_prompt(self) -> None:
        def done(step: int | None) -> None:
            if step is not None:
                self.goto_step(step)
        self.push_screen(GotoScreen(), done)

    def goto_step(self, step: int) -> None:
        if len(self.steps.steps):
            self.steps.go(self.data.index_of(step))

    def action_finding(self, direction: int) -> None:
        here = self.steps.step
        if here is None or not self.finding_steps:
            self.notify("no findings" if self.checked else "still checking the trace")
            return
        if direction > 0:
            i = bisect.bisect_right(self.finding_steps, here)
            target = self.finding_steps[i] if i < len(self.finding_steps) else None
        else:
            i = bisect.bisect_left(self.finding_steps, here)
            target = self.finding_steps[i - 1] if i > 0 else None
        if target is None:
            self.notify("no further finding")
        else:
            self.goto_step(target)

    def action_show(self, pane: str) -> None:
        self.query_one(TabbedContent).active = pane
        focus = {"findings": "#findings-table", "request": "#search", "sql": "#sql-input"}
        if pane in focus:
            self.query_one(focus[pane]).focus()
        else:
            self.steps.focus()

    def action_search(self) -> None:
        self.action_show("request")

    def action_follow(self) -> None:
        d = self.query_one(DetailPane).detail
        if d is not None and d.scheduled:
            self.follow(d.scheduled[0]["req_id"])
            self.action_show("request")
            self.steps.focus()

    def action_fold(self) -> None:
        self.query_one(DetailPane).toggle_fold()

    def action_cancel(self) -> None:
        pane = self.query_one(WorkerPane)
        if any(w.group == "worker" and w.is_running for w in self.workers):
            self.workers.cancel_group(self, "worker")
            s = self.session
            pane.note("replay cancelled" + (f" at position {s.position}" if s else "")
                      + ": moving the cursor or `w` replays again")
        if self.data.stop("sql"):
            self.query_one(SqlPane).status("query cancelled")
        self.steps.focus()

    def action_help(self) -> None:
        self.push_screen(HelpScreen())

    async def action_quit(self) -> None:
        # the work in flight stops first: its queries hold the cores that the app's own
        # shutdown needs; unmount then waits for their threads (tui/closing.py)
        self.workers.cancel_all()
        self.bodies.refuse()
        self.interrupt()
        await super().action_quit()

    async def on_unmount(self) -> None:
        gc.unfreeze()
        if self._rest_timer is not None:
            self._rest_timer.stop()
        self.workers.cancel_all()
        # the caller closes the trace's connections once the app returns: no body may be
        # left in a query by then (tui/closing.py)
        await self.bodies.stop(self.interrupt)

    def interrupt(self) -> None:
        """Interrupt every DuckDB query in flight: the app's cursors' and the checks'."""
        self.data.interrupt()
        with self._check_lock:
            if self._check_gateway is not None:
                self._check_gateway.interrupt()
