-- Set-based forms of the statements the store runs once per row with
-- Tx.many() (PostgreSQL only; loaded by _set_writes.py). Each block has the
-- name of the queries.sql block it stands for and does what running that
-- block once per row, in row order, does; it takes every row of the call as
-- one JSON array of objects, :rows, so a batch of N rows costs one statement
-- instead of N (the client work of a pipelined executemany is per row).
--
-- Each block has this shape, which the loader and the tests check:
--   * "-- key: col[, col]": the columns that name the row the statement
--     touches; they are a unique key of the target table (a test checks
--     that). The gateway sends the set form only when no two rows of a call
--     share a key, so no target row is touched twice by one statement (an
--     UPDATE ... FROM applies one of several matching rows, an INSERT would
--     fail on the second); otherwise the call runs one statement per row.
--   * the rows are read by one subquery, "r", of this form:
--       (SELECT ... FROM unnest(ARRAY(SELECT jsonb_array_elements(CAST(:rows AS jsonb))))
--                        [WITH ORDINALITY] AS e (v[, ord]),
--                        jsonb_to_record(e.v) AS j (column type, ...)
--        WHERE jsonb_typeof(e.v) = 'object'
--        OFFSET 0) AS r
--     whose column definition list names exactly the parameters of the
--     queries.sql block, each typed as the column it is written to or
--     compared with (text, bigint or double precision). The gateway sends
--     the set form only when every value has a JSON form that converts back
--     to the value the driver would have sent (str, int, a finite float,
--     None), and falls back to per row otherwise.
--   * an INSERT numbers the rows WITH ORDINALITY and inserts them ORDER BY
--     that number, so identity columns (seq) are assigned in row order, as
--     per-row inserts assign them. An UPDATE or DELETE touches distinct
--     rows, each as its per-row statement would, so their order does not
--     change the result.
--
-- The shape is chosen for the planner, which cannot see the rows. The
-- WHERE is always true (the gateway sends objects), but the planner takes it
-- for a selective condition and so counts one row for r (it would count 10
-- for unnest() of an array it cannot see, 100 for jsonb_to_recordset):
-- probing the target's key index once per row then beats reading the whole
-- table into a hash unless the table is tiny, whatever the table's size
-- and whether or not it has statistics. OFFSET 0 keeps r a subquery of its
-- own, and a constant that the per-row statement compares the target with
-- (t.status = 'queued') is a column of r instead: as a condition on the
-- target alone it would be estimated, on a table without statistics (a
-- young schema), to match one row, and the planner would read the table by
-- it and decode every JSON row again for each table row it found (a test
-- checks that each JSON row is decoded once).

-- name: node_insert
-- key: run_id, node_index
INSERT INTO dagwerk_nodes (run_id, node_index)
SELECT r.run_id, r.node_index
FROM (SELECT e.ord, j.*
      FROM unnest(ARRAY(SELECT jsonb_array_elements(CAST(:rows AS jsonb))))
               WITH ORDINALITY AS e (v, ord),
           jsonb_to_record(e.v) AS j (run_id text, node_index bigint)
      WHERE jsonb_typeof(e.v) = 'object'
      OFFSET 0) AS r
ORDER BY r.ord;

-- name: node_bump
-- key: run_id, node_index
UPDATE dagwerk_nodes AS n SET revision = n.revision + 1
FROM (SELECT j.*
      FROM unnest(ARRAY(SELECT jsonb_array_elements(CAST(:rows AS jsonb)))) AS e (v),
           jsonb_to_record(e.v) AS j (run_id text, node_index bigint)
      WHERE jsonb_typeof(e.v) = 'object'
      OFFSET 0) AS r
WHERE n.run_id = r.run_id AND n.node_index = r.node_index;

-- name: task_insert
-- key: task_id
INSERT INTO dagwerk_tasks
    (task_id, run_id, node_index, generation, launch_id, status, attempt_id, plan)
SELECT r.task_id, r.run_id, r.node_index, r.generation, r.launch_id, r.status, r.attempt_id,
       r.plan
FROM (SELECT e.ord, j.*
      FROM unnest(ARRAY(SELECT jsonb_array_elements(CAST(:rows AS jsonb))))
               WITH ORDINALITY AS e (v, ord),
           jsonb_to_record(e.v) AS j (
               task_id text, run_id text, node_index bigint, generation bigint,
               launch_id text, status text, attempt_id text, plan text)
      WHERE jsonb_typeof(e.v) = 'object'
      OFFSET 0) AS r
ORDER BY r.ord;

-- name: task_set_status
-- key: task_id
UPDATE dagwerk_tasks AS t
SET status = r.new, error = r.error,
    started_at = CASE WHEN r.new = 'running' THEN r.now ELSE t.started_at END,
    finished_at = CASE WHEN r.new = 'running' THEN NULL ELSE coalesce(t.finished_at, r.now) END
FROM (SELECT j.*
      FROM unnest(ARRAY(SELECT jsonb_array_elements(CAST(:rows AS jsonb)))) AS e (v),
           jsonb_to_record(e.v) AS j (
               task_id text, old text, attempt_id text, new text, error text,
               now double precision)
      WHERE jsonb_typeof(e.v) = 'object'
      OFFSET 0) AS r
WHERE t.task_id = r.task_id AND t.status = r.old AND t.attempt_id = r.attempt_id;

-- name: task_set_worker
-- key: task_id
UPDATE dagwerk_tasks AS t SET worker_id = r.worker_id
FROM (SELECT j.*, 'queued' AS queued
      FROM unnest(ARRAY(SELECT jsonb_array_elements(CAST(:rows AS jsonb)))) AS e (v),
           jsonb_to_record(e.v) AS j (task_id text, attempt_id text, worker_id text)
      WHERE jsonb_typeof(e.v) = 'object'
      OFFSET 0) AS r
WHERE t.task_id = r.task_id AND t.attempt_id = r.attempt_id AND t.status = r.queued;

-- name: task_claim
-- key: task_id
UPDATE dagwerk_tasks AS t
SET status = r.new, error = r.error, worker_id = r.worker_id, started_at = r.now,
    finished_at = NULL
FROM (SELECT j.*
      FROM unnest(ARRAY(SELECT jsonb_array_elements(CAST(:rows AS jsonb)))) AS e (v),
           jsonb_to_record(e.v) AS j (
               task_id text, old text, attempt_id text, new text, error text, worker_id text,
               now double precision)
      WHERE jsonb_typeof(e.v) = 'object'
      OFFSET 0) AS r
WHERE t.task_id = r.task_id AND t.status = r.old AND t.attempt_id = r.attempt_id;

-- name: task_complete
-- key: task_id
UPDATE dagwerk_tasks AS t
SET status = 'completed', completed_attempt_id = r.attempt_id,
    completed_launch_complete = r.launch_complete, finished_at = r.now
FROM (SELECT j.*, 'running' AS running
      FROM unnest(ARRAY(SELECT jsonb_array_elements(CAST(:rows AS jsonb)))) AS e (v),
           jsonb_to_record(e.v) AS j (
               task_id text, attempt_id text, launch_complete bigint, now double precision)
      WHERE jsonb_typeof(e.v) = 'object'
      OFFSET 0) AS r
WHERE t.task_id = r.task_id AND t.status = r.running AND t.attempt_id = r.attempt_id;

-- name: output_insert
-- key: run_id, output_id
INSERT INTO dagwerk_outputs
    (run_id, output_id, node_index, fields, data, correlation_id, routing_size)
SELECT r.run_id, r.output_id, r.node_index, r.fields, r.data, r.correlation_id, r.routing_size
FROM (SELECT e.ord, j.*
      FROM unnest(ARRAY(SELECT jsonb_array_elements(CAST(:rows AS jsonb))))
               WITH ORDINALITY AS e (v, ord),
           jsonb_to_record(e.v) AS j (
               run_id text, output_id text, node_index bigint, fields text, data text,
               correlation_id text, routing_size bigint)
      WHERE jsonb_typeof(e.v) = 'object'
      OFFSET 0) AS r
ORDER BY r.ord;

-- name: delivery_insert
-- key: delivery_id
INSERT INTO dagwerk_deliveries
    (delivery_id, task_id, attempt_id, generation, run_id, node_index, launch_id,
     queue, priority, available_at, delivery_count)
SELECT r.delivery_id, r.task_id, r.attempt_id, r.generation, r.run_id, r.node_index,
       r.launch_id, r.queue, r.priority, r.now, r.delivery_count
FROM (SELECT e.ord, j.*
      FROM unnest(ARRAY(SELECT jsonb_array_elements(CAST(:rows AS jsonb))))
               WITH ORDINALITY AS e (v, ord),
           jsonb_to_record(e.v) AS j (
               delivery_id text, task_id text, attempt_id text, generation bigint,
               run_id text, node_index bigint, launch_id text, queue text, priority bigint,
               now double precision, delivery_count bigint)
      WHERE jsonb_typeof(e.v) = 'object'
      OFFSET 0) AS r
ORDER BY r.ord;

-- name: queue_lease
-- key: delivery_id
UPDATE dagwerk_deliveries AS d
SET lease_owner = r.worker_id, lease_expires_at = r.expires, available_at = r.expires,
    delivery_count = d.delivery_count + 1
FROM (SELECT j.*
      FROM unnest(ARRAY(SELECT jsonb_array_elements(CAST(:rows AS jsonb)))) AS e (v),
           jsonb_to_record(e.v) AS j (delivery_id text, worker_id text, expires double precision)
      WHERE jsonb_typeof(e.v) = 'object'
      OFFSET 0) AS r
WHERE d.delivery_id = r.delivery_id;

-- name: queue_ack
-- key: delivery_id
DELETE FROM dagwerk_deliveries AS d
USING (SELECT j.*
       FROM unnest(ARRAY(SELECT jsonb_array_elements(CAST(:rows AS jsonb)))) AS e (v),
            jsonb_to_record(e.v) AS j (delivery_id text, worker_id text)
       WHERE jsonb_typeof(e.v) = 'object'
      OFFSET 0) AS r
WHERE d.delivery_id = r.delivery_id AND d.lease_owner = r.worker_id;

-- name: launch_count_completions
-- key: launch_id
UPDATE dagwerk_launches AS l SET completed = l.completed + r.n
FROM (SELECT j.*
      FROM unnest(ARRAY(SELECT jsonb_array_elements(CAST(:rows AS jsonb)))) AS e (v),
           jsonb_to_record(e.v) AS j (launch_id text, n bigint)
      WHERE jsonb_typeof(e.v) = 'object'
      OFFSET 0) AS r
WHERE l.launch_id = r.launch_id;
