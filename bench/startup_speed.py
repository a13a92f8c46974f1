"""Start-up of the command line: whole-process wall time of a few commands, minus that of
`python -c pass` (the interpreter's own start, which no change here can shorten).

Usage: python bench/startup_speed.py [--rounds 15] [--trace samples/mixed] [--exe PATH ...]

Each round runs every command once, in a new order each round (interleaved, so that the
machine's drift falls on all of them alike); the table shows medians over the rounds. The
`vllm-contract` next to this interpreter is used unless `--exe` names others: given more than
once (e.g. a launcher of another copy of the package), their commands take turns in the same
rounds, side by side.
"""

from __future__ import annotations

import argparse
import platform
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

# command -> target in seconds over `python -c pass` (issue 27); a typo has none of its own
TARGETS = {"--help": 0.3, "info": 0.8, "check": 0.8}
BASE = "python -c pass"


def commands(exe: str, trace: str) -> dict[str, list[str]]:
    return {
        "--help": [exe, "--help"],
        "info": [exe, "info", trace],
        "check": [exe, "check", trace],
        "typo": [exe, "chek", trace],  # a mistyped command: a usage error, exit 2
    }


def run_once(argv: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--trace", default="samples/mixed")
    ap.add_argument("--exe", action="append")
    a = ap.parse_args()
    exes = a.exe or [str(Path(sys.executable).with_name("vllm-contract"))]
    runs = {(BASE, ""): [sys.executable, "-c", "pass"]}
    for exe in exes:
        runs.update({(name, exe): argv for name, argv in commands(exe, a.trace).items()})
    for argv in runs.values():  # warm the page cache and the bytecode caches
        run_once(argv)
    times: dict[tuple, list[float]] = {key: [] for key in runs}
    rng = random.Random(0)
    for _ in range(a.rounds):
        order = list(runs)
        rng.shuffle(order)
        for key in order:
            times[key].append(run_once(runs[key]))
    base = statistics.median(times[(BASE, "")])
    print(f"{platform.node()}  Python {platform.python_version()}  rounds {a.rounds}  "
          f"trace {a.trace}")
    print(f"{BASE}: {base:.3f} s (median)\n")
    print("| command | vllm-contract | median wall | minus `python -c pass` | min, max minus it "
          "| target |")
    print("|---|---|---|---|---|---|")
    for name in commands("", ""):
        for exe in exes:
            ts = times[(name, exe)]
            med = statistics.median(ts)
            target = TARGETS.get(name)
            print(f"| `{name}` | {exe} | {med:.3f} s | {med - base:.3f} s | "
                  f"{min(ts) - base:.3f}, {max(ts) - base:.3f} s | "
                  + (f"≤ {target} s" if target else "") + " |")


if __name__ == "__main__":
    main()
