-- dagwerk SQLite schema, version 3: composite child runs with persisted
-- lineage, and run budgets (accounts, input charges, cost holds).

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
