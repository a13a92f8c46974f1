-- id: encoder.never_freed
-- severity: info
-- title: an encoder hash is never freed although every request that used it has ended
-- why: Freed outputs normally stay cached for reuse and are evicted under pressure, so this is
--      common; across a long trace a growing number of them means the encoder cache only grows.
-- relies_on: vllm/v1/core/encoder_cache_manager.py EncoderCacheManager.free / get_freed_mm_hashes
-- needs: mm_inputs, freed_mm, finished
-- columns: engine, step, req_id, details
WITH uses AS (
    SELECT engine, req_id, identifier, MIN(step) AS intro_step FROM mm_inputs
    GROUP BY engine, req_id, identifier
),
ended AS (
    SELECT u.engine, u.identifier, u.req_id, MIN(f.step) AS end_step
    FROM uses u
    LEFT JOIN finished f ON f.engine = u.engine AND f.req_id = u.req_id AND f.step > u.intro_step
    GROUP BY u.engine, u.identifier, u.req_id
),
all_ended AS (
    SELECT engine, identifier, MAX(end_step) AS last_end, MIN(req_id) AS req_id,
           SUM(CASE WHEN end_step IS NULL THEN 1 ELSE 0 END) AS still_running
    FROM ended GROUP BY engine, identifier
)
SELECT a.engine, a.last_end AS step, a.req_id,
       a.identifier || ' never freed after its last request ended at step '
       || CAST(a.last_end AS VARCHAR) AS details
FROM all_ended a
LEFT JOIN (SELECT DISTINCT engine, mm_hash FROM freed_mm) f
     ON f.engine = a.engine AND f.mm_hash = a.identifier
WHERE a.still_running = 0 AND f.mm_hash IS NULL
