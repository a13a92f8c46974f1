"""Whether a trace still holds every row its recorder wrote, and whether its Parquet segments
carry the checksums they claim.

Checksums catch bytes changed in place; they say nothing of rows that are gone. A live
segment's `steps` stream counts every other table's rows per flush in its commit markers
(trace.py ROWS_KEY), so a table's segment that holds fewer rows than were committed, or none,
lost them after they were written; a table's segment with rows beside no `steps` segment lost
its steps and their markers; and in format 2, rows under an `engine=NAME` partition that no
manifest names belong to no engine any reader opens. Compaction carries a segment's markers into
its `steps` Parquet; segments compacted before it did carry none: there the manifest's counts are
all that is left.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

from vllm_contract import schema

# `EngineTrace` and `Trace` below are trace.py's, which imports this module: annotations only
# (never evaluated), so that no import runs back into trace.py.

_MARKERS = "the steps stream's commit markers"
# Schema metadata of a Parquet segment whose pages carry checksums (recorder/compact.py): the
# others have none to verify, and decoding every page of them would check nothing.
PAGE_CHECKSUMS_KEY = b"vllm_contract.page_checksums"


def rows_on_disk(path: Path) -> int:
    """A segment's rows as written: a Parquet footer's count, a stream's whole batches (a torn
    tail, an empty file or one torn in its schema count what they hold)."""
    if path.suffix == schema.PARQUET_SUFFIX:
        try:
            return pq.ParquetFile(path).metadata.num_rows
        except (pa.ArrowException, OSError, ValueError):
            return 0  # unreadable: the reader reports it when it reads the file
    n = 0
    try:
        reader = ipc.open_stream(pa.py_buffer(path.read_bytes()))
        for batch in reader:
            n += batch.num_rows
    except (pa.ArrowException, OSError, ValueError, EOFError):
        pass
    return n


def _has_schema(stream: Path) -> bool:
    """Whether a stream segment got as far as its schema (not empty, not torn inside it)."""
    try:
        ipc.open_stream(pa.py_buffer(stream.read_bytes()))
    except (pa.ArrowException, OSError, ValueError, EOFError):
        return False
    return True


def _lost_committed(e: EngineTrace, by_table: dict[str, dict[str, Path]]) -> list[str]:
    """Rows the commit markers count that their table's segment does not hold."""
    out = []
    for seq, steps_path in sorted(by_table["steps"].items()):
        committed = e.commits(steps_path)
        for table, n in sorted((committed or {}).items()):
            if table == "steps" or table not in by_table or n <= 0:
                continue
            path = by_table[table].get(seq)
            if path is None:
                gone = schema.table_dir(e.dir, table) / f"{seq}{steps_path.suffix}"
                out.append(f"{gone}: gone (deleted, renamed or hidden), though {_MARKERS} "
                           f"count {n} row(s) of table {table} written to it")
                continue
            held = rows_on_disk(path)
            if held < n:
                out.append(f"{path}: holds {held} of the {n} row(s) {_MARKERS} count written "
                           "to it (rows lost after they were written)")
    return out


def _lost_steps(e: EngineTrace, by_table: dict[str, dict[str, Path]]) -> list[str]:
    """Segments of other tables with rows beside a `steps` segment that is gone or empty:
    the writer opens every table's stream with its schema, `steps` first, and commits each
    flush in `steps` last, so only damage leaves rows without their steps."""
    out = []
    steps = by_table["steps"]
    # a segment deleted at the size cap whose deletion was cut short (steps go first)
    pruned = {f"{p['segment']:06d}" for p in e.manifest.get("pruned_segments", [])
              if p.get("segment") is not None}
    for table, paths in by_table.items():
        if table == "steps":
            continue
        for seq, path in sorted(paths.items()):
            mate = steps.get(seq)
            if seq in pruned or (mate is not None and (mate.suffix == schema.PARQUET_SUFFIX
                                                       or _has_schema(mate))):
                continue  # a stream's markers are _lost_committed's; one without, pre-markers
            held = rows_on_disk(path)
            if held:
                what = ("gone" if mate is None else "empty" if not mate.stat().st_size
                        else "torn before its schema")
                out.append(f"{path}: holds {held} row(s) of table {table}, but segment {seq} "
                           f"of steps (its steps and their commit markers) is {what}")
    return out


def lost_rows(e: EngineTrace) -> list[str]:
    """One "PATH: what" per segment whose rows were lost after they were written."""
    by_table = {t: {p.stem: p for p in e.segments(t)} for t in schema.TABLE_NAMES}
    return _lost_committed(e, by_table) + _lost_steps(e, by_table)


def unverifiable(e: EngineTrace) -> list[str]:
    """What cannot be verified of this engine's segments, one note per kind: Parquet written
    without page checksums (changed bytes pass), and `steps` segments without commit-marker
    counts (rows lost from the other tables pass). Traces recorded or compacted before
    vllm-contract wrote either (format 1: the committed samples) have neither."""
    parquet = [p for t in schema.TABLE_NAMES for p in e.segments(t)
               if p.suffix == schema.PARQUET_SUFFIX]
    bare = 0
    for p in parquet:
        try:
            bare += PAGE_CHECKSUMS_KEY not in (pq.read_schema(p).metadata or {})
        except (pa.ArrowException, OSError, ValueError):
            pass  # unreadable: the reader reports it when it reads the file
    steps = e.segments("steps")
    uncounted = sum(e.commits(p) is None for p in steps)
    notes = []
    if bare:
        notes.append(f"{bare} of {len(parquet)} Parquet segment(s) carry no page checksums "
                     "(written before vllm-contract wrote them, or by another tool): bytes "
                     "changed in them cannot be detected")
    if uncounted:
        notes.append(f"{uncounted} of {len(steps)} steps segment(s) carry no row counts "
                     "(recorded or compacted before commit markers, or by another tool): rows "
                     "lost from the other tables there cannot be detected, only the steps' count "
                     "is compared with the manifest")
    return notes


def unknown_partitions(trace: Trace) -> list[str]:
    """Format 2: one "PATH: what" per table partition `engine=NAME` that no manifest under
    `_engines/` names (a renamed or copied partition: no reader opens its rows)."""
    homes = trace.root / schema.ENGINES_DIR
    if not homes.is_dir():
        return []
    named = {p.name for p in homes.iterdir() if p.name.startswith(schema.ENGINE_DIR_PREFIX)}
    out = []
    for table in schema.TABLE_NAMES:
        tdir = trace.root / table
        if not tdir.is_dir():
            continue
        for part in sorted(tdir.iterdir()):
            if not part.name.startswith(schema.ENGINE_DIR_PREFIX) or part.name in named:
                continue
            files = [p for p in part.iterdir() if p.is_file()
                     and p.suffix in (schema.SEGMENT_SUFFIX, schema.PARQUET_SUFFIX)]
            if files:
                out.append(f"{part}: {len(files)} segment(s) of table {table} under a partition "
                           f"no manifest names (engine {schema.plain_engine(part.name)}): "
                           "no engine's rows include them")
    return out


# Parquet's PageHeader (Thrift compact protocol): fields 1-3 are i32s (type, sizes), field 4
# the optional crc. A writer that writes checksums writes one on every page.
_I32, _CRC = 5, 4


def has_page_checksums(path: Path) -> bool:
    """Whether the first page of the file carries a CRC (a file rewritten by a tool that kept
    the schema's checksum marker but wrote no checksums has none to verify)."""
    meta = pq.ParquetFile(path).metadata
    if meta.num_row_groups == 0 or meta.num_columns == 0:
        return True  # no pages: nothing to verify
    col = meta.row_group(0).column(0)
    offset = col.dictionary_page_offset if col.has_dictionary_page else col.data_page_offset
    with open(path, "rb") as f:
        f.seek(offset)
        head = f.read(64)
    i, field_id = 0, 0
    while i < len(head):
        byte = head[i]
        i += 1
        delta, kind = byte >> 4, byte & 0x0F
        if byte == 0 or delta == 0 or kind != _I32:
            return False  # the struct ended, or a field past the i32s: no crc
        field_id += delta
        if field_id == _CRC:
            return True
        if field_id > _CRC:
            return False
        while i < len(head) and head[i] & 0x80:  # the i32's varint
            i += 1
        i += 1
    return False
