"""The fields of vLLM's contract dataclasses that the trace gives a column of their own: one list,
read by the recorder's snapshot (what goes to extra_fields), the manifest's drift report (what a
newer vLLM added) and the canonical form (what a replay compares). Anything else a dataclass has
is recorded in plain form in extra_fields: new vLLM versions add fields and nothing may be
dropped."""

SCHEDULER_OUTPUT = (
    "scheduled_new_reqs", "scheduled_cached_reqs", "num_scheduled_tokens",
    "total_num_scheduled_tokens", "scheduled_spec_decode_tokens", "scheduled_encoder_inputs",
    "finished_req_ids", "free_encoder_mm_hashes", "preempted_req_ids",
    "has_structured_output_requests", "pending_structured_output_tokens",
    "num_invalid_spec_tokens", "has_sync_kv_loads", "num_spec_tokens_to_schedule",
    "num_common_prefix_blocks", "new_block_ids_to_zero",
)
NEW_REQUEST = (
    "req_id", "prompt_token_ids", "mm_features", "sampling_params", "pooling_params",
    "block_ids", "num_computed_tokens", "lora_request", "prompt_embeds", "prompt_is_token_ids",
    "prefill_token_ids", "replay_start",
)
CACHED_REQUESTS = (
    "req_ids", "resumed_req_ids", "new_token_ids", "all_token_ids", "new_block_ids",
    "num_computed_tokens", "num_output_tokens",
)
MODEL_OUTPUT = ("req_ids", "req_id_to_index", "sampled_token_ids", "num_nans_in_logits")

WITH_COLUMN = {"SchedulerOutput": SCHEDULER_OUTPUT, "NewRequestData": NEW_REQUEST,
               "CachedRequestData": CACHED_REQUESTS, "ModelRunnerOutput": MODEL_OUTPUT}

# Fields known to hold opaque objects (connector metadata, tensors, stats): they have no column and
# go to extra_fields like drift does, but they are not drift.
OPAQUE = frozenset({
    "scheduled_encoder_input_stats", "kv_connector_metadata", "aux_output_connector_metadata",
    "ec_connector_metadata", "ec_manager_metadata", "kv_cache_block_copies",
    "kv_connector_block_state", "logprobs", "prompt_logprobs_dict",
    "prompt_token_id_logprobs_dict", "pooler_output", "kv_connector_output",
    "ec_connector_output", "cudagraph_stats", "aux_output_connector_output", "sampling_masks",
})
