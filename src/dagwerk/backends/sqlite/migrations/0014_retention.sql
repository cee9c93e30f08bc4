-- dagwerk SQLite schema, version 14: what retention looks up.
--
-- ``dagwerk_runs_finished`` lists finished runs by the time they finished
-- (the runs retention examines, oldest first); ``dagwerk_launches_run`` and
-- ``dagwerk_dead_letters_task`` find every launch of a run and every dead
-- letter of a task when their run is deleted. A terminal run stored before
-- version 2 has no finish time: it counts as finished when it was created.
-- Applying this file again changes nothing.

UPDATE dagwerk_runs SET finished_at = created_at
WHERE finished_at IS NULL AND status IN ('completed', 'failed', 'crashed', 'cancelled');
CREATE INDEX IF NOT EXISTS dagwerk_runs_finished ON dagwerk_runs (finished_at, run_id)
    WHERE finished_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS dagwerk_launches_run ON dagwerk_launches (run_id);
CREATE INDEX IF NOT EXISTS dagwerk_dead_letters_task ON dagwerk_dead_letters (task_id);
