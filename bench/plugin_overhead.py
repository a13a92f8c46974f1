"""What does the pytest plugin add to a test's time?

Writes a test file that runs every scenario of the rig (rig/scenarios.py: the real vLLM
Scheduler on each workload the suite records) as one test each, then runs it with pytest in a
fresh process, without and with --vllm-contract, alternated `--pairs` times. From each run's
JUnit XML: the tests' own time (setup, call and teardown: with the plugin, the recording and
the check at the end of each call are in it) and the process's wall time. Prints each pair and
the median ratios.

Usage: python bench/plugin_overhead.py [--pairs 2]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

# long_run at a quarter of its default size (1024 requests, 10k steps): each run a minute
LONG = {"VLLM_CONTRACT_LONG_REQS": "256", "VLLM_CONTRACT_LONG_STEPS": "2500"}

TESTS = '''
import pytest
from vllm_contract.rig import scenarios, tiny_model

@pytest.mark.parametrize("name", sorted(scenarios.SCENARIOS))
def test_scenario(name, tmp_path):
    scenarios.run(name, str(tiny_model.build()), tmp_path / "own")
'''


def run(where: Path, plugin: bool) -> tuple[float, float, int]:
    """(the tests' time, the process's wall time, tests) of one pytest run."""
    junit = where / f"junit-{int(plugin)}.xml"
    args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
            f"--junitxml={junit}", "test_scenarios.py"]
    if plugin:
        args.insert(4, "--vllm-contract")
    t0 = time.perf_counter()
    subprocess.run(args, cwd=where, check=True, capture_output=True,
                   env={**os.environ, "VLLM_LOGGING_LEVEL": "ERROR",
                        "VLLM_ENABLE_V1_MULTIPROCESSING": "0", **LONG})
    wall = time.perf_counter() - t0
    cases = list(ET.parse(junit).iter("testcase"))
    return sum(float(c.get("time")) for c in cases), wall, len(cases)


def main() -> None:
    from vllm_contract.rig import tiny_model

    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=2)
    a = ap.parse_args()
    tiny_model.build()
    where = Path(tempfile.mkdtemp(prefix="vllm-contract-plugin-"))
    (where / "test_scenarios.py").write_text(TESTS)
    rows = []
    for i in range(a.pairs):  # alternated, the first of a pair swapped each time
        order = (False, True) if i % 2 == 0 else (True, False)
        got = {p: run(where, p) for p in order}
        rows.append((got[False], got[True]))
    print(f"# pytest plugin overhead, {time.strftime('%Y-%m-%d')}, {platform.node()}, "
          f"{os.cpu_count()} cores\n")
    print("| pair | tests | tests' time off s | on s | ratio | wall off s | on s | ratio |")
    print("|---|---|---|---|---|---|---|---|")
    for i, (off, on) in enumerate(rows, 1):
        print(f"| {i} | {off[2]} | {off[0]:.2f} | {on[0]:.2f} | {on[0] / off[0]:.2f} | "
              f"{off[1]:.1f} | {on[1]:.1f} | {on[1] / off[1]:.2f} |")
    print(f"\nmedian ratio: tests' time {statistics.median(on[0] / off[0] for off, on in rows):.2f}, "
          f"wall {statistics.median(on[1] / off[1] for off, on in rows):.2f}")


if __name__ == "__main__":
    main()
