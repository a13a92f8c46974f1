"""Recording settings for live engines, read from the environment.

The plugin reads them in every vLLM process; `vllm-contract record` and `attach` validate the
same names before anything starts, so a typo is a clear error at the command line rather than an
engine that silently records with settings nobody asked for (e.g. unredacted prompts).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Mapping

TRACE_DIR = "VLLM_CONTRACT_TRACE_DIR"
ARM = "VLLM_CONTRACT_ARM"
RUN_DIR = "VLLM_CONTRACT_RUN_DIR"
# Set by `vllm-contract record`: a file where the plugin notes what the command's exit should
# explain (one word a line: `main-guard`).
RECORD_NOTES = "VLLM_CONTRACT_RECORD_NOTES"

# Writer options: environment name -> (attach() keyword, parser, default)
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b)?\s*$", re.I)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"", "0", "false", "no", "off"}


class SettingsError(ValueError):
    """A setting that cannot be used; the message names it and says what is accepted."""


def parse_size(text: str, name: str = "size") -> int:
    """'1073741824', '512M', '2G', '1.5GiB' -> bytes (powers of 1024)."""
    m = _SIZE.match(str(text))
    if not m:
        raise SettingsError(f"{name}={text!r}: not a size (bytes, or a number with K, M, G or T)")
    value = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    if value <= 0:
        raise SettingsError(f"{name}={text!r}: must be more than 0")
    return value


def parse_bool(text: str, name: str) -> bool:
    t = str(text).strip().lower()
    if t in _TRUE:
        return True
    if t in _FALSE:
        return False
    raise SettingsError(f"{name}={text!r}: use 1 or 0 (also true/false, yes/no, on/off)")


def _positive_float(text: str, name: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise SettingsError(f"{name}={text!r}: not a number of seconds") from None
    if not value > 0:
        raise SettingsError(f"{name}={text!r}: must be more than 0")
    return value


def _positive_int(text: str, name: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise SettingsError(f"{name}={text!r}: not a whole number") from None
    if value <= 0:
        raise SettingsError(f"{name}={text!r}: must be more than 0")
    return value


def _on_full(text: str, name: str) -> str:
    t = str(text).strip().lower()
    if t not in ("drop", "block"):
        raise SettingsError(f"{name}={text!r}: use 'drop' (default: never block the engine) or "
                            "'block'")
    return t


OPTIONS = {
    "VLLM_CONTRACT_FLUSH_SECONDS": ("flush_seconds", _positive_float),
    "VLLM_CONTRACT_FLUSH_STEPS": ("flush_steps", _positive_int),
    "VLLM_CONTRACT_SEGMENT_BYTES": ("segment_bytes", parse_size),
    "VLLM_CONTRACT_MAX_TRACE_BYTES": ("max_trace_bytes", parse_size),
    "VLLM_CONTRACT_MAX_PENDING": ("max_pending", _positive_int),
    "VLLM_CONTRACT_MAX_PENDING_BYTES": ("max_pending_bytes", parse_size),
    "VLLM_CONTRACT_ON_FULL": ("on_full", _on_full),
    "VLLM_CONTRACT_REDACT_PROMPTS": ("redact_prompts", parse_bool),
}
ENV_OF = {kw: env for env, (kw, _) in OPTIONS.items()}

# Every environment variable of ours that a vLLM process may see. vLLM warns about any VLLM_*
# name it does not know ("Unknown vLLM environment variable detected"), which reads like a typo;
# the plugin silences that warning for these names only, so a misspelt one is still reported.
KNOWN_ENV = frozenset({TRACE_DIR, ARM, RUN_DIR, RECORD_NOTES, *OPTIONS, "VLLM_CONTRACT_WRITER",
                       "VLLM_CONTRACT_CONTROL_IDLE_SECONDS", "VLLM_CONTRACT_CACHE"})

# Live engines flush by time: once a second (flush_seconds), or every 1024 steps if an engine
# is faster than that. attach()'s 64 steps made a small, fast engine pay a flush's fixed cost
# (about 50 column conversions) every 64 steps, most of what recording cost it (bench/RESULTS.md,
# live engines). A SIGKILL still loses at most ~1 s of steps.
LIVE_DEFAULTS = {"flush_steps": 1024}


@dataclass
class Settings:
    trace_dir: str | None = None  # record from engine start into this root
    arm: bool = False  # listen for attach without recording
    writer_options: dict = field(default_factory=dict)  # attach() keywords

    @property
    def armed(self) -> bool:
        return self.arm or self.trace_dir is not None


def writer_options(values: Mapping[str, str]) -> dict:
    """Parse writer options given by environment name (or attach() keyword)."""
    out = {}
    for key, raw in values.items():
        env = ENV_OF.get(key, key)
        if env not in OPTIONS:
            raise SettingsError(f"{key}: unknown recording option")
        kw, parse = OPTIONS[env]
        out[kw] = parse(raw, env)
    return out


def from_env(environ: Mapping[str, str] | None = None) -> Settings:
    """Settings from the environment; SettingsError if any of them is unusable."""
    env = os.environ if environ is None else environ
    trace_dir = env.get(TRACE_DIR) or None
    if trace_dir is not None:  # the engine core is a child process: the same cwd, but be sure
        trace_dir = os.path.abspath(os.path.expanduser(trace_dir))
    arm = parse_bool(env.get(ARM, ""), ARM)
    opts = {**LIVE_DEFAULTS,
            **writer_options({k: env[k] for k in OPTIONS if env.get(k, "") != ""})}
    return Settings(trace_dir=trace_dir, arm=arm, writer_options=opts)


def wants_plugin(environ: Mapping[str, str] | None = None) -> bool:
    """The cheap check the plugin makes first: is anything asked of it at all?"""
    env = os.environ if environ is None else environ
    return bool(env.get(TRACE_DIR)) or env.get(ARM, "").strip().lower() not in _FALSE
