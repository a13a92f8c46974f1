"""A finding, the one output format of every checker (the SQL catalog, the shadow worker): what
`check --format json` prints and what the TUI lists."""

from __future__ import annotations

from dataclasses import dataclass

SEVERITIES = ("error", "warning", "info")  # most severe first
RANK = {s: i for i, s in enumerate(reversed(SEVERITIES))}  # info 0, warning 1, error 2
COLUMNS = ["invariant", "severity", "engine", "step", "req_id", "message"]  # CSV's, in order


@dataclass
class Finding:
    """`title` is the kind's (the catalog check's, or core/kinds.py's), `details` this one's;
    `message` joins them as the JSON output has always carried them."""
    invariant: str
    severity: str
    step: int | None
    req_id: str | None
    details: str
    engine: str | None = None
    title: str = ""

    @property
    def message(self) -> str:
        return f"{self.title}: {self.details}" if self.title else self.details

    def to_dict(self) -> dict:
        return {"invariant": self.invariant, "severity": self.severity, "step": self.step,
                "req_id": self.req_id, "message": self.message, "engine": self.engine,
                "title": self.title}

    def sort_key(self) -> tuple:
        return by_severity(self)


# The two orders every output uses. A report (`check`) ranks what to fix first; a walk through the
# trace (`replay`, the TUI) goes by time, and keeps the producer's order within one request's step,
# where a worker reports a cause before what follows from it (so the sort must stay stable).
def by_severity(f: Finding) -> tuple:
    return (-RANK[f.severity], f.invariant, f.engine or "",
            -1 if f.step is None else f.step, f.req_id or "")


def by_step(f: Finding) -> tuple:
    return (-1 if f.step is None else f.step, f.engine or "", f.req_id or "")


@dataclass
class Report:
    findings: list[Finding]
    skipped: dict[str, str]  # invariant id -> reason
    ran: list[str]

    def at_or_above(self, severity: str) -> list[Finding]:
        return [f for f in self.findings if RANK[f.severity] >= RANK[severity]]

    def counts(self) -> dict[str, int]:
        return {s: sum(1 for f in self.findings if f.severity == s) for s in SEVERITIES}
