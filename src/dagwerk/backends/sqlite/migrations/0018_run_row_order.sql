-- dagwerk SQLite schema, version 18: a run's small columns come first.
--
-- SQLite stores a row's columns in order, and a value too big for its page
-- continues on a chain of overflow pages. A run's node definitions were its
-- second column, so every read of its status, epoch or node count (several
-- per completed task) walked that chain: a chain of 6,000 steps spent over
-- 1 ms per read. The table is rebuilt with the small columns first and the
-- error, the run input and the node definitions last; rows keep their rowid.
-- The copy is a table of the database file, not a temporary one, which this
-- store keeps in memory. Foreign keys stay on: the rows other tables
-- reference are gone between the drop and the copy back, which only the
-- deferred check at commit sees.

PRAGMA defer_foreign_keys = ON;
CREATE TABLE dagwerk_runs_copy AS SELECT rowid AS old_rowid, * FROM dagwerk_runs;
DROP TABLE dagwerk_runs;
CREATE TABLE dagwerk_runs (
    run_id TEXT PRIMARY KEY,
    status TEXT NOT NULL,
    -- Bumped by every terminal transition and reopen: older tokens go stale.
    epoch INTEGER NOT NULL DEFAULT 0,
    node_count INTEGER NOT NULL,
    failure_policy TEXT NOT NULL,
    retry_count INTEGER NOT NULL DEFAULT 0,
    queue TEXT NOT NULL,
    priority INTEGER NOT NULL,
    created_at REAL NOT NULL DEFAULT 0,
    finished_at REAL,
    pipeline TEXT,
    traceparent TEXT,
    -- Values that can be large last (see version 18).
    error TEXT,
    run_input TEXT NOT NULL,
    nodes TEXT NOT NULL
);
INSERT INTO dagwerk_runs
    (rowid, run_id, status, epoch, node_count, failure_policy, retry_count, queue, priority,
     created_at, finished_at, pipeline, traceparent, error, run_input, nodes)
SELECT old_rowid, run_id, status, epoch, node_count, failure_policy, retry_count, queue, priority,
       created_at, finished_at, pipeline, traceparent, error, run_input, nodes
FROM dagwerk_runs_copy ORDER BY old_rowid;
DROP TABLE dagwerk_runs_copy;
CREATE INDEX dagwerk_runs_created ON dagwerk_runs (created_at);
CREATE INDEX dagwerk_runs_created_status ON dagwerk_runs (created_at, status);
CREATE INDEX dagwerk_runs_finished ON dagwerk_runs (finished_at, run_id)
    WHERE finished_at IS NOT NULL;
