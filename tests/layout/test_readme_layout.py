"""The README's Layout table names every folder a reader meets: each top-level folder of the
checkout, each package under `replay/`, and each area of `tests/` (a new folder lands with its
row; `replay/resim/` once went without)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _table() -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index("\n## Layout\n")
    end = text.find("\n## ", start + 1)
    rows = [line for line in text[start:end if end != -1 else None].splitlines()
            if line.startswith("| `")]
    assert rows, "no Layout table in the README"
    return "\n".join(rows)


def _tracked_dirs() -> set[str]:
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, check=True, capture_output=True,
                           text=True).stdout.splitlines()
    return {str(Path(f).parent) for f in files if "/" in f}


def test_every_folder_has_a_row():
    table = _table()
    named = set(re.findall(r"`([\w./-]+/)`", table))
    dirs = _tracked_dirs() | {str(p.parent.relative_to(ROOT)) for p in
                              (ROOT / "replay").glob("*/__init__.py")}
    top = {d.split("/")[0] for d in dirs if not d.startswith(".")}
    replay = {"/".join(d.split("/")[:2]) for d in dirs if d.startswith("replay/")}
    missing = sorted(f"{d}/" for d in top | replay if f"{d}/" not in named)
    assert missing == [], f"README's Layout table lacks a row for {', '.join(missing)}"
    tests_row = next(line for line in table.splitlines() if line.startswith("| `tests/`"))
    areas = {p.name for p in (ROOT / "tests").iterdir()
             if p.is_dir() and p.name not in ("fixtures", "__pycache__", "__snapshots__")
             and any(p.glob("test_*.py"))}
    assert sorted(a for a in areas if f"`{a}/`" not in tests_row) == []
