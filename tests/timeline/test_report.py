"""`vllm-contract report` in a real browser: Debian's chromium, started headless by playwright,
loads the page from disk with every network request refused; no console error, every chart
drawn (an SVG with a size and marks in it), the findings with their why, a screenshot taken.
A long generated trace is drawn downsampled (at most CAP points, the peaks kept) and its request
lanes as a raster."""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from vllm_contract.cli import app
from vllm_contract.replay.query import catalog
from vllm_contract.replay.timeline import report as rp

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
