"""The shadow worker over one engine of a trace (ShadowModel): stepping, forward and back
through checkpoints, and the state as plain data; and a whole trace through it (run_shadow)."""

from __future__ import annotations

from typing import Callable

from vllm_contract.findings import Finding, by_step
from vllm_contract.replay.worker.shadow.fast import FastModel
from vllm_contract.replay.worker.shadow.state import Checkpoints

# A run forward restores a checkpoint ahead of it instead of stepping when it saves this many
# steps or more.
JUMP_STEPS = 64


class ShadowModel(FastModel):
    """The shadow worker over one engine of a trace. `step()` applies the next recorded step;
    `finish()` adds what only the end of the trace tells (state never freed).

    Most steps of a long run change little: the batch stays, a few requests come and go, a few
    get blocks. Those steps take a fast path that touches only what changes, from columns a
    chunk of steps at a time prepares with numpy; any step that could report more than a shared
    block or an output mismatch, or whose batch is not as the fast path expects, takes the full
    path, which follows `_update_states` row by row."""

    def __init__(self, engine, strict_order: bool = False, checkpoint_every: int = 256) -> None:
        super().__init__(engine, strict_order)
        self.checkpoint_every = max(1, checkpoint_every)
        # the findings of the furthest position reached: every checkpoint's are a prefix
        self._reach = (0, self.s.findings)
        self._cps = Checkpoints(self.checkpoint_every)
        self._store(0)

    @property
    def finished(self) -> bool:
        """finish() has reported the end-of-trace findings (undone by going back)."""
        return self._finished

    def run(self, until: int | None = None, progress: Callable[[int, int], None] | None = None,
            cancel: Callable[[], bool] | None = None) -> bool:
        """Apply steps up to index `until` (exclusive; default all, then finish()); False if
        cancelled. A checkpoint already taken on the way is restored instead of stepping."""
        end = len(self.steps) if until is None else min(until, len(self.steps))
        total = end
        if self._jump(end) and progress is not None and self.s.pos == end:
            progress(end, total)
        while self.s.pos < end:
            if cancel is not None and self.s.pos % 64 == 0 and cancel():
                return False
            self.step()
            if progress is not None and (self.s.pos % 256 == 0 or self.s.pos == end):
                progress(self.s.pos, total)
        if until is None:
            self.finish()
        return True

    def goto(self, pos: int) -> None:
        """State before step index `pos`: the nearest checkpoint at or below it, then replay."""
        pos = max(0, min(pos, len(self.steps)))
        if pos < self.s.pos or self._finished:
            self._restore(self._cps.last(pos))
        self._jump(pos)
        while self.s.pos < pos:
            self.step()

    def _jump(self, end: int) -> bool:
        """Restore the last checkpoint at or before `end` if it is well ahead."""
        at = self._cps.last(end)
        if at is not None and at >= self.s.pos + JUMP_STEPS and not self._finished:
            self._restore(at)
            return True
        return False

    def _restore(self, at: int) -> None:
        self.s = self._cps.restore(at, self._reach[1])
        self._finished = False

    def _store(self, at: int) -> None:
        self._sync()
        self._cps.store(at, self.s)

    def step(self) -> list[Finding]:
        """Apply the next recorded step, in _update_states' order; returns its findings."""
        s = self.s
        before = len(s.findings)
        if s.fast_ok:
            k = s.pos
            ch = self._chunk_at
            if not ch.k0 <= k < ch.k1:
                ch = self._chunk(k)
            if not ch.slow[k - ch.k0] and self._fast(ch, k - ch.k0, before):
                return self._stepped(before)
        self._slow(before)
        return self._stepped(before)

    def _stepped(self, before: int) -> list[Finding]:
        s = self.s
        s.pos += 1
        if s.pos > self._reach[0]:
            self._reach = (s.pos, s.findings)
        cps = self._cps
        if s.pos % cps.every == 0 and s.pos not in cps.packed:
            self._store(s.pos)
        return s.findings[before:]

    def state(self) -> dict:
        """The worker's state before step index `pos`, as plain data."""
        self._sync()
        s = self.s
        return {
            "engine": self.engine,
            "position": s.pos,
            "next_step": self.steps[s.pos] if s.pos < len(self.steps) else None,
            "requests": {rid: r.plain() for rid, r in sorted(s.requests.items())},
            "batch": [r for r in s.slots if r is not None],
            "encoder_cache": sorted(s.encoder),
            "block_holders": {f"{g}:{b}": sorted(h) for (g, b), h in sorted(s.holders.items())},
        }


def run_shadow(trace, strict_order: bool = False,
               progress: Callable[[int, int], None] | None = None,
               cancel: Callable[[], bool] | None = None) -> list[Finding]:
    """Every engine of a trace through the shadow worker; its findings, sorted by step."""
    out: list[Finding] = []
    for engine in trace.engines:
        w = ShadowModel(engine, strict_order=strict_order)
        if not w.run(progress=progress, cancel=cancel):
            break
        out.extend(w.findings)
    out.sort(key=by_step)
    return out
