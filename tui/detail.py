"""The selected step in full: each scheduled request, the ids finished, preempted and freed,
queue lengths and KV usage, the model output. Long lists fold to their first items and a count."""

from __future__ import annotations

import io

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text
from textual.containers import VerticalScroll
from textual.widgets import Static
from vllm_contract.findings import Finding
from vllm_contract.tui.data import StepDetail

FOLD = 8  # items of a list shown while folded
FOLD_ROWS = 40  # scheduled requests shown while folded


def fold(items, unfolded: bool, keep: int = FOLD) -> str:
    if items is None:
        return "-"
    items = list(items)
    if unfolded or len(items) <= keep:
        return ", ".join(map(str, items)) or "-"
    return ", ".join(map(str, items[:keep])) + f", … (+{len(items) - keep} more, {len(items)})"


def blocks(ids, unfolded: bool) -> str:
    """new_block_ids: one list per KV cache group."""
    if ids is None:
        return "-"
    return " ".join(f"g{g}:[{fold(group, unfolded)}]" for g, group in enumerate(ids))


def render(d: StepDetail, findings: list[Finding], unfolded: bool) -> Group:
    r = d.row
    head = Text(f"step {d.step}", style="bold")
    if r:
        head.append(f"   tokens {r.get('total_num_scheduled_tokens')}   new {r.get('num_new')}"
                    f"   cached {r.get('num_cached')}   running {r.get('num_running')}"
                    f"   waiting {r.get('num_waiting')}   kv usage "
                    f"{'-' if r.get('kv_usage') is None else format(r['kv_usage'], '.1%')}"
                    f"   schedule() {(r.get('schedule_ns') or 0) / 1e6:.2f} ms")
    parts: list = [head]
    for f in findings:
        parts.append(Text(f"● {f.severity} {f.invariant}"
                          + (f" req {f.req_id}" if f.req_id else "") + f": {f.message}",
                          style="red" if f.severity == "error" else "yellow"))
    outputs = {o["req_id"]: o for o in d.outputs}
    table = Table(title=f"scheduled requests ({len(d.scheduled)})", expand=True,
                  title_justify="left", show_lines=False)
    for col in ("req_id", "kind", "sched", "computed", "output", "new blocks", "spec",
                "encoder", "sampled"):
        table.add_column(col, overflow="fold")
    shown = d.scheduled if unfolded else d.scheduled[:FOLD_ROWS]
    for s in shown:
        req = d.requests.get(s["req_id"])
        kind = s["kind"] or "(dict key only)"
        if req is not None:
            kind += f" prompt {req['prompt_len']}"
        out = outputs.get(s["req_id"])
        table.add_row(s["req_id"], kind, _n(s["num_scheduled_tokens"]),
                      _n(s["num_computed_tokens"]), _n(s["num_output_tokens"]),
                      blocks(s["new_block_ids"], unfolded), fold(s["spec_token_ids"], unfolded),
                      fold(s["encoder_inputs"], unfolded),
                      fold(out["sampled_token_ids"], unfolded) if out else "-")
    parts.append(table)
    if len(shown) < len(d.scheduled):
        parts.append(Text(f"… {len(d.scheduled) - len(shown)} more requests (z unfolds)",
                          style="dim"))
    for name, ids in (("finished_req_ids", d.finished), ("preempted_req_ids", d.preempted),
                      ("free_encoder_mm_hashes", d.freed_mm)):
        parts.append(Text(f"{name} ({len(ids)}): {fold(ids, unfolded)}"))
    unscheduled = [o for o in d.outputs if o["req_id"] not in {s["req_id"] for s in d.scheduled}]
    parts.append(Text(f"model output: {len(d.outputs)} request(s)"
                      + (f", {len(unscheduled)} not scheduled in this step" if unscheduled else "")))
    return Group(*parts)


def _n(v) -> str:
    return "-" if v is None else str(v)


def plain(renderable, width: int = 200) -> str:
    console = Console(width=width, record=True, file=io.StringIO(), color_system=None)
    console.print(renderable)
    return console.export_text()


class DetailPane(VerticalScroll):
    DEFAULT_CSS = "DetailPane { height: 1fr; }"

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.detail: StepDetail | None = None
        self.findings: list[Finding] = []
        self.unfolded = False
        self.renderable = Text("loading…")

    def compose(self):
        yield Static(self.renderable, id="detail-body")

    def show(self, detail: StepDetail | None, findings: list[Finding]) -> None:
        self.detail, self.findings = detail, findings
        self._draw()

    def toggle_fold(self) -> None:
        self.unfolded = not self.unfolded
        self._draw()

    def _draw(self) -> None:
        if self.detail is None:
            return
        self.renderable = render(self.detail, self.findings, self.unfolded)
        self.query_one("#detail-body", Static).update(self.renderable)

    @property
    def text(self) -> str:
        return plain(self.renderable)
