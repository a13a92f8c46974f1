"""Arrow IPC stream segments on disk: one stream per table per segment, rotated by size.

The stream format stays readable while being written and after a SIGKILL (every whole batch),
which the IPC file format and Parquet do not; Parquet is made later, from closed segments only.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa

from vllm_contract import schema
from vllm_contract.trace import CHECKSUM_KEY, COMMITS_KEY, ROWS_KEY, batch_checksum


def write_json_atomic(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        tmp.write_text(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)  # a full disk must not leave half a manifest behind
        raise


def segment_path(engine_dir: Path, table: str, seq: int, suffix: str) -> Path:
    return schema.table_dir(engine_dir, table) / f"{seq:06d}{suffix}"


class SegmentSet:
    """The open segment: one stream writer per table, all sharing a sequence number."""

    def __init__(self, engine_dir: Path, segment_bytes: int) -> None:
        self.dir = engine_dir
        self.segment_bytes = segment_bytes
        self.seq = -1
        self.sinks: dict[str, pa.NativeFile] = {}
        self.writers: dict[str, pa.ipc.RecordBatchStreamWriter] = {}
        self.steps: list[int] | None = None  # [first, last] step of the open segment's `steps`
        self.closed: list[dict] = []  # {segment, bytes, steps} of closed segments, oldest first
        for table in schema.TABLE_NAMES:
            schema.table_dir(engine_dir, table).mkdir(parents=True, exist_ok=True)
        self._open()

    def _open(self) -> None:
        self.seq += 1
        self.steps = None
        for table in schema.TABLE_NAMES:
            sink = pa.OSFile(str(segment_path(self.dir, table, self.seq, schema.SEGMENT_SUFFIX)), "wb")
            self.sinks[table] = sink
            sch = schema.schema(table)
            if table == "steps":
                sch = sch.with_metadata({**(sch.metadata or {}), COMMITS_KEY: b"1"})
            self.writers[table] = pa.ipc.new_stream(sink, sch)

    def bytes_written(self) -> int:
        return sum(s.tell() for s in self.sinks.values())

    def write(self, batches: dict[str, pa.RecordBatch]) -> bool:
        """Write one batch per table. OSFile is unbuffered: once this returns, the data is in
        the kernel and survives the death of this process. Returns whether a new segment was
        opened (the old one is then closed). Each batch carries its checksum (custom metadata,
        verified by the reader): a bit flipped on disk becomes a finding, not a wrong row."""
        rows = {}
        for table, batch in batches.items():
            if batch.num_rows and table != "steps":
                self.writers[table].write_batch(
                    batch, custom_metadata={CHECKSUM_KEY: batch_checksum(batch)})
                rows[table] = batch.num_rows
        # Last, and always: the flush's commit (see core/trace.py ROWS_KEY). A flush torn by a
        # failure (a full disk) or a kill is then cut off by readers, not half read.
        steps = batches.get("steps")
        if steps is None:
            steps = pa.RecordBatch.from_pylist([], schema=schema.schema("steps"))
        self.writers["steps"].write_batch(steps, custom_metadata={
            CHECKSUM_KEY: batch_checksum(steps), ROWS_KEY: json.dumps(rows).encode()})
        if steps.num_rows:
            col = steps.column("step")
            first, last = col[0].as_py(), col[-1].as_py()
            self.steps = [first, last] if self.steps is None else [self.steps[0], last]
        if self.bytes_written() >= self.segment_bytes:
            self.closed.append({"segment": self.seq, "bytes": self.bytes_written(),
                                "steps": self.steps})
            self.close()
            self._open()
            return True
        return False

    def prune(self, max_bytes: int) -> list[dict]:
        """Delete the oldest closed segments (every table, stream or Parquet) while the trace
        holds more than max_bytes; returns what was deleted."""
        pruned = []
        total = sum(c["bytes"] for c in self.closed) + self.bytes_written()
        while self.closed and total > max_bytes:
            seg = self.closed.pop(0)
            for table in schema.TABLE_NAMES:
                for suffix in (schema.SEGMENT_SUFFIX, schema.PARQUET_SUFFIX):
                    try:
                        segment_path(self.dir, table, seg["segment"], suffix).unlink()
                    except FileNotFoundError:
                        pass
            total -= seg["bytes"]
            pruned.append({**seg, "reason": "max_trace_bytes"})
        return pruned

    def close(self) -> None:
        for table in list(self.writers):
            self.writers.pop(table).close()
            self.sinks.pop(table).close()
