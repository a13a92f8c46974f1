"""Plain-data form of arbitrary vLLM objects: JSON-safe, never executable, lossless where the
value is plain data, and a described stub (type, size, shape) where it is not.

Both sides use it: the recorder to store objects without a column of their own, the replay side to
compare a live SchedulerOutput with what a trace holds.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import sys
from typing import Any

MAX_DEPTH = 8
# Exact types that to_plain() returns unchanged: tested before the call, not inside it. The
# recorder converts every new request's SamplingParams (dozens of fields) in the writer thread,
# and call overhead was most of it.
_SCALARS = frozenset({type(None), bool, int, float, str})


class Stub:
    """A vLLM dataclass or msgspec struct as it reaches the writer process: its fields as
    attributes, and its type's names. The writer process never imports vLLM (a slow and large
    import), so the engine sends these in place of the objects (recorder/handoff.py);
    to_plain() gives a Stub exactly the plain form it gives the object it stands for."""

    # The type's names live in a slot, outside __dict__: a field may be called anything.
    __slots__ = ("_vc_type", "__dict__")

    def __init__(self, qualname: str, type_name: str, size: int, fields: dict) -> None:
        self.__dict__.update(fields)
        self._vc_type = (qualname, type_name, size)


class Opaque:
    """An object that is not plain data (a tensor, a handle) as it reaches the writer process:
    only the description opaque() made of it on the engine side."""

    def __init__(self, described: dict) -> None:
        self.described = described

    @property
    def shape(self):  # rows.py reads a prompt_embeds tensor's length from it
        return self.described.get("shape")


def type_name(value: Any) -> str:
    t = type(value)
    if t is Stub:
        return value._vc_type[1]
    if t is Opaque:
        return value.described["__opaque__"]
    return f"{t.__module__}.{t.__qualname__}"


def byte_size(value: Any) -> int:
    nbytes = getattr(value, "nbytes", None)
    if isinstance(nbytes, int):
        return nbytes
    try:
        return sys.getsizeof(value)
    except TypeError:
        return 0


def opaque(value: Any) -> dict:
    """A description of a value that is not plain data (tensor, callable, handle)."""
    if type(value) is Opaque:
        return dict(value.described)
    out: dict[str, Any]
    if type(value) is Stub:  # as opaque() described the object it stands for
        out = {"__opaque__": value._vc_type[1], "size": value._vc_type[2]}
    else:
        out = {"__opaque__": type_name(value), "size": byte_size(value)}
    shape = getattr(value, "shape", None)
    if shape is not None:
        try:
            out["shape"] = [int(s) for s in shape]
            out["dtype"] = str(getattr(value, "dtype", ""))
        except (TypeError, ValueError):  # a class whose `shape` is a property, say
            pass
    return out


def is_opaque(plain: Any) -> bool:
    return isinstance(plain, dict) and "__opaque__" in plain


def _order(v: Any) -> tuple:
    """Numbers in numeric order, strings in string order, anything else by its JSON text."""
    if isinstance(v, bool) or not isinstance(v, (int, float, str)):
        return (2, json.dumps(v, sort_keys=True))
    return (0, v, "") if isinstance(v, (int, float)) else (1, v)


# A dict with a key that is not a str (logit_bias: token id -> bias) as JSON, whose object keys
# are strings: its items as [key, value] pairs, so that loads() gives back the keys' types.
DICT_TAG = "__dict__"


def _keyed(value: dict, d: int) -> Any:
    items = []
    for k, v in value.items():
        # a str subclass (a str-mixin enum) keeps str()'s spelling, as before tagging existed
        items.append((str(k) if isinstance(k, str) else to_plain(k, d), to_plain(v, d)))
    if all(type(k) is str for k, _ in items) and not (len(items) == 1 and items[0][0] == DICT_TAG):
        return dict(items)  # enum keys, say: strings once converted, an object as before
    # sorted: the JSON text of a dict must not depend on its insertion order
    return {DICT_TAG: [[k, v] for k, v in sorted(items, key=lambda kv: _order(kv[0]))]}


def to_plain(value: Any, depth: int = 0) -> Any:
    """Convert to JSON-safe plain data. Sets become sorted lists, tuples lists, enums
    "Class.NAME", dataclasses and msgspec structs dicts tagged with "__type__", dicts with a key
    that is not a str {"__dict__": [[key, value], ...]} (see loads()); anything else opaque."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if depth > MAX_DEPTH:
        return opaque(value)
    d = depth + 1
    if isinstance(value, (list, tuple)):
        return [v if type(v) in _SCALARS else to_plain(v, d) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted((to_plain(v, d) for v in value), key=_order)
    if isinstance(value, dict):
        # str keys (nearly every dict) take one pass; a single key that reads as the tag would be
        # decoded by loads(), so that dict is tagged too
        if all(type(k) is str for k in value) and not (len(value) == 1 and DICT_TAG in value):
            return {k: v if type(v) in _SCALARS else to_plain(v, d) for k, v in value.items()}
        return _keyed(value, d)
    if type(value) is Stub:
        out = {"__type__": value._vc_type[0]}
        for name, v in value.__dict__.items():  # in the dataclass's field order
            out[name] = v if type(v) in _SCALARS else to_plain(v, d)
        return out
    if type(value) is Opaque:
        return dict(value.described)
    if isinstance(value, enum.Enum):
        return f"{type(value).__name__}.{value.name}"
    if isinstance(value, bytes):
        return {"__bytes__": value.hex()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out = {"__type__": type(value).__qualname__}
        for f in dataclasses.fields(value):
            out[f.name] = to_plain(getattr(value, f.name), d)
        return out
    struct_fields = getattr(type(value), "__struct_fields__", None)  # msgspec.Struct
    if struct_fields is not None:
        out = {"__type__": type(value).__qualname__}
        for name in struct_fields:
            v = getattr(value, name, None)
            out[name] = v if type(v) in _SCALARS else to_plain(v, d)
        return out
    return opaque(value)


# What json.dumps(sort_keys=True, separators=(",", ":")) builds on every call.
_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"))


def dumps(value: Any) -> str | None:
    """JSON of the plain form; None stays None (a SQL NULL)."""
    if value is None:
        return None
    return _ENCODER.encode(to_plain(value))


def _key(plain: Any) -> Any:
    """A tagged dict's key back: a list (a tuple once) as a tuple, since a key cannot be a list;
    an object (a dataclass key, say), which cannot be a key, as its JSON text."""
    if isinstance(plain, list):
        return tuple(_key(k) for k in plain)
    if isinstance(plain, dict):
        return _ENCODER.encode(to_plain(plain))
    return plain


def _untag(obj: dict) -> Any:
    if len(obj) == 1 and DICT_TAG in obj:
        pairs = obj[DICT_TAG]
        if isinstance(pairs, list) and all(isinstance(p, list) and len(p) == 2 for p in pairs):
            return {_key(k): v for k, v in pairs}
    return obj


def loads(text: str | None) -> Any:
    """The value of dumps()'s JSON, with the keys of tagged dicts as they were: for plain data
    (None, bool, int, float, str, and lists and dicts of them, dict keys of any of the scalar
    types) loads(dumps(x)) == x. JSON of older traces, whose int keys were written as strings,
    reads as it always did."""
    return None if text is None else json.loads(text, object_hook=_untag)
