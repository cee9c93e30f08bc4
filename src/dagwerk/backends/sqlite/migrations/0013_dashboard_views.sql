-- dagwerk SQLite schema, version 13: indexes of the dashboard's views.
--
-- dagwerk_tasks_node_stats covers the per-node counts of a run's page
-- (RunViewStore.node_task_stats) so a 100,000-task run is counted from the
-- index alone; dagwerk_runs_created_status covers the overview's runs by
-- status over the last day.

CREATE INDEX dagwerk_tasks_node_stats ON dagwerk_tasks
    (run_id, invalidated, node_index, status, attempt_number, started_at, finished_at);
CREATE INDEX dagwerk_runs_created_status ON dagwerk_runs (created_at, status);
