"""`info`: what a trace holds, and whether it can be trusted, as plain data."""

from __future__ import annotations

from typing import TYPE_CHECKING

from vllm_contract import schema
from vllm_contract.errors import TraceError
from vllm_contract.manifest import mid_stream_note
from vllm_contract.trace import Trace, reading

if TYPE_CHECKING:
    from vllm_contract.replay.query.base import QueryGateway

# The checks on the recording's own integrity whose findings `info` lists too: `info` and
# `check` then agree on them by construction (the same SQL).
INTEGRITY_CHECKS = ("trace.checksum", "trace.count_mismatch", "trace.duplicate_rows",
                    "trace.impossible_steps", "trace.lost_rows", "trace.recorder_stopped",
                    "trace.unverified")


# For each update_from_output(): how many schedule() calls from its own step on had returned
# before it did. 1 means one batch at a time; 2 or more, batches overlapped (async scheduling,
# pipeline parallelism: step_with_batch_queue), so what an update tells the scheduler (finished
# ids, rejected drafts) reaches the worker a step or more later. Events ordered by t_ns.
_IN_FLIGHT = """
WITH s AS (
    SELECT step, t_ns, ROW_NUMBER() OVER (ORDER BY step) - 1 AS i FROM steps_
),
ev AS (
    SELECT t_ns, 1 AS is_schedule, CAST(NULL AS BIGINT) AS step FROM s
    UNION ALL
    SELECT t_ns, 0 AS is_schedule, step FROM updates_
),
seen AS (
    SELECT step, is_schedule,
           SUM(is_schedule) OVER (ORDER BY t_ns, is_schedule
                                  ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS returned
    FROM ev
)
SELECT MAX(n) AS most, COALESCE(SUM(CASE WHEN n > 1 THEN 1 ELSE 0 END), 0) AS overlapped
FROM (SELECT GREATEST(v.returned - s.i, 1) AS n
      FROM seen v JOIN s ON s.step = v.step
      WHERE v.is_schedule = 0) x
"""


# The steps' numbers, times and tokens at a glance. In DuckDB, which `info` has loaded already,
# not pyarrow.compute, whose import would be most of the cost of these few sums.
_STEP_STATS = """
SELECT MIN(step), MAX(step), COUNT(DISTINCT step), MIN(t_ns), MAX(t_ns),
       SUM(total_num_scheduled_tokens)
FROM steps_
"""


def _step_stats(steps, con) -> tuple:
    import duckdb

    try:
        con.register("steps_", steps)
        return con.sql(_STEP_STATS).fetchall()[0]
    except duckdb.Error as e:  # as _in_flight's
        raise TraceError(f"steps: {e}") from None


def _in_flight(updates, con) -> dict:
    """After _step_stats (steps_)."""
    import duckdb

    try:
        con.register("updates_", updates.select(["step", "t_ns"]))
        most, overlapped = con.sql(_IN_FLIGHT).fetchall()[0]
    except duckdb.Error as e:  # damaged times or steps (an overflow): the trace's fault
        raise TraceError(f"batches in flight: {e}") from None
    return {"most_in_flight": most, "overlapped_updates": int(overlapped)}


def engine_summary(e, checked: list[str] | None = None,
                   unverified: list[str] | None = None) -> dict:
    """`checked`: the integrity checks' error and warning findings for this engine, and
    `unverified` their notes of what cannot be verified, when a gateway ran them; without, the
    reader's own notes stand in."""
    import duckdb

    with reading(e.dir), duckdb.connect() as con:
        return _engine_summary(e, checked, con,
                               e.unverified() if unverified is None else unverified)


def _engine_summary(e, checked: list[str] | None, con, unverified: list[str]) -> dict:
    m = e.manifest
    # only the columns summed up here: reading every table of a long trace whole costs
    # memory and time in proportion to the whole trace
    steps = e.read("steps", ["step", "t_ns", "total_num_scheduled_tokens"])
    reqs = e.read("requests", ["req_id"])
    counts = {t: e.count(t) for t in schema.TABLE_NAMES}
    integrity = []
    stopped = m.get("stopped")
    if stopped:
        at = stopped.get("after_step")
        where = "before its first step" if at is None else f"after step {at}"
        integrity.append(f"recording stopped {where}: {stopped.get('error')}")
    elif not m.get("closed_cleanly"):
        live = e.recording
        integrity.append(
            f"still being recorded (the recorder, pid {m.get('pid')}, is alive): what is "
            "flushed so far" if live else
            f"not closed cleanly: the recording process (pid {m.get('pid')}) died"
            if live is False else
            "not closed cleanly (recorder still running, or the process died)")
    for err in m.get("recorder_errors", []):
        integrity.append(f"recorder error: {err.get('error')}")
    for w in m.get("compaction_warnings", []):
        integrity.append(f"compacted from a damaged segment: {w}")
    pruned = {tuple(seg["steps"]) for seg in m.get("pruned_segments", []) if seg.get("steps")}
    for a, b in m.get("dropped_steps", []):
        why = ("deleted: the trace reached its size cap" if (a, b) in pruned
               else "the writer fell behind")
        integrity.append(f"steps {a}..{b} dropped ({why})")
    if m.get("attached_mid_stream"):
        integrity.append(mid_stream_note(m))
    lo, hi, distinct, t_min, t_max, tokens = _step_stats(steps, con)
    if lo is not None:  # some step has a number
        expected = hi - lo + 1
        if expected != distinct:  # repeats are not steps
            integrity.append(f"{expected - distinct} step numbers missing between {lo} and {hi}")
    integrity += list(e.problems) + e.lost_rows() if checked is None else checked
    return {
        "engine": e.name,
        "path": str(e.dir),
        "format_version": m.get("format_version"),
        "vllm_version": m.get("vllm_version"),
        "host": m.get("host"), "pid": m.get("pid"), "dp_rank": m.get("dp_rank"),
        "model": (m.get("engine") or {}).get("model"),
        "settings": m.get("engine"),
        "steps": steps.num_rows,
        "requests": len(set(reqs["req_id"].to_pylist())),
        "tokens_scheduled": tokens or 0,
        **_in_flight(e.read("updates", ["step", "t_ns"]), con),
        "first_step_ns": t_min, "last_step_ns": t_max,
        "span_s": (t_max - t_min) / 1e9 if steps.num_rows else 0.0,
        "closed_cleanly": bool(m.get("closed_cleanly")),
        "rows": counts,
        "fields": m.get("fields"),
        "contract_drift": m.get("contract_drift"),
        "warnings": list(e.warnings),
        "integrity": integrity,
        "unverified": unverified,
    }


def summary(trace: Trace, gateway: QueryGateway | None = None) -> dict:
    """With a gateway over the same trace, the integrity checks' findings join each engine's
    integrity list (the reader's checksum notes among them)."""
    checked: dict[str, list[str]] | None = None
    if gateway is not None:
        from vllm_contract.replay.query import catalog, checker

        checks = [i for i in catalog.load() if i.id in INTEGRITY_CHECKS]
        checked = {e.name: [] for e in trace.engines}
        notes: dict[str, list[str]] = {e.name: [] for e in trace.engines}
        for f in checker.run(gateway, checks).findings:
            into = notes if f.severity == "info" else checked
            into.setdefault(str(f.engine), []).append(
                f.details if f.severity == "info"
                else f"{f.invariant}: {f.message}")
    return {"root": str(trace.root),
            "engines": [engine_summary(e, None if checked is None else checked[e.name],
                                       None if checked is None else notes[e.name])
                        for e in trace.engines]}
