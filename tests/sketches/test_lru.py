"""The bounded least-recently-used map behind the query-text caches."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sketches.lru import Lru, chars


def test_entries_go_least_recently_used_first() -> None:
    cache: Lru[str, int] = Lru(2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == 1   # now "b" is the least recently used
    cache.put("c", 3)
    assert "b" not in cache and cache.get("a") == 1 and cache.get("c") == 3


def test_characters_of_keys_and_text_values_are_bounded() -> None:
    """Long texts push out older entries; one longer than the whole bound is not kept."""
    cache: Lru[tuple[str, int], str] = Lru(100, max_chars=10)
    cache.put(("abcd", 1), "xy")
    cache.put(("efgh", 2), "zw")
    assert len(cache) == 1 and ("efgh", 2) in cache and cache.chars == 6
    cache.put(("a" * 11, 3), "")
    assert ("a" * 11, 3) not in cache and cache.chars == 6
    assert cache.pop(("efgh", 2)) == "zw" and cache.chars == 0 and len(cache) == 0


def test_chars_counts_texts_in_nested_tuples() -> None:
    assert chars(("ab", (b"cde", 7, None), "f")) == 6 and chars(3.5) == 0


@given(st.lists(st.tuples(st.sampled_from("abcdefgh"), st.text(max_size=6),
                          st.booleans()), max_size=60),
       st.integers(0, 5), st.integers(0, 12))
def test_bounds_and_contents_follow_a_reference(ops: list[tuple[str, str, bool]],
                                                max_entries: int, max_chars: int) -> None:
    """Against a plain list in recency order: the same keys and values after any sequence of
    puts and gets, never more than the bounds, and the characters counted exactly."""
    cache: Lru[str, str] = Lru(max_entries, max_chars)
    ref: list[tuple[str, str]] = []
    for key, value, is_get in ops:
        if is_get:
            found = [v for k, v in ref if k == key]
            assert cache.get(key) == (found[0] if found else None)
            if found:
                ref = [(k, v) for k, v in ref if k != key] + [(key, found[0])]
            continue
        cache.put(key, value)
        ref = [(k, v) for k, v in ref if k != key]
        if len(key) + len(value) <= max_chars and max_entries > 0:
            ref.append((key, value))
        while len(ref) > max_entries or sum(len(k) + len(v) for k, v in ref) > max_chars:
            ref.pop(0)
        assert len(cache) == len(ref) <= max_entries
        assert cache.chars == sum(len(k) + len(v) for k, v in ref) <= max_chars
    assert all(k in cache for k, _v in ref)
    assert all(cache.get(k) == v for k, v in ref)
