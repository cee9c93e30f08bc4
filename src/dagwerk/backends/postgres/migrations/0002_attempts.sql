-- dagwerk PostgreSQL schema, version 2: attempt numbers and history, lost
-- deliveries, the worker of an attempt, wait responses and run times.

ALTER TABLE dagwerk_tasks ADD COLUMN attempt_number BIGINT NOT NULL DEFAULT 1;
ALTER TABLE dagwerk_tasks ADD COLUMN worker_id TEXT;
ALTER TABLE dagwerk_tasks ADD COLUMN lost_deliveries BIGINT NOT NULL DEFAULT 0;
ALTER TABLE dagwerk_waits ADD COLUMN response TEXT;
ALTER TABLE dagwerk_runs ADD COLUMN created_at DOUBLE PRECISION NOT NULL DEFAULT 0;
ALTER TABLE dagwerk_runs ADD COLUMN finished_at DOUBLE PRECISION;
-- Creation order among runs created in the same instant (SQLite uses rowid).
ALTER TABLE dagwerk_runs ADD COLUMN seq BIGINT GENERATED ALWAYS AS IDENTITY;
CREATE INDEX dagwerk_runs_created ON dagwerk_runs (created_at, seq);

CREATE TABLE dagwerk_attempts (
    seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    task_id TEXT NOT NULL REFERENCES dagwerk_tasks (task_id),
    attempt_id TEXT NOT NULL,
    number BIGINT NOT NULL,
    status TEXT NOT NULL,
    error TEXT,
    worker_id TEXT,
    resumed_from_wait_id TEXT
);
CREATE INDEX dagwerk_attempts_task ON dagwerk_attempts (task_id, seq);
