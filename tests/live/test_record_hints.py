"""What `vllm-contract record` says when no engine recorded: the reason, not a guess about the
installation. Real CPU vLLM, nothing mocked."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import live_child

CLI = [str(Path(sys.executable).with_name("vllm-contract"))]

# A user's script that makes its engine at import time: vLLM spawns its engine core, which
# imports the script again and fails with multiprocessing's bootstrapping error.
NO_MAIN_GUARD = """
import sys
from vllm import LLM
llm = LLM(model=sys.argv[1], skip_tokenizer_init=True, enforce_eager=True, max_model_len=256,
          dtype="bfloat16", kv_cache_memory_bytes=64 << 20)
"""


def record(tmp_path: Path, *command: str, mp: bool = False) -> subprocess.CompletedProcess:
    return subprocess.run(CLI + ["record", "--out", str(tmp_path / "trace"), "--", *command],
                          env=live_child.child_env(mp), capture_output=True, text=True,
                          timeout=300)


def test_record_of_a_script_without_a_main_guard_says_to_add_one(tiny_model, tmp_path):
    script = tmp_path / "script.py"
    script.write_text(NO_MAIN_GUARD)
    r = record(tmp_path, sys.executable, str(script), tiny_model, mp=True)
    assert r.returncode == 1, r.stderr[-3000:]
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("vllm-contract: warning: no engine recorded into "), last
    assert 'put the script\'s code under `if __name__ == "__main__":`' in last, last
    assert "installed" not in last, last
    # the engine's own log says it too, above vLLM's traceback
    assert "vllm-contract: this process, spawned by vLLM, imports the main script again" \
        in r.stdout + r.stderr


def test_record_of_a_failing_command_blames_the_command(tmp_path):
    r = record(tmp_path, sys.executable, "-c", "import sys; sys.exit(3)")
    assert r.returncode == 3
    assert r.stderr.strip().splitlines()[-1] == (
        f"vllm-contract: warning: no engine recorded into {tmp_path / 'trace'}: the command "
        "failed (exit 3) before an engine recorded anything; its error is above"), r.stderr
