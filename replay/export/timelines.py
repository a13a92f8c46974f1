"""What `export` and `report` print once their file is written: a line saying what it holds
(on stderr, since the file is the data), or the same counts as JSON on stdout."""

from __future__ import annotations

from vllm_contract.replay.export.registry import Rendered, exporter
from vllm_contract.replay.export.text import json_doc

EXPORT = "export"
REPORT = "report"


@exporter(EXPORT, "table")
def export_table(counts: dict, path) -> Rendered:
    return Rendered().err(
        f"wrote {path}: {counts['engines']} engine(s), {counts['steps']:,} steps, "
        f"{counts['requests']:,} requests in {counts['lanes']:,} lanes, "
        f"{counts['findings']:,} findings, {counts['bytes']:,} bytes\n")


@exporter(EXPORT, "json")
def export_json(counts: dict, path) -> Rendered:
    return Rendered().out(json_doc({"perfetto": str(path), **counts}))


@exporter(REPORT, "table")
def report_table(counts: dict, path) -> Rendered:
    return Rendered().err(f"wrote {path}: {counts['engines']} engine(s), {counts['charts']} "
                          f"charts, {counts['findings']:,} findings, {counts['bytes']:,} bytes\n")


@exporter(REPORT, "json")
def report_json(counts: dict, path) -> Rendered:
    return Rendered().out(json_doc(counts))
