"""Run the invariant catalog over a trace: findings, plus the checks skipped and why."""

from __future__ import annotations

from typing import Any, Callable, Protocol, runtime_checkable

from vllm_contract import schema
from vllm_contract.errors import TraceError
from vllm_contract.findings import Finding, Report
from vllm_contract.replay.query.base import QueryGateway
from vllm_contract.replay.query.catalog import Invariant
from vllm_contract.replay.query.deps import stored_before


@runtime_checkable
class _Checkable(Protocol):
    """What run() reads of any gateway (base.QueryGateway has it all): checked up front so that
    another object fails with one line naming what it lacks, not deep in a check."""
    views: list[str]
    present: set[str]

    def is_materialized(self, view: str) -> bool: ...
    def materialize(self, view: str) -> None: ...
    def sql(self, query: str) -> Any: ...


class _Cursor(Protocol):
    def interrupt(self) -> None: ...
    def close(self) -> None: ...


@runtime_checkable
class Cursors(Protocol):
    """What the checker needs of a gateway to run checks side by side: a cursor per thread,
    which `sql(query, con=cursor)` runs on and which interrupt() stops. DuckDB's Gateway has
    them; a gateway without (Spark's, which spreads a query over its own executors) runs the
    checks one after another."""
    def cursor(self) -> _Cursor: ...
    def sql(self, query: str, con: Any = None) -> Any: ...


def select(invariants: list[Invariant], only: list[str] | None) -> list[Invariant]:
    if not only:
        return invariants
    known = {i.id for i in invariants}
    unknown = [o for o in only if o not in known]
    if unknown:
        raise TraceError(f"unknown check id(s): {', '.join(unknown)} "
                         f"(see `vllm-contract check --list`)")
    return [i for i in invariants if i.id in only]


def run(gateway: QueryGateway, invariants: list[Invariant],
        progress: Callable[[int, int, str], None] | None = None, workers: int = 2) -> Report:
    """Every check over the trace. On DuckDB, `workers` cursors run the checks side by side
    once the views they share are stored: on a short trace each check's cost is planning,
    which one connection does one query at a time."""
    if not isinstance(gateway, _Checkable):
        lacks = [m for m in ("views", "present", "is_materialized", "materialize", "sql")
                 if not hasattr(gateway, m)]
        raise TypeError(f"checker.run needs a query gateway (replay/query/base.py), not a "
                        f"{type(gateway).__name__}, which lacks {', '.join(lacks)}")
    skipped: dict[str, str] = {}
    views = set(gateway.views)
    derived = views - set(schema.TABLE_NAMES)  # views computed from the tables, always there
    runnable: list[Invariant] = []
    for n, inv in enumerate(invariants):
        unknown = [t for t in inv.needs if t not in views]
        lacking = [t for t in inv.needs if t in views and t not in derived
                   and t not in gateway.present and t not in schema.ADDED_TABLES]
        if unknown:
            skipped[inv.id] = f"needs {', '.join(unknown)}, which no trace has"
            continue
        if lacking:
            skipped[inv.id] = f"the trace lacks {', '.join(lacking)}"
            continue
        try:
            # read by several checks: each stored once for the whole run
            for view in dict.fromkeys(v for need in inv.needs for v in stored_before(need)):
                if progress and not gateway.is_materialized(view):
                    progress(n, len(invariants), f"(computing the shared view {view})")
                gateway.materialize(view)
        except TraceError as e:
            raise TraceError(f"check {inv.id} ({inv.path}): {e}") from None
        runnable.append(inv)
    tables = _run_queries(gateway, runnable, progress, len(invariants), workers)
    findings: list[Finding] = []
    for inv, table in zip(runnable, tables):
        missing = {"engine", "step", "req_id", "details",
                   *(name for name, _ in inv.columns)} - set(table.column_names)
        if missing:
            raise TraceError(f"check {inv.id} ({inv.path}): query lacks column(s) "
                             f"{', '.join(sorted(missing))}")
        for row in table.select(["engine", "step", "req_id", "details"]).to_pylist():
            findings.append(Finding(
                invariant=inv.id, severity=inv.severity,
                step=None if row["step"] is None else int(row["step"]),
                req_id=row["req_id"], details=row["details"], engine=row["engine"],
                title=inv.title))
    if progress:
        progress(len(invariants), len(invariants), "")
    findings.sort(key=Finding.sort_key)
    return Report(findings, skipped, [inv.id for inv in runnable])


def _run_queries(gateway: QueryGateway, runnable: list[Invariant], progress, total: int,
                 workers: int) -> list:
    """Each check's result, in order; on DuckDB with workers > 1, on that many cursors."""
    def one(inv: Invariant, con=None):
        try:
            return gateway.sql(inv.sql) if con is None else gateway.sql(inv.sql, con=con)
        except TraceError as e:
            raise TraceError(f"check {inv.id} ({inv.path}): {e}") from None

    if workers <= 1 or len(runnable) < 2 or not isinstance(gateway, Cursors):
        out = []
        for n, inv in enumerate(runnable):
            if progress:
                progress(n, total, inv.id)
            out.append(one(inv))
        return out
    import threading
    from concurrent.futures import ThreadPoolExecutor

    local = threading.local()
    cursors, lock, done = [], threading.Lock(), [0]

    def job(inv: Invariant):
        cur = getattr(local, "cur", None)
        if cur is None:
            cur = local.cur = gateway.cursor()
            with lock:
                cursors.append(cur)
        table = one(inv, cur)
        if progress:
            with lock:
                done[0] += 1
                progress(done[0], total, inv.id)
        return table

    pool = ThreadPoolExecutor(workers, thread_name_prefix="vllm-contract-check")
    try:
        return list(pool.map(job, runnable))
    except BaseException:  # Ctrl-C, or a check's error: the others' queries stop now
        with lock:
            for cur in cursors:
                cur.interrupt()
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        for cur in cursors:
            cur.close()
