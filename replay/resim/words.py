"""The first difference between two canonical SchedulerOutputs (canonical.py's form), in words:
which request, which field, what each side had. vLLM-free."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Difference:
    field: str
    request: str | None
    text: str  # "the recording scheduled p7 for 512 tokens; the re-run scheduled it for 256"


def _short(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 80 else text[:77] + "..."


def _scheduled(rec: dict, run: dict) -> Difference | None:
    for rid in list(rec) + [r for r in run if r not in rec]:
        a, b = rec.get(rid), run.get(rid)
        if a == b:
            continue
        if b is None:
            text = f"the recording scheduled {rid} for {a} tokens; the re-run did not schedule it"
        elif a is None:
            text = f"the re-run scheduled {rid} for {b} tokens; the recording did not schedule it"
        else:
            text = f"the recording scheduled {rid} for {a} tokens; the re-run scheduled it for {b}"
        return Difference("num_scheduled_tokens", rid, text)
    return None


def _per_request(what: str, field: str, rec: dict[str, dict], run: dict[str, dict]
                 ) -> Difference | None:
    for rid in list(rec) + [r for r in run if r not in rec]:
        a, b = rec.get(rid), run.get(rid)
        if a == b:
            continue
        if b is None or a is None:
            has, lacks = ("recording", "re-run") if b is None else ("re-run", "recording")
            return Difference(field, rid, f"the {has} sent {rid} as a {what}; the {lacks} did not")
        for k in list(a) + [k for k in b if k not in a]:
            if a.get(k) != b.get(k):
                return Difference(f"{field}.{k}", rid, f"the recording sent {what} {rid} with "
                                  f"{k} {_short(a.get(k))}; the re-run with {_short(b.get(k))}")
    return None


def _cached(plain: dict) -> dict[str, dict]:
    c = plain["scheduled_cached_reqs"]
    out = {}
    for i, rid in enumerate(c["req_ids"]):
        out[rid] = {"resumed": rid in c["resumed_req_ids"],
                    "new_block_ids": c["new_block_ids"][i],
                    "num_computed_tokens": c["num_computed_tokens"][i],
                    "num_output_tokens": c["num_output_tokens"][i],
                    "all_token_ids": (c.get("all_token_ids") or {}).get(rid)}
    return out


def _id_set(field: str, rec: Any, run: Any) -> Difference | None:
    if rec == run:
        return None
    if rec is None or run is None:
        return Difference(field, None, f"the recording's {field} is {_short(rec)}; the "
                          f"re-run's is {_short(run)}")
    a, b = set(rec), set(run)
    for rid in sorted(a - b):
        return Difference(field, rid, f"the recording's {field} has {rid}; the re-run's does not")
    for rid in sorted(b - a):
        return Difference(field, rid, f"the re-run's {field} has {rid}; the recording's does not")
    return Difference(field, None, f"the recording's {field} is {_short(rec)}; the re-run's "
                      f"is {_short(run)}")


def _per_id(field: str, rec: dict | None, run: dict | None) -> Difference | None:
    rec, run = rec or {}, run or {}
    for rid in list(rec) + [r for r in run if r not in rec]:
        a, b = rec.get(rid), run.get(rid)
        if a != b:
            return Difference(field, rid, f"the recording's {field} for {rid} is "
                              f"{_short(a) if a is not None else 'absent'}; the re-run's is "
                              f"{_short(b) if b is not None else 'absent'}")
    return None


def _generic(path: str, a: Any, b: Any) -> str | None:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in list(a) + [k for k in b if k not in a]:
            d = _generic(f"{path}.{k}", a.get(k), b.get(k))
            if d:
                return d
        return None
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            d = _generic(f"{path}[{i}]", x, y)
            if d:
                return d
        return None
    return None if a == b else path


_IDS = ("finished_req_ids", "preempted_req_ids")
_PER_ID = ("scheduled_spec_decode_tokens", "scheduled_encoder_inputs", "num_invalid_spec_tokens")
_DONE = ("num_scheduled_tokens", "scheduled_new_reqs", "scheduled_cached_reqs") + _IDS + _PER_ID


def first_difference(rec: dict, run: dict) -> Difference | None:
    """None when the two are equal; else the first difference, most telling fields first:
    tokens scheduled, then the requests sent, then the ids freed and preempted."""
    if rec == run:
        return None
    d = _scheduled(rec["num_scheduled_tokens"], run["num_scheduled_tokens"])
    d = d or _per_request("new request", "scheduled_new_reqs",
                          {r["req_id"]: r for r in rec["scheduled_new_reqs"]},
                          {r["req_id"]: r for r in run["scheduled_new_reqs"]})
    d = d or _per_request("cached request", "scheduled_cached_reqs", _cached(rec), _cached(run))
    for f in _IDS:
        d = d or _id_set(f, rec.get(f), run.get(f))
    for f in _PER_ID:
        d = d or _per_id(f, rec.get(f), run.get(f))
    if d:
        return d
    rest_a = {k: v for k, v in rec.items() if k not in _DONE}
    rest_b = {k: v for k, v in run.items() if k not in _DONE}
    # what is left: scalars, the order of lists the checks above read as sets or maps
    path = _generic("", rest_a, rest_b) or _generic("", rec, run) or ".?"
    field = path.lstrip(".")
    a, b = _at(rec, field), _at(run, field)
    return Difference(field, None, f"the recording's {field} is {_short(a)}; the re-run's is "
                      f"{_short(b)}")


def _at(obj: Any, path: str) -> Any:
    for part in path.replace("[", ".[").split("."):
        if not part:
            continue
        if part.startswith("["):
            obj = obj[int(part[1:-1])] if isinstance(obj, list) else None
        else:
            obj = obj.get(part) if isinstance(obj, dict) else None
    return obj


def finish_difference(rec: list[tuple[str, str]], run: list[tuple[str, str]]
                      ) -> Difference | None:
    """The finishes an update_from_output() reported (request, reason), each side sorted."""
    if rec == run:
        return None
    a, b = dict(rec), dict(run)
    for rid in sorted(set(a) | set(b)):
        if a.get(rid) == b.get(rid):
            continue
        if rid not in b:
            text = (f"the recording's update finished {rid} ({a[rid]}); the re-run's did not")
        elif rid not in a:
            text = (f"the re-run's update finished {rid} ({b[rid]}); the recording's did not")
        else:
            text = (f"the recording's update finished {rid} with {a[rid]}; the re-run's with "
                    f"{b[rid]}")
        return Difference("finished (update_from_output)", rid, text)
    return None
