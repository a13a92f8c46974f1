-- id: encoder.never_freed
-- severity: info
-- title: an encoder hash is never freed although every request that used it has ended
-- why: Freed outputs normally stay cached for reuse and are evicted under pressure, so this is
--      common; across a long trace a growing number of them means the encoder cache only grows.
-- relies_on: vllm/v1/core/encoder_cache_manager.py EncoderCacheManager.free / get_freed_mm_hashes
-- needs: mm_inputs, freed_mm, finished
-- columns: engine, step, req_id, details
-- note: only a free after the hash's last introduction counts: an earlier one freed an output
--       that a later request brought back into the cache. Reported at the step that delivered
--       the finish of its last request, with that request.
WITH uses AS (
    SELECT engine, req_id, identifier, MIN(step) AS intro_step FROM mm_inputs
    GROUP BY engine, req_id, identifier
),
ended AS (
    SELECT u.engine, u.identifier, u.req_id, u.intro_step, MIN(f.step) AS end_step
    FROM uses u
    LEFT JOIN finished f ON f.engine = u.engine AND f.req_id = u.req_id AND f.step > u.intro_step
    GROUP BY u.engine, u.identifier, u.req_id, u.intro_step
),
all_ended AS (
    SELECT engine, identifier, MAX(end_step) AS last_end, MAX(intro_step) AS last_intro,
           SUM(CASE WHEN end_step IS NULL THEN 1 ELSE 0 END) AS still_running
    FROM ended GROUP BY engine, identifier
),
last_request AS (
    SELECT a.engine, a.identifier, a.last_end, a.last_intro, MIN(e.req_id) AS req_id
    FROM all_ended a
    JOIN ended e ON e.engine = a.engine AND e.identifier = a.identifier
         AND e.end_step = a.last_end
    WHERE a.still_running = 0
    GROUP BY a.engine, a.identifier, a.last_end, a.last_intro
)
SELECT a.engine, a.last_end AS step, a.req_id,
       a.identifier || ' never freed after its last request ended at step '
       || CAST(a.last_end AS VARCHAR) AS details
FROM last_request a
LEFT JOIN (SELECT engine, mm_hash, MAX(step) AS last_free FROM freed_mm
           GROUP BY engine, mm_hash) f
     ON f.engine = a.engine AND f.mm_hash = a.identifier AND f.last_free > a.last_intro
WHERE f.mm_hash IS NULL
