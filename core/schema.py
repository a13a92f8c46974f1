"""The trace format, defined once: table names, columns, types, docs and the format version.

Both the recorder (which writes) and replay (which reads) import this module; docs/trace-tables.md
is generated from it (`make docs`), and a test keeps the two equal.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

# 3: format 2 and the scheduler's input log (tables `inputs` and `added`), which a trace of
# format 1 or 2 lacks; 2: every table is one Hive-partitioned dataset,
# TRACE/<table>/engine=<name>/, and each engine's manifest lies in
# TRACE/_engines/engine=<name>/ (a folder dataset readers skip);
# 1: TRACE/engine=<name>/{manifest.json,<table>/}. All are read.
FORMAT_VERSION = 3
# The first format whose recorder logs the scheduler's inputs (tables INPUT_TABLES).
INPUTS_FORMAT = 3
MANIFEST = "manifest.json"
SEGMENT_SUFFIX = ".arrows"
PARQUET_SUFFIX = ".parquet"
ENGINE_DIR_PREFIX = "engine="
ENGINES_DIR = "_engines"


def table_dir(home: Path, table: str) -> Path:
    """Where an engine's segments of `table` lie, given the engine's home (the directory of
    its manifest): beside the engines folder in format 2, inside the home in format 1."""
    if home.parent.name == ENGINES_DIR:
        return home.parent.parent / table / home.name
    return home / table


def table_of(segment: Path) -> str:
    """The table a segment file belongs to, in either format."""
    parent = segment.parent
    return parent.parent.name if parent.name.startswith(ENGINE_DIR_PREFIX) else parent.name


def engine_name(home: Path) -> str:
    """An engine's plain name (the value of its `engine` partition key)."""
    return plain_engine(home.name)


def plain_engine(name: str) -> str:
    """An engine named by the user, as its directory (`engine=NAME`) or plainly."""
    return name.removeprefix(ENGINE_DIR_PREFIX)

_I64 = pa.int64()
_I32 = pa.int32()
_STR = pa.string()
_BOOL = pa.bool_()
_INTS = pa.list_(pa.int64())
_BLOCKS = pa.list_(pa.list_(pa.int32()))  # one block id list per KV cache group
_F64 = pa.float64()


def _col(name: str, typ: pa.DataType, doc: str, nullable: bool = True) -> pa.Field:
    return pa.field(name, typ, nullable=nullable, metadata={"doc": doc})


_STEP = _col("step", _I64, "Engine step number, 0 for the first recorded schedule() call "
             "(-1: an event before it).", False)

TABLES: dict[str, tuple[str, pa.Schema]] = {
    "steps": (
        "One row per schedule() call: the SchedulerOutput's scalar fields and the scheduler's state.",
        pa.schema([
            _STEP,
            _col("t_ns", _I64, "When schedule() returned, in ns since the epoch (the recorder's "
                 "clock: see docs/trace-format.md).", False),
            _col("schedule_ns", _I64, "Duration of schedule() in ns.", False),
            _col("total_num_scheduled_tokens", _I64, "SchedulerOutput.total_num_scheduled_tokens."),
            _col("num_new", _I64, "len(scheduled_new_reqs)."),
            _col("num_cached", _I64, "len(scheduled_cached_reqs.req_ids)."),
            _col("num_finished", _I64, "len(finished_req_ids)."),
            _col("num_running", _I64, "Scheduler's running queue length after schedule()."),
            _col("num_waiting", _I64, "Scheduler's waiting queue length after schedule()."),
            _col("kv_usage", pa.float64(), "Fraction of KV cache blocks in use after schedule()."),
            _col("preempted_is_null", _BOOL, "preempted_req_ids was None (not an empty set)."),
            _col("invalid_spec_is_null", _BOOL, "num_invalid_spec_tokens was None (not empty)."),
            _col("cached_new_token_ids_len", _I64,
                 "len(scheduled_cached_reqs.new_token_ids): 0 unless pipeline parallel."),
            _col("num_common_prefix_blocks", _INTS, "SchedulerOutput.num_common_prefix_blocks."),
            _col("new_block_ids_to_zero", _INTS, "SchedulerOutput.new_block_ids_to_zero."),
            _col("has_structured_output_requests", _BOOL, "Same-named SchedulerOutput field."),
            _col("pending_structured_output_tokens", _BOOL, "Same-named SchedulerOutput field."),
            _col("has_sync_kv_loads", _BOOL, "Same-named SchedulerOutput field."),
            _col("num_spec_tokens_to_schedule", _I64, "Same-named SchedulerOutput field."),
        ]),
    ),
    "scheduled": (
        "One row per (step, request id) named by any per-request part of the SchedulerOutput: "
        "the new and cached request lists and the per-request dicts.",
        pa.schema([
            _STEP,
            _col("req_id", _STR, "Request id (vLLM's internal id, with its random suffix).", False),
            _col("kind", _STR, "'new', 'cached' or 'resumed' (cached and in resumed_req_ids); "
                 "NULL when the id is only a key of a per-request dict."),
            _col("pos", _I64, "Index in scheduled_new_reqs or scheduled_cached_reqs.req_ids."),
            _col("resumed", _BOOL, "Id is in scheduled_cached_reqs.resumed_req_ids."),
            _col("num_scheduled_tokens", _I64, "num_scheduled_tokens[req_id], NULL if absent."),
            _col("num_computed_tokens", _I64, "num_computed_tokens sent to the worker."),
            _col("num_output_tokens", _I64, "Cached requests: num_output_tokens."),
            _col("new_block_ids", _BLOCKS, "New requests: block_ids; cached: new_block_ids "
                 "(the whole table when resumed). NULL when None."),
            _col("new_token_ids", _INTS, "Cached requests: new_token_ids (pipeline parallel only)."),
            _col("all_token_ids", _INTS, "scheduled_cached_reqs.all_token_ids[req_id]."),
            _col("spec_token_ids", _INTS, "scheduled_spec_decode_tokens[req_id]."),
            _col("num_invalid_spec_tokens", _I64, "num_invalid_spec_tokens[req_id]."),
            _col("encoder_inputs", _INTS, "scheduled_encoder_inputs[req_id]."),
        ]),
    ),
    "requests": (
        "One row per NewRequestData: what the worker caches when a request is introduced.",
        pa.schema([
            _STEP,
            _col("req_id", _STR, "Request id.", False),
            _col("pos", _I64, "Index in scheduled_new_reqs."),
            _col("prompt_token_ids", _INTS, "Prompt token ids (NULL when redacted or embeds)."),
            _col("prompt_len", _I64, "Prompt length in tokens."),
            _col("sampling_params", _STR, "SamplingParams as JSON (see docs: plain-data JSON)."),
            _col("pooling_params", _STR, "PoolingParams as JSON."),
            _col("lora_request", _STR, "LoRARequest as JSON."),
            _col("mm_features", _STR, "Multimodal feature specs as JSON (tensors as opaque)."),
            _col("prompt_embeds", _STR, "Prompt embeddings tensor: opaque description as JSON."),
            _col("prompt_is_token_ids", pa.list_(_BOOL), "NewRequestData.prompt_is_token_ids."),
            _col("prefill_token_ids", _INTS, "NewRequestData.prefill_token_ids."),
            _col("replay_start", _I64, "NewRequestData.replay_start."),
        ]),
    ),
    "mm_inputs": (
        "One row per multimodal input of a NewRequestData (mm_features), normalised so that "
        "encoder checks can join on it; the full objects stay in requests.mm_features.",
        pa.schema([
            _STEP,
            _col("req_id", _STR, "Request id.", False),
            _col("pos", _I64, "Index in mm_features: the encoder input index that "
                 "scheduled_encoder_inputs refers to."),
            _col("identifier", _STR, "Encoder-cache key (what free_encoder_mm_hashes names)."),
            _col("mm_hash", _STR, "Processor-cache hash."),
            _col("modality", _STR, "e.g. 'image'."),
            _col("offset", _I64, "First placeholder token of the input in the prompt."),
            _col("length", _I64, "Number of placeholder tokens."),
        ]),
    ),
    "finished": (
        "One row per id in a step's finished_req_ids (delivered to the worker with that step).",
        pa.schema([_STEP, _col("req_id", _STR, "Finished request id.", False)]),
    ),
    "preempted": (
        "One row per id in a step's preempted_req_ids.",
        pa.schema([_STEP, _col("req_id", _STR, "Preempted request id.", False)]),
    ),
    "freed_mm": (
        "One row per entry of a step's free_encoder_mm_hashes.",
        pa.schema([
            _STEP,
            _col("pos", _I64, "Index in free_encoder_mm_hashes."),
            _col("mm_hash", _STR, "Multimodal hash whose encoder output the worker frees.", False),
        ]),
    ),
    "updates": (
        "One row per update_from_output() call, matched to its schedule() by object identity.",
        pa.schema([
            _STEP,
            _col("t_ns", _I64, "When update_from_output() returned (the recorder's clock).", False),
            _col("update_ns", _I64, "Duration of update_from_output() in ns.", False),
            _col("num_outputs", _I64, "len(model_runner_output.req_ids)."),
        ]),
    ),
    "model_outputs": (
        "One row per request in a step's ModelRunnerOutput.",
        pa.schema([
            _STEP,
            _col("req_id", _STR, "Request id.", False),
            _col("pos", _I64, "Index in model_runner_output.req_ids."),
            _col("sampled_token_ids", _INTS, "Tokens sampled for this request in this step."),
            _col("num_nans_in_logits", _I64, "num_nans_in_logits[req_id], if reported."),
        ]),
    ),
    "finish_events": (
        "One row per request the engine finished: from update_from_output()'s outputs "
        "(stop, length, ...) and from finish_requests() (aborts).",
        pa.schema([
            _STEP,
            _col("req_id", _STR, "Request id.", False),
            _col("reason", _STR, "FinishReason or RequestStatus name, e.g. LENGTH, FINISHED_ABORTED."),
            _col("source", _STR, "'update_from_output' or 'finish_requests'."),
            _col("t_ns", _I64, "When the event was seen (the recorder's clock)."),
        ]),
    ),
    "extra_fields": (
        "Fields without a column of their own: dataclass fields this recorder does not know "
        "(contract drift) and opaque objects (connector metadata, tensors), never dropped.",
        pa.schema([
            _STEP,
            _col("owner", _STR, "Dataclass: SchedulerOutput, NewRequestData, CachedRequestData, "
                 "ModelRunnerOutput.", False),
            _col("req_id", _STR, "Request id for per-request objects, else NULL."),
            _col("field", _STR, "Field name.", False),
            _col("type_name", _STR, "Qualified type name of the value."),
            _col("size", _I64, "Approximate size in bytes of opaque values."),
            _col("value_json", _STR, "Plain-data JSON of the value (opaque parts described)."),
            _col("pickled", pa.binary(), "Pickled value: only when recorded with "
                 "pickle_opaque=True; reading it back needs allow_pickle=True."),
        ]),
    ),
    "transport": (
        "Both ends of the hand-off of a step's SchedulerOutput (live engines armed by the plugin): "
        "'executed' when the engine called its executor's execute_model() with it, 'received' "
        "when a worker's execute_model() got it. A step without 'executed' never left the engine.",
        pa.schema([
            _STEP,
            _col("event", _STR, "'executed' (engine side) or 'received' (worker side).", False),
            _col("worker", _I64, "'received': the worker's rank in its executor; NULL for "
                 "'executed'."),
            _col("seq", _I64, "Hand-off number: execute_model() calls since the engine was armed "
                 "(1 = the first); a worker's n-th receipt is matched to the engine's n-th call."),
            _col("t_ns", _I64, "When the event was seen (the recorder's clock, in the worker's "
                 "process for 'received')."),
            _col("num_scheduled_tokens", _I64, "total_num_scheduled_tokens of the output as that "
                 "end saw it (a check that engine and worker talk about the same step)."),
        ]),
    ),
    "redacted": (
        "One row per token list left out because prompts are redacted (VLLM_CONTRACT_REDACT_"
        "PROMPTS): its length and hash; the column it came from holds NULL.",
        pa.schema([
            _STEP,
            _col("req_id", _STR, "Request id.", False),
            _col("field", _STR, "'prompt_token_ids', 'prefill_token_ids' (requests) or "
                 "'all_token_ids' (scheduled).", False),
            _col("length", _I64, "Number of token ids."),
            _col("sha256", _STR, "Hex SHA-256 of the token ids as little-endian int64."),
        ]),
    ),
    "inputs": (
        "The scheduler's input log: one row per call that fed the scheduler something other "
        "than a step's schedule() or update_from_output(), per request it names: "
        "add_request(), finish_requests(), update_draft_token_ids(), "
        "update_draft_token_ids_in_output(), and schedule() called with arguments. Its place "
        "among all the scheduler's calls is exact: after `step`'s schedule() and after "
        "`updates` update_from_output() calls, in `seq` order.",
        pa.schema([
            _col("step", _I64, "The last step whose schedule() returned before this call "
                 "(-1: before the first; for schedule(): the step it made).", False),
            _col("seq", _I64, "Position among all the recorded scheduler calls (schedule(), "
                 "update_from_output() and these), 0 for the first: rows of one call share it.",
                 False),
            _col("updates", _I64, "update_from_output() calls recorded before this call.", False),
            _col("t_ns", _I64, "When the call returned (the recorder's clock)."),
            _col("call", _STR, "'add_request', 'finish_requests', 'update_draft_token_ids', "
                 "'update_draft_token_ids_in_output' or 'schedule'.", False),
            _col("req_id", _STR, "The request named (NULL for schedule(), for "
                 "finish_requests(None): every request, and for a draft update of none)."),
            _col("pos", _I64, "finish_requests(): the order vLLM took the ids in (set order), "
                 "those it finished first; drafts: index in DraftTokenIds.req_ids."),
            _col("status", _STR, "finish_requests(): the RequestStatus it was called with."),
            _col("finished", _BOOL, "finish_requests(): the id was finished by this call (it "
                 "was known and not finished already)."),
            _col("token_ids", _INTS, "Drafts: the draft token ids given for the request."),
            _col("args_json", _STR, "schedule(): its arguments as plain-data JSON "
                 "({\"args\": [...], \"kwargs\": {...}}), logged when they change; "
                 "update_draft_token_ids_in_output(): {\"scheduler_output_step\": N}."),
        ]),
    ),
    "added": (
        "One row per add_request(): the Request's fields the scheduler reads, as given to it "
        "(the `inputs` row of the same seq places it among the calls).",
        pa.schema([
            _col("step", _I64, "As in `inputs`: the last step scheduled before the call.",
                 False),
            _col("seq", _I64, "The add_request() call's seq in `inputs`.", False),
            _col("req_id", _STR, "Request.request_id.", False),
            _col("arrival_time", _F64, "Request.arrival_time (seconds since the epoch, as the "
                 "frontend stamped it)."),
            _col("priority", _I64, "Request.priority."),
            _col("client_index", _I64, "Request.client_index."),
            _col("num_prompt_tokens", _I64, "Request.num_prompt_tokens."),
            _col("prompt_token_ids", _INTS, "Request.prompt_token_ids (NULL when redacted)."),
            _col("prompt_block_hashes", pa.list_(pa.binary()), "Redacted prompts only: each "
                 "full prompt block's hash (Request.block_hashes) hashed again with a salt "
                 "drawn per recording and not kept, so equal blocks stay equal within the "
                 "trace and reveal nothing of the tokens."),
            _col("cache_salt", _STR, "Request.cache_salt (NULL when prompts are redacted: "
                 "the salted block hashes carry its effect)."),
            _col("sampling_params", _STR, "SamplingParams as JSON."),
            _col("pooling_params", _STR, "PoolingParams as JSON."),
            _col("lora_request", _STR, "LoRARequest as JSON."),
            _col("mm_features", _STR, "Multimodal feature specs as JSON (tensors as opaque)."),
            _col("other_json", _STR, "The Request constructor's other arguments, read back "
                 "from the Request, as plain-data JSON: those this recorder has no column for "
                 "(a newer vLLM's included, so that drift is never lost)."),
        ]),
    ),
    "malformed_steps": (
        "Quarantine: one row per step the recorder could not put in the other tables (a "
        "SchedulerOutput of the wrong shape: parallel lists of unequal length, None for a list, "
        "a value of the wrong type), kept whole in plain form; none of its rows are in the "
        "other tables. Also the model output of such a step (stage 'update').",
        pa.schema([
            _STEP,
            _col("t_ns", _I64, "When the recorder met it (the recorder's clock)."),
            _col("stage", _STR, "Where it failed: 'snapshot' (taking it in schedule()), 'rows' "
                 "(turning it into rows), 'arrow' (a value Arrow cannot store), or 'update' (the "
                 "model output of a quarantined step)."),
            _col("error", _STR, "Why, one line."),
            _col("plain_json", _STR, "The whole object in plain-data JSON (as the recorder held "
                 "it: the SchedulerOutput, its snapshot, or its rows)."),
        ]),
    ),
}

TABLE_NAMES = tuple(TABLES)
# The scheduler's input log (format INPUTS_FORMAT on): absent from older traces, where it
# was not recorded (not empty).
INPUT_TABLES = ("inputs", "added")
# Tables added to format 1 after its first traces: a trace without one had nothing to put in it
# (no quarantined step), so it counts as present and empty, and no check that needs it is skipped.
ADDED_TABLES = ("malformed_steps",)


def schema(table: str) -> pa.Schema:
    return TABLES[table][1]


def empty(sch: pa.Schema) -> pa.Table:
    """A table of no rows. Not `sch.empty_table()`: that builds each column from a Python list,
    and pyarrow's first conversion of Python values imports pandas (to ask whether they are
    pandas objects), which no command here needs."""
    return pa.Table.from_batches([], schema=sch)


def from_rows(rows: list[dict], sch: pa.Schema) -> pa.Table:
    """`pa.Table.from_pylist(rows, schema=sch)` for rows of JSON values (keys the schema lacks
    left out, as there), without pandas (see empty()): pyarrow's JSON reader builds the
    columns in C++, no Python value converted."""
    if not rows:
        return empty(sch)
    import json

    import pyarrow.json as pj

    data = "\n".join(json.dumps(r) for r in rows).encode()
    return pj.read_json(pa.BufferReader(data),
                        read_options=pj.ReadOptions(block_size=max(len(data), 1 << 20)),
                        parse_options=pj.ParseOptions(explicit_schema=sch,
                                                      unexpected_field_behavior="ignore"))


def markdown() -> str:
    """docs/trace-tables.md."""
    out = [f"<!-- generated by `python -m vllm_contract.schema`; format version {FORMAT_VERSION} -->"]
    for name, (doc, sch) in TABLES.items():
        out += ["", f"### `{name}`", "", doc, "", "| column | type | meaning |", "|---|---|---|"]
        for f in sch:
            out.append(f"| `{f.name}` | {f.type}{'' if f.nullable else ' not null'} | "
                       f"{f.metadata[b'doc'].decode()} |")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    print(markdown(), end="")
