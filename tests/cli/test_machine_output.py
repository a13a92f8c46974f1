"""Every machine-readable format is exactly its data on stdout, whatever else runs: each
command in a process of its own, as a user's pipe would run it, and stdout parsed whole. The
real worker's replay too, with vLLM's own log at its default level and at INFO."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from vllm_contract.recorder import attach
from vllm_contract.rig.engine import params, scheduler_of
from vllm_contract.rig.scenarios import prompt

SAMPLE = Path(__file__).resolve().parents[2] / "samples" / "mixed"
CLI = [str(Path(sys.executable).parent / "vllm-contract")]  # the installed command


def _run(*args, env=None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in (env or os.environ).items() if not k.startswith("VLLM_LOGGING")}
    return subprocess.run([*CLI, *map(str, args)], capture_output=True, text=True, env=env,
                          timeout=600)


def _jsonl(text: str) -> list:
    return [json.loads(line) for line in text.splitlines()]


def _csv(text: str) -> list:
    rows = list(csv.reader(io.StringIO(text)))
    assert rows and all(len(r) == len(rows[0]) for r in rows), text[:500]
    return rows


PARSE = {"json": json.loads, "jsonl": _jsonl, "csv": _csv, "junit": ET.fromstring}


@pytest.mark.parametrize("args,fmt", [
    (("info", SAMPLE), "json"),
    (("check", SAMPLE), "json"), (("check", SAMPLE), "jsonl"), (("check", SAMPLE), "csv"),
    (("check", SAMPLE), "junit"), (("check", SAMPLE, "--worker", "shadow"), "json"),
    (("sql", SAMPLE, "SELECT step, total_num_scheduled_tokens FROM steps"), "json"),
    (("sql", SAMPLE, "SELECT step, total_num_scheduled_tokens FROM steps"), "csv"),
    (("replay", SAMPLE), "json"), (("replay", SAMPLE), "jsonl"),
    (("ps",), "json"),
])
def test_each_format_parses_whole(args, fmt):
    r = _run(*args, "-f", fmt)
    assert r.returncode in (0, 1), r.stderr
    PARSE[fmt](r.stdout)


def test_the_real_workers_json_is_only_json(cpu_llm, tmp_path):
    """vLLM logs to stdout unless told otherwise; the replay routes it to stderr (and quiets
    it unless the user chose a level), so stdout parses at either level."""
    engine = cpu_llm.llm_engine
    with attach(scheduler_of(cpu_llm), tmp_path / "t"):
        for i in range(2):
            engine.add_request(f"r-{i}", {"prompt_token_ids": prompt(60 + i, 20)}, params(8))
        while engine.has_unfinished_requests():
            engine.step()
    for level in (None, "INFO"):
        env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_LOGGING")}
        if level:
            env["VLLM_LOGGING_LEVEL"] = level
        r = subprocess.run([*CLI, "replay", str(tmp_path / "t"), "--worker", "vllm", "-f",
                            "json"], capture_output=True, text=True, env=env, timeout=600)
        assert r.returncode in (0, 1), r.stderr[-3000:]
        out = json.loads(r.stdout)
        assert out["worker"] == "vllm" and out["steps_replayed"] > 0
        if level == "INFO":  # its log went somewhere: to stderr
            assert "INFO" in r.stderr
