"""Running the pytest file `reduce` emits as a vLLM developer would: in a fresh process where
vllm_contract cannot be imported (tests/replay/test_reduce.py and long/test_reduce_breaks.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

# the emitted file run where vllm_contract cannot be imported: only vLLM and pytest
_ONLY_VLLM = """
import sys
class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name == "vllm_contract" or name.startswith("vllm_contract."):
            raise ImportError("the pytest file must not need vllm_contract")
sys.meta_path.insert(0, Refuse())
import pytest
sys.exit(pytest.main(sys.argv[1:]))
"""


def run_emitted(path: Path, **env) -> subprocess.CompletedProcess:
    """The emitted file run by pytest in a fresh process, from its own directory (no conftest
    of this project in reach), with nothing of ours on PYTHONPATH unless `env` puts it there
    and no plugin of an installed package (ours among them: it would need vllm_contract)."""
    return subprocess.run([sys.executable, "-c", _ONLY_VLLM, "-q", "-p", "no:cacheprovider",
                           "--rootdir", str(path.parent), path.name], cwd=path.parent,
                          env={**os.environ, "PYTHONPATH": "",
                               "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", **env},
                          capture_output=True, text=True, timeout=300)


def why(invariant: str) -> str:
    """The catalog's why of `invariant`: the emitted file's assertion message ends with it."""
    from vllm_contract.replay.query import catalog

    return next(i.why for i in catalog.load(None) if i.id == invariant).strip()
