-- Sketch catalog: range partitions and provenance sketches (owner: sketches.catalog).
-- Idempotent: every object is created only if missing.

CREATE SCHEMA IF NOT EXISTS imp;

-- One row per (column, version) range partition. bounds holds PostgreSQL's text output of each
-- bound (cast to type_name to compare), bounds_literal the whole array literal.
CREATE TABLE IF NOT EXISTS imp.range_partitions (
    id             bigserial PRIMARY KEY,
    schema_name    text NOT NULL,
    table_name     text NOT NULL,
    column_name    text NOT NULL,
    type_name      text NOT NULL,
    bounds         text[] NOT NULL,
    bounds_literal text NOT NULL,
    version        int NOT NULL DEFAULT 1,
    valid          boolean NOT NULL DEFAULT true,
    created_at     timestamptz NOT NULL DEFAULT now(),
    UNIQUE (schema_name, table_name, column_name, version)
);

-- One row per captured sketch. template is the pglast fingerprint of query_text; params the
-- text form of the query's parameters ($n), NULL when it has none. tables[i] ('schema.table'),
-- aliases[i] (its name in the query) and attributes[i] describe the i-th sketched table.
-- version is the snapshot the sketch is exact for. strategy names how it is kept up to date.
CREATE TABLE IF NOT EXISTS imp.sketches (
    id            bigserial PRIMARY KEY,
    template      text NOT NULL,
    query_text    text NOT NULL,
    params        text[],
    tables        text[] NOT NULL,
    attributes    text[] NOT NULL,
    partition_ids bigint[] NOT NULL,
    version       pg_snapshot NOT NULL,
    captures      int NOT NULL DEFAULT 1,
    maintenances  int NOT NULL DEFAULT 0,
    uses          int NOT NULL DEFAULT 0,
    last_used     timestamptz,
    strategy      text NOT NULL DEFAULT 'capture',
    valid         boolean NOT NULL DEFAULT true,
    created_at    timestamptz NOT NULL DEFAULT now()
);
ALTER TABLE imp.sketches ADD COLUMN IF NOT EXISTS aliases text[];
-- The oids of every table of the query as it resolved when captured (the same text names other
-- tables under another search_path); NULL in rows of older versions.
ALTER TABLE imp.sketches ADD COLUMN IF NOT EXISTS relations bigint[];
-- The Python type of each parameter (int, Decimal, float, str, bool, NoneType): params holds
-- their text, and an int 5 and a numeric 5 are other queries (5 / 2); NULL in older rows,
-- which are captured again rather than loaded.
ALTER TABLE imp.sketches ADD COLUMN IF NOT EXISTS param_types text[];
-- The session settings the sketch was captured under (sketches.catalog.CAPTURE_SETTINGS, then
-- whether extra_float_digits > 0): it is loaded only by a connection with the same ones; NULL
-- in older rows, which are captured again rather than loaded.
ALTER TABLE imp.sketches ADD COLUMN IF NOT EXISTS settings text[];
-- no manager loads those rows, and their persisted states would hold back the audit-row
-- garbage collection for ever: invalidated (the garbage collection deletes them)
UPDATE imp.sketches SET valid = false WHERE settings IS NULL AND valid;
CREATE INDEX IF NOT EXISTS sketches_template_idx ON imp.sketches (template) WHERE valid;

-- The fragment set of each sketched table of a sketch (ordinal = position in tables[]).
CREATE TABLE IF NOT EXISTS imp.sketch_fragments (
    sketch_id    bigint NOT NULL REFERENCES imp.sketches (id) ON DELETE CASCADE,
    ordinal      int NOT NULL,
    partition_id bigint NOT NULL REFERENCES imp.range_partitions (id),
    fragments    int[] NOT NULL,
    PRIMARY KEY (sketch_id, ordinal)
);
