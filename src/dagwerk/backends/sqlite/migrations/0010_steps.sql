-- dagwerk SQLite schema, version 10: durable steps.
--
-- One row per step a task recorded (``ctx.step``): its name, the attempt
-- that ran it and its JSON result. Written by the task's current RUNNING
-- attempt only; the first result under a name stays. A task ID names one
-- node generation, so a replanned node's new tasks start without steps.

CREATE TABLE dagwerk_steps (
    task_id TEXT NOT NULL REFERENCES dagwerk_tasks (task_id),
    name TEXT NOT NULL,
    generation INTEGER NOT NULL,
    attempt_id TEXT NOT NULL,
    result TEXT NOT NULL,
    position INTEGER NOT NULL,
    recorded_at REAL NOT NULL,
    PRIMARY KEY (task_id, name)
) WITHOUT ROWID;
