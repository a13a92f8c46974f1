"""Diff tests of outputs.ids_mismatch: the request ids of each step's ModelRunnerOutput against
the ids the step scheduled, pinned to exact rows of tiny hand-built traces (tinytrace)."""

from __future__ import annotations

import tinytrace as tt

PROMPT = 4  # every prompt here: one block of the look-alike's block_size 4


def new(step: int, rid: str, blocks: list[int], pos: int) -> dict:
    return {"step": step, "req_id": rid, "kind": "new", "pos": pos, "resumed": False,
            "num_scheduled_tokens": PROMPT, "num_computed_tokens": 0, "new_block_ids": [blocks]}


def cached(step: int, rid: str, computed: int, pos: int, blocks: list[int] | None = None) -> dict:
    return {"step": step, "req_id": rid, "kind": "cached", "pos": pos, "resumed": False,
            "num_scheduled_tokens": 1, "num_computed_tokens": computed,
            "num_output_tokens": computed - PROMPT + 1,
            "new_block_ids": None if blocks is None else [blocks]}


def out(step: int, rid: str, pos: int) -> dict:
    return {"step": step, "req_id": rid, "pos": pos, "sampled_token_ids": [100 + step]}


def a_and_b(steps: list[int]) -> list[dict]:
    """a and b prefill at step 0 and decode one token a step after it; rows of the steps given
    (a step left out was still run: the counts go on growing)."""
    rows = [new(0, "a", [0], 0), new(0, "b", [1], 1)]
    for step in steps[1:]:
        grow = step == 1  # the first decode token needs each request's second block
        rows += [cached(step, "a", PROMPT + step - 1, 0, [2] if grow else None),
                 cached(step, "b", PROMPT + step - 1, 1, [3] if grow else None)]
    return rows


def write(tmp_path, scheduled: list[dict], model_outputs: list[dict],
          updated: list[int], **manifest) -> None:
    """Steps as the scheduled rows list them; an update (with its output count) per step of
    `updated`."""
    listed = sorted({r["step"] for r in scheduled})
    by_step = {s: [r for r in scheduled if r["step"] == s] for s in listed}
    steps = [{"step": s, "total_num_scheduled_tokens": sum(r["num_scheduled_tokens"]
                                                           for r in by_step[s]),
              "num_new": sum(r["kind"] == "new" for r in by_step[s]),
              "num_cached": sum(r["kind"] == "cached" for r in by_step[s]),
              "num_running": len(by_step[s]), "num_waiting": 0} for s in listed]
    updates = [{"step": s, "num_outputs": sum(m["step"] == s for m in model_outputs)}
               for s in updated]
    tt.write(tmp_path, {"steps": steps, "scheduled": scheduled, "model_outputs": model_outputs,
                        "updates": updates}, **manifest)


def test_ids_mismatch_missing_and_extra(tmp_path):
    """Every step updated (the whole-trace comparison first): step 1's output lacks b (its
    token dropped), step 2's has c, which no step scheduled. In all the output has as many
    rows as the steps scheduled (six), so only the ids can tell."""
    write(tmp_path, a_and_b([0, 1, 2]),
          [out(0, "a", 0), out(0, "b", 1),
           out(1, "a", 0),
           out(2, "a", 0), out(2, "b", 1), out(2, "c", 2)],
          updated=[0, 1, 2])
    assert tt.found(tmp_path, "outputs.ids_mismatch") == [
        (1, "b", "scheduled but missing from the model output"),
        (2, "c", "in the model output but not scheduled")]


def test_ids_match_in_any_order_and_last_step_without_update(tmp_path):
    """Each updated step's output names the ids it scheduled (in an order of its own: ids are
    compared as sets); step 3 was scheduled but the trace ends before its update, so it has no
    output to compare."""
    write(tmp_path, a_and_b([0, 1, 2, 3]),
          [out(0, "b", 0), out(0, "a", 1),
           out(1, "a", 0), out(1, "b", 1),
           out(2, "b", 0), out(2, "a", 1)],
          updated=[0, 1, 2])
    assert tt.found(tmp_path, "outputs.ids_mismatch") == []


def test_ids_mismatch_with_a_dropped_step(tmp_path):
    """Step 2 was dropped by the recorder (no rows at all), so the updated steps are not one
    span and each is compared on its own: step 3's output lacks b."""
    write(tmp_path, a_and_b([0, 1, 3]),
          [out(0, "a", 0), out(0, "b", 1),
           out(1, "a", 0), out(1, "b", 1),
           out(3, "a", 0)],
          updated=[0, 1, 3], dropped_steps=[[2, 2]])
    assert tt.found(tmp_path, "outputs.ids_mismatch") == [
        (3, "b", "scheduled but missing from the model output")]


def test_ids_match_with_a_dropped_step(tmp_path):
    """The same dropped step with every output complete."""
    write(tmp_path, a_and_b([0, 1, 3]),
          [out(0, "a", 0), out(0, "b", 1),
           out(1, "a", 0), out(1, "b", 1),
           out(3, "a", 0), out(3, "b", 1)],
          updated=[0, 1, 3], dropped_steps=[[2, 2]])
    assert tt.found(tmp_path, "outputs.ids_mismatch") == []
