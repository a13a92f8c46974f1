"""How fast is the shadow worker on a large trace, against `check` on the same trace?

1. Generate a contract-respecting trace (bench/gen_trace.py) into a cache folder, unless one is
   given.
2. Alternate, --rounds times, each in a fresh subprocess: the full invariant catalog (as
   bench/check_speed.py times it) and a shadow replay of the whole trace (`run_shadow`, reading
   included); the median of each side and the median round's ratio are shown, every round's
   listed. Target: shadow <= 120 s and <= 5x check.
3. In one more subprocess: a Session over the trace, a first full pass (it takes the
   checkpoints), then `goto(n)` and `state()` at --gotos random positions, each timed. Target:
   p95 <= 200 ms. The checkpoints' memory is reported.

`--module FILE` (repeatable) also times a ShadowModel module loaded from FILE (a copy of an
older single-file shadow.py, say: `git show 5ed0ac0:replay/worker/shadow.py > old.py`) in the
same rounds, so before and after are measured side by side.

Usage: python bench/shadow_speed.py [TRACE] [--steps 1000000] [--cache DIR] [--rounds 3]
                                    [--gotos 200] [--module FILE] [--no-check] [--no-goto]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / \
    "vllm-contract-bench"

LOAD = """
import importlib.util, json, resource, sys, time
def shadow_module(path):
    if not path:
        from vllm_contract.replay.worker import shadow
        return shadow
    spec = importlib.util.spec_from_file_location("shadow_under_test", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
def peak_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
"""

REPLAY = LOAD + """
from vllm_contract.trace import open_trace
mod = shadow_module(sys.argv[2])
t0 = time.perf_counter()
found = mod.run_shadow(open_trace(sys.argv[1]))
print(json.dumps({"seconds": time.perf_counter() - t0, "findings": len(found),
                  "first": [f.to_dict() for f in found[:3]], "peak_rss_mb": peak_mb()}))
"""

GOTO = LOAD + """
import pickle, random
from vllm_contract.replay import session as session_mod
from vllm_contract.replay.worker import shadow_worker
mod = shadow_module(sys.argv[2])
shadow_worker.ShadowModel = mod.ShadowModel  # what Session's shadow worker is made of
n_gotos, seed = int(sys.argv[3]), int(sys.argv[4])
t0 = time.perf_counter()
s = session_mod.Session(sys.argv[1])
opened = time.perf_counter() - t0
assert s.run()
first = time.perf_counter() - t0
assert s.findings == [], [f.message for f in s.findings[:3]]
rng = random.Random(seed)
times = []
for _ in range(n_gotos):
    n = rng.randrange(len(s.steps) + 1)
    t = time.perf_counter()
    s.goto(n)
    st = s.state()
    times.append(time.perf_counter() - t)
    assert st["position"] == n
w = s.worker.w
cps = w._cps.packed if hasattr(w, "_cps") else w._checkpoints  # the package; one shadow.py
# bytes when the worker keeps its checkpoints packed; otherwise their pickled size, which
# understates live Python objects several times over
packed = all(isinstance(v, (bytes, bytearray)) for v in cps.values())
size = sum(len(v) if packed else len(pickle.dumps(v)) for v in cps.values())
print(json.dumps({"open_s": opened, "first_pass_s": first, "times": times,
                  "checkpoints": len(cps), "checkpoint_bytes": size, "packed": packed,
                  "peak_rss_mb": peak_mb()}))
"""


def run_child(code: str, *args: str) -> dict:
    r = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                       check=False)
    if r.returncode != 0:
        raise SystemExit(f"child failed ({r.returncode}): {r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(p / 100 * len(xs)) - 1))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("trace", type=Path, nargs="?", help="a trace; default: generate one")
    ap.add_argument("--steps", type=int, default=1_000_000)
    ap.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    ap.add_argument("--rounds", type=int, default=3, help="check/shadow rounds (median shown)")
    ap.add_argument("--gotos", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--module", action="append", default=[],
                    help="also time the shadow.py at this path (repeatable)")
    ap.add_argument("--no-current", action="store_true", help="only the --module ones")
    ap.add_argument("--no-check", action="store_true")
    ap.add_argument("--no-goto", action="store_true")
    a = ap.parse_args()
    sys.path.insert(0, str(HERE))

    gen_s = None
    path = a.trace
    if path is None:
        from gen_trace import generate

        path = a.cache / f"gen-{a.steps}"
        if not (path / "engine=bench-0-dp0" / "manifest.json").exists():
            t0 = time.perf_counter()
            generate(path, a.steps, 64, 20_000)
            gen_s = time.perf_counter() - t0
    from check_speed import child as check_child

    versions = ([] if a.no_current else [("current", "")]) + [
        (Path(m).name, str(Path(m).resolve())) for m in a.module]
    rounds = []
    for r in range(a.rounds):
        row = {}
        if not a.no_check:
            row["check"] = check_child("check", path)
            serious = [f for f in row["check"]["findings"]
                       if f["severity"] in ("error", "warning")]
            assert not serious, f"the trace is not clean: {serious[:3]}"
        # the order within a round turns, so no version always runs right after check
        for name, mod in (versions if r % 2 == 0 else versions[::-1]):
            row[name] = run_child(REPLAY, str(path), mod)
            assert row[name]["findings"] == 0, row[name]["first"]
        rounds.append(row)
        print(f"round {r + 1}: " + ", ".join(f"{k} {v['seconds']:.1f} s"
                                              for k, v in row.items()),
              file=sys.stderr, flush=True)
    gotos = {}
    if not a.no_goto:
        for name, mod in versions:
            gotos[name] = run_child(GOTO, str(path), mod, str(a.gotos), str(a.seed))

    print(f"# shadow worker speed, {time.strftime('%Y-%m-%d %H:%M')}, {platform.node()}, "
          f"{os.cpu_count()} cores")
    gen = f", generated in {gen_s:.0f} s" if gen_s is not None else ""
    print(f"\ntrace: {path} ({a.steps if a.trace is None else '?'} steps{gen})")
    print("\n| measure | runs (s) | median s | peak RSS MB | ratio to check | target |")
    print("|---|---|---|---|---|---|")
    if not a.no_check:
        cs = [r["check"]["seconds"] for r in rounds]
        print(f"| check, full catalog | {', '.join(f'{x:.1f}' for x in cs)} | "
              f"{statistics.median(cs):.1f} | "
              f"{max(r['check']['peak_rss_mb'] for r in rounds):.0f} | 1 | |")
    for name, _ in versions:
        xs = [r[name]["seconds"] for r in rounds]
        ratio = ""
        if not a.no_check:
            ratios = sorted(r[name]["seconds"] / r["check"]["seconds"] for r in rounds)
            ratio = (f"**{statistics.median(ratios):.2f}x** (rounds: "
                     f"{', '.join(f'{x:.2f}' for x in ratios)})")
        print(f"| shadow replay, {name} | {', '.join(f'{x:.1f}' for x in xs)} | "
              f"{statistics.median(xs):.1f} | "
              f"{max(r[name]['peak_rss_mb'] for r in rounds):.0f} | {ratio} | "
              f"<= 120 s, <= 5x check |")
    for name, g in gotos.items():
        ms = [t * 1000 for t in g["times"]]
        kind = "packed" if g["packed"] else "pickled size of"
        print(f"\nSession, {name}: opened in {g['open_s']:.1f} s, first full pass "
              f"{g['first_pass_s']:.1f} s (opening included); {len(ms)} random goto(n) + "
              f"state(): p50 {pct(ms, 50):.1f} ms, **p95 {pct(ms, 95):.1f} ms**, max "
              f"{max(ms):.1f} ms (target p95 <= 200 ms); {g['checkpoints']} checkpoints, "
              f"{kind} {g['checkpoint_bytes'] / 2**20:.1f} MiB; peak RSS "
              f"{g['peak_rss_mb']:.0f} MB")


if __name__ == "__main__":
    main()
