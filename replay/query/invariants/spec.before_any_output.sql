-- id: spec.before_any_output
-- severity: error
-- title: real draft tokens for a request that has never produced a token
-- why: Drafts are proposed from a request's previous outputs; before its first sampled token
--      none can exist, so these came from another request's state.
-- relies_on: vllm/v1/core/sched/scheduler.py Scheduler.update_draft_token_ids
-- needs: scheduled, drafts, instances, model_outputs
-- columns: engine, step, req_id, details
-- note: newly admitted decodes may carry -1 placeholder drafts, and a running request skipped for
--       budget keeps its drafts (so "not in the previous batch" alone is fine); only drafts
--       other than -1 before any sampled token of this request instance are reported.
WITH tokens_ AS (
    SELECT engine, step, req_id, UNNEST(spec_token_ids) AS token
    FROM drafts
),
real_drafts AS (
    SELECT DISTINCT engine, step, req_id FROM tokens_ WHERE token <> -1
),
drafted AS (
    SELECT d.engine, d.step, d.req_id, i.intro_step
    FROM real_drafts d
    JOIN instances i ON i.engine = d.engine AND i.req_id = d.req_id
         AND d.step >= i.intro_step AND (i.next_intro_step IS NULL OR d.step < i.next_intro_step)
),
first_sample AS (
    -- the first sampled token since each drafted instance's introduction (one of a later
    -- instance of the id comes after every draft of this one, so it cannot hide a break)
    SELECT i.engine, i.req_id, i.intro_step, MIN(m.step) AS first_step
    FROM (SELECT DISTINCT engine, req_id, intro_step FROM drafted) i
    JOIN model_outputs m ON m.engine = i.engine AND m.req_id = i.req_id
    WHERE m.step >= i.intro_step AND CARDINALITY(m.sampled_token_ids) > 0
    GROUP BY i.engine, i.req_id, i.intro_step
)
SELECT d.engine, d.step, d.req_id, 'drafts before the first sampled token' AS details
FROM drafted d
LEFT JOIN first_sample f ON f.engine = d.engine AND f.req_id = d.req_id
     AND f.intro_step = d.intro_step
WHERE f.first_step IS NULL OR f.first_step >= d.step
