-- id: spec.unscheduled
-- severity: error
-- title: draft tokens for a request that is not scheduled in this step
-- why: The worker lays drafts out after the request's scheduled tokens; for a request not in the
--      batch there is no place for them (a KeyError or misplaced drafts).
-- relies_on: vllm/v1/worker/gpu_model_runner.py GPUModelRunner._calc_spec_decode_metadata
-- needs: scheduled, drafts
-- columns: engine, step, req_id, details
SELECT engine, step, req_id,
       CAST(CARDINALITY(spec_token_ids) AS VARCHAR) || ' draft tokens, no tokens scheduled'
       AS details
FROM drafts
WHERE num_scheduled_tokens IS NULL
