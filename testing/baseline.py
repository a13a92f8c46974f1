"""The plugin's baseline file: findings known and accepted, keyed by test id and invariant (a
step number moves with any change to a test; the pair does not). JSON, sorted, so that a
change to it reads as a diff."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest

FORMAT = "vllm-contract pytest baseline 1"


@dataclass
class Baseline:
    entries: dict[tuple[str, str], int] = field(default_factory=dict)  # (test, inv) -> count
    hit: set[tuple[str, str]] = field(default_factory=set)

    @classmethod
    def load(cls, path: Path) -> "Baseline":
        if not path.exists():
            raise pytest.UsageError(f"--vllm-contract-baseline {path} does not exist: write it "
                                    "with --vllm-contract-update-baseline")
        try:
            data = json.loads(path.read_text())
            if data.get("format") != FORMAT:
                raise ValueError(f"format {data.get('format')!r}, not {FORMAT!r}")
            entries = {(e["test"], e["invariant"]): int(e.get("count", 1))
                       for e in data["entries"]}
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise pytest.UsageError(f"--vllm-contract-baseline {path}: not a baseline file "
                                    f"({e})") from None
        return cls(entries)

    def add(self, test: str, invariant: str) -> None:
        self.entries[(test, invariant)] = self.entries.get((test, invariant), 0) + 1

    def absorbs(self, test: str, invariant: str) -> bool:
        if (test, invariant) in self.entries:
            self.hit.add((test, invariant))
            return True
        return False

    def not_hit(self) -> list[tuple[str, str]]:
        return sorted(set(self.entries) - self.hit)

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        entries = [{"test": t, "invariant": i, "count": n}
                   for (t, i), n in sorted(self.entries.items())]
        path.write_text(json.dumps({"format": FORMAT, "entries": entries}, indent=1) + "\n")
