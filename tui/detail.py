"""The selected step in full: each scheduled request, the ids finished, preempted and freed,
queue lengths and KV usage, the model output. Long lists fold to their first items and a count."""

from __future__ import annotations

import io

from rich.console import Console
from vllm_contract.findings import Finding
from vllm_contract.tui.data import StepDetail
from vllm_contract.tui.lines import BOLD, DIM, RED, YELLOW, Line, Lines

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


def render(d: StepDetail, findings: list[Finding], unfolded: bool) -> list[Line]:
    r = d.row
    head: list = [(f"step {d.step}", BOLD)]
    if r:
        head.append((f"   tokens {r.get('total_num_scheduled_tokens')}   new {r.get('num_new')}"
                     f"   cached {r.get('num_cached')}   running {r.get('num_running')}"
                     f"   waiting {r.get('num_waiting')}   kv usage "
                     f"{'-' if r.get('kv_usage') is None else format(r['kv_usage'], '.1%')}"
                     f"   schedule() {(r.get('schedule_ns') or 0) / 1e6:.2f} ms", ""))
    out: list[Line] = [head]
    for f in findings:
        out.append([(f"● {f.severity} {f.invariant}" + (f" req {f.req_id}" if f.req_id else "")
                     + f": {f.message}", RED if f.severity == "error" else YELLOW)])
    outputs = {o["req_id"]: o for o in d.outputs}
    shown = d.scheduled if unfolded else d.scheduled[:FOLD_ROWS]
    kinds = []
    for s in shown:
        req = d.requests.get(s["req_id"])
        kinds.append((s["kind"] or "(dict key only)")
                     + (f" prompt {req['prompt_len']}" if req is not None else ""))
    w_id = max([6] + [len(s["req_id"]) for s in shown])
    w_kind = max([4] + [len(k) for k in kinds])
    out += ["", [(f"scheduled requests ({len(d.scheduled)})", BOLD)],
            [(f" {'req_id':<{w_id}} {'kind':<{w_kind}} {'sched':>6} {'computed':>8} "
              f"{'output':>6}   new blocks · spec · encoder · sampled", DIM)]]
    for s, kind in zip(shown, kinds):
        o = outputs.get(s["req_id"])
        tail = [f"blocks {blocks(s['new_block_ids'], unfolded)}"
                if s["new_block_ids"] is not None else ""]
        if s["spec_token_ids"]:
            tail.append(f"spec [{fold(s['spec_token_ids'], unfolded)}]")
        if s["encoder_inputs"]:
            tail.append(f"encoder [{fold(s['encoder_inputs'], unfolded)}]")
        if o is not None:
            tail.append(f"sampled [{fold(o['sampled_token_ids'], unfolded)}]"
                        if o["sampled_token_ids"] else "sampled []")
        out.append(f" {s['req_id']:<{w_id}} {kind:<{w_kind}} {_n(s['num_scheduled_tokens']):>6} "
                   f"{_n(s['num_computed_tokens']):>8} {_n(s['num_output_tokens']):>6}   "
                   + "  ".join(t for t in tail if t))
    if len(shown) < len(d.scheduled):
        out.append([(f"… {len(d.scheduled) - len(shown)} more requests (z unfolds)", DIM)])
    out.append("")
    for name, ids in (("finished_req_ids", d.finished), ("preempted_req_ids", d.preempted),
                      ("free_encoder_mm_hashes", d.freed_mm)):
        out.append(f"{name} ({len(ids)}): {fold(ids, unfolded)}")
    scheduled = {s["req_id"] for s in d.scheduled}
    unscheduled = [o for o in d.outputs if o["req_id"] not in scheduled]
    out.append(f"model output: {len(d.outputs)} request(s)"
               + (f", {len(unscheduled)} not scheduled in this step" if unscheduled else ""))
    return out


def _n(v) -> str:
    return "-" if v is None else str(v)


def plain(renderable, width: int = 200) -> str:
    console = Console(width=width, record=True, file=io.StringIO(), color_system=None)
    console.print(renderable)
    return console.export_text()


class DetailPane(Lines):
    def __init__(self, **kw) -> None:
        super().__init__("loading…", **kw)
        self.detail: StepDetail | None = None
        self.findings: list[Finding] = []
        self.unfolded = False

    def show(self, detail: StepDetail | None, findings: list[Finding]) -> None:
        self.detail, self.findings = detail, findings
        self._draw()

    def toggle_fold(self) -> None:
        self.unfolded = not self.unfolded
        self._draw()

    def _draw(self) -> None:
        if self.detail is not None:
            self.set_lines(render(self.detail, self.findings, self.unfolded))
