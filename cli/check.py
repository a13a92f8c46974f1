"""`check` and `sql`: the invariant catalog and post-mortem SQL over a trace."""

from __future__ import annotations

import enum
import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from vllm_contract.cli.common import ExitCode, csv_text, err, fail, warn
from vllm_contract.errors import TraceError
from vllm_contract.findings import COLUMNS, RANK, SEVERITIES

app = typer.Typer()


class CheckFormat(str, enum.Enum):
    table = "table"
    json = "json"
    jsonl = "jsonl"
    csv = "csv"
    junit = "junit"


class CheckWorker(str, enum.Enum):
    shadow = "shadow"


class SqlEngine(str, enum.Enum):
    duckdb = "duckdb"
    spark = "spark"


Severity = enum.Enum("Severity", {s: s for s in SEVERITIES}, type=str)


class SqlFormat(str, enum.Enum):
    table = "table"
    json = "json"
    csv = "csv"


def _progress(n: int, total: int, name: str) -> None:
    """A progress line on a terminal; nothing when stderr is a file or a pipe."""
    if not sys.stderr.isatty():
        return
    typer.echo(f"\rchecking {n}/{total} {name:<40}", err=True, nl=False)
    if n == total:
        typer.echo("", err=True)


def _render_table(report, invariants, examples: int = 3) -> str:
    by: dict[str, list] = {}
    for f in report.findings:
        by.setdefault(f.invariant, []).append(f)
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
            lines.append(f"        {where}{who}: {f.message.split(': ', 1)[-1]}")
        if len(found) > examples:
            lines.append(f"        ... {len(found) - examples} more")
    for inv_id, why in report.skipped.items():
        lines.append(f"SKIPPED {inv_id}: {why}")
    counts = report.counts()
    lines.append(f"{len(report.ran)} checks ran, {len(report.skipped)} skipped: "
                 f"{counts['error']} error(s), {counts['warning']} warning(s), "
                 f"{counts['info']} info")
    return "\n".join(lines)


def _where(f) -> str:
    """Where a finding is, in words, leaving out what it does not name."""
    parts = [f"engine {f.engine}" if f.engine else None,
             f"step {f.step}" if f.step is not None else None,
             f"req {f.req_id}" if f.req_id else None]
    return " ".join(p for p in parts if p) or "trace"


def _render_junit(report, invariants, fail_on: str) -> str:
    """One testcase per check; a failure only for findings at or above --fail-on (what the
    exit code counts), the others in the testcase's system-out."""
    # here, not at the top: it loads urllib.request, which every other command would load too
    from xml.sax.saxutils import escape, quoteattr

    by: dict[str, list] = {}
    for f in report.findings:
        by.setdefault(f.invariant, []).append(f)
    known = {i.id for i in invariants}
    cases = [(i.id, i.severity, i.title) for i in invariants]
    cases += [(k, fs[0].severity, fs[0].title) for k, fs in by.items() if k not in known]
    failing = {k for k, fs in by.items() if any(RANK[f.severity] >= RANK[fail_on] for f in fs)}
    out = ['<?xml version="1.0" encoding="UTF-8"?>',
           f'<testsuite name="vllm-contract" tests="{len(cases)}" failures="{len(failing)}" '
           f'skipped="{len(report.skipped)}">']
    for inv_id, severity, title in cases:
        out.append(f'  <testcase classname="vllm_contract.invariants" name={quoteattr(inv_id)}>')
        body = "\n".join(f"{_where(f)}: {f.message}" for f in by.get(inv_id, ()))
        if inv_id in report.skipped:
            out.append(f"    <skipped message={quoteattr(report.skipped[inv_id])}/>")
        elif inv_id in failing:
            out.append(f"    <failure type={quoteattr(severity)} "
                       f"message={quoteattr(title)}>{escape(body)}</failure>")
        elif body:
            out.append(f"    <system-out>{escape(body)}</system-out>")
        out.append("  </testcase>")
    out.append("</testsuite>")
    return "\n".join(out)


def _add_worker_findings(report, trace: Path) -> None:
    from vllm_contract.kinds import without_repeats
    from vllm_contract.replay.worker.shadow import run_shadow
    from vllm_contract.trace import open_trace

    report.findings = without_repeats(report.findings, run_shadow(open_trace(trace)))
    report.ran.append("worker.shadow")
    report.findings.sort(key=lambda f: f.sort_key())


def _spark_conf(items: list[str]) -> dict[str, str]:
    conf = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise TraceError(f"--spark-conf {item!r}: expected KEY=VALUE")
        conf[key.strip()] = value
    return conf


@app.command()
def check(
    trace: Annotated[Path, typer.Argument(help="Trace directory.")],
    only: Annotated[Optional[list[str]], typer.Option("--only", help="Run only this check id "
                                                      "(repeatable).")] = None,
    invariants: Annotated[Optional[list[Path]], typer.Option(
        "--invariants", help="A directory of your own .sql checks (repeatable).")] = None,
    fail_on: Annotated[Severity, typer.Option("--fail-on", help="Exit 1 when a finding is at "
                                              "or above this severity.")] = Severity.error,
    format: Annotated[CheckFormat, typer.Option("--format", "-f")] = CheckFormat.table,
    list_: Annotated[bool, typer.Option("--list", help="List the checks and exit.")] = False,
    worker: Annotated[Optional[CheckWorker], typer.Option(
        "--worker", help="Also replay into this worker and add its findings (worker.*); one "
                         "saying what a catalog finding at the same step and request says "
                         "is left out.")] = None,
    sql_engine: Annotated[SqlEngine, typer.Option(
        "--sql-engine", help="Where the catalog's SQL runs: DuckDB in this process, or Spark "
                             "(pip install 'vllm-contract[spark]'; needs Java 17+), with the "
                             "same findings.")] = SqlEngine.duckdb,
    master: Annotated[str, typer.Option(
        "--master", help="Spark master URL (with --sql-engine spark).")] = "local[2]",
    spark_conf: Annotated[Optional[list[str]], typer.Option(
        "--spark-conf", metavar="KEY=VALUE",
        help="A Spark setting (repeatable; with --sql-engine spark).")] = None,
) -> None:
    """Check a trace against the invariant catalog. Exit 0: nothing at or above --fail-on;
    1: findings at or above it; 2: unusable input."""
    from vllm_contract.replay.query import catalog, checker
    from vllm_contract.replay.query.gateway import Gateway

    try:
        invs = catalog.load(invariants)
        if list_:
            for inv in invs:
                typer.echo(f"{inv.id:<36} {inv.severity:<8} {inv.title}")
            return
        selected = checker.select(invs, only)
        if sql_engine is SqlEngine.spark:
            from vllm_contract.replay.query.spark import SparkGateway

            gateway = SparkGateway(trace, master=master, conf=_spark_conf(spark_conf or []))
        else:
            if spark_conf or master != "local[2]":
                raise TraceError("--master and --spark-conf need --sql-engine spark")
            gateway = Gateway(trace)
        with gateway as gw:
            for w in gw.warnings:
                warn(w)
            report = checker.run(gw, selected, progress=_progress)
        if worker is not None:
            _add_worker_findings(report, trace)
    except TraceError as e:
        fail(e)
    rows = [f.to_dict() for f in report.findings]
    if format is CheckFormat.json:
        typer.echo(json.dumps(rows, indent=2))
    elif format is CheckFormat.jsonl:
        for r in rows:
            typer.echo(json.dumps(r))
    elif format is CheckFormat.csv:
        typer.echo(csv_text(rows, COLUMNS), nl=False)
    elif format is CheckFormat.junit:
        typer.echo(_render_junit(report, selected, fail_on.value))
    else:
        typer.echo(_render_table(report, selected))
    for inv_id, why in report.skipped.items():
        if format is not CheckFormat.table:
            err(f"vllm-contract: skipped {inv_id}: {why}")
    if report.at_or_above(fail_on.value):
        raise typer.Exit(ExitCode.FOUND)


def _json_value(v):
    """A value JSON has no type for: DuckDB's sums are 128-bit integers (Arrow decimals of
    scale 0), which stay numbers; times and the like become their text."""
    import decimal

    if isinstance(v, decimal.Decimal):
        return int(v) if v == v.to_integral_value() else float(v)
    return str(v)


def _print_table(table, format: SqlFormat) -> None:
    rows = table.to_pylist()
    if format is SqlFormat.json:
        typer.echo(json.dumps(rows, indent=2, default=_json_value))
        return
    if format is SqlFormat.csv:
        typer.echo(csv_text(rows, table.column_names), nl=False)
        return
    cols = table.column_names
    cells = [[("NULL" if r[c] is None else str(r[c])) for c in cols] for r in rows]
    widths = [min(60, max([len(c)] + [len(row[i]) for row in cells])) for i, c in enumerate(cols)]
    typer.echo("  ".join(c.ljust(w) for c, w in zip(cols, widths)))
    typer.echo("  ".join("-" * w for w in widths))
    for row in cells:
        typer.echo("  ".join(v[:w].ljust(w) for v, w in zip(row, widths)))
    typer.echo(f"({len(rows)} row{'s' * (len(rows) != 1)})")


@app.command()
def sql(
    trace: Annotated[Path, typer.Argument(help="Trace directory.")],
    query: Annotated[Optional[str], typer.Argument(help="SQL; omit for an interactive "
                                                   "prompt.")] = None,
    format: Annotated[SqlFormat, typer.Option("--format", "-f")] = SqlFormat.table,
) -> None:
    """Run SQL over a trace's views (steps, scheduled, requests, finished, lifeline, ...);
    without a query, an interactive prompt (statements end with ';', `.views` lists views)."""
    from vllm_contract.replay.query.gateway import Gateway
    from vllm_contract.replay.query.views import VIEW_DOCS

    try:
        gw = Gateway(trace)
        for w in gw.warnings:
            warn(w)
        if query is not None:
            _print_table(gw.sql(query), format)
            return
    except TraceError as e:
        fail(e)
    err(f"views: {', '.join(VIEW_DOCS)}. End statements with ';'. Ctrl-D quits.")
    buf: list[str] = []
    while True:
        try:
            line = input("sql> " if not buf else "...> ")
        except EOFError:
            typer.echo("", err=True)
            return
        if not buf and line.strip() == ".views":
            for name, doc in VIEW_DOCS.items():
                typer.echo(f"{name:<14} {doc}")
            continue
        buf.append(line)
        if line.rstrip().endswith(";"):
            text = "\n".join(buf).strip().rstrip(";")
            buf = []
            try:
                _print_table(gw.sql(text), format)
            except TraceError as e:  # the prompt survives a bad query
                err(f"error: {e}")
