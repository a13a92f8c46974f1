"""The checker asks of a gateway only what it uses (checker.Cursors for checks side by side),
never its class: any object with a gateway's face runs the catalog, one with cursors runs it on
them, and anything else is refused in one line that names what it lacks."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from vllm_contract.replay.query import catalog, checker
from vllm_contract.replay.query.gateway import Gateway
from vllm_contract.replay.query.spark import SparkGateway

SAMPLE = Path(__file__).resolve().parents[2] / "samples" / "broken-leak"


class Delegating:
    """A gateway by its face only: no QueryGateway or Gateway among its classes."""

    def __init__(self, gw: Gateway, cursors: bool):
        self._gw, self.threads = gw, set()
        self.views, self.present = gw.views, gw.present
        self.is_materialized, self.materialize = gw.is_materialized, gw.materialize
        if cursors:
            self.cursor = self._cursor

    def _cursor(self):
        self.threads.add(threading.current_thread().name)
        return self._gw.cursor()

    def sql(self, query, con=None):
        self.threads.add(threading.current_thread().name)
        return self._gw.sql(query) if con is None else self._gw.sql(query, con=con)


def findings(report):
    return [f.to_dict() for f in report.findings]


def test_gateways_are_taken_by_their_face():
    invs = catalog.load()
    with Gateway(SAMPLE) as gw:
        assert isinstance(gw, checker.Cursors)
        want = checker.run(gw, invs, workers=2)
    assert not hasattr(SparkGateway, "cursor")  # Spark's runs the checks one by one
    for cursors in (False, True):
        with Gateway(SAMPLE) as gw:
            duck = Delegating(gw, cursors)
            assert not isinstance(duck, Gateway)
            report = checker.run(duck, invs, workers=2)
        assert findings(report) == findings(want) and report.ran == want.ran
        on_cursors = {t for t in duck.threads if t.startswith("vllm-contract-check")}
        assert bool(on_cursors) == cursors, duck.threads


def test_another_object_is_refused_naming_what_it_lacks():
    with pytest.raises(TypeError) as e:
        checker.run(SAMPLE, catalog.load())
    msg = str(e.value)
    assert "query gateway" in msg and "PosixPath" in msg and "materialize" in msg
    assert "\n" not in msg
