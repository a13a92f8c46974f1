"""The suite on a machine other than the one that recorded the samples. A sample's manifest
names its model by an absolute path of the recording machine (its checkout's .cache/), which
exists where CI runs and nowhere else: a test that hands a committed sample to a real worker
without naming the suite's own model passes there and fails in every other clone.

So every such test names a model (read from the source: a new test is covered as it is
written), and those tests pass from a copy of the suite at another path whose samples'
manifests name a model path that exists nowhere, as the recording machine's path does on any
other machine."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _names_a_sample(fn: ast.FunctionDef) -> bool:
    return any(isinstance(n, ast.Name) and n.id == "SAMPLES"
               or isinstance(n, ast.Constant) and isinstance(n.value, str)
               and n.value.startswith("samples/") for n in ast.walk(fn))


def _hands_it_to_a_real_worker(fn: ast.FunctionDef) -> bool:
    """`worker="vllm"` in a call, or `"--worker", "vllm"` in a command line."""
    for n in ast.walk(fn):
        if isinstance(n, ast.keyword) and n.arg == "worker" and isinstance(
                n.value, ast.Constant) and n.value.value == "vllm":
            return True
        if isinstance(n, (ast.List, ast.Tuple, ast.Call)):
            items = n.elts if not isinstance(n, ast.Call) else n.args
            words = [e.value if isinstance(e, ast.Constant) else None for e in items]
            if any(a == "--worker" and b == "vllm" for a, b in zip(words, words[1:])):
                return True
    return False


def _names_a_model(fn: ast.FunctionDef) -> bool:
    return any(isinstance(n, ast.keyword) and n.arg == "model"
               or isinstance(n, ast.Constant) and n.value == "--model" for n in ast.walk(fn))


def real_worker_uses_of_samples() -> dict[str, bool]:
    """Each function of the suite (a test or a helper) that hands a committed sample to a
    real worker, as `path::name` (a test's node id) -> whether it names the model itself."""
    found = {}
    for path in sorted((ROOT / "tests").rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for fn in tree.body:
            if (isinstance(fn, ast.FunctionDef) and _names_a_sample(fn)
                    and _hands_it_to_a_real_worker(fn)):
                found[f"{path.relative_to(ROOT).as_posix()}::{fn.name}"] = _names_a_model(fn)
    return found


def test_every_test_handing_a_sample_to_a_real_worker_names_the_model():
    found = real_worker_uses_of_samples()
    assert found, "no test hands a sample to a real worker: this check finds nothing to check"
    lacking = sorted(t for t, named in found.items() if not named)
    assert not lacking, ("the model a sample's manifest names is the recording machine's path: "
                         "pass the suite's own (the tiny_model fixture) as model= or --model "
                         f"in {', '.join(lacking)}")


def test_those_tests_pass_where_the_recorded_model_path_does_not_exist(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    for part in ("tests", "samples"):
        shutil.copytree(ROOT / part, elsewhere / part,
                        ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache"))
    shutil.copy(ROOT / "pyproject.toml", elsewhere)
    gone = tmp_path / "recording-machine" / ".cache" / "tiny-llama-v1"
    manifests = sorted(elsewhere.glob("samples/*/engine=*/manifest.json"))
    assert manifests
    for path in manifests:
        m = json.loads(path.read_text())
        assert m["engine"]["model"]  # what the recording machine wrote
        m["engine"]["model"] = str(gone)
        path.write_text(json.dumps(m))
    tests = sorted(t for t in real_worker_uses_of_samples() if "::test_" in t)
    # the suite's own model as the suite has it (VLLM_CONTRACT_CACHE, set by the Makefile or
    # tests/conftest.py), at a path no sample names now
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests],
                       cwd=elsewhere, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
