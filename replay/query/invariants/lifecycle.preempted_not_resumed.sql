-- id: lifecycle.preempted_not_resumed
-- severity: error
-- title: a preempted request is scheduled again as cached, not as resumed
-- why: The worker keeps a preempted request's state, block table included. Only an id in
--      resumed_req_ids makes it replace that table with new_block_ids; otherwise it appends
--      the new blocks to the stale table, whose blocks were freed at the preemption and may
--      belong to another request by then: wrong KV, silently.
-- relies_on: vllm/v1/worker/gpu_model_runner.py GPUModelRunner._update_states
--            (resumed_from_preemption); vllm/v1/core/sched/scheduler.py
--            Scheduler._make_cached_request_data
-- needs: preempted, scheduled
-- columns: engine, step, req_id, details
-- note: the first row from the preemption's step on decides: a new row (the id freed and
--       introduced again) is a new request, not a return. A row in the very step that lists the
--       preemption counts: reset_prefix_cache(reset_running_requests=True) preempts between two
--       steps, and the next schedule() may resume the request in the step whose
--       preempted_req_ids carries it (a preemption inside schedule() is never scheduled in that
--       step); the worker's batch still holds it then, so a cached row appends to the stale
--       table there too. Whether a resumed row carries its whole table is
--       lifecycle.resumed_without_blocks' and blocks.table_short's question.
WITH next_row AS (
    SELECT p.engine, p.step AS preempt_step, p.req_id, MIN(s.step) AS step
    FROM preempted p
    JOIN scheduled s ON s.engine = p.engine AND s.req_id = p.req_id AND s.step >= p.step
    WHERE s.kind IS NOT NULL
    GROUP BY p.engine, p.step, p.req_id
)
SELECT n.engine, n.step, n.req_id,
       'scheduled as cached after its preemption at step ' || CAST(MAX(n.preempt_step) AS VARCHAR)
       || ', not in resumed_req_ids' AS details
FROM next_row n
JOIN scheduled s ON s.engine = n.engine AND s.req_id = n.req_id AND s.step = n.step
WHERE s.kind = 'cached'
GROUP BY n.engine, n.step, n.req_id
