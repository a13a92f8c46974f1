"""The TUI on a large trace, headless (Textual's pilot): time to first paint, step-to-step
navigation, jump to the next finding, and memory after many random navigations.

Usage: python bench/tui_speed.py TRACE [--presses 10000] [--moves 300] [--tui DIR]
       python bench/tui_speed.py TRACE --quit RUNS
(TRACE: e.g. `python bench/gen_trace.py /tmp/t1m --steps 1000000`. `--tui DIR` runs another
copy of the tui/ package, e.g. a commit's, `git archive COMMIT tui | tar -x -C DIR/..`: to
alternate two versions on a shared machine.)

- first paint: from constructing the app's data (the gateway and its views) to the first rows
  of the steps list drawn, the cursor's detail read as well.
- navigation: one `j` key, until the list shows the new cursor's row (`list`) and until that
  step's detail is read (`detail`, which waits out the app's debounce).
- next finding: one `n`, until the list shows the finding's step (`row`) and until its detail is
  read (`detail`); the next `n` is pressed once the detail is shown, as a person reads the step
  they jumped to. The generated trace is clean, so the app is given one finding every 997 steps
  (findings' source does not matter to the jump: it is a search in the sorted steps with
  findings, then the page and detail of that step).
- memory: resident set size after the warm-up and after `--presses` random navigations
  (j, k, pages, first, last, go to a random step); the page cache is bounded (64 pages).
- quit (`--quit RUNS`, alone): `vllm-contract tui TRACE` in a pseudo-terminal, `q` pressed
  while work is in flight, timed from the key to the process's exit (what a person waits for:
  the app's shutdown, the interrupted threads, the interpreter's exit), with its exit status
  and whether a traceback was written. Two states, RUNS each: the findings still computed
  (0-2 s after the steps are listed), and an SQL query running (a cross join of the trace's
  steps with themselves, hours unless interrupted) with the findings computed beside it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import random
import re
import select
import sys
import threading
import time
from pathlib import Path

from vllm_contract.findings import Finding


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def until(pilot, cond, timeout=60.0):
    # asyncio.sleep, not pilot.pause: the pilot waits for the whole process to fall idle,
    # DuckDB's threads included, which is not what a person waits for
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise TimeoutError
        await asyncio.sleep(0.001)


async def press(app, key: str) -> None:
    """A key as the terminal sends it, through the app's bindings."""
    app.simulate_key(key)
    await asyncio.sleep(0)


def p(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] * 1000


async def main(trace: Path, presses: int, moves: int) -> None:
    from vllm_contract.tui import messages as m
    from vllm_contract.tui.app import ContractApp
    from vllm_contract.tui.data import TraceData

    t0 = time.perf_counter()
    data = TraceData(trace)
    app = ContractApp(data, run_checks=False)
    async with app.run_test(size=(150, 45)) as pilot:
        lst = app.steps
        await until(pilot, lambda: len(lst.steps) and lst.row(0) is not None)
        first_rows = time.perf_counter() - t0
        await until(pilot, lambda: app.query_one("DetailPane").detail is not None)
        first_detail = time.perf_counter() - t0
        n = len(lst.steps)
        print(f"trace: {trace} ({n} steps)")
        print(f"first paint: rows {first_rows:.2f} s, with the detail {first_detail:.2f} s")

        nav_list, nav_detail = [], []
        app.goto_step(int(lst.steps[n // 2]))
        for _ in range(moves):
            want = lst.cursor + 1
            t = time.perf_counter()
            await press(app, "j")
            await until(pilot, lambda want=want: lst.cursor == want and lst.row(lst.cursor) is not None)
            nav_list.append(time.perf_counter() - t)
            await until(pilot, lambda: (d := app.query_one("DetailPane").detail) is not None
                        and d.step == lst.step)
            nav_detail.append(time.perf_counter() - t)
        print(f"navigation (j) x{moves}: list p50 {p(nav_list, .5):.1f} ms, p95 "
              f"{p(nav_list, .95):.1f} ms; detail p50 {p(nav_detail, .5):.1f} ms, p95 "
              f"{p(nav_detail, .95):.1f} ms")

        every = 997
        fake = [Finding("bench.synthetic", "error", int(s), None, "synthetic", data.engine)
                for s in lst.steps[::every]]
        app.on_findings_loaded(m.FindingsLoaded(fake, {}))
        app.goto_step(int(lst.steps[0]))
        jumps, jumps_detail = [], []
        for _ in range(min(moves, 200)):
            t = time.perf_counter()
            here = lst.cursor
            await press(app, "n")
            await until(pilot, lambda here=here: lst.cursor != here and lst.row(lst.cursor) is not None)
            jumps.append(time.perf_counter() - t)
            assert lst.cursor % every == 0
            await until(pilot, lambda: (d := app.query_one("DetailPane").detail) is not None
                        and d.step == lst.step)
            jumps_detail.append(time.perf_counter() - t)
        print(f"next finding (n) x{len(jumps)}: row p50 {p(jumps, .5):.1f} ms, p95 "
              f"{p(jumps, .95):.1f} ms; detail p50 {p(jumps_detail, .5):.1f} ms, p95 "
              f"{p(jumps_detail, .95):.1f} ms")

        rng = random.Random(0)
        before = rss_mb()
        t = time.perf_counter()
        trail = []  # RSS at each fifth of the presses: a trend, not two points
        for i in range(presses):
            if presses >= 5 and i % (presses // 5) == 0:
                trail.append(round(rss_mb()))
            r = rng.random()
            if r < 0.05:
                app.goto_step(int(lst.steps[rng.randrange(n)]))
            else:
                await press(app, rng.choice(("j", "j", "j", "k", "k", "pagedown", "pageup",
                                             "n", "N", "g", "G")))
            await asyncio.sleep(0.001)
        await asyncio.sleep(2)
        after = rss_mb()
        print(f"{presses} random navigations in {time.perf_counter() - t:.0f} s: RSS "
              f"{before:.0f} MB -> {after:.0f} MB (along the way {trail}); pages cached "
              f"{len(lst.pages)} (bound 64); DuckDB cursors "
              f"{len(getattr(data, '_cursors', []))}; threads {threading.active_count()}")
    print(f"machine: {platform.node()} {platform.machine()}, Python {sys.version.split()[0]}")


class Terminal:
    """`vllm-contract tui TRACE` in a pseudo-terminal: what it has drawn, as text."""

    def __init__(self, trace: Path) -> None:
        import pty

        exe = Path(sys.executable).with_name("vllm-contract")
        self.pid, self.fd = pty.fork()
        if self.pid == 0:
            os.environ.update(COLUMNS="150", LINES="45")
            os.execv(exe, [str(exe), "tui", str(trace)])
        self.raw = b""

    @property
    def text(self) -> str:
        return re.sub(r"\x1b\[[0-9;?<>=]*[a-zA-Z~]", "", self.raw.decode("utf-8", "replace"))

    def read(self, seconds: float) -> bool:
        """Read for `seconds`; False once the program has closed the terminal."""
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            if select.select([self.fd], [], [], min(left, 0.005))[0]:
                try:
                    chunk = os.read(self.fd, 1 << 16)
                except OSError:
                    return False
                if not chunk:
                    return False
                self.raw += chunk
        return True

    def until(self, pattern: str, timeout: float = 120.0) -> None:
        end = time.monotonic() + timeout
        while not re.search(pattern, self.text):
            if time.monotonic() > end or not self.read(0.05):
                raise TimeoutError(pattern)

    def keys(self, text: str) -> None:
        os.write(self.fd, text.encode())

    def quit(self) -> tuple[float, int, bool]:
        """Press q: seconds until the process has exited, its exit status, a traceback."""
        t = time.monotonic()
        self.keys("q")
        while self.read(0.005):
            if os.waitpid(self.pid, os.WNOHANG)[0]:
                break
        _, status = os.waitpid(self.pid, 0)
        return time.monotonic() - t, os.waitstatus_to_exitcode(status), "Traceback" in self.text


def quit_latency(trace: Path, runs: int) -> None:
    rng = random.Random(0)
    listed = r"[1-9][0-9]* steps · checking"
    heavy = "SELECT SUM(a.step + b.step) AS s FROM steps a, steps b"
    for state in ("findings computed", "SQL query running"):
        seconds, bad = [], []
        for _ in range(runs):
            term = Terminal(trace)
            term.until(listed)
            if state == "SQL query running":
                term.keys("s")
                term.read(0.3)
                term.keys(heavy + "\r")
                term.until("running…")
                term.keys("\t")  # out of the prompt: `q` there is a letter of the query
                term.read(0.5)
            else:
                term.read(rng.uniform(0, 2))
            if "finding(s)" in term.text:
                raise SystemExit(f"the findings were done before q ({state}): use a larger trace")
            s, rc, traceback = term.quit()
            seconds.append(s)
            if rc != 0 or traceback:
                bad.append(f"exit {rc}" + (", a traceback" if traceback else ""))
        print(f"quit, {state}, x{runs}: p50 {p(seconds, .5):.0f} ms, max {max(seconds) * 1000:.0f} "
              f"ms; unclean exits {len(bad)}" + (f" ({'; '.join(bad)})" if bad else ""))
    print(f"machine: {platform.node()} {platform.machine()}, {os.cpu_count()} cores, Python "
          f"{sys.version.split()[0]}, load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("trace", type=Path)
    ap.add_argument("--presses", type=int, default=10_000)
    ap.add_argument("--moves", type=int, default=300)
    ap.add_argument("--tui", type=Path, help="a tui/ package directory to run instead")
    ap.add_argument("--quit", type=int, metavar="RUNS", help="time quitting instead")
    a = ap.parse_args()
    if a.quit:
        quit_latency(a.trace, a.quit)
        raise SystemExit
    if a.tui is not None:
        import vllm_contract.tui

        vllm_contract.tui.__path__[:] = [str(a.tui.resolve())]
    asyncio.run(main(a.trace, a.presses, a.moves))
