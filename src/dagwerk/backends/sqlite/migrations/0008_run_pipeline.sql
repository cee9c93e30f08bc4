-- dagwerk SQLite schema, version 8: a run records its pipeline's name.
--
-- ``pipeline`` is the name of the pipeline file's pipeline the run was
-- submitted from, for people listing runs (``dagwerk runs``); NULL for runs
-- submitted as bare nodes and for runs stored before this version.

ALTER TABLE dagwerk_runs ADD COLUMN pipeline TEXT;
