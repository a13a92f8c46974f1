"""A check's report (its findings, the checks that ran and those skipped) in every format of
`check --format`."""

from __future__ import annotations

from vllm_contract.findings import COLUMNS, RANK
from vllm_contract.replay.export.registry import Rendered, exporter
from vllm_contract.replay.export.text import csv_text, json_doc, json_lines

KIND = "check"


def _by_check(report) -> dict[str, list]:
    by: dict[str, list] = {}
    for f in report.findings:
        by.setdefault(f.invariant, []).append(f)
    return by


def _skipped_on_stderr(r: Rendered, report) -> Rendered:
    # the table lists them among its lines; a machine format has no place for them
    for inv_id, why in report.skipped.items():
        r.err(f"vllm-contract: skipped {inv_id}: {why}\n")
    return r


@exporter(KIND, "table")
def table(report, invariants, fail_on: str, examples: int = 3) -> Rendered:
    by = _by_check(report)
    lines = []
    # the worker's findings (`--worker`) have no catalog entry: their own severity and title
    heads = [(i.severity, i.id, i.title) for i in invariants]
    known = {i.id for i in invariants}
    heads += [(fs[0].severity, k, fs[0].title) for k, fs in by.items() if k not in known]
    for severity, inv_id, title in sorted(heads, key=lambda h: (-RANK[h[0]], h[1])):
        found = by.get(inv_id)
        if not found:
            continue
        lines.append(f"{severity.upper():7} {inv_id}  ({len(found)})  {title}")
        for f in found[:examples]:
            where = f"step {f.step}" if f.step is not None else "trace"
            who = f" req {f.req_id}" if f.req_id else ""
            lines.append(f"        {where}{who}: {f.details}")
        if len(found) > examples:
            lines.append(f"        ... {len(found) - examples} more")
    for inv_id, why in report.skipped.items():
        lines.append(f"SKIPPED {inv_id}: {why}")
    counts = report.counts()
    lines.append(f"{len(report.ran)} checks ran, {len(report.skipped)} skipped: "
                 f"{counts['error']} error(s), {counts['warning']} warning(s), "
                 f"{counts['info']} info")
    return Rendered().out("\n".join(lines) + "\n")


@exporter(KIND, "json")
def as_json(report, invariants, fail_on: str) -> Rendered:
    return _skipped_on_stderr(Rendered().out(json_doc([f.to_dict() for f in report.findings])),
                              report)


@exporter(KIND, "jsonl")
def as_jsonl(report, invariants, fail_on: str) -> Rendered:
    return _skipped_on_stderr(Rendered().out(json_lines([f.to_dict() for f in report.findings])),
                              report)


@exporter(KIND, "csv")
def as_csv(report, invariants, fail_on: str) -> Rendered:
    rows = [f.to_dict() for f in report.findings]
    return _skipped_on_stderr(Rendered().out(csv_text(rows, COLUMNS)), report)


def where(f) -> str:
    """Where a finding is, in words, leaving out what it does not name."""
    parts = [f"engine {f.engine}" if f.engine else None,
             f"step {f.step}" if f.step is not None else None,
             f"req {f.req_id}" if f.req_id else None]
    return " ".join(p for p in parts if p) or "trace"


@exporter(KIND, "junit")
def junit(report, invariants, fail_on: str) -> Rendered:
    """One testcase per check; a failure only for findings at or above --fail-on (what the
    exit code counts), the others in the testcase's system-out."""
    # here, not at the top: it loads urllib.request, which every command would load too
    from xml.sax.saxutils import escape, quoteattr

    by = _by_check(report)
    known = {i.id for i in invariants}
    cases = [(i.id, i.severity, i.title) for i in invariants]
    cases += [(k, fs[0].severity, fs[0].title) for k, fs in by.items() if k not in known]
    failing = {k for k, fs in by.items() if any(RANK[f.severity] >= RANK[fail_on] for f in fs)}
    out = ['<?xml version="1.0" encoding="UTF-8"?>',
           f'<testsuite name="vllm-contract" tests="{len(cases)}" failures="{len(failing)}" '
           f'skipped="{len(report.skipped)}">']
    for inv_id, severity, title in cases:
        out.append(f'  <testcase classname="vllm_contract.invariants" name={quoteattr(inv_id)}>')
        body = "\n".join(f"{where(f)}: {f.message}" for f in by.get(inv_id, ()))
        if inv_id in report.skipped:
            out.append(f"    <skipped message={quoteattr(report.skipped[inv_id])}/>")
        elif inv_id in failing:
            out.append(f"    <failure type={quoteattr(severity)} "
                       f"message={quoteattr(title)}>{escape(body)}</failure>")
        elif body:
            out.append(f"    <system-out>{escape(body)}</system-out>")
        out.append("  </testcase>")
    out.append("</testsuite>")
    return _skipped_on_stderr(Rendered().out("\n".join(out) + "\n"), report)
