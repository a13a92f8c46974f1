"""Rebuild each step's SchedulerOutput from a trace, as objects of the installed vLLM.

`rebuild(engine)` gives a `Rebuilt`: iterate it for `(step, SchedulerOutput)` in step order, one
engine at a time; `notes` lists, one line each, what could not be restored as recorded (fields
the trace lacks or the installed vLLM lacks, opaque values set to None, steps absent from the
trace, redacted prompts). Nothing is guessed: a field the trace lacks keeps the installed class's
default (or None without one), and the note says so.

The rows are read by canonical.from_trace (one reader for both: what a replay rebuilds is exactly
what the lossless test compares). Objects are built from their plain JSON (plain.to_plain's
tagged forms) by field name and the installed class's annotations; nothing is unpickled or
evaluated. vLLM is imported inside functions only: the reading side must import without it.
"""

from __future__ import annotations

import json

import dataclasses
import enum
import types
import typing
from typing import Any, Iterator

from vllm_contract.fields import WITH_COLUMN
from vllm_contract.plain import DICT_TAG, is_opaque
from vllm_contract.replay.worker import canonical
from vllm_contract.replay.worker.plan import step_ranges

# Per-request dicts of a SchedulerOutput: the trace keeps their entries, not their order.
_PER_REQUEST = ("num_scheduled_tokens", "scheduled_spec_decode_tokens",
                "scheduled_encoder_inputs", "num_invalid_spec_tokens")
_NOTHING = object()


class Notes:
    """One-line notes, each said once: the same gap in every step is one line with a count."""

    def __init__(self) -> None:
        self._by_key: dict[tuple, list] = {}

    def add(self, key: tuple, text: str, step: int | None = None) -> None:
        seen = self._by_key.get(key)
        if seen is None:
            self._by_key[key] = [text, 0 if step is None else 1, step]
        elif step is not None:
            seen[1] += 1

    def lines(self) -> list[str]:
        out = []
        for text, count, first in self._by_key.values():
            if first is not None:
                text += f" (at {count} step{'s' * (count != 1)}, first {first})"
            out.append(text)
        return out


def trace_notes(engine) -> list[str]:
    """What the trace as a whole cannot give back (vLLM-free: read from the manifest and the
    quarantine table)."""
    m = engine.manifest
    out = []
    dropped = [s for a, b in m.get("dropped_steps") or () for s in range(a, b + 1)]
    if dropped:
        out.append(f"steps absent from the trace (dropped or pruned while recording): "
                   f"{step_ranges(dropped)}; not rebuilt")
    bad = [r["step"] for r in engine.read("malformed_steps", ["step", "stage"]).to_pylist()
           if r["stage"] != "update"]
    if bad:
        out.append(f"steps quarantined as malformed (table malformed_steps): {step_ranges(bad)}; "
                   "not rebuilt")
    if m.get("redacted_prompts"):
        out.append("prompts were redacted: NewRequestData.prompt_token_ids and "
                   "prefill_token_ids are None, CachedRequestData.all_token_ids lacks them")
    if m.get("attached_mid_stream"):
        out.append("recorded from mid-stream: the worker held requests before the first step "
                   "that no rebuilt step introduces (manifest worker_state_at_start)")
    return out


def _opaque_name(plain: Any) -> str:
    return str(plain.get("__opaque__") or plain.get("__type__") or "?")


class _Opaque(Exception):
    """A value, or a part of it, that the trace holds only as a description."""


def _union_args(hint: Any) -> tuple:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return typing.get_args(hint)
    return (hint,)


def _enum_of(hint: Any) -> list[type]:
    return [h for h in _union_args(hint) if isinstance(h, type) and issubclass(h, enum.Enum)]


def _container(hint: Any) -> tuple[Any, tuple]:
    """(origin, args) of the first list-like member of a hint: list, tuple, set or frozenset."""
    for h in _union_args(hint):
        origin = typing.get_origin(h) or h
        if origin in (list, tuple, set, frozenset):
            return origin, typing.get_args(h)
    return list, ()


def _mapping(hint: Any) -> tuple[Any, Any]:
    for h in _union_args(hint):
        if (typing.get_origin(h) or h) is dict:
            args = typing.get_args(h)
            return args if len(args) == 2 else (None, None)
    return None, None


def _hints(cls: type) -> dict[str, Any]:
    """The class's field annotations as objects. vLLM names some types only under
    TYPE_CHECKING (torch, connector metadata): get_type_hints then fails, and those fields are
    read without a hint (their values are plain data or opaque anyway)."""
    try:
        return typing.get_type_hints(cls)
    except Exception:
        out: dict[str, Any] = {}
        for klass in reversed(cls.__mro__):
            for name, ann in vars(klass).get("__annotations__", {}).items():
                out[name] = None if isinstance(ann, str) else ann
        return out


class _Field(typing.NamedTuple):
    hint: Any
    default: Any  # _NOTHING: required
    init: bool


def _fields(cls: type) -> dict[str, _Field]:
    hints = _hints(cls)
    if dataclasses.is_dataclass(cls):
        out = {}
        for f in dataclasses.fields(cls):
            if f.default is not dataclasses.MISSING:
                d = lambda v=f.default: v  # noqa: E731
            elif f.default_factory is not dataclasses.MISSING:
                d = f.default_factory
            else:
                d = _NOTHING
            out[f.name] = _Field(hints.get(f.name), d, f.init)
        return out
    import msgspec

    out = {}
    for f in msgspec.structs.fields(cls):
        if f.default is not msgspec.NODEFAULT:
            d = lambda v=f.default: v  # noqa: E731
        elif f.default_factory is not msgspec.NODEFAULT:
            d = f.default_factory
        else:
            d = _NOTHING
        out[f.name] = _Field(hints.get(f.name), d, True)
    return out


def _types() -> dict[str, type]:
    """Classes a plain form's "__type__" may name: those a NewRequestData or a SchedulerOutput
    carries and every dataclass or struct their annotations reach. Any other name is opaque."""
    from vllm.lora.request import LoRARequest
    from vllm.multimodal.inputs import MultiModalFeatureSpec
    from vllm.pooling_params import PoolingParams
    from vllm.sampling_params import SamplingParams
    from vllm.v1.core.sched.output import ScheduledEncoderInputStats

    found: dict[str, type] = {}
    todo: list[Any] = [SamplingParams, PoolingParams, LoRARequest, MultiModalFeatureSpec,
                       ScheduledEncoderInputStats]
    while todo:
        t = todo.pop()
        if isinstance(t, type) and (dataclasses.is_dataclass(t)
                                    or hasattr(t, "__struct_fields__")):
            if t.__qualname__ in found:
                continue
            found[t.__qualname__] = t
            todo.extend(_hints(t).values())
        else:
            todo.extend(typing.get_args(t))
    return found


class _Decoder:
    """Plain JSON -> objects of the installed vLLM, shaped by the target's annotations."""

    def __init__(self, notes: Notes) -> None:
        self.notes = notes
        self.types = _types()
        self._fields: dict[type, dict[str, _Field]] = {}

    def fields(self, cls: type) -> dict[str, _Field]:
        if cls not in self._fields:
            self._fields[cls] = _fields(cls)
        return self._fields[cls]

    def value(self, plain: Any, hint: Any) -> Any:
        if plain is None or isinstance(plain, (bool, int, float)):
            return plain
        if isinstance(plain, str):
            for e in _enum_of(hint):
                cls_name, _, member = plain.partition(".")
                if cls_name == e.__name__ and member in e.__members__:
                    return e[member]
            return plain
        if isinstance(plain, list):
            origin, args = _container(hint)
            if origin is tuple:
                hints = [args[0]] * len(plain) if len(args) == 2 and args[1] is ... else (
                    list(args) + [None] * len(plain))
                return tuple(self.value(v, h) for v, h in zip(plain, hints))
            items = [self.value(v, args[0] if args else None) for v in plain]
            return origin(items) if origin in (set, frozenset) else items
        if is_opaque(plain):
            raise _Opaque(_opaque_name(plain))
        if "__type__" in plain:
            cls = self.types.get(plain["__type__"])
            if cls is None:  # a connector's metadata, say: its class is not ours to pick
                raise _Opaque(plain["__type__"])
            return self.build(cls, {k: v for k, v in plain.items() if k != "__type__"})
        if set(plain) == {"__bytes__"}:
            return bytes.fromhex(plain["__bytes__"])
        kh, vh = _mapping(hint)
        if len(plain) == 1 and DICT_TAG in plain:
            return {tuple(k) if isinstance(k, list) else self.value(k, kh): self.value(v, vh)
                    for k, v in plain[DICT_TAG]}
        return {k: self.value(v, vh) for k, v in plain.items()}

    def build(self, cls: type, values: dict, step: int | None = None,
              absent: dict[str, Any] | None = None, ready: dict | None = None) -> Any:
        """An instance of cls from recorded field values. A field recorded that cls lacks is
        left out; one cls has that was not recorded keeps its default; both are noted. `absent`:
        fields the trace recorded but left out because they were None or empty (extra_fields):
        their value, without a note. `ready`: fields already built."""
        fields = self.fields(cls)
        name = cls.__qualname__
        kw: dict[str, Any] = dict(ready or {})
        for f, v in values.items():
            if f not in fields:
                self.notes.add((name, f, "lacks"), f"{name}.{f}: in the trace, but the "
                               "installed vLLM's class lacks it: left out")
                continue
            try:
                kw[f] = self.value(v, fields[f].hint)
            except _Opaque as o:
                self.notes.add((name, f, "opaque"), f"{name}.{f}: opaque in the trace "
                               f"({o}): set to None", step)
                kw[f] = None
        for f, spec in fields.items():
            if f in kw:
                continue
            if absent is not None and f in absent:
                kw[f] = absent[f]
            elif spec.default is _NOTHING:
                self.notes.add((name, f, "missing"), f"{name}.{f}: not in the trace and "
                               "required by the installed vLLM: set to None")
                kw[f] = None
            else:
                kw[f] = spec.default()
                self.notes.add((name, f, "missing"), f"{name}.{f}: not in the trace: left at "
                               f"the installed default ({kw[f]!r})")
        return _construct(cls, kw, fields)


def _construct(cls: type, kw: dict, fields: dict[str, _Field]) -> Any:
    """The object with exactly these field values. The contract dataclasses are built by their
    constructor; parameter objects (SamplingParams, ...) are set field by field, because their
    __post_init__ derives fields from others and would overwrite what was recorded (and may
    reject a state the engine itself produced, e.g. a structured-output backend already set)."""
    if cls.__module__ == "vllm.v1.core.sched.output":
        obj = cls(**{k: v for k, v in kw.items() if fields[k].init})
        for k, v in kw.items():
            if not fields[k].init:
                object.__setattr__(obj, k, v)
        return obj
    obj = cls.__new__(cls)
    if dataclasses.is_dataclass(cls):
        for k, v in kw.items():
            object.__setattr__(obj, k, v)  # frozen ones too (PlaceholderRange)
    else:
        import msgspec

        for k, v in kw.items():
            msgspec.structs.force_setattr(obj, k, v)
    return obj


def _absent_extras(cls: type, recorded: list[str], fields: dict[str, _Field]) -> dict:
    """Fields kept in extra_fields that a step lacks: the recorder skips None and empty
    containers. The installed default where it is one of those, else None."""
    out = {}
    for f in recorded:
        if f in WITH_COLUMN[cls.__name__] or f not in fields:
            continue
        d = fields[f].default
        v = None if d is _NOTHING else d()
        out[f] = v if v is None or (isinstance(v, (list, dict, set, tuple)) and not v) else None
    return out


def _ordered(d: dict | None, first: list[str]) -> dict | None:
    """vLLM fills per-request dicts with the cached requests first, then the new ones; the
    trace keeps entries, not order, so this order is restored (a worker may iterate them)."""
    if not d:
        return d
    rank = {rid: i for i, rid in enumerate(first)}
    return dict(sorted(d.items(), key=lambda kv: rank.get(kv[0], len(rank))))


class Rebuilt:
    """The rebuilt SchedulerOutputs of one engine. Iterating reads the trace anew each time.
    `notes` holds the trace-wide and field-set notes from the start; notes about values (an
    opaque field, a parameter object's fields) are added as the steps they concern are built,
    so the list is complete once iterated."""

    def __init__(self, engine) -> None:
        import vllm
        from vllm.v1.core.sched.output import (CachedRequestData, NewRequestData,
                                               SchedulerOutput)

        self.engine = engine
        self.classes = {"SchedulerOutput": SchedulerOutput, "NewRequestData": NewRequestData,
                        "CachedRequestData": CachedRequestData}
        self._notes = Notes()
        self._head = trace_notes(engine)
        self._decoder = _Decoder(self._notes)
        m = engine.manifest
        ver, here = m.get("vllm_version"), getattr(vllm, "__version__", "?")
        self.installed_version = here
        listed = m.get("fields") or {}
        self.recorded: dict[str, list[str]] = {}
        self.drift: list[str] = []  # field-set differences between the trace's vLLM and ours
        for name, cls in self.classes.items():
            installed = self._decoder.fields(cls)
            if name not in listed:
                self._head.append(f"the manifest lists no fields of {name}: its columns are "
                                  "taken as the fields recorded")
            rec = list(listed.get(name) or WITH_COLUMN[name])
            self.recorded[name] = rec
            lacks = [f for f in rec if f not in installed]
            if lacks:
                self.drift.append(f"{name} lacks {', '.join(lacks)}")
                self._head.append(f"{name}: recorded by vLLM {ver} with field(s) "
                                  f"{', '.join(lacks)} that the installed vLLM {here} lacks: "
                                  "left out")
            missing = [f for f in installed if f not in rec]
            for f in missing:  # said once here, not again per object
                self._notes.add((name, f, "missing"), "")
            if missing:
                self.drift.append(f"{name} adds {', '.join(missing)}")
                self._head.append(f"{name}: the installed vLLM {here} has field(s) "
                                  f"{', '.join(missing)} that the trace (vLLM {ver}) lacks: "
                                  "left at their defaults (None where required)")
            for f in lacks:
                self._notes.add((name, f, "lacks"), "")
        self._absent = {n: _absent_extras(c, self.recorded[n], self._decoder.fields(c))
                        for n, c in self.classes.items()}

    @property
    def notes(self) -> list[str]:
        return self._head + [n for n in self._notes.lines() if n]

    def message(self) -> str | None:
        """Every note in one message, or None when the rebuild is exact."""
        notes = self.notes
        return None if not notes else "rebuilt with gaps: " + "; ".join(notes)

    def decode(self, text: str | None) -> Any:
        """An object of the installed vLLM from a plain-data JSON column (sampling parameters,
        a LoRA request, multimodal features); an opaque value is None, with a note."""
        if text is None:
            return None
        try:
            return self._decoder.value(json.loads(text), None)
        except _Opaque as o:
            self._notes.add(("decode", str(o), "opaque"), f"{o}: opaque in the trace: set to "
                            "None")
            return None

    def _values(self, name: str, plain: dict) -> dict:
        rec = self.recorded[name]
        extra = plain.get("extra") or {}
        out = {f: plain[f] for f in rec if f in plain and f != "extra"}
        out.update({f: v for f, v in extra.items() if f in rec or f not in WITH_COLUMN[name]})
        return out

    def _build(self, name: str, values: dict, step: int, ready: dict | None = None) -> Any:
        return self._decoder.build(self.classes[name], values, step, self._absent[name], ready)

    def build_step(self, step: int, plain: dict) -> Any:
        """One SchedulerOutput from its canonical plain form (canonical.from_trace's)."""
        new = []
        for r in plain["scheduled_new_reqs"]:
            values = self._values("NewRequestData", r)
            if "mm_features" in values and values["mm_features"] is None:
                values["mm_features"] = []  # stored as NULL when empty
            new.append(self._build("NewRequestData", values, step))
        cached = self._build("CachedRequestData",
                             self._values("CachedRequestData", plain["scheduled_cached_reqs"]),
                             step)
        values = self._values("SchedulerOutput", plain)
        order = list(plain["scheduled_cached_reqs"]["req_ids"]) + [
            r["req_id"] for r in plain["scheduled_new_reqs"]]
        for f in _PER_REQUEST:
            if f in values:
                values[f] = _ordered(values[f], order)
        ready = {"scheduled_new_reqs": new, "scheduled_cached_reqs": cached}
        return self._build("SchedulerOutput", {k: v for k, v in values.items() if k not in ready},
                           step, ready)

    def __iter__(self) -> Iterator[tuple[int, Any]]:
        for step, plain in canonical.from_trace(self.engine):
            yield step, self.build_step(step, plain)


def rebuild(engine) -> Rebuilt:
    """Each step's SchedulerOutput of one engine's trace (an EngineTrace), for the installed
    vLLM; see Rebuilt."""
    return Rebuilt(engine)
