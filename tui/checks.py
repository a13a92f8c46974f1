"""The invariant catalog and its checker, for the findings pane: each finding with its
invariant's title, why it matters and the vLLM code that relies on it.

The checks run on a Gateway of their own, one check at a time: the views the checker stores
and the interrupts of a closing app are then the checks' alone."""

from __future__ import annotations

from dataclasses import dataclass

from vllm_contract.findings import Finding, by_step
from vllm_contract.kinds import KINDS
from vllm_contract.replay import Gateway, load_catalog, run_checks


@dataclass(frozen=True)
class Explanation:
    title: str
    why: str
    relies_on: str
    severity: str


def explanations() -> dict[str, Explanation]:
    """Finding kind -> what its catalog header (or, for a worker's, core/kinds.py) says."""
    out = {k.id: Explanation(k.title, k.why, k.relies_on, k.severity) for k in KINDS.values()}
    out.update({i.id: Explanation(i.title, i.why, i.relies_on, i.severity)
                for i in load_catalog()})
    return out


def known_ids() -> set[str]:
    return {i.id for i in load_catalog()}


def in_pane(f: Finding) -> tuple:
    """The findings pane's order: by step, with notes on the whole trace (no step, info: what
    it cannot verify) after the findings there is a step to go to."""
    return (f.step is None and f.severity == "info", *by_step(f))


def findings(gw: Gateway, engine: str, cancelled=lambda: False) -> list[Finding]:
    """The catalog's findings for one engine (and those of the whole trace), by step. One
    check at a time, so that a cancel (the app closing) is seen between them."""
    found = []
    for inv in load_catalog():
        if cancelled():
            break
        found += run_checks(gw, [inv]).findings
    mine = [f for f in found if f.engine in (None, engine)]
    mine.sort(key=in_pane)
    return mine
