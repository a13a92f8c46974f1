"""Attach to a running engine: a Unix domain socket per armed process, and its client.

The socket is `<run dir>/<pid>.sock`. The run dir is per user, 0700, and must be owned by the user
(`$VLLM_CONTRACT_RUN_DIR`, else `$XDG_RUNTIME_DIR/vllm-contract`, else
`/tmp/vllm-contract-<uid>`); a directory that another user could have planted or can read is
refused. On top of that, every connection's peer credentials (SO_PEERCRED) are checked: a peer
with another uid gets one refusal line and nothing else.

Protocol: one JSON object per line; one request, one answer, per connection.
  {"cmd": "info"}                                -> {"ok": true, "pid": ..., "engines": [...]}
  {"cmd": "start", "out": DIR, "steps": N|null, "seconds": S|null, "options": {ENV: value}}
  {"cmd": "stop"}                                -> {"ok": true, "engines": [{"path", ...}, ...]}
  {"cmd": "flush"}                               -> once what was recorded so far is on disk
The JSON is strict both ways: NaN and Infinity (which Python's json writes and reads by default)
are refused, and so is a number that only overflows to infinity (1e309).

The server is one selector thread and WORKERS answering threads, however many clients connect:
at most MAX_CONNECTIONS are open at once (a new one closes the oldest that has not sent its
request yet), and a connection that has not sent its request within IDLE_TIMEOUT_S is closed.
"""

from __future__ import annotations

import json
import logging
import math
import os
import queue
import selectors
import socket
import struct
import sys
import threading
import time
from pathlib import Path

# ControlError stays importable from here: the command line catches it from control's calls,
# and the run dir's checks raise it too
from vllm_contract.recorder.rundir import (ControlError, check_run_dir, ensure_run_dir,
                                           remove_quietly, run_dir)

log = logging.getLogger("vllm.vllm_contract")  # under vLLM's logger: our lines join its log

_PEERCRED = struct.Struct("3i")  # pid, uid, gid
MAX_MESSAGE = 1 << 20


def _line(obj: dict) -> bytes:
    """One line of strict JSON (ValueError for NaN or an infinity)."""
    return json.dumps(obj, default=str, allow_nan=False).encode() + b"\n"


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is not a finite number")
    return value


def _loads(data: bytes) -> dict:
    try:
        msg = json.loads(data, parse_constant=_no_constant, parse_float=_finite)
    except (ValueError, RecursionError) as e:  # JSONDecodeError, a 5000-digit int, [[[[...
        why = str(e)[:200] or type(e).__name__
        raise ControlError(f"not a control message ({why})") from None
    if not isinstance(msg, dict):
        raise ControlError("not a control message (not an object)")
    return msg


def _recv(conn: socket.socket) -> dict:
    buf = b""
    while not buf.endswith(b"\n"):
        chunk = conn.recv(65536)
        if not chunk:
            break
        buf += chunk
        if len(buf) > MAX_MESSAGE:
            raise ControlError("message too long")
    if not buf.strip():
        raise ControlError("connection closed without an answer")
    return _loads(buf)


def peer_uid(conn: socket.socket) -> int:
    _, uid, _ = _PEERCRED.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                  _PEERCRED.size))
    return uid


# -- server (inside the engine process) -----------------------------------------------------------
MAX_CONNECTIONS = 16  # open at once; beyond it the oldest one still silent is closed
IDLE_TIMEOUT_S = 5.0  # from connect to the end of the request line
IDLE_TIMEOUT_ENV = "VLLM_CONTRACT_CONTROL_IDLE_SECONDS"
WORKERS = 2  # threads that answer requests (start/stop/flush may wait on the recorder)
MAX_REQUEST = 64 << 10
MAX_STEPS = 10 ** 12
MAX_SECONDS = 10 ** 9


def idle_timeout_from_env() -> float:
    raw = os.environ.get(IDLE_TIMEOUT_ENV, "")
    if not raw:
        return IDLE_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not 0 < value <= 3600:
        log.error("vllm-contract: %s=%r: not a number of seconds in (0, 3600]; using %g",
                  IDLE_TIMEOUT_ENV, raw, IDLE_TIMEOUT_S)
        return IDLE_TIMEOUT_S
    return value


def start_limits(steps, seconds) -> str | None:
    """Why a start's `steps`/`seconds` cannot be used, or None (the CLI checks the same)."""
    if steps is not None and (type(steps) is not int or not 1 <= steps <= MAX_STEPS):
        return f"'steps' must be a whole number from 1 to {MAX_STEPS}, got {_show(steps)}"
    if seconds is not None and (type(seconds) not in (int, float)
                                or not 0 < seconds <= MAX_SECONDS):
        return (f"'seconds' must be a finite number more than 0 and at most {MAX_SECONDS}, "
                f"got {_show(seconds)}")
    return None


def _show(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


class _Conn:
    __slots__ = ("sock", "buf", "deadline")

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self.sock, self.buf, self.deadline = sock, b"", deadline


class ControlServer:
    """One selector thread accepts, checks the peer, reads each request line and closes
    connections that stay silent or are too many; WORKERS threads answer. No thread per
    connection: a client holding connections open costs a file descriptor each, up to
    MAX_CONNECTIONS."""

    TICK_S = 0.25
    SEND_TIMEOUT_S = 10.0  # an answer the client does not read frees its worker after this

    def __init__(self, engines, idle_timeout: float | None = None) -> None:
        self.engines = engines  # () -> list[ArmedEngine]
        self.idle_timeout = idle_timeout_from_env() if idle_timeout is None else idle_timeout
        d = ensure_run_dir()
        self.pid = os.getpid()
        self.path = d / f"{self.pid}.sock"
        try:
            self.path.unlink()  # a dead process with our pid left it
        except FileNotFoundError:
            pass
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(self.path))
        os.chmod(self.path, 0o600)
        self.sock.listen(64)
        self.sock.setblocking(False)
        self._refused: set[int] = set()
        self._logged: set[str] = set()
        self._closed = False
        self._reading: dict[int, _Conn] = {}  # by fd, oldest first; only the selector's thread
        self._answering = 0  # handed to the workers, not yet closed by them
        self._count_lock = threading.Lock()
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._tick_queued = False
        self._selector = selectors.DefaultSelector()
        self._selector.register(self.sock, selectors.EVENT_READ)
        self.thread = threading.Thread(target=self._serve, name="vllm-contract-control",
                                       daemon=True)
        self.workers = [threading.Thread(target=self._work, name=f"vllm-contract-control-{i}",
                                         daemon=True) for i in range(WORKERS)]
        for t in (self.thread, *self.workers):
            t.start()

    def close(self) -> None:
        if self._closed or os.getpid() != self.pid:
            return
        self._closed = True
        for _ in self.workers:
            self._jobs.put(None)
        try:
            self.sock.close()
        finally:
            try:
                self.path.unlink()
            except OSError:
                pass

    def _log_once(self, key: str, msg: str, *args) -> None:
        if key not in self._logged:
            self._logged.add(key)
            log.error(msg, *args)

    # -- the selector thread ----------------------------------------------------------------
    def _serve(self) -> None:
        next_tick = time.monotonic()
        try:
            while not self._closed:
                try:
                    now = time.monotonic()
                    if now >= next_tick:
                        next_tick = now + self.TICK_S
                        if not self._tick_queued:
                            self._tick_queued = True
                            self._jobs.put(self._tick)
                    wait = next_tick - now
                    if self._reading:
                        oldest = next(iter(self._reading.values())).deadline
                        wait = min(wait, max(0.0, oldest - now))
                    for key, _ in self._selector.select(wait):
                        if key.fileobj is self.sock:
                            self._accept()
                        else:
                            self._read(key.fileobj)
                    self._expire(time.monotonic())
                except Exception as e:  # never raised: the engine does not depend on us
                    if self._closed:
                        return
                    self._log_once(f"serve {type(e).__name__}",
                                   "vllm-contract: control socket: %s: %s", type(e).__name__, e)
                    time.sleep(self.TICK_S)
        finally:
            for c in list(self._reading.values()):
                self._drop(c)
            self._selector.close()

    def _accept(self) -> None:
        for _ in range(64):  # what is queued now; the selector calls again for more
            try:
                sock, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                if not self._closed:
                    self._log_once(f"accept {e.errno}", "vllm-contract: control socket: "
                                   "accept: %s", e)
                return
            sock.setblocking(False)
            try:
                uid = peer_uid(sock)
            except OSError:
                sock.close()
                continue
            if uid != os.getuid():
                self._refuse_uid(sock, uid)
                continue
            if len(self._reading) + self._answering >= MAX_CONNECTIONS:
                if not self._reading:  # all of them are being answered
                    self._reply_and_close(sock, f"busy: {MAX_CONNECTIONS} control connections "
                                                "are being answered; try again")
                    continue
                oldest = next(iter(self._reading.values()))
                self._drop(oldest, f"closed: more than {MAX_CONNECTIONS} control connections "
                                   "open; this one had not sent its request")
            c = _Conn(sock, time.monotonic() + self.idle_timeout)
            self._reading[sock.fileno()] = c
            self._selector.register(sock, selectors.EVENT_READ, c)

    def _refuse_uid(self, sock: socket.socket, uid: int) -> None:
        if uid not in self._refused:
            self._refused.add(uid)
            log.warning("vllm-contract: refused a control connection from uid %d "
                        "(this engine runs as uid %d)", uid, os.getuid())
        self._reply_and_close(sock, f"refused: uid {uid} may not control this engine "
                                    f"(uid {os.getuid()})")

    def _read(self, sock: socket.socket) -> None:
        c = self._reading.get(sock.fileno())
        if c is None:
            return
        try:
            chunk = sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._drop(c)
            return
        c.buf += chunk
        line, newline, _ = c.buf.partition(b"\n")
        if not newline and chunk and len(c.buf) <= MAX_REQUEST:
            return
        if len(line) > MAX_REQUEST:
            self._drop(c, f"request longer than {MAX_REQUEST} bytes")
            return
        if not line.strip():  # closed, or an empty line: nothing asked
            self._drop(c)
            return
        self._unregister(c)
        with self._count_lock:
            self._answering += 1
        self._jobs.put((c.sock, line))

    def _expire(self, now: float) -> None:
        while self._reading:
            c = next(iter(self._reading.values()))
            if c.deadline > now:
                return
            self._drop(c, f"no request within {self.idle_timeout:g} s")

    def _unregister(self, c: _Conn) -> None:
        self._reading.pop(c.sock.fileno(), None)
        try:
            self._selector.unregister(c.sock)
        except (KeyError, ValueError):
            pass

    def _drop(self, c: _Conn, error: str | None = None) -> None:
        self._unregister(c)
        if error is None:
            c.sock.close()
        else:
            self._reply_and_close(c.sock, error)

    @staticmethod
    def _reply_and_close(sock: socket.socket, error: str) -> None:
        """Best effort, never waiting: one short line fits in an empty socket buffer."""
        try:
            sock.setblocking(False)
            sock.send(_line({"ok": False, "error": error}))
        except OSError:
            pass
        sock.close()

    # -- the workers ----------------------------------------------------------------------------
    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            if callable(job):
                try:
                    job()
                except Exception as e:
                    self._log_once(f"job {type(e).__name__}", "vllm-contract: control socket: "
                                   "%s: %s", type(e).__name__, e)
                finally:
                    self._tick_queued = False
                continue
            sock, line = job
            try:
                sock.settimeout(self.SEND_TIMEOUT_S)
                try:
                    reply = self.handle(_loads(line))
                except ControlError as e:
                    reply = {"ok": False, "error": str(e)}
                except Exception as e:
                    self._log_once(f"handle {type(e).__name__}", "vllm-contract: control "
                                   "request failed: %s: %s", type(e).__name__, e)
                    reply = {"ok": False, "error": f"{type(e).__name__}: {e}"}
                try:
                    data = _line(reply)
                except ValueError as e:  # not JSON (a non-finite number): say so instead
                    data = _line({"ok": False, "error": f"unanswerable: {e}"})
                sock.sendall(data)
            except OSError:
                pass  # the client left
            except Exception as e:
                self._log_once(f"work {type(e).__name__}", "vllm-contract: control socket: "
                               "%s: %s", type(e).__name__, e)
            finally:
                sock.close()
                with self._count_lock:
                    self._answering -= 1

    def _tick(self) -> None:
        for e in self.engines():
            try:
                e.tick()
            except Exception as err:
                self._log_once(f"tick {type(err).__name__}", "vllm-contract: %s: %s",
                               type(err).__name__, err)

    def handle(self, req: dict) -> dict:
        from vllm_contract.recorder.armed import RecordingError
        from vllm_contract.recorder.settings import (ENV_OF, LIVE_DEFAULTS, SettingsError,
                                                     writer_options)

        cmd = req.get("cmd")
        engines = self.engines()
        if cmd in ("info", "status"):
            return {"ok": True, **process_info(), "engines": [e.describe() for e in engines]}
        if not engines:
            return {"ok": False, "error": "no engine is armed in this process any more"}
        if cmd == "start":
            out = req.get("out")
            if not isinstance(out, str) or not os.path.isabs(out):
                return {"ok": False, "error": f"start: 'out' must be an absolute path, "
                                              f"got {_show(out)}"}
            steps, seconds = req.get("steps"), req.get("seconds")
            problem = start_limits(steps, seconds)
            if problem:
                return {"ok": False, "error": f"start: {problem}"}
            options = req.get("options") or {}
            if not isinstance(options, dict) or not all(
                    isinstance(v, str) for v in options.values()):
                return {"ok": False, "error": "start: 'options' must map VLLM_CONTRACT_ names "
                                              "to strings, as in the environment"}
            try:
                opts = {**LIVE_DEFAULTS, **writer_options(options)}
            except (SettingsError, ValueError, OverflowError) as e:
                return {"ok": False, "error": f"start: {e}"}
            infinite = [k for k, v in opts.items() if isinstance(v, float)
                        and not math.isfinite(v)]
            if infinite:
                return {"ok": False, "error": f"start: {ENV_OF.get(infinite[0], infinite[0])} "
                                              "must be a finite number"}
            started, errors = [], []
            for e in engines:
                try:
                    rec = e.start(out, started_by="vllm-contract attach",
                                  max_steps=steps, max_seconds=seconds, **opts)
                    started.append({"index": e.index, "path": str(rec.path)})
                except (RecordingError, OSError) as err:
                    errors.append(f"engine {e.index}: {err}")
            if not started:
                return {"ok": False, "error": "; ".join(errors)}
            return {"ok": True, "engines": started, "errors": errors}
        if cmd == "flush":  # everything recorded so far is on disk when this answers
            done = [e.flush() for e in engines]
            return {"ok": all(done), "engines": [{"index": e.index, "flushed": d}
                                                 for e, d in zip(engines, done)]}
        if cmd == "stop":
            stopped, errors = [], []
            for e in engines:
                try:
                    stopped.append({"index": e.index, **e.stop("detach")})
                except RecordingError as err:
                    errors.append(f"engine {e.index}: {err}")
            if not stopped:
                return {"ok": False, "error": "; ".join(errors) or "not recording"}
            return {"ok": True, "engines": stopped, "errors": errors}
        return {"ok": False, "error": f"unknown command {cmd!r}"}


def process_info() -> dict:
    try:
        import vllm

        version = vllm.__version__
    except Exception:
        version = None
    return {"pid": os.getpid(), "ppid": os.getppid(), "uid": os.getuid(),
            "host": socket.gethostname(), "vllm_version": version,
            "argv": sys.argv[:8]}


# -- client (the CLI) -------------------------------------------------------------------------
def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def connect(s: socket.socket, path: Path, timeout: float) -> None:
    """A Unix socket with a timeout does not wait for room in the listener's backlog (EAGAIN):
    a client that floods the engine must not make everyone else's connect fail."""
    end = time.monotonic() + timeout
    while True:
        try:
            return s.connect(str(path))
        except BlockingIOError:
            if time.monotonic() >= end:
                raise socket.timeout from None
            time.sleep(0.01)


def request(path: Path, msg: dict, timeout: float = 60.0) -> dict:
    """One request to one engine socket; ControlError with a one-line message on failure."""
    try:
        data = _line(msg)
    except ValueError as e:
        raise ControlError(f"cannot send {msg.get('cmd')!r}: {e}") from None
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        connect(s, path, timeout)
        s.sendall(data)
        return _recv(s)
    except PermissionError:
        raise ControlError(f"{path}: permission denied") from None
    except (ConnectionRefusedError, FileNotFoundError):
        raise ControlError(f"{path}: no engine listening (it has exited)") from None
    except socket.timeout:
        raise ControlError(f"{path}: no answer within {timeout:g} s") from None
    except OSError as e:
        raise ControlError(f"{path}: {e.strerror or e}") from None
    finally:
        s.close()


def sockets() -> list[tuple[int, Path]]:
    d = run_dir()
    if not d.exists():
        return []
    check_run_dir(d)
    out = []
    for p in d.glob("*.sock"):
        try:
            out.append((int(p.stem), p))
        except ValueError:
            continue
    return sorted(out)


def discover(timeout: float = 5.0) -> list[dict]:
    """info of every armed process of this user on this machine; sockets and receipt rings of
    dead processes are removed."""
    found = []
    for pid, path in sockets():
        if not _pid_alive(pid):
            remove_quietly(path)
            continue
        try:
            info = request(path, {"cmd": "info"}, timeout)
        except ControlError:
            continue
        if info.get("ok"):
            info["socket"] = str(path)
            found.append(info)
    for ring in run_dir().glob("worker-*.ring") if run_dir().exists() else ():
        try:
            if not _pid_alive(int(ring.stem.split("-", 1)[1])):
                remove_quietly(ring)
        except ValueError:
            continue
    return found
