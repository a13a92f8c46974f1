"""The long fuzz run of the readers (`make fuzz`): N mutated copies of the committed samples,
each read by `info`, `check` and `sql`; every outcome must be exit 0/1 with no exception, or exit
2 with one line on stderr, within a time limit. Prints the outcomes per mutation and every
failure (with the seed that replays it); exits 1 if there was any.

    python bench/fuzz_reader.py [--cases 300] [--seed 0]
"""

from __future__ import annotations

import argparse
import collections
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import readerkit as rk  # noqa: E402

SAMPLES = ("mixed", "mixed-async", "spec-decode", "encoder-lookalike", "broken-leak")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    outcomes: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    failures = []
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        templates = {}
        for name in SAMPLES:
            templates[name, "parquet"] = rk.copy_sample(name, base / f"{name}-pq")
            templates[name, "streams"] = rk.as_streams(name, base / f"{name}-st", segments=2)
        for case in range(args.cases):
            seed = args.seed * 1_000_003 + case
            rng = random.Random(seed)
            sample, form = rng.choice(SAMPLES), rng.choice(["parquet", "streams"])
            kinds = [rng.choice(rk.MUTATIONS) for _ in range(rng.randint(1, 2))]
            root = base / f"case{case}"
            shutil.copytree(templates[sample, form], root)
            outside = base / f"outside{case}"
            outside.mkdir()
            (outside / "file").write_bytes(b"\xff\xff\xff\xff" + bytes(64))
            done = [rk.mutate(root, k, rng, outside) for k in kinds]
            for command in rk.COMMANDS:
                try:
                    result = rk.run_command(command, root, seconds=120)
                    rk.assert_outcome(result)
                    outcomes["+".join(kinds)][f"exit {result.exit_code}"] += 1
                except (AssertionError, TimeoutError) as e:
                    failures.append(f"seed {seed} {sample}/{form} {done} {command}: {e}")
                    outcomes["+".join(kinds)]["FAILED"] += 1
            shutil.rmtree(root, ignore_errors=True)
            shutil.rmtree(outside, ignore_errors=True)
    for kinds, c in sorted(outcomes.items()):
        print(f"{kinds:<28} " + "  ".join(f"{k}: {v}" for k, v in sorted(c.items())))
    print(f"{args.cases} cases, {3 * args.cases} commands, {len(failures)} failures, "
          f"{time.perf_counter() - start:.0f} s")
    for f in failures:
        print(f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
