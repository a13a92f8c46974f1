-- id: encoder.free_unknown
-- severity: warning
-- title: a freed encoder hash that no request ever brought
-- why: The worker pops the hash from its encoder cache and tolerates a miss, but the scheduler's
--      encoder-cache bookkeeping and the worker's have diverged.
-- relies_on: vllm/v1/core/encoder_cache_manager.py EncoderCacheManager.get_freed_mm_hashes
-- needs: freed_mm, mm_inputs
-- columns: engine, step, req_id (NULL), details
WITH first_seen AS (
    SELECT engine, identifier, MIN(step) AS step FROM mm_inputs GROUP BY engine, identifier
)
SELECT f.engine, f.step, CAST(NULL AS VARCHAR) AS req_id,
       'freed ' || f.mm_hash || ', never an input of a request before' AS details
FROM freed_mm f
LEFT JOIN first_seen s ON s.engine = f.engine AND s.identifier = f.mm_hash AND s.step <= f.step
WHERE s.identifier IS NULL
