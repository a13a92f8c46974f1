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


def write_json_atomic(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")
    os.replace(tmp, path)


def segment_path(engine_dir: Path, table: str, seq: int, suffix: str) -> Path:
    return engine_dir / table / f"{seq:06d}{suffix}"


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
            (engine_dir / table).mkdir(parents=True, exist_ok=True)
        self._open()

    def _open(self) -> None:
        self.seq += 1
        self.steps = None
        for table in schema.TABLE_NAMES:
            sink = pa.OSFile(str(segment_path(self.dir, table, self.seq, schema.SEGMENT_SUFFIX)), "wb")
            self.sinks[table] = sink
            self.writers[table] = pa.ipc.new_stream(sink, schema.schema(table))

    def bytes_written(self) -> int:
        return sum(s.tell() for s in self.sinks.values())

    def write(self, batches: dict[str, pa.RecordBatch]) -> bool:
        """Write one batch per table. OSFile is unbuffered: once this returns, the data is in
        the kernel and survives the death of this process. Returns whether a new segment was
        opened (the old one is then closed)."""
        for table, batch in batches.items():
            if batch.num_rows:
                self.writers[table].write_batch(batch)
        steps = batches.get("steps")
        if steps is not None and steps.num_rows:
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
