-- id: blocks.double_owner
-- severity: error
-- title: a block is handed to a request while another live request still holds it
-- why: Two requests writing KV into one block corrupt each other's attention: silently wrong
--      tokens, no error anywhere.
-- relies_on: vllm/v1/core/block_pool.py BlockPool; vllm/v1/core/kv_cache_manager.py allocate_slots
-- needs: scheduled, grants, block_holds, window_releases, kv_groups, preempted, finish_events,
--        engines
-- columns: engine, step, req_id, details
-- note: prefix-cache sharing is allowed: a new or resumed request may share as many blocks as
--       its num_computed_tokens covers, also blocks a request admitted before it fills in the
--       same step (running requests are served first, then new ones in list order; the order
--       of a resumed and a new request within one step is unknown, so such pairs are not
--       compared).
--       A holder keeps a block until it is preempted (its blocks may go to others in that very
--       step) or until the step after its finish event; in a sliding-window, chunked-local or
--       Mamba group, until its window leaves the block behind (`window_releases`: vLLM frees
--       it in the request's next allocation and may hand it to others in that step). The
--       null block (0), which such groups repeat, is nobody's. With several KV cache groups a
--       request may share each group's prefix-hit blocks: num_computed_tokens // block size
--       of each group.
WITH holds AS (
    SELECT engine, req_id, step, block_id, end_step FROM block_holds
),
lagged AS (
    SELECT engine, block_id, step, prev_end FROM block_holds
),
overlapping AS (
    SELECT DISTINCT engine, block_id FROM lagged WHERE prev_end > step
),
shared_blocks AS (
    SELECT h.engine, h.req_id, h.step, h.block_id,
           CASE WHEN g.kind = 'cached' THEN 0 ELSE 1 END AS phase, g.kind, g.pos,
           g.num_computed_tokens, h.end_step
    FROM holds h
    JOIN overlapping o ON o.engine = h.engine AND o.block_id = h.block_id
    JOIN grants g ON g.engine = h.engine AND g.step = h.step AND g.req_id = h.req_id
    WHERE g.kind IS NOT NULL
),
swept AS (
    -- per block, in step order: until when its holders from earlier steps keep it (one sort of
    -- the acquisitions, instead of joining every acquisition with every earlier holder)
    SELECT engine, req_id, step, block_id, kind, num_computed_tokens,
           MAX(COALESCE(end_step, 9223372036854775807)) OVER (
               PARTITION BY engine, block_id ORDER BY step
               RANGE BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS held_until
    FROM shared_blocks
),
taken AS (
    -- blocks still held by an earlier step's holder, or by one served before it in this step
    -- (running requests first, then new ones in list order)
    SELECT engine, step, req_id, kind, num_computed_tokens, block_id
    FROM swept
    WHERE held_until > step
    UNION
    SELECT b.engine, b.step, b.req_id, b.kind, b.num_computed_tokens, b.block_id
    FROM shared_blocks b
    JOIN shared_blocks h ON h.engine = b.engine AND h.step = b.step AND h.block_id = b.block_id
         AND h.req_id <> b.req_id
    WHERE h.phase < b.phase OR (h.kind = b.kind AND h.pos < b.pos)
),
shared AS (
    SELECT engine, step, req_id, kind, num_computed_tokens, COUNT(DISTINCT block_id) AS n_shared,
           MIN(block_id) AS block_id
    FROM taken
    GROUP BY engine, step, req_id, kind, num_computed_tokens
),
group_sizes AS (
    -- each engine's groups' block sizes; one group of the engine's block size where the
    -- manifest names none
    SELECT engine, block_size FROM kv_groups WHERE block_size > 0
    UNION ALL
    SELECT e.engine, e.block_size
    FROM engines e
    WHERE e.block_size > 0 AND NOT EXISTS (SELECT 1 FROM kv_groups g WHERE g.engine = e.engine)
),
allowed AS (
    SELECT s.engine, s.step, s.req_id, s.kind, s.n_shared, s.block_id,
           SUM(s.num_computed_tokens // z.block_size) AS prefix_blocks
    FROM shared s JOIN group_sizes z ON z.engine = s.engine
    GROUP BY s.engine, s.step, s.req_id, s.kind, s.n_shared, s.block_id
),
flagged AS (
    SELECT engine, step, req_id, n_shared, block_id, prefix_blocks
    FROM allowed
    WHERE kind = 'cached' OR n_shared > prefix_blocks
),
holder AS (
    -- who holds it, named only for what is reported
    SELECT f.engine, f.step, f.req_id, MIN(h.req_id) AS holder
    FROM flagged f
    JOIN shared_blocks h ON h.engine = f.engine AND h.block_id = f.block_id
         AND h.req_id <> f.req_id
         AND h.step <= f.step AND (h.end_step IS NULL OR h.end_step > f.step)
    GROUP BY f.engine, f.step, f.req_id
)
SELECT f.engine, f.step, f.req_id,
       CAST(f.n_shared AS VARCHAR) || ' block(s) (e.g. ' || CAST(f.block_id AS VARCHAR)
       || ') still held by ' || COALESCE(h.holder, 'an earlier holder') || '; prefix hits cover '
       || CAST(f.prefix_blocks AS VARCHAR) AS details
FROM flagged f
LEFT JOIN holder h ON h.engine = f.engine AND h.step = f.step AND h.req_id = f.req_id
