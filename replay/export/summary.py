"""A trace's summary (replay/query/summary.py, with the views' row counts) in every format of
`info --format`."""

from __future__ import annotations

import json

from vllm_contract.replay.export.registry import Rendered, exporter
from vllm_contract.replay.export.text import json_doc

KIND = "info"


def _fmt_ns(ns: int | None) -> str:
    if ns is None:
        return "-"
    import datetime

    try:
        return datetime.datetime.fromtimestamp(ns / 1e9, datetime.timezone.utc).isoformat(
            timespec="seconds")
    except (OverflowError, ValueError, OSError):  # a damaged time, past year 9999
        return f"{ns} ns"


@exporter(KIND, "table")
def table(s: dict) -> Rendered:
    lines = []
    for e in s["engines"]:
        st = e["settings"] or {}
        lines.append(f"engine        {e['engine']}  ({e['path']})")
        lines.append(f"vLLM          {e['vllm_version']}   format v{e['format_version']}   "
                     f"host {e['host']} pid {e['pid']} dp_rank {e['dp_rank']}")
        lines.append(f"model         {e['model']}  dtype {st.get('dtype')}  block_size "
                     f"{st.get('block_size')}  kv_blocks {st.get('num_kv_blocks')}")
        lines.append(f"steps         {e['steps']}   requests {e['requests']}   tokens "
                     f"scheduled {e['tokens_scheduled']}")
        lines.append(f"time          {_fmt_ns(e['first_step_ns'])} .. "
                     f"{_fmt_ns(e['last_step_ns'])}  ({e['span_s']:.3f} s)")
        if e["most_in_flight"]:
            lines.append("batches       " + (
                "one at a time" if e["most_in_flight"] == 1 else
                f"up to {e['most_in_flight']} in flight ({e['overlapped_updates']} of "
                f"{e['rows']['updates']} updates came after the next schedule())"))
        lines.append("rows          " + "  ".join(f"{k}={v}" for k, v in e["rows"].items()))
        drift = (e["contract_drift"] or {}).get("unknown_fields") or {}
        lines.append(f"fields        {sum(len(v) for v in (e['fields'] or {}).values())} seen; "
                     f"drift: {json.dumps(drift) if drift else 'none'}")
        status = "OK" if not e["integrity"] and not e["warnings"] else "; ".join(
            e["integrity"] + [f"{len(e['warnings'])} segment warning(s)"] * bool(e["warnings"]))
        lines.append(f"integrity     {status}")
        for note in e.get("unverified") or []:
            lines.append(f"unverified    {note}")
        lines.append("")
    lines.append("views         " + "  ".join(f"{k}={v}" for k, v in s["views"].items()))
    return Rendered().out("".join(line + "\n" for line in lines))


@exporter(KIND, "json")
def as_json(s: dict) -> Rendered:
    return Rendered().out(json_doc(s, default=str))
