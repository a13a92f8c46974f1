"""Pickled opaque payloads: recorded only with the writer's pickle_opaque=True, and readable only
with a second, explicit opt-in here. Unpickling runs code from the trace: only for traces you
made yourself."""

from __future__ import annotations

import pickle
from typing import Any

from vllm_contract.errors import TraceError


def load_pickled(row: dict, allow_pickle: bool = False) -> Any:
    """The original object of an extra_fields row. Refuses unless allow_pickle=True."""
    blob = row.get("pickled")
    if blob is None:
        raise TraceError(f"{row.get('owner')}.{row.get('field')} at step {row.get('step')}: no "
                         "pickled payload (record with pickle_opaque=True to keep one)")
    if not allow_pickle:
        raise TraceError("refusing to unpickle a trace payload: unpickling runs code from the "
                         "trace; pass allow_pickle=True only for traces you trust")
    return pickle.loads(blob)
