"""The pytest plugin, loaded by pytest from the package's `pytest11` entry point in every run
of every project that has vllm-contract installed: so it only adds its options here, imports
nothing heavy, and does nothing unless `--vllm-contract` (or the ini option `vllm_contract`)
turns it on (then session.py does the work; docs/pytest-plugin.md)."""

from __future__ import annotations

import pytest

FAIL_ON = ("error", "warning", "never")


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("vllm-contract", "contract-check every vLLM Scheduler a test creates")
    g.addoption("--vllm-contract", action="store_true", default=False,
                help="record every vLLM Scheduler a test creates and check its steps with the "
                     "invariant catalog at the end of the test")
    parser.addini("vllm_contract", type="bool", default=False,
                  help="as --vllm-contract")
    g.addoption("--vllm-contract-dir", metavar="DIR", default=None,
                help="where the traces go, DIR/<test file>/<test name>/scheduler-N "
                     "(default .vllm-contract under the rootdir)")
    parser.addini("vllm_contract_dir", default=".vllm-contract", help="as --vllm-contract-dir")
    g.addoption("--vllm-contract-worker", choices=("none", "shadow"), default="none",
                help="also replay each trace into the shadow worker (its worker.* findings)")
    g.addoption("--vllm-contract-fail-on", choices=FAIL_ON, default="error",
                help="fail a test on findings of this severity or above (default error)")
    g.addoption("--vllm-contract-baseline", metavar="FILE", default=None,
                help="findings listed in FILE (by test id and invariant) do not fail a test")
    g.addoption("--vllm-contract-update-baseline", action="store_true", default=False,
                help="write the baseline FILE with this run's findings instead")
    g.addoption("--vllm-contract-strict", action="store_true", default=False,
                help="fail the run when a baseline entry was not hit")


def pytest_configure(config: pytest.Config) -> None:
    if not (config.getoption("vllm_contract") or config.getini("vllm_contract")):
        return
    if hasattr(config, "workerinput") or (config.pluginmanager.hasplugin("xdist")
                                          and config.getoption("numprocesses", None)):
        raise pytest.UsageError(
            "--vllm-contract does not run under pytest-xdist (-n): each worker would check "
            "its own tests and the run's summary and baseline would be split; run without -n")
    if config.getoption("vllm_contract_update_baseline") and not config.getoption(
            "vllm_contract_baseline"):
        raise pytest.UsageError("--vllm-contract-update-baseline needs "
                                "--vllm-contract-baseline FILE: the file to write")
    from vllm_contract.testing.session import ContractSession

    config.pluginmanager.register(ContractSession(config), "vllm-contract-session")
