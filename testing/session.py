"""The plugin at work (docs/pytest-plugin.md): vLLM's Scheduler class patched so that every
instance made while a test runs is recorded (a trace per scheduler under the test's folder);
at the end of the test's call each trace is sealed and checked with the catalog (and the shadow
worker if asked), what a test's own driving produces is told apart (usage.py), the baseline
applied, and the test failed on what is left. What its teardown does with schedulers (made
there, or driven there after the call's check) is checked after the teardown, and fails it as
a teardown error."""

from __future__ import annotations

import functools
import re
import shutil
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from vllm_contract.findings import RANK

STARTED_BY = "vllm-contract pytest plugin"


@dataclass
class Checked:
    """One test's schedulers (or those of one of its phases), checked."""
    traces: list[Path] = field(default_factory=list)
    steps: int = 0
    failing: list[Any] = field(default_factory=list)  # findings that fail the test
    reported: list[Any] = field(default_factory=list)  # below the fail-on severity
    absorbed: list[Any] = field(default_factory=list)  # in the baseline
    excused: list[Any] = field(default_factory=list)  # taken for the test's own driving
    notes: list[str] = field(default_factory=list)  # the test's own driving, not a contract
    errors: list[str] = field(default_factory=list)  # a trace that could not be checked

    def add(self, other: "Checked") -> None:
        for name in ("traces", "failing", "reported", "absorbed", "excused", "notes", "errors"):
            getattr(self, name).extend(getattr(other, name))
        self.steps += other.steps


def test_folder(nodeid: str) -> Path:
    """DIR-relative folder of a test: its file's path, then its name (parameters kept, made
    safe for a file name)."""
    file, _, name = nodeid.partition("::")
    safe = re.sub(r"[^A-Za-z0-9_.\-\[\]=,+]", "_", name.replace("::", ".")) or "_"
    return Path(*[p for p in Path(file).parts if p not in ("..", "/")]) / safe[:150]


def _record(scheduler: Any, path: Path, started_by: str) -> Any:
    from vllm_contract.recorder import attach

    if path.exists():  # the previous run's: a trace is never appended to
        shutil.rmtree(path, ignore_errors=True)
    # a test waits for the disk rather than lose a step (an engine's recorder drops steps when
    # the writer falls behind; a check of a trace with holes says little)
    return attach(scheduler, path, writer="thread", on_full="block", started_by=started_by)


class _Watch:
    """A scheduler whose trace was checked at the end of the call: a fixture's teardown may
    still drive it. Its first schedule() from then on starts a second trace, attached
    mid-stream (the recorder's manifest says so, and the catalog allows for it), checked after
    the teardown. Nothing is recorded for a scheduler the teardown leaves alone."""

    def __init__(self, scheduler: Any, path: Path, error: Any) -> None:
        self.scheduler, self.path, self.rec = scheduler, path, None
        self._armed = True
        self._had = "schedule" in scheduler.__dict__
        self._prev = scheduler.__dict__.get("schedule")
        inner = scheduler.schedule  # a test's own instance-level wrapper stays in the chain
        if path.exists():  # the previous run's: this run may leave none in its place
            shutil.rmtree(path, ignore_errors=True)

        def schedule(*args: Any, **kwargs: Any) -> Any:
            if self._armed:
                self._armed = False
                try:
                    self.rec = _record(scheduler, path, f"{STARTED_BY} (teardown)")
                except Exception as e:  # the test never pays for the recorder
                    error(f"{path.name}: not recorded: {type(e).__name__}: {e}")
                else:  # through the recorder's wrapper, which calls back here
                    return scheduler.schedule(*args, **kwargs)
            return inner(*args, **kwargs)

        self._sentinel = schedule
        scheduler.schedule = schedule

    def stop(self) -> Any:
        """Take the watch off; the second trace's recorder (sealed here) if there is one."""
        self._armed = False
        if self.rec is not None:
            try:
                self.rec.close()  # puts the sentinel back: the recorder found it there
            except Exception:
                pass
        s, self.scheduler = self.scheduler, None
        if s is not None and s.__dict__.get("schedule") is self._sentinel:
            if self._had:
                s.schedule = self._prev
            else:
                del s.__dict__["schedule"]
        return self.rec


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
        self.made: Counter = Counter()  # test -> schedulers made: their trace's number
        self.recorders: dict[str, list] = {}  # test -> [(recorder, path)] recording
        self.watches: dict[str, list[_Watch]] = {}  # test -> schedulers checked, still watched
        self.unrecorded: dict[str, list[str]] = {}  # test -> recorders that failed to start
        self.called: set[str] = set()  # tests whose setup passed and whose call ran
        self.checked: dict[str, Checked] = {}  # test -> all its phases, checked
        self.found: Counter = Counter()  # invariant -> findings reported, every test
        self.excused: Counter = Counter()  # invariant -> findings taken for tests' driving
        self._undo = _patch_schedulers(self._created)

    # -- recording ----------------------------------------------------------------------------
    def _created(self, scheduler: Any) -> None:
        """A Scheduler's __init__ has run: record it if a test is running."""
        item = self.current
        if item is None:
            return
        n = self.made[item.nodeid]
        self.made[item.nodeid] += 1
        path = self.dir / test_folder(item.nodeid) / f"scheduler-{n}"
        try:
            rec = _record(scheduler, path, STARTED_BY)
        except Exception as e:  # the test never pays for the recorder
            self.unrecorded.setdefault(item.nodeid, []).append(
                f"not recorded: {type(e).__name__}: {e}")
            return
        self.recorders.setdefault(item.nodeid, []).append((rec, path))

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: Any):
        self.current = item
        try:
            return (yield)
        finally:
            self.current = None
            for w in self.watches.pop(item.nodeid, []):  # a teardown that never ran
                w.stop()
            self._seal(item.nodeid)
            self.made.pop(item.nodeid, None)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item):
        self.called.add(item.nodeid)
        try:
            result = yield
        except BaseException:
            self._check(item, "call", self._seal(item.nodeid, watch=True))
            raise  # the test's own failure stands; the findings go beside it
        c = self._check(item, "call", self._seal(item.nodeid, watch=True))
        if c is not None and c.failing:
            pytest.fail(_failure(c, "call"), pytrace=False)
        return result

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_teardown(self, item: pytest.Item, nextitem: Any):
        try:
            result = yield
        except BaseException:
            self._after_teardown(item)
            raise
        c = self._after_teardown(item)
        # a test whose setup failed has its error already; its schedulers' findings go beside it
        if c is not None and c.failing and item.nodeid in self.called:
            pytest.fail(_failure(c, "teardown"), pytrace=False)
        return result

    def _after_teardown(self, item: pytest.Item) -> Checked | None:
        """What is left: schedulers made in setup of a test whose call never ran, made in
        teardown, or driven in teardown after the call's check (their second trace)."""
        paths = []
        for w in self.watches.pop(item.nodeid, []):
            if w.stop() is not None:
                paths.append(w.path)
        return self._check(item, "teardown", paths + self._seal(item.nodeid))

    def _seal(self, nodeid: str, watch: bool = False) -> list[Path]:
        def error(line: str) -> None:
            self.unrecorded.setdefault(nodeid, []).append(line)

        paths = []
        for rec, path in self.recorders.pop(nodeid, []):
            try:
                rec.close()
            except Exception:
                pass
            paths.append(path)
            if watch:
                try:
                    self.watches.setdefault(nodeid, []).append(_Watch(
                        rec.scheduler, path.with_name(path.name + "-teardown"), error))
                except Exception as e:
                    error(f"{path.name}: not watched through teardown: {type(e).__name__}: {e}")
        return paths

    # -- checking -----------------------------------------------------------------------------
    def _check(self, item: pytest.Item, when: str, paths: list[Path]) -> Checked | None:
        from vllm_contract.testing import usage

        c = Checked(errors=self.unrecorded.pop(item.nodeid, []))
        if not paths and not c.errors:
            return None
        for path in paths:
            try:
                steps, found, excused, notes = usage.check(path, self.worker == "shadow")
            except Exception as e:
                c.errors.append(f"{path}: not checked: {type(e).__name__}: {e}")
                continue
            c.traces.append(path)
            c.steps += steps
            c.notes += notes
            c.excused += excused
            for f in excused:
                self.excused[f.invariant] += 1
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
        self.checked.setdefault(item.nodeid, Checked()).add(c)
        self._report(item, c, when)
        return c

    def _report(self, item: pytest.Item, c: Checked, when: str) -> None:
        item.add_report_section(when, "vllm-contract", _section(c))
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
        by = ", ".join(f"{inv} {n}" for inv, n in sorted(self.excused.items())) or "none"
        tr.write_line(f"findings taken for the tests' own driving (notes): {by}")
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
    """vLLM's Scheduler calls `created(instance)` once its outermost __init__ has run: the
    class object is patched (tests that imported it by name are covered), and so is the
    __init__ of every subclass, those defined later too (a subclass's own __init__ runs on
    after Scheduler's, and a recording that started inside it would miss what it sets up).
    Returns the undo."""
    try:
        from vllm.v1.core.sched import scheduler as module
    except Exception as e:
        why = (str(e).splitlines() or [""])[0]
        raise pytest.UsageError(
            f"--vllm-contract needs vLLM (pip install vllm): cannot import "
            f"vllm.v1.core.sched.scheduler ({type(e).__name__}: {why})") from None
    base = module.Scheduler
    building: set[int] = set()  # instances inside their outermost __init__
    undo: list = []

    def wrap(cls: type) -> None:
        original = cls.__dict__.get("__init__")
        if original is None or hasattr(original, "__vllm_contract__"):
            return

        @functools.wraps(original)
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            outer = id(self) not in building
            building.add(id(self))
            try:
                original(self, *args, **kwargs)
            finally:
                if outer:
                    building.discard(id(self))
            if outer:
                created(self)

        __init__.__vllm_contract__ = True  # type: ignore[attr-defined]
        cls.__init__ = __init__  # type: ignore[misc]
        undo.append(lambda: setattr(cls, "__init__", original))

    def subclasses(cls: type) -> list[type]:
        return [s for sub in cls.__subclasses__() for s in [sub, *subclasses(sub)]]

    for cls in [base, *subclasses(base)]:
        wrap(cls)
    prior = base.__dict__.get("__init_subclass__")

    def __init_subclass__(cls: type, **kwargs: Any) -> None:
        if prior is not None:
            prior.__func__(cls, **kwargs)
        else:
            super(base, cls).__init_subclass__(**kwargs)
        wrap(cls)

    base.__init_subclass__ = classmethod(__init_subclass__)  # type: ignore[assignment]

    def undo_all() -> None:
        if prior is not None:
            base.__init_subclass__ = prior
        else:
            del base.__init_subclass__
        for step in reversed(undo):
            step()

    return undo_all


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


def _failure(c: Checked, when: str) -> str:
    head = (f"vllm-contract: {len(c.failing)} contract finding(s) in this test's scheduler steps"
            + ("" if when == "call" else " checked after its teardown"))
    return "\n".join([head] + [f"  {_one(f)}" for f in c.failing]
                     + [f"  traces: {' '.join(str(p) for p in c.traces)}"])
