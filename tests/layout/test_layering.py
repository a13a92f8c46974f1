"""The layering rules, read from the source (every import, module-level or lazy) and measured in
subprocesses. Each rule keeps a promise: the recorder runs inside vLLM, so it must stay light and
never pull in the reading side; reading and checking a trace must work without vLLM; only the
command line and the TUI may load Textual; the command line starts without DuckDB; the query
layer and the worker stay apart; no two modules import each other, even lazily.

A hand-written AST walk rather than import-linter. Its graph builder (grimp) finds a package's
modules by walking the one folder `vllm_contract` loads from, core/, so it sees none of the
subpackages that setuptools maps onto sibling folders (package-dir), and it refuses a subpackage
as a root of its own (NotATopLevelModule). And several rules here are about what runs at import
time (vLLM, pyspark and DuckDB only lazily), which import-linter cannot express: its contracts
count every import, inside a function or not."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# folder -> the package it installs as
PACKAGES = {"core": "vllm_contract", "cli": "vllm_contract.cli",
            "recorder": "vllm_contract.recorder", "replay": "vllm_contract.replay",
            "tui": "vllm_contract.tui", "rig": "vllm_contract.rig",
            "testing": "vllm_contract.testing"}
CORE = {f"vllm_contract.{p.stem}" for p in (ROOT / "core").glob("*.py") if p.stem != "__init__"}
HEAVY = ("duckdb", "vllm", "typer", "textual", "torch")


@dataclass(frozen=True)
class Imp:
    """One name an import statement brings in: `import a.b` is (a.b, None), `from a import b`
    is (a, b), with a relative `from .x import y` made absolute."""
    module: str
    attr: str | None
    line: int
    at_import: bool  # runs when its module is imported: not inside a function, nor TYPE_CHECKING


def _modules(folder: str) -> dict[str, Path]:
    base = ROOT / folder
    out = {}
    for path in sorted(base.rglob("*.py")):
        parts = [p for p in path.relative_to(base).with_suffix("").parts if p != "__init__"]
        out[".".join([PACKAGES[folder], *parts])] = path
    assert out, f"no modules under {base}"
    return out


def _type_checking(test: ast.expr) -> bool:
    return ((isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
            or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def _statements(body: list[ast.stmt], at_import: bool):
    """(import statement, whether it runs at import time) for every import in `body`: those in a
    module-level try, if, with or class body run with the module; those in a function when it is
    called."""
    for stmt in body:
        if isinstance(stmt, (ast.Import, ast.ImportFrom)):
            yield stmt, at_import
        elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield from _statements(stmt.body, False)
        elif isinstance(stmt, ast.If) and _type_checking(stmt.test):
            yield from _statements(stmt.body, False)
            yield from _statements(stmt.orelse, at_import)
        else:
            for child in ast.iter_child_nodes(stmt):
                if isinstance(child, (ast.ExceptHandler, ast.match_case)):
                    yield from _statements(child.body, at_import)
            for field in ("body", "orelse", "finalbody"):
                block = getattr(stmt, field, None)
                if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
                    yield from _statements(block, at_import)


def _walk(folder: str) -> dict[str, list[Imp]]:
    """Module name -> every import in it, module-level or lazy."""
    out = {}
    for mod, path in _modules(folder).items():
        found = []
        for node, at_import in _statements(ast.parse(path.read_text(), str(path)).body, True):
            if isinstance(node, ast.Import):
                found += [Imp(a.name, None, node.lineno, at_import) for a in node.names]
                continue
            base = node.module or ""
            if node.level:  # relative to the module's package (a package's own for __init__)
                package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
                for _ in range(node.level - 1):
                    package = package.rpartition(".")[0]
                base = f"{package}.{base}" if base else package
            found += [Imp(base, a.name, node.lineno, at_import) for a in node.names]
        out[mod] = found
    return out


def _imports(folder: str, top_level_only: bool = False) -> dict[str, set[str]]:
    """Module name -> the absolute module names it imports (`from a import b` gives a and a.b);
    with `top_level_only`, those that run at import time."""
    return {mod: {n for i in imps if i.at_import or not top_level_only
                  for n in ((i.module, f"{i.module}.{i.attr}") if i.attr else (i.module,))}
            for mod, imps in _walk(folder).items()}


def _walk_all() -> dict[str, list[Imp]]:
    return {mod: imps for folder in PACKAGES if (ROOT / folder).is_dir()
            for mod, imps in _walk(folder).items()}


def _face_exports() -> dict[str, str]:
    """`vllm_contract.replay.Gateway` -> the module it is loaded from. The face loads its
    exports on first use (a module __getattr__), an import the AST cannot see."""
    import vllm_contract.replay as face

    return {f"{face.__name__}.{name}": module for name, (module, _) in face._EXPORTS.items()}


def _graph(at_import: bool = False) -> dict[str, dict[str, list[Imp]]]:
    """Our module -> our modules it imports -> the imports that do; with `at_import`, only
    those that run when the importer is imported. `from a import b` is an import of the module
    a.b where there is one, else of a. Importing a module first runs its parent packages'
    __init__: an edge too, except to the importer's own parents, which are always loaded before
    the importer is (an edge to them would close a cycle with every __init__ that imports its
    children)."""
    walked = _walk_all()
    face = _face_exports()
    out: dict[str, dict[str, list[Imp]]] = {}
    for mod, imps in walked.items():
        edges = out.setdefault(mod, {})
        own = set(_parents(mod))
        for i in imps:
            if at_import and not i.at_import:
                continue
            full = f"{i.module}.{i.attr}" if i.attr else i.module
            full = face.get(full, full)
            target = full if full in walked else i.module if i.module in walked else None
            if target is None:
                continue
            for t in (*_parents(target), target):
                if t != mod and t not in own and t in walked:
                    edges.setdefault(t, []).append(i)
    return out


def _cycles(graph: dict[str, dict[str, list[Imp]]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while not component or component[-1] != v:
                component.append(stack.pop())
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def _parents(mod: str) -> list[str]:
    parts = mod.split(".")
    return [".".join(parts[:n]) for n in range(1, len(parts))]


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
    everywhere = [v for folder in ("core", "recorder", "replay", "cli", "tui", "rig", "testing")
                  for v in _violations(folder, ("pyspark",))]
    assert [v for v in everywhere if not v.startswith("vllm_contract.replay.query.spark")] == []
    assert _violations("replay", ("pyspark",), top_level_only=True) == []


def _replay_face() -> frozenset[str]:
    """replay's public face: the names `vllm_contract.replay` exports, read from its __all__ (a
    `from vllm_contract.replay import Session` reads as vllm_contract.replay.Session). Importing
    the package loads none of them: it resolves each name when first used."""
    import vllm_contract.replay as face

    return frozenset(f"vllm_contract.replay.{name}" for name in face.__all__)


REPLAY_FACE = _replay_face()


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


@pytest.mark.parametrize("folder", ["core", "recorder", "replay", "rig", "testing"])
def test_nothing_but_cli_and_tui_imports_textual(folder):
    assert _violations(folder, ("textual",)) == []


def test_the_rules_see_a_violation(tmp_path, monkeypatch):
    # The walk must find a lazy import inside a function, or every rule above passes vacuously.
    pkg = tmp_path / "core"
    pkg.mkdir()
    (pkg / "bad.py").write_text("def f():\n    import duckdb\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert _violations("core", HEAVY) == ["vllm_contract.bad imports duckdb"]


def test_the_walk_reads_relative_imports_and_what_runs_at_import_time(tmp_path, monkeypatch):
    # A rule that misses `from . import x`, or an import under a module-level try or if, passes
    # a violation written that way; one that counts a function's import as run at import time
    # bans every lazy import the rules allow.
    pkg = tmp_path / "core" / "sub"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("from .a import K\n")
    (pkg / "a.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "from . import b\n"
        "from ..c import d\n"
        "try:\n    import duckdb\nexcept ImportError:\n    import pyspark\n"
        "if duckdb:\n    import vllm\n"
        "class K:\n    import torch\n\n    def f(self):\n        import textual\n"
        "if TYPE_CHECKING:\n    import typer\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert _imports("core")["vllm_contract.sub"] == {"vllm_contract.sub.a",
                                                     "vllm_contract.sub.a.K"}
    at_import = {"typing", "typing.TYPE_CHECKING", "vllm_contract.sub", "vllm_contract.sub.b",
                 "vllm_contract.c", "vllm_contract.c.d", "duckdb", "pyspark", "vllm", "torch"}
    assert _imports("core", top_level_only=True)["vllm_contract.sub.a"] == at_import
    assert _imports("core")["vllm_contract.sub.a"] == at_import | {"textual", "typer"}


def test_no_import_cycles_lazy_ones_included():
    """A cycle that closes only inside a function works until an import moves to module level
    or a process reaches the modules in another order; then one of them meets the other half
    initialised (ImportError, or a name missing). Each module of a cycle then also depends on
    all the others: none can be read, moved or tested alone."""
    assert _cycle_report() == []


def _cycle_report() -> list[str]:
    """Each cycle as its imports, with their lines."""
    graph = _graph()
    found = []
    for cycle in _cycles(graph):
        edges = []
        for a in cycle:
            for b, imps in sorted(graph[a].items()):
                if b in cycle:
                    lines = ", ".join(f"{n}{'' if now else ' lazy'}"
                                      for n, now in sorted({(i.line, i.at_import) for i in imps}))
                    edges.append(f"{a} -> {b} (line {lines})")
        found.append("; ".join(edges))
    return found


def test_the_cycle_check_sees_a_lazy_cycle_and_not_a_package_importing_its_children(
        tmp_path, monkeypatch):
    pkg = tmp_path / "recorder"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from vllm_contract.recorder.c import C\n")
    (pkg / "a.py").write_text("from vllm_contract.recorder.b import x\n")
    (pkg / "b.py").write_text("def f():\n    from . import a\n")
    # c reaches b through its own package, already loaded by the time c runs: no cycle
    (pkg / "c.py").write_text("from vllm_contract.recorder import b\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert _cycle_report() == ["vllm_contract.recorder.a -> vllm_contract.recorder.b (line 1); "
                               "vllm_contract.recorder.b -> vllm_contract.recorder.a (line 2 lazy)"]


def test_query_and_worker_reach_each_other_only_through_the_replay_face():
    """`check` runs the query layer without a worker and a replay runs the worker without SQL:
    neither imports the other's insides, so each changes alone and loads without the other's
    weight (DuckDB on one side, vLLM on the other)."""
    assert _crossings() == []


def _crossings() -> list[str]:
    bad = []
    for side in ("query", "worker"):
        own = f"vllm_contract.replay.{side}"
        for mod, names in _imports("replay").items():
            if _under(mod, own):
                bad += [f"{mod} imports {n}" for n in names
                        if _under(n, "vllm_contract.replay") and not _under(n, own)
                        and n != "vllm_contract.replay" and n not in REPLAY_FACE]
    return sorted(bad)


def test_the_query_worker_rule_sees_a_crossing(tmp_path, monkeypatch):
    (tmp_path / "replay" / "query").mkdir(parents=True)
    (tmp_path / "replay" / "worker").mkdir()
    (tmp_path / "replay" / "query" / "x.py").write_text(
        "def f():\n    from vllm_contract.replay.worker.shadow import ShadowWorker\n")
    (tmp_path / "replay" / "worker" / "y.py").write_text(
        "from ..query import gateway\nfrom vllm_contract.replay import Session\n"
        "from vllm_contract.replay.session import Session\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    # the face's Session is allowed; the module it comes from is replay's insides
    y = "vllm_contract.replay.worker.y imports vllm_contract.replay"
    assert _crossings() == [
        "vllm_contract.replay.query.x imports vllm_contract.replay.worker.shadow",
        "vllm_contract.replay.query.x imports vllm_contract.replay.worker.shadow.ShadowWorker",
        f"{y}.query", f"{y}.query.gateway", f"{y}.session", f"{y}.session.Session"]


def _loading_duckdb(folders: tuple[str, ...]) -> list[str]:
    """Each module of `folders` whose import loads DuckDB, with the chain of imports that run
    at import time from it to a module that imports duckdb at module level."""
    walked = _walk_all()
    graph = _graph(at_import=True)
    bad = []
    for start in sorted(m for folder in folders for m in _modules(folder)):
        # importing a module runs its parent packages first
        came_from: dict[str, str | None] = {m: None for m in (*_parents(start), start)}
        queue = deque(came_from)
        while queue:
            mod = queue.popleft()
            hits = [i for i in walked.get(mod, ()) if i.at_import and _under(i.module, "duckdb")]
            if hits:
                chain = [mod]
                while came_from[chain[-1]] is not None:
                    chain.append(came_from[chain[-1]])
                bad.append(f"{start}: {' -> '.join(reversed(chain))} imports duckdb "
                           f"(line {hits[0].line})")
                break
            for nxt in graph.get(mod, {}):
                if nxt not in came_from:
                    came_from[nxt] = mod
                    queue.append(nxt)
    return bad


def test_cli_and_rig_load_no_duckdb_at_import_time():
    """`vllm-contract --help` and the commands that run no SQL must not pay for DuckDB: the
    command line loads it inside the commands that query. The rig drives real vLLM engines in
    the process being recorded, beside the recorder, which never loads it."""
    assert _loading_duckdb(("cli", "rig", "testing")) == []


def test_the_duckdb_rule_follows_what_runs_at_import_time(tmp_path, monkeypatch):
    for d in ("core", "cli", "rig", "replay/query"):
        (tmp_path / d).mkdir(parents=True)
    (tmp_path / "core" / "heavy.py").write_text(
        "try:\n    import duckdb\nexcept ImportError:\n    duckdb = None\n")
    (tmp_path / "cli" / "a.py").write_text("from vllm_contract.heavy import x\n")
    (tmp_path / "cli" / "lazy.py").write_text("def f():\n    from vllm_contract import heavy\n")
    (tmp_path / "replay" / "query" / "__init__.py").write_text("import duckdb\n")
    (tmp_path / "replay" / "query" / "views.py").write_text("")
    (tmp_path / "replay" / "query" / "gateway.py").write_text("")
    # the face's Gateway is loaded from the gateway module, which runs query/__init__ first
    (tmp_path / "rig" / "face.py").write_text("from vllm_contract.replay import Gateway\n")
    (tmp_path / "rig" / "views.py").write_text("import vllm_contract.replay.query.views\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert _loading_duckdb(("cli", "rig")) == [
        "vllm_contract.cli.a: vllm_contract.cli.a -> vllm_contract.heavy imports duckdb (line 2)",
        "vllm_contract.rig.face: vllm_contract.rig.face -> vllm_contract.replay.query "
        "imports duckdb (line 1)",
        "vllm_contract.rig.views: vllm_contract.rig.views -> vllm_contract.replay.query "
        "imports duckdb (line 1)"]


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


def test_importing_every_cli_and_rig_module_leaves_duckdb_unloaded():
    # measured, for what the AST walk cannot see: a third-party package that loads DuckDB
    mods = sorted(m for folder in ("cli", "rig") for m in _modules(folder))
    loaded = _loaded_after("import " + ", ".join(mods))
    assert "duckdb" not in loaded and "typer" in loaded


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
