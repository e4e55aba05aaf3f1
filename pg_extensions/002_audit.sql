-- Delta capture for incremental sketch maintenance (DESIGN §6).
--
-- Per tracked table T: an audit table imp.delta_<oid of T> (_xid xid8, _mult int, <T's columns>)
-- filled by statement-level AFTER triggers with transition tables. TRUNCATE and DDL (ALTER/DROP)
-- bump imp.tracked_tables.epoch: a sketch records the epoch it was captured under and is invalid
-- once the epoch differs (the check is the library's, in the same snapshot as its deltas).
-- Idempotent: everything is CREATE ... IF NOT EXISTS / CREATE OR REPLACE.

CREATE TABLE IF NOT EXISTS imp.tracked_tables (
    relid       oid PRIMARY KEY,
    audit_table regclass NOT NULL,
    columns     text[] NOT NULL,
    epoch       bigint NOT NULL DEFAULT 0,
    tracked_at  timestamptz NOT NULL DEFAULT now()
);
-- The table's relfilenode when its audit table was last built: an ALTER TABLE that rewrote the
-- table (ALTER COLUMN TYPE … USING, even to the same type) changed its values.
ALTER TABLE imp.tracked_tables ADD COLUMN IF NOT EXISTS filenode oid;
-- And its relnatts, which counts dropped columns too: `DROP COLUMN v, ADD COLUMN v int DEFAULT 1`
-- in one ALTER TABLE rewrites nothing (a constant default lives in the catalog) and leaves the
-- live columns as they were, yet every v changed (found: a maintained sketch kept its groups).
ALTER TABLE imp.tracked_tables ADD COLUMN IF NOT EXISTS natts int2;

-- A random token only schema imp's owner can read: imp._audit_always sets `imp.retracking` to it
-- for its own ALTER TABLE, which imp._ddl_end then leaves alone. Why not a fixed value: any
-- client could SET imp.retracking = on and switch the DDL guard off for its own ALTER TABLE
-- (found: an ALTER COLUMN TYPE … USING that changed values went unseen, and a maintained
-- sketch answered without a group, for every role).
CREATE TABLE IF NOT EXISTS imp.guard_token (token text NOT NULL);
REVOKE ALL ON imp.guard_token FROM PUBLIC;
INSERT INTO imp.guard_token (token)
SELECT md5(random()::text || clock_timestamp()::text || pg_backend_pid()::text)
WHERE NOT EXISTS (SELECT FROM imp.guard_token);

-- Epochs come from one sequence: every tracking lifetime and every bump gets a value never used
-- before, so a table untracked (e.g. its audit table dropped by hand) and tracked again can never
-- show a state built under the old tracking the epoch it was built under (with a per-row counter
-- restarting at 0, writes between untrack and re-track were invisible to the epoch check).
-- It starts at a random point in [2^40, 2^40 + 2^61): schema imp dropped and installed again
-- restarts the sequence, and from 1 the first table tracked again got the epoch a proxy still
-- held for it from before the drop — writes made in between, never audited, went unseen.
DO $$
BEGIN
    IF to_regclass('imp.epoch_seq') IS NULL THEN
        EXECUTE format('CREATE SEQUENCE imp.epoch_seq START WITH %s',
                       (2::numeric ^ 40 + floor(random() * 2::numeric ^ 61))::bigint);
    END IF;
END
$$;

-- The type an audit column of a column of type `typ` (modifier `typmod`) has: a domain's base
-- type (through domains over domains) with the modifier the column's values have. Why not the
-- domain: ALTER DOMAIN … ADD CONSTRAINT, VALIDATE CONSTRAINT and SET NOT NULL check every
-- column of the domain, and old values the audit keeps (deleted or updated since) failed them
-- where PostgreSQL alone succeeds (found: 23514 naming the audit table).
CREATE OR REPLACE FUNCTION imp._audit_type(typ oid, typmod int, OUT base oid, OUT basemod int)
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE y record;
BEGIN
    base := typ;
    basemod := typmod;
    LOOP
        SELECT t.typtype, t.typbasetype, t.typtypmod INTO y FROM pg_type t WHERE t.oid = base;
        EXIT WHEN NOT FOUND OR y.typtype <> 'd';
        IF basemod = -1 THEN
            basemod := y.typtypmod;
        END IF;
        base := y.typbasetype;
    END LOOP;
END $$;

-- Gives every column of audit table `audit` that has a domain type the domain's base type,
-- modifier and collation (imp._audit_type). At creation (empty), and at install for audit
-- tables an earlier version made (they kept the domain: ALTER DOMAIN failed on their old values,
-- and imp._audit_current, which compares through imp._audit_type, re-tracked such a table at
-- its next ALTER TABLE, a capture's SET STATISTICS included, behind its open writers).
CREATE OR REPLACE FUNCTION imp._audit_base_types(audit regclass) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE col record;
BEGIN
    FOR col IN
        SELECT a.attname, format_type(b.base, b.basemod) AS typ,
               (SELECT format(' COLLATE %I.%I', n.nspname, co.collname) FROM pg_collation co
                JOIN pg_namespace n ON n.oid = co.collnamespace
                WHERE co.oid = a.attcollation) AS coll
        FROM pg_attribute a JOIN pg_type y ON y.oid = a.atttypid,
             LATERAL imp._audit_type(a.atttypid, a.atttypmod) b
        WHERE a.attrelid = audit AND a.attnum > 0 AND NOT a.attisdropped AND y.typtype = 'd'
    LOOP
        EXECUTE format('ALTER TABLE %s ALTER COLUMN %I TYPE %s%s', audit, col.attname, col.typ,
                       coalesce(col.coll, ''));
    END LOOP;
END $$;
REVOKE ALL ON FUNCTION imp._audit_base_types(regclass) FROM PUBLIC;

-- (Re)creates the audit table of a tracked table: same columns, types and collations as T (LIKE,
-- a domain replaced by its base type: imp._audit_type), SELECT granted to exactly the roles
-- holding SELECT on T. Internal; callers hold the row lock.
CREATE OR REPLACE FUNCTION imp._create_audit_table(rel regclass) RETURNS regclass
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    audit_name text := 'delta_' || rel::oid;
    audit regclass;
    cols text[];
    grantee record;
BEGIN
    -- point the row away from the old audit table first, so the drop below is not mistaken for
    -- a hand-made drop by imp._audit_guard
    UPDATE imp.tracked_tables SET audit_table = 'imp.tracked_tables'::regclass
    WHERE relid = rel::oid;
    EXECUTE format('DROP TABLE IF EXISTS imp.%I', audit_name);
    EXECUTE format('CREATE TABLE imp.%I (_xid xid8 NOT NULL, _mult int NOT NULL, LIKE %s)',
                   audit_name, rel);
    audit := format('imp.%I', audit_name)::regclass;
    EXECUTE format('CREATE INDEX ON imp.%I (_xid)', audit_name);
    PERFORM imp._audit_table_trigger(rel, audit);
    PERFORM imp._audit_base_types(audit);
    -- LIKE copies NOT NULL constraints: harmless (rows come from T), but drop them so a later
    -- relaxation of T's constraints can never make a trigger fail.
    FOR grantee IN
        SELECT a.attname FROM pg_attribute a
        WHERE a.attrelid = audit AND a.attnum > 0 AND NOT a.attisdropped AND a.attnotnull
          AND a.attname NOT IN ('_xid', '_mult')
    LOOP
        EXECUTE format('ALTER TABLE imp.%I ALTER COLUMN %I DROP NOT NULL', audit_name,
                       grantee.attname);
    END LOOP;
    SELECT array_agg(a.attname::text ORDER BY a.attnum) INTO cols
    FROM pg_attribute a WHERE a.attrelid = rel AND a.attnum > 0 AND NOT a.attisdropped;
    EXECUTE format('REVOKE ALL ON imp.%I FROM PUBLIC', audit_name);
    FOR grantee IN
        SELECT DISTINCT acl.grantee AS role_oid
        FROM pg_class c, LATERAL aclexplode(coalesce(c.relacl, acldefault('r', c.relowner))) acl
        WHERE c.oid = rel AND acl.privilege_type = 'SELECT'
    LOOP
        IF grantee.role_oid = 0 THEN
            EXECUTE format('GRANT SELECT ON imp.%I TO PUBLIC', audit_name);
        ELSE
            EXECUTE format('GRANT SELECT ON imp.%I TO %I', audit_name,
                           (SELECT rolname FROM pg_roles WHERE oid = grantee.role_oid));
        END IF;
    END LOOP;
    UPDATE imp.tracked_tables SET audit_table = audit, columns = cols,
        filenode = (SELECT c.relfilenode FROM pg_class c WHERE c.oid = rel),
        natts = (SELECT c.relnatts FROM pg_class c WHERE c.oid = rel)
    WHERE relid = rel::oid;
    PERFORM imp._create_audit_triggers(rel, cols);
    RETURN audit;
END $$;

-- (Re)creates the audit triggers of `rel` auditing `cols` (in the triggers' arguments). CREATE OR
-- REPLACE TRIGGER sets them back to fire on origin only: callers run imp._audit_always after.
-- Triggers that already audit `cols` are left alone: replacing them takes a SHARE ROW EXCLUSIVE
-- lock, and after an ALTER TABLE that took a weaker one (SET STATISTICS, which a capture runs)
-- that waited for a writer whose audit trigger waited for the rebuilt audit table: a deadlock.
CREATE OR REPLACE FUNCTION imp._create_audit_triggers(rel regclass, cols text[]) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    args text := (SELECT coalesce(string_agg(quote_literal(c), ', ' ORDER BY i), '')
                  FROM unnest(cols) WITH ORDINALITY AS u(c, i));
    raw bytea := (SELECT coalesce(string_agg(convert_to(c, current_setting('server_encoding'))
                                             || decode('00', 'hex'), ''::bytea ORDER BY i), ''::bytea)
                  FROM unnest(cols) WITH ORDINALITY AS u(c, i));
BEGIN
    IF (SELECT count(*) FROM pg_trigger
        WHERE tgrelid = rel AND tgname IN ('imp_audit_ins', 'imp_audit_del', 'imp_audit_upd')
          AND tgargs = raw) = 3
       AND EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = rel AND tgname = 'imp_audit_trunc')
    THEN
        RETURN;
    END IF;
    EXECUTE format('CREATE OR REPLACE TRIGGER imp_audit_ins AFTER INSERT ON %s'
                   ' REFERENCING NEW TABLE AS imp_new'
                   ' FOR EACH STATEMENT EXECUTE FUNCTION imp._audit_insert(%s)', rel, args);
    EXECUTE format('CREATE OR REPLACE TRIGGER imp_audit_del AFTER DELETE ON %s'
                   ' REFERENCING OLD TABLE AS imp_old'
                   ' FOR EACH STATEMENT EXECUTE FUNCTION imp._audit_delete(%s)', rel, args);
    EXECUTE format('CREATE OR REPLACE TRIGGER imp_audit_upd AFTER UPDATE ON %s'
                   ' REFERENCING OLD TABLE AS imp_old NEW TABLE AS imp_new'
                   ' FOR EACH STATEMENT EXECUTE FUNCTION imp._audit_update(%s)', rel, args);
    EXECUTE format('CREATE OR REPLACE TRIGGER imp_audit_trunc AFTER TRUNCATE ON %s'
                   ' FOR EACH STATEMENT EXECUTE FUNCTION imp._audit_truncate()', rel);
END $$;
REVOKE ALL ON FUNCTION imp._create_audit_triggers(regclass, text[]) FROM PUBLIC;

-- The audit triggers name the audited columns in their arguments, and the audit table is
-- imp.delta_<oid of T>: they read nothing from imp.tracked_tables, whose row a REPEATABLE READ or
-- SERIALIZABLE writer whose snapshot predates the tracking cannot see (found: such a writer's
-- inserts left no audit rows, and a maintained sketch lost their group). Trigger arguments come
-- from the catalog as it is now, whatever the writer's snapshot. The INSERT runs in the trigger
-- function itself: the transition tables are visible there only.
CREATE OR REPLACE FUNCTION imp._audit_list(cols text[]) RETURNS text
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT coalesce(string_agg(', ' || quote_ident(c), '' ORDER BY i), '')
    FROM unnest(cols) WITH ORDINALITY AS u(c, i)
$$;

-- A write whose audit table is missing: the table was restored with its triggers under another
-- oid (pg_dump -t, then DROP TABLE and pg_restore: found, every INSERT, UPDATE and DELETE failed
-- with "relation imp.delta_<oid> does not exist" until a sketched query tracked the table
-- again), or the audit table was dropped with the guard off. The write goes ahead as it would
-- without the proxy and writes no audit row. Nothing can miss it: no sketch relies on a table
-- tracked under no audit table (the proxy's delta reads and its probe of imp.tracked_tables
-- find the audit table gone and capture anew; imp.track_table tracks such a table afresh,
-- under a new epoch). Why no epoch bump here: it updated one imp.tracked_tables row per write,
-- serialising the table's writers on it (found: a REPEATABLE READ writer of other rows failed
-- with 40001).
DROP FUNCTION IF EXISTS imp._audit_missing(oid);

CREATE OR REPLACE FUNCTION imp._audit_insert() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    audit text := 'delta_' || TG_RELID;
    cols text := imp._audit_list(TG_ARGV);
BEGIN
    IF to_regclass('imp.' || audit) IS NULL THEN
        RETURN NULL;
    END IF;
    EXECUTE format('INSERT INTO imp.%I (_xid, _mult%s) SELECT pg_current_xact_id(), 1%s'
                   ' FROM imp_new', audit, cols, cols);
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION imp._audit_delete() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    audit text := 'delta_' || TG_RELID;
    cols text := imp._audit_list(TG_ARGV);
BEGIN
    IF to_regclass('imp.' || audit) IS NULL THEN
        RETURN NULL;
    END IF;
    EXECUTE format('INSERT INTO imp.%I (_xid, _mult%s) SELECT pg_current_xact_id(), -1%s'
                   ' FROM imp_old', audit, cols, cols);
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION imp._audit_update() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    audit text := 'delta_' || TG_RELID;
    cols text := imp._audit_list(TG_ARGV);
BEGIN
    IF to_regclass('imp.' || audit) IS NULL THEN
        RETURN NULL;
    END IF;
    EXECUTE format('INSERT INTO imp.%I (_xid, _mult%s)'
                   ' SELECT pg_current_xact_id(), -1%s FROM imp_old'
                   ' UNION ALL SELECT pg_current_xact_id(), 1%s FROM imp_new',
                   audit, cols, cols, cols);
    RETURN NULL;
END $$;

-- Raises the serialization failure (40001: retry) of a transaction whose snapshot predates the
-- tracking of `rel`: it cannot see, so cannot bump, the table's epoch row.
CREATE OR REPLACE FUNCTION imp._tracked_after_snapshot(rel regclass) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RAISE EXCEPTION 'could not serialize access due to concurrent tracking of table %', rel
        USING ERRCODE = 'serialization_failure',
              HINT = 'The table''s change tracking began after this transaction''s snapshot.'
                     ' The transaction might succeed if retried.';
END $$;

-- Moves the epoch of tracked table `rel`: every state built under the old one is invalid. A
-- REPEATABLE READ or SERIALIZABLE transaction whose snapshot predates the tracking cannot see
-- the row to bump: it fails as a serialization failure (40001: retry), never unseen.
CREATE OR REPLACE FUNCTION imp._bump_epoch(rel oid) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    UPDATE imp.tracked_tables SET epoch = nextval('imp.epoch_seq') WHERE relid = rel;
    IF NOT FOUND THEN
        PERFORM imp._tracked_after_snapshot(rel::regclass);
    END IF;
END $$;
REVOKE ALL ON FUNCTION imp._bump_epoch(oid) FROM PUBLIC;

-- TRUNCATE writes no audit rows: it invalidates the table's sketches (transactionally).
CREATE OR REPLACE FUNCTION imp._audit_truncate() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF to_regclass('imp.delta_' || TG_RELID) IS NULL THEN   -- as imp._audit_insert
        RETURN NULL;
    END IF;
    PERFORM imp._bump_epoch(TG_RELID);
    RETURN NULL;
END $$;

-- A TRUNCATE of an audit table itself (by hand: the proxy deletes audit rows only through
-- imp.gc_deltas) removes rows states have still to apply, without moving the watermark of
-- imp.collected: it bumps the audited table's epoch (the trigger's argument), so those states
-- are invalid (found: a sketch maintained after `TRUNCATE imp.delta_<oid>` missed the rows
-- written before it).
CREATE OR REPLACE FUNCTION imp._audit_table_truncated() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM imp._bump_epoch(TG_ARGV[0]::oid);
    RETURN NULL;
END $$;

-- A DELETE or UPDATE of an audit table's rows does the same, unless imp.gc_deltas runs it:
-- its frame is on the call stack (PG_CONTEXT, whose words follow lc_messages but whose
-- signatures do not; imp is not on this function's search_path, so the name is printed
-- qualified, and only imp's owner can create a function in imp). Found by
-- a helper's search: after `DELETE FROM imp.delta_<oid>` by hand, a maintained sketch lacked a
-- group that a write before it had moved into the HAVING answer. Why the stack and not a
-- setting imp.gc_deltas sets: the imp.gc_deltas of an earlier version, installed again over
-- this one, set none, and its every collection invalidated every state.
CREATE OR REPLACE FUNCTION imp._audit_table_changed() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    stack text;
BEGIN
    GET DIAGNOSTICS stack = PG_CONTEXT;
    IF strpos(stack, ' imp.gc_deltas(regclass,pg_snapshot) ') = 0 THEN
        PERFORM imp._bump_epoch(TG_ARGV[0]::oid);
    END IF;
    RETURN NULL;
END $$;

-- The TRUNCATE trigger of audit table `audit` of `rel`, firing ALWAYS as the audit triggers do
-- (imp._audit_always; imp._ddl_end ignores the ALTER TABLE of an audit table). Internal.
CREATE OR REPLACE FUNCTION imp._audit_table_trigger(rel regclass, audit regclass) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    EXECUTE format('CREATE OR REPLACE TRIGGER imp_audit_table_trunc AFTER TRUNCATE ON %s'
                   ' FOR EACH STATEMENT EXECUTE FUNCTION imp._audit_table_truncated(%s)',
                   audit, quote_literal(rel::oid));
    EXECUTE format('ALTER TABLE %s ENABLE ALWAYS TRIGGER imp_audit_table_trunc', audit);
    EXECUTE format('CREATE OR REPLACE TRIGGER imp_audit_table_write AFTER DELETE OR UPDATE ON %s'
                   ' FOR EACH STATEMENT EXECUTE FUNCTION imp._audit_table_changed(%s)',
                   audit, quote_literal(rel::oid));
    EXECUTE format('ALTER TABLE %s ENABLE ALWAYS TRIGGER imp_audit_table_write', audit);
END $$;
REVOKE ALL ON FUNCTION imp._audit_table_trigger(regclass, regclass) FROM PUBLIC;

-- The audit triggers fire ALWAYS: with the default (origin) mode, session_replication_role =
-- replica (pg_restore, bulk loads) or ALTER TABLE … DISABLE TRIGGER made
-- writes that the audit table never saw, and incrementally maintained sketches went wrong.
-- Called at tracking and after every ALTER TABLE of a tracked table (one ALTER TABLE for all
-- triggers, only when one is not ALWAYS; imp._ddl_end ignores it).
-- Untrack a table with imp.untrack_table to stop auditing it.
CREATE OR REPLACE FUNCTION imp._audit_always(rel regclass) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE subcommands text;
BEGIN
    SELECT string_agg(format('ENABLE ALWAYS TRIGGER %I', tgname), ', ' ORDER BY tgname)
    INTO subcommands
    FROM pg_trigger WHERE tgrelid = rel AND tgname LIKE 'imp\_audit\_%' AND tgenabled <> 'A';
    IF subcommands IS NOT NULL THEN
        -- this ALTER TABLE ends in imp._ddl_end: the token tells it the change is ours
        PERFORM set_config('imp.retracking', (SELECT g.token FROM imp.guard_token g LIMIT 1),
                           true);
        EXECUTE format('ALTER TABLE %s %s', rel, subcommands);
        PERFORM set_config('imp.retracking', '', true);
    END IF;
END $$;
REVOKE ALL ON FUNCTION imp._audit_always(regclass) FROM PUBLIC;

-- Does `rel` carry every audit trigger, enabled ALWAYS? A tracking row counts only then
-- (sketches.deltas.audited says the same in the proxy's reads): a restore of schema imp from an
-- older dump of this database brought the row and the audit table back, but the restore's drop
-- of the audit table had taken the triggers (imp._audit_guard), and writes went unaudited.
CREATE OR REPLACE FUNCTION imp._audited(rel regclass) RETURNS boolean
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT count(*) = 4 FROM pg_trigger
    WHERE tgrelid = rel AND tgenabled = 'A'
      AND tgname IN ('imp_audit_ins', 'imp_audit_del', 'imp_audit_upd', 'imp_audit_trunc')
$$;

-- Starts tracking `rel` (idempotent): audit table, index on _xid, grants, triggers.
-- Returns the audit table.
CREATE OR REPLACE FUNCTION imp.track_table(rel regclass) RETURNS regclass
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    audit regclass;
BEGIN
    IF (SELECT relkind FROM pg_class WHERE oid = rel) NOT IN ('r', 'p') THEN
        RAISE EXCEPTION 'imp.track_table: % is not a table', rel
            USING ERRCODE = 'wrong_object_type';
    END IF;
    -- a schema imp restored from another database is discarded before its rows are believed
    -- (pg_extensions/004_identity.sql; also when called by hand before any proxy connected)
    IF to_regprocedure('imp.claim_identity()') IS NOT NULL THEN
        PERFORM imp.claim_identity();
    END IF;
    -- serialise concurrent track_table calls on the same table
    PERFORM pg_advisory_xact_lock(hashtext('imp.track_table'), rel::oid::int);
    SELECT t.audit_table INTO audit FROM imp.tracked_tables t WHERE t.relid = rel::oid;
    IF FOUND THEN
        IF to_regclass('imp.delta_' || rel::oid) IS NOT NULL AND imp._audited(rel) THEN
            RETURN audit;
        END IF;
        -- its audit table was dropped with the guard off (found: the table was never sketched
        -- again), or its triggers are gone (schema imp restored from an older dump of this
        -- database): tracked afresh, under a new epoch
        DELETE FROM imp.tracked_tables WHERE relid = rel::oid;
    END IF;
    INSERT INTO imp.tracked_tables (relid, audit_table, columns, epoch)
    VALUES (rel::oid, 'imp.tracked_tables'::regclass, '{}', nextval('imp.epoch_seq'));
    audit := imp._create_audit_table(rel);
    PERFORM imp._audit_always(rel);
    RETURN audit;
END $$;
REVOKE ALL ON FUNCTION imp.track_table(regclass) FROM PUBLIC;
REVOKE ALL ON FUNCTION imp._create_audit_table(regclass) FROM PUBLIC;

-- Stops tracking `rel`: drops triggers and audit table. Returns whether it was tracked.
CREATE OR REPLACE FUNCTION imp.untrack_table(rel regclass) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE t imp.tracked_tables;
BEGIN
    DELETE FROM imp.tracked_tables WHERE relid = rel::oid RETURNING * INTO t;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    EXECUTE format('DROP TRIGGER IF EXISTS imp_audit_ins ON %s', rel);
    EXECUTE format('DROP TRIGGER IF EXISTS imp_audit_del ON %s', rel);
    EXECUTE format('DROP TRIGGER IF EXISTS imp_audit_upd ON %s', rel);
    EXECUTE format('DROP TRIGGER IF EXISTS imp_audit_trunc ON %s', rel);
    EXECUTE format('DROP TABLE IF EXISTS %s', t.audit_table);
    RETURN true;
END $$;
REVOKE ALL ON FUNCTION imp.untrack_table(regclass) FROM PUBLIC;

-- The invalidation epoch of a tracked table (NULL: not tracked, e.g. dropped).
CREATE OR REPLACE FUNCTION imp.table_epoch(rel oid) RETURNS bigint
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT epoch FROM imp.tracked_tables WHERE relid = rel
$$;

-- The garbage-collection watermark of each tracked table: every audit row imp.gc_deltas ever
-- deleted had an _xid visible in `bound`. Written by imp.gc_deltas itself, in the same
-- transaction as the delete (the join of the old watermark and the bound used; a concurrent
-- collection's write to the row fails this one, 40001 under REPEATABLE READ), read by every
-- delta read's probe: a state whose version does not contain it may have lost rows it still
-- had to apply, and is rebuilt instead (found: a second proxy's state, whose persisted row the
-- first proxy dropped with the sketch, stepped over the rows the first one then collected: a
-- group missing from a HAVING answer). In the function, not its caller: an older proxy on the
-- same database calls this function without writing the watermark (found in an upgrade).
CREATE TABLE IF NOT EXISTS imp.collected (
    relid oid PRIMARY KEY,
    bound pg_snapshot NOT NULL
);

-- The snapshot in which exactly the xids visible in a or in b are visible (xmin and xmax the
-- larger, xip every listed xid below that xmax visible in neither); sketches.incremental.join.
CREATE OR REPLACE FUNCTION imp._snapshot_join(a pg_snapshot, b pg_snapshot) RETURNS pg_snapshot
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT format('%s:%s:%s', x.lo, x.hi,
                  coalesce((SELECT string_agg(u::text, ',' ORDER BY u)
                            FROM (SELECT pg_snapshot_xip(a) UNION SELECT pg_snapshot_xip(b))
                                 AS l(u)
                            WHERE u >= x.lo AND u < x.hi AND NOT pg_visible_in_snapshot(u, a)
                              AND NOT pg_visible_in_snapshot(u, b)), ''))::pg_snapshot
    FROM (SELECT greatest(pg_snapshot_xmin(a), pg_snapshot_xmin(b)) AS lo,
                 greatest(pg_snapshot_xmax(a), pg_snapshot_xmax(b)) AS hi) AS x
$$;

-- Deletes the audit rows of `rel` whose transaction is visible in `snap` (the oldest live sketch
-- version of the table: every sketch already covers them), and moves its watermark
-- (imp.collected) by `snap` when it deleted any. Returns the number of rows deleted.
-- Then ANALYZEs the audit table when it has no statistics or has outgrown them: never analysed
-- and rows deleted or more than 100 written; or now more than twice the pages its statistics
-- saw (a logarithmic number of ANALYZEs while a sketch's state holds the bound back).
-- Without statistics the planner guesses a delta (the newest xids) at a third of the table,
-- and a join's delta query (sketches/ivm/partials.py) hashes whole base tables for a few delta
-- rows: 14 ms instead of 1.7 ms for a 100-row join delta in a 5,000-row audit table (a hash
-- over a 320K-row partner). Stale statistics are harmless: beyond the histogram's last bound
-- the planner reads the actual newest xid from the _xid index. Not after every delete: an
-- ANALYZE invalidates every cached plan reading the table, so each sketch's next delta read
-- would be planned anew (0.28 of a 1.1 ms read of a 100-row delta). A table locked by DDL
-- is skipped (0 rows) until the next collection.
CREATE OR REPLACE FUNCTION imp.gc_deltas(rel regclass, snap pg_snapshot) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    audit regclass;
    n bigint;
BEGIN
    SELECT t.audit_table INTO audit FROM imp.tracked_tables t WHERE t.relid = rel::oid;
    -- gone since this transaction's snapshot (a dropped relation prints as its OID)
    IF NOT FOUND OR to_regclass(audit::text) IS DISTINCT FROM audit THEN
        RETURN 0;
    END IF;
    -- never wait for DDL on the table: the caller collects several tables in one transaction,
    -- and a DROP of several tracked tables would wait for a lock it holds (a deadlock)
    BEGIN
        EXECUTE format('LOCK TABLE %s IN ROW EXCLUSIVE MODE NOWAIT', audit);
    EXCEPTION WHEN lock_not_available THEN
        RETURN 0;
    END;
    EXECUTE format('DELETE FROM %s WHERE _xid < pg_snapshot_xmax($1)'
                   ' AND pg_visible_in_snapshot(_xid, $1)', audit) USING snap;
    GET DIAGNOSTICS n = ROW_COUNT;
    IF n > 0 THEN
        INSERT INTO imp.collected AS w (relid, bound) VALUES (rel::oid, snap)
        ON CONFLICT (relid) DO UPDATE SET bound = imp._snapshot_join(w.bound, EXCLUDED.bound);
    END IF;
    IF (SELECT CASE WHEN c.reltuples < 0
                    THEN n > 0 OR pg_stat_get_mod_since_analyze(audit) > 100
                    ELSE pg_relation_size(audit) > 2 * greatest(c.relpages, 1)
                         * current_setting('block_size')::bigint END
        FROM pg_class c WHERE c.oid = audit) THEN
        EXECUTE format('ANALYZE %s', audit);
    END IF;
    RETURN n;
END $$;
REVOKE ALL ON FUNCTION imp.gc_deltas(regclass, pg_snapshot) FROM PUBLIC;

-- DDL on tracked tables: an ALTER bumps the epoch and rebuilds the audit table and triggers with
-- the new columns (so writes keep working); DROP TABLE forgets the table. Not only ALTER TABLE:
-- ALTER VIEW / MATERIALIZED VIEW / FOREIGN TABLE … RENAME COLUMN and ALTER TYPE … RENAME
-- ATTRIBUTE work on a table too, ALTER TYPE … RENAME VALUE relabels an enum the engine holds by
-- label, DROP TYPE … CASCADE drops columns (found: a column swap through ALTER VIEW, and an
-- enum value renamed, left maintained sketches wrong).
CREATE OR REPLACE FUNCTION imp._retrack(rel regclass) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    UPDATE imp.tracked_tables SET epoch = nextval('imp.epoch_seq') WHERE relid = rel::oid;
    PERFORM imp._create_audit_table(rel);
    PERFORM imp._audit_always(rel);
END $$;
REVOKE ALL ON FUNCTION imp._retrack(regclass) FROM PUBLIC;

-- Does the audit of `rel` still hold after an ALTER of it: the same columns (names, types,
-- typmods, collations) as its audit table and no rewrite since it was built? Then nothing is
-- rebuilt and its sketches stay valid. Why: rebuilding drops the audit table, which waits for
-- every open writer of the table while the ALTER holds its own lock; after the weak ones
-- (SET STATISTICS, which a capture runs, or SET (fillfactor)) a capture stalled behind an open
-- writer and blocked every other writer, and a writer's ANALYZE deadlocked with it (found).
-- A partitioned table has no storage to compare: always rebuilt.
CREATE OR REPLACE FUNCTION imp._audit_current(rel regclass) RETURNS boolean
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT coalesce(c.relkind <> 'p' AND t.filenode = c.relfilenode AND t.natts = c.relnatts
        AND (SELECT array_agg(format('%s %s %s %s', a.attname, b.base, b.basemod,
                                     a.attcollation) ORDER BY a.attnum)
             FROM pg_attribute a, LATERAL imp._audit_type(a.atttypid, a.atttypmod) b
             WHERE a.attrelid = rel AND a.attnum > 0 AND NOT a.attisdropped)
          = (SELECT array_agg(format('%s %s %s %s', a.attname, a.atttypid, a.atttypmod,
                                     a.attcollation) ORDER BY a.attnum)
             FROM pg_attribute a WHERE a.attrelid = t.audit_table AND a.attnum > 0
               AND NOT a.attisdropped AND a.attname NOT IN ('_xid', '_mult')), false)
    FROM imp.tracked_tables t JOIN pg_class c ON c.oid = t.relid
    WHERE t.relid = rel
$$;
REVOKE ALL ON FUNCTION imp._audit_current(regclass) FROM PUBLIC;

-- A table whose audit table exists is tracked, whatever the caller's snapshot sees (to_regclass
-- reads the catalog as it is now): DDL from a REPEATABLE READ or SERIALIZABLE transaction whose
-- snapshot predates the tracking cannot bump the epoch it cannot see, and fails with 40001
-- (found: an ALTER COLUMN TYPE … USING from such a transaction went unseen, and a DROP COLUMN
-- broke every later write in the audit triggers).
CREATE OR REPLACE FUNCTION imp._ddl_end() RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE rel oid;
BEGIN
    IF current_setting('imp.retracking', true)
       = (SELECT g.token FROM imp.guard_token g LIMIT 1) THEN
        RETURN;
    END IF;
    FOR rel IN
        SELECT DISTINCT c.objid FROM pg_event_trigger_ddl_commands() c
        WHERE c.classid = 'pg_class'::regclass
          AND to_regclass(format('imp.%I', 'delta_' || c.objid)) IS NOT NULL
    LOOP
        IF NOT EXISTS (SELECT 1 FROM imp.tracked_tables t WHERE t.relid = rel) THEN
            PERFORM imp._tracked_after_snapshot(rel::regclass);
        END IF;
        IF imp._audit_current(rel::regclass) THEN
            PERFORM imp._audit_always(rel::regclass);
        ELSE
            PERFORM imp._retrack(rel::regclass);
        END IF;
    END LOOP;
    FOR rel IN
        SELECT DISTINCT t.relid FROM pg_event_trigger_ddl_commands() c
        JOIN imp.tracked_tables t
          ON (c.classid = 'pg_type'::regclass AND EXISTS (
                SELECT 1 FROM pg_attribute a JOIN pg_type ty ON ty.oid = a.atttypid
                WHERE a.attrelid = t.relid AND a.attnum > 0 AND NOT a.attisdropped
                  AND c.objid IN (ty.oid, ty.typelem, ty.typbasetype)
                UNION ALL
                SELECT 1 FROM pg_class r WHERE r.oid = t.relid AND r.reltype = c.objid))
    LOOP
        PERFORM imp._retrack(rel::regclass);
    END LOOP;
    -- a logical-replication subscription's apply worker fires only row-level triggers, so
    -- its writes never reach the audit: a table a subscription now writes gets a new epoch
    -- (its states are invalid, also when the subscription is gone by their next maintenance)
    IF tg_tag IN ('CREATE SUBSCRIPTION', 'ALTER SUBSCRIPTION') THEN
        UPDATE imp.tracked_tables t SET epoch = nextval('imp.epoch_seq')
        WHERE t.relid IN (SELECT s.srrelid FROM pg_subscription_rel s);
    END IF;
END $$;

CREATE OR REPLACE FUNCTION imp._ddl_drop() RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE t imp.tracked_tables; rel oid;
BEGIN
    FOR t IN
        SELECT tt.* FROM imp.tracked_tables tt
        WHERE tt.relid IN (SELECT d.objid FROM pg_event_trigger_dropped_objects() d
                           WHERE d.classid = 'pg_class'::regclass AND d.objsubid = 0)
    LOOP
        DELETE FROM imp.tracked_tables WHERE relid = t.relid;
        EXECUTE format('DROP TABLE IF EXISTS imp.%I', 'delta_' || t.relid);
    END LOOP;
    -- columns dropped by another command than ALTER TABLE (DROP TYPE … CASCADE)
    FOR rel IN
        SELECT DISTINCT tt.relid FROM imp.tracked_tables tt
        JOIN pg_event_trigger_dropped_objects() d
          ON d.classid = 'pg_class'::regclass AND d.objid = tt.relid AND d.objsubid > 0
    LOOP
        PERFORM imp._retrack(rel::regclass);
    END LOOP;
END $$;

-- An audit table or audit trigger dropped by hand (not through imp.untrack_table): the table's
-- deltas can no longer be trusted, and with the audit table gone every write to the base table
-- would fail in the remaining triggers. Stop tracking it (row, triggers, audit table): its sketches
-- see table_epoch() = NULL, i.e. invalid, and the next capture tracks it again.
CREATE OR REPLACE FUNCTION imp._audit_guard() RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    d record;
    rel_oid oid;
    rel regclass;
BEGIN
    FOR d IN SELECT * FROM pg_event_trigger_dropped_objects() LOOP
        rel_oid := NULL;
        IF d.classid = 'pg_class'::regclass AND d.objsubid = 0 THEN
            SELECT t.relid INTO rel_oid FROM imp.tracked_tables t
            WHERE t.audit_table::oid = d.objid;
        ELSIF d.classid = 'pg_trigger'::regclass AND d.address_names[3] IN
                ('imp_audit_ins', 'imp_audit_del', 'imp_audit_upd', 'imp_audit_trunc') THEN
            rel := to_regclass(format('%I.%I', d.address_names[1], d.address_names[2]));
            IF rel IS NOT NULL AND EXISTS (SELECT 1 FROM imp.tracked_tables t
                                           WHERE t.relid = rel::oid) THEN
                rel_oid := rel::oid;
            END IF;
        END IF;
        CONTINUE WHEN rel_oid IS NULL;
        RAISE WARNING 'imp: audit object % dropped by hand: table % is no longer tracked, '
                      'its sketches are invalid', d.object_identity, rel_oid::regclass;
        DELETE FROM imp.tracked_tables WHERE relid = rel_oid;
        rel := to_regclass(rel_oid::regclass::text);
        IF rel IS NOT NULL THEN
            EXECUTE format('DROP TRIGGER IF EXISTS imp_audit_ins ON %s', rel);
            EXECUTE format('DROP TRIGGER IF EXISTS imp_audit_del ON %s', rel);
            EXECUTE format('DROP TRIGGER IF EXISTS imp_audit_upd ON %s', rel);
            EXECUTE format('DROP TRIGGER IF EXISTS imp_audit_trunc ON %s', rel);
        END IF;
        EXECUTE format('DROP TABLE IF EXISTS imp.%I', 'delta_' || rel_oid);
    END LOOP;
END $$;

-- The event triggers that fire the functions above: ddl_guard.sql (pg_extensions.install runs
-- it after the migrations).

-- Audit triggers of an earlier version read their columns from imp.tracked_tables: give them
-- their columns as arguments (their audit tables and rows are kept).
DO $$
DECLARE t imp.tracked_tables;
BEGIN
    FOR t IN
        SELECT tt.* FROM imp.tracked_tables tt
        JOIN pg_trigger g ON g.tgrelid = tt.relid AND g.tgname = 'imp_audit_ins'
        WHERE g.tgnargs = 0 AND cardinality(tt.columns) > 0
    LOOP
        PERFORM imp._create_audit_triggers(t.relid::regclass, t.columns);
        PERFORM imp._audit_always(t.relid::regclass);
    END LOOP;
END $$;

-- Persisted state of the incremental operators of a sketch (sketches.ivm.state).
CREATE TABLE IF NOT EXISTS imp.ivm_state (
    sketch_key  text PRIMARY KEY,
    version     pg_snapshot NOT NULL,
    epochs      jsonb NOT NULL,
    state       jsonb NOT NULL,
    updated_at  timestamptz NOT NULL DEFAULT now()
);

-- Audit tables of an earlier version lack a TRUNCATE or write trigger of their own: give them both.
DO $$
DECLARE t imp.tracked_tables;
BEGIN
    FOR t IN
        SELECT tt.* FROM imp.tracked_tables tt
        WHERE tt.audit_table <> 'imp.tracked_tables'::regclass
          AND (SELECT count(*) FROM pg_trigger g WHERE g.tgrelid = tt.audit_table
               AND g.tgname IN ('imp_audit_table_trunc', 'imp_audit_table_write')) < 2
    LOOP
        PERFORM imp._audit_table_trigger(t.relid::regclass, t.audit_table);
    END LOOP;
END $$;

-- Audit tables an earlier version made with domain-typed columns get their base types now
-- (imp._audit_base_types: nothing for a table without one).
DO $$
DECLARE audit regclass;
BEGIN
    FOR audit IN
        SELECT t.audit_table FROM imp.tracked_tables t
        WHERE t.audit_table <> 'imp.tracked_tables'::regclass
    LOOP
        PERFORM imp._audit_base_types(audit);
    END LOOP;
END $$;
