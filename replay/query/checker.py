"""Run the invariant catalog over a trace: findings, plus the checks skipped and why."""

from __future__ import annotations

from typing import Callable

from vllm_contract import schema
from vllm_contract.errors import TraceError
from vllm_contract.findings import Finding, Report
from vllm_contract.replay.query.catalog import Invariant
from vllm_contract.replay.query.gateway import Gateway
from vllm_contract.replay.query.views import SHARED_VIEWS

def select(invariants: list[Invariant], only: list[str] | None) -> list[Invariant]:
    if not only:
        return invariants
    known = {i.id for i in invariants}
    unknown = [o for o in only if o not in known]
    if unknown:
        raise TraceError(f"unknown check id(s): {', '.join(unknown)} "
                         f"(see `vllm-contract check --list`)")
    return [i for i in invariants if i.id in only]


def run(gateway: Gateway, invariants: list[Invariant],
        progress: Callable[[int, int, str], None] | None = None) -> Report:
    findings: list[Finding] = []
    skipped: dict[str, str] = {}
    ran: list[str] = []
    views = set(gateway.views)
    derived = views - set(schema.TABLE_NAMES)  # views computed from the tables, always there
    for n, inv in enumerate(invariants):
        if progress:
            progress(n, len(invariants), inv.id)
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
            for view in dict.fromkeys(v for need in inv.needs for v in SHARED_VIEWS.get(need, ())):
                if progress and not gateway.is_materialized(view):
                    progress(n, len(invariants), f"(computing the shared view {view})")
                gateway.materialize(view)
            table = gateway.sql(inv.sql)
        except TraceError as e:
            raise TraceError(f"check {inv.id} ({inv.path}): {e}") from None
        missing = {"engine", "step", "req_id", "details"} - set(table.column_names)
        if missing:
            raise TraceError(f"check {inv.id} ({inv.path}): query lacks column(s) "
                             f"{', '.join(sorted(missing))}")
        ran.append(inv.id)
        for row in table.select(["engine", "step", "req_id", "details"]).to_pylist():
            findings.append(Finding(
                invariant=inv.id, severity=inv.severity,
                step=None if row["step"] is None else int(row["step"]),
                req_id=row["req_id"], message=f"{inv.title}: {row['details']}",
                engine=row["engine"], title=inv.title))
    if progress:
        progress(len(invariants), len(invariants), "")
    findings.sort(key=Finding.sort_key)
    return Report(findings, skipped, ran)
