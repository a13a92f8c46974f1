"""What a command's process loads before it does anything: every command, `--help` and a typo
included, pays for each package the command line imports at its start, so the start stays free
of the heavy ones and each command loads only what it uses. pandas in particular: nothing here
needs it, but pyarrow imports it the first time it converts Python values or opens a dataset,
so a stray `pa.array(list)` or `pq.read_table` on the way brings it back (the readers build
their tables without either)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "samples" / "mixed"


def _modules_after(code: str) -> set[str]:
    """The module names in sys.modules after `code` runs in a fresh interpreter."""
    r = subprocess.run([sys.executable, "-c", "import sys\n" + code +
                        "\nprint(' '.join(sorted(sys.modules)), file=sys.stderr)"],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.stderr.strip(), r.stdout[-2000:]
    return set(r.stderr.strip().splitlines()[-1].split())


def _command(*args: str) -> str:
    """Run the command line in-process, as the `vllm-contract` script does."""
    return ("from vllm_contract.cli import main\n"
            f"sys.argv = ['vllm-contract', *{list(args)!r}]\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n")


def _top(modules: set[str]) -> set[str]:
    return {m.split(".")[0] for m in modules}


def test_importing_the_command_line_loads_no_heavy_package():
    loaded = _top(_modules_after("import vllm_contract.cli"))
    assert not loaded & {"duckdb", "pandas", "vllm", "torch", "pyarrow", "numpy", "textual"}, (
        loaded)


@pytest.mark.parametrize("args", [("--help",), ("chek", "x")], ids=["help", "typo"])
def test_help_and_a_typo_load_nothing_to_read_a_trace_with(args):
    loaded = _top(_modules_after(_command(*args)))
    assert not loaded & {"duckdb", "pandas", "pyarrow", "numpy"}, loaded


# What `--help` must never load (issue 54): each is a module name as sys.modules holds it, the
# engine or view of a command (DuckDB, pyarrow's compute kernels, vLLM, the TUI, the report's
# charts), which only that command may import, inside its function.
HELP_NEVER = ("duckdb", "pyarrow.compute", "vllm", "textual", "matplotlib")


def test_help_loads_no_command_engine():
    loaded = _modules_after(_command("--help"))
    assert "typer" in loaded  # the command line did run
    assert sorted(m for m in HELP_NEVER if m in loaded) == [], sorted(_top(loaded))


def test_the_help_probe_sees_a_module_by_its_full_name():
    # pyarrow.compute is a submodule: the probe must name it, not only its package
    loaded = _modules_after("import pyarrow.compute")
    assert "pyarrow.compute" in loaded and "pyarrow.compute" in HELP_NEVER


@pytest.mark.parametrize("command", ["info", "check"])
def test_info_and_check_of_a_sample_do_not_load_pandas(command):
    loaded = _modules_after(_command(command, str(SAMPLE)))
    assert "duckdb" in loaded  # the command did run
    assert not _top(loaded) & {"pandas", "vllm", "torch"}, sorted(_top(loaded))
    assert "pyarrow.dataset" not in loaded


def test_the_check_sees_pandas_when_it_is_loaded():
    # the same probe after a conversion that does load it: the tests above are not vacuous
    loaded = _modules_after("import pyarrow as pa\npa.array([1, 2])")
    assert "pandas" in loaded


def test_the_pytest_plugin_loads_nothing_heavy_until_turned_on():
    """pytest loads the plugin (entry point pytest11) in every run of every project that has
    vllm-contract installed: off, it must cost nothing."""
    loaded = _top(_modules_after("import vllm_contract.testing.plugin"))
    assert not loaded & {"duckdb", "pandas", "vllm", "torch", "pyarrow", "numpy", "textual",
                         "typer"}, loaded
