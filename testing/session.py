"""The plugin at work (docs/pytest-plugin.md): vLLM's Scheduler class patched so that every
instance made while a test runs is recorded (a trace per scheduler under the test's folder);
at the end of the test's call each trace is sealed and checked with the catalog (and the shadow
worker if asked), what a test's own driving produces is told apart (usage.py), the baseline
applied, and the test failed on what is left."""

from __future__ import annotations

import re
import shutil
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from vllm_contract.findings import RANK


@dataclass
class Checked:
    """One test's schedulers, checked."""
    traces: list[Path] = field(default_factory=list)
    steps: int = 0
    failing: list[Any] = field(default_factory=list)  # findings that fail the test
    reported: list[Any] = field(default_factory=list)  # below the fail-on severity
    absorbed: list[Any] = field(default_factory=list)  # in the baseline
    notes: list[str] = field(default_factory=list)  # the test's own driving, not a contract
    errors: list[str] = field(default_factory=list)  # a trace that could not be checked


def test_folder(nodeid: str) -> Path:
    """DIR-relative folder of a test: its file's path, then its name (parameters kept, made
    safe for a file name)."""
    file, _, name = nodeid.partition("::")
    safe = re.sub(r"[^A-Za-z0-9_.\-\[\]=,+]", "_", name.replace("::", ".")) or "_"
    return Path(*[p for p in Path(file).parts if p not in ("..", "/")]) / safe[:150]


class ContractSession:
    def __init__(self, config: pytest.Config) -> None:
        from vllm_contract.testing import baseline

        self.config = config
        opt = config.getoption
        root = Path(config.rootpath)
        self.dir = root / (opt("vllm_contract_dir") or config.getini("vllm_contract_dir"))
        self.worker = opt("vllm_contract_worker")
        self.fail_on = opt("vllm_contract_fail_on")
        self.update = opt("vllm_contract_update_baseline")
        self.strict = opt("vllm_contract_strict")
        path = opt("vllm_contract_baseline")
        self.baseline_path = None if path is None else root / path
        self.baseline = baseline.Baseline.load(self.baseline_path) if (
            self.baseline_path is not None and not self.update) else baseline.Baseline()
        self.current: Any = None  # the test item running
        self.recorders: dict[str, list] = {}
        self.checked: dict[str, Checked] = {}
        self.found: Counter = Counter()  # invariant -> findings reported, every test
        self._undo = _patch_schedulers(self._created)

    # -- recording ----------------------------------------------------------------------------
    def _created(self, scheduler: Any) -> None:
        """A Scheduler's __init__ has run: record it if a test is running."""
        item = self.current
        if item is None:
            return
        from vllm_contract.recorder import attach

        mine = self.recorders.setdefault(item.nodeid, [])
        path = self.dir / test_folder(item.nodeid) / f"scheduler-{len(mine)}"
        if path.exists():  # the previous run's: a trace is never appended to
            shutil.rmtree(path, ignore_errors=True)
        try:
            # a test waits for the disk rather than lose a step (an engine's recorder drops
            # steps when the writer falls behind; a check of a trace with holes says little)
            mine.append((attach(scheduler, path, writer="thread", on_full="block",
                                started_by="vllm-contract pytest plugin"), path))
        except Exception as e:  # the test never pays for the recorder
            self.checked.setdefault(item.nodeid, Checked()).errors.append(
                f"not recorded: {type(e).__name__}: {e}")

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: Any):
        self.current = item
        try:
            return (yield)
        finally:
            self.current = None
            self._seal(item.nodeid)  # a test that failed in setup: its schedulers still closed

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item):
        try:
            result = yield
        except BaseException:
            self._check(item)  # the test's own failure stands; the findings go beside it
            raise
        c = self._check(item)
        if c is not None and c.failing:
            pytest.fail(_failure(c), pytrace=False)
        return result

    def _seal(self, nodeid: str) -> list[Path]:
        paths = []
        for rec, path in self.recorders.pop(nodeid, []):
            try:
                rec.close()
            except Exception:
                pass
            paths.append(path)
        return paths

    # -- checking -----------------------------------------------------------------------------
    def _check(self, item: pytest.Item) -> Checked | None:
        from vllm_contract.testing import usage

        paths = self._seal(item.nodeid)
        c = self.checked.setdefault(item.nodeid, Checked())
        if not paths and not c.errors:
            return None
        for path in paths:
            try:
                steps, found, notes = usage.check(path, self.worker == "shadow")
            except Exception as e:
                c.errors.append(f"{path}: not checked: {type(e).__name__}: {e}")
                continue
            c.traces.append(path)
            c.steps += steps
            c.notes += notes
            for f in found:
                self.found[f.invariant] += 1
                if self.update:
                    self.baseline.add(item.nodeid, f.invariant)
                    c.reported.append(f)
                elif self.baseline.absorbs(item.nodeid, f.invariant):
                    c.absorbed.append(f)
                elif self.fail_on != "never" and RANK[f.severity] >= RANK[self.fail_on]:
                    c.failing.append(f)
                else:
                    c.reported.append(f)
        self._report(item, c)
        return c

    def _report(self, item: pytest.Item, c: Checked) -> None:
        item.add_report_section("call", "vllm-contract", _section(c))
        props = item.user_properties
        props.append(("vllm_contract_traces", " ".join(str(p) for p in c.traces)))
        props.append(("vllm_contract_steps", c.steps))
        for f in c.failing + c.reported + c.absorbed:
            props.append(("vllm_contract_finding", _one(f)))

    # -- the end of the run -------------------------------------------------------------------
    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        tr = terminalreporter
        checked = [c for c in self.checked.values() if c.traces]
        schedulers = sum(len(c.traces) for c in checked)
        steps = sum(c.steps for c in checked)
        tr.write_sep("=", "vllm-contract")
        by = ", ".join(f"{inv} {n}" for inv, n in sorted(self.found.items())) or "none"
        tr.write_line(f"{len(checked)} test(s) checked, {schedulers} scheduler(s), {steps:,} "
                      f"step(s); findings: {by}")
        failed = sum(1 for c in checked if c.failing)
        absorbed = sum(len(c.absorbed) for c in checked)
        if failed or absorbed:
            tr.write_line(f"{failed} test(s) failed on findings; {absorbed} finding(s) in the "
                          "baseline")
        for line in self._stale_lines():
            tr.write_line(line)
        if self.update and self.baseline_path is not None:
            tr.write_line(f"baseline written: {self.baseline_path} "
                          f"({len(self.baseline.entries)} entries)")
        tr.write_line(f"traces: {self.dir}")

    def _stale_lines(self) -> list[str]:
        if self.update:
            return []
        ran = set(self.checked)
        return [f"baseline entry not hit: {test} {inv}"
                for test, inv in self.baseline.not_hit() if test in ran or self.strict]

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if self.update and self.baseline_path is not None:
            self.baseline.save(self.baseline_path)
        elif self.strict and self._stale_lines() and exitstatus == 0:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        self._undo()


def _patch_schedulers(created: Any) -> Any:
    """vLLM's Scheduler.__init__ (the class object: tests that imported it by name and its
    subclasses are covered) calls `created(instance)` when it has run; returns the undo."""
    from vllm.v1.core.sched import scheduler as module

    cls = module.Scheduler
    original = cls.__init__

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        created(self)

    __init__.__wrapped__ = original  # type: ignore[attr-defined]
    cls.__init__ = __init__

    def undo() -> None:
        cls.__init__ = original

    return undo


def _one(f: Any) -> str:
    where = f" at step {f.step}" if f.step is not None else ""
    return f"{f.invariant}{where}" + (f" ({f.req_id})" if f.req_id else "") + \
        f": {f.title or f.details}"


def _section(c: Checked) -> str:
    lines = [f"{len(c.traces)} scheduler(s), {c.steps:,} step(s): "
             + " ".join(str(p) for p in c.traces)]
    for label, fs in (("fails the test", c.failing), ("reported", c.reported),
                      ("in the baseline", c.absorbed)):
        lines += [f"  {label}: {f.severity} {_one(f)}" + (f" — {f.details}" if f.title else "")
                  for f in fs]
    lines += [f"  note: {n}" for n in c.notes]
    lines += [f"  error: {e}" for e in c.errors]
    return "\n".join(lines)


def _failure(c: Checked) -> str:
    head = f"vllm-contract: {len(c.failing)} contract finding(s) in this test's scheduler steps"
    return "\n".join([head] + [f"  {_one(f)}" for f in c.failing]
                     + [f"  traces: {' '.join(str(p) for p in c.traces)}"])
