"""What the thread workers post back to the event loop: one typed message per kind of result."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from textual.message import Message
from vllm_contract.findings import Finding
from vllm_contract.tui.data import Lifeline, StepDetail


@dataclass(eq=False)
class StepsLoaded(Message):
    steps: np.ndarray


@dataclass(eq=False)
class PageLoaded(Message):
    start: int
    rows: list[dict]


@dataclass(eq=False)
class DetailLoaded(Message):
    detail: StepDetail


@dataclass(eq=False)
class FindingsLoaded(Message):
    findings: list[Finding]
    explanations: dict


@dataclass(eq=False)
class SearchDone(Message):
    prefix: str
    ids: list[tuple[str, int]]


@dataclass(eq=False)
class LifelineLoaded(Message):
    lifeline: Lifeline


@dataclass(eq=False)
class ChartsLoaded(Message):
    series: dict[str, list[float]]


@dataclass(eq=False)
class WorkerProgress(Message):
    done: int
    total: int
    what: str


@dataclass(eq=False)
class WorkerNote(Message):
    text: str


@dataclass(eq=False)
class WorkerReached(Message):
    position: int
    state: dict
    findings: list[Finding]
    divergences: list
    notes: list[str]


@dataclass(eq=False)
class SqlDone(Message):
    query: str
    table: pa.Table
    seconds: float
