-- dagwerk PostgreSQL schema, version 6: failed launches are found by index.
--
-- The targeted reconcile after every completion asks whether the run has a
-- failed launch; the active-launch index made that a scan of every launch
-- of the run (O(nodes) per completion, O(nodes²) for a chain). This partial
-- index holds only the failed active launches, so the check is one probe.

CREATE INDEX dagwerk_launches_failed
    ON dagwerk_launches (run_id) WHERE active = 1 AND disposition = 'failed';
