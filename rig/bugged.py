"""The named breaks of breaks.py written as vLLM Scheduler subclasses: a module of vLLM-only
source (the break's function and a subclass applying it after every schedule()), so that the
class is importable by name (`--scheduler-cls module:Class`) in a process that has only vLLM,
as the pytest file of `vllm-contract reduce` is run; and the workload reduce's tests and bench
record them on."""

from __future__ import annotations

import inspect
from pathlib import Path

from vllm_contract.rig import breaks

# the named breaks (breaks.BREAKS), each with the invariant a reduction of its recording keeps
SCHEDULER_BREAKS = {make.__name__: what.split(":")[0].split(" + ")[-1]
                    for _, make, what in breaks.BREAKS.values()}

_HEAD = '''"""Scheduler subclasses with a bug: vllm_contract/rig/breaks.py's, applied after each
schedule(). Needs vLLM only."""

import dataclasses
from typing import Callable

from vllm.v1.core.sched.scheduler import Scheduler
'''

_CLASS = '''

class {cls}(Scheduler):
    """{doc}"""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._break, self._calls = {fn}(), 0
        self.broken = []  # (schedule() call, request id) of each output the break changed

    def schedule(self, *args, **kwargs):
        so = super().schedule(*args, **kwargs)
        hit = self._break(so, self._calls)
        if hit:
            self.broken.append(hit)
        self._calls += 1
        return so
'''


def class_name(name: str) -> str:
    """drop_finished_once -> DropFinishedOnce."""
    return "".join(part.capitalize() for part in name.split("_"))


def module_source(names: list[str]) -> str:
    """The text of a module with a Scheduler subclass per break function in `names`."""
    parts = [_HEAD]
    for name in names:
        fn = getattr(breaks, name, None)
        if fn is None or not callable(fn):
            raise ValueError(f"no break {name!r} in rig/breaks.py")
        doc = " ".join((inspect.getdoc(fn) or name).split())
        parts += ["\n\n" + inspect.getsource(fn).rstrip() + "\n",
                  _CLASS.format(cls=class_name(name), doc=doc.replace('"""', "'''"), fn=name)]
    return "".join(parts)


def write(where: Path, module: str, names: list[str]) -> dict[str, str]:
    """`module`.py under `where` with the subclasses of `names`; break name -> "module:Class"
    (importable once `where` is on the path)."""
    (Path(where) / f"{module}.py").write_text(module_source(names))
    return {n: f"{module}:{class_name(n)}" for n in names}


def record_workload(cls, model: str, path: Path, requests: int = 60) -> int:
    """`requests` requests of staggered lengths, all added at the start, recorded with `cls` in
    place of vLLM's Scheduler on a batch of 4 until they have all finished: over a thousand
    steps. Returns the steps recorded."""
    import vllm.v1.core.sched.scheduler as sched_mod

    from vllm_contract.recorder import attach
    from vllm_contract.rig.harness import Harness, HarnessConfig
    from vllm_contract.rig.scenarios import prompt

    stock, sched_mod.Scheduler = sched_mod.Scheduler, cls
    try:
        h = Harness(model, HarnessConfig(max_num_seqs=4, max_num_batched_tokens=128))
    finally:
        sched_mod.Scheduler = stock
    steps = 0
    with attach(h.scheduler, path):
        for i in range(requests):
            h.add(f"w{i}", prompt(i, 20), max_tokens=50 + (i * 37) % 60)
        while h.busy:
            h.step()
            steps += 1
    return steps
