"""Every invariant of the catalog has a diff test here: a tiny trace and its exact rows."""

from __future__ import annotations

from pathlib import Path

from vllm_contract.replay.query import catalog


def test_every_invariant_has_a_diff_test():
    here = Path(__file__).parent
    text = "\n".join(p.read_text() for p in here.glob("test_*.py") if p.name != Path(__file__).name)
    missing = [i.id for i in catalog.load() if f'"{i.id}"' not in text]
    assert missing == [], f"no diff test in tests/query/diff/ names {missing}"
