"""Diff tests of outputs.index_mismatch: a model output's req_id_to_index, kept in extra_fields
only when it is not req_ids enumerated, against the model output's own req_ids."""

from __future__ import annotations

import json

import tinytrace as tt


def _trace(tmp_path, index: dict):
    outs = [{"step": 0, "req_id": rid, "pos": i, "sampled_token_ids": [7]}
            for i, rid in enumerate(["a", "b", "c"])]
    extra = [{"step": 0, "owner": "ModelRunnerOutput", "field": "req_id_to_index",
              "type_name": "dict", "size": 0, "value_json": json.dumps(index)}]
    return tt.write(tmp_path, {"steps": tt.steps(1), "model_outputs": outs,
                               "extra_fields": extra})


def test_two_requests_swapped_and_one_missing(tmp_path):
    """b and c swapped (each would get the other's token); a absent (KeyError)."""
    _trace(tmp_path, {"b": 2, "c": 1})
    assert sorted(tt.found(tmp_path, "outputs.index_mismatch")) == [
        (0, "a", "in req_ids at 0, missing from req_id_to_index"),
        (0, "b", "req_id_to_index gives 2, req_ids has it at 1"),
        (0, "c", "req_id_to_index gives 1, req_ids has it at 2"),
    ]


def test_an_id_the_output_does_not_have(tmp_path):
    """A map naming a request the output never ran."""
    _trace(tmp_path, {"a": 0, "b": 1, "c": 2, "z": 3})
    assert tt.found(tmp_path, "outputs.index_mismatch") == [
        (0, "z", "req_id_to_index gives 3, req_ids has it nowhere")]


def test_a_map_that_agrees_in_another_order(tmp_path):
    """Insertion order is the model runner's business: only the values count."""
    _trace(tmp_path, {"c": 2, "a": 0, "b": 1})
    assert tt.found(tmp_path, "outputs.index_mismatch") == []
