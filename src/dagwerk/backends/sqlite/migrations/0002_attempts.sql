-- dagwerk SQLite schema, version 2: attempt numbers and history, lost
-- deliveries, the worker of an attempt, wait responses and run times.

ALTER TABLE dagwerk_tasks ADD COLUMN attempt_number INTEGER NOT NULL DEFAULT 1;
ALTER TABLE dagwerk_tasks ADD COLUMN worker_id TEXT;
ALTER TABLE dagwerk_tasks ADD COLUMN lost_deliveries INTEGER NOT NULL DEFAULT 0;
ALTER TABLE dagwerk_waits ADD COLUMN response TEXT;
ALTER TABLE dagwerk_runs ADD COLUMN created_at REAL NOT NULL DEFAULT 0;
ALTER TABLE dagwerk_runs ADD COLUMN finished_at REAL;
CREATE INDEX dagwerk_runs_created ON dagwerk_runs (created_at);

CREATE TABLE dagwerk_attempts (
    seq INTEGER PRIMARY KEY,
    task_id TEXT NOT NULL REFERENCES dagwerk_tasks (task_id),
    attempt_id TEXT NOT NULL,
    number INTEGER NOT NULL,
    status TEXT NOT NULL,
    error TEXT,
    worker_id TEXT,
    resumed_from_wait_id TEXT
);
CREATE INDEX dagwerk_attempts_task ON dagwerk_attempts (task_id, seq);
