-- dagwerk SQLite schema, current version: the sum of migrations/*.sql.
-- A test proves that applying every migration gives exactly this schema.
-- (Columns added by later migrations appear where ALTER TABLE puts them.)

CREATE TABLE dagwerk_schema_version (
    version INTEGER NOT NULL
);

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
CREATE INDEX dagwerk_runs_created ON dagwerk_runs (created_at);

CREATE TABLE dagwerk_nodes (
    run_id TEXT NOT NULL REFERENCES dagwerk_runs (run_id),
    node_index INTEGER NOT NULL,
    generation INTEGER NOT NULL DEFAULT 0,
    revision INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (run_id, node_index)
) WITHOUT ROWID;

CREATE TABLE dagwerk_launches (
    launch_id TEXT PRIMARY KEY,
    run_id TEXT NOT NULL REFERENCES dagwerk_runs (run_id),
    node_index INTEGER NOT NULL,
    generation INTEGER NOT NULL,
    plugin TEXT NOT NULL,
    disposition TEXT NOT NULL,
    error TEXT NOT NULL,
    task_count INTEGER NOT NULL,
    completed INTEGER NOT NULL DEFAULT 0,
    active INTEGER NOT NULL DEFAULT 1
);
CREATE UNIQUE INDEX dagwerk_launches_active
    ON dagwerk_launches (run_id, node_index) WHERE active = 1;
CREATE INDEX dagwerk_launches_failed
    ON dagwerk_launches (run_id) WHERE active = 1 AND disposition = 'failed';

CREATE TABLE dagwerk_tasks (
    seq INTEGER PRIMARY KEY,
    task_id TEXT NOT NULL UNIQUE,
    run_id TEXT NOT NULL REFERENCES dagwerk_runs (run_id),
    node_index INTEGER NOT NULL,
    generation INTEGER NOT NULL,
    launch_id TEXT NOT NULL REFERENCES dagwerk_launches (launch_id),
    status TEXT NOT NULL,
    attempt_id TEXT NOT NULL,
    plan TEXT NOT NULL,
    error TEXT,
    resumed_from_wait_id TEXT,
    active_wait_id TEXT,
    invalidated INTEGER NOT NULL DEFAULT 0,
    completed_attempt_id TEXT,
    completed_launch_complete INTEGER,
    failure_attempt_id TEXT,
    failure_status TEXT
, attempt_number INTEGER NOT NULL DEFAULT 1, worker_id TEXT, lost_deliveries INTEGER NOT NULL DEFAULT 0, started_at REAL, finished_at REAL);
CREATE INDEX dagwerk_tasks_run ON dagwerk_tasks (run_id, invalidated, status);
CREATE INDEX dagwerk_tasks_launch ON dagwerk_tasks (launch_id, seq);

CREATE TABLE dagwerk_outputs (
    seq INTEGER PRIMARY KEY,
    run_id TEXT NOT NULL REFERENCES dagwerk_runs (run_id),
    output_id TEXT NOT NULL,
    node_index INTEGER NOT NULL,
    fields TEXT NOT NULL,
    data TEXT NOT NULL,
    correlation_id TEXT,
    routing_size INTEGER NOT NULL,
    invalidated INTEGER NOT NULL DEFAULT 0,
    -- Output IDs stay reserved for the run's lifetime, invalidated or not.
    UNIQUE (run_id, output_id)
);
CREATE INDEX dagwerk_outputs_node ON dagwerk_outputs (run_id, node_index, invalidated, seq);

CREATE TABLE dagwerk_waits (
    task_id TEXT NOT NULL REFERENCES dagwerk_tasks (task_id),
    wait_id TEXT NOT NULL,
    attempt_id TEXT NOT NULL,
    generation INTEGER NOT NULL,
    state TEXT NOT NULL,
    resumed_attempt_id TEXT, response TEXT, waited_at REAL,
    PRIMARY KEY (task_id, wait_id)
) WITHOUT ROWID;

CREATE TABLE dagwerk_recoveries (
    task_id TEXT NOT NULL REFERENCES dagwerk_tasks (task_id),
    abandoned_attempt_id TEXT NOT NULL,
    generation INTEGER NOT NULL,
    recovered_attempt_id TEXT NOT NULL,
    resumed_from_wait_id TEXT,
    PRIMARY KEY (task_id, abandoned_attempt_id, generation)
) WITHOUT ROWID;

CREATE TABLE dagwerk_deliveries (
    seq INTEGER PRIMARY KEY,
    delivery_id TEXT NOT NULL UNIQUE,
    task_id TEXT NOT NULL REFERENCES dagwerk_tasks (task_id),
    attempt_id TEXT NOT NULL,
    generation INTEGER NOT NULL,
    run_id TEXT NOT NULL,
    node_index INTEGER NOT NULL,
    launch_id TEXT NOT NULL,
    queue TEXT NOT NULL,
    priority INTEGER NOT NULL,
    -- The visibility time: a lease or a nack delay moves it forward.
    available_at REAL NOT NULL,
    lease_owner TEXT,
    lease_expires_at REAL,
    delivery_count INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX dagwerk_deliveries_ready
    ON dagwerk_deliveries (priority DESC, available_at, seq);
CREATE INDEX dagwerk_deliveries_task ON dagwerk_deliveries (task_id);
CREATE INDEX dagwerk_deliveries_run ON dagwerk_deliveries (run_id, seq);

CREATE TABLE dagwerk_dead_letters (
    seq INTEGER PRIMARY KEY,
    dead_letter_id TEXT NOT NULL UNIQUE,
    delivery_id TEXT NOT NULL,
    task_id TEXT NOT NULL REFERENCES dagwerk_tasks (task_id),
    attempt_id TEXT NOT NULL,
    generation INTEGER NOT NULL,
    run_id TEXT NOT NULL,
    node_index INTEGER NOT NULL,
    launch_id TEXT NOT NULL,
    queue TEXT NOT NULL,
    priority INTEGER NOT NULL,
    delivery_count INTEGER NOT NULL,
    reason TEXT NOT NULL,
    dead_at REAL NOT NULL,
    reinjected_attempt_id TEXT
);
CREATE INDEX dagwerk_dead_letters_run ON dagwerk_dead_letters (run_id, seq);

CREATE TABLE dagwerk_attempts (
    seq INTEGER PRIMARY KEY,
    task_id TEXT NOT NULL REFERENCES dagwerk_tasks (task_id),
    attempt_id TEXT NOT NULL,
    number INTEGER NOT NULL,
    status TEXT NOT NULL,
    error TEXT,
    worker_id TEXT,
    resumed_from_wait_id TEXT
, started_at REAL, finished_at REAL);
CREATE INDEX dagwerk_attempts_task ON dagwerk_attempts (task_id, seq);

CREATE TABLE dagwerk_run_links (
    run_id TEXT PRIMARY KEY REFERENCES dagwerk_runs (run_id),
    -- No foreign keys to the ancestors: an ancestor with no stored run is
    -- legal and is not a cancellation signal.
    parent_run_id TEXT NOT NULL,
    parent_task_id TEXT NOT NULL,
    root_run_id TEXT NOT NULL,
    wait_id TEXT,
    -- Opaque to the store: workers decode it before executing any task.
    lineage TEXT NOT NULL,
    created_seq INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX dagwerk_run_links_parent ON dagwerk_run_links (parent_run_id, created_seq);

CREATE TABLE dagwerk_budgets (
    account_id TEXT PRIMARY KEY REFERENCES dagwerk_runs (run_id),
    max_input_bytes INTEGER,
    max_output_bytes INTEGER,
    max_cost_units INTEGER,
    max_cost TEXT,
    used_input_bytes INTEGER NOT NULL DEFAULT 0,
    used_output_bytes INTEGER NOT NULL DEFAULT 0,
    charged_units INTEGER NOT NULL DEFAULT 0
) WITHOUT ROWID;

CREATE TABLE dagwerk_run_accounts (
    run_id TEXT NOT NULL REFERENCES dagwerk_runs (run_id),
    account_id TEXT NOT NULL,
    position INTEGER NOT NULL,
    PRIMARY KEY (run_id, account_id)
) WITHOUT ROWID;
CREATE INDEX dagwerk_run_accounts_account ON dagwerk_run_accounts (account_id);

CREATE TABLE dagwerk_budget_holds (
    task_id TEXT NOT NULL,
    attempt_id TEXT NOT NULL,
    run_id TEXT NOT NULL,
    units INTEGER NOT NULL,
    -- A hold counts while its attempt is the task's current RUNNING one.
    charged INTEGER NOT NULL DEFAULT 0,
    input_bytes INTEGER NOT NULL,
    PRIMARY KEY (task_id, attempt_id)
) WITHOUT ROWID;
CREATE INDEX dagwerk_budget_holds_run ON dagwerk_budget_holds (run_id, charged);

-- version 4 (gated dispatch): named leases and stalls (version 5 dropped
-- its first-seen waits: dagwerk_waits.waited_at replaces them).
CREATE TABLE dagwerk_leases (
    name TEXT PRIMARY KEY,
    holder TEXT NOT NULL,
    expires_at REAL NOT NULL
) WITHOUT ROWID;

CREATE TABLE dagwerk_stalls (
    run_id TEXT PRIMARY KEY REFERENCES dagwerk_runs (run_id),
    reason TEXT NOT NULL,
    held_nodes TEXT NOT NULL,
    detected_at REAL NOT NULL
) WITHOUT ROWID;

-- version 7: worker presence (one row per recent worker).
CREATE TABLE dagwerk_workers (
    worker_id TEXT PRIMARY KEY,
    plugins TEXT NOT NULL,
    queues TEXT,
    seen_at REAL NOT NULL,
    expires_at REAL NOT NULL
) WITHOUT ROWID;

-- version 10: durable steps (one row per recorded ctx.step of a task).
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

-- version 11: task logs, one row per captured line.
CREATE TABLE dagwerk_task_logs (
    line_id INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id TEXT NOT NULL,
    task_id TEXT NOT NULL,
    node_index INTEGER NOT NULL,
    attempt INTEGER NOT NULL,
    at REAL NOT NULL,
    level TEXT NOT NULL,
    logger TEXT NOT NULL,
    message TEXT NOT NULL,
    traceback TEXT
);
CREATE INDEX dagwerk_task_logs_run ON dagwerk_task_logs (run_id, line_id);
CREATE INDEX dagwerk_task_logs_task ON dagwerk_task_logs (task_id, attempt, line_id);

-- version 12: schedules, their tick records and idempotent-submit keys.
CREATE TABLE dagwerk_schedules (
    schedule_id TEXT PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    definition TEXT NOT NULL,
    paused INTEGER NOT NULL DEFAULT 0,
    tick_cursor REAL NOT NULL,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL
) WITHOUT ROWID;

CREATE TABLE dagwerk_schedule_fires (
    schedule_id TEXT NOT NULL,
    tick INTEGER NOT NULL,
    schedule_name TEXT NOT NULL,
    run_id TEXT,
    source TEXT NOT NULL,
    fired_at REAL NOT NULL,
    PRIMARY KEY (schedule_id, tick)
) WITHOUT ROWID;
CREATE INDEX dagwerk_schedule_fires_run ON dagwerk_schedule_fires (run_id);

CREATE TABLE dagwerk_idempotency_keys (
    key TEXT PRIMARY KEY,
    fingerprint TEXT NOT NULL,
    run_id TEXT NOT NULL,
    created_at REAL NOT NULL,
    expires_at REAL NOT NULL
) WITHOUT ROWID;
CREATE INDEX dagwerk_idempotency_keys_expiry ON dagwerk_idempotency_keys (expires_at);

-- version 13: indexes of the dashboard's views.
CREATE INDEX dagwerk_tasks_node_stats ON dagwerk_tasks
    (run_id, invalidated, node_index, status, attempt_number, started_at, finished_at);
CREATE INDEX dagwerk_runs_created_status ON dagwerk_runs (created_at, status);

-- version 14: what retention looks up (finished runs by finish time, the
-- launches of a run, the dead letters of a task).
CREATE INDEX dagwerk_runs_finished ON dagwerk_runs (finished_at, run_id)
    WHERE finished_at IS NOT NULL;
CREATE INDEX dagwerk_launches_run ON dagwerk_launches (run_id);
CREATE INDEX dagwerk_dead_letters_task ON dagwerk_dead_letters (task_id);

-- version 15: the traceback of each failed attempt.
CREATE TABLE dagwerk_attempt_tracebacks (
    task_id TEXT NOT NULL REFERENCES dagwerk_tasks (task_id),
    attempt_id TEXT NOT NULL,
    traceback TEXT NOT NULL,
    PRIMARY KEY (task_id, attempt_id)
) WITHOUT ROWID;
