"""The plain-data form (vllm_contract.plain): what dumps() writes and loads() gives back."""

from __future__ import annotations

import enum
import json

from hypothesis import given, settings, strategies as st

from vllm_contract.plain import dumps, loads, to_plain


def test_int_keys_of_real_sampling_params_survive_the_trace_and_the_writer_process():
    """logit_bias maps token ids (ints) to biases: a worker reading it back from a trace must get
    ints, not the strings JSON object keys would make of them."""
    from vllm import SamplingParams

    from vllm_contract.recorder import handoff

    bias = {7: -2.0, 5: 1.5}
    sp = SamplingParams(logit_bias=bias, max_tokens=4, seed=3, stop=["x"])
    plain = to_plain(sp)
    text = dumps(sp)
    assert json.loads(text) == plain  # the plain form is what the JSON holds
    back = loads(text)
    assert back["logit_bias"] == bias
    assert all(type(k) is int for k in back["logit_bias"])
    assert back == {**plain, "logit_bias": bias}
    # the writer process gets a stand-in for the object: it must write the same JSON
    assert dumps(handoff.decode(handoff.Encoder().encode(sp))) == text
    # the same dict inserted in another order writes the same text
    assert dumps(SamplingParams(logit_bias={5: 1.5, 7: -2.0}, max_tokens=4, seed=3,
                                stop=["x"])) == text


def test_str_keyed_dicts_and_old_traces_read_as_before():
    assert dumps({"b": {"x": 1}, "a": [1, 2]}) == '{"a":[1,2],"b":{"x":1}}'
    # what a trace recorded before int keys were tagged holds: strings, and they stay strings
    assert loads('{"logit_bias":{"5":1.5},"__type__":"SamplingParams"}') == {
        "logit_bias": {"5": 1.5}, "__type__": "SamplingParams"}
    assert loads(None) is None and dumps(None) is None


def test_keys_that_are_not_strings_and_dicts_that_look_tagged_round_trip():
    class Color(enum.Enum):
        RED = 1

    assert dumps({5: 1.5, "a": 2}) == '{"__dict__":[[5,1.5],["a",2]]}'
    for value in ({(1, (2, 3)): "pair"}, {None: 0, True: 1, 2.5: 2},
                  {"__dict__": [[1, 2]]}, {"__dict__": {"__dict__": 1}},
                  {"k": {3: {4: [{5: None}]}}}):
        assert loads(dumps(value)) == value, value
    # enum keys were strings before and stay an object of strings
    assert dumps({Color.RED: 1}) == '{"Color.RED":1}'


def _plain(depth: int):
    scalars = (st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
               | st.text(max_size=5))
    if depth == 0:
        return scalars
    keys = (st.text(max_size=5) | st.integers() | st.sampled_from(["__dict__", "5", "-1"])
            | st.booleans() | st.none() | st.floats(allow_nan=False))
    inner = _plain(depth - 1)
    return (scalars | st.lists(inner, max_size=4)
            | st.dictionaries(keys, inner, max_size=4))


@settings(max_examples=300, deadline=None)
@given(_plain(4).filter(lambda v: v is not None))  # a None is no JSON: a SQL NULL
def test_plain_data_round_trips(value):
    """None, bools, ints, floats, strs, lists and dicts of them, keys of any of those scalar
    types: loads(dumps(x)) == x, and the JSON holds exactly the plain form."""
    text = dumps(value)
    assert loads(text) == value
    assert json.loads(text) == to_plain(value)
    assert text == dumps(loads(text))
