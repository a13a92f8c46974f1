"""What `resim` and `reduce` print, in every format of their --format: a re-run compared with
the recording (step for step, or a what-if run side by side), and a reduction's counts."""

from __future__ import annotations

from vllm_contract.replay.export.registry import Rendered, exporter
from vllm_contract.replay.export.text import json_doc

RESIM = "resim"
REDUCE = "reduce"


def _plain(s, divergent: list) -> list[str]:
    pct = 100.0 * s.identical_steps / s.steps if s.steps else 0.0
    lines = [f"engine {s.engine}, re-run with {s.scheduler_class}",
             f"{s.identical_steps:,} of {s.steps:,} steps identical ({pct:.1f} %)"]
    if s.stopped:
        lines.append(f"the re-run stopped there: {s.steps:,} of the recording's "
                     f"{s.recorded_steps:,} steps run")
    if s.until is not None:
        lines.append(f"stopped after step {s.until:,} (--until): {s.steps:,} of the "
                     f"recording's {s.recorded_steps:,} steps run")
    if s.quit_at is not None:
        lines.append(f"quit in the debugger at step {s.quit_at:,}: {s.steps:,} of the "
                     f"recording's {s.recorded_steps:,} steps run")
    if s.first is not None:
        lines.append(f"first divergence: {s.first.difference}")
        later = [r for r in divergent if r.step != s.first.step]
        if later:
            lines.append(f"{len(later):,} more divergent step(s), the next: {later[0].difference}")
    rec = s.recorded
    if rec is not None:
        lines.append(f"the re-run recorded in {rec.trace}: the catalog finds {rec.errors:,} "
                     f"error(s), {rec.warnings:,} warning(s)"
                     + (f" (first: {rec.findings[0]})" if rec.findings else ""))
    return lines


def _whatif(s, kept: bool) -> list[str]:
    from vllm_contract.replay.resim.whatif import table

    lines = [f"engine {s.engine}, what-if run with {s.scheduler_class}",
             f"{s.steps:,} step(s) run (the recording has {s.recorded_steps:,}); "
             f"{s.identical_steps:,} identical to the recording's step of the same index"]
    if s.first is not None:
        lines.append(f"first divergence: {s.first.difference}")
    if s.stopped:
        lines.append("the re-run's scheduler raised: the measures are up to there")
    if s.quit_at is not None:
        lines.append(f"quit in the debugger at step {s.quit_at:,}")
    if s.whatif is not None:
        lines += table(s.whatif)
    rec = s.recorded
    if rec is not None:
        lines.append((f"the re-run recorded in {rec.trace}" if kept else
                      "the re-run checked in a scratch trace (--out NEW_TRACE keeps it)")
                     + (f" (first finding: {rec.findings[0]})" if rec.findings else ""))
    return lines


@exporter(RESIM, "table")
def resim_table(summary, divergent: list, whatif: bool, kept: bool) -> Rendered:
    """`divergent`: the re-run's steps that differ; `kept`: whether the re-run's trace (--out)
    outlives the command, or was a scratch one."""
    lines = _whatif(summary, kept) if whatif else _plain(summary, divergent)
    return Rendered().out("\n".join(lines) + "\n")


@exporter(RESIM, "json")
def resim_json(summary, divergent: list, whatif: bool, kept: bool) -> Rendered:
    out = summary.as_dict()
    if not kept and out.get("out"):
        out["out"]["trace"] = None  # the scratch trace is gone with the command
    out["divergent_steps"] = [r.step for r in divergent]
    return Rendered().out(json_doc(out))


def _stopped(result) -> Rendered:
    r = Rendered()
    if result.stopped:
        r.err(f"vllm-contract: note: stopped early ({result.stopped}): the best reduction so "
              "far\n")
    return r


@exporter(REDUCE, "table")
def reduce_table(result, out) -> Rendered:
    """`out`: the folder the reduction was written into."""
    return _stopped(result).out(
        f"{result.invariant}: {result.original_requests:,} → "
        f"{len(result.best.requests):,} request(s), {result.original_steps:,} → "
        f"{result.best_steps:,} step(s), {result.calls:,} re-simulations, "
        f"{result.seconds:.1f} s\n"
        f"the reduced trace: {result.trace}; the report: {out / 'README.md'}\n")


@exporter(REDUCE, "json")
def reduce_json(result, out) -> Rendered:
    return _stopped(result).out(json_doc(result.as_dict()))
