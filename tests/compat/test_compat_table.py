"""`make compat`'s table (compat/run.py): every gap is a cell that says so and a reason below,
an install that failed is a row of dashes with its reason, a suite that stopped is said. The
results are written here as the suite writes them (its own JSON shape, not vLLM's)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run_module():
    spec = importlib.util.spec_from_file_location("compat_run", ROOT / "compat" / "run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_each_gap_is_a_cross_with_its_reason_and_a_failed_install_a_row_of_dashes():
    run = _run_module()
    names = [n for n, _ in run.CAPABILITIES]
    ok = {n: {"ok": True, "detail": "fine", "seconds": 0.1} for n in names}
    bad = dict(ok, real={"ok": False, "reason": "RuntimeError: no executor", "seconds": 1.0})
    text = run.table([
        {"vllm": "9.1.0", "capabilities": ok},
        {"vllm": "9.0.0", "capabilities": bad, "suite_error": "Killed"},
        {"vllm": "8.9.0", "install": "does not install: no wheel"},
    ])
    rows = {line.split(" | ")[0].strip("| "): line.strip("|").split(" | ")[1:]
            for line in text.splitlines() if line.startswith("| 9.") or line.startswith("| 8.")}
    assert [c.strip() for c in rows["9.1.0"]] == ["✓"] * len(names)
    cells = [c.strip() for c in rows["9.0.0"]]
    assert cells[names.index("real")] == "✗" and cells.count("✓") == len(names) - 1
    assert [c.strip() for c in rows["8.9.0"]] == ["-"] * len(names)
    gaps = text.split("## Gaps", 1)[1].split("##", 1)[0]
    label = dict(run.CAPABILITIES)["real"]
    assert f"- **9.0.0**, {label}: RuntimeError: no executor" in gaps
    assert "- **9.0.0**: the suite stopped: Killed" in gaps
    assert "- **8.9.0**: does not install: no wheel" in gaps
    assert "None." not in gaps
    clean = run.table([{"vllm": "9.1.0", "capabilities": ok}])
    assert "None." in clean.split("## Gaps", 1)[1].split("##", 1)[0]
