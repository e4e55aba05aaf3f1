-- imp's DDL guard: the event triggers that tell the audit of DDL on tracked tables (ALTER …
-- TYPE, DROP, a subscription). Not a numbered migration: pg_extensions.install runs it after
-- the migrations every time. Only a superuser may create event triggers: a schema imp
-- installed by a role that is none has no guard, and without it nothing is maintained
-- incrementally (sketches.incremental.track refuses to track, and every delta read's probe
-- checks it, pg_extensions.ddl_guarded). The guard is made only when its functions belong to
-- a superuser: an event trigger runs its function for every role's DDL, so one of a lesser
-- role's functions would be that role's way to run code as a superuser (such a guard, made
-- by an earlier version, is dropped). A guard made or enabled anew (it was dropped or
-- disabled by hand, DDL meanwhile unseen) tracks every table afresh: their audit tables and
-- triggers are dropped, so every state is rebuilt.
--
-- The event triggers fire ALWAYS, as the audit triggers do: under session_replication_role =
-- replica an ALTER TABLE … ALTER COLUMN TYPE went unseen, and a bulk load between DISABLE and
-- ENABLE TRIGGER ALL left no audit rows (found: a maintained sketch kept old values). A trigger
-- from an earlier version with other tags is created again.
DO $$
DECLARE
    wanted record;
    remade boolean := false;
    rel oid;
BEGIN
    IF NOT (SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user) THEN
        RAISE WARNING 'imp: not a superuser, so no DDL guard: sketches are not maintained incrementally';
        RETURN;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_roles r ON r.oid = p.proowner
               WHERE p.oid IN ('imp._ddl_end()'::regprocedure, 'imp._ddl_drop()'::regprocedure,
                               'imp._audit_guard()'::regprocedure)
                 AND NOT r.rolsuper) THEN
        RAISE WARNING 'imp: schema imp is not a superuser''s, so no DDL guard: sketches are not maintained incrementally';
        FOR wanted IN SELECT e.evtname FROM pg_catalog.pg_event_trigger e
                      WHERE e.evtname IN ('imp_ddl_end', 'imp_ddl_drop', 'imp_audit_guard')
        LOOP
            EXECUTE format('DROP EVENT TRIGGER %I', wanted.evtname);
        END LOOP;
        RETURN;
    END IF;
    FOR wanted IN
        SELECT * FROM (VALUES
            ('imp_ddl_end', 'ddl_command_end', ARRAY['ALTER TABLE', 'ALTER VIEW',
             'ALTER MATERIALIZED VIEW', 'ALTER FOREIGN TABLE', 'ALTER TYPE', 'ALTER INDEX',
             'ALTER SEQUENCE', 'CREATE SUBSCRIPTION', 'ALTER SUBSCRIPTION'], 'imp._ddl_end'),
            ('imp_ddl_drop', 'sql_drop', ARRAY['DROP TABLE', 'DROP TYPE', 'DROP DOMAIN'],
             'imp._ddl_drop'),
            ('imp_audit_guard', 'sql_drop', ARRAY['DROP TABLE', 'DROP TRIGGER'],
             'imp._audit_guard')) AS w(name, event, tags, func)
    LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_event_trigger e WHERE e.evtname = wanted.name
                       AND e.evtenabled = 'A') THEN
            remade := true;
        END IF;
        IF EXISTS (SELECT 1 FROM pg_catalog.pg_event_trigger e WHERE e.evtname = wanted.name
                   AND e.evttags IS DISTINCT FROM wanted.tags) THEN
            EXECUTE format('DROP EVENT TRIGGER %I', wanted.name);
        END IF;
        IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_event_trigger e WHERE e.evtname = wanted.name) THEN
            EXECUTE format('CREATE EVENT TRIGGER %I ON %s WHEN TAG IN (%s) EXECUTE FUNCTION %s()',
                           wanted.name, wanted.event,
                           (SELECT string_agg(quote_literal(t), ', ') FROM unnest(wanted.tags) t),
                           wanted.func);
        END IF;
        EXECUTE format('ALTER EVENT TRIGGER %I ENABLE ALWAYS', wanted.name);
    END LOOP;
    IF remade THEN
        FOR rel IN SELECT t.relid FROM imp.tracked_tables t
                   JOIN pg_catalog.pg_class c ON c.oid = t.relid
        LOOP
            PERFORM imp.untrack_table(rel::regclass);
        END LOOP;
        DELETE FROM imp.tracked_tables;   -- rows of tables dropped while the guard was off
    END IF;
END $$;
