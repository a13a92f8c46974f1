"""`vllm-contract report`: one self-contained HTML page of a trace (docs/report.md), to attach to
a bug report: `info`'s summary, the findings with their why and the vLLM code they rely on, and
charts drawn by matplotlib as inline SVG (no script, no CDN: it opens offline, anywhere). Long
traces are drawn as the min..max of each of at most CAP buckets of steps, so peaks stay."""

from __future__ import annotations

import html
import io
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from vllm_contract.errors import TraceError
from vllm_contract.replay.timeline.spans import Engine

CAP = 2000  # points a line chart draws at most; columns of the request chart
_GANTT_BARS = 4000  # spans drawn one by one up to this many; past it, a raster
_COLOURS = {"waiting": "#b8b8b8", "prefill": "#e6a23c", "decode": "#409eff",
            "preempted": "#e05353"}
_RANK = {"decode": 1, "prefill": 2, "waiting": 3, "preempted": 4}  # a raster cell shows the top


def envelope(x: np.ndarray, y: np.ndarray, cap: int = CAP) -> tuple:
    """(x, low, high, steps a point): each point the min and max of a bucket of consecutive
    values, at most `cap` of them (all of them when there are fewer)."""
    n = len(y)
    if n <= cap:
        return x, y, y, 1
    size = -(-n // cap)
    starts = np.arange(0, n, size)
    return x[starts], np.minimum.reduceat(y, starts), np.maximum.reduceat(y, starts), size


def _svg(fig: Any) -> str:
    import matplotlib.pyplot as plt

    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    plt.close(fig)
    text = buf.getvalue()
    text = text[text.index("<svg"):]  # without the XML prologue and doctype
    # without its RDF metadata (a creation date that would make every page differ)
    a, b = text.find("<metadata>"), text.find("</metadata>")
    return text if a < 0 or b < 0 else text[:a] + text[b + len("</metadata>"):]


def _figure(height: float = 2.2) -> tuple:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"svg.fonttype": "none", "font.size": 9, "axes.spines.top": False,
                         "axes.spines.right": False})
    fig, ax = plt.subplots(figsize=(10, height))
    return fig, ax


def line_chart(steps: np.ndarray, series: dict[str, np.ndarray], unit: str) -> tuple[str, int]:
    """One chart of `series` over the steps; (SVG, steps a point)."""
    fig, ax = _figure()
    per = 1
    for (label, y), colour in zip(series.items(), ("#409eff", "#e6a23c", "#67c23a")):
        x, lo, hi, per = envelope(steps, y.astype(float))
        if per > 1:
            ax.fill_between(x, lo, hi, color=colour, alpha=0.35, linewidth=0, step="post")
        ax.step(x, hi, where="post", color=colour, linewidth=0.8, label=label)
    ax.set_xlabel("step")
    ax.set_ylabel(unit)
    if len(series) > 1:
        ax.legend(loc="upper right", frameon=False)
    ax.margins(x=0)
    return _svg(fig), per


def gantt(e: Engine) -> tuple[str, str]:
    """The request lanes over the steps; (SVG, how it was drawn)."""
    fig, ax = _figure(max(2.0, min(8.0, 0.12 * e.lanes + 1)))
    spans = [(r.lane, phase, first, last) for r in e.requests for phase, first, last in r.phases]
    lo, hi = int(e.steps.step[0]), int(e.steps.step[-1]) + 1
    if len(spans) <= _GANTT_BARS:
        how = "each request's phases as bars"
        bars: dict[tuple[int, str], list] = {}
        for lane, phase, first, last in spans:
            bars.setdefault((lane, phase), []).append((first, last - first + 1))
        for (lane, phase), xs in bars.items():
            ax.broken_barh(xs, (lane - 0.4, 0.8), facecolors=_COLOURS[phase],
                           edgecolors="white", linewidth=0.5)
    else:
        from matplotlib.colors import ListedColormap

        cols = min(CAP, hi - lo)
        per = (hi - lo) / cols
        grid = np.zeros((max(1, e.lanes), cols), dtype=np.int8)
        for lane, phase, first, last in spans:
            a = int((first - lo) / per)
            b = max(a + 1, int(np.ceil((last + 1 - lo) / per)))
            cell = grid[lane, a:b]
            np.maximum(cell, _RANK[phase], out=cell)
        order = ["#ffffff"] + [_COLOURS[p] for p in sorted(_RANK, key=_RANK.get)]
        ax.imshow(grid, aspect="auto", interpolation="nearest", cmap=ListedColormap(order),
                  vmin=0, vmax=len(order) - 1, origin="lower",
                  extent=(lo, hi, -0.5, grid.shape[0] - 0.5))
        how = (f"{cols:,} columns of {per:,.1f} steps each; a column shows the phase ranked "
               "highest in it (preempted, waiting, prefill, decode)")
    from matplotlib.patches import Patch

    ax.legend(handles=[Patch(color=c, label=p) for p, c in _COLOURS.items()],
              loc="lower left", bbox_to_anchor=(0, 1.0), frameon=False, ncol=4, fontsize=8)
    from matplotlib.ticker import MaxNLocator

    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlim(lo, hi)
    ax.set_xlabel("step")
    ax.set_ylabel("lane")
    return _svg(fig), how


def request_steps(e: Engine) -> tuple[list[int], list[int]]:
    """Per request that arrived within the range (docs/report.md): its time to first token,
    steps from its arrival to its first token step, both counted, where that step is in the
    range too; and its duration, steps from its arrival to its last scheduled step in the
    range, both counted."""
    ttft, duration = [], []
    for r in e.requests:
        if r.arrival is None or r.arrival < e.lo:
            continue  # arrived before the range: what it waited there is not in it
        if r.first_token is not None:
            ttft.append(r.first_token - r.arrival + 1)
        ran = [last for phase, _, last in r.phases if phase in ("prefill", "decode")]
        if ran:
            duration.append(max(ran) - r.arrival + 1)
    return ttft, duration


def histogram(values: list[int], label: str) -> str:
    from matplotlib.ticker import MaxNLocator

    fig, ax = _figure(2.0)
    if values:
        lo, hi = min(values), max(values)
        # a bar a step where they fit, else 50 bins
        bins = np.arange(lo, hi + 2) - 0.5 if hi - lo < 50 else 50
        ax.hist(values, bins=bins, color="#409eff")
    # whole steps and whole requests: a tick at 2.5 would name a value none can have (one
    # integer in view is enough, else matplotlib falls back to fractions)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))
    ax.yaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))
    ax.set_xlabel(label)
    ax.set_ylabel("requests")
    return _svg(fig)


_CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222}
h1{font-size:1.5em}h2{font-size:1.25em;border-bottom:1px solid #ddd;margin-top:2em}
h3{font-size:1.05em;margin-bottom:.2em}pre{background:#f6f6f6;padding:.8em;overflow:auto;
font-size:12px}table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ddd;
padding:.25em .5em;vertical-align:top;text-align:left}.error{color:#b00}.warning{color:#a60}
figure{margin:.5em 0 1.5em}figcaption{color:#666;font-size:12px}svg{max-width:100%;height:auto}
"""


def _findings_html(e: Engine, why: dict[str, Any]) -> str:
    if not e.findings:
        return "<p>No findings.</p>"
    by: dict[str, list] = {}
    for f in e.findings:
        by.setdefault(f.invariant, []).append(f)
    rows = []
    from vllm_contract.findings import RANK

    for inv, fs in sorted(by.items(), key=lambda kv: (-RANK[kv[1][0].severity], -len(kv[1]),
                                                     kv[0])):
        f = fs[0]
        known = why.get(inv)
        examples = "<br>".join(
            html.escape(f"step {x.step}" if x.step is not None else "the trace")
            + (f" · {html.escape(x.req_id)}" if x.req_id else "") + ": "
            + html.escape(x.details) for x in fs[:5])
        more = f"<br>… and {len(fs) - 5:,} more" if len(fs) > 5 else ""
        rows.append(
            f"<tr><td><b>{html.escape(inv)}</b><br><span class='{html.escape(f.severity)}'>"
            f"{html.escape(f.severity)}</span> · {len(fs):,}</td>"
            f"<td>{html.escape(f.title)}<br>{examples}{more}</td>"
            f"<td>{html.escape(known.why) if known else ''}</td>"
            f"<td><code>{html.escape(known.relies_on) if known else ''}</code></td></tr>")
    return ("<table><tr><th>invariant</th><th>what</th><th>why it matters</th>"
            "<th>vLLM code it relies on</th></tr>" + "".join(rows) + "</table>")


def _figure_html(name: str, title: str, svg: str, caption: str) -> str:
    return (f"<figure class='chart' data-chart='{name}'><h3>{html.escape(title)}</h3>{svg}"
            f"<figcaption>{html.escape(caption)}</figcaption></figure>")


def engine_html(e: Engine, why: dict[str, Any]) -> tuple[str, int]:
    """An engine's section; and how many charts it has."""
    s = e.steps
    c = s.columns
    charts = []
    for name, title, series, unit in (
            ("tokens", "Tokens per step", {"tokens": c["tokens"]}, "tokens"),
            ("batch", "Batch size (requests scheduled)",
             {"scheduled": c["num_new"] + c["num_cached"]}, "requests"),
            ("kv", "KV cache usage", {"KV usage": c["kv_pct"]}, "%"),
            ("queues", "Queue lengths after schedule()",
             {"running": c["num_running"], "waiting": c["num_waiting"]}, "requests"),
            ("schedule", "schedule() time", {"schedule()": c["schedule_us"]}, "µs")):
        svg, per = line_chart(s.step, series, unit)
        caption = ("every step" if per == 1 else
                   f"each point the min–max of {per:,} steps (at most {CAP:,} points a chart)")
        charts.append(_figure_html(name, title, svg, caption))
    svg, how = gantt(e)
    charts.append(_figure_html("gantt", f"Requests ({len(e.requests):,} in {e.lanes:,} lanes, "
                               "the peak concurrency)", svg, how))
    ttft, duration = request_steps(e)
    before = sum(1 for r in e.requests if r.arrival is None or r.arrival < e.lo)
    cut = f"; {before:,} that arrived before the range left out" if before else ""
    charts.append(_figure_html("ttft", "Time to first token, in steps",
                               histogram(ttft, "steps from arrival to first token"),
                               f"{len(ttft):,} requests (those whose prompt was computed "
                               f"to its end in the range){cut}"))
    charts.append(_figure_html("duration", "Request duration, in steps",
                               histogram(duration, "steps from arrival to last scheduled step"),
                               f"{len(duration):,} requests{cut}"))
    body = (f"<h2>Engine {html.escape(e.name)}</h2><p>Steps {int(s.step[0]):,}–"
            f"{int(s.step[-1]):,} ({len(s):,} recorded), {len(e.requests):,} requests, "
            f"{len(e.findings):,} findings.</p><h3>Findings</h3>{_findings_html(e, why)}"
            + "".join(charts))
    return body, len(charts)


def write(trace: str | Path, out: str | Path, *, engine: str | None = None,
          first: int | None = None, last: int | None = None,
          progress: Callable[[str], None] | None = None) -> dict:
    """Write the report of `trace` to `out` (a file written whole or not at all); what it
    holds."""
    from vllm_contract.replay.export import render
    from vllm_contract.replay.query import catalog
    from vllm_contract.replay.query.gateway import Gateway
    from vllm_contract.replay.query.summary import summary
    from vllm_contract.replay.timeline.spans import read
    from vllm_contract.trace import open_trace

    say = progress or (lambda text: None)
    out = Path(out)
    t = open_trace(trace)  # unusable input is said before any progress
    names = [e.name for e in t.engines]
    if engine is not None and engine not in names:
        raise TraceError(f"no engine {engine!r} in the trace (it has: {', '.join(names)})")
    if first is not None and last is not None and first > last:
        raise TraceError(f"--from {first} is after --until {last}")
    say("reading the trace")
    with Gateway(t) as gw:
        s = summary(t, gw)
        s["views"] = gw.counts()  # the tables' rows, as `info` prints them
    info = "".join(text for text, _ in render("info", "table", s).chunks)
    say("checking it with the catalog")
    engines = read(trace, engine, first, last)
    why = {i.id: i for i in catalog.load(None)}
    sections, charts = [], 0
    for n, e in enumerate(engines, 1):
        say(f"drawing engine {e.name} ({n} of {len(engines)})")
        body, k = engine_html(e, why)
        sections.append(body)
        charts += k
    page = (f"<!doctype html><html lang='en'><head><meta charset='utf-8'>"
            f"<title>vllm-contract report: {html.escape(str(trace))}</title>"
            f"<style>{_CSS}</style></head><body><h1>vllm-contract report</h1>"
            f"<p><code>{html.escape(str(trace))}</code>, made "
            f"{time.strftime('%Y-%m-%d %H:%M')} by <code>vllm-contract report</code>.</p>"
            f"<h2>Summary</h2><pre>{html.escape(info)}</pre>" + "".join(sections)
            + "</body></html>\n")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".partial")
    tmp.write_text(page, encoding="utf-8")
    tmp.replace(out)
    return {"report": str(out), "engines": len(engines), "charts": charts,
            "findings": sum(len(e.findings) for e in engines), "bytes": out.stat().st_size}
