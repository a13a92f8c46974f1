"""A KV cache group's rules, from its recorded spec: which kind of block manager vLLM gives it,
and for the kinds that free blocks while their request runs, when a block at a table position
is freed (vllm/v1/core/single_type_kv_cache_manager.py, remove_skipped_blocks)."""

from __future__ import annotations

from typing import Any, NamedTuple

# Spec class name parts, in order: the first one a name contains decides (SlidingWindowMLASpec
# is a sliding window, MLAAttentionSpec and SinkFullAttentionSpec are full attention).
_KINDS = (("Mamba", "mamba"), ("CrossAttention", "cross"), ("ChunkedLocal", "chunked_local"),
          ("SlidingWindow", "sliding_window"), ("EncoderOnly", "encoder_only"),
          ("FullAttention", "full"), ("MLAAttention", "full"))


def group_kind(spec_name: str | None) -> str:
    """full, sliding_window, chunked_local, mamba, cross, encoder_only, or other (a class this
    table does not know: its blocks are taken as held until the request ends)."""
    for part, kind in _KINDS:
        if part in (spec_name or ""):
            return kind
    return "other"


class Release(NamedTuple):
    """How many leading table positions a group has freed once its request has `c` computed
    tokens: ((max(c - offset, 0) // chunk) * chunk) // block_size. vLLM frees them in the
    request's next allocate_slots (each step it is scheduled), before it allocates new ones."""
    offset: int
    chunk: int
    block_size: int

    def freed(self, computed: int) -> int:
        return (max(computed - self.offset, 0) // self.chunk * self.chunk) // self.block_size


def release_rule(group: dict[str, Any]) -> Release | None:
    """The group's Release, or None where it holds every block until its request ends.

    - sliding window: get_num_skipped_tokens(c) = c - sliding_window + 1 - extra_retained_tokens;
    - chunked local attention: (c // attention_chunk_size) * attention_chunk_size;
    - Mamba: c - 1 (only the last state is read); in "align" mode the state block of the step
      before is freed on the same condition (MambaManager.remove_skipped_blocks).
    """
    kind = group.get("kind") or group_kind(group.get("spec"))
    bs = group.get("block_size")
    if not bs:
        return None
    if kind == "sliding_window" and group.get("sliding_window"):
        return Release(int(group["sliding_window"]) - 1
                       + int(group.get("extra_retained_tokens") or 0), 1, int(bs))
    if kind == "chunked_local" and group.get("attention_chunk_size"):
        return Release(0, int(group["attention_chunk_size"]), int(bs))
    if kind == "mamba":
        return Release(1, 1, int(bs))
    return None
