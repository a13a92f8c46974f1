"""The scheduler's input log, engine side: what add_request(), finish_requests(), the draft
updates and schedule()'s arguments gave the scheduler, each placed exactly among its calls.

The hooks keep references and a few counts on the engine thread; the writer turns them into
rows (rows.Columns.add_input). A Request is not plain data (its block hasher is a function),
so its fields are taken as a tuple (`request_fields`): references to what the Request holds
unchanged after add_request(), copied only where the scheduler mutates them later.
"""

from __future__ import annotations

import inspect
from typing import Any

# Request constructor arguments with a column of their own in `added` (core/schema.py), in
# the order request_fields() returns them; the rest go to `other_json`.
COLUMNS = ("request_id", "arrival_time", "priority", "client_index", "prompt_token_ids",
           "cache_salt", "sampling_params", "pooling_params", "lora_request", "mm_features")
# Not data, or the scheduler's own: never recorded.
_SKIP = frozenset({"self", "block_hasher"})
# Constructor arguments the Request keeps elsewhere than under their own name.
_WHERE = {"reasoning_ended": ("structured_output_request", "reasoning_ended"),
          "reasoning_parser_kwargs": ("structured_output_request", "reasoning_parser_kwargs")}


def other_names() -> tuple[str, ...]:
    """The installed Request's constructor arguments without a column: read once at attach."""
    try:
        from vllm.v1.request import Request

        params = inspect.signature(Request.__init__).parameters
    except Exception:  # another vLLM's layout: the columns still record what they can
        return ()
    return tuple(p for p in params if p not in _SKIP and p not in COLUMNS)


def _read(req: Any, name: str) -> Any:
    path = _WHERE.get(name, (name,))
    value = req
    for part in path:
        value = getattr(value, part, None)
    return value


def request_fields(req: Any, others: tuple[str, ...], redacted: bool) -> tuple:
    """An add_request()'s Request as the writer needs it, on the hot path: (columns...,
    num_prompt_tokens, full prompt blocks' hashes or None, {other name: value}). The hashes
    are taken (redacted prompts only) before the request has any output: the prompt's."""
    hashes = list(getattr(req, "block_hashes", None) or ()) if redacted else None
    mm = getattr(req, "mm_features", None)
    return (req.request_id, getattr(req, "arrival_time", None), getattr(req, "priority", None),
            getattr(req, "client_index", None), getattr(req, "prompt_token_ids", None),
            getattr(req, "cache_salt", None), getattr(req, "sampling_params", None),
            getattr(req, "pooling_params", None), getattr(req, "lora_request", None),
            list(mm) if mm else None, getattr(req, "num_prompt_tokens", None), hashes,
            {name: _read(req, name) for name in others})


def draft_lists(draft_token_ids: Any) -> tuple[list, list]:
    """(req_ids, drafts) copied: the scheduler trims and pads the lists it is given."""
    return (list(draft_token_ids.req_ids),
            [list(d) if d is not None else None for d in draft_token_ids.draft_token_ids])


def status_name(status: Any) -> str:
    return getattr(status, "name", None) or str(status)
