"""The invariant catalog: one `.sql` file per invariant, its metadata in header comments.

    -- id: finished.leaked
    -- severity: error            (error | warning | info)
    -- title: one line
    -- why: what breaks in the worker (may continue on lines indented after `--`)
    -- relies_on: the vLLM file and function that depend on it
    -- needs: tables/views the query reads (a check is skipped when its trace lacks one;
    --        `name (if present)`: read, but an absent table reads as empty instead)
    -- columns: engine, step, req_id, details
    -- note: optional, what the query deliberately does not report
    SELECT engine, step, req_id, details FROM ...

Users add checks in the same format with `--invariants DIR`. Loading a user's check compares its
`needs:` with what its query reads (deps.reads: DuckDB's own parser lists the tables): a table the query reads but
`needs:` omits would make a trace without it fail instead of skipping the check, and a name it lists
but never reads would skip the check for nothing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import duckdb

from vllm_contract import schema
from vllm_contract.errors import TraceError
from vllm_contract.findings import SEVERITIES
from vllm_contract.replay.query.deps import reads, through
from vllm_contract.replay.query.views import VIEW_DOCS

BUILTIN_DIR = Path(__file__).resolve().parent / "invariants"
REQUIRED = ("id", "severity", "title", "why", "relies_on", "needs")
_KEY = re.compile(r"^--\s*([a-z_]+):\s*(.*)$")
_ID = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z0-9_]+)+$")
_OPTIONAL = "(if present)"


@dataclass
class Invariant:
    id: str
    severity: str
    title: str
    why: str
    relies_on: str
    needs: list[str]
    sql: str
    path: Path
    note: str = ""
    meta: dict = field(default_factory=dict)
    # read when the trace has them (the query copes with their absence): never a reason to skip
    optional: list[str] = field(default_factory=list)

    @property
    def columns(self) -> list[tuple[str, bool]]:
        """The `-- columns:` header as (name, always NULL) pairs: the result columns the
        checker requires of the query (the four a finding is made of, by default)."""
        text = self.meta.get("columns") or "engine, step, req_id, details"
        out = []
        for part in (p.strip() for p in text.split(",")):
            name, _, rest = part.partition(" ")
            if name:
                out.append((name, rest.strip().upper() == "(NULL)"))
        return out


def parse(path: Path) -> Invariant:
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise TraceError(f"{path}: unreadable check ({e})") from None
    meta: dict[str, str] = {}
    key = None
    body: list[str] = []
    for line in text.splitlines():
        if body or not line.startswith("--"):
            if line.strip() or body:
                body.append(line)
            continue
        m = _KEY.match(line)
        if m:
            key = m.group(1)
            meta[key] = m.group(2).strip()
        elif key is not None:  # a continuation line of the previous key
            meta[key] += " " + line[2:].strip()
    missing = [k for k in REQUIRED if not meta.get(k) and k != "needs"]
    if "needs" not in meta:
        missing.append("needs")
    if missing:
        raise TraceError(f"{path}: malformed check: header lacks {', '.join(missing)}")
    if meta["severity"] not in SEVERITIES:
        raise TraceError(f"{path}: malformed check: severity must be one of "
                         f"{'|'.join(SEVERITIES)}, not {meta['severity']!r}")
    if not _ID.match(meta["id"]):
        raise TraceError(f"{path}: malformed check: id {meta['id']!r} is not like 'area.name'")
    sql = "\n".join(body).strip().rstrip(";")
    if not sql:
        raise TraceError(f"{path}: malformed check: no query after the header")
    needs, optional = [], []
    for name in (n.strip() for n in meta["needs"].split(",")):
        if name.endswith(_OPTIONAL):
            optional.append(name[:-len(_OPTIONAL)].strip())
        elif name:
            needs.append(name)
    return Invariant(id=meta["id"], severity=meta["severity"], title=meta["title"],
                     why=meta["why"], relies_on=meta["relies_on"], needs=needs, sql=sql,
                     path=path, note=meta.get("note", ""), meta=meta, optional=optional)


def check_needs(inv: Invariant, con: duckdb.DuckDBPyConnection) -> None:
    """TraceError unless `needs` lists exactly what the query reads: every table and view it
    reads, and nothing that it reads neither itself nor through a view it reads."""
    try:
        direct = reads(inv.sql, con)
    except (ValueError, duckdb.Error) as e:
        raise TraceError(f"{inv.path}: malformed check: its query does not parse as a "
                         f"SELECT ({' '.join(str(e).split())})") from None
    known = set(schema.TABLE_NAMES) | set(VIEW_DOCS)
    declared = inv.needs + inv.optional
    problems = []
    if unknown := sorted(set(declared) - known):
        problems.append(f"needs {', '.join(unknown)}, which no trace has")
    if undeclared := sorted((direct & known) - set(declared)):
        problems.append(f"`needs:` lacks {', '.join(undeclared)}, which its query reads")
    # a view read through another may be listed: the checker then stores it before the check
    if unread := sorted((set(declared) & known) - through(direct)):
        problems.append(f"`needs:` lists {', '.join(unread)}, which its query never reads")
    if strange := sorted(direct - known):
        problems.append(f"reads {', '.join(strange)}, which no trace has")
    if problems:
        raise TraceError(f"{inv.path}: malformed check: {'; '.join(problems)}")


def load(extra_dirs: list[Path] | None = None, builtin: bool = True) -> list[Invariant]:
    """The built-in checks and those in `extra_dirs`. The `needs:` of a check from
    `extra_dirs` is checked here (check_needs); the built-in checks' are not: they change only
    with the package, whose tests check them (tests/query/test_needs.py), and DuckDB's parser
    over every one of them would be most of a short command's start. A built-in check's file
    is named by its id (`invariants/<id>.sql`: the docs link each check's source by that
    name); a user's checks may be named as their author likes."""
    dirs = ([(BUILTIN_DIR, False)] if builtin else []) + [(Path(d), True)
                                                          for d in extra_dirs or []]
    found: dict[str, Invariant] = {}
    con = None
    try:
        for d, users in dirs:
            if not d.is_dir():
                raise TraceError(f"{d}: no such invariants directory")
            for path in sorted(d.glob("*.sql")):
                inv = parse(path)
                if not users and path.stem != inv.id:
                    raise TraceError(f"{path}: malformed check: a built-in check's file is "
                                     f"named by its id, {inv.id}.sql")
                if inv.id in found:
                    raise TraceError(f"{path}: duplicate check id {inv.id!r} "
                                     f"(also in {found[inv.id].path})")
                if users:
                    con = con or duckdb.connect()
                    check_needs(inv, con)
                found[inv.id] = inv
    finally:
        if con is not None:
            con.close()
    return sorted(found.values(), key=lambda i: i.id)


def validate(invariants: list[Invariant]) -> None:
    """check_needs on each: what load() does for a user's checks, for any list of checks."""
    with duckdb.connect() as con:
        for inv in invariants:
            check_needs(inv, con)


def markdown(invariants: list[Invariant]) -> str:
    """docs/invariants.md, generated from the headers."""
    out = ["<!-- generated by `python -m vllm_contract.replay.query.catalog`; edit the .sql headers -->",
           "", "# The invariant catalog", "",
           "Each check is a SQL file in `replay/query/invariants/`; its header is the documentation "
           "below. A finding names the invariant, the engine, the step and the request. "
           "`Needs` lists the tables and views a check reads (checked when the catalog loads): "
           "on a trace that lacks one of those tables the check is skipped, except for those "
           "it reads when present, which an absent table leaves empty. The SQL keeps to the rules "
           "of docs/portable-sql.md, so that `check --sql-engine spark` finds the same.", "",
           "Every read vLLM's model runner makes of the scheduler's output, and which check "
           "guards it: [docs/worker-reads.md](worker-reads.md).", "",
           "| id | severity | title |", "|---|---|---|"]
    out += [f"| `{i.id}` | {i.severity} | {i.title} |" for i in invariants]
    for i in invariants:
        out += ["", f"## `{i.id}` ({i.severity})", "", i.title + ".", "",
                f"- Why it matters: {i.why}", f"- Relied on by: {i.relies_on}",
                f"- Needs: {', '.join(i.needs) or '-'}"
                + (f"; reads when present: {', '.join(i.optional)}" if i.optional else "")]
        if i.note:
            out.append(f"- Not reported: {i.note}")
        out.append(f"- Source: `replay/query/invariants/{i.path.name}`")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    print(markdown(load()), end="")
