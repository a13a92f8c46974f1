-- id: encoder.free_unknown
-- severity: warning
-- title: a freed encoder hash that no request brought, or none brought back since its last free
-- why: The worker pops the hash from its encoder cache and tolerates a miss, but the scheduler's
--      encoder-cache bookkeeping and the worker's have diverged: the hash was never an input of
--      a request, or it was freed before and nothing put it back in the cache since.
-- relies_on: vllm/v1/core/encoder_cache_manager.py EncoderCacheManager.get_freed_mm_hashes;
--            vllm/v1/worker/gpu_model_runner.py GPUModelRunner._update_states
--            (encoder_cache.pop) / _execute_mm_encoder
-- needs: freed_mm, mm_inputs, scheduled, instances
-- columns: engine, step, req_id (NULL), details
-- note: after a free, the hash is back when a request brings it (an introduction after that
--       free, up to the next one) or when a step computes it (a scheduled encoder input whose
--       feature has that identifier: a resumed request recomputes without a new introduction).
--       The worker frees, then computes, within a step: a compute in the step of the earlier
--       free counts, one in the step of the later free does not.
WITH first_seen AS (
    SELECT engine, identifier, MIN(step) AS step FROM mm_inputs GROUP BY engine, identifier
),
frees AS (
    -- two frees of a hash in one step tie, and are alike but for their position: either order
    -- gives the same rows
    SELECT f.engine, f.step, f.mm_hash, s.identifier IS NOT NULL AS known,
           LAG(f.step) OVER (PARTITION BY f.engine, f.mm_hash ORDER BY f.step) AS prev_free
    FROM freed_mm f
    LEFT JOIN first_seen s ON s.engine = f.engine AND s.identifier = f.mm_hash AND s.step <= f.step
),
again AS (
    SELECT engine, step, mm_hash, prev_free FROM frees WHERE known AND prev_free IS NOT NULL
),
users AS (
    -- only the requests that brought a hash freed more than once are read: none at all (and no
    -- scan of scheduled) in a trace where every hash is freed once
    SELECT DISTINCT m.engine, m.req_id
    FROM mm_inputs m
    JOIN (SELECT DISTINCT engine, mm_hash FROM again) a
         ON a.engine = m.engine AND a.mm_hash = m.identifier
),
with_inputs AS (
    SELECT s.engine, s.step, s.req_id, s.encoder_inputs
    FROM scheduled s
    JOIN users u ON u.engine = s.engine AND u.req_id = s.req_id
    -- no filter on encoder_inputs: one below the join would decode every row's list
),
inputs AS (
    SELECT engine, step, req_id, UNNEST(encoder_inputs) AS idx FROM with_inputs
),
back AS (
    -- each step that put a hash back: by an introduction, or by a compute
    SELECT engine, identifier, step, FALSE AS computed FROM mm_inputs
    UNION ALL
    SELECT c.engine, m.identifier, c.step, TRUE AS computed
    FROM inputs c
    JOIN instances i ON i.engine = c.engine AND i.req_id = c.req_id AND i.intro_step <= c.step
         AND (i.next_intro_step IS NULL OR c.step < i.next_intro_step)
    JOIN mm_inputs m ON m.engine = c.engine AND m.req_id = c.req_id AND m.step = i.intro_step
         AND m.pos = c.idx
)
SELECT engine, step, CAST(NULL AS VARCHAR) AS req_id,
       'freed ' || mm_hash || ', never an input of a request before' AS details
FROM frees
WHERE NOT known
UNION ALL
SELECT a.engine, a.step, CAST(NULL AS VARCHAR) AS req_id,
       'freed ' || a.mm_hash || ' again, neither brought nor computed since its free at step '
       || CAST(a.prev_free AS VARCHAR) AS details
FROM again a
LEFT JOIN back b ON b.engine = a.engine AND b.identifier = a.mm_hash
     AND ((b.computed AND b.step >= a.prev_free AND b.step < a.step)
          OR (NOT b.computed AND b.step > a.prev_free AND b.step <= a.step))
WHERE b.identifier IS NULL
