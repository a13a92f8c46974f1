"""The hot path: what the recorder takes from a SchedulerOutput inside schedule().

It must be cheap next to schedule() itself, inside which it runs, and it must be a
true snapshot: an in-process worker later extends NewRequestData.block_ids and a resumed request's
block table in place, and update_draft_token_ids_in_output() extends spec token lists in place.
So containers that anyone may mutate later are copied; lists the scheduler builds fresh each step
and never touches again are kept by reference. Conversion to Arrow happens in the writer thread.
"""

from __future__ import annotations

import dataclasses
import pickle
import re
import struct
from array import array
from itertools import chain, compress, repeat
from operator import is_not
from typing import Any, NamedTuple, TypedDict

from vllm_contract.fields import OPAQUE, WITH_COLUMN
from vllm_contract.plain import opaque, to_plain, type_name
from vllm_contract.recorder.columns import pack_ints

def field_names(obj_or_cls: Any) -> list[str]:
    return [f.name for f in dataclasses.fields(obj_or_cls)]


def field_types() -> dict[str, dict[str, str | None]]:
    """The installed vLLM's contract classes, field -> its type as the source writes it (the
    Request: its constructor's arguments, None where unannotated): what `vllm-contract
    contract` diffs, read once at attach time into the manifest."""
    import inspect

    from vllm.v1.core.sched import output
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import Request

    classes = {}
    for name, cls in (("SchedulerOutput", output.SchedulerOutput),
                      ("NewRequestData", output.NewRequestData),
                      ("CachedRequestData", output.CachedRequestData),
                      ("ModelRunnerOutput", ModelRunnerOutput)):
        classes[name] = {f.name: _type(f.type) for f in dataclasses.fields(cls)}
    params = inspect.signature(Request.__init__).parameters
    classes["Request"] = {n: (None if p.annotation is inspect.Parameter.empty
                              else _type(p.annotation)) for n, p in params.items()
                          if n != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
    return classes


def _type(t: Any) -> str:
    """An annotation as its source writes it: `list[NewRequestData]`, `int | None`."""
    if isinstance(t, str):
        return t
    text = t.__name__ if isinstance(t, type) else str(t)
    return re.sub(r"\b(?:[A-Za-z_]\w*\.)+(\w+)", r"\1", text)  # without module paths


class Fields:
    """Field lists of the installed dataclasses, read once at attach time."""

    def __init__(self, pickle_opaque: bool = False) -> None:
        from vllm.v1.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput
        from vllm.v1.outputs import ModelRunnerOutput

        self.all = {
            "SchedulerOutput": field_names(SchedulerOutput),
            "NewRequestData": field_names(NewRequestData),
            "CachedRequestData": field_names(CachedRequestData),
            "ModelRunnerOutput": field_names(ModelRunnerOutput),
        }
        self.extra = {k: [f for f in v if f not in WITH_COLUMN[k]] for k, v in self.all.items()}
        self.drift = {k: [f for f in v if f not in OPAQUE] for k, v in self.extra.items()}
        self.missing = {k: sorted(set(WITH_COLUMN[k]) - set(v)) for k, v in self.all.items()}
        self.pickle_opaque = pickle_opaque

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in ("all", "extra", "drift", "missing", "pickle_opaque")}

    @classmethod
    def from_dict(cls, d: dict) -> "Fields":
        """The writer process's copy (it does not import vLLM)."""
        f = cls.__new__(cls)
        f.__dict__.update(d)
        return f


def _extras(obj: Any, names: list[str], pickle_opaque: bool = False) -> list[tuple]:
    """(field, type name, size, plain form, pickled bytes or None) of each field without a column.
    Converted here, not later: these objects are outside our knowledge, so we cannot know whether
    someone mutates them after schedule() returns. They are None almost always."""
    out = []
    for name in names:
        value = getattr(obj, name, None)
        if value is None or (isinstance(value, (dict, list, set, tuple)) and not value):
            continue
        blob = None
        if pickle_opaque:
            try:
                blob = pickle.dumps(value)
            except Exception:  # unpicklable (a callable, a lock): described only
                blob = None
        out.append((name, type_name(value), opaque(value)["size"], to_plain(value), blob))
    return out or ()


def _ints(values, typecode: str = "q"):
    """A list of ints as an array: copied in C, and no Python object for the GC to walk while
    it waits in the queue (held lists of ints made the engine's collections several times
    slower). Anything that is not a plain int list is kept as it is: a plain copy."""
    if values is None:
        return None
    try:
        return array(typecode, pack_ints(values, typecode))
    except (struct.error, TypeError, OverflowError):
        return list(values)


def _blocks(block_ids):
    return None if block_ids is None else tuple(map(list, block_ids))


# Shared empty values: a snapshot waits in the queue for up to a flush interval, and every
# container it holds counts towards the engine's next garbage collection (and is walked by it).
_NO_IDS = frozenset()
_NO_ITEMS: dict = {}  # never mutated: the writer only reads snapshots


class NewRequest(TypedDict):
    """One NewRequestData as the writer needs it. A dict literal, not a class of ours: the
    engine thread builds one per new request, and a literal is the cheapest thing to build."""
    req: Any  # the NewRequestData: sampling params & co are immutable once the request exists
    block_ids: tuple | None  # copied: the scheduler's lists may change before the writer runs
    extra: list[tuple]  # _extras() of the NewRequestData


class Scheduled(NamedTuple):
    """One SchedulerOutput as the writer needs it (see rows.Columns.add_schedule)."""
    new: list[NewRequest] | tuple
    req_ids: tuple  # CachedRequestData's columns from here to num_output_tokens
    resumed: Any
    new_token_ids: list
    all_token_ids: dict
    new_block_ids: tuple  # sparse: (length, rows that are not None, their entries)
    num_computed_tokens: Any
    num_output_tokens: Any
    num_scheduled_tokens: dict
    total: int
    spec: dict
    encoder: dict
    invalid: dict | None
    finished: tuple
    preempted: tuple | None
    freed_mm: tuple
    prefix_blocks: tuple
    zero_blocks: tuple | None
    structured: bool | None  # scalars newer than the core: None where vLLM lacks them
    pending_structured: Any
    sync_kv_loads: bool | None
    spec_to_schedule: int | None
    extra: Any  # _extras() of the SchedulerOutput and of its CachedRequestData
    cached_extra: Any


def scheduler_output(so: Any, fields: Fields) -> Scheduled:
    new: list[NewRequest] = [
        {
            "req": r,
            "block_ids": _blocks(r.block_ids),
            "extra": _extras(r, fields.extra["NewRequestData"], fields.pickle_opaque),
        }
        for r in so.scheduled_new_reqs
    ] if so.scheduled_new_reqs else ()
    cr = so.scheduled_cached_reqs
    # Fields newer than the SchedulerOutput core are read with a default: a vLLM without them
    # records their absence in the manifest (missing_fields), not a recorder crash.
    resumed = getattr(cr, "resumed_req_ids", None) or _NO_IDS
    # Sparse: (length, rows that are not None, their entries). In a decode step a few requests
    # of hundreds get a new block; a copied list of them all, held until the writer's flush,
    # was most of what the engine's collections walked.
    nbi = cr.new_block_ids
    where = list(compress(range(len(nbi)), map(is_not, nbi, repeat(None))))
    blocks = [nbi[i] for i in where]
    if resumed:  # a resumed request's whole block table: copied, the worker extends it
        req_ids = cr.req_ids
        for j, i in enumerate(where):
            if i < len(req_ids) and req_ids[i] in resumed:
                blocks[j] = _blocks(blocks[j])
    new_block_ids = (len(nbi), where, blocks)
    spec = so.scheduled_spec_decode_tokens
    enc = so.scheduled_encoder_inputs
    invalid = getattr(so, "num_invalid_spec_tokens", None)
    preempted = getattr(so, "preempted_req_ids", None)
    zero = getattr(so, "new_block_ids_to_zero", None)
    return Scheduled(
        new=new,
        # Tuples of strs: the GC stops walking them after one collection; a held list of 256
        # ids is walked by every collection until the writer lets it go.
        req_ids=tuple(cr.req_ids),
        resumed=resumed,
        new_token_ids=cr.new_token_ids,
        all_token_ids=getattr(cr, "all_token_ids", None) or _NO_ITEMS,
        new_block_ids=new_block_ids,
        num_computed_tokens=_ints(cr.num_computed_tokens),
        num_output_tokens=_ints(cr.num_output_tokens),
        num_scheduled_tokens=dict(so.num_scheduled_tokens),
        total=so.total_num_scheduled_tokens,
        spec={k: list(v) for k, v in spec.items()} if spec else _NO_ITEMS,
        encoder={k: list(v) for k, v in enc.items()} if enc else _NO_ITEMS,
        invalid=None if invalid is None else dict(invalid),
        finished=tuple(so.finished_req_ids),  # () when empty allocates nothing
        preempted=None if preempted is None else tuple(preempted),
        freed_mm=tuple(so.free_encoder_mm_hashes),
        prefix_blocks=tuple(getattr(so, "num_common_prefix_blocks", ())),
        zero_blocks=None if zero is None else tuple(zero),
        structured=getattr(so, "has_structured_output_requests", None),
        pending_structured=getattr(so, "pending_structured_output_tokens", None),
        sync_kv_loads=getattr(so, "has_sync_kv_loads", None),
        spec_to_schedule=getattr(so, "num_spec_tokens_to_schedule", None),
        extra=_extras(so, fields.extra["SchedulerOutput"], fields.pickle_opaque),
        cached_extra=_extras(cr, fields.extra["CachedRequestData"], fields.pickle_opaque),
    )


def plain_form(obj: Any, depth: int = 0) -> Any:
    """to_plain() of a malformed output, field by field: a missing attribute or a field that
    cannot be converted is named, never a reason to lose the rest."""
    if not dataclasses.is_dataclass(obj) or depth > 2:
        try:
            return to_plain(obj)
        except Exception as e:
            return {"__unencodable__": f"{type(e).__name__}: {e}"}
    out = {"__type__": type_name(obj)}
    for f in dataclasses.fields(obj):
        if not hasattr(obj, f.name):
            out[f.name] = {"__missing__": True}
        else:
            out[f.name] = plain_form(getattr(obj, f.name), depth + 1)
    return out


def model_output(mro: Any, fields: Fields) -> dict:
    # Taken before update_from_output() runs: it trims (del lst[n:]) a sampled list that runs past
    # a stop (spec decode).
    # Flattened here (one array of ints, one of lengths): keeping the step's per-request lists
    # alive until the writer runs would promote them into the GC's older generations, and full
    # collections over a busy engine's heap cost more than the whole recorder.
    sampled = mro.sampled_token_ids
    return {
        "req_ids": tuple(mro.req_ids),
        "sampled": (_ints(list(chain.from_iterable(sampled))), _ints(list(map(len, sampled)), "i")),
        "nans": dict(mro.num_nans_in_logits) if mro.num_nans_in_logits else None,
        # By reference: the model runner sends a fresh copy each step, and a dict of strs and
        # ints is not tracked by the GC. Compared with req_ids in the writer (rows.add_update).
        "index": getattr(mro, "req_id_to_index", None),
        "extra": _extras(mro, fields.extra["ModelRunnerOutput"], fields.pickle_opaque),
    }
