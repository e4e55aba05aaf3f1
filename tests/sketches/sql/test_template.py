"""Template reuse: only the provably safe cases."""

from __future__ import annotations

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
