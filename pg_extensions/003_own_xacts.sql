-- Transactions of the sketch manager itself (owner: sketches.manager / sketches.catalog).
--
-- The manager's own transactions write only schema imp (catalog rows, statistics), never user
-- data, so sketches.freshness may ignore them when deciding whether a sketch is still exact. It
-- kept their xids only in memory: a restarted proxy saw its predecessor's catalog writes as
-- foreign commits and recaptured every persisted sketch. Recorded here in the writing
-- transaction itself (so an aborted one leaves no row), reloaded at start, pruned below the
-- oldest valid sketch version. A missing row only costs a recapture, never a wrong answer.
CREATE TABLE IF NOT EXISTS imp.own_xacts (
    xid         xid8 PRIMARY KEY,
    recorded_at timestamptz NOT NULL DEFAULT now()
);
