-- id: progress.stuck_running
-- severity: warning
-- title: zero-token steps while requests are running
-- why: The scheduler serves its running requests first, and with the token budget all free
--      nothing in one batch's step keeps a running request out: a run of such steps while the
--      worker holds their state and KV blocks is the engine deadlocked, the signature of
--      several public vLLM hangs.
-- relies_on: vllm/v1/core/sched/scheduler.py Scheduler.schedule (the RUNNING loop);
--            vllm/v1/engine/core.py EngineCore.step / step_with_batch_queue
-- needs: steps
-- columns: engine, step, req_id (NULL), details
-- note: reported from the 32nd consecutive such step. What legitimately empties a step while
--       requests run (vLLM 0.32): with a batch queue (async scheduling, pipeline parallel),
--       requests whose batch is in flight and has reached max_tokens, pipeline stages still
--       prefilling, or decodes held pp_size steps apart; each ends when the oldest batch
--       returns, and the engine waits for it once its queue of max_concurrent_batches (2,
--       pp_size, or pp_size + 1 with the V2 model runner) is full, so such runs stay a few
--       steps long. A paused scheduler (PAUSED_ALL) schedules nothing but steps only while
--       finished ids wait for delivery or a connector has push work pending. Remote KV loads and
--       grammar compilation keep requests waiting, not running (progress.stalled's case). Not
--       told apart: a running multimodal request waiting for an encoder-cache connector
--       (ec_connector.ensure_cache_available), which can last many steps.
WITH flagged AS (
    SELECT engine, step,
           CASE WHEN total_num_scheduled_tokens = 0 AND num_running > 0 THEN 1 ELSE 0 END AS stuck
    FROM steps
),
runs AS (
    SELECT engine, step, stuck,
           SUM(CASE WHEN stuck = 0 THEN 1 ELSE 0 END) OVER (
               PARTITION BY engine ORDER BY step
               ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS run_id
    FROM flagged
),
lengths AS (
    SELECT engine, run_id, MIN(step) AS first_step, COUNT(*) AS n
    FROM runs WHERE stuck = 1 GROUP BY engine, run_id
)
SELECT engine, first_step + 31 AS step, CAST(NULL AS VARCHAR) AS req_id,
       CAST(n AS VARCHAR) || ' consecutive zero-token steps from step '
       || CAST(first_step AS VARCHAR) || ' with requests running' AS details
FROM lengths
WHERE n >= 32
