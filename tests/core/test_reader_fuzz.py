"""Fuzzing the readers: mutated copies of the committed samples (as compacted and as live
stream segments), each read by `info`, `check` or `sql`. Whatever the damage, a command exits 0
or 1 without an exception, or 2 with one line on stderr; and it ends (a pipe is never opened).
The longer run: `make fuzz` (bench/fuzz_reader.py)."""

from __future__ import annotations

import random
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import readerkit as rk

SAMPLES = ("mixed", "spec-decode", "broken-leak")


@pytest.fixture(scope="module")
def templates(tmp_path_factory) -> dict[tuple[str, str], Path]:
    base = tmp_path_factory.mktemp("templates")
    out = {}
    for name in SAMPLES:
        out[name, "parquet"] = rk.copy_sample(name, base / f"{name}-pq")
        out[name, "streams"] = rk.as_streams(name, base / f"{name}-st", segments=2)
    return out


@settings(max_examples=40, derandomize=True, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(sample=st.sampled_from(SAMPLES), form=st.sampled_from(["parquet", "streams"]),
       kinds=st.lists(st.sampled_from(rk.MUTATIONS), min_size=1, max_size=2),
       seed=st.integers(0, 2 ** 32), command=st.sampled_from(sorted(rk.COMMANDS)))
def test_damaged_traces_fail_cleanly_or_not_at_all(templates, sample, form, kinds, seed,
                                                   command):
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "trace"
        shutil.copytree(templates[sample, form], root)
        outside = Path(tmp) / "outside"
        outside.mkdir()
        (outside / "file").write_bytes(b"\xff\xff\xff\xff" + bytes(64))
        done = [rk.mutate(root, kind, rng, outside) for kind in kinds]
        result = rk.run_command(command, root)
        try:
            rk.assert_outcome(result)
        except AssertionError as e:
            raise AssertionError(f"{command} after {done}: {e}") from None


def test_every_mutation_is_exercised(templates, tmp_path):
    """Each mutation, once, through all three commands: the fuzz run above draws from these."""
    for i, kind in enumerate(rk.MUTATIONS):
        for form in ("parquet", "streams"):
            root = tmp_path / f"{kind}-{form}"
            shutil.copytree(templates["mixed", form], root)
            (tmp_path / "outside").mkdir(exist_ok=True)
            (tmp_path / "outside" / "file").write_bytes(b"x")
            done = rk.mutate(root, kind, random.Random(i), tmp_path / "outside")
            for command in rk.COMMANDS:
                result = rk.run_command(command, root)
                try:
                    rk.assert_outcome(result)
                except AssertionError as e:
                    raise AssertionError(f"{command} after {done}: {e}") from None
