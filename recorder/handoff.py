"""Queue items as bytes, from the engine process to its writer process (writer_proc.py).

The engine side pickles each item with `pickle`'s C pickler: a deep copy at C speed, taken where
the snapshot must be taken (inside schedule(), before update_from_output()), of the
SchedulerOutput or ModelRunnerOutput itself, in less time than the snapshot and its own
encoding together (bench/RESULTS.md). The queue's records (records.py) cross as plain tuples,
their kind's number first. Objects that are not plain Python data never cross as themselves,
so the writer process needs no vLLM (and cannot run code from the bytes): a reducer hook turns
each into what `plain.to_plain()` would make of it —
- a dataclass or msgspec struct (NewRequestData, SamplingParams, ...) into a `plain.Stub` with
  its fields;
- an enum into its "Class.NAME" string; a subclass of int, float, str, list, tuple, dict, set or
  bytes into the plain type's value;
- anything else (tensors, handles, callables) into a `plain.Opaque` description.
The other side unpickles with an allow-list of exactly those constructors, so that nothing else
can be named by the bytes. These bytes live for milliseconds between two processes of one
recording and never reach a trace; a trace holds Arrow and JSON only.
"""

from __future__ import annotations

import dataclasses
import enum
import io
import pickle
from array import _array_reconstructor, array
from typing import Any

from vllm_contract.plain import Opaque, Stub, byte_size, opaque
from vllm_contract.recorder.records import RING_RECORDS

# Fields the trace does not keep and the writer process does not read: not worth a copy.
# (ModelRunnerOutput.req_id_to_index is a 256-entry dict per step at 256 requests.)
_NOT_SENT = {"ModelRunnerOutput": frozenset({"req_id_to_index"})}
_PLAIN_BASES = (int, float, str, bytes, tuple, list, dict, set, frozenset)
_NATIVE = object()  # pickled as it is (array.array)


def _classify(t: type) -> Any:
    """How an instance of type t crosses, in the order to_plain() tests its cases."""
    if t is array:
        return _NATIVE
    for base in (int, float, str):  # an IntEnum is an int to to_plain()
        if issubclass(t, base):
            return base
    for base in (list, tuple):
        if issubclass(t, base):
            return base
    for base in (set, frozenset):
        if issubclass(t, base):
            return set
    if issubclass(t, dict):
        return dict
    if issubclass(t, enum.Enum):
        return enum.Enum
    if issubclass(t, bytes):
        return bytes
    if dataclasses.is_dataclass(t):
        skip = _NOT_SENT.get(t.__qualname__, ())
        return tuple(f.name for f in dataclasses.fields(t) if f.name not in skip)
    struct_fields = getattr(t, "__struct_fields__", None)
    if struct_fields is not None:
        return tuple(struct_fields)
    return Opaque


_ALLOWED = {
    ("vllm_contract.plain", "Stub"): Stub,
    ("vllm_contract.plain", "Opaque"): Opaque,
    ("array", "_array_reconstructor"): _array_reconstructor,
    ("array", "array"): array,
    **{("builtins", t.__name__): t for t in _PLAIN_BASES},
}
_GLOBALS = frozenset(_ALLOWED.values())
_BUILTIN_FUNCTION = type(len)


class _Pickler(pickle.Pickler):
    def __init__(self, file) -> None:
        super().__init__(file, protocol=5)
        self.kinds: dict[type, Any] = {}

    def reducer_override(self, obj: Any) -> Any:
        t = type(obj)
        kind = self.kinds.get(t)
        if kind is None:
            kind = self.kinds[t] = _classify(t)
        if kind is _NATIVE:
            return NotImplemented
        if type(kind) is tuple:  # field names of a dataclass or struct
            return Stub, (t.__qualname__, f"{t.__module__}.{t.__qualname__}", byte_size(obj),
                          {name: getattr(obj, name, None) for name in kind})
        if kind is Opaque:
            if (t is type or t is _BUILTIN_FUNCTION) and obj in _GLOBALS:
                return NotImplemented  # what the reductions here name: pickled by name
            return Opaque, (opaque(obj),)
        if kind is enum.Enum:
            return str, (f"{t.__name__}.{obj.name}",)
        if kind is str:
            return str, (str.__str__(obj),)
        return kind, (kind(obj),)


class Encoder:
    """One per engine: reuses its pickler and buffer, which a new pair per item would pay
    for on every item."""

    def __init__(self) -> None:
        self._buf = io.BytesIO()
        self._pickler = _Pickler(self._buf)
        # No memo: faster on a step (no table of every object seen). Shared
        # objects are then written once per reference, and a cycle is refused (ValueError),
        # which the recorder treats like any other failure.
        self._pickler.fast = True

    def encode(self, item: Any) -> bytes:
        buf = self._buf
        buf.seek(0)
        buf.truncate()
        self._pickler.dump(item)
        return buf.getvalue()

    def encode_record(self, record: tuple) -> bytes:
        """A queue record (records.py) in its form on the ring: a plain tuple, its kind's
        number first. A record pickled by its class name would cost the engine a reducer
        call and a reduction on every item (bench/RESULTS.md)."""
        return self.encode((_KIND[type(record)],) + record)


# A record's kind on the ring: its place in RING_RECORDS (both ends import the same file).
_KIND = {r: i for i, r in enumerate(RING_RECORDS)}


def encode_control(record: tuple) -> bytes:
    """A control record: the standard pickler, independent of an Encoder's state, which may be
    what just failed."""
    return pickle.dumps((_KIND[type(record)],) + record, protocol=5)


def decode_record(data: bytes) -> tuple:
    """The record encode_record() or encode_control() sent."""
    kind, *fields = decode(data)
    return RING_RECORDS[kind]._make(fields)


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in _ALLOWED:
            raise pickle.UnpicklingError(f"{module}.{name} is not allowed in a recorder item")
        return _ALLOWED[module, name]


def decode(data: bytes) -> Any:
    return _Unpickler(io.BytesIO(data)).load()
