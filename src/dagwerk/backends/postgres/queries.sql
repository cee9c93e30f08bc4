-- Every statement the SQL store runs on PostgreSQL, one named block per
-- operation (the same names as sqlite/queries.sql; a test compares the sets).
-- Parameters use the :name style; casts are spelled CAST(x AS t), never x::t.
-- Lists arrive as JSON text and are expanded once, with
-- "= ANY (ARRAY(SELECT jsonb_array_elements_text(...)))": an uncorrelated
-- ARRAY() is evaluated once, where "IN (SELECT ...)" may re-parse the JSON
-- for every row it filters (quadratic for a 10,000-task launch). "= ANY" is
-- only linear where it is an index condition (a key looked up per element);
-- a long list that may meet many rows fetched by another index (a run's
-- outputs) is a DISTINCT relation joined to them instead (outputs_resolve).
--
-- Locking. Write transactions run at READ COMMITTED, so every statement sees
-- the commits that came before it. The run row is the serialisation boundary
-- of everything that belongs to a run: a block that opens a write transition
-- starts with a *lock prelude*, one or more statements before the block's
-- last that lock the run row, in one of three modes:
-- * claim (FOR KEY SHARE; tasks_claimable_many): a batch claim moves QUEUED
--   tasks to RUNNING. Claims share the run with each other and with
--   completions; they lock the task rows they read (in task order), so two
--   claims of one task serialise there;
-- * completion (FOR NO KEY UPDATE; tasks_get_owned_many, task_get_completing):
--   accepting results writes outputs, counters and the completed tasks' own
--   rows, nothing a claim reads; completions serialise with each other;
-- * exclusive (FOR UPDATE; every other prelude): anything else, including all
--   that changes what a claim depends on (the run's status, a node's
--   generation, a launch's activity, a QUEUED task's attempt), waits for and
--   shuts out claims and completions.
-- A transaction never takes a stronger mode after a weaker one (the gateway
-- checks): an upgrade waits for the sharers, which could wait for it. A unit
-- of work (PostgresGateway.unit: a completion that is expected to end its
-- launch, with the launches of the reconcile after it) runs its first
-- locking block in exclusive mode, whatever that block's own mode, so that
-- nothing later in it needs a stronger lock.
-- Unlike FOR UPDATE, the two weaker modes do not block the foreign-key checks
-- of rows that reference the run. The gateway runs preludes in write
-- transactions only; read transactions are REPEATABLE READ snapshots and take
-- no locks. The queue takes row locks instead: dequeue skips rows other
-- workers hold (FOR UPDATE SKIP LOCKED), so workers never wait on each other
-- there.
--
-- Lineages. A child run's transactions reach its parent (a finished child
-- resumes the waiting parent task) and a parent's reach its children (a
-- stop cancels them), so two run rows of one lineage are locked in both
-- orders. Every run-row prelude therefore first locks the *root* run named
-- by the run's dagwerk_run_links row (nothing for a root run): all writers
-- of one lineage serialise on its root before they lock any other run row
-- or budget account of the lineage, and no lock cycle can form.

-- name: run_insert
INSERT INTO dagwerk_runs
    (run_id, nodes, run_input, failure_policy, status, node_count, queue, priority, created_at,
     pipeline)
VALUES (:run_id, :nodes, :run_input, :failure_policy, 'pending', :node_count, :queue, :priority,
        :now, :pipeline)
ON CONFLICT (run_id) DO NOTHING;

-- name: node_insert
INSERT INTO dagwerk_nodes (run_id, node_index) VALUES (:run_id, :node_index);

-- name: run_status
SELECT 1 FROM dagwerk_runs WHERE run_id = (
    SELECT root_run_id FROM dagwerk_run_links WHERE run_id = :run_id
) FOR NO KEY UPDATE;
SELECT 1 FROM dagwerk_runs WHERE run_id = :run_id FOR UPDATE;
SELECT status FROM dagwerk_runs WHERE run_id = :run_id;

-- name: run_get
SELECT 1 FROM dagwerk_runs WHERE run_id = (
    SELECT root_run_id FROM dagwerk_run_links WHERE run_id = :run_id
) FOR NO KEY UPDATE;
SELECT 1 FROM dagwerk_runs WHERE run_id = :run_id FOR UPDATE;
SELECT * FROM dagwerk_runs WHERE run_id = :run_id;

-- name: run_get_locked
-- run_get without a lock prelude, for a transaction that holds the run's lock.
SELECT * FROM dagwerk_runs WHERE run_id = :run_id;

-- name: run_record
SELECT r.run_id, r.status, r.failure_policy, r.retry_count, r.error, r.node_count,
       r.created_at, r.finished_at, r.pipeline,
       (SELECT count(*) FROM dagwerk_launches l
         WHERE l.run_id = r.run_id AND l.active = 1
           AND (l.disposition <> 'launched' OR l.completed = l.task_count)) AS settled_nodes
FROM dagwerk_runs r WHERE r.run_id = :run_id;

-- name: runs_list
SELECT r.run_id, r.status, r.failure_policy, r.retry_count, r.error, r.node_count,
       r.created_at, r.finished_at, r.pipeline,
       (SELECT count(*) FROM dagwerk_launches l
         WHERE l.run_id = r.run_id AND l.active = 1
           AND (l.disposition <> 'launched' OR l.completed = l.task_count)) AS settled_nodes
FROM dagwerk_runs r WHERE (CAST(:status AS text) IS NULL OR r.status = :status)
ORDER BY r.created_at DESC, r.seq DESC LIMIT :limit;

-- name: run_set_status
UPDATE dagwerk_runs SET status = :new WHERE run_id = :run_id AND status = :old;

-- name: run_terminate
UPDATE dagwerk_runs SET status = :new, error = :error, epoch = epoch + 1, finished_at = :now
WHERE run_id = :run_id AND status = :old;

-- name: run_rerun
UPDATE dagwerk_runs
SET status = 'running', error = NULL, retry_count = retry_count + 1, epoch = epoch + 1,
    finished_at = NULL
WHERE run_id = :run_id;

-- name: run_reopen
UPDATE dagwerk_runs
SET status = 'running', error = NULL, retry_count = retry_count + 1, epoch = epoch + 1,
    finished_at = NULL
WHERE run_id = :run_id AND status = :old;

-- name: task_status_counts
SELECT status, count(*) AS n FROM dagwerk_tasks
WHERE run_id = :run_id AND invalidated = 0 GROUP BY status;

-- name: run_failures
-- The active failed launches and FAILED/CRASHED tasks of a run in one round trip.
SELECT 'launch' AS kind, launch_id AS id, CAST(NULL AS TEXT) AS attempt_id, node_index,
       generation, CAST(NULL AS TEXT) AS status, 0 AS seq
FROM dagwerk_launches WHERE run_id = :run_id AND active = 1 AND disposition = 'failed'
UNION ALL
SELECT 'task', task_id, attempt_id, node_index, generation, status, seq
FROM dagwerk_tasks
WHERE run_id = :run_id AND invalidated = 0 AND status IN ('failed', 'crashed');

-- name: failed_nodes
SELECT node_index FROM dagwerk_launches
WHERE run_id = :run_id AND active = 1 AND disposition = 'failed'
UNION
SELECT node_index FROM dagwerk_tasks
WHERE run_id = :run_id AND invalidated = 0 AND status IN ('failed', 'crashed');

-- name: nodes_of_run
SELECT node_index, generation, revision FROM dagwerk_nodes WHERE run_id = :run_id;

-- name: node_bump
UPDATE dagwerk_nodes SET revision = revision + 1
WHERE run_id = :run_id AND node_index = :node_index;

-- name: node_advance_generation
UPDATE dagwerk_nodes SET generation = generation + 1, revision = revision + 1
WHERE run_id = :run_id AND node_index = :node_index;

-- name: launch_completion_summary
SELECT count(*) AS active,
       coalesce(sum(CASE WHEN disposition NOT IN ('failed', 'upstream_failed')
                          AND (disposition <> 'launched' OR completed = task_count)
                         THEN 1 ELSE 0 END), 0) AS good
FROM dagwerk_launches WHERE run_id = :run_id AND active = 1;

-- name: launch_active
SELECT * FROM dagwerk_launches WHERE run_id = :run_id AND node_index = :node_index AND active = 1;

-- name: launches_active
SELECT * FROM dagwerk_launches WHERE run_id = :run_id AND active = 1 ORDER BY node_index;

-- name: launch_task_ids
SELECT task_id FROM dagwerk_tasks WHERE launch_id = :launch_id ORDER BY seq;

-- name: launch_task_ids_of_run
-- The task IDs of every active launch of a run in one round trip.
SELECT t.launch_id, t.task_id
FROM dagwerk_launches l JOIN dagwerk_tasks t ON t.launch_id = l.launch_id
WHERE l.run_id = :run_id AND l.active = 1
ORDER BY t.seq;

-- name: launches_of_nodes
-- The active launches of some nodes of a run (a JSON list of node indices).
SELECT launch_id, node_index, generation, disposition, task_count, completed
FROM dagwerk_launches
WHERE run_id = :run_id AND active = 1
  AND node_index = ANY (ARRAY(
      SELECT CAST(jsonb_array_elements_text(CAST(:nodes AS jsonb)) AS bigint)));

-- name: frontier_of_nodes
-- Generation and revision of some nodes of a run (a JSON list of node
-- indices), each with its active launch's columns (NULL without one).
SELECT n.node_index, n.generation AS node_generation, n.revision,
       l.launch_id, l.generation, l.disposition, l.task_count, l.completed
FROM dagwerk_nodes n
LEFT JOIN dagwerk_launches l
       ON l.run_id = n.run_id AND l.node_index = n.node_index AND l.active = 1
WHERE n.run_id = :run_id
  AND n.node_index = ANY (ARRAY(
      SELECT CAST(jsonb_array_elements_text(CAST(:nodes AS jsonb)) AS bigint)));

-- name: nodes_of_indices
-- Generation and revision of some nodes of a run (a JSON list of node indices).
SELECT node_index, generation, revision FROM dagwerk_nodes
WHERE run_id = :run_id
  AND node_index = ANY (ARRAY(
      SELECT CAST(jsonb_array_elements_text(CAST(:nodes AS jsonb)) AS bigint)));

-- name: run_head
-- The run row without its node definitions (the prelude is run_get's).
SELECT 1 FROM dagwerk_runs WHERE run_id = (
    SELECT root_run_id FROM dagwerk_run_links WHERE run_id = :run_id
) FOR NO KEY UPDATE;
SELECT 1 FROM dagwerk_runs WHERE run_id = :run_id FOR UPDATE;
SELECT run_id, status, epoch, node_count, run_input FROM dagwerk_runs WHERE run_id = :run_id;

-- name: run_frontier
-- Status, complete launches (counted only when :count = 1: it reads every
-- launch of the run) and whether anything failed, for a targeted reconcile;
-- with run_head's columns, which a planning snapshot that follows in the same
-- SQLite unit of work reuses.
SELECT r.run_id, r.status, r.epoch, r.node_count, r.run_input,
       CASE WHEN :count = 1 THEN
           (SELECT count(*) FROM dagwerk_launches l
             WHERE l.run_id = r.run_id AND l.active = 1
               AND (l.disposition <> 'launched' OR l.completed = l.task_count))
       END AS complete_nodes,
       (EXISTS (SELECT 1 FROM dagwerk_launches l
                 WHERE l.run_id = r.run_id AND l.active = 1 AND l.disposition = 'failed')
        OR EXISTS (SELECT 1 FROM dagwerk_tasks t
                    WHERE t.run_id = r.run_id AND t.invalidated = 0
                      AND t.status IN ('failed', 'crashed'))) AS has_failure
FROM dagwerk_runs r WHERE r.run_id = :run_id;

-- name: launch_insert
INSERT INTO dagwerk_launches
    (launch_id, run_id, node_index, generation, plugin, disposition, error, task_count)
VALUES (:launch_id, :run_id, :node_index, :generation, :plugin, :disposition, :error, :task_count);

-- name: launch_deactivate
UPDATE dagwerk_launches SET active = 0
WHERE run_id = :run_id AND node_index = :node_index AND active = 1;

-- name: launch_count_completion
UPDATE dagwerk_launches SET completed = completed + 1 WHERE launch_id = :launch_id;

-- name: task_insert
INSERT INTO dagwerk_tasks
    (task_id, run_id, node_index, generation, launch_id, status, attempt_id, plan)
VALUES (:task_id, :run_id, :node_index, :generation, :launch_id, :status, :attempt_id, :plan);

-- name: task_insert_claimed
-- task_insert of a task the launch claims for the next claim of its thread
-- as it is written: RUNNING, with the claiming worker (see sql/_ahead.py).
-- The launch holds its run exclusively.
INSERT INTO dagwerk_tasks
    (task_id, run_id, node_index, generation, launch_id, status, attempt_id, plan, worker_id,
     started_at)
VALUES (:task_id, :run_id, :node_index, :generation, :launch_id, :status, :attempt_id, :plan,
        :worker_id, :started_at);

-- name: task_get_owned
SELECT 1 FROM dagwerk_runs WHERE run_id = (
    SELECT root_run_id FROM dagwerk_run_links WHERE run_id = (SELECT run_id FROM dagwerk_tasks WHERE task_id = :task_id)
) FOR NO KEY UPDATE;
SELECT 1 FROM dagwerk_runs
WHERE run_id = (SELECT run_id FROM dagwerk_tasks WHERE task_id = :task_id) FOR UPDATE;
SELECT t.*, r.status AS run_status,
       (t.invalidated = 0 AND n.generation = t.generation AND l.launch_id IS NOT NULL) AS owned
FROM dagwerk_tasks t
JOIN dagwerk_runs r ON r.run_id = t.run_id
JOIN dagwerk_nodes n ON n.run_id = t.run_id AND n.node_index = t.node_index
LEFT JOIN dagwerk_launches l
       ON l.launch_id = t.launch_id AND l.active = 1 AND l.generation = t.generation
WHERE t.task_id = :task_id;

-- name: task_get_completing
-- task_get_owned in completion mode (see Locking above), with the counter of
-- the task's launch: every write of a counter takes its run in completion
-- mode, so the value read after the prelude stays until this commits.
SELECT 1 FROM dagwerk_runs WHERE run_id = (
    SELECT root_run_id FROM dagwerk_run_links WHERE run_id = (SELECT run_id FROM dagwerk_tasks WHERE task_id = :task_id)
) FOR NO KEY UPDATE;
SELECT 1 FROM dagwerk_runs
WHERE run_id = (SELECT run_id FROM dagwerk_tasks WHERE task_id = :task_id) FOR NO KEY UPDATE;
SELECT t.*, r.status AS run_status,
       (t.invalidated = 0 AND n.generation = t.generation AND l.launch_id IS NOT NULL) AS owned,
       l.completed AS launch_completed, l.task_count AS launch_task_count
FROM dagwerk_tasks t
JOIN dagwerk_runs r ON r.run_id = t.run_id
JOIN dagwerk_nodes n ON n.run_id = t.run_id AND n.node_index = t.node_index
LEFT JOIN dagwerk_launches l
       ON l.launch_id = t.launch_id AND l.active = 1 AND l.generation = t.generation
WHERE t.task_id = :task_id;

-- name: tasks_get_owned_many
-- task_get_completing for a list of one run's tasks.
SELECT 1 FROM dagwerk_runs WHERE run_id = (
    SELECT root_run_id FROM dagwerk_run_links WHERE run_id = (SELECT run_id FROM dagwerk_tasks WHERE task_id = :first)
) FOR NO KEY UPDATE;
SELECT 1 FROM dagwerk_runs
WHERE run_id = (SELECT run_id FROM dagwerk_tasks WHERE task_id = :first) FOR NO KEY UPDATE;
SELECT t.*, r.status AS run_status,
       (t.invalidated = 0 AND n.generation = t.generation AND l.launch_id IS NOT NULL) AS owned,
       l.completed AS launch_completed, l.task_count AS launch_task_count
FROM dagwerk_tasks t
JOIN dagwerk_runs r ON r.run_id = t.run_id
JOIN dagwerk_nodes n ON n.run_id = t.run_id AND n.node_index = t.node_index
LEFT JOIN dagwerk_launches l
       ON l.launch_id = t.launch_id AND l.active = 1 AND l.generation = t.generation
WHERE t.task_id = ANY (ARRAY(SELECT jsonb_array_elements_text(CAST(:ids AS jsonb))))
  AND CAST(:first AS text) IS NOT NULL;

-- name: tasks_claimable_many
-- tasks_get_owned_many in claim mode (see Locking above): the run rows are
-- shared, the tasks' rows locked, in task order (two claims of one task wait
-- for each other, and the later sees the earlier's claim). The launch's size
-- tells the worker whether a completion will end the launch.
SELECT 1 FROM dagwerk_runs WHERE run_id = (
    SELECT root_run_id FROM dagwerk_run_links WHERE run_id = (SELECT run_id FROM dagwerk_tasks WHERE task_id = :first)
) FOR KEY SHARE;
SELECT 1 FROM dagwerk_runs
WHERE run_id = (SELECT run_id FROM dagwerk_tasks WHERE task_id = :first) FOR KEY SHARE;
SELECT t.*, r.status AS run_status,
       (t.invalidated = 0 AND n.generation = t.generation AND l.launch_id IS NOT NULL) AS owned,
       l.task_count AS launch_task_count
FROM dagwerk_tasks t
JOIN dagwerk_runs r ON r.run_id = t.run_id
JOIN dagwerk_nodes n ON n.run_id = t.run_id AND n.node_index = t.node_index
LEFT JOIN dagwerk_launches l
       ON l.launch_id = t.launch_id AND l.active = 1 AND l.generation = t.generation
WHERE t.task_id = ANY (ARRAY(SELECT jsonb_array_elements_text(CAST(:ids AS jsonb))))
  AND CAST(:first AS text) IS NOT NULL
ORDER BY t.task_id
FOR NO KEY UPDATE OF t;

-- name: launch_count_completions
UPDATE dagwerk_launches SET completed = completed + :n WHERE launch_id = :launch_id;

-- name: tasks_runs
SELECT task_id, run_id FROM dagwerk_tasks
WHERE task_id = ANY (ARRAY(SELECT jsonb_array_elements_text(CAST(:ids AS jsonb))));

-- name: tasks_running_in_nodes
SELECT task_id, node_index FROM dagwerk_tasks
WHERE run_id = :run_id AND invalidated = 0 AND status = 'running'
  AND node_index = ANY (ARRAY(
      SELECT CAST(jsonb_array_elements_text(CAST(:nodes AS jsonb)) AS bigint)))
ORDER BY seq;

-- name: tasks_of_run
SELECT * FROM dagwerk_tasks WHERE run_id = :run_id AND (:all = 1 OR invalidated = 0) ORDER BY seq;

-- name: task_set_status
-- RUNNING starts the attempt (started_at); any other status settles it
-- (finished_at; a settled attempt keeps its time).
UPDATE dagwerk_tasks
SET status = :new, error = :error,
    started_at = CASE WHEN :new = 'running' THEN CAST(:now AS double precision) ELSE started_at END,
    finished_at = CASE WHEN :new = 'running' THEN NULL ELSE coalesce(finished_at, CAST(:now AS double precision)) END
WHERE task_id = :task_id AND status = :old AND attempt_id = :attempt_id;

-- name: task_claim
-- task_set_status QUEUED -> RUNNING that also records the leasing worker.
UPDATE dagwerk_tasks
SET status = :new, error = :error, worker_id = :worker_id, started_at = :now, finished_at = NULL
WHERE task_id = :task_id AND status = :old AND attempt_id = :attempt_id;

-- name: task_replace_attempt
UPDATE dagwerk_tasks
SET attempt_id = :attempt_id, status = 'queued', error = NULL,
    failure_attempt_id = NULL, failure_status = NULL,
    resumed_from_wait_id = coalesce(CAST(:resumed_from AS text), resumed_from_wait_id),
    active_wait_id = CASE WHEN CAST(:resumed_from AS text) IS NULL THEN active_wait_id END,
    attempt_number = attempt_number + 1, worker_id = NULL, started_at = NULL, finished_at = NULL,
    lost_deliveries = coalesce(CAST(:lost_deliveries AS bigint), lost_deliveries)
WHERE task_id = :task_id AND status = :old_status AND attempt_id = :old_attempt;

-- name: attempt_archive
-- An attempt replaced unfinished ends at :now.
INSERT INTO dagwerk_attempts
    (task_id, attempt_id, number, status, error, worker_id, resumed_from_wait_id,
     started_at, finished_at)
SELECT task_id, attempt_id, attempt_number, :status, coalesce(CAST(:error AS text), error),
       worker_id, resumed_from_wait_id, started_at,
       coalesce(finished_at, CAST(:now AS double precision))
FROM dagwerk_tasks WHERE task_id = :task_id;

-- name: attempts_of_task
SELECT attempt_id, number, status, error, worker_id, resumed_from_wait_id, started_at,
       finished_at
FROM dagwerk_attempts WHERE task_id = :task_id ORDER BY seq;

-- name: attempt_tracebacks_of_task
SELECT attempt_id, traceback FROM dagwerk_attempt_tracebacks WHERE task_id = :task_id;

-- name: attempt_traceback_insert
-- Only the task's current, RUNNING attempt; an attempt keeps its first traceback.
INSERT INTO dagwerk_attempt_tracebacks (task_id, attempt_id, traceback)
SELECT task_id, attempt_id, :traceback FROM dagwerk_tasks
WHERE task_id = :task_id AND attempt_id = :attempt_id AND status = 'running'
ON CONFLICT DO NOTHING;

-- name: task_set_worker
UPDATE dagwerk_tasks SET worker_id = :worker_id
WHERE task_id = :task_id AND attempt_id = :attempt_id AND status = 'queued';

-- name: task_crash_dead_lettered
UPDATE dagwerk_tasks
SET status = 'crashed', error = :error, failure_attempt_id = attempt_id, failure_status = 'crashed',
    finished_at = :now
WHERE task_id = :task_id AND attempt_id = :attempt_id AND status IN ('queued', 'running');

-- name: task_complete
UPDATE dagwerk_tasks
SET status = 'completed', completed_attempt_id = :attempt_id,
    completed_launch_complete = :launch_complete, finished_at = :now
WHERE task_id = :task_id AND status = 'running' AND attempt_id = :attempt_id;

-- name: task_mark_failure
UPDATE dagwerk_tasks
SET status = :status, error = :error, failure_attempt_id = :attempt_id, failure_status = :status,
    finished_at = :now
WHERE task_id = :task_id AND status = 'running' AND attempt_id = :attempt_id;

-- name: task_set_active_wait
UPDATE dagwerk_tasks SET active_wait_id = :wait_id WHERE task_id = :task_id;

-- name: tasks_cancel_unfinished
-- A WAITING attempt keeps the time it settled.
UPDATE dagwerk_tasks SET status = 'cancelled', finished_at = coalesce(finished_at, CAST(:now AS double precision))
WHERE run_id = :run_id AND invalidated = 0
  AND (CAST(:node_index AS bigint) IS NULL OR node_index = :node_index)
  AND status = ANY (ARRAY(SELECT jsonb_array_elements_text(CAST(:unfinished AS jsonb))));

-- name: tasks_invalidate_node
UPDATE dagwerk_tasks SET invalidated = 1
WHERE run_id = :run_id AND node_index = :node_index AND invalidated = 0;

-- name: waits_invalidate_active
-- This block opens the stop of a run's (or node's) active work. Its prelude
-- locks the queue rows that the stop will delete before any task row is
-- touched: a dequeue holding one of them may still need its task's row, so
-- taking them in the other order could deadlock with it.
SELECT 1 FROM dagwerk_deliveries AS d
WHERE d.run_id = :run_id AND (CAST(:node_index AS bigint) IS NULL OR d.node_index = :node_index)
  AND EXISTS (SELECT 1 FROM dagwerk_tasks AS t WHERE t.task_id = d.task_id AND t.invalidated = 0)
FOR UPDATE;
UPDATE dagwerk_waits SET state = 'invalidated'
WHERE state = 'active' AND (task_id, wait_id) IN (
    SELECT task_id, active_wait_id FROM dagwerk_tasks
    WHERE run_id = :run_id AND invalidated = 0 AND active_wait_id IS NOT NULL
      AND (CAST(:node_index AS bigint) IS NULL OR node_index = :node_index)
);

-- name: tasks_clear_active_wait
UPDATE dagwerk_tasks SET active_wait_id = NULL
WHERE run_id = :run_id AND invalidated = 0 AND active_wait_id IS NOT NULL
  AND (CAST(:node_index AS bigint) IS NULL OR node_index = :node_index);

-- name: deliveries_drop_active
-- Found by the queue rows' own run (a queue row carries its task's run and
-- node): a finished run's queue is empty, and reading every task of the run
-- to find that out cost ~2 ms per 1,000 tasks.
DELETE FROM dagwerk_deliveries AS d
WHERE d.run_id = :run_id AND (CAST(:node_index AS bigint) IS NULL OR d.node_index = :node_index)
  AND EXISTS (SELECT 1 FROM dagwerk_tasks AS t WHERE t.task_id = d.task_id AND t.invalidated = 0);

-- name: deliveries_drop_task
DELETE FROM dagwerk_deliveries WHERE task_id = :task_id;

-- name: outputs_of_node
SELECT output_id, fields, correlation_id, routing_size FROM dagwerk_outputs
WHERE run_id = :run_id AND node_index = :node_index AND invalidated = 0
ORDER BY seq LIMIT :limit;

-- name: outputs_of_run
-- Every valid output of the run with its node, for the run's result
-- (dagwerk_outputs_node serves it: run_id, then node_index and seq).
SELECT output_id, node_index, fields, data FROM dagwerk_outputs
WHERE run_id = :run_id AND invalidated = 0 ORDER BY node_index, seq;

-- name: output_ids_of_node
SELECT output_id FROM dagwerk_outputs
WHERE run_id = :run_id AND node_index = :node_index AND invalidated = 0 ORDER BY seq;

-- name: outputs_valid_by_ids
-- One probe per wanted ID (see outputs_resolve).
SELECT o.output_id, o.node_index
FROM (SELECT DISTINCT jsonb_array_elements_text(CAST(:ids AS jsonb)) AS output_id) AS wanted
CROSS JOIN LATERAL (
    SELECT output_id, node_index FROM dagwerk_outputs
    WHERE run_id = :run_id AND output_id = wanted.output_id AND invalidated = 0 LIMIT 1
) AS o;

-- name: outputs_reserved
-- One probe per wanted ID (see outputs_resolve).
SELECT o.output_id
FROM (SELECT DISTINCT jsonb_array_elements_text(CAST(:ids AS jsonb)) AS output_id) AS wanted
CROSS JOIN LATERAL (
    SELECT output_id FROM dagwerk_outputs
    WHERE run_id = :run_id AND output_id = wanted.output_id LIMIT 1
) AS o;

-- name: outputs_resolve
-- The wanted IDs are a relation, each probing the unique (run_id, output_id)
-- index once: the LIMIT keeps the planner from flattening the probe into a
-- join it may plan as a scan of the run's outputs. Before a new table's
-- first ANALYZE it did exactly that, by the (run_id, node_index, ...) index
-- into a hash: a batch of 32 IDs read all 100,000 outputs of a wide run
-- (~45 ms instead of ~0.2 ms), and a worker kept that plan until autovacuum
-- analysed the table, up to a minute later. An "= ANY" filter is no better:
-- it scans the whole list for every output the index returns.
SELECT o.output_id, o.fields, o.data
FROM (SELECT DISTINCT jsonb_array_elements_text(CAST(:ids AS jsonb)) AS output_id) AS wanted
CROSS JOIN LATERAL (
    SELECT output_id, fields, data FROM dagwerk_outputs
    WHERE run_id = :run_id AND output_id = wanted.output_id AND invalidated = 0 LIMIT 1
) AS o;

-- name: output_insert
INSERT INTO dagwerk_outputs
    (run_id, output_id, node_index, fields, data, correlation_id, routing_size)
VALUES (:run_id, :output_id, :node_index, :fields, :data, :correlation_id, :routing_size);

-- name: outputs_invalidate_node
UPDATE dagwerk_outputs SET invalidated = 1
WHERE run_id = :run_id AND node_index = :node_index AND invalidated = 0;

-- name: wait_get
SELECT 1 FROM dagwerk_runs WHERE run_id = (
    SELECT root_run_id FROM dagwerk_run_links WHERE run_id = (SELECT run_id FROM dagwerk_tasks WHERE task_id = :task_id)
) FOR NO KEY UPDATE;
SELECT 1 FROM dagwerk_runs
WHERE run_id = (SELECT run_id FROM dagwerk_tasks WHERE task_id = :task_id) FOR UPDATE;
SELECT w.*, t.run_id, t.node_index FROM dagwerk_waits w
JOIN dagwerk_tasks t ON t.task_id = w.task_id
WHERE w.task_id = :task_id AND w.wait_id = :wait_id;

-- name: wait_insert
INSERT INTO dagwerk_waits (task_id, wait_id, attempt_id, generation, state, waited_at)
VALUES (:task_id, :wait_id, :attempt_id, :generation, 'active', :waited_at);

-- name: wait_resolve
UPDATE dagwerk_waits
SET state = 'resolved', resumed_attempt_id = :resumed_attempt_id, response = :response
WHERE task_id = :task_id AND wait_id = :wait_id AND state = 'active';

-- name: wait_response
SELECT response FROM dagwerk_waits WHERE task_id = :task_id AND wait_id = :wait_id;

-- name: recovery_get
SELECT 1 FROM dagwerk_runs WHERE run_id = (
    SELECT root_run_id FROM dagwerk_run_links WHERE run_id = (SELECT run_id FROM dagwerk_tasks WHERE task_id = :task_id)
) FOR NO KEY UPDATE;
SELECT 1 FROM dagwerk_runs
WHERE run_id = (SELECT run_id FROM dagwerk_tasks WHERE task_id = :task_id) FOR UPDATE;
SELECT r.*, t.run_id, t.node_index FROM dagwerk_recoveries r
JOIN dagwerk_tasks t ON t.task_id = r.task_id
WHERE r.task_id = :task_id AND r.abandoned_attempt_id = :abandoned
  AND r.generation = :generation;

-- name: recovery_insert
INSERT INTO dagwerk_recoveries
    (task_id, abandoned_attempt_id, generation, recovered_attempt_id, resumed_from_wait_id)
SELECT task_id, :abandoned, :generation, :recovered, resumed_from_wait_id
FROM dagwerk_tasks WHERE task_id = :task_id;

-- name: delivery_insert
INSERT INTO dagwerk_deliveries
    (delivery_id, task_id, attempt_id, generation, run_id, node_index, launch_id,
     queue, priority, available_at, delivery_count)
VALUES (:delivery_id, :task_id, :attempt_id, :generation, :run_id, :node_index, :launch_id,
        :queue, :priority, :now, :delivery_count);

-- name: delivery_insert_leased
-- delivery_insert of that task's delivery, leased to the claiming worker as
-- queue_lease would leave it (hidden until the lease expires, delivered once).
INSERT INTO dagwerk_deliveries
    (delivery_id, task_id, attempt_id, generation, run_id, node_index, launch_id,
     queue, priority, available_at, delivery_count, lease_owner, lease_expires_at)
VALUES (:delivery_id, :task_id, :attempt_id, :generation, :run_id, :node_index, :launch_id,
        :queue, :priority, :expires, 1, :worker_id, :expires);

-- name: delivery_delete
DELETE FROM dagwerk_deliveries WHERE delivery_id = :delivery_id;

-- name: deliveries_list
SELECT * FROM dagwerk_deliveries
WHERE (CAST(:run_id AS text) IS NULL OR run_id = :run_id) ORDER BY seq;

-- name: queue_candidates
-- :plugins (a JSON list, or NULL: any) filters by the node's plugin, which
-- the row's launch names; :run_id (or NULL: any) by run.
SELECT * FROM dagwerk_deliveries AS d
WHERE available_at <= :now
  AND (CAST(:queues AS text) IS NULL
       OR queue = ANY (ARRAY(SELECT jsonb_array_elements_text(CAST(:queues AS jsonb)))))
  AND (CAST(:run_id AS text) IS NULL OR run_id = CAST(:run_id AS text))
  AND (CAST(:plugins AS text) IS NULL OR EXISTS (
      SELECT 1 FROM dagwerk_launches AS l
      WHERE l.launch_id = d.launch_id
        AND l.plugin = ANY (ARRAY(SELECT jsonb_array_elements_text(CAST(:plugins AS jsonb))))))
ORDER BY priority DESC, available_at, seq
LIMIT :limit
FOR UPDATE OF d SKIP LOCKED;

-- name: queue_lease_next
-- postgres only: SQLite (one writer) leases in the loop of sql/_queue.py.
-- The lease of a dequeue in one statement, sent with its COMMIT in one
-- flight: the first :limit available rows in the queue's order, skipping
-- rows another transaction holds; those below :max_deliveries are leased.
-- Every picked row comes back as it was before the lease, with "leased", in
-- the queue's order (a row that used up its deliveries is buried after).
WITH picked AS (
    SELECT * FROM dagwerk_deliveries AS c
    WHERE available_at <= :now
      AND (CAST(:queues AS text) IS NULL
           OR queue = ANY (ARRAY(SELECT jsonb_array_elements_text(CAST(:queues AS jsonb)))))
      AND (CAST(:run_id AS text) IS NULL OR run_id = CAST(:run_id AS text))
      AND (CAST(:plugins AS text) IS NULL OR EXISTS (
          SELECT 1 FROM dagwerk_launches AS l
          WHERE l.launch_id = c.launch_id
            AND l.plugin = ANY (ARRAY(SELECT jsonb_array_elements_text(CAST(:plugins AS jsonb))))))
    ORDER BY priority DESC, available_at, seq
    LIMIT :limit
    FOR UPDATE OF c SKIP LOCKED
), leased AS (
    UPDATE dagwerk_deliveries AS d
    SET lease_owner = :worker_id, lease_expires_at = :expires, available_at = :expires,
        delivery_count = d.delivery_count + 1
    FROM picked AS p
    WHERE d.delivery_id = p.delivery_id AND p.delivery_count < :max_deliveries
    RETURNING d.delivery_id
)
SELECT p.*, (l.delivery_id IS NOT NULL) AS leased
FROM picked AS p LEFT JOIN leased AS l ON l.delivery_id = p.delivery_id
ORDER BY p.priority DESC, p.available_at, p.seq;

-- name: queue_get
SELECT 1 FROM dagwerk_deliveries WHERE delivery_id = :delivery_id FOR UPDATE;
SELECT * FROM dagwerk_deliveries WHERE delivery_id = :delivery_id;

-- name: queue_lease
UPDATE dagwerk_deliveries
SET lease_owner = :worker_id, lease_expires_at = :expires, available_at = :expires,
    delivery_count = delivery_count + 1
WHERE delivery_id = :delivery_id;

-- name: queue_ack
DELETE FROM dagwerk_deliveries WHERE delivery_id = :delivery_id AND lease_owner = :worker_id;

-- name: queue_release
UPDATE dagwerk_deliveries
SET lease_owner = NULL, lease_expires_at = NULL, available_at = :available_at
WHERE delivery_id = :delivery_id;

-- name: queue_extend
UPDATE dagwerk_deliveries SET lease_expires_at = :expires, available_at = :expires
WHERE delivery_id = :delivery_id AND lease_owner = :worker_id AND lease_expires_at > :now;

-- name: dead_letter_insert
INSERT INTO dagwerk_dead_letters
    (dead_letter_id, delivery_id, task_id, attempt_id, generation, run_id, node_index,
     launch_id, queue, priority, delivery_count, reason, dead_at)
SELECT :dead_letter_id, delivery_id, task_id, attempt_id, generation, run_id, node_index,
       launch_id, queue, priority, delivery_count, :reason, :now
FROM dagwerk_deliveries WHERE delivery_id = :delivery_id;

-- name: dead_letter_get
SELECT 1 FROM dagwerk_runs WHERE run_id = (
    SELECT root_run_id FROM dagwerk_run_links WHERE run_id = (
        SELECT run_id FROM dagwerk_dead_letters WHERE dead_letter_id = :dead_letter_id
    )
) FOR NO KEY UPDATE;
SELECT 1 FROM dagwerk_runs
WHERE run_id = (SELECT run_id FROM dagwerk_dead_letters WHERE dead_letter_id = :dead_letter_id)
FOR UPDATE;
SELECT * FROM dagwerk_dead_letters WHERE dead_letter_id = :dead_letter_id;

-- name: dead_letters_list
SELECT * FROM dagwerk_dead_letters
WHERE (CAST(:run_id AS text) IS NULL OR run_id = :run_id) ORDER BY seq;

-- name: dead_letter_mark_reinjected
UPDATE dagwerk_dead_letters SET reinjected_attempt_id = :attempt_id
WHERE dead_letter_id = :dead_letter_id AND reinjected_attempt_id IS NULL;

-- name: schema_version_table
-- The prelude serialises migrations of one schema across every process.
SELECT pg_advisory_xact_lock(hashtext('dagwerk.migrate'), hashtext(:schema));
SELECT count(*) AS n FROM pg_catalog.pg_tables
WHERE schemaname = current_schema() AND tablename = 'dagwerk_schema_version';

-- name: schema_version_get
SELECT max(version) AS version FROM dagwerk_schema_version;

-- name: schema_version_set
INSERT INTO dagwerk_schema_version (version) VALUES (:version);

-- name: schema_foreign_tables
-- Other applications' tables may share the schema; what cannot be migrated
-- is a dagwerk table without the version table (a half-made schema).
SELECT count(*) AS n FROM pg_catalog.pg_tables
WHERE schemaname = current_schema() AND tablename LIKE 'dagwerk\_%'
  AND tablename <> 'dagwerk_schema_version';


-- name: gated_lease_acquire
INSERT INTO dagwerk_leases (name, holder, expires_at) VALUES (:name, :holder, :expires)
ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, expires_at = excluded.expires_at
WHERE dagwerk_leases.holder = excluded.holder OR dagwerk_leases.expires_at <= :now;

-- name: gated_run_lock
SELECT 1 FROM dagwerk_runs WHERE run_id = (
    SELECT root_run_id FROM dagwerk_run_links WHERE run_id = :run_id
) FOR NO KEY UPDATE;
SELECT status FROM dagwerk_runs WHERE run_id = :run_id FOR UPDATE;

-- name: gated_lease_release
DELETE FROM dagwerk_leases WHERE name = :name AND holder = :holder;

-- name: gated_queued_without_delivery
SELECT t.* FROM dagwerk_tasks t
JOIN dagwerk_nodes n
     ON n.run_id = t.run_id AND n.node_index = t.node_index AND n.generation = t.generation
JOIN dagwerk_launches l
     ON l.launch_id = t.launch_id AND l.active = 1 AND l.generation = t.generation
WHERE t.run_id = :run_id AND t.invalidated = 0 AND t.status = 'queued'
  AND NOT EXISTS (SELECT 1 FROM dagwerk_deliveries d
                  WHERE d.task_id = t.task_id AND d.attempt_id = t.attempt_id)
  AND NOT EXISTS (SELECT 1 FROM dagwerk_dead_letters x
                  WHERE x.task_id = t.task_id AND x.attempt_id = t.attempt_id
                    AND x.reinjected_attempt_id IS NULL)
ORDER BY t.seq;

-- name: gated_wait_ages
SELECT t.task_id, w.waited_at FROM dagwerk_runs r
JOIN dagwerk_tasks t ON t.run_id = r.run_id
JOIN dagwerk_waits w ON w.task_id = t.task_id AND w.wait_id = t.active_wait_id
WHERE r.run_id = :run_id AND r.status = 'running'
  AND t.invalidated = 0 AND t.status = 'waiting'
ORDER BY t.seq;

-- name: tasks_running_without_delivery
-- The idle sweep's candidates (runtime/sweep.py): RUNNING tasks of the run
-- whose current attempt has no queue row, which no redelivery can reach.
-- Only RUNNING rows are read, not the whole run.
SELECT t.task_id, t.attempt_id FROM dagwerk_tasks t
WHERE t.run_id = :run_id AND t.invalidated = 0 AND t.status = 'running'
  AND NOT EXISTS (SELECT 1 FROM dagwerk_deliveries d
                  WHERE d.task_id = t.task_id AND d.attempt_id = t.attempt_id)
ORDER BY t.seq;

-- name: gated_live_node
-- Whether the stall diagnosis (stall.py) would find a node of the run live
-- from its tasks: the node's active launch launched tasks, none of its
-- active tasks FAILED or CRASHED, and one is RUNNING, or QUEUED with a queue
-- row for its attempt. The first such task ends the search; the diagnosis
-- itself reads every task of the run.
SELECT 1 FROM dagwerk_tasks t
WHERE t.run_id = :run_id AND t.invalidated = 0 AND t.status IN ('running', 'queued')
  AND (t.status = 'running' OR EXISTS (
      SELECT 1 FROM dagwerk_deliveries d
      WHERE d.task_id = t.task_id AND d.attempt_id = t.attempt_id))
  AND EXISTS (
      SELECT 1 FROM dagwerk_launches l
      WHERE l.run_id = t.run_id AND l.node_index = t.node_index AND l.active = 1
        AND l.disposition = 'launched')
  AND NOT EXISTS (
      SELECT 1 FROM dagwerk_tasks f
      WHERE f.run_id = t.run_id AND f.invalidated = 0 AND f.status IN ('failed', 'crashed')
        AND f.node_index = t.node_index)
LIMIT 1;

-- name: gated_stall_insert
INSERT INTO dagwerk_stalls (run_id, reason, held_nodes, detected_at)
SELECT run_id, :reason, :held_nodes, :now FROM dagwerk_runs WHERE run_id = :run_id
ON CONFLICT (run_id) DO NOTHING;

-- name: gated_stall_update
UPDATE dagwerk_stalls SET reason = :reason, held_nodes = :held_nodes WHERE run_id = :run_id;

-- name: gated_stall_delete
DELETE FROM dagwerk_stalls WHERE run_id = :run_id;

-- name: gated_stalls_list
SELECT * FROM dagwerk_stalls ORDER BY detected_at, run_id;

-- name: gated_queue_stats
SELECT queue,
       sum(CASE WHEN lease_expires_at IS NULL OR lease_expires_at <= :now THEN 1 ELSE 0 END)
           AS depth,
       min(CASE WHEN available_at <= :now THEN available_at END) AS oldest
FROM dagwerk_deliveries GROUP BY queue ORDER BY queue;

-- name: gated_run_status_counts
SELECT status, count(*) AS n FROM dagwerk_runs GROUP BY status;

-- Composite child runs and budgets. ---------------------------------

-- name: child_link_insert
INSERT INTO dagwerk_run_links
    (run_id, parent_run_id, parent_task_id, root_run_id, wait_id, lineage, created_seq)
VALUES (:run_id, :parent_run_id, :parent_task_id, :root_run_id, :wait_id, :lineage,
        (SELECT coalesce(max(created_seq), 0) + 1 FROM dagwerk_run_links
          WHERE parent_run_id = :parent_run_id));

-- name: child_link_get
SELECT * FROM dagwerk_run_links WHERE run_id = :run_id;

-- name: child_runs_of
SELECT l.run_id, r.status FROM dagwerk_run_links l
JOIN dagwerk_runs r ON r.run_id = l.run_id
WHERE l.parent_run_id = :run_id ORDER BY l.created_seq, l.run_id;

-- name: child_outputs_of_node
SELECT output_id, fields, data FROM dagwerk_outputs
WHERE run_id = :run_id AND node_index = :node_index AND invalidated = 0 ORDER BY seq;

-- name: child_wait_used
SELECT 1 AS used FROM dagwerk_waits WHERE task_id = :task_id AND wait_id = :wait_id;

-- name: budget_insert
INSERT INTO dagwerk_budgets
    (account_id, max_input_bytes, max_output_bytes, max_cost_units, max_cost)
VALUES (:account_id, :max_input_bytes, :max_output_bytes, :max_cost_units, :max_cost);

-- name: budget_run_account_insert
INSERT INTO dagwerk_run_accounts (run_id, account_id, position)
VALUES (:run_id, :account_id, :position);

-- name: budget_charge
UPDATE dagwerk_budgets
SET used_input_bytes = used_input_bytes + :input_bytes,
    used_output_bytes = used_output_bytes + :output_bytes,
    charged_units = charged_units + :units
WHERE account_id = :account_id;

-- name: budget_hold_get
SELECT * FROM dagwerk_budget_holds WHERE task_id = :task_id AND attempt_id = :attempt_id;

-- name: budget_hold_insert
INSERT INTO dagwerk_budget_holds (task_id, attempt_id, run_id, units, charged, input_bytes)
VALUES (:task_id, :attempt_id, :run_id, :units, 0, :input_bytes);

-- name: budget_hold_charge
UPDATE dagwerk_budget_holds SET charged = 1
WHERE task_id = :task_id AND attempt_id = :attempt_id AND charged = 0;

-- name: budget_accounts_of
-- The accounts a run draws on with their usage; a hold is reserved while its
-- attempt is the task's current RUNNING attempt (release needs no write).
-- The prelude locks the account rows (in key order), so runs that share an
-- account (a root and its children) admit charges one at a time.
SELECT 1 FROM dagwerk_budgets
WHERE account_id IN (SELECT account_id FROM dagwerk_run_accounts WHERE run_id = :run_id)
ORDER BY account_id FOR UPDATE;
SELECT b.*, a.position,
       (SELECT coalesce(sum(h.units), 0) FROM dagwerk_budget_holds h
          JOIN dagwerk_run_accounts ha ON ha.run_id = h.run_id AND ha.account_id = b.account_id
          JOIN dagwerk_tasks t ON t.task_id = h.task_id
         WHERE h.charged = 0 AND t.attempt_id = h.attempt_id AND t.status = 'running'
           AND t.invalidated = 0) AS reserved_units
FROM dagwerk_run_accounts a JOIN dagwerk_budgets b ON b.account_id = a.account_id
WHERE a.run_id = :run_id ORDER BY a.position;

-- name: workers_prune
DELETE FROM dagwerk_workers WHERE expires_at < :horizon;

-- name: worker_upsert
INSERT INTO dagwerk_workers (worker_id, plugins, queues, seen_at, expires_at)
VALUES (:worker_id, :plugins, :queues, :now, :expires)
ON CONFLICT (worker_id) DO UPDATE SET
    plugins = excluded.plugins, queues = excluded.queues,
    seen_at = excluded.seen_at, expires_at = excluded.expires_at;

-- name: worker_retire
UPDATE dagwerk_workers SET expires_at = :now
WHERE worker_id = :worker_id AND expires_at > :now;

-- name: workers_list
SELECT * FROM dagwerk_workers ORDER BY seen_at DESC, worker_id;

-- name: leases_expired
SELECT * FROM dagwerk_deliveries
WHERE lease_owner IS NOT NULL AND lease_expires_at <= :now
  AND (CAST(:run_id AS text) IS NULL OR run_id = CAST(:run_id AS text))
ORDER BY lease_expires_at, seq;

-- name: queue_next_due
-- A claim sets available_at to the lease's end: a row under the asking
-- worker's own lease is due when that lease ends.
SELECT min(available_at) AS due FROM dagwerk_deliveries AS d
WHERE (lease_owner IS NULL OR lease_expires_at <= :now
       OR lease_owner = CAST(:worker_id AS text))
  AND (CAST(:queues AS text) IS NULL
       OR queue = ANY (ARRAY(SELECT jsonb_array_elements_text(CAST(:queues AS jsonb)))))
  AND (CAST(:run_id AS text) IS NULL OR run_id = CAST(:run_id AS text))
  AND (CAST(:plugins AS text) IS NULL OR EXISTS (
      SELECT 1 FROM dagwerk_launches AS l
      WHERE l.launch_id = d.launch_id
        AND l.plugin = ANY (ARRAY(SELECT jsonb_array_elements_text(CAST(:plugins AS jsonb))))));

-- Durable task records (dagwerk.store_durable): steps, and a task's journal.

-- name: step_insert
-- The step's position is the task's count of steps so far: the caller holds
-- the task's run (task_get_completing), so no other step of it commits between.
INSERT INTO dagwerk_steps (task_id, name, generation, attempt_id, result, position, recorded_at)
VALUES (:task_id, :name, :generation, :attempt_id, :result,
        (SELECT count(*) FROM dagwerk_steps WHERE task_id = :task_id), :now)
ON CONFLICT (task_id, name) DO NOTHING;

-- name: step_get
SELECT * FROM dagwerk_steps WHERE task_id = :task_id AND name = :name;

-- name: journal_task
SELECT task_id, run_id, generation FROM dagwerk_tasks WHERE task_id = :task_id;

-- name: journal_steps
SELECT * FROM dagwerk_steps WHERE task_id = :task_id ORDER BY position;

-- name: journal_waits
SELECT * FROM dagwerk_waits WHERE task_id = :task_id ORDER BY waited_at, wait_id;

-- name: journal_children
SELECT l.run_id, l.lineage, r.run_input, r.status FROM dagwerk_run_links l
JOIN dagwerk_runs r ON r.run_id = l.run_id
WHERE l.parent_run_id = :run_id AND l.parent_task_id = :task_id
ORDER BY l.created_seq, l.run_id;

-- name: run_journal_tasks
-- The run's tasks that recorded a step or a wait.
SELECT t.task_id, t.run_id, t.generation FROM dagwerk_tasks t
WHERE t.run_id = :run_id
  AND (EXISTS (SELECT 1 FROM dagwerk_steps s WHERE s.task_id = t.task_id)
       OR EXISTS (SELECT 1 FROM dagwerk_waits w WHERE w.task_id = t.task_id))
ORDER BY t.task_id;

-- Retention (backends/sql/_retention.py): finished roots (runs that are no
-- stored run's child), their lineages, and one delete per table of
-- RUN_TABLES, each for every run of the batch at once.

-- name: retention_roots
-- For a dry run: reads only.
SELECT r.run_id, r.finished_at FROM dagwerk_runs r
WHERE r.finished_at < :before
  AND r.status = ANY (ARRAY(SELECT jsonb_array_elements_text(CAST(:statuses AS jsonb))))
  AND (r.finished_at > :after_at OR (r.finished_at = :after_at AND r.run_id > :after_id))
  AND NOT EXISTS (
      SELECT 1 FROM dagwerk_run_links l JOIN dagwerk_runs p ON p.run_id = l.parent_run_id
      WHERE l.run_id = r.run_id)
ORDER BY r.finished_at, r.run_id
LIMIT :limit;

-- name: retention_claim_roots
-- The roots a delete examines, locked; roots another transaction holds are
-- left to a later batch (never waited for: see backends/sql/_retention.py).
SELECT r.run_id, r.finished_at FROM dagwerk_runs r
WHERE r.finished_at < :before
  AND r.status = ANY (ARRAY(SELECT jsonb_array_elements_text(CAST(:statuses AS jsonb))))
  AND (r.finished_at > :after_at OR (r.finished_at = :after_at AND r.run_id > :after_id))
  AND NOT EXISTS (
      SELECT 1 FROM dagwerk_run_links l JOIN dagwerk_runs p ON p.run_id = l.parent_run_id
      WHERE l.run_id = r.run_id)
ORDER BY r.finished_at, r.run_id
LIMIT :limit
FOR UPDATE OF r SKIP LOCKED;

-- name: retention_lineages
-- Each root with every stored run below it, and their statuses.
WITH RECURSIVE tree (root_id, run_id) AS (
    SELECT x.id, x.id FROM jsonb_array_elements_text(CAST(:roots AS jsonb)) AS x(id)
    UNION
    SELECT t.root_id, l.run_id FROM tree t
    JOIN dagwerk_run_links l ON l.parent_run_id = t.run_id
)
SELECT t.root_id, t.run_id, r.status FROM tree t JOIN dagwerk_runs r ON r.run_id = t.run_id;

-- name: retention_lock_runs
-- The runs of the lineages, locked in run order; a run another transaction
-- holds is not returned (its lineage waits for a later batch).
SELECT run_id FROM dagwerk_runs
WHERE run_id = ANY (ARRAY(SELECT jsonb_array_elements_text(CAST(:runs AS jsonb))))
ORDER BY run_id FOR UPDATE SKIP LOCKED;

-- name: retention_delete_steps
DELETE FROM dagwerk_steps WHERE task_id = ANY (ARRAY(
    SELECT task_id FROM dagwerk_tasks
    WHERE run_id = ANY (ARRAY(SELECT jsonb_array_elements_text(CAST(:runs AS jsonb))))));

-- name: retention_delete_task_logs
DELETE FROM dagwerk_task_logs
WHERE run_id = ANY (ARRAY(SELECT jsonb_array_elements_text(CAST(:runs AS jsonb))));

-- name: retention_delete_schedule_fires
-- A deleted run's tick record goes with it: a later backfill of that range
-- creates the tick's run again.
DELETE FROM dagwerk_schedule_fires
WHERE run_id = ANY (ARRAY(SELECT jsonb_array_elements_text(CAST(:runs AS jsonb))));

-- name: retention_delete_idempotency_keys
DELETE FROM dagwerk_idempotency_keys
WHERE run_id = ANY (ARRAY(SELECT jsonb_array_elements_text(CAST(:runs AS jsonb))));

-- name: retention_delete_waits
DELETE FROM dagwerk_waits WHERE task_id = ANY (ARRAY(
    SELECT task_id FROM dagwerk_tasks
    WHERE run_id = ANY (ARRAY(SELECT jsonb_array_elements_text(CAST(:runs AS jsonb))))));

-- name: retention_delete_recoveries
DELETE FROM dagwerk_recoveries WHERE task_id = ANY (ARRAY(
    SELECT task_id FROM dagwerk_tasks
    WHERE run_id = ANY (ARRAY(SELECT jsonb_array_elements_text(CAST(:runs AS jsonb))))));

-- name: retention_delete_attempts
DELETE FROM dagwerk_attempts WHERE task_id = ANY (ARRAY(
    SELECT task_id FROM dagwerk_tasks
    WHERE run_id = ANY (ARRAY(SELECT jsonb_array_elements_text(CAST(:runs AS jsonb))))));

-- name: retention_delete_attempt_tracebacks
DELETE FROM dagwerk_attempt_tracebacks WHERE task_id = ANY (ARRAY(
    SELECT task_id FROM dagwerk_tasks
    WHERE run_id = ANY (ARRAY(SELECT jsonb_array_elements_text(CAST(:runs AS jsonb))))));

-- name: retention_delete_deliveries
DELETE FROM dagwerk_deliveries
WHERE run_id = ANY (ARRAY(SELECT jsonb_array_elements_text(CAST(:runs AS jsonb))));

-- name: retention_delete_dead_letters
DELETE FROM dagwerk_dead_letters
WHERE run_id = ANY (ARRAY(SELECT jsonb_array_elements_text(CAST(:runs AS jsonb))));

-- name: retention_delete_budget_holds
DELETE FROM dagwerk_budget_holds
WHERE run_id = ANY (ARRAY(SELECT jsonb_array_elements_text(CAST(:runs AS jsonb))));

-- name: retention_delete_tasks
DELETE FROM dagwerk_tasks
WHERE run_id = ANY (ARRAY(SELECT jsonb_array_elements_text(CAST(:runs AS jsonb))));

-- name: retention_delete_outputs
DELETE FROM dagwerk_outputs
WHERE run_id = ANY (ARRAY(SELECT jsonb_array_elements_text(CAST(:runs AS jsonb))));

-- name: retention_delete_launches
DELETE FROM dagwerk_launches
WHERE run_id = ANY (ARRAY(SELECT jsonb_array_elements_text(CAST(:runs AS jsonb))));

-- name: retention_delete_nodes
DELETE FROM dagwerk_nodes
WHERE run_id = ANY (ARRAY(SELECT jsonb_array_elements_text(CAST(:runs AS jsonb))));

-- name: retention_delete_run_links
DELETE FROM dagwerk_run_links
WHERE run_id = ANY (ARRAY(SELECT jsonb_array_elements_text(CAST(:runs AS jsonb))));

-- name: retention_delete_run_accounts
DELETE FROM dagwerk_run_accounts
WHERE run_id = ANY (ARRAY(SELECT jsonb_array_elements_text(CAST(:runs AS jsonb))));

-- name: retention_delete_budgets
DELETE FROM dagwerk_budgets
WHERE account_id = ANY (ARRAY(SELECT jsonb_array_elements_text(CAST(:runs AS jsonb))));

-- name: retention_delete_stalls
DELETE FROM dagwerk_stalls
WHERE run_id = ANY (ARRAY(SELECT jsonb_array_elements_text(CAST(:runs AS jsonb))));

-- name: retention_delete_runs
DELETE FROM dagwerk_runs
WHERE run_id = ANY (ARRAY(SELECT jsonb_array_elements_text(CAST(:runs AS jsonb))));

-- name: task_log_insert
INSERT INTO dagwerk_task_logs
    (run_id, task_id, node_index, attempt, at, level, logger, message, traceback)
VALUES (:run_id, :task_id, :node_index, :attempt, :at, :level, :logger, :message, :traceback);

-- name: task_logs_read
SELECT line_id, run_id, task_id, node_index, attempt, at, level, logger, message, traceback
FROM dagwerk_task_logs
WHERE run_id = :run_id AND line_id > :after
  AND (CAST(:task_id AS text) IS NULL OR task_id = :task_id)
  AND (CAST(:node_index AS bigint) IS NULL OR node_index = :node_index)
  AND (CAST(:attempt AS bigint) IS NULL OR attempt = :attempt)
ORDER BY line_id LIMIT :limit;

-- name: run_set_traceparent
UPDATE dagwerk_runs SET traceparent = :traceparent
WHERE run_id = :run_id AND traceparent IS NULL;

-- name: run_traceparent
SELECT traceparent FROM dagwerk_runs WHERE run_id = :run_id;

-- Schedules (ScheduleStore) and idempotent submits (IdempotentSubmitStore).
-- A tick's record, its run and the cursor commit together under the lock of
-- the schedule's row (schedule_lock); no run row of another run is locked.

-- name: schedule_insert
INSERT INTO dagwerk_schedules
    (schedule_id, name, definition, paused, tick_cursor, created_at, updated_at)
VALUES (:schedule_id, :name, :definition, 0, :now, :now, :now)
ON CONFLICT (name) DO NOTHING;

-- name: schedule_replace
UPDATE dagwerk_schedules SET definition = :definition, updated_at = :now WHERE name = :name;

-- name: schedule_get
SELECT * FROM dagwerk_schedules WHERE name = :name;

-- name: schedule_list
SELECT * FROM dagwerk_schedules ORDER BY name;

-- name: schedule_lock
SELECT * FROM dagwerk_schedules WHERE schedule_id = :schedule_id FOR UPDATE;

-- name: schedule_pause
UPDATE dagwerk_schedules SET paused = 1, updated_at = :now WHERE name = :name AND paused = 0;

-- name: schedule_resume
UPDATE dagwerk_schedules
SET paused = 0, updated_at = :now, tick_cursor = greatest(tick_cursor, :now)
WHERE name = :name AND paused = 1;

-- name: schedule_delete
DELETE FROM dagwerk_schedules WHERE schedule_id = :schedule_id;

-- name: schedule_fires_delete
DELETE FROM dagwerk_schedule_fires WHERE schedule_id = :schedule_id;

-- name: schedule_fire_insert
INSERT INTO dagwerk_schedule_fires (schedule_id, tick, schedule_name, run_id, source, fired_at)
VALUES (:schedule_id, :tick, :schedule_name, :run_id, :source, :now)
ON CONFLICT (schedule_id, tick) DO NOTHING;

-- name: schedule_fire_get
SELECT * FROM dagwerk_schedule_fires WHERE schedule_id = :schedule_id AND tick = :tick;

-- name: schedule_cursor_advance
UPDATE dagwerk_schedules SET tick_cursor = :tick
WHERE schedule_id = :schedule_id AND tick_cursor < :tick;

-- name: schedule_fires_list
SELECT * FROM dagwerk_schedule_fires
WHERE schedule_id = :schedule_id
  AND (CAST(:source AS text) IS NULL OR source = CAST(:source AS text))
  AND (CAST(:since AS bigint) IS NULL OR tick >= CAST(:since AS bigint))
  AND (CAST(:until AS bigint) IS NULL OR tick <= CAST(:until AS bigint))
ORDER BY tick DESC LIMIT :limit;

-- name: schedule_run_fire
SELECT * FROM dagwerk_schedule_fires WHERE run_id = :run_id;

-- name: lease_get
SELECT * FROM dagwerk_leases WHERE name = :name AND expires_at > :now;

-- name: idempotency_expired_delete
DELETE FROM dagwerk_idempotency_keys WHERE key = :key AND expires_at <= :now;

-- name: idempotency_insert
-- A concurrent insert of the same key waits for the first to commit, then
-- does nothing; the reread that follows (READ COMMITTED) sees the winner.
INSERT INTO dagwerk_idempotency_keys (key, fingerprint, run_id, created_at, expires_at)
VALUES (:key, :fingerprint, :run_id, :now, :expires)
ON CONFLICT (key) DO NOTHING;

-- name: idempotency_get
SELECT * FROM dagwerk_idempotency_keys WHERE key = :key;

-- name: idempotency_purge
DELETE FROM dagwerk_idempotency_keys WHERE key IN (
    SELECT key FROM dagwerk_idempotency_keys WHERE expires_at <= :now LIMIT :limit
);

-- Dashboard views (store_views.RunViewStore): read-only.

-- name: views_runs_page
-- Newest first by (created_at, run_id); the created_at bound of the cursor
-- is a range on dagwerk_runs_created, the run_id part breaks ties.
SELECT r.run_id, r.status, r.failure_policy, r.retry_count, r.error, r.node_count,
       r.created_at, r.finished_at, r.pipeline,
       (SELECT count(*) FROM dagwerk_launches l
         WHERE l.run_id = r.run_id AND l.active = 1
           AND (l.disposition <> 'launched' OR l.completed = l.task_count)) AS settled_nodes
FROM dagwerk_runs r
WHERE (CAST(:status AS text) IS NULL OR r.status = :status)
  AND (CAST(:pipeline AS text) IS NULL OR r.pipeline = :pipeline)
  AND (CAST(:since AS double precision) IS NULL OR r.created_at >= :since)
  AND (CAST(:until AS double precision) IS NULL OR r.created_at < :until)
  AND (CAST(:cursor_at AS double precision) IS NULL
       OR (r.created_at <= :cursor_at
           AND (r.created_at < :cursor_at OR r.run_id < :cursor_id)))
ORDER BY r.created_at DESC, r.run_id DESC LIMIT :limit;

-- name: views_run_task_counts
SELECT run_id, status, count(*) AS n FROM dagwerk_tasks
WHERE run_id IN (SELECT jsonb_array_elements_text(CAST(:run_ids AS jsonb)))
  AND invalidated = 0
GROUP BY run_id, status;

-- name: views_node_task_stats
-- Counted from dagwerk_tasks_node_stats alone (it covers every column).
SELECT node_index, status, count(*) AS n, sum(attempt_number) AS attempts,
       min(started_at) AS first_started_at, max(finished_at) AS last_finished_at
FROM dagwerk_tasks WHERE run_id = :run_id AND invalidated = 0
GROUP BY node_index, status ORDER BY node_index;

-- name: views_run_exists
SELECT run_input FROM dagwerk_runs WHERE run_id = :run_id;

-- name: views_tasks_page
SELECT * FROM dagwerk_tasks
WHERE run_id = :run_id AND invalidated = 0
  AND (CAST(:node_index AS integer) IS NULL OR node_index = :node_index)
  AND (CAST(:status AS text) IS NULL OR status = :status)
  AND seq > :after_seq
ORDER BY seq LIMIT :limit;

-- name: views_node_tasks_page
-- The tasks of one node's active launch, by the (launch_id, seq) index.
SELECT * FROM dagwerk_tasks
WHERE launch_id = (SELECT launch_id FROM dagwerk_launches
                   WHERE run_id = :run_id AND node_index = :node_index AND active = 1)
  AND invalidated = 0
  AND (CAST(:status AS text) IS NULL OR status = :status)
  AND seq > :after_seq
ORDER BY seq LIMIT :limit;

-- name: views_node_launches
SELECT node_index, disposition, error, task_count, completed FROM dagwerk_launches
WHERE run_id = :run_id AND active = 1;

-- name: views_task_seq
SELECT seq, run_id, node_index FROM dagwerk_tasks WHERE task_id = :task_id;

-- name: views_task_waits
SELECT * FROM dagwerk_waits WHERE task_id = :task_id;

-- name: views_task_outputs
-- The runtime names a task's outputs TASK_ID/N; compared by prefix, since a
-- range of the text index would follow the database's collation.
SELECT output_id, fields, data FROM dagwerk_outputs
WHERE run_id = :run_id AND node_index = :node_index AND invalidated = 0
  AND left(output_id, length(:prefix) + 1) = :prefix || '/'
ORDER BY seq;

-- name: views_run_status_counts
SELECT status, count(*) AS n FROM dagwerk_runs WHERE created_at >= :since GROUP BY status;
