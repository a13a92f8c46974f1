"""`vllm-contract contract` (docs/contract.md): the fields of the dataclasses the trace format
depends on, in the installed vLLM, diffed against another field set (the seed excerpt, a
trace's manifest, or a saved JSON), each change classified and rated by what it breaks here."""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from vllm_contract.errors import TraceError
from vllm_contract.fields import OPAQUE, WITH_COLUMN

CLASSES = ("SchedulerOutput", "NewRequestData", "CachedRequestData", "ModelRunnerOutput",
           "Request")
# renames vLLM made, (class, old name) -> new name
RENAMES = {("CachedRequestData", "resumed_from_preemption"): "resumed_req_ids"}
_RENAMED_FROM = {(cls, new): old for (cls, old), new in RENAMES.items()}
# what a field with a column feeds here, by its class
_FEEDS = {"SchedulerOutput": ["recording", "check", "replay", "resim"],
          "NewRequestData": ["recording", "check", "replay", "resim"],
          "CachedRequestData": ["recording", "check", "replay", "resim"],
          "ModelRunnerOutput": ["recording", "check", "resim"],
          "Request": ["resim"]}
# the classes the real worker rebuilds from a trace, refusing one whose field set differs
REBUILT = ("SchedulerOutput", "NewRequestData", "CachedRequestData")
_ORDER = ("recording", "check", "replay", "resim")
# the Request arguments resim gives (replay/resim/feed.py): the others take their defaults
RESIM_REQUEST = ("request_id", "prompt_token_ids", "sampling_params", "pooling_params",
                 "arrival_time", "lora_request", "cache_salt", "priority", "mm_features",
                 "block_hasher", "client_index", "eos_token_id")


@dataclass
class FieldSet:
    """Per class, field name -> its type as written (None where the source has no types)."""
    source: str
    classes: dict[str, dict[str, str | None]]
    partial: dict[str, str] = field(default_factory=dict)  # class -> what the source lacks

    def as_dict(self) -> dict:
        return {"format": "vllm-contract fields 1", "source": self.source,
                "classes": self.classes, "partial": self.partial}


def seed_copy() -> FieldSet:
    """The seed excerpt's field set as this project read it from ../shared/seeds/ (for a
    checkout without that folder beside it): its SchedulerOutput, lines 245-279."""
    return FieldSet(
        "seed excerpt of vllm/vllm/v1/core/sched/output.py at ef9339e (the copy read into "
        "vllm_contract)",
        {"SchedulerOutput": {
            "scheduled_new_reqs": "list[NewRequestData]",
            "scheduled_cached_reqs": "CachedRequestData",
            "num_scheduled_tokens": "dict[str, int]", "total_num_scheduled_tokens": "int",
            "scheduled_spec_decode_tokens": "dict[str, list[int]]",
            "scheduled_encoder_inputs": "dict[str, list[int]]",
            "finished_req_ids": "set[str]", "free_encoder_mm_hashes": "list[str]"}},
        {"SchedulerOutput": "the excerpt ends at line 279: fields after it are not known"})


@dataclass
class Change:
    cls: str
    name: str
    kind: str  # added, removed, renamed, type changed, beyond the source
    before: str | None = None
    after: str | None = None
    breaks: list[str] = field(default_factory=list)  # recording, check, replay, resim
    why: str = ""

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def installed() -> FieldSet:
    """The installed vLLM's field sets (Request: its constructor's arguments)."""
    from vllm import __version__

    from vllm_contract.recorder.snapshot import field_types

    return FieldSet(f"vLLM {__version__} (installed)", field_types())


_SEED_LINE = re.compile(r"^(\d+)(.*)$")


def from_seed(path: Path) -> FieldSet:
    """The field sets a seed excerpt of vLLM's source shows (a numbered excerpt: `NNNclass X:`
    then `NNN    name: type`); a class is partial where the excerpt ends inside it."""
    text = path.read_text(encoding="utf-8")
    classes: dict[str, dict[str, str | None]] = {}
    partial: dict[str, str] = {}
    head = re.search(r"([\w/.]+\.py) · (\w+) · L(\d+)[–-](\d+)", text)
    cls = None
    last = None
    for line in text.splitlines():
        m = _SEED_LINE.match(line)
        if not m:
            continue
        last, body = int(m.group(1)), m.group(2)
        c = re.match(r"class (\w+)\b", body)
        if c:
            cls = c.group(1)
            classes[cls] = {}
            continue
        f = re.match(r"    (\w+): (.+?)(?: = .*)?$", body)
        if cls is not None and f and not body.strip().startswith("#"):
            classes[cls][f.group(1)] = f.group(2).strip()
    if not classes:
        raise TraceError(f"{path}: no dataclass in this excerpt (numbered lines `NNNclass X:`)")
    where = f"{head.group(1)} at {head.group(2)}" if head else str(path)
    if cls is not None:  # the excerpt ends inside its last class
        partial[cls] = f"the excerpt ends at line {last}: fields after it are not known"
    return FieldSet(f"seed excerpt of {where}", classes, partial)


def from_trace(path: Path) -> FieldSet:
    """The field sets a trace's manifest recorded: with their types and the Request's
    arguments where it has `field_types`, else the names of `fields` (an older recorder)."""
    from vllm_contract.trace import open_trace

    engines = open_trace(path).engines
    if not engines:
        raise TraceError(f"{path}: no engine in the trace")
    m = engines[0].manifest
    typed = m.get("field_types")
    if isinstance(typed, dict) and typed:
        classes = {c: dict(v) for c, v in typed.items() if isinstance(v, dict)}
        return FieldSet(f"trace {path} (vLLM {m.get('vllm_version')})", classes)
    recorded = m.get("fields")
    if not isinstance(recorded, dict) or not recorded:
        raise TraceError(f"{path}: the manifest records no field sets (an older recorder)")
    classes = {c: dict.fromkeys(v) for c, v in recorded.items() if isinstance(v, list)}
    return FieldSet(f"trace {path} (vLLM {m.get('vllm_version')})", classes)


def from_json(path: Path) -> FieldSet:
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
        classes = d["classes"]
        if not isinstance(classes, dict) or not all(isinstance(v, dict)
                                                    for v in classes.values()):
            raise ValueError("`classes` is not class -> {field: type}")
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise TraceError(f"{path}: not a field-set file ({e}); write one with "
                         "`vllm-contract contract --dump`") from None
    return FieldSet(d.get("source") or str(path), classes, d.get("partial") or {})


def load(against: str, seed_dir: Path) -> FieldSet:
    """`--against`: "seed" (the excerpt in `seed_dir`, else the copy read from it), a trace
    directory, or a JSON file."""
    if against == "seed":
        seeds = sorted(seed_dir.glob("*.txt")) if seed_dir.is_dir() else []
        return from_seed(seeds[0]) if seeds else seed_copy()
    p = Path(against)
    if p.is_dir():
        return from_trace(p)
    if p.is_file():
        return from_json(p)
    raise TraceError(f"--against {against}: no such trace directory or file")


def _breaks(cls: str, name: str) -> list[str]:
    if name in WITH_COLUMN.get(cls, ()):
        return list(_FEEDS[cls])
    if cls == "Request" and name in RESIM_REQUEST:
        return ["resim"]
    return []


def diff(before: FieldSet, after: FieldSet) -> list[Change]:
    """What changed from `before` to `after`, class by class (classes both have)."""
    out: list[Change] = []
    for cls in [c for c in CLASSES if c in before.classes and c in after.classes]:
        b, a = before.classes[cls], after.classes[cls]
        gone = [n for n in b if n not in a]
        new = [n for n in a if n not in b]
        for old in list(gone):
            # a rename either way: an older vLLM against a newer one's field set too
            to = RENAMES.get((cls, old)) or _RENAMED_FROM.get((cls, old))
            if to in new:
                gone.remove(old)
                new.remove(to)
                handled = to in WITH_COLUMN.get(cls, ())
                out.append(Change(cls, old, "renamed", old, to,
                                  [] if handled else _breaks(cls, old),
                                  "the recorder knows the new name" if handled else
                                  f"the recorder reads {old}, not {to}"))
        for n in gone:
            br = _breaks(cls, n)
            out.append(Change(cls, n, "removed", b[n], None, br,
                              "its column stays empty and what reads it sees nothing" if br
                              else "no column of ours: recorded in extra_fields until now"))
        partial = before.partial.get(cls)
        for n in new:
            if partial:
                out.append(Change(cls, n, "beyond the source", None, a[n], [], partial))
                continue
            known = n in WITH_COLUMN.get(cls, ()) or n in OPAQUE
            out.append(Change(cls, n, "added", None, a[n], [],
                              "it has a column of ours" if n in WITH_COLUMN.get(cls, ())
                              else "an opaque object: kept in extra_fields" if known
                              else "contract drift: recorded in extra_fields, no check reads "
                                   "it"))
        for n in a:
            if n in b and b[n] is not None and a[n] is not None and _norm(b[n]) != _norm(a[n]):
                br = [x for x in _breaks(cls, n) if x in ("recording", "replay", "resim")]
                out.append(Change(cls, n, "type changed", b[n], a[n], br,
                                  "its column and the rebuilt objects assume the old type" if br
                                  else "no column of ours"))
    return [_refused_by_real_worker(c) for c in out]


def _refused_by_real_worker(c: Change) -> Change:
    """A field set that differs in a class the real worker rebuilds (replay/worker/rebuild.py)
    makes it refuse the trace: what fields a SchedulerOutput must have is the installed vLLM's
    to say, and a guess would replay something vLLM never sent."""
    if c.cls not in REBUILT or c.kind not in ("added", "removed", "renamed"):
        return c
    breaks = [x for x in _ORDER if x in c.breaks or x == "replay"]
    return dataclasses.replace(c, breaks=breaks, why=f"{c.why}; the real worker refuses a trace "
                               "whose field set differs (the shadow worker replays it)")


def _norm(t: str) -> str:
    """One spelling of a type: no spaces, no module paths, Optional[X] as X|None."""
    t = re.sub(r"\s+", "", re.sub(r"\b(?:[A-Za-z_]\w*\.)+(\w+)", r"\1", t))
    m = re.fullmatch(r"Optional\[(.*)\]", t)
    return f"{m.group(1)}|None" if m else t
