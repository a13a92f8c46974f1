"""The per-user run directory that holds the engines' control sockets and the workers' receipt
rings (`$VLLM_CONTRACT_RUN_DIR`, else `$XDG_RUNTIME_DIR/vllm-contract`, else
`/tmp/vllm-contract-<uid>`): it must be owned by the user and 0700, since a directory another
user could have planted or can read would hand them the engines.

Its own module so that both ends reach it without importing each other: the control socket
(`control`, which reaches the recording through `armed`) and the receipt rings (`receipts`, which
`armed` imports)."""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

from vllm_contract.recorder.settings import RUN_DIR


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


def remove_quietly(path: Path) -> None:
    """Unlink, ignoring any error (also used at exit for the worker rings)."""
    try:
        path.unlink()
    except OSError:
        pass
