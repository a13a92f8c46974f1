-- id: blocks.double_owner
-- severity: error
-- title: a block is handed to a request while another live request still holds it
-- why: Two requests writing KV into one block corrupt each other's attention: silently wrong
--      tokens, no error anywhere.
-- relies_on: vllm/v1/core/block_pool.py BlockPool; vllm/v1/core/kv_cache_manager.py allocate_slots
-- needs: scheduled, grants, window_releases, kv_groups, preempted, finish_events, engines
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
WITH acq AS (
    -- each block handed out, with no more columns than finding the blocks that ever had two
    -- holders needs (the others are fetched for those blocks alone)
    SELECT engine, step, req_id, block_id
    FROM (SELECT engine, step, req_id, UNNEST(block_ids) AS block_id
          FROM grants
          WHERE kind IS NOT NULL) u
    WHERE block_id <> 0
),
release_ AS (
    SELECT engine, req_id, step AS end_step FROM preempted
    UNION ALL
    SELECT engine, req_id, step + 1 AS end_step FROM finish_events
),
spans AS (
    SELECT engine, req_id, MIN(step) AS first_step, MAX(step) AS last_step
    FROM grants
    WHERE kind IS NOT NULL
    GROUP BY engine, req_id
),
id_ends AS (
    -- an id released nowhere between its first and last acquisitions holds every block it got
    -- until its first release after the first: one end per id (cheaper than joining each
    -- acquisition with the releases and taking the least)
    SELECT p.engine, p.req_id, MIN(r.end_step) AS end_step,
           SUM(CASE WHEN r.end_step <= p.last_step THEN 1 ELSE 0 END) AS inside
    FROM spans p
    LEFT JOIN release_ r ON r.engine = p.engine AND r.req_id = p.req_id
         AND r.end_step > p.first_step
    GROUP BY p.engine, p.req_id
),
holds_ AS (
    SELECT a.engine, a.req_id, a.step, a.block_id, e.end_step
    FROM acq a
    JOIN id_ends e ON e.engine = a.engine AND e.req_id = a.req_id
    WHERE e.inside = 0
    UNION ALL
    SELECT a.engine, a.req_id, a.step, a.block_id, MIN(r.end_step) AS end_step
    FROM acq a
    JOIN id_ends e ON e.engine = a.engine AND e.req_id = a.req_id
    LEFT JOIN release_ r ON r.engine = a.engine AND r.req_id = a.req_id AND r.end_step > a.step
    WHERE e.inside > 0
    GROUP BY a.engine, a.req_id, a.step, a.block_id
),
holds AS (
    -- a window group's block is held until its window passes it, if that comes first
    SELECT h.engine, h.req_id, h.step, h.block_id,
           CASE WHEN w.release_step IS NOT NULL
                     AND (h.end_step IS NULL OR w.release_step < h.end_step)
                THEN w.release_step ELSE h.end_step END AS end_step
    FROM holds_ h
    LEFT JOIN window_releases w ON w.engine = h.engine AND w.req_id = h.req_id
         AND w.step = h.step AND w.block_id = h.block_id
),
lagged AS (
    -- a block whose acquisitions, in step order, each start at or after the previous one's end
    -- never had two holders at once (the ends then only grow): only the other blocks need the
    -- sweep below, and in a trace without prefix sharing that is almost none of them
    SELECT engine, block_id, step,
           LAG(COALESCE(end_step, 9223372036854775807)) OVER (
               PARTITION BY engine, block_id ORDER BY step) AS prev_end
    FROM holds
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
