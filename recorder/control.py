"""Attach to a running engine: a Unix domain socket per armed process, and its client.

The socket is `<run dir>/<pid>.sock`. The run dir is per user, 0700, and must be owned by the user
(`$VLLM_CONTRACT_RUN_DIR`, else `$XDG_RUNTIME_DIR/vllm-contract`, else
`/tmp/vllm-contract-<uid>`); a directory that another user could have planted or can read is
refused. On top of that, every connection's peer credentials (SO_PEERCRED) are checked: a peer
with another uid gets one refusal line and nothing else.

Protocol: one JSON object per line; one request, one answer, per connection.
  {"cmd": "info"}                                   -> {"ok": true, "pid": ..., "engines": [...]}
  {"cmd": "start", "out": DIR, "steps": N|null, "seconds": S|null, "options": {ENV: value}}
  {"cmd": "stop"}                                   -> {"ok": true, "engines": [{"path", "steps", ...}]}
  {"cmd": "flush"}                                  -> once what was recorded so far is on disk
"""

from __future__ import annotations

import json
import logging
import os
import socket
import stat
import struct
import sys
import tempfile
import threading
import time
from pathlib import Path

from vllm_contract.recorder.settings import RUN_DIR

log = logging.getLogger("vllm_contract.recorder")

_PEERCRED = struct.Struct("3i")  # pid, uid, gid
MAX_MESSAGE = 1 << 20


class ControlError(Exception):
    """Talking to an engine failed; the message is one line for the user."""


def run_dir() -> Path:
    env = os.environ.get(RUN_DIR)
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg and os.path.isdir(xdg):
        return Path(xdg) / "vllm-contract"
    return Path(tempfile.gettempdir()) / f"vllm-contract-{os.getuid()}"


def check_run_dir(d: Path) -> Path:
    """The directory must be ours and closed to everyone else."""
    try:
        st = os.lstat(d)
    except FileNotFoundError:
        raise ControlError(f"{d}: no such directory") from None
    if not stat.S_ISDIR(st.st_mode):
        raise ControlError(f"{d}: not a directory (a symlink?): refusing to use it")
    if st.st_uid != os.getuid():
        raise ControlError(f"{d}: owned by uid {st.st_uid}, not {os.getuid()}: refusing to use it")
    if st.st_mode & 0o077:
        raise ControlError(f"{d}: mode {stat.S_IMODE(st.st_mode):04o}, must be 0700 (other "
                           "users could reach the engines' sockets): refusing to use it")
    return d


def ensure_run_dir() -> Path:
    d = run_dir()
    try:
        d.parent.mkdir(parents=True, exist_ok=True)
        d.mkdir(mode=0o700)
    except FileExistsError:
        pass
    return check_run_dir(d)


def socket_path(pid: int) -> Path:
    return run_dir() / f"{pid}.sock"


def _send(conn: socket.socket, obj: dict) -> None:
    conn.sendall(json.dumps(obj, default=str).encode() + b"\n")


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
    try:
        msg = json.loads(buf)
    except json.JSONDecodeError as e:
        raise ControlError(f"not a control message ({e})") from None
    if not isinstance(msg, dict):
        raise ControlError("not a control message (not an object)")
    return msg


def peer_uid(conn: socket.socket) -> int:
    _, uid, _ = _PEERCRED.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                  _PEERCRED.size))
    return uid


# -- server (inside the engine process) -----------------------------------------------------------
class ControlServer:
    TICK_S = 0.25

    def __init__(self, engines) -> None:
        self.engines = engines  # () -> list[ArmedEngine]
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
        self.sock.listen(16)
        self.sock.settimeout(self.TICK_S)
        self._refused: set[int] = set()
        self._closed = False
        self.thread = threading.Thread(target=self._serve, name="vllm-contract-control",
                                       daemon=True)
        self.thread.start()

    def close(self) -> None:
        if self._closed or os.getpid() != self.pid:
            return
        self._closed = True
        try:
            self.sock.close()
        finally:
            try:
                self.path.unlink()
            except OSError:
                pass

    def _serve(self) -> None:
        while not self._closed:
            try:
                conn, _ = self.sock.accept()
            except socket.timeout:
                self._tick()
                continue
            except OSError:
                if self._closed:
                    return
                time.sleep(self.TICK_S)
                continue
            threading.Thread(target=self._connection, args=(conn,), daemon=True,
                             name="vllm-contract-control-conn").start()
            self._tick()

    def _tick(self) -> None:
        for e in self.engines():
            try:
                e.tick()
            except Exception as err:
                log.error("vllm-contract: %s: %s", type(err).__name__, err)

    def _connection(self, conn: socket.socket) -> None:
        with conn:
            try:
                conn.settimeout(30)
                uid = peer_uid(conn)
                if uid != os.getuid():
                    if uid not in self._refused:
                        self._refused.add(uid)
                        log.warning("vllm-contract: refused a control connection from uid %d "
                                    "(this engine runs as uid %d)", uid, os.getuid())
                    _send(conn, {"ok": False, "error": f"refused: uid {uid} may not control "
                                                       f"this engine (uid {os.getuid()})"})
                    return
                _send(conn, self.handle(_recv(conn)))
            except Exception as e:
                try:
                    _send(conn, {"ok": False, "error": f"{type(e).__name__}: {e}"})
                except OSError:
                    pass

    def handle(self, req: dict) -> dict:
        from vllm_contract.recorder.armed import RecordingError
        from vllm_contract.recorder.settings import LIVE_DEFAULTS, SettingsError, writer_options

        cmd = req.get("cmd")
        engines = self.engines()
        if cmd in ("info", "status"):
            return {"ok": True, **process_info(), "engines": [e.describe() for e in engines]}
        if not engines:
            return {"ok": False, "error": "no engine is armed in this process any more"}
        if cmd == "start":
            out = req.get("out")
            if not isinstance(out, str) or not os.path.isabs(out):
                return {"ok": False, "error": f"start: 'out' must be an absolute path, got {out!r}"}
            steps, seconds = req.get("steps"), req.get("seconds")
            if steps is not None and (not isinstance(steps, int) or isinstance(steps, bool)
                                      or steps < 1):
                return {"ok": False, "error": f"start: 'steps' must be a whole number ≥ 1, "
                                              f"got {steps!r}"}
            if seconds is not None and (not isinstance(seconds, (int, float))
                                        or isinstance(seconds, bool) or not seconds > 0):
                return {"ok": False, "error": f"start: 'seconds' must be more than 0, "
                                              f"got {seconds!r}"}
            try:
                opts = {**LIVE_DEFAULTS, **writer_options(req.get("options") or {})}
            except SettingsError as e:
                return {"ok": False, "error": str(e)}
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


def request(path: Path, msg: dict, timeout: float = 60.0) -> dict:
    """One request to one engine socket; ControlError with a one-line message on failure."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.connect(str(path))
        _send(s, msg)
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


def remove_quietly(path: Path) -> None:
    """Unlink, ignoring any error (also used at exit for the worker rings)."""
    try:
        path.unlink()
    except OSError:
        pass
