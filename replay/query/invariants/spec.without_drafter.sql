-- id: spec.without_drafter
-- severity: error
-- title: draft tokens on an engine without a drafter
-- why: Without a speculative config the worker still writes the drafts into the request's
--      inputs, but takes the logits at the last scheduled position (the last draft) and has no
--      rejection sampler: the token it samples follows an unverified draft, silently.
--      computed.progress counts such drafts as rejected and stays quiet.
-- relies_on: vllm/v1/worker/gpu_model_runner.py GPUModelRunner._prepare_inputs
--            (use_spec_decode = speculative_config is not None);
--            vllm/v1/worker/gpu_input_batch.py InputBatch.update_req_spec_token_ids
-- needs: scheduled, drafts, engines
-- columns: engine, step, req_id, details
-- note: an empty list for a request is harmless (nothing is written) and not reported.
SELECT d.engine, d.step, d.req_id,
       CAST(CARDINALITY(d.spec_token_ids) AS VARCHAR)
       || ' draft token(s), the engine has no speculative config' AS details
FROM drafts d
JOIN engines e ON e.engine = d.engine
WHERE e.spec_method IS NULL AND CARDINALITY(d.spec_token_ids) > 0
