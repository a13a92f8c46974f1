"""Diff tests of trace.recorder_stopped: the manifest's `stopped`, as the writer leaves it when
an error (a full disk) ends the recording, and trace.unclean_close giving way to it."""

from __future__ import annotations

import tinytrace as tt

ENOSPC = "OSError: [Errno 28] No space left on device"


def test_stopped_after_a_step(tmp_path):
    tt.write(tmp_path, {"steps": tt.steps(4)}, closed_cleanly=False,
             recorder_errors=[{"time": 1.0, "error": ENOSPC}],
             stopped={"after_step": 3, "error": ENOSPC})
    assert tt.found(tmp_path, "trace.recorder_stopped") == [
        (3, None, f"recording stopped after step 3: {ENOSPC}")]
    assert tt.found(tmp_path, "trace.unclean_close") == []


def test_stopped_before_any_step(tmp_path):
    tt.write(tmp_path, {}, closed_cleanly=False, stopped={"after_step": None, "error": ENOSPC})
    assert tt.found(tmp_path, "trace.recorder_stopped") == [
        (None, None, f"recording stopped before its first step: {ENOSPC}")]


def test_a_process_that_died_is_not_a_stop(tmp_path):
    """No `stopped`: the recorder did not stop itself (a kill); unclean_close reports it."""
    tt.write(tmp_path, {"steps": tt.steps(4)}, closed_cleanly=False)
    assert tt.found(tmp_path, "trace.recorder_stopped") == []
    assert len(tt.found(tmp_path, "trace.unclean_close")) == 1
