"""Scheduler bugs written as vLLM Scheduler subclasses, for the resim tests: importable by
name (`--scheduler-cls module:DropFinishedOnce`) and recorded in the real Scheduler's place."""

from __future__ import annotations

import contextlib
import importlib
import sys
from pathlib import Path

from vllm_contract.rig import bugged, scenarios

# the break of rig/breaks.py as a Scheduler subclass (DropFinishedOnce, ForgetNewRequest), and
# one that fails outright
BUG_MODULE = bugged.module_source(["drop_finished_once", "forget_new_request"]) + '''

class RaisesOnThirdSchedule(Scheduler):
    calls = 0

    def schedule(self, *args, **kwargs):
        self.calls += 1
        if self.calls == 3:
            raise RuntimeError("broken\\nacross lines")
        return super().schedule(*args, **kwargs)
'''


@contextlib.contextmanager
def bug_scheduler(where: Path, module: str):
    """DropFinishedOnce, written as `module` under `where` (with ForgetNewRequest and
    RaisesOnThirdSchedule beside it) and importable by that name while the block runs (each
    test file names its own: one module per name in sys.modules)."""
    (where / f"{module}.py").write_text(BUG_MODULE)
    sys.path.insert(0, str(where))
    try:
        yield importlib.import_module(module).DropFinishedOnce
    finally:
        sys.path.remove(str(where))


def record_with(cls, scenario: str, model: str, path: Path, **options):
    """Scenario recorded with `cls` in place of vLLM's Scheduler (the rig builds `Scheduler`
    by name from vLLM's module, so the name is swapped there); returns the harness."""
    import vllm.v1.core.sched.scheduler as sched_mod

    stock, sched_mod.Scheduler = sched_mod.Scheduler, cls
    try:
        return scenarios.run(scenario, model, path, **options)
    finally:
        sched_mod.Scheduler = stock


def without_input_log(trace: Path, copy: Path) -> Path:
    """A copy of `trace` as a recorder of format 2 would have written it: no input log
    (tables `inputs` and `added`), the manifest without `input_log` and at version 2."""
    import json
    import shutil

    from vllm_contract import schema

    shutil.copytree(trace, copy)
    for table in schema.INPUT_TABLES:
        shutil.rmtree(copy / table, ignore_errors=True)
    for manifest in (copy / schema.ENGINES_DIR).glob(f"*/{schema.MANIFEST}"):
        m = json.loads(manifest.read_text())
        m.pop("input_log", None)
        m["format_version"] = 2
        manifest.write_text(json.dumps(m))
    return copy


def assert_re_runs_identically(trace: Path, engine: str | None = None):
    """`resim` on a recording: from its input log, every step identical; the summary."""
    from vllm_contract import replay

    run = replay.resim(trace, engine=engine)
    results = list(run)
    s = run.summary
    assert s.first is None, s.first.difference
    assert s.identical_steps == s.steps == len(results) > 0
    assert s.notes[0].startswith("inputs from the recorded input log"), s.notes
    return s


record_workload = bugged.record_workload
