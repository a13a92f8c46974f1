"""`contract`'s diff of two field sets (replay/contract.py) in every format of `contract
--format`: a line a change, a markdown table, JSON, or GitHub annotations."""

from __future__ import annotations

import json

from vllm_contract.replay.contract import Change, FieldSet
from vllm_contract.replay.export.registry import Rendered, exporter

KIND = "contract"


@exporter(KIND, "oneline")
def oneline(changes: list[Change], before: FieldSet, after: FieldSet) -> Rendered:
    shown = _grouped(changes)
    lines = [f"{c.cls}.{c.name}: {_what(c)}" for c in shown]
    lines.append(f"{before.source} -> {after.source}: {len(shown)} change(s), "
                 f"{_breaking(changes)} breaking something here")
    return _lines(lines)


@exporter(KIND, "markdown")
def markdown(changes: list[Change], before: FieldSet, after: FieldSet) -> Rendered:
    shown = _grouped(changes)
    lines = [f"`{before.source}` → `{after.source}`: {len(shown)} change(s), "
             f"{_breaking(changes)} breaking something here", ""]
    if shown:
        lines += ["| class | field | change | breaks | why |", "|---|---|---|---|---|"]
        lines += [f"| {c.cls} | `{c.name}` | {_change(c)} | {', '.join(c.breaks) or '-'} | "
                  f"{c.why} |" for c in shown]
    return _lines(lines)


@exporter(KIND, "json")
def as_json(changes: list[Change], before: FieldSet, after: FieldSet) -> Rendered:
    # every field on its own, the ones past a partial source too: a program reads this
    return Rendered().out(json.dumps({
        "before": before.source, "after": after.source, "breaking": _breaking(changes),
        "changes": [c.as_dict() for c in changes]}, indent=2) + "\n")


@exporter(KIND, "github")
def github(changes: list[Change], before: FieldSet, after: FieldSet) -> Rendered:
    return _lines([f"::{'error' if c.breaks else 'notice'} title=vLLM contract::{c.cls}.{c.name} "
                   f"{_what(c)}" for c in _grouped(changes)]
                  or ["::notice title=vLLM contract::no change"])


def _lines(lines: list[str]) -> Rendered:
    return Rendered().out("".join(line + "\n" for line in lines))


def _breaking(changes: list[Change]) -> int:
    return sum(1 for c in changes if c.breaks)


def _grouped(changes: list[Change]) -> list[Change]:
    """The fields past the end of a partial source, one entry a class (for people to read)."""
    out, beyond = [], {}
    for c in changes:
        if c.kind == "beyond the source":
            beyond.setdefault(c.cls, []).append(c)
        else:
            out.append(c)
    for cls, cs in beyond.items():
        out.append(Change(cls, ", ".join(c.name for c in cs), "beyond the source",
                          why=f"{len(cs)} field(s) not compared: {cs[0].why}"))
    return out


def _change(c: Change) -> str:
    if c.kind == "renamed":
        return f"renamed to `{c.after}`"
    if c.kind == "type changed":
        return f"type `{c.before}` → `{c.after}`"
    return c.kind


def _what(c: Change) -> str:
    breaks = f"; breaks {', '.join(c.breaks)}" if c.breaks else ""
    return f"{_change(c).replace('`', '')}{breaks} ({c.why})"
