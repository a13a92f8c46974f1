"""What every query gateway answers, DuckDB's (gateway.py) and Spark's (spark.py): the checker
and the commands that run it type against QueryGateway, so that either engine runs the same
catalog. What the two do alike lives here once."""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import TypeVar

import pyarrow as pa

from vllm_contract import schema
from vllm_contract.trace import Trace, open_trace
from vllm_contract.replay.query.views import VIEW_DOCS

G = TypeVar("G", bound="QueryGateway")


class QueryGateway(ABC):
    """One trace's tables, the manifest's views and the derived views, queried in DuckDB SQL.

    `present`: the tables with at least one segment in some engine (a check needing another is
    skipped). `sql` returns Arrow; every engine's error is a TraceError. A gateway is a context
    manager that closes itself."""

    trace: Trace
    present: set[str]

    def _open(self, trace: Trace | str | Path) -> None:
        """The state both gateways start from: the trace opened, nothing stored yet."""
        self.trace = trace if isinstance(trace, Trace) else open_trace(trace)
        self.present = set()
        self._materialized: set[str] = set()

    @property
    def warnings(self) -> list[str]:
        """What the reader noted about the trace (torn tails, damaged segments)."""
        return self.trace.warnings

    @property
    def views(self) -> list[str]:
        """Every table and view a query may read, documented in views.VIEW_DOCS."""
        return list(VIEW_DOCS)

    def is_materialized(self, view: str) -> bool:
        return view in self._materialized

    @abstractmethod
    def materialize(self, view: str) -> None:
        """Compute a derived view once and keep the result for the queries after."""

    @abstractmethod
    def sql(self, query: str) -> pa.Table:
        """`query`'s result (DuckDB SQL) as Arrow."""

    @abstractmethod
    def close(self) -> None:
        """Release the engine's resources."""

    def __enter__(self: G) -> G:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def verified_parquet(trace: Trace) -> dict[Path, bool]:
    """Each Parquet segment of the trace verified (EngineTrace.verify): neither engine checks
    page checksums nor columns' types. (Two threads at it saved nothing measurable on a
    million-step trace's 550 files: bench/RESULTS.md.)"""
    return {p: e.verify(p) for table in schema.TABLE_NAMES for e in trace.engines
            for p in e.segments(table) if p.suffix == schema.PARQUET_SUFFIX}
