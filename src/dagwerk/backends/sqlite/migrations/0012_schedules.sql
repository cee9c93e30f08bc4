-- dagwerk SQLite schema, version 12: schedules, their tick records and the
-- keys of idempotent submits.
--
-- A schedule's definition (pipeline snapshot, input, trigger, zone, window,
-- policies) is one JSON document; tick_cursor is the newest tick the
-- scheduler has dealt with. dagwerk_schedule_fires holds one row per tick a
-- schedule turned into a run (run_id) or skipped (run_id NULL): its primary
-- key is what makes a tick a run exactly once, since the row commits with the
-- run. An idempotency key maps to the run it created until expires_at.

CREATE TABLE dagwerk_schedules (
    schedule_id TEXT PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    definition TEXT NOT NULL,
    paused INTEGER NOT NULL DEFAULT 0,
    tick_cursor REAL NOT NULL,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL
) WITHOUT ROWID;

CREATE TABLE dagwerk_schedule_fires (
    schedule_id TEXT NOT NULL,
    tick INTEGER NOT NULL,
    schedule_name TEXT NOT NULL,
    run_id TEXT,
    source TEXT NOT NULL,
    fired_at REAL NOT NULL,
    PRIMARY KEY (schedule_id, tick)
) WITHOUT ROWID;
CREATE INDEX dagwerk_schedule_fires_run ON dagwerk_schedule_fires (run_id);

CREATE TABLE dagwerk_idempotency_keys (
    key TEXT PRIMARY KEY,
    fingerprint TEXT NOT NULL,
    run_id TEXT NOT NULL,
    created_at REAL NOT NULL,
    expires_at REAL NOT NULL
) WITHOUT ROWID;
CREATE INDEX dagwerk_idempotency_keys_expiry ON dagwerk_idempotency_keys (expires_at);
