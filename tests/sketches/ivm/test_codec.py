"""The JSON text of a persisted state, its long lists written and read a slice at a time."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sketches.ivm.codec import LENGTH, SLICES, Json, dumps, loads
from sketches.ivm.errors import StateFormatError

_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=5),
                     st.floats(allow_nan=False, allow_infinity=False))
_JSON: st.SearchStrategy[Json] = st.recursive(
    _SCALARS, lambda sub: st.one_of(
        st.lists(sub, max_size=12), st.tuples(sub, sub),
        st.dictionaries(st.text(max_size=4), sub, max_size=5),
        st.dictionaries(st.integers(), sub, max_size=3)), max_leaves=60)


@settings(max_examples=400, deadline=None)
@given(_JSON, st.integers(1, 5))
def test_what_is_written_reads_back_as_json_would(value: Json, slice_len: int) -> None:
    """The value ``json.dumps`` and ``json.loads`` would give back (tuples as lists, keys as
    strings), whatever the slice length; plain JSON reads as ``json.loads`` reads it."""
    text = dumps(value, slice_len)
    assert loads(text) == json.loads(json.dumps(value))
    assert loads(json.dumps(value)) == json.loads(json.dumps(value))


def test_a_long_list_under_a_dict_is_written_in_slices() -> None:
    groups = [[[i], 1, [[[i, 1]]]] for i in range(5)]
    written = json.loads(dumps({"ops": {"aggregate": {"groups": groups, "n": [1, 2]}}}, 2))
    assert written["ops"]["aggregate"]["n"] == [1, 2]
    sliced = written["ops"]["aggregate"]["groups"]
    assert sliced[LENGTH] == 5
    assert [json.loads(t) for t in sliced[SLICES]] == [groups[0:2], groups[2:4], groups[4:]]


@pytest.mark.parametrize("sliced", [
    {SLICES: ["[1, 2]", "[3]"], LENGTH: 2},          # a slice too many (or the length cut)
    {SLICES: ["[1, 2]"], LENGTH: 3},                 # a slice lost
    {SLICES: ["[1, 2", "[3]"], LENGTH: 3},           # a slice cut in half
    {SLICES: [1, 2], LENGTH: 2},                     # no texts
    {SLICES: ['{"a": 1}'], LENGTH: 1},               # no list
    {SLICES: "[1]", LENGTH: 1},
    {SLICES: ["[1]"]},
    {SLICES: ["[1]"], LENGTH: 1, "x": 0},
])
def test_a_sliced_list_edited_by_hand_is_refused(sliced: Json) -> None:
    """A state edited by hand is a :class:`StateFormatError` (the caller builds it anew),
    never another exception (which the manager takes for an engine bug) nor a list short
    of elements."""
    with pytest.raises(StateFormatError):
        loads(json.dumps({"ops": {"groups": sliced}}))
    with pytest.raises(StateFormatError):
        loads('{"ops": ')
