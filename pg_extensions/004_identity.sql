-- The identity of schema imp: which database wrote its state (owner: sketches.catalog).
--
-- Much of schema imp only means something in the database it was written in: imp.own_xacts
-- holds transaction ids, imp.sketches / imp.ivm_state / imp.collected hold pg_snapshots, and
-- imp.tracked_tables, imp.collected and the audit tables imp.delta_<oid> name tables by oid.
-- pg_dump / pg_restore of schema imp into another database (another cluster, or another
-- database of the same cluster) carried all of it along (found: in a fresh cluster a restored
-- own xid was handed to a user transaction, whose write the freshness check then ignored — a
-- group missing from a HAVING answer; a restored table that got the old table's oid was
-- answered from the old table's sketch; a table whose oid matched a restored imp.tracked_tables
-- row was taken as tracked although it had no audit triggers).
--
-- imp.identity records the cluster (pg_control_system().system_identifier) and the database
-- (its oid) the state belongs to; imp.claim_identity(), which the proxy calls before it reads
-- any of that state, discards the state of another database.
-- Idempotent: CREATE ... IF NOT EXISTS / CREATE OR REPLACE.

CREATE TABLE IF NOT EXISTS imp.identity (
    one               boolean PRIMARY KEY DEFAULT true CHECK (one),
    system_identifier bigint NOT NULL,
    database_oid      oid NOT NULL,
    claimed_at        timestamptz NOT NULL DEFAULT now()
);

-- Returns true when schema imp held another database's state and it was discarded.
--
-- No row (a fresh install, or a schema of a version before this file): records this database,
-- nothing to judge (also when a concurrent first claim recorded it after the caller's
-- REPEATABLE READ snapshot, which made the INSERT fail with 40001). The same identity:
-- nothing (reads only, so a caller's transaction gets no xid from it). Another identity: in this one transaction, forgets every tracked table first
-- (so imp._audit_guard and imp._ddl_drop, which react to the drops below, find no row to act
-- on: a restored row's relid is an oid of the old database and may name another table here),
-- drops every audit trigger on a user table (found by trigger name and function, not through
-- imp.tracked_tables: a restore brings the triggers along with the tables, and they write into
-- imp.delta_<this table's oid>, which does not exist) and every audit table, deletes sketches,
-- fragments, range partitions, persisted states, own transactions and GC watermarks, records
-- this identity and warns. The UPDATE of the identity row comes first: a concurrent claim waits
-- for it and then finds nothing to do (READ COMMITTED) or fails with 40001 (REPEATABLE READ).
CREATE OR REPLACE FUNCTION imp.claim_identity() RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    sysid bigint := (SELECT s.system_identifier FROM pg_control_system() s);
    dboid oid := (SELECT d.oid FROM pg_database d WHERE d.datname = current_database());
    held imp.identity;
    obj record;
    n_tracked bigint;
    n_sketches bigint;
    n_triggers int := 0;
    n_audit int := 0;
BEGIN
    SELECT * INTO held FROM imp.identity;
    IF NOT FOUND THEN
        BEGIN
            INSERT INTO imp.identity (system_identifier, database_oid) VALUES (sysid, dboid)
            ON CONFLICT DO NOTHING;
        EXCEPTION WHEN serialization_failure THEN
            -- REPEATABLE READ: a concurrent first claim inserted the row after this snapshot;
            -- it found nothing to judge either, so neither is there anything here
            NULL;
        END;
        RETURN false;
    END IF;
    IF held.system_identifier = sysid AND held.database_oid = dboid THEN
        RETURN false;
    END IF;
    UPDATE imp.identity SET system_identifier = sysid, database_oid = dboid, claimed_at = now()
    WHERE system_identifier = held.system_identifier AND database_oid = held.database_oid;
    IF NOT FOUND THEN   -- a concurrent claim did it
        RETURN false;
    END IF;

    -- the DROP TRIGGERs below wait at most 2 s for a table's lock (a shorter lock_timeout in
    -- force is kept): the proxy's own connections set theirs per transaction, and its
    -- background thread claims in a statement of its own, which would otherwise wait behind a
    -- client's open transaction for as long as that lasts, and hold that table's readers up
    PERFORM set_config('lock_timeout', CASE WHEN current_setting('lock_timeout')::interval
                                              BETWEEN '1 us' AND '2 s'
                                            THEN current_setting('lock_timeout') ELSE '2s' END,
                       true);
    DELETE FROM imp.tracked_tables;
    GET DIAGNOSTICS n_tracked = ROW_COUNT;
    -- a trigger cloned onto a partition goes with its parent's (tgparentid)
    FOR obj IN
        SELECT g.tgrelid::regclass AS rel, g.tgname
        FROM pg_trigger g JOIN pg_proc p ON p.oid = g.tgfoid
        WHERE g.tgname IN ('imp_audit_ins', 'imp_audit_del', 'imp_audit_upd', 'imp_audit_trunc')
          AND p.pronamespace = 'imp'::regnamespace
          AND p.proname IN ('_audit_insert', '_audit_delete', '_audit_update', '_audit_truncate')
          AND NOT g.tgisinternal AND g.tgparentid = 0
        ORDER BY g.tgrelid, g.tgname
    LOOP
        EXECUTE format('DROP TRIGGER IF EXISTS %I ON %s', obj.tgname, obj.rel);
        n_triggers := n_triggers + 1;
    END LOOP;
    FOR obj IN
        SELECT c.oid::regclass AS rel FROM pg_class c
        WHERE c.relnamespace = 'imp'::regnamespace AND c.relkind IN ('r', 'p')
          AND c.relname ~ '^delta_[0-9]+$'
        ORDER BY c.oid
    LOOP
        EXECUTE format('DROP TABLE IF EXISTS %s', obj.rel);
        n_audit := n_audit + 1;
    END LOOP;
    DELETE FROM imp.ivm_state;
    DELETE FROM imp.sketches;   -- and imp.sketch_fragments (ON DELETE CASCADE)
    GET DIAGNOSTICS n_sketches = ROW_COUNT;
    DELETE FROM imp.sketch_fragments;
    DELETE FROM imp.range_partitions;
    DELETE FROM imp.own_xacts;
    DELETE FROM imp.collected;

    RAISE WARNING 'imp: schema imp was written in another database (system identifier %, '
                  'database oid %), this is system identifier %, database oid %: its state '
                  'was discarded (% sketch(es), persisted states, own transactions; % tracked '
                  'table(s) untracked, % audit table(s) and % audit trigger(s) dropped)',
                  held.system_identifier, held.database_oid, sysid, dboid, n_sketches,
                  n_tracked, n_audit, n_triggers;
    RETURN true;
END $$;
REVOKE ALL ON FUNCTION imp.claim_identity() FROM PUBLIC;

-- A fresh install (and an upgrade from a version before this file) belongs to this database.
SELECT imp.claim_identity();
