"""Maintained sketches of sum/avg over numeric values whose scale or finiteness changes: the
maintained sketch against PostgreSQL after every write (``check``)."""

from __future__ import annotations

from collections.abc import Sequence

import psycopg
import pytest
from psycopg.errors import NumericValueOutOfRange

from sketches.errors import CaptureError
from sketches.manager import SketchManager, SketchSettings
from tests.sketches.test_maintained_types import run_checked
from tests.sketches.test_manager_ivm import check, db, fresh_table

__all__ = ["db"]   # the module fixture, used through its name

AVG_QUERY = ("SELECT g, count(*) FROM nm_avg GROUP BY g"
             " HAVING avg(w) < 1.33333333333333333")
"""avg of group 7's 1, 1, 2, … is 4/3: PostgreSQL prints 16 digits of it (passes) when the
largest scale present is 0, 20 digits (fails) when a value of scale 20 is present."""


def _run(db: str, table: str, ddl: str, fill: str, query: str,
         writes: Sequence[str]) -> dict[str, object]:
    """``query``'s maintained sketch checked after each of ``writes`` to ``table``."""
    return run_checked(db, {table: ddl}, [fill], query, None, writes, each=True)


def _avg_table(db: str, seven: str, writes: Sequence[str]) -> dict[str, object]:
    """``nm_avg``: 40 groups of 90 rows, group 7 of values 1 and 2 (one in three) but row 47
    of value ``seven``; the other groups of 5."""
    return _run(db, "nm_avg", "id serial PRIMARY KEY, g int, w numeric",
                "INSERT INTO nm_avg (g, w) SELECT i % 40, CASE WHEN i = 47 THEN " + seven
                + " WHEN i % 40 = 7 THEN (CASE WHEN i % 120 = 7 THEN 2 ELSE 1 END)"
                " ELSE 5 END FROM generate_series(1, 3600) i", AVG_QUERY, writes)


def test_avg_has_the_scale_of_the_values_present(db: str) -> None:
    """A value of scale 20 written and overwritten: the running sum kept scale 20 and the
    average its 20 digits, 0 rows instead of 1. Maintained, not recaptured: the value of
    scale 20 was counted when it came."""
    entry = _avg_table(db, "1", ["UPDATE nm_avg SET w = 1.00000000000000000000 WHERE id = 47",
                                 "UPDATE nm_avg SET w = 1 WHERE id = 47"])
    assert entry["captures"] == 1 and entry["maintenances"] == 2


def test_a_scale_present_at_the_build_is_maintained_after_its_delete(db: str) -> None:
    """The value of scale 20 was there at the capture, among values of scale 0 in its
    (group, fragment). A build that saw only the partial's largest scale could not know the
    scale of the rest once it was deleted: recaptured (before that, maintained with scale 20
    kept: 0 rows instead of 1). The build now splits avg's partials by scale and counts every
    value at its own: the delete is maintained, and so is the insert of a 1 that brings the
    group back to 4/3 with every value of scale 0 — passing only when its avg is computed at
    PostgreSQL's 16 digits, not 20."""
    entry = _avg_table(db, "1.00000000000000000000", ["DELETE FROM nm_avg WHERE id = 47",
                                                      "INSERT INTO nm_avg (g, w) VALUES (7, 1)"])
    assert entry["captures"] == 1 and entry["maintenances"] == 2, entry


def test_avg_over_a_negative_scale_numeric(db: str) -> None:
    """``numeric(7, -2)`` (PostgreSQL 15) rounds to hundreds and its values have display scale
    0; taken as the declared −2, avg's total was quantized to 78 digits: group 7's 400/3
    compared its 78 digits, not 16, with the constant and its fragment went missing."""
    entry = _run(db, "nm_neg", "id serial PRIMARY KEY, g int, c numeric(7, -2)",
                 "INSERT INTO nm_neg (g, c) SELECT i % 40, CASE WHEN i % 40 = 7 THEN 100"
                 " ELSE 500 END FROM generate_series(1, 3600) i",
                 "SELECT g, count(*) FROM nm_neg GROUP BY g"
                 " HAVING avg(c) < 133.33333333333333333",
                 ["INSERT INTO nm_neg (g, c) SELECT 7, 200 FROM generate_series(1, 45)",
                  "DELETE FROM nm_neg WHERE id > 3600"])
    assert entry["captures"] == 1 and entry["maintenances"] == 2, entry


def test_a_deleted_nan_leaves_the_sum(db: str) -> None:
    """PostgreSQL counts NaN (and ±Infinity) apart from the finite sum; the running sum kept
    NaN after the NaN row was deleted (NaN − NaN): 0 rows instead of 1 once the group's
    finite sum reached 101. Refused, recaptured: the answer is PostgreSQL's."""
    _run(db, "nm_nan", "id serial PRIMARY KEY, g int, w numeric",
         "INSERT INTO nm_nan (g, w) SELECT i % 40, 1 FROM generate_series(1, 4000) i",
         "SELECT g, count(*) FROM nm_nan GROUP BY g HAVING sum(w) = 101",
         ["INSERT INTO nm_nan (g, w) VALUES (3, 'NaN')",
          "DELETE FROM nm_nan WHERE w = 'NaN'",
          "INSERT INTO nm_nan (g, w) VALUES (3, 1)"])



def test_deletes_from_a_column_of_one_scale_are_maintained(db: str) -> None:
    """A state build that only knew each (group, fragment)'s largest scale made the scale of
    a group unknown once its values of that scale were deleted, though every value had it:
    refused, recaptured after each such delete. The build now reads whether a partial's values
    have one scale (``min(scale) = max(scale)``) and counts them all: deletes are maintained,
    and each answer is PostgreSQL's."""
    entry = _run(db, "nm_one", "id serial PRIMARY KEY, g int, w numeric",
                 "INSERT INTO nm_one (g, w) SELECT i % 40, (i % 7) + 0.25 FROM"
                 " generate_series(1, 4000) i",
                 "SELECT g, count(*) FROM nm_one GROUP BY g HAVING avg(w) < 3.2",
                 ["DELETE FROM nm_one WHERE id IN (SELECT id FROM nm_one WHERE g = 3 LIMIT 60)",
                  "DELETE FROM nm_one WHERE g = 5 AND w > 4",
                  "UPDATE nm_one SET w = w + 1.50 WHERE g = 9"])
    assert entry["captures"] == 1 and entry["maintenances"] == 3, entry


NAN_QUERIES = [
    "SELECT g, max(v) FROM nm_mm GROUP BY g ORDER BY max(v) DESC LIMIT 3",
    "SELECT g, min(v) FROM nm_mm GROUP BY g ORDER BY min(v) LIMIT 3",
    "SELECT g, count(*) FROM nm_mm GROUP BY g HAVING max(v) > 24",
    "SELECT g, max(f) FROM nm_mm GROUP BY g ORDER BY max(f) DESC LIMIT 3",
    "SELECT g, count(*) FROM nm_mm GROUP BY g HAVING min(f) < 0.3",
]


@pytest.mark.parametrize("query", NAN_QUERIES)
def test_a_nan_written_under_min_max_is_refused_not_an_engine_error(db: str,
                                                                     query: str) -> None:
    """NaN (numeric and float8) inserted into and updated over the column of a maintained
    min/max and of a top-k by max: refused (``NotMaintainable``) and recaptured, each answer
    PostgreSQL's. Found: the answers were right, but every recapture's state build sorted the
    group's values before checking them, and a Decimal NaN raised ``InvalidOperation``
    there: an engine error (``engine_errors`` 16 in a sweep), the sketch recaptured for
    good."""
    with psycopg.connect(db, autocommit=True) as c:
        fresh_table(c, "nm_mm", "id serial PRIMARY KEY, g int, v numeric, f float8",
                    "(g, v, f) SELECT i % 40, (i % 97)::numeric / 4, (i % 97)::float8 / 4"
                    " FROM generate_series(1, 2000) i")
        m = SketchManager(SketchSettings(fragments=10))
        try:
            check(m, c, query, None, as_text=("numeric", "float8"))
            for write in ["INSERT INTO nm_mm (g, v, f) SELECT 3, 'NaN', 'NaN'"
                          " FROM generate_series(1, 30)",
                          "UPDATE nm_mm SET v = 'NaN', f = 'NaN' WHERE id IN (SELECT id FROM"
                          " nm_mm WHERE g = 8 ORDER BY id LIMIT 3)",
                          "INSERT INTO nm_mm (g, v, f) VALUES (5, 60, 60)",
                          "DELETE FROM nm_mm WHERE v = 'NaN'",
                          "INSERT INTO nm_mm (g, v, f) VALUES (6, 70, 70)"]:
                c.execute(write)
                check(m, c, query, None, as_text=("numeric", "float8"))
            assert m.stats().get("engine_errors", 0) == 0, m.stats()
        finally:
            m.close()


@pytest.mark.parametrize("having", ["max(f) > sum(n)", "max(n) < 1e300::float8",
                                    "max(f) + max(n) < 100"])
def test_a_numeric_beyond_float8_beside_a_float_fails_as_in_postgresql(db: str,
                                                                       having: str) -> None:
    """PostgreSQL casts a numeric to float8 beside a float8 and fails (22003) on a value
    beyond float8's range; Python's ``float`` gave an infinity, the group failed its HAVING
    and the maintained sketch answered 0 rows instead of the error. Refused now: recaptured,
    and the capture fails as the query does. Once the value is gone, maintained again."""
    q = f"SELECT g, count(*) FROM nm_big GROUP BY g HAVING {having}"
    m = SketchManager(SketchSettings(fragments=10))
    try:
        with psycopg.connect(db, autocommit=True) as c:
            fresh_table(c, "nm_big", "id serial PRIMARY KEY, g int, f float8, n numeric",
                        "(g, f, n) SELECT i % 40, (i % 97)::float8, (i % 13)::numeric"
                        " FROM generate_series(1, 2000) i")
            assert check(m, c, q, None).decision == "capture"
            c.execute("INSERT INTO nm_big (g, f, n) VALUES (7, 1, 1e400)")
            c.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            try:
                row = c.execute("SELECT current_setting('search_path'),"
                                " pg_current_snapshot()::text").fetchone()
                assert row is not None
                with pytest.raises(CaptureError) as raised:
                    m.prepare(c, q, None, row[0], snapshot=row[1])
                assert isinstance(raised.value.__cause__, NumericValueOutOfRange)
            finally:
                c.execute("ROLLBACK")
            with pytest.raises(NumericValueOutOfRange):
                c.execute(q)
            c.execute("DELETE FROM nm_big WHERE n = 1e400")
            assert check(m, c, q, None).decision in ("use", "capture")
    finally:
        m.close()
