"""Opening a trace: a root holding one or more engine directories, each with a manifest and one
folder per table of numbered segments (live `.arrows` streams or compacted `.parquet`).

Reading never unpickles: pickled opaque payloads stay bytes unless the caller opts in.
"""

from __future__ import annotations

import json
import stat
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

from vllm_contract import schema
from vllm_contract.errors import TraceError


@dataclass
class EngineTrace:
    dir: Path
    manifest: dict
    warnings: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.dir.name

    def segments(self, table: str) -> list[Path]:
        """One path per sequence number; Parquet wins over a leftover stream of the same number
        (compaction renames the Parquet into place before it deletes the stream)."""
        by_seq: dict[str, Path] = {}
        tdir = self.dir / table
        if not tdir.is_dir():
            return []
        for p in sorted(tdir.iterdir()):
            if p.name.startswith("."):
                continue
            if p.suffix == schema.PARQUET_SUFFIX or (
                    p.suffix == schema.SEGMENT_SUFFIX and p.stem not in by_seq):
                by_seq[p.stem] = p
        return [by_seq[k] for k in sorted(by_seq)]

    def read(self, table: str, columns: list[str] | None = None) -> pa.Table:
        """A table's rows; only `columns` of them if given (Parquet then reads no others)."""
        parts = [self._segment(p, columns) for p in self.segments(table)]
        want = schema.schema(table)
        if columns is not None:
            want = pa.schema([want.field(c) for c in columns])
        parts = [p.cast(want) if p.schema != want else p for p in parts if p is not None]
        if not parts:
            return want.empty_table()
        return pa.concat_tables(parts)

    def count(self, table: str) -> int:
        """A table's row count: a Parquet segment's from its footer, a stream segment's by
        reading it (and reporting a torn tail, as read() does)."""
        n = 0
        for path in self.segments(table):
            if path.suffix == schema.PARQUET_SUFFIX:
                try:
                    n += pq.ParquetFile(path).metadata.num_rows
                except Exception as e:
                    raise TraceError(f"{path}: unreadable Parquet segment ({e})") from None
            else:
                part = self._segment(path)
                n += part.num_rows if part is not None else 0
        return n

    def _segment(self, path: Path, columns: list[str] | None = None) -> pa.Table | None:
        found: list[str] = []
        part = read_segment(path, found, columns)
        self.warnings.extend(w for w in found if w not in self.warnings)  # reads repeat
        return part


def read_segment(path: Path, warnings: list[str],
                 columns: list[str] | None = None) -> pa.Table | None:
    """Every whole batch of a segment; a torn tail (crash mid-write) is reported, not fatal."""
    if path.suffix == schema.PARQUET_SUFFIX:
        try:
            return pq.read_table(path, columns=columns)
        except Exception as e:
            raise TraceError(f"{path}: unreadable Parquet segment ({e})") from None
    try:
        if not stat.S_ISREG(path.stat().st_mode):
            # A device or pipe in a trace (e.g. a symlink to /dev/zero) would be read forever.
            raise TraceError(f"{path}: not a regular file: not a trace segment")
        data = path.read_bytes()
    except OSError as e:
        raise TraceError(f"{path}: cannot read segment ({e.strerror or e})") from None
    if not data:
        warnings.append(f"{path}: empty segment (the writer died before its first write)")
        return None
    try:
        reader = ipc.open_stream(pa.py_buffer(data))
    except (pa.ArrowInvalid, OSError) as e:
        if data.startswith(_STREAM_MARKER):
            warnings.append(f"{path}: torn before its schema was written (no data lost)")
            return None
        raise TraceError(f"{path}: not an Arrow stream segment ({e})") from None
    batches = []
    try:
        for batch in reader:
            batches.append(batch)
    except (pa.ArrowInvalid, OSError) as e:
        warnings.append(f"{path}: truncated after {len(batches)} whole batches "
                        f"(kept; the writer did not finish: {e})")
    table = pa.Table.from_batches(batches, schema=reader.schema)
    return table if columns is None else table.select(columns)


_STREAM_MARKER = b"\xff\xff\xff\xff"


def load_manifest(engine_dir: Path) -> dict:
    path = engine_dir / schema.MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError:
        raise TraceError(f"{engine_dir}: no {schema.MANIFEST}: not a vllm-contract trace") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise TraceError(f"{path}: manifest is not valid JSON ({e})") from None
    if not isinstance(manifest, dict) or "format_version" not in manifest:
        raise TraceError(f"{path}: manifest has no format_version: not a vllm-contract trace")
    version = manifest["format_version"]
    if not isinstance(version, int) or version > schema.FORMAT_VERSION:
        raise TraceError(f"{path}: trace format version {version} is newer than this "
                         f"vllm-contract reads ({schema.FORMAT_VERSION}); upgrade vllm-contract")
    return manifest


@dataclass
class Trace:
    root: Path
    engines: list[EngineTrace]

    def read(self, table: str) -> pa.Table:
        """All engines' rows of a table, with an `engine` column first."""
        parts = []
        for e in self.engines:
            t = e.read(table)
            parts.append(t.add_column(0, "engine", pa.array([e.name] * t.num_rows, pa.string())))
        return pa.concat_tables(parts)

    @property
    def warnings(self) -> list[str]:
        return [w for e in self.engines for w in e.warnings]


def open_trace(path: str | Path) -> Trace:
    """A trace root (several engines) or one engine directory."""
    root = Path(path)
    if not root.exists():
        raise TraceError(f"{root}: no such trace directory")
    if not root.is_dir():
        raise TraceError(f"{root}: not a directory (a trace is a directory)")
    if (root / schema.MANIFEST).exists():
        dirs = [root]
    else:
        dirs = sorted(p for p in root.iterdir()
                      if p.is_dir() and p.name.startswith(schema.ENGINE_DIR_PREFIX))
    if not dirs:
        raise TraceError(f"{root}: empty: no {schema.MANIFEST} and no engine=* directories")
    return Trace(root, [EngineTrace(d, load_manifest(d)) for d in dirs])
