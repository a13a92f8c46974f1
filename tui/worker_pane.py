"""The worker's state after the selected step, from the replay Session, in the view its class
fits (`compares_tokens`): a modelled worker state (render_model) or the tokens of a worker that
runs the model (render_tokens). The pane knows no worker by name."""

from __future__ import annotations

from textual.containers import Vertical
from textual.widgets import ProgressBar, Static
from vllm_contract.findings import Finding
from vllm_contract.tui.detail import blocks, fold
from vllm_contract.tui.lines import BOLD, DIM, RED, YELLOW, Line, Lines

NOT_SAME = "≠"  # marks a replayed token list that differs from the recorded one


def _findings(findings: list[Finding]) -> list[Line]:
    out: list[Line] = ["", [(f"worker findings so far ({len(findings)})", BOLD)]]
    for f in findings[-20:]:
        out.append([(f"● step {f.step} {f.invariant} {f.req_id or ''}: {f.message}",
                     RED if f.severity == "error" else YELLOW)])
    return out


def render_model(kind: str, state: dict, findings: list[Finding], unfolded: bool
                 ) -> list[Line]:
    """A worker that models vLLM's worker state (the shadow): its request cache, batch order,
    block tables and encoder cache."""
    reqs = state.get("requests", {})
    out: list[Line] = [
        [(f"{kind} worker at position {state.get('position')} "
          f"(next step {state.get('next_step')})", BOLD)],
        f"batch order ({len(state.get('batch', []))}): "
        f"{fold(state.get('batch', []), unfolded, 16)}", "",
        [(f"request cache ({len(reqs)})", BOLD)]]
    w_id = max([6] + [len(r) for r in reqs])
    out.append([(f" {'req_id':<{w_id}} {'prompt':>6} {'computed':>8} {'output':>6} "
                 f"{'introduced':>10} {'preempted':>9}   block table", DIM)])
    for rid, r in reqs.items():
        out.append(f" {rid:<{w_id}} {r.get('prompt_len')!s:>6} "
                   f"{r.get('num_computed_tokens')!s:>8} {r.get('num_output_tokens')!s:>6} "
                   f"{r.get('introduced_at')!s:>10} {'yes' if r.get('preempted') else '':>9}   "
                   f"{blocks(r.get('block_ids'), unfolded)}")
    out += ["", f"encoder cache ({len(state.get('encoder_cache', []))}): "
                f"{fold(state.get('encoder_cache', []), unfolded)}"]
    holders = state.get("block_holders", {})
    shared = {b: h for b, h in holders.items() if len(h) > 1}
    out.append(f"blocks held: {len(holders)}, by more than one request: {len(shared)}"
               + (f" ({fold([f'{b}:{h}' for b, h in shared.items()], unfolded)})"
                  if shared else ""))
    out.append([(f"tokens: the {kind} worker replays no tokens (no divergences)", DIM)])
    return out + _findings(findings)


def render_tokens(kind: str, state: dict, findings: list[Finding], divergences: list,
                  notes: list[str], unfolded: bool) -> list[Line]:
    """A worker that runs the model (a real vLLM worker): the requests it holds and the step's
    recorded against replayed tokens, divergences marked."""
    held = state.get("held", {})
    tokens = state.get("tokens", {})
    step = state.get("step")
    out: list[Line] = [[(f"{kind} worker at position {state.get('position')} "
                         f"(after step {'-' if step is None else step})", BOLD)]]
    for note in notes:
        out.append([(f"note: {note}", DIM)])
    first = divergences[0] if divergences else None
    out.append([(f"divergences so far: {len(divergences)}"
                 + (f", the first at step {first.step} req {first.req_id}" if first else ""),
                 RED if divergences else "")])
    ids = sorted(set(tokens) | set(held))
    w_id = max([6] + [len(r) for r in ids])
    out += ["", [(f"tokens of step {'-' if step is None else step}: recorded against "
                  f"replayed ({len(tokens)})", BOLD)],
            [(f"   {'req_id':<{w_id}}  recorded  |  replayed", DIM)]]
    for rid in sorted(tokens):
        t = tokens[rid]
        same = (t.get("recorded") or []) == (t.get("replayed") or [])
        mark, style = (("=", "") if same else (NOT_SAME, RED)) if t.get("comparable") else (
            "~", DIM)
        line = [(f" {mark} {rid:<{w_id}}  {fold(t.get('recorded'), unfolded)}  |  "
                 f"{fold(t.get('replayed'), unfolded)}", style)]
        if not t.get("comparable"):
            line.append(("  (not comparable: sampled without a seed)", DIM))
        out.append(line)
    out += ["", [(f"held by the worker ({len(held)})", BOLD)],
            [(f"   {'req_id':<{w_id}} {'computed':>8}   output tokens", DIM)]]
    for rid, h in held.items():
        out.append(f"   {rid:<{w_id}} {h.get('num_computed_tokens')!s:>8}   "
                   f"{fold(h.get('output_token_ids'), unfolded, 16)}")
    if divergences:
        out += ["", [(f"divergences ({len(divergences)})", BOLD)]]
        for d in divergences[-20:]:
            out.append([(f"{NOT_SAME} step {d.step} req {d.req_id}: recorded "
                         f"{fold(d.recorded, unfolded)}, replayed {fold(d.replayed, unfolded)}",
                         RED)])
    return out + _findings(findings)


class WorkerPane(Vertical):
    DEFAULT_CSS = """
    WorkerPane { height: 1fr; }
    WorkerPane #worker-status { height: auto; }
    WorkerPane ProgressBar { display: none; }
    WorkerPane.replaying ProgressBar { display: block; }
    """

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.state: dict | None = None
        self.error: str | None = None

    def compose(self):
        yield ProgressBar(id="worker-progress", show_eta=False)
        yield Static("", id="worker-status")
        yield Lines("the worker replays when this pane is shown", id="worker-body")

    def progress(self, done: int, total: int, what: str) -> None:
        self.add_class("replaying")
        self.query_one(ProgressBar).update(total=max(total, 1), progress=done)
        self.query_one("#worker-status", Static).update(
            f"{what}: {done}/{total} steps (Esc cancels)")

    def show(self, state: dict, findings: list[Finding], divergences: list, notes: list[str],
             worker: type, unfolded: bool) -> None:
        """`worker`: the Worker class, whose `compares_tokens` says which view fits."""
        self.remove_class("replaying")
        self.state, self.error = state, None
        self.query_one("#worker-status", Static).update("")
        self._set(render_tokens(worker.kind, state, findings, divergences, notes, unfolded)
                  if worker.compares_tokens else render_model(worker.kind, state, findings,
                                                               unfolded))

    def fail(self, error: str, started: bool) -> None:
        self.remove_class("replaying")
        self.error = error
        self.query_one("#worker-status", Static).update("")
        self._set([[(f"worker {'failed' if started else 'unavailable'}: {error}", RED)],
                   [(("moving the cursor replays to its step again" if started
                      else "the worker could not start") + "; the other panes work as before",
                     DIM)]])

    def note(self, text: str) -> None:
        """A line above the state (what the worker is doing), the state kept below it."""
        self.remove_class("replaying")
        self.query_one("#worker-status", Static).update(text)

    def _set(self, lines: list[Line]) -> None:
        self.query_one("#worker-body", Lines).set_lines(lines)

    @property
    def status(self) -> str:
        return str(self.query_one("#worker-status", Static).render())

    @property
    def text(self) -> str:
        return self.query_one("#worker-body", Lines).text
