"""A table's segments for the columnar loader (columns.py), one at a time, with Parquet ones read
keeping their string columns as the dictionaries the file stores.

The trace reader (core/trace.py: EngineTrace.segment, read_segment) always decodes string
columns into strings, and has no read that leaves them dictionary-encoded; decoding a million
steps' request ids and hashing them back into codes is most of the cost of loading them. So the
Parquet read is done here, after the same checks, and anything unusual goes back to the trace
reader, which reads it and reports what is wrong with it.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from vllm_contract import schema
from vllm_contract.errors import TraceError
from vllm_contract.trace import regular_file


def parts(engine, table: str, columns: list[str], as_dict: tuple[str, ...] = ()):
    """The table's segments one at a time (a trace's big tables are never whole in memory as
    Arrow), or the whole table from an engine that only reads whole tables."""
    if not (hasattr(engine, "segments") and hasattr(engine, "segment")):
        part = engine.read(table, columns)
        if part.num_rows:
            yield part
        return
    root = getattr(engine, "root", None) or engine.dir
    for path in engine.segments(table):
        part = None
        if path.suffix == schema.PARQUET_SUFFIX and as_dict:
            part = parquet(path, table, columns, as_dict, root)
        if part is None:
            part = engine.segment(path, columns)
        if part is not None and part.num_rows:
            yield part


def parquet(path, table: str, columns: list[str], as_dict: tuple[str, ...], root):
    """A Parquet segment read as the trace reader reads it, but with the string columns
    `as_dict` left as the dictionaries the file stores. None for anything but a plain readable
    segment of the expected schema: the trace reader then reads it, and reports what is wrong
    with it."""
    try:
        regular_file(path, root)
        found = pq.read_schema(path)
        want = schema.schema(table)
        if [(f.name, f.type) for f in found] != [(f.name, f.type) for f in want]:
            return None
        return pq.read_table(path, columns=columns, read_dictionary=list(as_dict),
                             page_checksum_verification=True)
    except (pa.ArrowException, OSError, ValueError, TypeError, KeyError, IndexError,
            EOFError, TraceError):
        return None
