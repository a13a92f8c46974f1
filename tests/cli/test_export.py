"""The exporters (vllm_contract.replay.export) are where every --format comes from: each
command offers exactly the formats registered for its kind, and the package stays light, since
the command line's start imports it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from vllm_contract.cli import check, live, replay, trace
from vllm_contract.replay import export


@pytest.mark.parametrize("choice, kind", [(check.CheckFormat, "check"), (check.SqlFormat, "rows"),
                                          (replay.ReplayFormat, "replay"),
                                          (trace.InfoFormat, "info"), (live.PsFormat, "ps")])
def test_each_command_offers_the_formats_its_kind_has(choice, kind):
    assert [c.value for c in choice] == export.formats(kind)


def test_a_format_no_exporter_has_is_refused_by_name():
    with pytest.raises(ValueError, match="'xml' format for rows; there are table, json, csv"):
        export.render("rows", "xml", None)


def test_a_registered_format_is_rendered(monkeypatch):
    monkeypatch.setitem(export.registry._EXPORTERS, "demo", {})
    export.exporter("demo", "upper")(lambda text: export.Rendered().out(text.upper()).err("!"))
    r = export.render("demo", "upper", "abc")
    assert export.formats("demo") == ["upper"]
    assert r.chunks == [("ABC", False), ("!", True)] and r.stdout == "ABC"


def test_importing_the_exporters_loads_no_reader():
    code = ("import sys, vllm_contract.replay.export\n"
            "print(' '.join(sorted({m.split('.')[0] for m in sys.modules})))")
    loaded = set(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                check=True).stdout.split())
    assert not loaded & {"duckdb", "pyarrow", "pandas", "numpy", "vllm", "torch", "typer"}
