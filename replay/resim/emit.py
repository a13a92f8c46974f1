"""The standalone pytest file of a reduction (docs/reduce.md, "The pytest file"): the reduced
recording's requests, settings and tokens written out as data, and a test that drives a
scheduler built with vLLM's API over them, asserting the contract the finding names after
every step. The file imports vLLM and pytest only, so that it can be pasted into vLLM's tests."""

from __future__ import annotations

import json
import pprint
from pathlib import Path

from vllm_contract.errors import TraceError

_STOCK = "vllm.v1.core.sched.scheduler:Scheduler"
# the sampling parameters the scheduler reads (stop checks, lengths); the rest is the sampler's
_SAMPLING = ("n", "max_tokens", "min_tokens", "ignore_eos", "stop_token_ids", "temperature",
             "seed", "logprobs", "prompt_logprobs")
# set by vLLM's input processor, not by the constructor: the stop checks read them
_PRIVATE = ("_all_stop_token_ids", "_eos_token_id")
_ENGINE = ("max_model_len", "max_num_batched_tokens", "max_num_seqs", "enable_prefix_caching",
           "seed")

# each invariant a file can assert, as the body of
# `check(step, so, owed, known, tables, seen, group_tables)`:
# `owed`, the ids that finished (an update's finish or an abort) since the last schedule();
# `known`, the ids the worker holds (kept up to date by the test, as _update_states does);
# `tables`, each live request's KV blocks as the worker's block tables have them, those freed
# by this output's finished and preempted ids already dropped, and those a window group
# (sliding window, chunked local, Mamba) has freed by this step; `seen`, what earlier outputs
# and updates told the worker (the template's Seen); `group_tables`, each live request's table
# per KV cache group (KV_GROUPS), by table position, the null block (0) where vLLM put it or a
# window freed it; an assert's message ends with the invariant's why
CONTRACTS = {
    "lifecycle.unknown_cached": '''\
    unknown = set(so.scheduled_cached_reqs.req_ids) - known
    assert not unknown, (f"step {step}: {sorted(unknown)} scheduled as cached but never sent "
                         f"in scheduled_new_reqs. {WHY}")''',
    "finished.leaked": '''\
    missing = owed - set(so.finished_req_ids)
    assert not missing, (f"step {step}: {sorted(missing)} finished before this schedule() but "
                         f"is not in its finished_req_ids. {WHY}")''',
    # running requests are served before new ones, new ones in list order; a new or resumed
    # request may share the prefix its computed tokens cover (prefix-cache hits): in each KV
    # cache group the table positions before computed // the group's block size
    "blocks.double_owner": '''\
    holder = {b: rid for rid, held in tables.items() for b in held}
    c = so.scheduled_cached_reqs
    grants = [(rid, ids, c.num_computed_tokens[i] if rid in c.resumed_req_ids else 0)
              for i, (rid, ids) in enumerate(zip(c.req_ids, c.new_block_ids))]
    grants += [(r.req_id, r.block_ids, r.num_computed_tokens) for r in so.scheduled_new_reqs]
    for rid, ids, computed in grants:
        blocks = blocks_of(ids)
        fresh = [b for g, group in enumerate(ids or ())
                 for b in group[computed // KV_GROUPS[g]["block_size"]:] if b]
        for b in fresh:
            other = holder.get(b, rid)
            assert other == rid, (f"step {step}: {rid} is given block {b}, which {other} "
                                  f"still holds. {WHY}")
        holder.update((b, rid) for b in blocks if b not in holder)''',
    # the first row of a preempted id after its preemption is resumed (or new, once freed)
    "lifecycle.preempted_not_resumed": '''\
    c = so.scheduled_cached_reqs
    stale = sorted(r for r in c.req_ids if r in seen.preempted and r not in c.resumed_req_ids)
    assert not stale, (f"step {step}: {stale} scheduled as cached after its preemption, not "
                       f"in resumed_req_ids. {WHY}")''',
    "lifecycle.resumed_without_blocks": '''\
    c = so.scheduled_cached_reqs
    bare = sorted(r for r, ids in zip(c.req_ids, c.new_block_ids)
                  if r in c.resumed_req_ids and ids is None)
    assert not bare, f"step {step}: {bare} resumed with new_block_ids = None. {WHY}"''',
    # the rows an async worker rebuilds the outputs of: resumed, or out of the batch in the
    # step before, with outputs (the scheduler sends the field on every engine)
    "outputs.all_token_ids_missing": '''\
    for rid, n in seen.rebuilt(so):
        sent = so.scheduled_cached_reqs.all_token_ids.get(rid)
        assert sent is not None and len(sent) >= n, (
            f"step {step}: {rid} comes back with num_output_tokens {n} and "
            f"{'no all_token_ids' if sent is None else f'all_token_ids of {len(sent)}'}. {WHY}")''',
    "outputs.all_token_ids_mismatch": '''\
    for rid, n in seen.rebuilt(so):
        sent = so.scheduled_cached_reqs.all_token_ids.get(rid)
        if sent is not None and len(sent) >= n:
            tail, outputs = list(sent[len(sent) - n:]), seen.outputs.get(rid, [])[:n]
            assert tail == outputs, (f"step {step}: {rid}'s all_token_ids ends in {tail}, its "
                                     f"outputs are {outputs}. {WHY}")''',
    # sync: every update comes before the next schedule(), so the worker holds all outputs
    "outputs.count_below_held": '''\
    c = so.scheduled_cached_reqs
    for rid, n in zip(c.req_ids, c.num_output_tokens):
        held = len(seen.outputs.get(rid, []))
        assert n >= held, (f"step {step}: {rid} is sent num_output_tokens {n}, below the {held} "
                           f"outputs the worker holds. {WHY}")''',
    "blocks.zeroed_held": '''\
    c = so.scheduled_cached_reqs
    got = {rid: set(blocks_of(ids)) for rid, ids in zip(c.req_ids, c.new_block_ids)}
    got.update((r.req_id, set(blocks_of(r.block_ids))) for r in so.scheduled_new_reqs)
    for b in so.new_block_ids_to_zero or ():
        for rid, held in tables.items():
            assert not b or b not in held or b in got.get(rid, ()), (
                f"step {step}: block {b} is zeroed while {rid} holds it. {WHY}")''',
    "blocks.zeroed_out_of_range": '''\
    bad = [b for b in so.new_block_ids_to_zero or () if not 0 <= b < NUM_BLOCKS]
    assert not bad, (f"step {step}: block(s) {bad} to zero outside 0..{NUM_BLOCKS - 1}. "
                     f"{WHY}")''',
    "blocks.repeated_in_grant": '''\
    c = so.scheduled_cached_reqs
    grants = list(zip(c.req_ids, c.new_block_ids))
    grants += [(r.req_id, r.block_ids) for r in so.scheduled_new_reqs]
    for rid, ids in grants:
        blocks = blocks_of(ids)
        twice = sorted({b for b in blocks if blocks.count(b) > 1})
        assert not twice, f"step {step}: {rid} is given block(s) {twice} twice. {WHY}"''',
    # a new or resumed request's blocks are its whole table, a running one's are appended
    "blocks.table_too_long": '''\
    width = -(-ENGINE["max_model_len"] // BLOCK_SIZE)
    c = so.scheduled_cached_reqs
    rows = [(rid, blocks_of(ids), rid not in c.resumed_req_ids)
            for rid, ids in zip(c.req_ids, c.new_block_ids)]
    rows += [(r.req_id, blocks_of(r.block_ids), False) for r in so.scheduled_new_reqs]
    for rid, blocks, appended in rows:
        length = len(blocks) + (len(tables.get(rid, [])) if appended else 0)
        assert length <= width, (f"step {step}: {rid}'s block table of {length} blocks is past "
                                 f"the {width} that max_model_len needs. {WHY}")''',
    # the file's engine has no speculative config (a recording with one is not written)
    "spec.without_drafter": '''\
    drafted = {r: d for r, d in so.scheduled_spec_decode_tokens.items() if d}
    assert not drafted, f"step {step}: drafts {drafted} on an engine without a drafter. {WHY}"''',
    # in an attention group the table positions from the first one its window covers on are
    # read (0 in full attention), a grant's last null block is compared with it; in a Mamba
    # group a grant's last block is the state the step writes, and a new or resumed request
    # with computed tokens starts from the state at cdiv(computed, block size) - 1
    "blocks.null_needed": '''\
    c = so.scheduled_cached_reqs
    rows = [(rid, ids, c.num_computed_tokens[i], rid in c.resumed_req_ids)
            for i, (rid, ids) in enumerate(zip(c.req_ids, c.new_block_ids))]
    rows += [(r.req_id, r.block_ids, r.num_computed_tokens, True) for r in so.scheduled_new_reqs]
    for rid, ids, computed, whole in rows:
        for g, group in enumerate(KV_GROUPS):
            got = list(ids[g]) if ids is not None and g < len(ids) else []
            kind, size = group["kind"], group["block_size"]
            if not got or kind not in ("full", "sliding_window", "chunked_local", "mamba"):
                continue
            start = 0 if whole else len(group_tables.get(rid, [[]] * len(KV_GROUPS))[g])
            if 0 in got:
                pos = start + len(got) - 1 - got[::-1].index(0)
                if kind == "mamba":
                    assert got[-1] != 0, (f"step {step}: {rid}'s KV cache group {g} (mamba) has "
                                          f"the null block at table position {pos}, where the "
                                          f"step writes its state. {WHY}")
                else:
                    covered = 0  # the first position the window still reads
                    if group["release"] is not None:
                        offset, chunk = group["release"]
                        covered = (max(computed - offset, 0) // chunk * chunk) // size
                    assert pos < covered, (f"step {step}: {rid}'s KV cache group {g} ({kind}) "
                                           f"has the null block at table position {pos}, which "
                                           f"its attention reads (positions from {covered} on)."
                                           f" {WHY}")
            if kind == "mamba" and whole and computed > 0:
                read = -(-computed // size) - 1
                there = got[read] if read < len(got) else None
                assert there and got.index(there) == read, (
                    f"step {step}: {rid}'s KV cache group {g} (mamba) has "
                    f"{'no block' if there is None else 'the null block'} at table position "
                    f"{read}, the state its computed tokens left, which the step starts from. "
                    f"{WHY}")''',
}

_TEMPLATE = '''\
"""Reproducer of {invariant}: {title}

Emitted by `vllm-contract reduce` from {source}: {requests} request(s) over {steps} step(s).
It builds the scheduler with vLLM's API from the recorded settings (the model's config is read,
not its weights), adds each request at its recorded step, gives it the tokens it was recorded
producing (by output position) and checks the contract after every schedule(). It fails with
the scheduler the finding was recorded with and passes once that is fixed. Choose the scheduler
with VLLM_SCHEDULER_CLS=module:Class (default vLLM's own; the finding was recorded with
{recorded}). Needs vLLM and pytest only.
"""

import importlib
import json
import os

import torch
from vllm import SamplingParams
from vllm.engine.arg_utils import EngineArgs
from vllm.v1 import kv_cache_interface as kvi
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request, RequestStatus
from vllm.v1.structured_output import StructuredOutputManager

SCHEDULER = os.environ.get("VLLM_SCHEDULER_CLS", {stock!r})
MODEL = {model!r}
# the model's config.json as recorded: the scheduler reads the config, never the weights, so a
# folder holding only this stands in for MODEL on any machine (None: MODEL itself is read)
MODEL_CONFIG = {model_config}
ENGINE = {engine}
NUM_BLOCKS = {num_blocks}
BLOCK_SIZE = {block_size}
# the block sizes the scheduler was built with: it schedules in the first (the least common
# multiple of its groups' block sizes) and hashes prompts in blocks of the second
SCHEDULER_BLOCK_SIZE = {scheduler_block_size}
HASH_BLOCK_SIZE = {hash_block_size}
# cache_config.mamba_cache_mode as recorded (a Mamba group's "align" mode schedules block-aligned
# chunks); None: the engine config's own
MAMBA_CACHE_MODE = {mamba_cache_mode!r}
# the recorded KV cache groups: vLLM's spec of each (the scheduler's block managers follow it),
# the layers behind it, its kind and block size, and for a group that frees blocks while its
# request runs (sliding window, chunked local attention, Mamba: remove_skipped_blocks) the
# (offset, chunk) of what it frees: the table positions before
# (max(computed - offset, 0) // chunk * chunk) // block size
KV_GROUPS = {kv_groups}
STEPS = {steps}
WHY = {why!r}
# (step whose schedule() it comes before, request id, prompt token ids, sampling parameters,
# the private ones vLLM's input processor sets, the tokens it produces in order)
REQUESTS = {requests_data}
# step -> the (request id, status) aborts made before its schedule()
ABORTS = {aborts}


def model(folder):
    if MODEL_CONFIG is None:
        return MODEL
    (folder / "config.json").write_text(json.dumps(MODEL_CONFIG))
    return str(folder)


def build(folder):
    module, _, name = SCHEDULER.partition(":")
    cls = getattr(importlib.import_module(module), name)
    vc = EngineArgs(model=model(folder), block_size=BLOCK_SIZE, enforce_eager=True,
                    skip_tokenizer_init=True, **ENGINE).create_engine_config()
    vc.cache_config.num_gpu_blocks = NUM_BLOCKS
    if MAMBA_CACHE_MODE is not None:
        vc.cache_config.mamba_cache_mode = MAMBA_CACHE_MODE
    groups = [kvi.KVCacheGroupSpec([f"group{{i}}.layer{{j}}" for j in range(g["layers"])],
                                   g["spec"]) for i, g in enumerate(KV_GROUPS)]
    kv = kvi.KVCacheConfig(num_blocks=NUM_BLOCKS, kv_cache_tensors=[], kv_cache_groups=groups)
    hasher = None
    if vc.cache_config.enable_prefix_caching:
        from vllm.utils.hashing import get_hash_fn_by_name
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash

        fn = get_hash_fn_by_name(vc.cache_config.prefix_caching_hash_algo)
        init_none_hash(fn)
        hasher = get_request_block_hasher(HASH_BLOCK_SIZE, fn)
    sched = cls(vllm_config=vc, kv_cache_config=kv,
                structured_output_manager=StructuredOutputManager(vc),
                block_size=SCHEDULER_BLOCK_SIZE, hash_block_size=HASH_BLOCK_SIZE, log_stats=False)
    return sched, hasher


def request(req_id, prompt, sampling, private, arrival, hasher):
    params = SamplingParams(**sampling)
    for k, v in private.items():
        setattr(params, k, set(v) if isinstance(v, list) else v)
    return Request(request_id=req_id, prompt_token_ids=list(prompt), sampling_params=params,
                   pooling_params=None, arrival_time=arrival, block_hasher=hasher)


def blocks_of(ids):
    """The blocks of a block-id tuple (one list per KV cache group), block 0 (vLLM's null
    block) left out."""
    return [b for group in (ids or ()) for b in group if b]


def grant(so, tables):
    """The worker's block tables after `so`, one per KV cache group: a new or resumed
    request's given whole, a running one's appended to."""
    c = so.scheduled_cached_reqs
    for rid, ids in zip(c.req_ids, c.new_block_ids):
        if rid in c.resumed_req_ids:
            tables[rid] = [[] for _ in KV_GROUPS]
        row = tables.setdefault(rid, [[] for _ in KV_GROUPS])
        for g, group in enumerate(ids or ()):
            row[g].extend(group)
    for r in so.scheduled_new_reqs:
        tables[r.req_id] = [list(group) for group in r.block_ids]


def release(tables, rows):
    """The blocks a window group has freed once each (request id, computed tokens) of `rows`
    is scheduled: vLLM frees them in that schedule() (remove_skipped_blocks) and may hand them
    to another request in it. The worker's table keeps them; here the null block takes their
    place, as in vLLM's own table."""
    for rid, computed in rows:
        for g, group in enumerate(KV_GROUPS):
            if group["release"] is None or rid not in tables:
                continue
            offset, chunk = group["release"]
            table = tables[rid][g]
            n = min((max(computed - offset, 0) // chunk * chunk) // group["block_size"],
                    len(table))
            table[:n] = [0] * n


class Seen:
    """What the worker was told before this schedule(): the ids preempted and not scheduled
    since, the ids with a token count in the previous step, each request's outputs."""

    def __init__(self):
        self.preempted, self.prev, self.outputs = set(), set(), {{}}

    def rebuilt(self, so):
        """(id, num_output_tokens) of the cached rows whose outputs an async worker rebuilds
        from all_token_ids: resumed, or given no token count in the previous step."""
        c = so.scheduled_cached_reqs
        return [(rid, n) for rid, n in zip(c.req_ids, c.num_output_tokens)
                if n > 0 and (rid in c.resumed_req_ids or rid not in self.prev)]

    def after(self, so):
        back = set(so.scheduled_cached_reqs.req_ids) | {{r.req_id for r in so.scheduled_new_reqs}}
        self.preempted = (self.preempted - back - set(so.finished_req_ids)) | set(
            so.preempted_req_ids or ())
        self.prev = set(so.num_scheduled_tokens)


def check(step, so, owed, known, tables, seen, group_tables):
{contract}


def test_{name}(tmp_path):
    sched, hasher = build(tmp_path)
    tokens = {{}}
    owed, known = set(), set()  # finished since the last schedule(); held by the worker
    tables = {{}}  # request id -> its block table in each KV cache group
    seen = Seen()
    for step in range(STEPS):  # as many schedule() calls as the recording made
        for i, (at, req_id, prompt, sampling, private, produced) in enumerate(REQUESTS):
            if at == step:
                tokens[req_id] = produced
                sched.add_request(request(req_id, prompt, sampling, private, float(i), hasher))
        for req_id, status in ABORTS.get(step, []):
            if req_id in sched.requests:
                sched.finish_requests(req_id, RequestStatus[status])
                owed.add(req_id)
        so = sched.schedule()
        known -= set(so.finished_req_ids)  # the worker frees them first
        for r in set(so.finished_req_ids) | set(so.preempted_req_ids or ()):
            tables.pop(r, None)
        c = so.scheduled_cached_reqs
        computed = list(zip(c.req_ids, c.num_computed_tokens))
        release(tables, [(r, n) for r, n in computed if r not in c.resumed_req_ids])
        check(step, so, owed, known, {{r: blocks_of(t) for r, t in tables.items()}}, seen,
              tables)
        seen.after(so)
        known |= {{r.req_id for r in so.scheduled_new_reqs}}
        grant(so, tables)
        release(tables, computed + [(r.req_id, r.num_computed_tokens)
                                    for r in so.scheduled_new_reqs])
        owed = set()
        chunks = {{r: sched.requests[r].is_prefill_chunk for r in so.num_scheduled_tokens
                  if r in sched.requests}}
        req_ids, sampled = [], []
        for r in so.num_scheduled_tokens:
            if r not in chunks:
                continue
            req_ids.append(r)
            req = sched.requests[r]
            pos = req.num_output_tokens
            if chunks[r]:
                sampled.append([])
            else:
                sampled.append([tokens[r][pos] if pos < len(tokens[r]) else 0])
        out = ModelRunnerOutput(req_ids=req_ids,
                                req_id_to_index={{r: i for i, r in enumerate(req_ids)}},
                                sampled_token_ids=sampled)
        for eco in sched.update_from_output(so, out).values():
            owed |= {{o.request_id for o in eco.outputs if o.finish_reason is not None}}
            for o in eco.outputs:
                seen.outputs.setdefault(o.request_id, []).extend(o.new_token_ids)
'''


def pytest_file(reduced: Path, invariant: str, title: str, why: str, source: str,
                scheduler_cls: str | None) -> str:
    """The text of the standalone test for the reduced recording at `reduced`; TraceError
    (said in the report instead) where it cannot be written."""
    from vllm_contract.replay.resim.build import mamba_cache_mode
    from vllm_contract.replay.worker.plan import pick_engine
    from vllm_contract.trace import open_trace

    if invariant not in CONTRACTS:
        raise TraceError(f"no pytest form of {invariant} yet (written for: "
                         f"{', '.join(sorted(CONTRACTS))})")
    eng = pick_engine(open_trace(reduced), None)
    e = eng.manifest.get("engine") or {}
    if e.get("speculative"):
        raise TraceError("the pytest file builds an engine without speculative decoding; this "
                         "recording has a speculative config")
    kv_groups = _kv_groups(e)
    added = sorted(eng.read("added").to_pylist(), key=lambda r: r["seq"])
    ids = [r["req_id"] for r in added]
    if len(set(ids)) != len(ids):
        raise TraceError("the pytest file gives each request id one incarnation; an id is "
                         "reused here")
    produced: dict[str, list[tuple[int, int, list[int]]]] = {}
    for r in eng.read("model_outputs", ["step", "req_id", "pos", "sampled_token_ids"]).to_pylist():
        if r["sampled_token_ids"]:
            produced.setdefault(r["req_id"], []).append(
                (r["step"], r["pos"] or 0, list(r["sampled_token_ids"])))
    requests = []
    for r in added:
        if r["prompt_token_ids"] is None:
            raise TraceError("the recording's prompts are redacted: the pytest file needs them")
        sp = json.loads(r["sampling_params"] or "{}")
        if sp.get("structured_outputs"):
            raise TraceError("structured output requests are not written to a pytest file yet")
        sampling = {k: sp[k] for k in _SAMPLING if sp.get(k) is not None}
        private = {k: sp[k] for k in _PRIVATE if sp.get(k) is not None}
        toks = [t for _, _, ts in sorted(produced.get(r["req_id"], [])) for t in ts]
        # `step`: the schedule() calls before it, less one (the recorder's numbering)
        requests.append((int(r["step"]) + 1, r["req_id"], list(r["prompt_token_ids"]),
                         sampling, private, toks))
    aborts: dict[int, list] = {}
    for r in eng.read("inputs").to_pylist():
        if r["call"] == "finish_requests" and r["req_id"]:
            aborts.setdefault(int(r["step"]) + 1, []).append(
                (r["req_id"], r["status"] or "FINISHED_ABORTED"))
    steps = len(eng.read("steps", ["step"]))
    return _TEMPLATE.format(model_config=_model_config(e.get("model")),
        invariant=invariant, title=title, source=source, requests=len(requests), steps=steps,
        stock=_STOCK, recorded=scheduler_cls or _STOCK, model=str(e.get("model")),
        engine=pprint.pformat({k: e[k] for k in _ENGINE if e.get(k) is not None}, width=90),
        num_blocks=int(e["num_kv_blocks"]), block_size=int(e["block_size"]),
        scheduler_block_size=int(e.get("scheduler_block_size") or e["block_size"]),
        hash_block_size=int(e.get("hash_block_size") or e["block_size"]),
        mamba_cache_mode=mamba_cache_mode(e), kv_groups=kv_groups, why=" ".join(
            why.split()), requests_data=pprint.pformat(requests, width=96, compact=True),
        aborts=pprint.pformat(aborts, width=96), contract=CONTRACTS[invariant],
        name=invariant.replace(".", "_"))


def _model_config(model: str | None) -> str:
    """The recorded model's config.json as a Python literal, where the model is a folder here
    (a rig recording's local model is nowhere else); "None" for a hub id, read as it is."""
    if model is None or not (Path(model) / "config.json").is_file():
        return "None"
    return pprint.pformat(json.loads((Path(model) / "config.json").read_text()), width=90)


def _kv_groups(e: dict) -> str:
    """KV_GROUPS of the file: each recorded group's spec rebuilt as resim rebuilds it
    (build.py, from every recorded field; an older manifest's one full-attention group),
    written as vLLM-only source (the fields that differ from the class's defaults), with its
    layers, kind, block size and window rule (core/kv_groups.py); TraceError where a field has
    no such form."""
    import dataclasses

    from vllm_contract.kv_groups import group_kind, release_rule
    from vllm_contract.replay.resim.build import rebuild_spec

    recorded = e.get("kv_cache_groups") or [
        {"layers": 1, "spec": "FullAttentionSpec", "block_size": int(e["block_size"])}]
    rows = []
    for i, g in enumerate(recorded):
        spec = rebuild_spec(i, g, e)
        args = []
        for f in dataclasses.fields(spec):
            if not f.init:
                continue
            value = getattr(spec, f.name)
            default = (f.default if f.default is not dataclasses.MISSING else
                       f.default_factory() if f.default_factory is not dataclasses.MISSING
                       else dataclasses.MISSING)
            if default is not dataclasses.MISSING and _same(value, default):
                continue
            args.append(f"{f.name}={_source(value, i, f.name)}")
        if not _same(_rebuilt(f"kvi.{type(spec).__name__}({', '.join(args)})"), spec):
            raise TraceError(f"KV cache group {i} ({type(spec).__name__}) cannot be written "
                             f"in the pytest file: its spec does not come back the same")
        lines = [f"    {{'spec': kvi.{type(spec).__name__}("]
        for a in args:  # the arguments wrapped at 96 columns
            if len(lines[-1]) + len(a) + 2 > 96 and not lines[-1].endswith("("):
                lines.append("        ")
            lines[-1] += a + ", "
        lines = [line.rstrip() for line in lines]
        lines[-1] = lines[-1].rstrip(",") + "),"
        kind = g.get("kind") or group_kind(type(spec).__name__)
        rule = release_rule({**g, "kind": kind, "block_size": spec.block_size})
        lines.append(f"     'layers': {max(1, int(g.get('layers') or 1))}, 'kind': {kind!r}, "
                     f"'block_size': {int(spec.block_size)}, "
                     f"'release': {None if rule is None else (rule.offset, rule.chunk)!r}}},")
        rows += lines
    return "[\n" + "\n".join(rows) + "\n]"


def _same(a, b) -> bool:
    try:
        return bool(a == b)
    except Exception:  # a value whose == is not a bool (a tensor)
        return a is b


def _source(v, i: int, name: str) -> str:
    """A spec field's value as source text the file can evaluate with torch and kvi."""
    import enum

    import torch

    if v is None or type(v) in (bool, int, float, str):
        return repr(v)
    if isinstance(v, (tuple, list)):
        items = [_source(x, i, name) for x in v]
        if isinstance(v, list):
            return "[" + ", ".join(items) + "]"
        return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"
    if isinstance(v, torch.dtype):
        return str(v)  # torch.float32
    if isinstance(v, enum.Enum) and getattr(_kvi(), type(v).__name__, None) is type(v):
        return f"kvi.{type(v).__name__}.{v.name}"
    raise TraceError(f"KV cache group {i}'s {name} ({v!r}) has no form the pytest file can "
                     f"write")


def _kvi():
    from vllm.v1 import kv_cache_interface as kvi

    return kvi


def _rebuilt(text: str):
    import torch

    try:
        return eval(text, {"torch": torch, "kvi": _kvi()})  # noqa: S307 (our own text)
    except Exception:
        return None
