"""The manifest is checked against its schema before anything reads it: each of these once
gave a traceback and exit 1 (the code for findings). Now each is exit 2 with one line naming
the file and the key, for `info`, `check` and `sql` alike."""

from __future__ import annotations

import json

import pytest

import readerkit as rk
from vllm_contract import schema
from vllm_contract.errors import TraceError
from vllm_contract.manifest import depth, validate

COMMANDS = ("info", "check", "sql")


@pytest.fixture
def trace(tmp_path):
    return rk.copy_sample("mixed", tmp_path / "t")


def set_manifest(root, text: str) -> None:
    (rk.engine_dir(root) / schema.MANIFEST).write_text(text)


def with_key(root, key: str, value) -> None:
    m = json.loads((rk.engine_dir(root) / schema.MANIFEST).read_text())
    if "." in key:
        outer, inner = key.split(".")
        m[outer][inner] = value
    else:
        m[key] = value
    set_manifest(root, json.dumps(m))


BAD = [
    ("recorder_errors", 5, "must be a list"),
    ("recorder_errors", [5], "recorder_errors[0]: must be an object"),
    ("recorder_errors", [{"error": 5}], "recorder_errors[0].error: must be a string"),
    ("dropped_steps", [[0, 2 ** 70]], "out of range"),
    ("dropped_steps", [[5, 3]], "first step 5 is after last step 3"),
    ("dropped_steps", [[1]], "[first, last] pair"),
    ("dropped_steps", "0..3", "must be a list"),
    ("steps_recorded", -1, "out of range"),
    ("steps_recorded", 1.5, "must be an integer"),
    ("closed_cleanly", "yes", "must be a boolean"),
    ("engine", 5, "must be an object"),
    ("engine.block_size", "16", "engine.block_size: must be an integer"),
    ("engine.max_model_len", 2 ** 64, "out of range"),
    ("fields", {"SchedulerOutput": 5}, "fields.SchedulerOutput: must be a list"),
    ("pruned_segments", [{"steps": 5}], "pruned_segments[0].steps"),
    ("compaction_warnings", "torn", "must be a list"),
    ("started_at", 1e300, "not a plausible time"),
    ("contract_drift", {"unknown_fields": []}, "contract_drift.unknown_fields"),
    ("format_version", 0, "format_version"),
]


@pytest.mark.parametrize("key,value,words", BAD, ids=[f"{k}={v!r}"[:40] for k, v, _ in BAD])
def test_wrong_type_or_range(trace, key, value, words):
    with_key(trace, key, value)
    for command in COMMANDS:
        line = rk.assert_clean_failure(rk.run_command(command, trace))
        assert schema.MANIFEST in line and key.split(".")[0] in line and words in line, line


@pytest.mark.parametrize("n", [33, 5000, 200000])
def test_deeply_nested(trace, n):
    set_manifest(trace, '{"format_version": 1, "x": ' + "[" * n + "]" * n + "}")
    for command in COMMANDS:
        line = rk.assert_clean_failure(rk.run_command(command, trace))
        assert "deeper than" in line


@pytest.mark.parametrize("text,words", [
    ('{"format_version": 1, "started_at": NaN}', "not valid JSON"),
    ('{"format_version": 1, "steps_recorded": ' + "9" * 5000 + "}", "not valid JSON"),
    ('{"format_version": 1, "started_at": 1e999}', "started_at"),
    ("[1, 2]", "no format_version"),
    ('{"format_version": true}', "format version"),
])
def test_not_a_manifest(trace, text, words):
    set_manifest(trace, text)
    line = rk.assert_clean_failure(rk.run_command("info", trace))
    assert words in line, line


def test_unknown_keys_pass(trace):
    """A newer recorder's keys, whatever their shape, are not this reader's business."""
    with_key(trace, "some_future_key", {"nested": [[1, {"a": None}]]})
    assert rk.invoke("check", trace).exit_code == 0
    assert rk.integrity(trace) == []


def test_every_committed_manifest_validates():
    for path in rk.SAMPLES.rglob(schema.MANIFEST):
        validate(json.loads(path.read_text()), path)


def test_depth():
    assert depth('{"a": "[[[[", "b": [1, {"c": []}]}') == 4
    assert depth('"\\"["') == 0


def test_trace_error_is_one_line():
    assert str(TraceError("pyarrow said:\n  line two\n\tline three")) == (
        "pyarrow said: line two line three")
