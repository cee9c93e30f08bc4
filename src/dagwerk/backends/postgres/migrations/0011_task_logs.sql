-- dagwerk PostgreSQL schema, version 11: task logs and the submitter's trace context.
--
-- ``dagwerk_task_logs`` holds each line a plugin logged during an attempt,
-- in the order it was stored (``line_id``); lines are deleted by run
-- (``run_id`` is indexed). ``dagwerk_runs.traceparent`` is the W3C trace
-- context of the code that submitted the run (NULL without tracing).

CREATE TABLE dagwerk_task_logs (
    line_id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_id TEXT NOT NULL,
    task_id TEXT NOT NULL,
    node_index BIGINT NOT NULL,
    attempt BIGINT NOT NULL,
    at DOUBLE PRECISION NOT NULL,
    level TEXT NOT NULL,
    logger TEXT NOT NULL,
    message TEXT NOT NULL,
    traceback TEXT
);
CREATE INDEX dagwerk_task_logs_run ON dagwerk_task_logs (run_id, line_id);
CREATE INDEX dagwerk_task_logs_task ON dagwerk_task_logs (task_id, attempt, line_id);

ALTER TABLE dagwerk_runs ADD COLUMN traceparent TEXT;
