"""Helpers of the reader tests: private copies of the committed samples (as compacted, or
rewritten as live stream segments), the CLI, and what a clean failure looks like."""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
from typer.testing import CliRunner

from vllm_contract import schema
from vllm_contract.cli import app
from vllm_contract.recorder.segments import SegmentSet

SAMPLES = Path(__file__).resolve().parents[1] / "samples"
ERROR_PREFIX = "vllm-contract: error:"


def engine_dir(root: Path) -> Path:
    """The one engine's home (the directory of its manifest), in either format."""
    homes = root / schema.ENGINES_DIR
    (d,) = [p for p in (homes.iterdir() if homes.is_dir() else root.iterdir())
            if p.name.startswith(schema.ENGINE_DIR_PREFIX)]
    return d


def table_dir(root: Path, table: str) -> Path:
    """Where the one engine's segments of `table` lie, in either format."""
    return schema.table_dir(engine_dir(root), table)


def copy_engine(root: Path, name: str) -> Path:
    """A second engine in the trace, `name`, a copy of its one engine (either format)."""
    home = engine_dir(root)
    new = home.with_name(f"{schema.ENGINE_DIR_PREFIX}{name}")
    shutil.copytree(home, new)
    if home.parent.name == schema.ENGINES_DIR:
        for table in schema.TABLE_NAMES:
            if schema.table_dir(home, table).is_dir():
                shutil.copytree(schema.table_dir(home, table), schema.table_dir(new, table))
    return new


def copy_sample(name: str, dst: Path) -> Path:
    """A private copy of samples/NAME (compacted: Parquet segments), free to damage."""
    shutil.copytree(SAMPLES / name, dst)
    return dst


def sample_fleet(dst: Path) -> Path:
    """A fleet root of two engines, `a` (the mixed sample's) and `b` (broken-leak's)."""
    for name, sample in (("a", "mixed"), ("b", "broken-leak")):
        (src,) = (SAMPLES / sample).glob("engine=*")
        shutil.copytree(src, dst / f"engine={name}")
    return dst


def as_streams(name: str, dst: Path, batch_rows: int = 16, segments: int = 1) -> Path:
    """samples/NAME rewritten by the recorder's own segment writer: `.arrows` streams of
    `batch_rows`-row batches (each with its checksum), in `segments` segments."""
    src = engine_dir(SAMPLES / name)
    edir = dst / src.name
    edir.mkdir(parents=True)
    tables = {}
    for t in schema.TABLE_NAMES:
        files = sorted((src / t).glob("*.parquet")) if (src / t).is_dir() else []
        tables[t] = (pq.read_table(files[0]).cast(schema.schema(t)) if files
                     else schema.schema(t).empty_table())
    seg = SegmentSet(edir, segment_bytes=1 << 40)
    for part in range(segments):
        # each segment holds its share of every table's rows
        rounds = []
        for t, data in tables.items():
            n = data.num_rows
            lo, hi = n * part // segments, n * (part + 1) // segments
            rounds.append((t, data.slice(lo, hi - lo).to_batches(max_chunksize=batch_rows)))
        for i in range(max(len(b) for _, b in rounds)):
            seg.write({t: b[i] for t, b in rounds if i < len(b)})
        if part < segments - 1:
            seg.close()
            seg._open()
    seg.close()
    manifest = json.loads((src / schema.MANIFEST).read_text())
    (edir / schema.MANIFEST).write_text(json.dumps(manifest))
    return dst


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def assert_clean_failure(result) -> str:
    """Exit 2, one line on stderr with the error prefix, nothing on stdout, no traceback."""
    assert result.exit_code == 2, (result.exit_code, result.output, result.exc_info)
    assert result.exc_info is None or result.exc_info[0] is SystemExit, result.exc_info
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(ERROR_PREFIX), lines[0]
    assert result.stdout == ""
    for text in (result.output, result.stdout, result.stderr):
        assert "Traceback" not in text
    return lines[0]


def assert_outcome(result) -> None:
    """What any input may give: 0 or 1 with no exception escaping, or a clean failure."""
    if result.exit_code == 2:
        assert_clean_failure(result)
        return
    assert result.exit_code in (0, 1), (result.exit_code, result.output, result.exc_info)
    assert result.exc_info is None or result.exc_info[0] is SystemExit, result.exc_info
    assert "Traceback" not in result.output
    assert not [ln for ln in result.stderr.splitlines()
                if not ln.startswith("vllm-contract: warning:")], result.stderr


def findings(root: Path, *only: str) -> list[dict]:
    args = ["check", root, "--format", "json"] + [a for o in only for a in ("--only", o)]
    r = invoke(*args)
    assert r.exit_code in (0, 1), (r.exit_code, r.output)
    return json.loads(r.stdout)


def integrity(root: Path) -> list[str]:
    r = invoke("info", root, "--format", "json")
    assert r.exit_code == 0, (r.exit_code, r.output)
    return [i for e in json.loads(r.stdout)["engines"] for i in e["integrity"]]


def errors(root: Path) -> dict[str, list[str]]:
    """`check`'s error findings' messages, by invariant."""
    out: dict[str, list[str]] = {}
    for f in findings(root):
        if f["severity"] == "error":
            out.setdefault(f["invariant"], []).append(f["message"])
    return out


def assert_agree(root: Path, invariant: str, *words: str, checks: tuple[str, ...]) -> None:
    """`check` exits 1 with an error finding of `invariant` mentioning `words`; `info` lists
    exactly the findings of `checks` (the integrity checks) that `check` reports, and its
    integrity line names `invariant`."""
    r = invoke("check", root)
    assert r.exit_code == 1, r.output
    found = errors(root)
    assert invariant in found, found
    assert any(all(w in m for w in words) for m in found[invariant]), found[invariant]
    listed = [i for i in integrity(root) if i.startswith("trace.")]
    checked = sorted(f"{inv}: {m}" for inv, ms in found.items() if inv in checks for m in ms)
    assert sorted(listed) == checked
    line = next(ln for ln in invoke("info", root).stdout.splitlines()
                if ln.startswith("integrity"))
    assert invariant in line


# -- damage, for the fuzz tests (tests/core/test_reader_fuzz.py, bench/fuzz_reader.py) ---------

WRONG_VALUES = [5, -1, "x", 2 ** 70, -(2 ** 70), 1e308, [], {}, None, True, [[1]], [[5, 3]],
                [{"time": "t", "error": 5}], {"a": 1}]


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink())


@contextlib.contextmanager
def within(seconds: float):
    """Fail with TimeoutError instead of hanging (a pipe opened for reading blocks)."""
    def expired(*_):
        raise TimeoutError(f"still running after {seconds} s")

    old = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _replace(p: Path) -> None:
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p)
    else:
        p.unlink()


def mutate(root: Path, kind: str, rng: random.Random, outside: Path) -> str:
    """Damage the trace under root in one way; returns what was done, for the report."""
    files = _files(root)
    manifests = [p for p in files if p.name == schema.MANIFEST]
    segments = [p for p in files if p.suffix in (schema.SEGMENT_SUFFIX, schema.PARQUET_SUFFIX)]
    if not files or (kind in ("wrong_type", "deep") and not manifests) or (
            kind in ("duplicate", "wrong_schema", "steps") and not segments):
        return f"{kind} (nothing left to damage)"
    target = rng.choice(files)
    if kind == "truncate":
        data = target.read_bytes()
        target.write_bytes(data[:rng.randrange(len(data) + 1)])
    elif kind == "flip":
        data = bytearray(target.read_bytes())
        for _ in range(rng.randint(1, 3)):
            if data:
                data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        target.write_bytes(bytes(data))
    elif kind == "delete":
        target.unlink()
    elif kind == "duplicate":
        target = rng.choice(segments)
        seqs = [int(p.stem) for p in target.parent.iterdir() if p.stem.isdigit()]
        shutil.copy(target, target.with_name(f"{max(seqs) + 1:06d}{target.suffix}"))
    elif kind == "wrong_type":
        target = rng.choice(manifests)
        try:
            m = json.loads(target.read_bytes())
        except (ValueError, RecursionError):  # damaged already
            m = None
        if not isinstance(m, dict):
            m = {"format_version": schema.FORMAT_VERSION}
        key = rng.choice(sorted(m) + ["engine.block_size", "engine.max_model_len"])
        value = rng.choice(WRONG_VALUES)
        if key.startswith("engine.") and isinstance(m.get("engine"), dict):
            m["engine"][key.split(".", 1)[1]] = value
        else:
            m[key] = value
        target.write_text(json.dumps(m))
    elif kind == "deep":
        target = rng.choice(manifests)
        n = rng.choice([50, 5000, 100000])
        target.write_text('{"format_version": 1, "engine": ' + "[" * n + "]" * n + "}")
    elif kind == "wrong_schema":
        target = rng.choice(segments)
        others = [p for p in segments if p.suffix == target.suffix
                  and p.parent.name != target.parent.name]
        if others:
            shutil.copy(rng.choice(others), target)
    elif kind == "fifo":
        target = rng.choice(manifests + segments or files)
        target.unlink()
        os.mkfifo(target)
    elif kind == "symlink_out":
        choices = [target, target.parent] if target.parent != root else [target]
        target = rng.choice(choices)
        dest = rng.choice([outside, outside / "file", Path("/dev/zero"), Path("/etc/hostname")])
        _replace(target)
        target.symlink_to(dest)
    elif kind == "dir_in_place":
        _replace(target)
        target.mkdir()
    elif kind == "steps":
        target = rng.choice(segments)
        try:
            t = (pq.read_table(target) if target.suffix == schema.PARQUET_SUFFIX
                 else ipc.open_stream(pa.py_buffer(target.read_bytes())).read_all())
        except (pa.ArrowException, OSError):
            return f"{kind} (unreadable {target.name})"
        if "step" in t.column_names and t.num_rows:
            vals = [rng.choice([-1, -477, 0, 1, 2 ** 40, 2 ** 62, None]) for _ in range(len(t))]
            t = t.set_column(t.column_names.index("step"), "step", pa.array(vals, pa.int64()))
            if target.suffix == schema.PARQUET_SUFFIX:
                pq.write_table(t, target)
            else:
                with pa.OSFile(str(target), "wb") as sink, ipc.new_stream(sink, t.schema) as w:
                    w.write_table(t)
    else:
        raise ValueError(kind)
    return f"{kind} {target.relative_to(root) if target.is_relative_to(root) else target}"


MUTATIONS = ("truncate", "flip", "delete", "duplicate", "wrong_type", "deep", "wrong_schema",
             "fifo", "symlink_out", "dir_in_place", "steps")
COMMANDS = {"info": ["info"], "check": ["check"],
            "sql": ["sql", None, "SELECT COUNT(*) AS n FROM steps"]}


def run_command(name: str, root: Path, seconds: float = 60):
    args = [root if a is None else a for a in COMMANDS[name]]
    if len(args) == 1:
        args.append(root)
    with within(seconds):
        return invoke(*args)
