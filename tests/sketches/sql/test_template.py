"""Template reuse: only the provably safe cases."""

from __future__ import annotations

from decimal import Decimal

import pytest

from sketches.sql.template import instance, reusable

HAVING = "SELECT g, count(*) FROM t WHERE v > 1 GROUP BY g HAVING count(*) > {}"


@pytest.mark.parametrize(("old", "new", "ok"), [
    (5, 5, True), (5, 7, True), (5, 4, False),
])
def test_stricter_having_threshold(old: int, new: int, ok: bool) -> None:
    assert reusable(instance(HAVING.format(old)), instance(HAVING.format(new))) is ok


def test_less_than_thresholds_go_the_other_way() -> None:
    q = "SELECT g FROM t GROUP BY g HAVING sum(v) <= {}"
    assert reusable(instance(q.format(10)), instance(q.format(3)))
    assert not reusable(instance(q.format(3)), instance(q.format(10)))


def test_constant_on_the_left_is_flipped() -> None:
    q = "SELECT g FROM t GROUP BY g HAVING {} < count(*)"
    assert reusable(instance(q.format(2)), instance(q.format(9)))
    assert not reusable(instance(q.format(9)), instance(q.format(2)))


def test_parameters_are_compared_by_value() -> None:
    q = "SELECT g FROM t WHERE v > $1 GROUP BY g HAVING count(*) > $2"
    assert reusable(instance(q, [1, 5]), instance(q, [1, 6]))
    assert not reusable(instance(q, [1, 5]), instance(q, [2, 6]))
    assert not reusable(instance(q, [1, 5]), instance(q, [1, 4]))


def test_other_constants_must_be_equal() -> None:
    assert not reusable(instance(HAVING.format(5).replace("v > 1", "v > 2")),
                        instance(HAVING.format(5)))


def test_smaller_k_only() -> None:
    q = "SELECT g, sum(v) AS s FROM t GROUP BY g ORDER BY s DESC LIMIT {}"
    assert reusable(instance(q.format(10)), instance(q.format(3)))
    assert not reusable(instance(q.format(3)), instance(q.format(10)))
    p = "SELECT * FROM t ORDER BY v LIMIT $1"
    assert reusable(instance(p, [10]), instance(p, [10]))
    assert not reusable(instance(p, [10]), instance(p, [11]))


def test_having_must_not_change_with_a_limit() -> None:
    q = "SELECT g, sum(v) AS s FROM t GROUP BY g HAVING count(*) > {} ORDER BY s DESC LIMIT 3"
    assert reusable(instance(q.format(2)), instance(q.format(2)))
    assert not reusable(instance(q.format(2)), instance(q.format(5)))


def test_different_templates_never_reuse() -> None:
    assert not reusable(instance(HAVING.format(5)),
                        instance("SELECT g, count(*) FROM t GROUP BY g HAVING sum(v) > 5"))
    assert not reusable(instance(HAVING.format(5)),
                        instance(HAVING.format(5).replace(">", ">=", 2)))


@pytest.mark.parametrize(("first", "second"), [
    (2, Decimal(2)), ("2", 2), ("2", Decimal(2)), (2.0, Decimal(2)), (2, 2.0), (True, 1),
])
def test_parameters_of_one_text_and_other_types_are_other_values(first: object,
                                                                 second: object) -> None:
    """``v / $1`` divides integers for an int ``2`` and numerics for a numeric ``2``; a
    text ``'2'`` is the type PostgreSQL infers. Found: the sketch of the int answered the
    numeric (a group missing). The same value of one type still reuses."""
    q = "SELECT g FROM t WHERE v / $1 > 2 GROUP BY g HAVING count(*) > 0"
    assert not reusable(instance(q, [first]), instance(q, [second]))
    assert not reusable(instance(q, [second]), instance(q, [first]))
    assert reusable(instance(q, [second]), instance(q, [second]))


def test_a_literal_is_never_a_parameter_marker() -> None:
    """A parameter was marked by the string constant ``'$param:<value>'``: the query with
    that literal shared a sketch with the one binding ``'x'`` (0 rows instead of 1)."""
    literal = instance("SELECT g FROM t WHERE s = '$param:x' GROUP BY g HAVING count(*) > 0")
    bound = instance("SELECT g FROM t WHERE s = $1 GROUP BY g HAVING count(*) > 0", ["x"])
    assert not reusable(literal, bound) and not reusable(bound, literal)
    assert not reusable(instance("SELECT g FROM t WHERE s = '$param:str:x' GROUP BY g"
                                 " HAVING count(*) > 0"), bound)


@pytest.mark.parametrize("k", ["2", 2.6, Decimal("2.5")])
def test_having_must_not_change_with_a_limit_kept_in_the_skeleton(k: object) -> None:
    """A LIMIT whose k is no integer stays in the skeleton, and a stricter HAVING lets other
    groups into the top k (found: ``LIMIT $2`` with 2.5 reused the sketch of a looser
    HAVING: 1 row instead of 3)."""
    q = ("SELECT g, sum(v) AS s FROM t GROUP BY g HAVING count(*) > $1"
         " ORDER BY s DESC, g LIMIT $2")
    assert not reusable(instance(q, (0, k)), instance(q, (5, k)))
    assert reusable(instance(q, (5, k)), instance(q, (5, k)))
