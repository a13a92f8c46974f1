"""How fast is the invariant catalog on a large trace, and at what memory?

1. Generate a contract-respecting trace (bench/gen_trace.py), check that the catalog finds no
   error and no warning on it (the generator and the checker validate each other).
2. Time DuckDB merely scanning the columns the checks read; time the full catalog; both in a
   fresh subprocess whose peak RSS is reported, alternating --pairs times (the median pair's
   ratio shown, every pair's listed). Target: catalog <= 3x scan, peak <= 8 GB.
3. On a subset trace: a straightforward Python loop over the rows checking nine core invariants
   against the SQL catalog restricted to the same nine. Target: SQL >= 20x faster.

Usage: python bench/check_speed.py [--steps 1000000] [--subset-steps 100000] [--pairs 5]
                                   [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
SAME = ["tokens.total_mismatch", "tokens.nonpositive", "tokens.duplicate_request",
        "lifecycle.unknown_cached", "lifecycle.scheduled_after_finish", "finished.and_scheduled",
        "finished.leaked", "computed.progress", "outputs.ids_mismatch"]

# The columns the checks read, per table (tests/query/test_bench_scan.py holds this to what DuckDB's
# plans of the catalog read). Of the list columns, `encoder_inputs` the catalog reads only
# where row-group statistics let DuckDB skip it on a trace without encoder inputs, so it never
# decodes it there, while this scan does; `spec_token_ids` the `drafts` view does read, all
# of it, a little faster than the scan does (bench/RESULTS.md).
SCAN_COLUMNS = {
    "scheduled": ("step", "req_id", "kind", "pos", "num_scheduled_tokens", "num_computed_tokens",
                  "num_output_tokens", "new_block_ids", "spec_token_ids", "encoder_inputs",
                  "all_token_ids", "new_token_ids"),
    "model_outputs": ("step", "req_id", "pos", "sampled_token_ids"),
    "steps": ("step", "t_ns", "total_num_scheduled_tokens", "num_running", "num_waiting",
              "num_new", "num_cached", "num_finished", "cached_new_token_ids_len",
              "has_structured_output_requests", "new_block_ids_to_zero",
              "num_spec_tokens_to_schedule"),
    "requests": ("step", "req_id", "prompt_len", "sampling_params", "pooling_params"),
    "added": ("step", "req_id"),
    "finished": ("step", "req_id"),
    "finish_events": ("step", "req_id", "reason", "source", "t_ns"),
    "preempted": ("step", "req_id"),
    "freed_mm": ("step", "mm_hash"),
    "mm_inputs": ("step", "req_id", "pos", "identifier", "offset", "length"),
    "transport": ("step", "event", "worker", "seq", "t_ns"),
    "updates": ("step", "t_ns"),
    "extra_fields": ("step", "owner", "field", "value_json"),
    "redacted": ("step", "req_id", "field", "length"),
    "malformed_steps": ("step", "stage", "error"),
}


def scan_sql() -> str:
    """One query per table reading every listed column (a list's length decodes its entries)."""
    import pyarrow as pa

    from vllm_contract import schema

    queries = []
    for table, cols in SCAN_COLUMNS.items():
        types = schema.schema(table)
        # quoted: `offset` is a reserved word in DuckDB
        reads = [f'MAX(CARDINALITY("{c}"))' if pa.types.is_list(types.field(c).type)
                 else f'MAX("{c}")' for c in cols]
        queries.append(f"SELECT COUNT(*), {', '.join(reads)} FROM {table}")
    return ";".join(queries)


CHILD = """
import json, resource, sys, time
from vllm_contract.replay.query import catalog, checker
from vllm_contract.replay.query.gateway import Gateway
mode, path = sys.argv[1], sys.argv[2]
t0 = time.perf_counter()
with Gateway(path) as gw:
    if mode == "scan":
        for q in sys.argv[3].split(";"):
            gw.sql(q)
        out = {}
    else:
        only = sys.argv[3].split(",") if len(sys.argv) > 3 and sys.argv[3] else None
        r = checker.run(gw, checker.select(catalog.load(), only))
        out = {"findings": [f.to_dict() for f in r.findings], "ran": len(r.ran)}
out["seconds"] = time.perf_counter() - t0
out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps(out))
"""


def child(mode: str, path: Path, arg: str = "") -> dict:
    r = subprocess.run([sys.executable, "-c", CHILD, mode, str(path), arg], capture_output=True,
                       text=True, check=True)
    return json.loads(r.stdout.strip().splitlines()[-1])


def loop_child(path: Path) -> dict:
    """python_loop() in a process of its own: it holds every row (9 GB at 100k steps), and a
    process started from one that big inherits its peak RSS figure; the page cache it evicts
    is what the SQL runs after it read the trace from."""
    code = ("import json, resource, sys; sys.path.insert(0, sys.argv[1]); "
            "from check_speed import python_loop; from pathlib import Path; "
            "s, n = python_loop(Path(sys.argv[2])); "
            "print(json.dumps({'seconds': s, 'findings': n, 'peak_rss_mb': "
            "resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))")
    r = subprocess.run([sys.executable, "-c", code, str(HERE), str(path)], capture_output=True,
                       text=True, check=True)
    return json.loads(r.stdout.strip().splitlines()[-1])


def python_loop(path: Path) -> tuple[float, int]:
    """The straightforward way: read every row into Python and walk the steps."""
    from vllm_contract.trace import open_trace

    t0 = time.perf_counter()
    t = open_trace(path)
    by_step = defaultdict(lambda: defaultdict(list))
    for table in ("steps", "scheduled", "requests", "finished", "finish_events", "model_outputs",
                  "updates"):
        for row in t.read(table).to_pylist():
            by_step[row["step"]][table].append(row)
    findings = 0
    live: dict[str, int] = {}  # req_id -> intro step, for requests the worker holds
    last: dict[str, tuple[int, int]] = {}  # req_id -> (computed + scheduled, step)
    due: dict[str, tuple[int, int]] = {}  # req_id -> (event step, due step)
    steps = sorted(s for s in by_step if by_step[s]["steps"])
    for i, s in enumerate(steps):
        d = by_step[s]
        rows = d["scheduled"]
        total = d["steps"][0]["total_num_scheduled_tokens"]
        findings += total != sum(r["num_scheduled_tokens"] or 0 for r in rows)
        findings += sum(1 for r in rows if (r["num_scheduled_tokens"] or 1) <= 0)
        listed = [r["req_id"] for r in rows if r["kind"]]
        findings += len(listed) - len(set(listed))
        fin = {r["req_id"] for r in d["finished"]}
        for rid, (ev, due_step) in list(due.items()):
            if due_step == s:
                findings += rid not in fin
                del due[rid]
        for rid in fin:
            live.pop(rid, None)
        for r in d["requests"]:
            live[r["req_id"]] = s
        for r in rows:
            if r["kind"] in ("cached", "resumed"):
                findings += r["req_id"] not in live
                findings += r["req_id"] in fin
                prev = last.get(r["req_id"])
                if r["kind"] == "cached" and prev is not None:
                    findings += prev[0] != r["num_computed_tokens"]
            if r["kind"]:
                last[r["req_id"]] = (r["num_computed_tokens"] + r["num_scheduled_tokens"], s)
        outs = {m["req_id"] for m in d["model_outputs"]}
        if d["updates"]:
            findings += len(outs ^ {r["req_id"] for r in rows if r["num_scheduled_tokens"]})
        nxt = steps[i + 1] if i + 1 < len(steps) else None
        for e in d["finish_events"]:
            if nxt is not None:
                due[e["req_id"]] = (s, nxt)
    return time.perf_counter() - t0, findings


def generated(root: Path) -> bool:
    """Whether --keep already holds gen_trace's trace there (format 2: its engine's manifest
    under _engines/), so that it is timed again rather than generated again."""
    from vllm_contract import schema

    return (root / schema.ENGINES_DIR / f"{schema.ENGINE_DIR_PREFIX}bench-0-dp0"
            / schema.MANIFEST).exists()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=1_000_000)
    # the loop holds every row in memory, which bounds the steps it can take; at 20k steps
    # the SQL side's fixed costs (opening the trace, creating views) weigh more
    ap.add_argument("--subset-steps", type=int, default=100_000)
    ap.add_argument("--keep", type=Path)
    ap.add_argument("--pairs", type=int, default=5, help="scan/catalog pairs (median shown)")
    a = ap.parse_args()
    sys.path.insert(0, str(HERE))
    from gen_trace import generate

    root = a.keep or Path(tempfile.mkdtemp(prefix="vllm-contract-check-"))
    big = root / f"big-{a.steps}"
    small = big if a.subset_steps == a.steps else root / f"small-{a.subset_steps}"
    t0 = time.perf_counter()
    if not generated(big):
        generate(big, a.steps, 64, 20_000)
    gen_s = time.perf_counter() - t0
    if not generated(small):
        generate(small, a.subset_steps, 64, 20_000)

    # Scan and catalog alternate, --pairs times: on this machine one run of either moved a lot
    # within minutes, so one pair's ratio alone says little.
    pairs = []
    for _ in range(a.pairs):
        scan, full = child("scan", big, scan_sql()), child("check", big)
        serious = [f for f in full["findings"] if f["severity"] in ("error", "warning")]
        assert not serious, f"generated trace is not clean: {serious[:3]}"
        pairs.append((full["seconds"] / scan["seconds"], scan, full))
    pairs.sort(key=lambda p: p[0])
    ratio, scan, full = pairs[len(pairs) // 2]
    # The SQL side three times around the loop (median shown): one run of it is short, and
    # what ran just before it (the full catalog, the loop) moved it.
    sql_runs = [child("check", small, ",".join(SAME))]
    loop = loop_child(small)
    loop_s = loop["seconds"]
    assert loop["findings"] == 0, \
        f"the Python loop found {loop['findings']} breaks in a clean trace"
    sql_runs += [child("check", small, ",".join(SAME)) for _ in range(2)]
    sql_runs.sort(key=lambda r: r["seconds"])
    sql_same = sql_runs[1]

    print(f"# invariant catalog speed, {time.strftime('%Y-%m-%d')}, {platform.node()}, "
          f"{os.cpu_count()} cores")
    print(f"\ntrace: {a.steps} steps x 64 requests ({a.steps * 64} scheduled rows), generated "
          f"in {gen_s:.0f} s; {full['ran']} checks, no error or warning")
    print("\n| measure | seconds | peak RSS MB | ratio | target |")
    print("|---|---|---|---|---|")
    each = ", ".join(f"{r:.2f}" for r, _, _ in pairs)
    print(f"| DuckDB scan of the checked columns (the median pair of {len(pairs)}) | "
          f"{scan['seconds']:.1f} | {scan['peak_rss_mb']:.0f} | 1 | |")
    print(f"| full catalog ({full['ran']} checks; ratios of the pairs: {each}) | "
          f"{full['seconds']:.1f} | {max(p[2]['peak_rss_mb'] for p in pairs):.0f} | "
          f"{ratio:.2f}x scan | <= 3x scan, <= 8192 MB |")
    print(f"| Python loop, {len(SAME)} invariants, {a.subset_steps} steps | {loop_s:.2f} | "
          f"{loop['peak_rss_mb']:.0f} | | |")
    runs = ", ".join(f"{r['seconds']:.2f}" for r in sql_runs)
    print(f"| SQL, same {len(SAME)} invariants, same trace (median of 3: {runs}) | "
          f"{sql_same['seconds']:.2f} | "
          f"{sql_same['peak_rss_mb']:.0f} | {loop_s / sql_same['seconds']:.1f}x faster | "
          ">= 20x |")


if __name__ == "__main__":
    main()
