"""What the app reads from a trace, through the query gateway: the step index, pages of the
steps list, one step in full, a request's lifeline, id search, the charts' series and free SQL.

Every function here runs on a worker thread, never on the event loop, each thread with its own
DuckDB cursor (`TraceData.cursor`)."""

from __future__ import annotations

import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
from vllm_contract.errors import TraceError
from vllm_contract.replay import Gateway

PAGE = 128  # rows of the steps list fetched at once


class Interrupted(Exception):
    """A query stopped because a newer one of its kind, or the person, superseded it."""


def lit(s: str) -> str:
    """A string as an SQL literal (the gateway takes no parameters)."""
    return "'" + s.replace("'", "''") + "'"


@dataclass
class StepDetail:
    step: int
    row: dict
    scheduled: list[dict]
    requests: dict[str, dict]
    finished: list[str]
    preempted: list[str]
    freed_mm: list[str]
    outputs: list[dict]


@dataclass
class LifeEvent:
    first: int
    last: int
    event: str
    count: int = 1
    tokens: int | None = None
    info: str = ""


@dataclass
class Lifeline:
    req_id: str
    events: list[LifeEvent] = field(default_factory=list)


class TraceData:
    """One engine of a trace, read through a Gateway. `steps` is the engine's step numbers in
    order (a million of them are 8 MB): the list's row i is steps[i], and a page of rows is
    fetched by its first and last step number (a keyset), which Parquet's statistics prune."""

    def __init__(self, trace: str | Path, engine: str | None = None) -> None:
        self.gateway = Gateway(trace)
        names = [e.name for e in self.gateway.trace.engines]
        if engine is None:
            engine = names[0]
        if engine not in names:
            self.gateway.close()
            raise TraceError(f"no engine {engine!r} in the trace (it has {', '.join(names)})")
        self.engine = engine
        self.root = self.gateway.trace.root
        self._cursors: list = []  # every cursor made, to interrupt and close them
        self._free: list = []  # the pool's idle ones
        self._slots: dict[str, object] = {}  # kind of query -> the cursor running the newest
        self._lock = threading.Lock()
        self.steps = np.zeros(0, dtype=np.int64)
        self.t0 = 0  # the first step's t_ns: the list shows times since it

    # -- cursors ------------------------------------------------------------------------------
    @contextmanager
    def borrow(self):
        """A DuckDB cursor for this thread, from a pool: Textual starts a thread per worker,
        and a cursor per thread would grow without bound over a long session."""
        with self._lock:
            cur = self._free.pop() if self._free else None
        if cur is None:
            cur = self.gateway.cursor()
            with self._lock:
                self._cursors.append(cur)
        try:
            yield cur
        finally:
            with self._lock:
                self._free.append(cur)

    @contextmanager
    def newest(self, kind: str):
        """A cursor of its own for a query that a newer one of the same kind supersedes (the
        detail of a step the cursor left, a replaced SQL query): taking it interrupts the query
        of the one before, which then raises `Interrupted`. A pooled cursor is never
        interrupted: it may be running another worker's query by then."""
        cur = self.gateway.cursor()
        with self._lock:  # held while interrupting and closing: the old one is open here
            self._cursors.append(cur)
            old = self._slots.get(kind)
            self._slots[kind] = cur
            if old is not None:
                old.interrupt()
        try:
            yield cur
        except TraceError as e:
            if self._slots.get(kind) is not cur:
                raise Interrupted(kind) from e
            raise
        finally:
            with self._lock:
                if self._slots.get(kind) is cur:
                    del self._slots[kind]
                if cur in self._cursors:  # else closed already, by close()
                    self._cursors.remove(cur)
                    cur.close()

    def stop(self, kind: str) -> bool:
        """Interrupt the newest query of `kind`, if one runs (the person pressed Esc)."""
        with self._lock:
            cur = self._slots.pop(kind, None)
            if cur is not None:
                cur.interrupt()
        return cur is not None

    def sql(self, query: str, params: list | None = None, kind: str | None = None) -> pa.Table:
        """The query's result, on a pooled cursor, or on the newest cursor of `kind`."""
        with self.borrow() if kind is None else self.newest(kind) as cur:
            return self.gateway.sql(query, con=cur, params=params)

    def interrupt(self) -> None:
        """Interrupt whatever any cursor is running (the app closing)."""
        with self._lock:
            for cur in self._cursors:
                cur.interrupt()

    def close(self) -> None:
        with self._lock:
            for cur in self._cursors:
                cur.close()
            self._cursors.clear()
            self._free.clear()
        self.gateway.close()

    @property
    def where(self) -> str:
        return f"engine = {lit(self.engine)}"

    # -- the steps list -----------------------------------------------------------------------
    def load_steps(self) -> np.ndarray:
        # the column as stored, sorted here: DuckDB's DISTINCT and ORDER BY over a million
        # steps took most of the first paint
        t = self.sql("SELECT step FROM steps WHERE engine = ?", [self.engine])
        steps = t.column("step").to_numpy().astype(np.int64, copy=False)
        if len(steps) > 1 and not bool(np.all(steps[1:] > steps[:-1])):
            steps = np.unique(steps)  # several segments out of order, or a duplicated row
        self.steps = steps
        t0 = self.sql("SELECT MIN(t_ns) AS t FROM steps WHERE engine = ?",
                      [self.engine])["t"][0].as_py()
        self.t0 = t0 or 0
        return self.steps

    def index_of(self, step: int) -> int:
        """The row of the first step at or after `step` (clamped to the last row)."""
        i = int(np.searchsorted(self.steps, step))
        return min(i, len(self.steps) - 1)

    def page(self, start: int, count: int = PAGE) -> list[dict]:
        """Rows start..start+count-1 of the steps list."""
        stop = min(start + count, len(self.steps))
        if start >= stop:
            return []
        lo, hi = int(self.steps[start]), int(self.steps[stop - 1])
        span = f"{self.where} AND step BETWEEN {lo} AND {hi}"
        t = self.sql(f"""
            SELECT s.step, s.t_ns, s.num_new AS new,
                   s.num_cached - COALESCE(r.n, 0) AS cached, COALESCE(r.n, 0) AS resumed,
                   s.total_num_scheduled_tokens AS tokens, s.num_finished AS finished,
                   COALESCE(p.n, 0) AS preempted, s.num_running AS running,
                   s.num_waiting AS waiting, s.kv_usage
            FROM steps s
            LEFT JOIN (SELECT step, COUNT(*) AS n FROM scheduled
                       WHERE {span} AND kind = 'resumed' GROUP BY step) r ON r.step = s.step
            LEFT JOIN (SELECT step, COUNT(*) AS n FROM preempted WHERE {span} GROUP BY step) p
                   ON p.step = s.step
            WHERE s.{self.where} AND s.step BETWEEN {lo} AND {hi}
            ORDER BY s.step""")
        rows, seen = [], set()
        for row in t.to_pylist():
            if row["step"] not in seen:  # a duplicated row (a damaged trace) shows once
                seen.add(row["step"])
                rows.append(row)
        return rows

    # -- one step -----------------------------------------------------------------------------
    def detail(self, step: int, cancelled=lambda: False) -> StepDetail | None:
        """The step in full; None if `cancelled()` turns true between its queries (a newer
        step was asked for)."""
        at = "engine = $engine AND step = $step"
        p = {"engine": self.engine, "step": int(step)}
        with self.newest("detail") as cur:
            def q(query: str) -> pa.Table:
                return self.gateway.sql(query, con=cur, params=p)

            row = q(f"SELECT * EXCLUDE (engine) FROM steps WHERE {at} LIMIT 1").to_pylist()
            if cancelled():
                return None
            sched = q(f"""SELECT * EXCLUDE (engine, step) FROM scheduled WHERE {at}
                          ORDER BY kind = 'new' DESC, pos NULLS LAST, req_id""").to_pylist()
            if cancelled():
                return None
            reqs = q(f"SELECT req_id, prompt_len, sampling_params FROM requests WHERE {at}")
            # the three id lists in one query: a query costs its scan setup more than its rows
            ids = q(f"""SELECT 0 AS k, req_id AS id FROM finished WHERE {at}
                        UNION ALL SELECT 1, req_id FROM preempted WHERE {at}
                        UNION ALL SELECT 2, mm_hash FROM freed_mm WHERE {at}""").to_pylist()
            if cancelled():
                return None
            outs = q(f"""SELECT req_id, sampled_token_ids, num_nans_in_logits
                         FROM model_outputs WHERE {at} ORDER BY pos""").to_pylist()

        def of(k: int) -> list[str]:
            return [r["id"] for r in ids if r["k"] == k]

        return StepDetail(step=int(step), row=row[0] if row else {}, scheduled=sched,
                          requests={r["req_id"]: r for r in reqs.to_pylist()},
                          finished=of(0), preempted=of(1), freed_mm=of(2), outputs=outs)

    # -- requests -----------------------------------------------------------------------------
    def search(self, prefix: str, limit: int = 50) -> list[tuple[str, int]]:
        """Request ids starting with `prefix`, with the step each was first introduced at."""
        t = self.sql("""SELECT req_id, MIN(step) AS step FROM requests
                        WHERE engine = ? AND starts_with(req_id, ?)
                        GROUP BY req_id ORDER BY MIN(step), req_id LIMIT ?""",
                     [self.engine, prefix, int(limit)], kind="search")
        return [(r["req_id"], r["step"]) for r in t.to_pylist()]

    def lifeline(self, req_id: str) -> Lifeline:
        """The request's events in step order; consecutive steps of the same kind are one
        event (a thousand decode steps read as one line)."""
        who = f"{self.where} AND req_id = {lit(req_id)}"
        t = self.sql(f"""
            SELECT step, 0 AS o, 'introduced' AS event, prompt_len AS tokens, '' AS info
              FROM requests WHERE {who}
            UNION ALL
            SELECT step, 1, CASE WHEN kind = 'new' THEN 'scheduled new' ELSE kind END,
                   num_scheduled_tokens, ''
              FROM scheduled WHERE {who} AND kind IS NOT NULL
            UNION ALL
            SELECT step, 2, 'preempted', NULL, '' FROM preempted WHERE {who}
            UNION ALL
            SELECT step, 3, 'finished', NULL, COALESCE(reason, '') || ' (' ||
                   COALESCE(source, '') || ')' FROM finish_events WHERE {who}
            UNION ALL
            SELECT step, 4, 'freed (finished_req_ids)', NULL, '' FROM finished WHERE {who}
            ORDER BY step, o""", kind="lifeline")
        out = Lifeline(req_id)
        for r in t.to_pylist():
            prev = out.events[-1] if out.events else None
            if (prev is not None and r["event"] == "cached" and prev.event == "cached"
                    and r["step"] == prev.last + 1):
                prev.last, prev.count = r["step"], prev.count + 1
                prev.tokens = (prev.tokens or 0) + (r["tokens"] or 0)
                continue
            out.events.append(LifeEvent(r["step"], r["step"], r["event"], 1, r["tokens"],
                                        r["info"]))
        return out

    # -- charts -------------------------------------------------------------------------------
    def series(self, buckets: int = 240) -> dict[str, list[float]]:
        """Per bucket of consecutive steps, the largest value of each charted quantity."""
        n = len(self.steps)
        if n == 0:
            return {}
        lo, hi = int(self.steps[0]), int(self.steps[-1])
        width = max(1, min(buckets, hi - lo + 1))
        t = self.sql(f"""
            SELECT CAST((step - {lo}) * {width} // {hi - lo + 1} AS BIGINT) AS b,
                   MAX(total_num_scheduled_tokens) AS tokens,
                   MAX(num_new + num_cached) AS batch, MAX(kv_usage) AS kv,
                   MAX(num_waiting) AS waiting, MAX(num_running) AS running
            FROM steps WHERE {self.where} GROUP BY b ORDER BY b""")
        out: dict[str, list[float]] = {k: [0.0] * width for k in
                                       ("tokens", "batch", "kv", "waiting", "running")}
        for r in t.to_pylist():
            for k, values in out.items():
                values[r["b"]] = float(r[k] or 0)
        out["_range"] = [float(lo), float(hi)]
        return out
