-- dagwerk SQLite schema, version 15: the traceback of each failed attempt.
--
-- ``dagwerk_attempt_tracebacks`` holds the formatted exception of an
-- attempt whose plugin raised (bounded, with resolved secrets masked), one
-- row per attempt, written before the attempt's failure commits. A table of
-- its own, not a column of the task row: task rows are read on every
-- transition and stay small. Rows are deleted with their task.

CREATE TABLE dagwerk_attempt_tracebacks (
    task_id TEXT NOT NULL REFERENCES dagwerk_tasks (task_id),
    attempt_id TEXT NOT NULL,
    traceback TEXT NOT NULL,
    PRIMARY KEY (task_id, attempt_id)
) WITHOUT ROWID;
