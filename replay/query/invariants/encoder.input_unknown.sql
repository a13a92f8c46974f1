-- id: encoder.input_unknown
-- severity: error
-- title: an encoder input the request's introduction did not bring, or brought without its data
-- why: The worker looks each scheduled encoder input up in the mm_features its request was
--      introduced with: an index past them is an IndexError. A feature whose placeholder the
--      introduction's num_computed_tokens already covered arrives without its data
--      (strip_covered_mm_data): the worker skips it without a word, nothing is cached, and the
--      next read of its output is "Encoder cache miss".
-- relies_on: vllm/v1/worker/gpu_model_runner.py GPUModelRunner._batch_mm_inputs_from_scheduler;
--            vllm/v1/core/sched/output.py NewRequestData.from_request;
--            vllm/multimodal/utils.py strip_covered_mm_data
-- needs: scheduled, instances, mm_inputs, grants
-- columns: engine, step, req_id, details
-- note: an id with no introduction before the row is left to lifecycle.unknown_cached and
--       encoder.unscheduled. An engine without any multimodal input in the trace is taken for a
--       text-only model, whose runner never runs the encoder (supports_mm_inputs). A negative
--       index is reported too: Python takes it from the end, but no scheduler means that.
--       Models with M-RoPE keep part of a stripped feature's data, so the worker runs its
--       encoder on what is left instead of skipping it: still a feature the scheduler must not
--       schedule.
WITH with_inputs AS (
    -- only engines that brought some multimodal input are read (a text-only model's runner
    -- never reads scheduled_encoder_inputs): none at all in a text-only trace. No filter on
    -- encoder_inputs here: one below the join would decode every row's list.
    SELECT s.engine, s.step, s.req_id, s.encoder_inputs
    FROM scheduled s
    JOIN (SELECT DISTINCT engine FROM mm_inputs) m ON m.engine = s.engine
),
inputs AS (
    SELECT engine, step, req_id, UNNEST(encoder_inputs) AS idx FROM with_inputs
),
placed AS (
    -- each input with its request instance's introduction
    SELECT c.engine, c.step, c.req_id, c.idx, i.intro_step
    FROM inputs c
    JOIN instances i ON i.engine = c.engine AND i.req_id = c.req_id AND i.intro_step <= c.step
         AND (i.next_intro_step IS NULL OR c.step < i.next_intro_step)
),
brought AS (
    SELECT p.engine, p.step, p.req_id, p.idx, p.intro_step, COUNT(m.pos) AS n
    FROM placed p
    LEFT JOIN mm_inputs m ON m.engine = p.engine AND m.req_id = p.req_id
         AND m.step = p.intro_step
    GROUP BY p.engine, p.step, p.req_id, p.idx, p.intro_step
)
SELECT engine, step, req_id,
       'encoder input ' || CAST(idx AS VARCHAR) || ' outside the ' || CAST(n AS VARCHAR)
       || ' mm_features of its introduction at step ' || CAST(intro_step AS VARCHAR) AS details
FROM brought
WHERE idx < 0 OR idx >= n
UNION ALL
SELECT p.engine, p.step, p.req_id,
       'encoder input ' || CAST(p.idx AS VARCHAR) || ' (' || m.identifier || ', tokens '
       || CAST(m."offset" AS VARCHAR) || '..' || CAST(m."offset" + m.length - 1 AS VARCHAR)
       || ') came without its data: num_computed_tokens ' || CAST(g.num_computed_tokens AS VARCHAR)
       || ' at its introduction (step ' || CAST(p.intro_step AS VARCHAR) || ') covered it'
       AS details
FROM placed p
JOIN mm_inputs m ON m.engine = p.engine AND m.req_id = p.req_id AND m.step = p.intro_step
     AND m.pos = p.idx
JOIN grants g ON g.engine = p.engine AND g.req_id = p.req_id AND g.step = p.intro_step
     AND g.kind = 'new'
WHERE g.num_computed_tokens > 0 AND m."offset" + m.length <= g.num_computed_tokens
