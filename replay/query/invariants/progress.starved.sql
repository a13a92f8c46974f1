-- id: progress.starved
-- severity: warning
-- title: a running request is left unscheduled for many steps while the step had room
-- why: The worker keeps the request's state and blocks the whole time; a scheduler that forgets
--      a running request stalls its client and pins its KV blocks.
-- relies_on: vllm/v1/core/sched/scheduler.py Scheduler.schedule (running queue)
-- needs: scheduled, windowed_runs, run_ids, steps, preempted, engines
-- columns: engine, step, req_id, details
-- note: waiting requests can wait for dozens of steps because KV blocks, not tokens, are the
--       limit; only requests already running (not preempted) count, and only gaps of 64 steps
--       or more in which every step left token budget and sequence slots unused.
--       An id with a gap is never plain (run_groups): windowed_runs has its rows.
WITH gaps AS (
    SELECT k.engine, k.req_id, r.step, r.prev_step
    FROM windowed_runs r
    JOIN run_ids k ON k.inst = r.inst
    WHERE r.num_scheduled_tokens IS NOT NULL AND r.step - r.prev_step >= 64
),
busy AS (
    SELECT g.engine, g.req_id, g.prev_step, g.step,
           SUM(CASE WHEN s.total_num_scheduled_tokens >= e.max_num_batched_tokens
                     OR s.num_new + s.num_cached >= e.max_num_seqs THEN 1 ELSE 0 END) AS full_steps
    FROM gaps g
    JOIN steps s ON s.engine = g.engine AND s.step > g.prev_step AND s.step < g.step
    JOIN engines e ON e.engine = g.engine
    GROUP BY g.engine, g.req_id, g.prev_step, g.step
)
SELECT b.engine, b.step, b.req_id,
       'not scheduled from step ' || CAST(b.prev_step AS VARCHAR) || ' to '
       || CAST(b.step AS VARCHAR) || ' with budget to spare' AS details
FROM busy b
LEFT JOIN preempted p ON p.engine = b.engine AND p.req_id = b.req_id
     AND p.step > b.prev_step AND p.step <= b.step
WHERE b.full_steps = 0 AND p.req_id IS NULL
