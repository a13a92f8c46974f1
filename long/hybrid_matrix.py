"""Record the hybrid workload (rig/hybrid_engine.py) on every tiny hybrid model kind, run check,
check --worker shadow, resim and replay --worker vllm on each trace, and write the results as a
markdown table to docs/hybrid.md.

    python long/hybrid_matrix.py [KIND ...] [--out DIR] [--doc FILE] [--timeout SECONDS]

Each kind is recorded in a child process (`python -m vllm_contract.rig.hybrid_engine KIND OUT`),
so a model vLLM cannot run fails its own row only. The traces and every command's output stay
under --out (default: a new temporary directory; OUT/KIND is replaced). No GPU needed; one vLLM
engine runs at a time.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from vllm_contract.rig.hybrid_engine import ENGINE_OPTIONS
from vllm_contract.rig.hybrid_models import KINDS

ROOT = Path(__file__).resolve().parents[1]


def cli() -> list[str]:
    exe = Path(sys.executable).with_name("vllm-contract")
    return [str(exe)] if exe.exists() else [shutil.which("vllm-contract") or "vllm-contract"]


def run(cmd: list[str], log: Path, timeout: int) -> tuple[int | None, str]:
    """(exit code or None on timeout, stdout); stdout and stderr are kept in `log`."""
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        log.write_text(f"$ {' '.join(cmd)}\nTIMEOUT after {timeout} s\n{e.stdout or ''}"
                       f"{e.stderr or ''}")
        return None, ""
    log.write_text(f"$ {' '.join(cmd)}\nexit {p.returncode}\n--- stdout\n{p.stdout}"
                   f"--- stderr\n{p.stderr}")
    return p.returncode, p.stdout + p.stderr


def reason(text: str) -> str:
    """The line of a failed run that says why: the last `XxxError: ...`, else the last line."""
    lines = [re.sub(r"^\[rank\d+\]:\s*", "", s).strip() for s in text.splitlines() if s.strip()]
    errors = [s for s in lines if re.match(r"^[\w.]*(Error|Exception|Interrupt)\b", s)]
    line = (errors or lines or ["no output"])[-1]
    return line if len(line) <= 200 else line[:197] + "..."


def groups(manifest: dict) -> str:
    """The KV cache groups as `1 sliding_window (2 layers) + 1 full (2 layers)`, block size,
    blocks. A Mamba group goes by its mamba_type (mamba2, gdn_attn)."""
    engine = manifest.get("engine") or {}
    count: Counter = Counter()
    layers: Counter = Counter()
    for g in engine.get("kv_cache_groups") or []:
        name = (g.get("mamba_type") or g.get("kind") or g.get("spec") or "?").lower()
        count[name] += 1
        layers[name] += g.get("layers") or 0
    desc = " + ".join(f"{n} {k} ({layers[k]} layers)" for k, n in count.items()) or "?"
    return f"{desc}; block {engine.get('block_size')}, {engine.get('num_kv_blocks')} blocks"


def trace_facts(out: Path) -> dict:
    from vllm_contract.trace import open_trace

    trace = open_trace(out)
    scheduled = trace.read("scheduled").select(["req_id", "kind", "num_computed_tokens"])
    hits = {r["req_id"] for r in scheduled.to_pylist()
            if r["kind"] == "new" and (r["num_computed_tokens"] or 0) > 0}
    return dict(steps=trace.read("steps").num_rows, preempted=trace.read("preempted").num_rows,
                hits=len(hits), groups="; ".join(groups(e.manifest) for e in trace.engines))


def findings(rc: int | None, out: str) -> str:
    if rc is None:
        return "timeout"
    try:
        found = json.loads(out[out.index("["):out.rindex("]") + 1])
    except ValueError:
        return f"rc {rc}: {reason(out)}"
    sev = Counter(f.get("severity") for f in found)
    return f"{sev['error']} E / {sev['warning']} W (rc {rc})"


def matched(pattern: str, rc: int | None, out: str, fmt: str) -> str:
    if rc is None:
        return "timeout"
    m = re.findall(pattern, out)
    return f"{fmt.format(*m[-1])} (rc {rc})" if m else f"rc {rc}: {reason(out)}"


def one(kind: str, base: Path, timeout: int) -> dict:
    t0 = time.monotonic()
    out = base / kind
    shutil.rmtree(out, ignore_errors=True)
    row: dict = dict(kind=kind)
    rc, text = run([sys.executable, "-m", "vllm_contract.rig.hybrid_engine", kind, str(out)],
                   base / f"{kind}.record.log", timeout)
    row["record"] = "timeout" if rc is None else f"rc {rc}"
    if rc != 0:
        row["notes"] = f"does not run: {reason(text)}" if rc is not None else "record timed out"
        row["wall"] = time.monotonic() - t0
        return row
    row.update(trace_facts(out))
    c = cli()
    rc, text = run(c + ["check", str(out), "-f", "json"], base / f"{kind}.check.log", timeout)
    row["check"] = findings(rc, text)
    rc, text = run(c + ["check", str(out), "--worker", "shadow", "-f", "json"],
                   base / f"{kind}.shadow.log", timeout)
    row["shadow"] = findings(rc, text)
    rc, text = run(c + ["resim", str(out)], base / f"{kind}.resim.log", timeout)
    row["resim"] = matched(r"(\d+) of (\d+) steps identical", rc, text, "{}/{} identical")
    rc, text = run(c + ["replay", str(out), "--worker", "vllm"], base / f"{kind}.replay.log",
                   timeout)
    row["replay"] = matched(r"(\d+) of (\d+) step\(s\) replayed.*?(\d+) divergence\(s\)", rc, text,
                            "{}/{} replayed, {} div")
    row["wall"] = time.monotonic() - t0
    return row


COLUMNS = [("kind", "kind"), ("record", "record"), ("steps", "steps"),
           ("preempted", "preemptions"), ("hits", "prefix-hit requests"),
           ("groups", "KV cache groups"), ("check", "check"), ("shadow", "check --worker shadow"),
           ("resim", "resim"), ("replay", "replay --worker vllm"), ("wall", "wall s"),
           ("notes", "notes")]


NOT_HERE = ["", "Not in the matrix (vLLM's CPU build cannot run them): Jamba and Mamba1 "
            "(`selective_scan_fwd` is missing on the CPU), Bamba (falls back to the Transformers "
            "backend, which fails)."]


def markdown(rows: list[dict], argv: list[str]) -> str:
    date = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    head = (f"<!-- generated by `python long/hybrid_matrix.py{''.join(' ' + a for a in argv)}` "
            f"on {date}, machine {platform.machine()}, {os.cpu_count()} CPUs: do not edit, "
            f"rerun it -->\n\n"
            "# Hybrid models: the matrix\n\n"
            "Tiny random-weight hybrid models (`rig/hybrid_models.py`, several KV cache groups) "
            "recorded on vLLM's CPU build over the workload of `rig/hybrid_engine.py` (a shared "
            "160-token prefix, chunked prefill, preemption under a small KV cache, two aborts), "
            "then checked, re-simulated and replayed into a real vLLM worker. check columns: "
            "error / warning findings and the exit code.\n\n")
    lines = ["| " + " | ".join(t for _, t in COLUMNS) + " |",
             "|" + "---|" * len(COLUMNS)]
    for r in rows:
        cells = []
        for key, _ in COLUMNS:
            v = r.get(key, "")
            cells.append(f"{v:.0f}" if isinstance(v, float) else str(v).replace("|", "\\|"))
        lines.append("| " + " | ".join(cells) + " |")
    kinds = ["", "## The kinds", "", "| kind | model | engine options beyond the defaults |",
             "|---|---|---|"]
    for r in rows:
        spec = KINDS[r["kind"]]
        opts = ", ".join(f"{k}={v}" for k, v in ENGINE_OPTIONS.get(r["kind"], {}).items())
        kinds.append(f"| {r['kind']} | {spec['model']}: {spec['doc']} | {opts} |")
    return head + "\n".join(lines + kinds + NOT_HERE) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("kinds", nargs="*", metavar="KIND", help=f"default: all ({', '.join(KINDS)})")
    ap.add_argument("--out", type=Path, help="where the traces and logs go (default: a new "
                                             "temporary directory)")
    ap.add_argument("--doc", type=Path, default=ROOT / "docs" / "hybrid.md")
    ap.add_argument("--timeout", type=int, default=900, help="seconds per command")
    args = ap.parse_args(argv)
    unknown = [k for k in args.kinds if k not in KINDS]
    if unknown:
        ap.error(f"unknown kind(s) {', '.join(unknown)}; known: {', '.join(KINDS)}")
    os.environ.setdefault("VLLM_CONTRACT_CACHE", str(ROOT / ".cache"))
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    base = args.out or Path(tempfile.mkdtemp(prefix="hybrid-matrix-"))
    base.mkdir(parents=True, exist_ok=True)
    print(f"traces and logs under {base}", file=sys.stderr)
    rows = []
    for kind in args.kinds or list(KINDS):
        row = one(kind, base, args.timeout)
        rows.append(row)
        print(f"{kind}: " + ", ".join(f"{k}={row[k]:.0f}" if isinstance(row[k], float)
                                      else f"{k}={row[k]}" for k, _ in COLUMNS[1:] if k in row),
              file=sys.stderr, flush=True)
    args.doc.write_text(markdown(rows, argv))
    print(f"wrote {args.doc}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
