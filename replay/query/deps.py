"""Which tables and views a query reads, by DuckDB's parser (the parser that runs the catalog,
and the dialect Spark's SQL is transpiled from): one answer for the catalog's `needs:` check,
the views the checker stores before a check, and the views the Spark gateway builds for a
query. A name in a comment, a string or a column, or a common table expression named like a
view, is not a read."""

from __future__ import annotations

import json
import threading
from functools import lru_cache

import duckdb

from vllm_contract.replay.query.views import STORED, derived_views


_parser: duckdb.DuckDBPyConnection | None = None
_parser_lock = threading.Lock()


def reads(sql: str, con: duckdb.DuckDBPyConnection | None = None) -> set[str]:
    """The tables and views a query reads: every table reference but those naming a common
    table expression in scope. ValueError (or duckdb.Error) when it does not parse as a
    SELECT. Without `con`, on a connection of this module's, opened once: a connection costs
    more than parsing a check (bench/RESULTS.md)."""
    global _parser
    if con is None:
        with _parser_lock:
            if _parser is None:
                _parser = duckdb.connect()
            return reads(sql, _parser)
    parsed = json.loads(con.execute("SELECT json_serialize_sql(?)", [sql]).fetchone()[0])
    if parsed.get("error"):
        raise ValueError(f"{parsed.get('error_type')}: {parsed.get('error_message')}")
    found: set[str] = set()

    def walk(node, ctes: frozenset) -> None:
        if isinstance(node, list):
            for v in node:
                walk(v, ctes)
            return
        if not isinstance(node, dict):
            return
        if (node.get("type") == "BASE_TABLE" and node.get("schema_name") in ("", "main", None)
                and node.get("table_name", "").lower() not in ctes):
            found.add(node["table_name"].lower())
        cte_map = node.get("cte_map")
        if isinstance(cte_map, dict):
            for entry in cte_map.get("map", []):  # each sees the ones before it
                walk(entry.get("value"), ctes)
                ctes = ctes | {entry["key"].lower()}
        for key, v in node.items():
            if key != "cte_map":
                walk(v, ctes)

    walk(parsed.get("statements"), frozenset())
    return found


@lru_cache(maxsize=1)
def view_reads() -> dict[str, frozenset]:
    """What each derived view reads itself, in creation order (the same whatever the engines:
    per_engine repeats a pass, never changes what it reads)."""
    return {name: frozenset(reads(body)) for name, body in derived_views(["engine"]).items()}


@lru_cache(maxsize=1)
def _derived() -> tuple[str, ...]:
    """The derived views' names in creation order, known without parsing them."""
    return tuple(derived_views(["engine"]))


def through(names) -> set[str]:
    """`names` and every table and view read through the derived views among them."""
    names = set(names)
    # Names of tables alone read nothing more, and need no parse of every derived view
    # (view_reads): `info`'s integrity checks read only tables.
    if names.isdisjoint(_derived()):
        return names
    graph = view_reads()
    out, todo = set(), list(names)
    while todo:
        name = todo.pop()
        if name not in out:
            out.add(name)
            todo += graph.get(name, ())
    return out


def derived_read(names) -> list[str]:
    """The derived views among `names` and those they read, in creation order (each reads only
    views before it)."""
    wanted = through(names)
    return [v for v in _derived() if v in wanted]


def stored_before(name: str) -> tuple[str, ...]:
    """The views to store (STORED), in creation order, before a query reads `name`: itself if
    stored, and the stored views it reads."""
    return tuple(v for v in derived_read([name]) if v in STORED)


def stored_views() -> tuple[str, ...]:
    """Every stored view, in creation order."""
    return tuple(v for v in view_reads() if v in STORED)
