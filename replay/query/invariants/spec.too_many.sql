-- id: spec.too_many
-- severity: error
-- title: at least as many draft tokens as scheduled tokens
-- why: Scheduled tokens of a decode are 1 + drafts; with drafts >= scheduled there is no slot
--      for the token the drafts extend, and the worker's logits indices go out of range.
-- relies_on: vllm/v1/worker/gpu_model_runner.py GPUModelRunner._calc_spec_decode_metadata
-- needs: scheduled, drafts
-- columns: engine, step, req_id, details
SELECT engine, step, req_id,
       CAST(CARDINALITY(spec_token_ids) AS VARCHAR) || ' drafts for '
       || CAST(num_scheduled_tokens AS VARCHAR) || ' scheduled tokens' AS details
FROM drafts
WHERE num_scheduled_tokens IS NOT NULL
  AND CARDINALITY(spec_token_ids) >= num_scheduled_tokens
