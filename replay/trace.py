"""Kept at its documented path: the reader lives in `vllm_contract.trace` (core, pyarrow only)."""

from vllm_contract.trace import EngineTrace, Trace, open_trace, read_segment  # noqa: F401
