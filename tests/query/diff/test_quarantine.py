"""Diff tests of the recorder's quarantine: trace.malformed_step, and trace.missing_steps not
counting a quarantined step as a hole."""

from __future__ import annotations

import tinytrace as tt

ERROR = "ValueError: scheduled.num_computed_tokens: 2 values for 3 requests"


def _trace(tmp_path):
    mal = [{"step": 2, "t_ns": 2000, "stage": "rows", "error": ERROR, "plain_json": "{}"},
           {"step": 2, "t_ns": 2500, "stage": "update", "error": "the model output of a "
            "quarantined step", "plain_json": "{}"}]
    steps = [s for s in tt.steps(4) if s["step"] != 2]
    return tt.write(tmp_path, {"steps": steps, "malformed_steps": mal})


def test_a_quarantined_step_is_one_error(tmp_path):
    """One finding per quarantined step (its update's row is not a second one)."""
    _trace(tmp_path)
    assert tt.found(tmp_path, "trace.malformed_step") == [(2, None, f"rows: {ERROR}")]


def test_a_quarantined_step_is_not_a_hole(tmp_path):
    _trace(tmp_path)
    assert tt.found(tmp_path, "trace.missing_steps") == []


def test_without_quarantine(tmp_path):
    """A trace from before the quarantine table (no folder at all) reads it as empty."""
    tt.write(tmp_path, {"steps": tt.steps(3)}, absent=("transport", "malformed_steps"))
    assert tt.found(tmp_path, "trace.malformed_step") == []
