"""What a timeline draws, read from a trace with the query layer (docs/timeline.md): per engine,
its steps with their counts and times, each request instance's phases as runs of steps
(waiting, prefill, decode, preempted), the instances packed into as few lanes as the peak
concurrency needs, and the catalog's findings. Exporters (perfetto.py) turn this into a file;
nothing here knows a file format."""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

import numpy as np

from vllm_contract.errors import TraceError

# counters drawn beside the steps: (name, unit, the steps column)
COUNTERS = (("tokens per step", "tokens", "tokens"), ("running", "requests", "num_running"),
            ("waiting", "requests", "num_waiting"), ("KV usage", "%", "kv_pct"),
            ("schedule() time", "us", "schedule_us"))


@dataclass
class Steps:
    """One engine's steps in [first, last], as numpy columns in step order."""
    step: np.ndarray
    start_ns: np.ndarray  # when its schedule() began (t_ns less its duration)
    end_ns: np.ndarray  # when the next step began (the last: its start plus a typical step)
    columns: dict[str, np.ndarray]  # tokens, num_new, num_cached, resumed, num_running, ...
    finished: dict[int, list[str]]  # step -> the ids in its finished_req_ids
    preempted: dict[int, list[str]]

    def __len__(self) -> int:
        return len(self.step)

    def ts(self, step: int) -> int:
        """Where `step` begins on the clock: a step not recorded, where the next recorded one
        does; past the last, where the last ends."""
        i = int(np.searchsorted(self.step, step))
        return int(self.end_ns[-1]) if i >= len(self.step) else int(self.start_ns[i])


@dataclass
class Request:
    """One request instance (an id from its introduction to the id's next one)."""
    req_id: str
    intro_step: int
    phases: list[tuple[str, int, int]] = field(default_factory=list)  # (phase, first, last)
    lane: int = -1
    # the step it could first be scheduled in: the one after its add_request() where the trace
    # has the input log, else its introduction (not cut to the range, unlike its phases)
    arrival: int | None = None
    # the step whose scheduled tokens reached the end of its prompt (computed + scheduled >=
    # prompt length): that step's forward pass samples its first token; None when no step of
    # the range did, or it arrived before the range
    first_token: int | None = None

    @property
    def first(self) -> int:
        return self.phases[0][1]

    @property
    def last(self) -> int:
        return self.phases[-1][2]


@dataclass
class Finding:
    invariant: str
    severity: str
    step: int | None
    req_id: str | None
    title: str
    details: str


@dataclass
class Engine:
    name: str
    steps: Steps
    requests: list[Request]
    lanes: int  # the peak number of requests live at once
    findings: list[Finding]
    lo: int = -(2 ** 62)  # the steps asked for (the recorded ones are in `steps`)
    hi: int = 2 ** 62


def pack(requests: list[Request]) -> int:
    """Give each request a lane: lanes never hold two requests at a step, and there are as
    many as the most requests live at one step (interval partitioning, by first step)."""
    free: list[int] = []  # lanes whose request has ended, reused lowest first
    busy: list[tuple[int, int]] = []  # (last step, lane)
    lanes = 0
    for r in sorted(requests, key=lambda r: (r.first, r.last)):
        while busy and busy[0][0] < r.first:
            heapq.heappush(free, heapq.heappop(busy)[1])
        if free:
            r.lane = heapq.heappop(free)
        else:
            r.lane, lanes = lanes, lanes + 1
        heapq.heappush(busy, (r.last, r.lane))
    return lanes


_STEPS_SQL = """
SELECT s.step, s.t_ns, s.schedule_ns, COALESCE(s.total_num_scheduled_tokens, 0) AS tokens,
       COALESCE(s.num_new, 0) AS num_new, COALESCE(s.num_cached, 0) AS num_cached,
       COALESCE(s.num_finished, 0) AS num_finished, COALESCE(s.num_running, 0) AS num_running,
       COALESCE(s.num_waiting, 0) AS num_waiting, COALESCE(s.kv_usage, 0) * 100 AS kv_pct,
       s.schedule_ns / 1000.0 AS schedule_us,
       COALESCE(r.resumed, 0) AS resumed
FROM steps s
LEFT JOIN (SELECT step, COUNT(*) AS resumed FROM scheduled
           WHERE engine = $engine AND kind = 'resumed' AND step BETWEEN $lo AND $hi
           GROUP BY step) r ON r.step = s.step
WHERE s.engine = $engine AND s.step BETWEEN $lo AND $hi
ORDER BY s.step
"""

# each listed row of a request instance, with its phase; runs of one phase over consecutive
# steps become one span (gaps and islands: step less the row's rank within the phase)
_SPANS_SQL = """
WITH inst AS (
    SELECT inst, engine, req_id, intro_step, next_intro_step, prompt_len
    FROM instances WHERE engine = $engine
),
listed AS (
    SELECT i.inst, s.step,
           CASE WHEN s.num_computed_tokens >= COALESCE(i.prompt_len, 0)
                 AND COALESCE(s.num_scheduled_tokens, 0)
                     <= 1 + COALESCE(len(s.spec_token_ids), 0)
                THEN 'decode' ELSE 'prefill' END AS phase
    FROM inst i JOIN scheduled s ON s.engine = i.engine AND s.req_id = i.req_id
         AND s.step >= i.intro_step AND (i.next_intro_step IS NULL OR s.step < i.next_intro_step)
    WHERE s.kind IS NOT NULL AND s.step BETWEEN $lo AND $hi
),
islands AS (
    SELECT inst, phase, step,
           step - ROW_NUMBER() OVER (PARTITION BY inst, phase ORDER BY step) AS island
    FROM listed
)
SELECT inst, phase, MIN(step) AS first, MAX(step) AS last
FROM islands GROUP BY inst, phase, island
UNION ALL
SELECT i.inst, 'preempted' AS phase, p.step AS first, p.step AS last
FROM inst i JOIN preempted p ON p.engine = i.engine AND p.req_id = i.req_id
     AND p.step > i.intro_step AND (i.next_intro_step IS NULL OR p.step < i.next_intro_step)
WHERE p.step BETWEEN $lo AND $hi
ORDER BY inst, first
"""

_INSTANCES_SQL = """
SELECT i.inst, i.req_id, i.intro_step, MAX(a.step) AS added_step
FROM instances i
LEFT JOIN added a ON a.engine = i.engine AND a.req_id = i.req_id AND a.step < i.intro_step
WHERE i.engine = $engine
GROUP BY i.inst, i.req_id, i.intro_step
"""

# a preempted request's recompute reaches its prompt's end again: the first time counts
_FIRST_TOKEN_SQL = """
SELECT i.inst, MIN(s.step) AS first_token
FROM instances i JOIN scheduled s ON s.engine = i.engine AND s.req_id = i.req_id
     AND s.step >= i.intro_step AND (i.next_intro_step IS NULL OR s.step < i.next_intro_step)
WHERE i.engine = $engine AND s.kind IS NOT NULL AND s.step BETWEEN $lo AND $hi
  AND s.num_computed_tokens + s.num_scheduled_tokens >= i.prompt_len
GROUP BY i.inst
"""


def _ids_by_step(gw, table: str, engine: str, lo: int, hi: int) -> dict[int, list[str]]:
    t = gw.sql(f"SELECT step, list(req_id ORDER BY req_id) AS ids FROM {table} "
               "WHERE engine = $engine AND step BETWEEN $lo AND $hi GROUP BY step",
               params={"engine": engine, "lo": lo, "hi": hi})
    return dict(zip(t["step"].to_pylist(), t["ids"].to_pylist()))


def steps_of(gw, engine: str, lo: int, hi: int) -> Steps:
    t = gw.sql(_STEPS_SQL, params={"engine": engine, "lo": lo, "hi": hi})
    if not t.num_rows:
        raise TraceError(f"engine {engine} has no recorded step in {lo:,}..{hi:,}")
    cols = {n: t[n].to_numpy() for n in t.column_names}
    start = (cols["t_ns"] - cols["schedule_ns"]).astype(np.int64)
    # a clock that steps back would draw overlaps; Perfetto's timestamps are unsigned
    start = np.maximum.accumulate(np.maximum(start, 0))
    gaps = np.diff(start)
    typical = int(np.median(gaps)) if len(gaps) else int(cols["schedule_ns"][0])
    end = np.append(start[1:], start[-1] + max(1000, typical))
    return Steps(cols["step"].astype(np.int64), start, end, cols,
                 _ids_by_step(gw, "finished", engine, lo, hi),
                 _ids_by_step(gw, "preempted", engine, lo, hi))


def requests_of(gw, engine: str, lo: int, hi: int) -> list[Request]:
    """Each request instance seen in [lo, hi], its phases in order: a gap between two listed
    runs is preempted after a preemption, else waiting (live, not scheduled); before the first
    run, waiting since its add where the input log has it."""
    params = {"engine": engine, "lo": lo, "hi": hi}
    inst = gw.sql(_INSTANCES_SQL, params={"engine": engine})
    meta = {k: (rid, intro, added) for k, rid, intro, added in zip(
        inst["inst"].to_pylist(), inst["req_id"].to_pylist(), inst["intro_step"].to_pylist(),
        inst["added_step"].to_pylist())}
    t = gw.sql(_FIRST_TOKEN_SQL, params=params)
    first_token = dict(zip(t["inst"].to_pylist(), t["first_token"].to_pylist()))
    t = gw.sql(_SPANS_SQL, params=params)
    spans: dict[int, list[tuple[str, int, int]]] = {}
    for k, phase, first, last in zip(t["inst"].to_pylist(), t["phase"].to_pylist(),
                                     t["first"].to_pylist(), t["last"].to_pylist()):
        spans.setdefault(k, []).append((phase, first, last))
    out = []
    for k, runs in spans.items():
        rid, intro, added = meta[k]
        phases: list[tuple[str, int, int]] = []
        if added is not None and max(lo, added + 1) < runs[0][1]:
            phases.append(("waiting", max(lo, added + 1), runs[0][1] - 1))
        for phase, first, last in runs:
            if phases and first > phases[-1][2] + 1:
                gap = "preempted" if phases[-1][0] == "preempted" else "waiting"
                if gap == "preempted":  # the preemption's span lasts until it runs again
                    phases[-1] = (gap, phases[-1][1], first - 1)
                else:
                    phases.append((gap, phases[-1][2] + 1, first - 1))
            phases.append((phase, first, last))
        arrival = intro if added is None else added + 1
        # before the range, its prompt's end may be too: a decode step in it is not that
        ft = first_token.get(k) if arrival >= lo else None
        out.append(Request(rid, intro, phases, arrival=arrival, first_token=ft))
    return out


def findings_of(gw) -> list:
    """The catalog's findings, every severity."""
    from vllm_contract.replay.query import catalog, checker

    return checker.run(gw, catalog.load(None)).findings


def read(path, engine: str | None = None, first: int | None = None,
         last: int | None = None) -> list[Engine]:
    """The timeline of each engine of the trace at `path` (or of `engine`), steps
    `first`..`last` (either end open)."""
    from vllm_contract.replay.query.gateway import Gateway

    lo = -(2 ** 62) if first is None else first
    hi = 2 ** 62 if last is None else last
    if lo > hi:
        raise TraceError(f"--from {first} is after --until {last}")
    with Gateway(path) as gw:
        names = gw.sql("SELECT DISTINCT engine::VARCHAR AS e FROM steps ORDER BY e")["e"]
        names = names.to_pylist()
        if engine is not None:
            if engine not in names:
                raise TraceError(f"no engine {engine!r} in the trace (it has: "
                                 f"{', '.join(names) or 'none'})")
            names = [engine]
        if not names:
            raise TraceError("the trace has no recorded step")
        found = findings_of(gw)
        engines = []
        for name in names:
            steps = steps_of(gw, name, lo, hi)
            requests = requests_of(gw, name, lo, hi)
            lanes = pack(requests)
            mine = [Finding(f.invariant, f.severity, f.step, f.req_id, f.title, f.details)
                    for f in found if f.engine in (None, name)
                    and (f.step is None or lo <= f.step <= hi)]
            engines.append(Engine(name, steps, requests, lanes, mine, lo, hi))
        return engines
