"""`record`, `ps`, `attach`, `detach`: getting traces out of the engines users actually run.

`record` runs a command with the plugin's environment set; `ps`/`attach`/`detach` talk to armed
engines over their control sockets (vllm_contract.recorder.control). Diagnostics go to stderr,
data (the `ps` table, JSON) to stdout; bad input is one line on stderr and exit 2.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from vllm_contract.cli.common import ExitCode, emit, err, fail, format_choice, progress_line, warn

app = typer.Typer()


# the formats the exporters have (vllm_contract.replay.export)
PsFormat = format_choice("PsFormat", "ps")


def _options(redact_prompts: bool, max_trace_bytes: Optional[str], flush_seconds: Optional[float],
             flush_steps: Optional[int], max_pending_bytes: Optional[str]) -> dict[str, str]:
    """Recording options as the environment names the plugin reads, validated here."""
    # imported here, not at the top: the recorder package brings pyarrow with it, which
    # every other command (and `--help`) would load for nothing
    from vllm_contract.recorder import settings as st

    raw, flags = {}, {}
    if flush_seconds is not None and not (math.isfinite(flush_seconds) and flush_seconds > 0):
        fail(f"--flush-seconds must be a finite number more than 0, got {flush_seconds}")
    if redact_prompts:
        raw["VLLM_CONTRACT_REDACT_PROMPTS"] = "1"
    for env, flag, value in (
            ("VLLM_CONTRACT_MAX_TRACE_BYTES", "--max-trace-bytes", max_trace_bytes),
            ("VLLM_CONTRACT_FLUSH_SECONDS", "--flush-seconds", flush_seconds),
            ("VLLM_CONTRACT_FLUSH_STEPS", "--flush-steps", flush_steps),
            ("VLLM_CONTRACT_MAX_PENDING_BYTES", "--max-pending-bytes", max_pending_bytes)):
        if value is not None:
            raw[env] = str(value)
            flags[env] = flag
    try:
        st.writer_options(raw)
    except st.SettingsError as e:
        msg = str(e)
        for env, flag in flags.items():
            msg = msg.replace(env + "=", flag + " ")
        fail(msg)
    except OverflowError:  # a size with more digits than a float holds
        fail(f"{' or '.join(flags.values())}: a number too large to use")
    return raw


# Options shared by `record` and `attach`.
RedactOpt = Annotated[bool, typer.Option(
    "--redact-prompts", help="Leave prompt token ids out (lengths and SHA-256 kept); the trace "
                             "cannot be replayed into a real worker.")]
MaxBytesOpt = Annotated[Optional[str], typer.Option(
    "--max-trace-bytes", metavar="SIZE", help="Keep each engine's trace under SIZE (e.g. 2G): "
                                              "the oldest closed segments are deleted, the gap "
                                              "is recorded.")]
FlushSecondsOpt = Annotated[Optional[float], typer.Option(
    "--flush-seconds", help="Write to disk at least this often (default 1.0).")]
FlushStepsOpt = Annotated[Optional[int], typer.Option(
    "--flush-steps", help="Write to disk every this many steps (default 64).")]
PendingOpt = Annotated[Optional[str], typer.Option(
    "--max-pending-bytes", metavar="SIZE", help="Memory the writer may fall behind by before "
                                                "steps are dropped (default 256M).")]


def _check_out(out: Path) -> Path:
    out = out.expanduser().absolute()
    if out.exists() and not out.is_dir():
        fail(f"{out}: exists and is not a directory")
    return out


def _summarise(out: Path) -> str:
    from vllm_contract.errors import TraceError
    from vllm_contract.trace import open_trace

    try:
        t = open_trace(out)
    except TraceError:
        return ""
    engines = t.engines
    steps = sum(e.manifest.get("steps_recorded") or 0 for e in engines)
    try:
        steps = sum(e.count("steps") for e in engines)
    except TraceError:
        pass
    unclean = sum(1 for e in engines if not e.manifest.get("closed_cleanly"))
    return (f"{len(engines)} engine(s), {steps} steps"
            + (f"; {unclean} not closed cleanly" if unclean else ""))


@app.command(context_settings={"allow_interspersed_args": False})
def record(
    command: Annotated[Optional[list[str]], typer.Argument(
        help="The command to run, after `--`: e.g. -- vllm serve MODEL, -- python script.py",
        show_default=False)] = None,
    out: Annotated[Path, typer.Option("--out", "-o", help="Trace root: every engine the "
                                      "command starts records into its own directory here.")]
    = Path("vllm-trace"),
    redact_prompts: RedactOpt = False,
    max_trace_bytes: MaxBytesOpt = None,
    flush_seconds: FlushSecondsOpt = None,
    flush_steps: FlushStepsOpt = None,
    max_pending_bytes: PendingOpt = None,
) -> None:
    """Run a command with recording on (every vLLM engine it starts records every step), then
    say where the trace is. The command's exit code is passed through."""
    if not command:
        fail("record: no command given (usage: vllm-contract record --out DIR -- COMMAND ...)")
    out = _check_out(out)
    env = dict(os.environ)
    env.update(_options(redact_prompts, max_trace_bytes, flush_seconds, flush_steps,
                        max_pending_bytes))
    from vllm_contract.recorder.settings import TRACE_DIR

    env[TRACE_DIR] = str(out)
    plugins = env.get("VLLM_PLUGINS")
    if plugins is not None and "vllm_contract" not in [p.strip() for p in plugins.split(",")]:
        fail(f"VLLM_PLUGINS={plugins!r} leaves out vllm_contract: nothing would be recorded")
    from importlib.metadata import entry_points

    if not any(ep.name == "vllm_contract" for ep in entry_points(group="vllm.general_plugins")):
        err("vllm-contract: warning: the vllm_contract plugin is not installed in this Python "
             "environment; the command's vLLM must have it (pip install vllm-contract)")
    out.mkdir(parents=True, exist_ok=True)
    from vllm_contract.recorder.settings import RECORD_NOTES

    fd, notes = tempfile.mkstemp(prefix="vllm-contract-record-", suffix=".notes")
    os.close(fd)
    env[RECORD_NOTES] = notes
    err(f"vllm-contract: recording into {out}/")
    try:
        proc = subprocess.Popen(command, env=env)
    except OSError as e:
        os.unlink(notes)
        fail(f"cannot run {command[0]!r}: {e.strerror or e}")
    # Ctrl-C reaches the command from the terminal itself; SIGTERM/SIGHUP sent to us are passed
    # on, so that a supervisor stopping us stops (and seals the trace of) the command.
    previous = {}
    for sig in (signal.SIGTERM, signal.SIGHUP):
        previous[sig] = signal.signal(sig, lambda s, f: proc.send_signal(s))
    previous[signal.SIGINT] = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        code = proc.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    try:
        noted = set(Path(notes).read_text().split())
        os.unlink(notes)
    except OSError:
        noted = set()
    if code < 0:
        err(f"vllm-contract: the command was killed by {signal.Signals(-code).name}")
        code = 128 - code
    summary = _summarise(out)
    if summary:
        err(f"vllm-contract: trace: {out}  ({summary})")
        err(f"vllm-contract: next: vllm-contract info {out}")
    elif "main-guard" in noted:
        warn(f"no engine recorded into {out}: the script starts vLLM when it is imported, and "
             "vLLM's engine core process (spawned) imports it again and fails; put the "
             'script\'s code under `if __name__ == "__main__":`')
    elif code != 0:
        warn(f"no engine recorded into {out}: the command failed (exit {code}) before an "
             "engine recorded anything; its error is above")
    else:
        warn(f"no engine recorded into {out}: did the command start a "
             "vLLM engine from a Python environment with vllm-contract installed?")
    raise typer.Exit(code)


# -- live engines ---------------------------------------------------------------------------------
def _discover() -> list[dict]:
    from vllm_contract.recorder.control import ControlError, discover

    try:
        return discover()
    except ControlError as e:
        fail(str(e))
    return []


def _targets(pid: int) -> list[dict]:
    """The armed processes meant by PID: the engine core process itself, or the parent of
    engine cores (a `vllm serve` or `LLM` front end; with data parallelism several)."""
    procs = _discover()
    exact = [p for p in procs if p["pid"] == pid]
    found = exact or [p for p in procs if p.get("ppid") == pid]
    if not found:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            fail(f"no process {pid}")
        except PermissionError:
            pass
        fail(f"process {pid} is not an armed vLLM engine of this user (start vLLM with "
              f"VLLM_CONTRACT_ARM=1; `vllm-contract ps` lists armed engines)")
    return found


def _ask(proc: dict, msg: dict, timeout: float = 60.0) -> dict:
    from vllm_contract.recorder.control import ControlError, request

    try:
        reply = request(Path(proc["socket"]), msg, timeout)
    except ControlError as e:
        fail(f"engine {proc['pid']}: {e}")
    if not reply.get("ok"):
        fail(f"engine {proc['pid']}: {reply.get('error')}")
    return reply


@app.command()
def ps(format: Annotated[PsFormat, typer.Option("--format", "-f")] = PsFormat.table) -> None:
    """List the armed vLLM engines of this user on this machine: pid, model, data-parallel
    rank, and whether (and where) each is recording."""
    from vllm_contract.replay.export import render

    emit(render("ps", format.value, _discover()))


@app.command()
def attach(
    pid: Annotated[int, typer.Argument(help="An armed engine core's pid, or its parent's "
                                            "(`vllm serve`, an LLM script).")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Trace root to record into.")],
    steps: Annotated[Optional[int], typer.Option(
        help="Stop after this many steps.", min=1)] = None,
    seconds: Annotated[Optional[float], typer.Option(
        help="Stop after this many seconds.")] = None,
    wait: Annotated[bool, typer.Option(
        "--wait/--no-wait", help="With --steps/--seconds: wait for the end and show progress "
                                 "(default), or return at once.")] = True,
    redact_prompts: RedactOpt = False,
    max_trace_bytes: MaxBytesOpt = None,
    flush_seconds: FlushSecondsOpt = None,
    flush_steps: FlushStepsOpt = None,
    max_pending_bytes: PendingOpt = None,
) -> None:
    """Start recording a running engine at its next step boundary, without a restart."""
    if steps is not None and seconds is not None:
        fail("attach: give --steps or --seconds, not both")
    from vllm_contract.recorder.control import MAX_SECONDS, MAX_STEPS

    if seconds is not None and not 0 < seconds <= MAX_SECONDS:  # NaN fails this too
        fail(f"attach: --seconds must be a finite number more than 0 and at most "
             f"{MAX_SECONDS}, got {seconds}")
    if steps is not None and steps > MAX_STEPS:
        fail(f"attach: --steps must be at most {MAX_STEPS}, got {steps}")
    out = _check_out(out)
    options = _options(redact_prompts, max_trace_bytes, flush_seconds, flush_steps,
                       max_pending_bytes)
    procs = _targets(pid)
    msg = {"cmd": "start", "out": str(out), "steps": steps, "seconds": seconds,
           "options": options}
    started: list[tuple[dict, int]] = []
    for p in procs:
        reply = _ask(p, msg)
        for e in reply["engines"]:
            typer.echo(f"recording engine {p['pid']}#{e['index']} into {e['path']} "
                       f"(from its next step)")
            started.append((p, e["index"]))
        for warning in reply.get("errors") or ():
            warn(f"engine {p['pid']}: {warning}")
    if steps is None and seconds is None:
        err(f"vllm-contract: stop with: vllm-contract detach {pid}")
        return
    if not wait:
        return
    try:
        _wait_for_end(started, steps)
    except KeyboardInterrupt:
        err("")
        err("vllm-contract: interrupted: detaching")
        for p in {id(p): p for p, _ in started}.values():
            _report_stop(p, _ask(p, {"cmd": "stop"}))
        return


def _wait_for_end(started: list[tuple[dict, int]], steps: Optional[int]) -> None:
    """Poll the engines this attach started until each recording has ended and been sealed."""
    last_line = ""
    bar = progress_line()
    procs = {id(p): p for p, _ in started}
    wanted = {(id(p), index) for p, index in started}
    while True:
        states, counts, lasts = [], 0, []
        for key, p in procs.items():
            info = _ask(p, {"cmd": "status"}, timeout=30)
            for e in info["engines"]:
                if (key, e["index"]) not in wanted:
                    continue
                states.append(e["state"])
                counts += e.get("steps") or 0
                lasts.append(e.get("last"))
        if all(s == "armed" for s in states) and all(x and x["sealed"] for x in lasts):
            break
        line = f"recorded {counts}" + (f"/{steps * len(states)}" if steps else "") + " steps"
        if line != last_line:
            bar.show(line)
            last_line = line
        time.sleep(0.5)
    bar.end()
    bad = False
    for last in lasts:
        if last:
            status = "" if last["closed_cleanly"] else ", NOT closed cleanly"
            typer.echo(f"closed {last['path']}: {last['steps']} steps ({last['reason']}{status})")
            for problem in last.get("errors") or ():
                err(f"vllm-contract: recorder error: {problem}")
            bad |= not last["closed_cleanly"]
    if bad:
        err("vllm-contract: error: the recorder failed; see the trace's recorder_errors")
        raise typer.Exit(ExitCode.FOUND)


def _report_stop(p: dict, reply: dict) -> bool:
    ok = True
    for e in reply["engines"]:
        status = "closed cleanly" if e.get("closed_cleanly") else "NOT closed cleanly"
        extra = f"; {e['dropped_steps_total']} steps dropped" if e.get("dropped_steps_total") else ""
        typer.echo(f"closed {e['path']}: {e['steps']} steps, {status}{extra}")
        for problem in e.get("errors") or ():
            err(f"vllm-contract: recorder error (engine {p['pid']}#{e['index']}): {problem}")
        ok &= bool(e.get("closed_cleanly"))
    return ok


@app.command()
def detach(pid: Annotated[int, typer.Argument(help="The pid given to `attach`.")]) -> None:
    """Stop recording at the next step boundary and close the trace cleanly."""
    procs = _targets(pid)
    ok = True
    stopped = False
    for p in procs:
        from vllm_contract.recorder.control import ControlError, request

        try:
            reply = request(Path(p["socket"]), {"cmd": "stop"}, 120)
        except ControlError as e:
            fail(f"engine {p['pid']}: {e}")
        if not reply.get("ok"):
            if len(procs) == 1:
                fail(f"engine {p['pid']}: {reply.get('error')}")
            continue
        stopped = True
        ok &= _report_stop(p, reply)
    if not stopped:
        fail(f"no engine of process {pid} is recording")
    if not ok:
        raise typer.Exit(ExitCode.FOUND)
