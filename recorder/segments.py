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
        for table in schema.TABLE_NAMES:
            (engine_dir / table).mkdir(parents=True, exist_ok=True)
        self._open()

    def _open(self) -> None:
        self.seq += 1
        for table in schema.TABLE_NAMES:
            sink = pa.OSFile(str(segment_path(self.dir, table, self.seq, schema.SEGMENT_SUFFIX)), "wb")
            self.sinks[table] = sink
            self.writers[table] = pa.ipc.new_stream(sink, schema.schema(table))

    def bytes_written(self) -> int:
        return sum(s.tell() for s in self.sinks.values())

    def write(self, batches: dict[str, pa.RecordBatch]) -> None:
        """Write one batch per table. OSFile is unbuffered: once this returns, the data is in
        the kernel and survives the death of this process."""
        for table, batch in batches.items():
            if batch.num_rows:
                self.writers[table].write_batch(batch)
        if self.bytes_written() >= self.segment_bytes:
            self.close()
            self._open()

    def close(self) -> None:
        for table in list(self.writers):
            self.writers.pop(table).close()
            self.sinks.pop(table).close()
