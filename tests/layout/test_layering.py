"""The layering rules, read from the source (every import, module-level or lazy) and measured in
subprocesses. Each rule keeps a promise: the recorder runs inside vLLM, so it must stay light and
never pull in the reading side; reading and checking a trace must work without vLLM; only the
command line and the TUI may load Textual.

A hand-written AST walk rather than import-linter: setuptools maps `vllm_contract`'s subpackages
onto sibling folders (package-dir), which import-linter's graph builder cannot follow."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# folder -> the package it installs as
PACKAGES = {"core": "vllm_contract", "cli": "vllm_contract.cli",
            "recorder": "vllm_contract.recorder", "replay": "vllm_contract.replay",
            "tui": "vllm_contract.tui", "rig": "vllm_contract.rig"}
CORE = {f"vllm_contract.{p.stem}" for p in (ROOT / "core").glob("*.py") if p.stem != "__init__"}
HEAVY = ("duckdb", "vllm", "typer", "textual", "torch")


def _imports(folder: str, top_level_only: bool = False) -> dict[str, set[str]]:
    """Module name -> the absolute module names it imports (`from a import b` gives a and a.b)."""
    out = {}
    base = ROOT / folder
    for path in sorted(base.rglob("*.py")):
        rel = path.relative_to(base).with_suffix("")
        parts = [p for p in rel.parts if p != "__init__"]
        mod = ".".join([PACKAGES[folder], *parts])
        tree = ast.parse(path.read_text(), str(path))
        nodes = tree.body if top_level_only else ast.walk(tree)
        found: set[str] = set()
        for node in nodes:
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                found.add(node.module)
                found.update(f"{node.module}.{a.name}" for a in node.names)
        out[mod] = found
    assert out, f"no modules under {base}"
    return out


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def _violations(folder: str, banned: tuple[str, ...], allowed_own: tuple[str, ...] | None = None,
                top_level_only: bool = False, within: str | None = None) -> list[str]:
    """Imports of `banned` packages; with `allowed_own`, also any vllm_contract module that is
    neither core nor under one of those prefixes."""
    bad = []
    for mod, names in _imports(folder, top_level_only).items():
        if within and not _under(mod, within):
            continue
        for name in names:
            if any(_under(name, b) for b in banned):
                bad.append(f"{mod} imports {name}")
            elif (allowed_own is not None and _under(name, "vllm_contract")
                  and name != "vllm_contract" and not any(_under(name, c) for c in CORE)
                  and not any(_under(name, a) for a in allowed_own)):
                bad.append(f"{mod} imports {name}")
    return sorted(bad)


def test_core_imports_no_heavy_package_and_nothing_above_it():
    assert _violations("core", HEAVY, allowed_own=()) == []


def test_recorder_imports_core_only_and_vllm_lazily():
    assert _violations("recorder", ("duckdb", "typer", "textual"),
                       allowed_own=("vllm_contract.recorder",)) == []
    assert _violations("recorder", ("vllm", "torch"), top_level_only=True) == []


def test_query_layer_imports_neither_vllm_nor_textual():
    assert _violations("replay", ("vllm", "torch", "textual", "typer"),
                       allowed_own=("vllm_contract.replay",),
                       within="vllm_contract.replay.query") == []


def test_worker_imports_vllm_only_lazily():
    assert _violations("replay", ("textual", "typer"), allowed_own=("vllm_contract.replay",),
                       within="vllm_contract.replay.worker") == []
    assert _violations("replay", ("vllm", "torch"), top_level_only=True) == []


def test_only_the_query_layer_imports_duckdb_on_the_reading_side():
    bad = [v for v in _violations("replay", ("duckdb",)) if not v.startswith(
        "vllm_contract.replay.query")]
    assert bad == []


def test_pyspark_only_in_the_spark_module_and_only_lazily():
    """pyspark is an optional extra: nothing but replay/query/spark.py may import it, and that
    only inside functions, so that `check` on DuckDB never needs it."""
    everywhere = [v for folder in ("core", "recorder", "replay", "cli", "tui", "rig")
                  for v in _violations(folder, ("pyspark",))]
    assert [v for v in everywhere if not v.startswith("vllm_contract.replay.query.spark")] == []
    assert _violations("replay", ("pyspark",), top_level_only=True) == []


# replay's public face: the names `vllm_contract.replay` exports (a `from vllm_contract.replay
# import Session` reads as vllm_contract.replay.Session)
REPLAY_FACE = ("vllm_contract.replay.trace", "vllm_contract.replay.open_trace",
               "vllm_contract.replay.Trace", "vllm_contract.replay.Gateway",
               "vllm_contract.replay.Session", "vllm_contract.replay.Invariant",
               "vllm_contract.replay.load_catalog", "vllm_contract.replay.run_checks")


def test_tui_uses_the_replay_face_and_never_the_recorder():
    assert _violations("tui", ("vllm", "torch", "duckdb", "typer"),
                       allowed_own=("vllm_contract.replay", "vllm_contract.tui")) == []
    # every import of the replay package's insides (the walk of all imports, not
    # _violations("tui", ()), which lists nothing when given nothing to ban)
    bad = sorted(f"{mod} imports {name}" for mod, names in _imports("tui").items()
                 for name in names if _under(name, "vllm_contract.replay")
                 and name != "vllm_contract.replay" and name not in REPLAY_FACE)
    assert bad == [], ("the TUI imports replay's public face (vllm_contract.replay), not its "
                       f"insides: {bad}")


def test_the_tui_rule_sees_an_import_of_replays_insides(tmp_path, monkeypatch):
    pkg = tmp_path / "tui"
    pkg.mkdir()
    (pkg / "bad.py").write_text("from vllm_contract.replay import Session\n"
                                "from vllm_contract.replay.worker.shadow import ShadowWorker\n")
    # the catalog through the face is allowed; its module directly is not, even from checks
    (pkg / "checks.py").write_text("from vllm_contract.replay import load_catalog\n"
                                   "from vllm_contract.replay.query import catalog\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    with pytest.raises(AssertionError) as e:
        test_tui_uses_the_replay_face_and_never_the_recorder()
    assert "vllm_contract.tui.bad imports vllm_contract.replay.worker.shadow" in str(e.value)
    assert "vllm_contract.tui.checks imports vllm_contract.replay.query" in str(e.value)
    assert "load_catalog" not in str(e.value) and "Session" not in str(e.value)


@pytest.mark.parametrize("folder", ["core", "recorder", "replay", "rig"])
def test_nothing_but_cli_and_tui_imports_textual(folder):
    assert _violations(folder, ("textual",)) == []


def test_the_rules_see_a_violation(tmp_path, monkeypatch):
    # The walk must find a lazy import inside a function, or every rule above passes vacuously.
    pkg = tmp_path / "core"
    pkg.mkdir()
    (pkg / "bad.py").write_text("def f():\n    import duckdb\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert _violations("core", HEAVY) == ["vllm_contract.bad imports duckdb"]


def _loaded_after(code: str, block: tuple[str, ...] = ()) -> set[str]:
    """Top-level packages in sys.modules after running `code` in a fresh interpreter; `block`
    makes those packages unimportable, as if not installed."""
    prelude = "import sys\n" + "".join(f"sys.modules[{b!r}] = None\n" for b in block)
    r = subprocess.run([sys.executable, "-c", prelude + code +
                        "\nprint(' '.join(sorted({m.split('.')[0] for m in sys.modules})))"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    return set(r.stdout.split())


def test_the_plugin_vllm_loads_in_every_process_stays_light():
    loaded = _loaded_after("import vllm_contract.recorder.plugin")
    assert not loaded & {"duckdb", "typer", "textual", "click", "rich"}, loaded


def test_reading_and_checking_work_without_vllm():
    loaded = _loaded_after(
        "import vllm_contract.replay.query.checker, vllm_contract.replay.worker.canonical\n"
        "from vllm_contract.replay.trace import open_trace\n"
        "from vllm_contract.replay import Gateway", block=("vllm", "torch"))
    assert "duckdb" in loaded and "textual" not in loaded


@pytest.mark.parametrize("folder", list(PACKAGES))
def test_every_import_of_our_own_modules_resolves(folder):
    # A module moved without its importers fixed fails only when that code path runs (a lazy
    # import inside a command): found here instead, for every path at once.
    import importlib

    missing = []
    for mod, names in _imports(folder).items():
        for name in names:
            if not _under(name, "vllm_contract"):
                continue
            try:
                importlib.import_module(name)
                continue
            except ImportError:
                pass
            parent, _, attr = name.rpartition(".")
            try:
                if hasattr(importlib.import_module(parent), attr):
                    continue
            except ImportError:
                pass
            missing.append(f"{mod} imports {name}")
    assert missing == []
