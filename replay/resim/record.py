"""`--out NEW_TRACE`: the re-run recorded by the project's own recorder, as a live engine's
would be, then checked with the invariant catalog (docs/resim.md, "Recording the re-run")."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vllm_contract.errors import TraceError


@dataclass
class Recorded:
    """The new trace and what the catalog found on it."""
    trace: str
    errors: int | None = None  # None until the catalog has run (the re-run stopped early)
    warnings: int | None = None
    findings: list[str] | None = None  # "invariant at step N (req_id)" of each error/warning
    found: list | None = None  # those findings (core/findings.Finding)

    def as_dict(self) -> dict:
        return {"trace": self.trace, "errors": self.errors, "warnings": self.warnings,
                "findings": self.findings}


def refuse_used(out: Path) -> None:
    """TraceError for an --out that already holds something: a trace is never written over."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise TraceError(f"--out {out} already exists and is not an empty directory: resim "
                         "records the re-run into a new one")


def start(scheduler: Any, out: Path, source: dict) -> Any:
    """Record every call the re-run makes to `scheduler` into `out` (recorder/attach.py, as the
    rig does); the manifest's `resim` says which recording and settings it re-ran."""
    from vllm_contract.recorder import attach

    return attach(scheduler, out, started_by="vllm-contract resim",
                  manifest_extra={"resim": source})


def check(rec: Recorded) -> Recorded:
    """The catalog on the new trace, as `vllm-contract check` runs it."""
    from vllm_contract.replay.query import catalog, checker
    from vllm_contract.replay.query.gateway import Gateway

    with Gateway(rec.trace) as gw:
        report = checker.run(gw, catalog.load(None))
    counts = report.counts()
    rec.errors, rec.warnings = counts["error"], counts["warning"]
    rec.found = report.at_or_above("warning")
    rec.findings = [f"{f.invariant} at step {f.step} ({f.req_id})" for f in rec.found]
    return rec
