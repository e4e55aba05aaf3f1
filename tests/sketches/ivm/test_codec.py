"""The JSON text of a persisted state, written a slice of a long list at a time."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from sketches.ivm.codec import Json, dumps

_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=5),
                     st.floats(allow_nan=False, allow_infinity=False))
_JSON: st.SearchStrategy[Json] = st.recursive(
    _SCALARS, lambda sub: st.one_of(
        st.lists(sub, max_size=12), st.tuples(sub, sub),
        st.dictionaries(st.text(max_size=4), sub, max_size=5),
        st.dictionaries(st.integers(), sub, max_size=3)), max_leaves=60)


@settings(max_examples=400, deadline=None)
@given(_JSON, st.integers(1, 5))
def test_the_text_is_json_dumps_text(value: Json, slice_len: int) -> None:
    """Same text as one ``json.dumps`` call (a dict with a key that is no string included:
    encoded whole), whatever the slice length."""
    assert dumps(value, slice_len) == json.dumps(value)

