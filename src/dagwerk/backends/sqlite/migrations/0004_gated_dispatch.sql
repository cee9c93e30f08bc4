-- dagwerk SQLite schema, version 4: the gated-dispatch backstop's named
-- leases, persisted stalls (one event per stall) and first-seen wait times.

CREATE TABLE dagwerk_leases (
    name TEXT PRIMARY KEY,
    holder TEXT NOT NULL,
    expires_at REAL NOT NULL
) WITHOUT ROWID;

CREATE TABLE dagwerk_stalls (
    run_id TEXT PRIMARY KEY REFERENCES dagwerk_runs (run_id),
    reason TEXT NOT NULL,
    held_nodes TEXT NOT NULL,
    detected_at REAL NOT NULL
) WITHOUT ROWID;

CREATE TABLE dagwerk_wait_seen (
    task_id TEXT NOT NULL,
    wait_id TEXT NOT NULL,
    first_seen_at REAL NOT NULL,
    PRIMARY KEY (task_id, wait_id)
) WITHOUT ROWID;
