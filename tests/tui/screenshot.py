"""docs/tui.svg, the README's picture: the real app on samples/broken-leak at its first finding,
at the snapshot tests' terminal size (`make docs`)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from tuikit import SAMPLES, SIZE, make_app, ready, until

OUT = Path(__file__).resolve().parents[2] / "docs" / "tui.svg"


async def main(out: Path) -> None:
    app = make_app(SAMPLES / "broken-leak")
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: ready(app))
        await pilot.press("n")
        await until(pilot, lambda: ready(app) and app.steps.step in app.finding_steps)
        await pilot.pause(0.2)
        app.save_screenshot(str(out.name), str(out.parent))


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]) if len(sys.argv) > 1 else OUT))
