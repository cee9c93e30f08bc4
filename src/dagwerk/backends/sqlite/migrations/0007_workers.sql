-- dagwerk SQLite schema, version 7: worker presence.
--
-- Every worker upserts its row when it starts and at a fixed interval: the
-- plugins it serves and its queues (JSON lists; queues NULL: every queue).
-- The stall diagnosis and /healthz read it to tell that no live worker has
-- a plugin, or that no worker was seen for a while. Rows are pruned a day
-- after their last heartbeat, so the table stays one row per recent worker.

CREATE TABLE dagwerk_workers (
    worker_id TEXT PRIMARY KEY,
    plugins TEXT NOT NULL,
    queues TEXT,
    seen_at REAL NOT NULL,
    expires_at REAL NOT NULL
) WITHOUT ROWID;
