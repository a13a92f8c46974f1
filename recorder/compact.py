"""Closed stream segments → Parquet (zstd). Each file is written under a temporary name and renamed
into place before its stream is deleted, so a crash at any point leaves a readable trace (the
reader prefers a segment's Parquet over its stream)."""

from __future__ import annotations

import json
import os
import socket


import pyarrow.parquet as pq

from vllm_contract import schema
from vllm_contract.recorder.segments import write_json_atomic
from vllm_contract.trace import (PAGE_CHECKSUMS_KEY, ROWS_KEY, EngineTrace, Trace,
                                 read_segment)


def _writer_alive(manifest: dict) -> bool:
    if manifest.get("closed_cleanly") or manifest.get("host") != socket.gethostname():
        return False
    try:
        os.kill(int(manifest["pid"]), 0)
    except (ProcessLookupError, KeyError, TypeError, ValueError):
        return False
    except PermissionError:
        return True
    return True


def compact_engine(e: EngineTrace, on_file=None) -> dict:
    """Compact one engine's closed segments. A torn segment's warning would vanish with the
    stream it describes, so it is kept in the manifest (compaction_warnings)."""
    live = _writer_alive(e.manifest)
    seen = len(e.warnings)
    stats = {"compacted": 0, "skipped_live": 0, "skipped_damaged": 0, "bytes_before": 0,
             "bytes_after": 0}
    # `steps` last: its streams say where the other tables' flushes end (committed_rows)
    for table in sorted(schema.TABLE_NAMES, key=lambda t: t == "steps"):
        for path in schema.table_dir(e.dir, table).glob(f"*{schema.SEGMENT_SUFFIX}"):
            if path.with_suffix(schema.PARQUET_SUFFIX).exists():  # a crash mid-compaction
                path.unlink()
        streams = [p for p in e.segments(table) if p.suffix == schema.SEGMENT_SUFFIX]
        if live and streams:
            stats["skipped_live"] += 1
            streams = streams[:-1]  # the writer still appends to the newest one
        for path in streams:
            damaged: list[str] = []
            data = read_segment(path, e.warnings, problems=damaged, root=e.root or e.dir,
                                keep_rows=e.committed_rows(path))
            if damaged:
                # A Parquet file made from it would carry fresh checksums over the damage:
                # the stream stays, and keeps failing its checksum where the checks see it.
                e.problems.extend(p for p in damaged if p not in e.problems)
                stats["skipped_damaged"] += 1
                continue
            target = path.with_suffix(schema.PARQUET_SUFFIX)
            stats["bytes_before"] += path.stat().st_size
            if data is not None:
                tmp = path.with_name(f".{path.stem}.tmp-{os.getpid()}{schema.PARQUET_SUFFIX}")
                # page checksums: the reader verifies them (DuckDB, which reads these files for
                # the checks, does not: the gateway verifies each file first)
                data = data.cast(schema.schema(table))
                meta = {**(data.schema.metadata or {}), PAGE_CHECKSUMS_KEY: b"crc32"}
                committed = e.commits(path) if table == "steps" else None
                if committed is not None:
                    # the markers go with their stream: without them no lost row of the
                    # compacted segments could be told from one never written
                    meta[ROWS_KEY] = json.dumps(committed, sort_keys=True).encode()
                data = data.replace_schema_metadata(meta)
                pq.write_table(data, tmp, compression="zstd", write_page_checksum=True)
                os.replace(tmp, target)
                stats["bytes_after"] += target.stat().st_size
            path.unlink()
            stats["compacted"] += 1
            if on_file:
                on_file(path)
    if len(e.warnings) > seen:
        e.manifest.setdefault("compaction_warnings", []).extend(e.warnings[seen:])
        write_json_atomic(e.dir / schema.MANIFEST, e.manifest)
    return stats


def compact(trace: Trace, on_file=None) -> dict:
    total: dict[str, int] = {}
    for e in trace.engines:
        for k, v in compact_engine(e, on_file).items():
            total[k] = total.get(k, 0) + v
    return total


def segment_count(trace: Trace) -> int:
    return sum(1 for e in trace.engines for t in schema.TABLE_NAMES for p in e.segments(t)
               if p.suffix == schema.SEGMENT_SUFFIX)



