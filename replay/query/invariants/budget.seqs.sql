-- id: budget.seqs
-- severity: error
-- title: a step schedules more requests than max_num_seqs
-- why: The persistent batch has max_num_seqs slots; one more request has nowhere to go.
-- relies_on: vllm/v1/worker/gpu_input_batch.py InputBatch.add_request
-- needs: scheduled, step_totals, engines
-- columns: engine, step, req_id (NULL), details
SELECT p.engine, p.step, CAST(NULL AS VARCHAR) AS req_id,
       CAST(p.n AS VARCHAR) || ' requests > max_num_seqs ' || CAST(e.max_num_seqs AS VARCHAR)
       AS details
FROM step_totals p JOIN engines e ON e.engine = p.engine
WHERE e.max_num_seqs IS NOT NULL AND p.n > e.max_num_seqs
