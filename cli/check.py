"""`check` and `sql`: the invariant catalog and post-mortem SQL over a trace."""

from __future__ import annotations

import enum
from pathlib import Path
from typing import Annotated, Optional

import typer

from vllm_contract.cli.common import (ExitCode, emit, err, format_choice, progress_line, warn,
                                      worker_choice)
from vllm_contract.errors import TraceError
from vllm_contract.findings import SEVERITIES
from vllm_contract.replay.export import render

app = typer.Typer()


# the formats the exporters have (vllm_contract.replay.export): a new one is offered here too
CheckFormat = format_choice("CheckFormat", "check")
SqlFormat = format_choice("SqlFormat", "rows")


CheckWorker = worker_choice("CheckWorker")  # the registry's kinds


class SqlEngine(str, enum.Enum):
    duckdb = "duckdb"
    spark = "spark"


Severity = enum.Enum("Severity", {s: s for s in SEVERITIES}, type=str)


def _add_worker_findings(report, trace: Path, worker: str) -> None:
    """A whole replay into the worker (every engine it covers), its findings and divergences
    added to the catalog's."""
    from vllm_contract.findings import by_severity
    from vllm_contract.kinds import without_repeats
    from vllm_contract.replay.stepping import replay_range

    run = replay_range(trace, worker)
    report.findings = without_repeats(report.findings, run.all_findings(), key=by_severity)
    report.ran.append(f"worker.{worker}")


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
        # on a terminal only: a CI log gets the findings, not a line per check
        line = progress_line("checking {n}/{total} {name:<40}", tty_only=True)
        report = checker.run(gw, selected, progress=line)
        line.end()
    if worker is not None:
        _add_worker_findings(report, trace, worker.value)
    emit(render("check", format.value, report, selected, fail_on.value))
    if report.at_or_above(fail_on.value):
        raise typer.Exit(ExitCode.FOUND)


def _print_table(table, format: SqlFormat) -> None:
    emit(render("rows", format.value, table))


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

    with Gateway(trace) as gw:
        for w in gw.warnings:
            warn(w)
        if query is not None:
            _print_table(gw.sql(query), format)
            return
        _prompt(gw, format)


def _prompt(gw, format: SqlFormat) -> None:
    from vllm_contract.replay.query.views import VIEW_DOCS

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
