"""The recorded input log (tables `inputs` and `added`, trace format 3), as calls a re-run
makes (vLLM-free): each placed after the schedule() of its `step` and its `updates`-th
update_from_output(), in `seq` order.

A trace of an older format has no log: inputs.py derives the calls from the outputs instead.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from vllm_contract import schema

NOTE = ("inputs from the recorded input log: add_request() with the recorded Request fields "
        "(arrival times, priorities, cache salts), aborts with their status, drafts, each in "
        "its recorded place among the scheduler's calls")


def has_log(engine) -> bool:
    m = engine.manifest
    return bool(m.get("input_log")) and (m.get("format_version") or 0) >= schema.INPUTS_FORMAT


@dataclass(frozen=True)
class Entry:
    """One recorded input call: where it goes, and what it is (a Call for run.py)."""
    step: int
    updates: int
    seq: int
    call: Any


class Added:
    """The `added` rows, kept in Arrow and read one at a time as the re-run adds them;
    `t_ns`: when each add_request() returned (seq -> the recorder's clock)."""

    def __init__(self, table: pa.Table, t_ns: dict[int, int] | None = None) -> None:
        self.table = table.take(pc.sort_indices(table, [("seq", "ascending")]))
        self.index = {s: i for i, s in enumerate(self.table["seq"].to_pylist())}
        self.t_ns = t_ns or {}

    def req_id(self, seq: int) -> str:
        return self.table["req_id"][self.index[seq]].as_py()

    def incarnation_at(self, req_id: str, seq: int) -> int:
        """Which incarnation of req_id a call at `seq` concerns: its adds before it, less one."""
        ids, seqs = self.table["req_id"].to_pylist(), self.table["seq"].to_pylist()
        return sum(1 for r, s in zip(ids, seqs) if r == req_id and s < seq) - 1

    def arrival_steps(self, mode: str, step_t_ns: list[int]) -> dict[int, list[int]]:
        """step -> the seqs of the adds that arrive just before it in a what-if run. "step":
        the step after the one the recording added it after. "time": the first step whose
        virtual time has reached its arrival time, virtual time being the recorded schedule()
        times (`step_t_ns`, from the first step), continued past the recording by its median
        step; arrival times are put on the recorder's clock by the smallest lag between a
        request's arrival time and its add_request()."""
        seqs = self.table["seq"].to_pylist()
        steps = self.table["step"].to_pylist()
        out: dict[int, list[int]] = {}
        if mode == "step":
            for seq, step in zip(seqs, steps):
                out.setdefault(step + 1, []).append(seq)
            return out
        import bisect

        arrivals = self.table["arrival_time"].to_pylist()
        known = [(a, seq) for a, seq in zip(arrivals, seqs) if a is not None]
        if not known or not step_t_ns:
            return self.arrival_steps("step", step_t_ns)
        # onto the recorder's clock by the smallest lag from arrival to add_request(): the
        # request that reached the scheduler soonest arrived as it was added
        shift = min(self.t_ns[seq] - a * 1e9 for a, seq in known if seq in self.t_ns)
        gaps = sorted(b - a for a, b in zip(step_t_ns, step_t_ns[1:])) or [1]
        median = max(1, gaps[len(gaps) // 2])
        for a, seq, step in zip(arrivals, seqs, steps):
            if a is None:
                out.setdefault(step + 1, []).append(seq)
                continue
            t = a * 1e9 + shift
            k = bisect.bisect_left(step_t_ns, t)
            if k == len(step_t_ns):
                k += int((t - step_t_ns[-1]) // median)
            out.setdefault(k, []).append(seq)
        return out

    def row(self, seq: int) -> dict:
        return self.table.slice(self.index[seq], 1).to_pylist()[0]

    def incarnations(self) -> dict[str, list[int]]:
        """req_id -> the first step each of its adds could be scheduled at (one past the
        step it was added after), in order: the n-th is its n-th incarnation's."""
        out: dict[str, list[int]] = {}
        for rid, step in zip(self.table["req_id"].to_pylist(), self.table["step"].to_pylist()):
            out.setdefault(rid, []).append(step + 1)
        return out



def read(engine, call_of) -> tuple[list[Entry], Added, dict[int, tuple[list, dict]]]:
    """(the input calls in seq order, the added rows, schedule() arguments by the step from
    which they hold). `call_of(kind, step, req_id=None, status=None, data=None)` makes a
    Call (an abort's data: its seq)."""
    rows = engine.read("inputs")
    rows = rows.take(pc.sort_indices(rows, [("seq", "ascending"), ("pos", "ascending")]))
    adds = rows.filter(pc.fill_null(pc.equal(rows["call"], "add_request"), False))
    added = Added(engine.read("added"), dict(zip(adds["seq"].to_pylist(),
                                                 adds["t_ns"].to_pylist())))
    entries: list[Entry] = []
    args: dict[int, tuple[list, dict]] = {}
    drafts: dict[int, list] = {}  # seq -> [step, updates, call, req_ids, lists, step of output]
    for r in rows.to_pylist():
        call, step, seq = r["call"], r["step"], r["seq"]
        if call == "add_request":
            entries.append(Entry(step, r["updates"], seq,
                                 call_of("add", step, r["req_id"], data=seq)))
        elif call == "finish_requests":
            if r["req_id"] is not None and r["finished"]:
                # one id a call, in the order vLLM took them: with several, finish_requests
                # frees them in set order, and the block ids handed out next follow it
                entries.append(Entry(step, r["updates"], seq,
                                     call_of("abort", step, r["req_id"], r["status"],
                                             data=seq)))
        elif call == "schedule":
            a = json.loads(r["args_json"] or "{}")
            args[step] = (list(a.get("args") or []), dict(a.get("kwargs") or {}))
        else:
            d = drafts.get(seq)
            if d is None:
                into = json.loads(r["args_json"] or "{}").get("scheduler_output_step")
                d = drafts[seq] = [step, r["updates"], call, [], [], into]
            if r["req_id"] is not None:
                d[3].append(r["req_id"])
                d[4].append(list(r["token_ids"] or []))
    for seq, (step, updates, call, req_ids, lists, into) in drafts.items():
        kind = "drafts" if call == "update_draft_token_ids" else "drafts_in_output"
        entries.append(Entry(step, updates, seq,
                             call_of(kind, step, data=(req_ids, lists, into))))
    entries.sort(key=lambda e: e.seq)
    return entries, added, args
