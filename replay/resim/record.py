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
    found: list | None = None  # the errors and warnings (core/findings.Finding)

    @property
    def findings(self) -> list[str] | None:
        """"invariant at step N (req_id)" of each error and warning."""
        if self.found is None:
            return None
        return [f"{f.invariant} at step {f.step} ({f.req_id})" for f in self.found]

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


def catalog_findings(trace: str | Path) -> list:
    """The catalog's errors and warnings on `trace`, as `vllm-contract check` finds them."""
    from vllm_contract.replay.query import catalog, checker
    from vllm_contract.replay.query.gateway import Gateway

    with Gateway(trace) as gw:
        return checker.run(gw, catalog.load(None)).at_or_above("warning")


def check(rec: Recorded) -> Recorded:
    """The catalog on the new trace."""
    rec.found = catalog_findings(rec.trace)
    rec.errors = sum(1 for f in rec.found if f.severity == "error")
    rec.warnings = len(rec.found) - rec.errors
    return rec
