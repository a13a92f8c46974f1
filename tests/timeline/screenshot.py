"""The README's picture of `vllm-contract report`: the page of samples/broken-leak, from its
request lanes on,
as Debian's chromium draws it (`make docs`). Usage: python tests/timeline/screenshot.py OUT.png"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

from vllm_contract.replay.timeline.report import write

ROOT = Path(__file__).resolve().parents[2]


def main(out: str) -> None:
    from playwright.sync_api import sync_playwright

    page_path = Path(tempfile.mkdtemp()) / "report.html"
    write(ROOT / "samples" / "broken-leak", page_path)
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=shutil.which("chromium"), args=["--no-sandbox"])
        page = b.new_page(viewport={"width": 1150, "height": 1500})
        page.goto(page_path.as_uri())
        page.locator("figure[data-chart=gantt]").scroll_into_view_if_needed()
        page.screenshot(path=out)
        b.close()


if __name__ == "__main__":
    main(sys.argv[1])
