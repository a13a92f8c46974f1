"""Traces gathered into one root, each an engine of it under a name of its own: one run of the
catalog then checks them all (Spark's cost is its planning and jobs, paid once per run, not once
per trace), and each trace's findings are still its own engine's.

`keep(path)` copies a trace as some test just checked it, into the session's gathering; the
Spark test checks what was gathered against DuckDB."""

from __future__ import annotations

import atexit
import os
import re
import shutil
import tempfile
from pathlib import Path

from vllm_contract import schema
from vllm_contract.trace import open_trace

_KEPT: list[tuple[str, Path]] = []
_HOME: list[Path] = []


def gather(sources: dict[str, Path], root: Path) -> Path:
    """Copy each trace of `sources` into `root` as engine `name` (`name-ENGINE` for each engine
    of a trace of several), in its own format: format 2 homes go to root/_engines with their
    tables beside, format 1 engine folders as they are."""
    root.mkdir(parents=True, exist_ok=True)
    for name, src in sources.items():
        engines = open_trace(src).engines
        for e in engines:
            _copy_engine(e.dir, root, name if len(engines) == 1 else f"{name}-{e.name}")
    return root


def _copy_engine(home: Path, root: Path, name: str) -> None:
    new = schema.ENGINE_DIR_PREFIX + name
    if home.parent.name == schema.ENGINES_DIR:
        shutil.copytree(home, root / schema.ENGINES_DIR / new)
        for table in schema.TABLE_NAMES:
            d = schema.table_dir(home, table)
            if d.is_dir():
                shutil.copytree(d, root / table / new)
    else:
        shutil.copytree(home, root / new)


def keep(path: Path) -> None:
    """Keep a copy of the single-engine trace at `path`, named after the running test."""
    if not _HOME:
        _HOME.append(Path(tempfile.mkdtemp(prefix="vllm-contract-kept-")))
        atexit.register(shutil.rmtree, _HOME[0], True)
    test = os.environ.get("PYTEST_CURRENT_TEST", "trace").split(" ")[0].split("::")[-1]
    name = f"{len(_KEPT):03d}-" + re.sub(r"[^A-Za-z0-9_.-]+", "-", test)[:80]
    copy = _HOME[0] / name
    shutil.copytree(path, copy, ignore=shutil.ignore_patterns("*.lock"))
    _KEPT.append((name, copy))


def kept() -> dict[str, Path]:
    return dict(_KEPT)
