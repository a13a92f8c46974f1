"""The armed vLLM engines `ps` lists (recorder/control.py's discover()) in every format of
`ps --format`."""

from __future__ import annotations

from vllm_contract.replay.export.registry import Rendered, exporter
from vllm_contract.replay.export.text import json_doc

KIND = "ps"
NONE = ("vllm-contract: no armed vLLM engines (start vLLM with VLLM_CONTRACT_ARM=1, or "
        "VLLM_CONTRACT_TRACE_DIR=DIR to record from the start)")


def _age(t: float | None) -> str:
    import time

    if not t:
        return "-"
    s = int(time.time() - t)
    return f"{s // 86400}d{s % 86400 // 3600}h" if s >= 86400 else (
        f"{s // 3600}h{s % 3600 // 60}m" if s >= 3600 else f"{s // 60}m{s % 60}s")


@exporter(KIND, "table")
def table(procs: list[dict]) -> Rendered:
    if not procs:
        return Rendered().err(NONE + "\n")
    rows = [("PID", "PPID", "DP", "UP", "STATE", "STEPS", "MODEL", "TRACE")]
    for p in procs:
        for e in p["engines"]:
            state = e["state"]
            if state == "armed" and e.get("last") and e["last"].get("failed"):
                state = "armed (last recording failed)"
            rows.append((str(p["pid"]), str(p.get("ppid", "-")), str(e.get("dp_rank", "-")),
                         _age(e.get("armed_at")), state,
                         "-" if e.get("steps") is None else str(e["steps"]),
                         str(e.get("model") or "-"), e.get("trace") or "-"))
    # the last column, a path, is not padded: nothing follows it
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    return Rendered().out("".join("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  "
                                  + r[-1] + "\n" for r in rows))


@exporter(KIND, "json")
def as_json(procs: list[dict]) -> Rendered:
    return Rendered().out(json_doc(procs, default=str))
