"""Opening a trace: a root holding one or more engine directories, each with a manifest and one
folder per table of numbered segments (live `.arrows` streams or compacted `.parquet`).

Reading never unpickles: pickled opaque payloads stay bytes unless the caller opts in. A trace is
input from anywhere: every file is opened only if it is a regular file inside the trace (a pipe
would block forever, a device never end), and anything wrong with it is a one-line TraceError.
Data that fails its checksum is not an error but a problem of the trace (`problems`), which
the checks report as findings.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

from vllm_contract import manifest as manifest_schema
from vllm_contract import completeness, liveness, schema
from vllm_contract.errors import TraceError

# The key of a stream batch's custom metadata holding the CRC-32 of the batch as serialized
# (RecordBatch.serialize(), without that metadata): written by recorder/segments.py.
CHECKSUM_KEY = b"vllm_contract.crc32"
# the Parquet page-checksum marker, defined beside the check of what it vouches for
PAGE_CHECKSUMS_KEY = completeness.PAGE_CHECKSUMS_KEY
# A flush is visible to readers only once all of it is on disk: the writer writes every other
# table's batch first and the `steps` batch last, with the rows of each table in that flush as
# JSON under ROWS_KEY; a `steps` stream whose schema carries COMMITS_KEY was written that way,
# and readers cut the other tables' streams of its segment at the last whole flush.
ROWS_KEY = b"vllm_contract.rows"
COMMITS_KEY = b"vllm_contract.commits"
# What a reader can raise on a file that is not what it should be; anything else is our bug.
_BAD_INPUT = (pa.ArrowException, OSError, ValueError, TypeError, KeyError, IndexError,
              OverflowError, RecursionError, EOFError)


@contextlib.contextmanager
def reading(what: object) -> Iterator[None]:
    """Turn what bad input makes pyarrow or the file system raise into a TraceError."""
    try:
        yield
    except TraceError:
        raise
    except _BAD_INPUT as e:
        raise TraceError(f"{what}: unreadable ({type(e).__name__}: {e})") from None


def batch_checksum(batch: pa.RecordBatch) -> bytes:
    """The value stored under CHECKSUM_KEY: the same for a batch and the batch read back."""
    return str(zlib.crc32(batch.serialize())).encode()


def regular_file(path: Path, root: Path | None = None, what: str = "trace segment") -> None:
    """Refuse anything but a regular file (following links) that resolves inside `root`."""
    try:
        mode = os.stat(path).st_mode
    except OSError as e:
        raise TraceError(f"{path}: cannot read {what} ({e.strerror or e})") from None
    if not stat.S_ISREG(mode):
        # A pipe would be waited on forever, a device (a link to /dev/zero) read forever.
        raise TraceError(f"{path}: not a regular file: not a {what}")
    if root is not None:
        inside(path, root)


def inside(path: Path, root: Path) -> None:
    """Refuse a path (a file, a table or engine directory) whose links lead out of the trace."""
    try:
        real, top = path.resolve(strict=True), root.resolve(strict=True)
    except (OSError, RuntimeError) as e:
        raise TraceError(f"{path}: cannot resolve ({e})") from None
    if real != top and top not in real.parents:
        raise TraceError(f"{path}: a link to {real}, outside the trace {top}: refused")


@dataclass
class EngineTrace:
    dir: Path
    manifest: dict
    warnings: list[str] = field(default_factory=list)
    # one line per file or batch that fails its checksum (data damaged after it was written)
    problems: list[str] = field(default_factory=list)
    root: Path | None = None  # the trace's root: nothing outside it is opened (default: dir)
    _commits: dict = field(default_factory=dict, repr=False)  # segment -> rows, or None

    def committed_rows(self, path: Path) -> int | None:
        """How many rows of a stream segment belong to whole flushes (see ROWS_KEY); None: all
        of them (Parquet, the steps table itself, a segment written before commit markers)."""
        table = schema.table_of(path)
        if path.suffix != schema.SEGMENT_SUFFIX or table == "steps":
            return None
        rows = self.commits(schema.table_dir(self.dir, "steps") / path.name)
        return None if rows is None else rows.get(table, 0)

    def commits(self, steps_path: Path) -> dict[str, int] | None:
        """The rows per table that a `steps` stream's commit markers count (see _commits), or
        that compaction carried over into its Parquet (_compacted_commits)."""
        if steps_path.name not in self._commits:
            read = _commits if steps_path.suffix == schema.SEGMENT_SUFFIX else _compacted_commits
            self._commits[steps_path.name] = read(steps_path, self.root or self.dir)
        return self._commits[steps_path.name]

    def lost_rows(self) -> list[str]:
        """One "PATH: what" per segment whose rows are gone (completeness.py); asked once."""
        if "_lost" not in self._commits:
            with reading(self.dir):
                self._commits["_lost"] = completeness.lost_rows(self)
        return self._commits["_lost"]

    def unverified(self) -> list[str]:
        """What of this engine's segments cannot be verified (completeness.py); asked once."""
        if "_unverified" not in self._commits:
            with reading(self.dir):
                self._commits["_unverified"] = completeness.unverifiable(self)
        return self._commits["_unverified"]

    @property
    def name(self) -> str:
        return schema.engine_name(self.dir)

    @property
    def recording(self) -> bool | None:
        """Whether the recorder is still writing this engine (liveness.py): True, False (it
        died), None (a clean close, or a trace that cannot tell). Asked once per open."""
        if "_recording" not in self._commits:
            self._commits["_recording"] = (None if self.manifest.get("closed_cleanly")
                                           else liveness.alive(self.dir))
        return self._commits["_recording"]

    def segments(self, table: str) -> list[Path]:
        """One path per sequence number; Parquet wins over a leftover stream of the same number
        (compaction renames the Parquet into place before it deletes the stream). Every path
        is a regular file inside the trace."""
        root = self.root or self.dir
        by_seq: dict[str, Path] = {}
        tdir = schema.table_dir(self.dir, table)
        if not tdir.is_dir():
            return []
        inside(tdir, root)
        with reading(tdir):
            names = sorted(tdir.iterdir())
        for p in names:
            if p.name.startswith("."):
                continue
            if p.suffix == schema.PARQUET_SUFFIX or (
                    p.suffix == schema.SEGMENT_SUFFIX and p.stem not in by_seq):
                by_seq[p.stem] = p
        paths = [by_seq[k] for k in sorted(by_seq)]
        for p in paths:
            regular_file(p, root)
        return paths

    def parts(self, table: str, columns: list[str] | None = None) -> Iterator[pa.Table]:
        """A table's rows a segment at a time, in stored order (each at most the recorder's
        segment size): the one walk of a table's rows, for a reader that must not hold a big
        table whole. A segment that cannot be read is left out, noted as segment() notes it."""
        for path in self.segments(table):
            part = self.segment(path, columns)
            if part is not None:
                yield part

    def read(self, table: str, columns: list[str] | None = None) -> pa.Table:
        """A table's rows; only `columns` of them if given (Parquet then reads no others)."""
        parts = list(self.parts(table, columns))
        if not parts:
            want = schema.schema(table)
            if columns is not None:
                want = pa.schema([want.field(c) for c in columns])
            return schema.empty(want)
        return pa.concat_tables(parts)

    def count(self, table: str) -> int:
        """A table's row count: a Parquet segment's from its footer, a stream segment's by
        reading it (and reporting a torn tail, as read() does)."""
        n = 0
        for path in self.segments(table):
            if path.suffix == schema.PARQUET_SUFFIX:
                with reading(f"{path}: unreadable Parquet segment"):
                    n += pq.ParquetFile(path).metadata.num_rows
            else:
                part = self.segment(path)
                n += part.num_rows if part is not None else 0
        return n

    def segment(self, path: Path, columns: list[str] | None = None) -> pa.Table | None:
        """One segment of this engine, its warnings and problems noted once (reads repeat)."""
        found: list[str] = []
        damaged: list[str] = []
        part = read_segment(path, found, columns, problems=damaged, root=self.root or self.dir,
                            keep_rows=self.committed_rows(path), live=self.recording is True)
        self.warnings.extend(w for w in found if w not in self.warnings)
        self.problems.extend(p for p in damaged if p not in self.problems)
        return part

    def verify(self, path: Path) -> bool:
        """Whether a Parquet segment's pages pass their checksums (its columns are checked
        too), without keeping its rows: the SQL side lets DuckDB read it, which checks neither.
        A segment that fails is for segment() to read (and note)."""
        return verify_parquet(path, self.root or self.dir)


def _want(path: Path, columns: list[str] | None) -> pa.Schema | None:
    """The schema a segment must have: its table's (the folder's name), or None if unknown."""
    table = schema.table_of(path)
    if table not in schema.TABLES:
        return None
    want = schema.schema(table)
    return want if columns is None else pa.schema([want.field(c) for c in columns])


def _conform(path: Path, data: pa.Table, want: pa.Schema | None) -> pa.Table:
    if want is None or data.schema == want:
        return data
    try:
        return data.cast(want)
    except (pa.ArrowException, ValueError, TypeError) as e:
        raise TraceError(f"{path}: not a segment of table {schema.table_of(path)}: its columns "
                         f"differ ({e})") from None


def _is_checksum_error(e: Exception) -> bool:
    return "checksum" in str(e).lower() or "crc" in str(e).lower()


def verify_parquet(path: Path, root: Path | None = None) -> bool:
    """Read every page of a Parquet segment once, its checksums verified; nothing is kept.
    False if a page fails its checksum."""
    regular_file(path, root)
    want = _want(path, None)
    with reading(f"{path}: unreadable Parquet segment"):
        found = pq.read_schema(path)
    _conform(path, schema.empty(found), want)
    if PAGE_CHECKSUMS_KEY not in (found.metadata or {}):
        return True
    if not _checksummed(path):
        return False  # for segment() to read and note
    try:
        f = pq.ParquetFile(path, page_checksum_verification=True)
        for i in range(f.metadata.num_row_groups):
            f.read_row_group(i)
    except _BAD_INPUT as e:
        _damaged_or_unreadable(path, e)
        return False
    return True


def _checksummed(path: Path) -> bool:
    with reading(f"{path}: unreadable Parquet segment"):
        return completeness.has_page_checksums(path)


def _read_parquet(path: Path, columns: list[str] | None, **options) -> pa.Table:
    # One file, read as a file: pq.read_table would make it a dataset, and pyarrow.dataset
    # imports pandas, which nothing here needs.
    with pq.ParquetFile(path, **options) as f:
        return f.read(columns=columns)


def _damaged_or_unreadable(path: Path, e: Exception) -> None:
    """After a read with page checksums verified failed: return if the checksums are what
    failed (pyarrow then also reports a page it skipped as a column of the wrong length), raise
    a TraceError if the file does not read without them either."""
    if _is_checksum_error(e):
        return
    try:
        f = pq.ParquetFile(path)
        for i in range(f.metadata.num_row_groups):
            f.read_row_group(i)
    except _BAD_INPUT as again:
        raise TraceError(f"{path}: unreadable Parquet segment ({again})") from None


def _commits(steps_path: Path, root: Path) -> dict[str, int] | None:
    """Rows per table in the whole flushes of a segment, read from its steps stream; None when
    that stream was written without commit markers (or is gone: compacted)."""
    try:
        regular_file(steps_path, root)
        with pa.OSFile(str(steps_path)) as f:
            reader = ipc.open_stream(f)
            if COMMITS_KEY not in (reader.schema.metadata or {}):
                return None
            rows: dict[str, int] = {}
            while True:
                try:
                    _, meta = reader.read_next_batch_with_custom_metadata()
                except StopIteration:
                    break
                for table, n in json.loads(meta[ROWS_KEY]).items():
                    rows[table] = rows.get(table, 0) + int(n)
            return rows
    except TraceError:
        return None
    except _BAD_INPUT + (json.JSONDecodeError,):
        return rows if "rows" in locals() else None  # a torn tail: the whole flushes before it


def _compacted_commits(steps_path: Path, root: Path) -> dict[str, int] | None:
    """The commit markers' counts that compaction wrote into a `steps` Parquet's schema
    (ROWS_KEY); None for one compacted before it did, or not readable."""
    try:
        regular_file(steps_path, root)
        rows = json.loads((pq.read_schema(steps_path).metadata or {})[ROWS_KEY])
        return {str(t): int(n) for t, n in rows.items()}
    except (TraceError, AttributeError, json.JSONDecodeError) + _BAD_INPUT:
        return None


def _open_stream(path: Path, data: bytes, warnings: list[str], unknown: bool):
    """A stream's reader, or None for one empty or torn in its schema. Rows committed to it are
    lost (completeness.py says so); markers counting none for it mean a table without rows whose
    writer never closed it (the schema goes out with the first batch). Only without markers
    (`unknown`) is there something to warn of."""
    if not data:
        if unknown:
            warnings.append(f"{path}: empty segment (the writer died before its first write)")
        return None
    if data == _STREAM_MARKER + bytes(4):
        # the end-of-stream marker alone: closed after its schema failed to go out (a full
        # disk), so no row was ever in it
        if unknown:
            warnings.append(f"{path}: closed before its schema was written (no data lost)")
        return None
    try:
        return ipc.open_stream(pa.py_buffer(data))
    except _BAD_INPUT as e:
        if _torn_in_schema(data):
            if unknown:
                warnings.append(f"{path}: torn before its schema was written (no data lost)")
            return None
        raise TraceError(f"{path}: not an Arrow stream segment ({e})") from None


def read_segment(path: Path, warnings: list[str], columns: list[str] | None = None, *,
                 problems: list[str] | None = None, root: Path | None = None,
                 keep_rows: int | None = None, live: bool = False) -> pa.Table | None:
    """Every whole batch of a segment, with its table's schema; a torn tail (crash mid-write)
    is reported, not fatal. A batch or page failing its checksum is kept and noted in
    `problems` (in `warnings` without it)."""
    problems = warnings if problems is None else problems
    regular_file(path, root)
    want = _want(path, columns)
    if path.suffix == schema.PARQUET_SUFFIX:
        # the columns first: a read failing for lack of one is no checksum's doing
        with reading(f"{path}: unreadable Parquet segment"):
            found = pq.read_schema(path)
        _conform(path, schema.empty(found), _want(path, None))
        if PAGE_CHECKSUMS_KEY in (found.metadata or {}) and not _checksummed(path):
            # pyarrow passes a page without a checksum: the marker alone would vouch for it
            problems.append(f"{path}: marked as carrying page checksums, but its pages have "
                            "none (rewritten by another tool: its data cannot be verified)")
        try:
            data = _read_parquet(path, columns, page_checksum_verification=True)
        except _BAD_INPUT as e:
            _damaged_or_unreadable(path, e)
            try:
                data = _read_parquet(path, columns)
            except _BAD_INPUT:
                problems.append(f"{path}: a page fails its checksum and does not decode "
                                "(damaged after it was written; its rows are left out)")
                return None
            problems.append(f"{path}: a page fails its checksum "
                            "(data damaged after it was written)")
        return _conform(path, data, want)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise TraceError(f"{path}: cannot read segment ({e.strerror or e})") from None
    reader = _open_stream(path, data, warnings, unknown=not live and keep_rows is None)
    if reader is None:
        return None
    batches = []
    bad = 0
    torn: Exception | None = None
    try:
        while True:
            try:
                batch, meta = reader.read_next_batch_with_custom_metadata()
            except StopIteration:
                break
            if meta is not None and CHECKSUM_KEY in meta:
                if meta[CHECKSUM_KEY] != batch_checksum(batch):
                    bad += 1
            batches.append(batch)
    except _BAD_INPUT as e:
        torn = e
    if bad:
        problems.append(f"{path}: {bad} of {len(batches)} batches fail their checksum "
                        "(data damaged after it was written)")
    with reading(path):
        table = pa.Table.from_batches(batches, schema=reader.schema)
    table = _conform(path, table, _want(path, None))
    if torn is not None and not live:  # else the writer is mid-batch: its whole ones are flushed
        why = (f"the writer did not finish: {torn}" if keep_rows is None
               or table.num_rows >= keep_rows else
               f"short of the {keep_rows} rows its flushes committed: rows lost, not unwritten")
        warnings.append(f"{path}: truncated after {len(batches)} whole batches (kept; {why})")
    if keep_rows is not None and table.num_rows > keep_rows:
        if not live:
            warnings.append(f"{path}: {table.num_rows - keep_rows} rows of a flush the writer "
                            "did not finish left out (the manifest says why it stopped)")
        table = table.slice(0, keep_rows)
    return table if columns is None else table.select(columns)


_STREAM_MARKER = b"\xff\xff\xff\xff"


def _torn_in_schema(data: bytes) -> bool:
    """The file ends inside the stream's first message (continuation marker, length, schema):
    a writer that died while starting the segment. A whole schema message that does not parse
    is damage, not a tear."""
    if len(data) < 8:
        return _STREAM_MARKER.startswith(data[:4])
    if not data.startswith(_STREAM_MARKER):
        return False
    return 8 + int.from_bytes(data[4:8], "little", signed=True) > len(data)


def load_manifest(engine_dir: Path, root: Path | None = None) -> dict:
    path = engine_dir / schema.MANIFEST
    if not os.path.lexists(path):
        raise TraceError(f"{engine_dir}: no {schema.MANIFEST}: not a vllm-contract trace")
    regular_file(path, root or engine_dir, what="manifest")
    try:
        data = path.read_bytes()
    except OSError as e:
        raise TraceError(f"{path}: cannot read manifest ({e.strerror or e})") from None
    return manifest_schema.parse(path, data)


@dataclass
class Trace:
    root: Path
    engines: list[EngineTrace]
    source: str | None = None  # the remote URL it was read from (root is a local copy)

    def read(self, table: str) -> pa.Table:
        """All engines' rows of a table, with an `engine` column first."""
        parts = []
        for e in self.engines:
            t = e.read(table)
            parts.append(t.add_column(0, "engine", pa.array([e.name] * t.num_rows, pa.string())))
        return pa.concat_tables(parts)

    @property
    def warnings(self) -> list[str]:
        live = [f"engine {e.name} is still being recorded (its recorder, pid "
                f"{e.manifest.get('pid')}, is alive): reading the steps flushed so far"
                for e in self.engines if e.recording]
        return live + [w for e in self.engines for w in e.warnings]

    @property
    def problems(self) -> list[str]:
        return [p for e in self.engines for p in e.problems]

    def lost_rows(self) -> list[tuple[EngineTrace, str]]:
        """(engine, "PATH: what") per segment whose rows were lost after they were written; rows
        under a partition no manifest names go to the first engine (they have none)."""
        with reading(self.root):
            stray = completeness.unknown_partitions(self)
        return ([(e, p) for e in self.engines for p in e.lost_rows()]
                + [(self.engines[0], p) for p in stray])


def open_trace(path: str | Path) -> Trace:
    """A trace root (several engines), or one engine's directory (format 1) or home (format
    2: TRACE/_engines/engine=NAME, whose tables lie under TRACE); or `s3://bucket/prefix`,
    read through a local copy (remote.py)."""
    from vllm_contract import remote

    url = remote.as_url(path)
    if url is not None:
        t = open_trace(remote.fetch(url))
        t.source = url
        return t
    root = Path(path)
    with reading(root):
        if not root.exists():
            raise TraceError(f"{root}: no such trace directory")
        if not root.is_dir():
            raise TraceError(f"{root}: not a directory (a trace is a directory)")
        if os.path.lexists(root / schema.MANIFEST):
            dirs = [root]
            if root.parent.name == schema.ENGINES_DIR:
                root = root.parent.parent
        else:
            homes = root / schema.ENGINES_DIR
            dirs = sorted(p for p in (homes.iterdir() if homes.is_dir() else ())
                          if p.name.startswith(schema.ENGINE_DIR_PREFIX) and p.is_dir())
            dirs += sorted(p for p in root.iterdir()
                           if p.name.startswith(schema.ENGINE_DIR_PREFIX) and p.is_dir())
    if not dirs:
        with reading(root):
            what = "not a vllm-contract trace" if any(root.iterdir()) else "empty"
        raise TraceError(f"{root}: {what}: no {schema.MANIFEST}, no {schema.ENGINES_DIR}/"
                         "engine=* and no engine=* directories")
    for d in dirs:
        inside(d, root)
    return Trace(root, [EngineTrace(d, load_manifest(d, root), root=root) for d in dirs])
