"""A worker kind is one class implementing `Worker` and one line in the registry: Session, a
whole replay and its exporters then take it without naming it anywhere else."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from vllm_contract.errors import TraceError
from vllm_contract.replay import Session, WorkerOptions, worker_class
from vllm_contract.replay.export import formats, render
from vllm_contract.replay.stepping import replay_range
from vllm_contract.replay.worker import registry
from vllm_contract.replay.worker.base import Stepped, Worker
from vllm_contract.replay.worker.shadow_worker import ShadowWorker

SAMPLES = Path(__file__).resolve().parents[2] / "samples"


@pytest.mark.parametrize("name", registry.names())
def test_every_registered_kind_is_a_whole_worker(name):
    cls = worker_class(name)
    assert issubclass(cls, Worker) and not inspect.isabstract(cls), cls
    assert cls.kind == name and cls.title
    assert isinstance(cls.compares_tokens, bool) and isinstance(cls.rewinds_cheaply, bool)


def test_every_member_of_the_interface_says_what_it_does():
    members = 0
    for name, member in vars(Worker).items():
        if name.startswith("_"):
            continue
        fn = (member.fget if isinstance(member, property)
              else member.__func__ if isinstance(member, classmethod) else member)
        if not inspect.isfunction(fn):
            continue  # a class attribute, said in a comment
        members += 1
        assert fn.__doc__ and len(fn.__doc__.split()) >= 5, name
    assert members >= 14


class Every2nd(ShadowWorker):
    """A worker made here: the shadow worker's findings on even positions only, as a new kind
    would bring its own."""
    kind = "every2nd"
    title = "the every-second worker"

    def step(self) -> Stepped:
        r = super().step()
        return r if self.position % 2 == 0 else Stepped(applied=r.applied)


def test_a_new_kind_is_one_class_and_one_registry_line(monkeypatch):
    monkeypatch.setitem(registry.WORKERS, "every2nd", f"{__name__}:Every2nd")
    trace = SAMPLES / "broken-unknown-cached"
    s = Session(trace, worker="every2nd")
    assert type(s.worker) is Every2nd and s.run() and s.position == len(s.steps)
    run = replay_range(trace, "every2nd")
    assert run.worker == "every2nd" and run.steps_replayed == len(s.steps)
    assert run.findings and run.findings == replay_range(trace, "shadow").findings
    for fmt in formats("replay"):
        assert render("replay", fmt, run).stdout
    assert "replayed into the every-second worker" in render("replay", "table", run).stdout


def test_options_reach_the_worker_and_unknown_names_are_trace_errors():
    s = Session(SAMPLES / "mixed", options=WorkerOptions(checkpoint_every=8))
    assert s.worker.model.checkpoint_every == 8
    assert Session(SAMPLES / "mixed", checkpoint_every=4).worker.model.checkpoint_every == 4
    with pytest.raises(TraceError, match="unknown worker 'gpu'"):
        worker_class("gpu")


def test_the_command_line_offers_the_registry(monkeypatch):
    from vllm_contract.cli.common import worker_choice

    monkeypatch.setitem(registry.WORKERS, "every2nd", f"{__name__}:Every2nd")
    assert [w.value for w in worker_choice("W")] == registry.names()
    assert "every2nd" in registry.names()
