-- dagwerk SQLite schema, version 5: a wait records when it began.
--
-- ``waited_at`` (store clock seconds) is written by try_wait_task in the
-- commit that makes the task WAITING; the per-node wait timeout of gated
-- dispatch counts from it. It replaces version 4's ``dagwerk_wait_seen``
-- (when a backstop first saw the wait), which this migration folds in and
-- drops. Waits that no backstop saw are timed from this upgrade.

ALTER TABLE dagwerk_waits ADD COLUMN waited_at REAL;

UPDATE dagwerk_waits SET waited_at = COALESCE(
    (SELECT s.first_seen_at FROM dagwerk_wait_seen s
     WHERE s.task_id = dagwerk_waits.task_id AND s.wait_id = dagwerk_waits.wait_id),
    (julianday('now') - 2440587.5) * 86400.0
);

DROP TABLE dagwerk_wait_seen;
