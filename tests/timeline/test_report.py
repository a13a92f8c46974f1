"""`vllm-contract report` in a real browser: Debian's chromium, started headless by playwright,
loads the page from disk with every network request refused; no console error, every chart
drawn (an SVG with a size and marks in it), the findings with their why, a screenshot taken.
A long generated trace is drawn downsampled (at most CAP points, the peaks kept) and its request
lanes as a raster."""

from __future__ import annotations

import html
import json
import re
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from vllm_contract.cli import app
from vllm_contract.replay.query import catalog, checker
from vllm_contract.replay.query.gateway import Gateway
from vllm_contract.replay.timeline import report as rp
from vllm_contract.replay.timeline import spans
from vllm_contract.trace import open_trace

import readerkit

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "samples"
CHARTS = ["tokens", "batch", "kv", "queues", "schedule", "gantt", "ttft", "duration"]


@pytest.fixture(scope="module")
def browser():
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.fail("the report's browser test needs Debian's chromium: "
                    "`apt-get install -y chromium` (make test installs it)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as e:
        pytest.fail(f"needs playwright: run `make test` (pip install -e '.[test]'); {e}")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            yield b
        finally:
            b.close()


def _findings(trace: Path) -> list:
    """The catalog's findings on `trace`, every severity, as the report shows them."""
    with Gateway(trace) as gw:
        return checker.run(gw, catalog.load(None)).findings


def _report(trace: Path, out: Path, *args: str) -> dict:
    r = CliRunner().invoke(app, ["report", str(trace), "--out", str(out), "--json", *args])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def _load(browser, page_path: Path, shot: Path):
    """The page opened from disk, network refused: (console errors, page errors, requests
    refused, the charts' [name, width, height, marks])."""
    page = browser.new_page(viewport={"width": 1200, "height": 900})
    errors, refused = [], []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))

    def route(r):
        if r.request.url.startswith("file://"):
            r.continue_()
        else:
            refused.append(r.request.url)
            r.abort()

    page.route("**/*", route)
    page.goto(page_path.as_uri())
    charts = page.eval_on_selector_all(
        "figure.chart", """els => els.map(f => {
            const s = f.querySelector('svg'); const b = s ? s.getBoundingClientRect() : null;
            return [f.dataset.chart, b ? b.width : 0, b ? b.height : 0,
                    s ? s.querySelectorAll('path, rect, image, use').length : 0]; })""")
    page.screenshot(path=str(shot), full_page=True)
    text = page.inner_text("body")
    page.close()
    return errors, refused, charts, text


def test_the_page_draws_offline_with_every_chart(browser, tmp_path):
    counts = _report(SAMPLES / "broken-leak", tmp_path / "r.html")
    assert counts["engines"] == 1 and counts["charts"] == len(CHARTS)
    html_text = (tmp_path / "r.html").read_text()
    assert "<script" not in html_text  # nothing to run, nothing fetched (checked again below)
    assert not re.search(r"""(?:src|href)\s*=\s*["']?(?:https?:)?//|url\(\s*["']?https?:""",
                         html_text)
    errors, refused, charts, text = _load(browser, tmp_path / "r.html", tmp_path / "r.png")
    assert errors == [] and refused == []
    assert [c[0] for c in charts] == CHARTS
    for name, width, height, marks in charts:
        assert width > 300 and height > 50 and marks > 5, (name, width, height, marks)
    assert (tmp_path / "r.png").stat().st_size > 20_000
    why = next(i for i in catalog.load(None) if i.id == "finished.leaked")
    flat = " ".join(text.split())
    assert "finished.leaked" in flat and " ".join(why.why.split()) in flat
    assert why.relies_on.split(";")[0].strip() in flat
    for f in _findings(SAMPLES / "broken-leak"):
        assert " ".join(f.title.split()) in flat, f.invariant
    assert "vm-15009-dp0" in flat and "steps 177" in flat  # info's summary


def test_a_long_trace_is_downsampled_and_keeps_its_peaks(browser, tmp_path):
    sys.path.insert(0, str(ROOT / "bench"))
    import gen_trace

    gen_trace.generate(tmp_path / "t", 8000, 64, 4000)  # more request phases than bars
    counts = _report(tmp_path / "t", tmp_path / "long.html")
    errors, refused, charts, text = _load(browser, tmp_path / "long.html", tmp_path / "l.png")
    assert errors == [] and refused == [] and [c[0] for c in charts] == CHARTS
    assert all(w > 300 and h > 50 and m > 5 for _, w, h, m in charts)
    assert f"at most {rp.CAP:,} points a chart" in text
    assert "columns of" in text  # the lanes drawn as a raster: more spans than bars
    assert counts["bytes"] < 2_000_000


def test_a_fleet_has_a_section_per_engine_with_its_charts_and_findings(tmp_path):
    fleet = readerkit.sample_fleet(tmp_path / "fleet")
    counts = _report(fleet, tmp_path / "fleet.html")
    assert counts["engines"] == 2 and counts["charts"] == 2 * len(CHARTS)
    page = (tmp_path / "fleet.html").read_text()
    heads = re.findall(r"<h2>Engine ([^<]*)</h2>", page)
    assert heads == ["a", "b"]
    sections = dict(zip(heads, page.split("<h2>Engine ")[1:]))
    for name, sample in (("a", "mixed"), ("b", "broken-leak")):
        section = sections[name]
        charts = re.findall(r"<figure class='chart' data-chart='([^']*)'>(.*?)</figure>",
                            section, re.S)
        assert [c for c, _ in charts] == CHARTS, name
        for chart, body in charts:
            assert "<svg" in body and "<path" in body, (name, chart)
            if chart in ("ttft", "duration"):  # whole steps, whole requests
                ticks = re.findall(r'<g id="[xy]tick_\d+">.*?<text[^>]*>([^<]*)</text>', body,
                                   re.S)
                assert ticks and all(t.isdigit() for t in ticks), (name, chart, ticks)
        found = _findings(SAMPLES / sample)
        assert found
        for f in found:
            assert html.escape(f.title) in section and f">{f.invariant}<" in section, name
    assert "finished.leaked" in sections["b"] and "finished.leaked" not in sections["a"]
    assert "finished.phantom" in sections["a"] and "finished.phantom" not in sections["b"]


def _expected_request_steps(sample: Path) -> dict[tuple[str, int], tuple[int, int | None, int]]:
    """Per request instance (id, introduction): its arrival, first token step and last
    scheduled step, from the trace's tables by DuckDB over the reader's Arrow tables. Arrival:
    the step after its add_request() (input log), else its introduction; first token: the
    first step whose scheduled tokens reach the end of its prompt."""
    import duckdb

    (e,) = open_trace(sample).engines
    con = duckdb.connect()
    for table in ("requests", "scheduled", "added"):
        con.register(table, e.read(table))
    rows = con.sql("""
        WITH r AS (SELECT req_id, step AS intro, prompt_len,
                          LEAD(step) OVER (PARTITION BY req_id ORDER BY step) AS next_intro
                   FROM requests),
        s AS (SELECT r.req_id, r.intro, x.step,
                     x.num_computed_tokens + x.num_scheduled_tokens >= r.prompt_len AS reached
              FROM r JOIN scheduled x ON x.req_id = r.req_id AND x.step >= r.intro
                   AND (r.next_intro IS NULL OR x.step < r.next_intro)
              WHERE x.kind IS NOT NULL)
        SELECT s.req_id, s.intro,
               COALESCE((SELECT MAX(a.step) + 1 FROM added a
                         WHERE a.req_id = s.req_id AND a.step < s.intro), s.intro) AS arrival,
               MIN(s.step) FILTER (WHERE s.reached) AS first_token, MAX(s.step) AS last
        FROM s GROUP BY s.req_id, s.intro""").fetchall()
    con.close()
    return {(rid, intro): (arrival, first, last) for rid, intro, arrival, first, last in rows}


def _first_sampled(sample: Path) -> dict[str, list[int]]:
    """Per request id, the steps whose model output sampled a token for it, in order."""
    (e,) = open_trace(sample).engines
    out: dict[str, list[int]] = {}
    for r in sorted(e.read("model_outputs", ["step", "req_id", "sampled_token_ids"]).to_pylist(),
                    key=lambda r: r["step"]):
        if r["sampled_token_ids"]:
            out.setdefault(r["req_id"], []).append(r["step"])
    return out


def test_time_to_first_token_and_duration_in_steps():
    """mixed: chunked prefills, a preemption and its recompute, an aborted request's id reused,
    requests queued behind others."""
    sample = SAMPLES / "mixed"
    expected = _expected_request_steps(sample)
    (e,) = spans.read(sample)
    got = {(r.req_id, r.intro_step): (r.arrival, r.first_token) for r in e.requests}
    assert got == {k: (a, f) for k, (a, f, _) in expected.items()}
    # the first token step is the one whose model output first sampled a token for it
    sampled = _first_sampled(sample)
    for (rid, intro), (_, first, _) in expected.items():
        if first is not None:
            assert min(t for t in sampled[rid] if t >= intro) == first, rid
    ttft, duration = rp.request_steps(e)
    assert sorted(ttft) == sorted(f - a + 1 for a, f, _ in expected.values() if f is not None)
    assert sorted(duration) == sorted(last - a + 1 for a, _, last in expected.values())
    # several steps of prefill (chunked), and a wait behind others before it
    assert max(f - a for a, f, _ in expected.values() if f is not None) >= 2
    assert len(set(ttft)) > 2 and len(set(duration)) > 2

    # a range that begins after some arrivals leaves those requests out of both
    cut = 30
    (e,) = spans.read(sample, first=cut)
    ttft, duration = rp.request_steps(e)
    inside = [v for v in expected.values() if v[0] >= cut]
    assert 0 < len(inside) < len(expected)
    assert sorted(ttft) == sorted(f - a + 1 for a, f, _ in inside if f is not None)
    assert sorted(duration) == sorted(last - a + 1 for a, _, last in inside)


def test_envelope_keeps_every_peak_within_the_cap():
    y = np.zeros(100_003)
    y[[7, 50_001, 100_002]] = [5.0, 9.0, 3.0]
    y[77_777] = -4.0
    x = np.arange(len(y))
    xs, lo, hi, per = rp.envelope(x, y)
    assert len(xs) <= rp.CAP and per * len(xs) >= len(y)
    assert sorted(hi[hi > 0]) == [3.0, 5.0, 9.0] and lo.min() == -4.0
    short = rp.envelope(x[:10], y[:10])
    assert short[3] == 1 and list(short[2]) == list(y[:10])


def test_bad_input_is_one_line(tmp_path):
    def run(*args):
        return CliRunner().invoke(app, ["report", *map(str, args)])

    for args, said in (((tmp_path / "nope", "--out", tmp_path / "x.html"), "no such trace"),
                       ((SAMPLES / "mixed", "--out", tmp_path), "is a directory"),
                       ((SAMPLES / "mixed", "--out", tmp_path / "x.html", "--engine", "zz"),
                        "no engine 'zz'")):
        r = run(*args)
        assert r.exit_code == 2 and len(r.stderr.splitlines()) == 1, r.output
        assert said in r.stderr and "Traceback" not in r.output
    assert not (tmp_path / "x.html").exists()
