"""The imp catalog: idempotent install, partitions and sketches round-trip."""

from __future__ import annotations

from typing import Any

import psycopg

import pg_extensions
from sketches import catalog
from sketches.ranges import build_partition
from sketches.sketch import Sketch, SketchPart
from sketches.sql import TableRef


def test_install_is_idempotent(conn: psycopg.Connection[Any]) -> None:
    catalog.ensure_installed(conn)
    catalog.ensure_installed(conn)
    assert pg_extensions.install(conn) == []
    tables = {r[0] for r in conn.execute(
        "SELECT tablename FROM pg_tables WHERE schemaname = 'imp'").fetchall()}
    assert {"range_partitions", "sketches", "sketch_fragments"} <= tables


def test_partition_and_sketch_roundtrip(conn: psycopg.Connection[Any]) -> None:
    catalog.ensure_installed(conn)
    conn.execute("CREATE TABLE cat_t (d date)")
    conn.execute("INSERT INTO cat_t SELECT date '2020-01-01' + i FROM generate_series(0, 999) i")
    p = catalog.save_partition(conn, build_partition(conn, "public", "cat_t", "d", 20))
    assert p.id is not None and p.version == 1
    again = catalog.save_partition(conn, p)
    assert again.version == 2
    loaded = catalog.latest_partition(conn, "public", "cat_t", "d")
    assert loaded is not None and loaded.version == 2
    assert loaded.bounds == p.bounds and loaded.literals == p.literals
    assert loaded.array_literal == p.array_literal and loaded.type_name == "date"

    version = conn.execute("SELECT pg_current_snapshot()::text").fetchone()
    assert version is not None
    part = SketchPart(TableRef(0, None, "cat_t", "c", 0), "public", "d", again,
                      frozenset({1, 5, 6}))
    sketch = Sketch(None, "tmpl", "SELECT d FROM cat_t c GROUP BY d", (3, None), (part,),
                    version[0])
    sid = catalog.save_sketch(conn, sketch)
    stored = catalog.load_sketches(conn, "tmpl")
    assert [s.id for s in stored] == [sid]
    s = stored[0]
    assert s.aliases == ("c",) and s.columns == ("d",) and s.fragments == (part.fragments,)
    assert s.params == ("3", None) and s.version == version[0]
    assert s.partitions[0].bounds == again.bounds
    catalog.update_counters(conn, sid, 4, 1)
    assert catalog.load_sketches(conn, "tmpl")[0].uses == 4
    catalog.invalidate(conn, sid)
    assert catalog.load_sketches(conn, "tmpl") == []
    assert catalog.delete_sketch(conn, sid)
    assert not catalog.delete_sketch(conn, sid)

    conn.execute("SET TimeZone = 'Asia/Tokyo'")
    tokyo = catalog.save_sketch(conn, sketch)
    conn.execute("SET extra_float_digits = 0")
    assert catalog.load_sketches(conn, "tmpl") == []
    conn.execute("SET extra_float_digits = 3")   # prints floats as 1 does
    assert [s.id for s in catalog.load_sketches(conn, "tmpl")] == [tokyo]
    conn.execute("RESET TimeZone")
    assert catalog.load_sketches(conn, "tmpl") == []
    assert catalog.other_settings(conn, "tmpl") == [tokyo]
    conn.execute("RESET extra_float_digits")


def test_a_catalog_of_an_older_version_is_brought_up_to_date(
        conn: psycopg.Connection[Any]) -> None:
    """Sketches record their settings since session 25: a catalog without the column is
    installed again (idempotently) by the first query, not left failing every capture."""
    catalog.ensure_installed(conn)
    conn.execute("ALTER TABLE imp.sketches DROP COLUMN settings")
    conn.execute("UPDATE imp.schema_version SET checksum = 'older' WHERE version = 1")
    row = conn.execute("INSERT INTO imp.sketches (template, query_text, tables, attributes,"
                       " partition_ids, version) VALUES ('old', 'SELECT 1', '{}', '{}', '{}',"
                       " pg_current_snapshot()) RETURNING id").fetchone()
    assert row is not None
    assert not catalog.is_installed(conn)
    assert catalog.ensure_installed(conn)
    assert catalog.is_installed(conn)
    # loaded by no manager, its state would hold back the garbage collection: invalid
    assert conn.execute("SELECT valid FROM imp.sketches WHERE id = %s", row).fetchone() \
        == (False,)


def test_a_domain_columns_bounds_are_of_its_base_type(conn: psycopg.Connection[Any]) -> None:
    """A domain's CHECK runs on a cast to the domain, never on reading the column: bounds
    cast to it could fail in a session where the CHECK now refuses them (see
    ``ranges.CAST_TYPE``). A partition saved by an earlier version under the domain's name
    is read as of the base type, so its sketches' filters are too."""
    catalog.ensure_installed(conn)
    conn.execute("CREATE DOMAIN cat_code AS varchar(6) CHECK (VALUE <> 'x')")
    conn.execute("CREATE TABLE cat_dom (c cat_code)")
    conn.execute("INSERT INTO cat_dom SELECT 'c' || (i % 50) FROM generate_series(0, 999) i")
    built = build_partition(conn, "public", "cat_dom", "c", 8)
    assert built.type_name == "character varying(6)"
    p = catalog.save_partition(conn, built)
    conn.execute("UPDATE imp.range_partitions SET type_name = 'cat_code' WHERE id = %s",
                 (p.id,))
    loaded = catalog.load_partition(conn, p.id or 0)
    assert loaded is not None and loaded.type_name == "character varying(6)"
    assert loaded.bounds == p.bounds and loaded.literals == p.literals


def test_a_partition_whose_type_name_is_gone_is_not_loaded(conn: psycopg.Connection[Any]) -> None:
    """A partition saved under a domain's name (as earlier versions did) whose domain was
    renamed since failed to load (``type "…[]" does not exist``) in every query of the
    column, for good (found by a helper's upgrade search, session 36). It is not loaded
    now: the column's partition is built again."""
    catalog.ensure_installed(conn)
    conn.execute("CREATE DOMAIN cat_dg AS int")
    conn.execute("CREATE TABLE cat_renamed (g cat_dg)")
    conn.execute("INSERT INTO cat_renamed SELECT i % 50 FROM generate_series(0, 999) i")
    p = catalog.save_partition(conn, build_partition(conn, "public", "cat_renamed", "g", 8))
    conn.execute("UPDATE imp.range_partitions SET type_name = 'cat_dg' WHERE id = %s", (p.id,))
    assert catalog.load_partition(conn, p.id or 0) is not None
    conn.execute("ALTER DOMAIN cat_dg RENAME TO cat_dg_renamed")
    assert catalog.load_partition(conn, p.id or 0) is None
    assert catalog.latest_partition(conn, "public", "cat_renamed", "g") is None
